"""The shrinkage of ``fit`` (``FitConfig.shrink``): after degree ``k`` is trained alone, its term is
scaled by the ``s`` in :data:`SHRINK_GRID` that the validation loss prefers, pooled or over the
validation groups (``group_rule``); ``s = 0`` is the lower truncation."""

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

SHRINK_GRID = tuple(i / 20 for i in range(21))


HURT_Z = 2.0  # a group is hurt when its mean change in loss is this many standard errors above 0


def fit_order_scale(
    prefix: Tensor,
    term: Tensor,
    y: Tensor,
    groups: Sequence[Tensor] | None = None,
    rule: str = "balanced",
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> tuple[float, float]:
    """The per-order scale ``s`` in ``SHRINK_GRID`` (0, 0.05, ..., 1) that minimises the validation
    BCE of ``prefix + s * term`` (ties: the smaller ``s``). ``s = 0`` is the lower truncation.

    With ``groups`` (index tensors) and ``rule="balanced"``, ``s`` minimises the mean of the groups'
    BCEs among the scales that hurt no group: a group is hurt when the mean of its rows' change in
    BCE over ``s = 0`` is more than :data:`HURT_Z` standard errors above 0 (a paired test on the
    same rows). With ``rule="worst"``, ``s`` minimises the worst group's change in BCE over
    ``s = 0``, so a scale above 0 is kept only where it lowers every group's loss. The pooled BCE
    at ``s`` is returned. ``reduce`` maps the rows' logits ``[..., n]`` to what ``y`` and ``groups``
    label (a sequence's logit from its tokens': ``objective="sctopk"``)."""
    grid = torch.tensor(SHRINK_GRID, dtype=prefix.dtype, device=prefix.device)[:, None]
    logits = prefix + grid * term  # [scale, row]
    if reduce is not None:
        logits = reduce(logits)
    if groups is not None and rule == "balanced":
        rows = F.binary_cross_entropy_with_logits(logits, y.expand(len(SHRINK_GRID), -1), reduction="none")
        change = rows - rows[:1]  # [scale, row]: each row's change in BCE over s = 0
        hurt = torch.stack([change[:, g].mean(1) > HURT_Z * _stderr(change[:, g]) for g in groups]).any(0)
        loss = torch.where(hurt, math.inf, torch.stack([rows[:, g].mean(1) for g in groups]).mean(0)).tolist()
        i = min(range(len(SHRINK_GRID)), key=lambda i: (round(loss[i], 12), i))  # s = 0 is never hurt
        return SHRINK_GRID[i], float(rows[i].mean())
    # every (scale, group) loss in one read back to the host
    parts = [slice(None)] + ([] if groups is None else list(groups))
    table = torch.stack(
        [torch.stack([F.binary_cross_entropy_with_logits(row[g], y[g]) for g in parts]) for row in logits]
    ).tolist()  # [scale][pooled, group...]
    if groups is not None:
        base = table[0][1:]  # SHRINK_GRID[0] == 0
        regret = [
            (max(row[1 + j] - b for j, b in enumerate(base)), s) for s, row in zip(SHRINK_GRID, table, strict=True)
        ]
        i = min(range(len(regret)), key=lambda i: (round(regret[i][0], 12), regret[i][1]))
        return SHRINK_GRID[i], table[i][0]
    best = (math.inf, 0.0)
    for s, row in zip(SHRINK_GRID, table, strict=True):
        if row[0] < best[0] - 1e-12:
            best = (row[0], s)
    return best[1], best[0]


def _stderr(x: Tensor) -> Tensor:
    """The standard error of the mean of each row of ``x`` [scale, n] (0 for a single column)."""
    return x.std(1) / math.sqrt(x.shape[1]) if x.shape[1] > 1 else torch.zeros_like(x[:, 0])
