"""Robustness-aware choices made on validation groups (phrasing families, sources): which site a
monitor reads, judged by the worst group at a fixed false-positive rate."""

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .._errors import TPCHooksError
from ..head import FitConfig
from ..metrics import worst_group
from ._engine import fit

FPR = 0.01


def choose_site(
    data: Mapping[str, tuple[Any, Any, Any, Any]],
    groups: Any,
    config: FitConfig | None = None,
    device: Any = None,
    fpr: float = FPR,
    benign: Any = None,
) -> tuple[str, list[dict[str, Any]]]:
    """The site whose linear probe does best on its *worst* validation group: recall at ``fpr``,
    ties by AUROC. The probe is the TPC's own order 1 (same data, same C selection), so the
    choice costs one logistic regression per site, and it is deterministic. ``train_monitor``
    calls it when given several sites; call it yourself on activations you collected.

    Args:
        data: site -> ``(X_train, y_train, X_val, y_val)``; the validation rows of every site are
            the same prompts in the same order.
        groups: one group label per validation row.
        config: the :class:`FitConfig` the monitor trains with (its ``Cs``, ``probe_metric``, solver
            and seed; default: ``FitConfig()``).
        benign: the validation rows the threshold is set on (default: every benign row), e.g. the
            everyday sources' benign prompts.

    Returns:
        ``(site, table)``: the chosen site and one row per candidate (``site``, ``recall_at_fpr``,
        ``auroc``, ``f1``: each the worst group's).

    Example:
        >>> import numpy as np, tpc_hooks as tpc
        >>> from tpc_hooks.synthetic import make_problem
        >>> X, y = make_problem(n=400, d_model=8, seed=0)
        >>> noise = np.random.default_rng(0).standard_normal(X.shape).astype(np.float32)
        >>> data = {
        ...     "signal": (X[:300], y[:300], X[300:], y[300:]),
        ...     "noise": (noise[:300], y[:300], noise[300:], y[300:]),
        ... }
        >>> tpc.choose_site(data, groups=["all"] * 100, config=tpc.FitConfig())[0]
        'signal'
    """
    if not data:
        raise TPCHooksError("choose_site needs at least one candidate site")
    g = np.asarray(groups)
    table: list[dict[str, Any]] = []
    for site, (X, y, Xv, yv) in data.items():
        probe = fit(
            X,
            y,
            Xv,
            yv,
            config,
            degree=1,
            objective=None,  # a probe per row: the site is chosen before any sequence is trained
            consistency=0.0,
            experimental={**config.experimental, "contrast": 0.0} if config else None,
            device=device,  # degree 1 only
            verbose=False,
        )
        with torch.no_grad():
            s = probe(torch.as_tensor(np.asarray(Xv))).double().cpu().numpy()
        table.append({"site": site, **worst_group(np.asarray(yv), s, g, fpr, benign)})

    def rank(v):
        return -np.inf if np.isnan(v) else v

    best = max(table, key=lambda r: (rank(r["recall_at_fpr"]), rank(r["auroc"])))
    return best["site"], table
