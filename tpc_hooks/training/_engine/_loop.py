"""The training loop shared by every TPC degree and every baseline."""

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..._errors import TPCHooksError
from ...head import TrainConfig
from ._rows import Rows
from ._segments import SequenceBatches


def f1_at_zero(logits: Tensor, y: Tensor) -> float:
    """F1 of ``logits > 0`` against binary ``y`` (0 when there is no true or predicted positive)."""
    pred = logits > 0
    pos = y > 0.5
    tp = (pred & pos).sum().item()
    fp = (pred & ~pos).sum().item()
    fn = (~pred & pos).sum().item()
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def loss_and_f1(
    logits: Tensor, y: Tensor, groups: Sequence[Tensor] | None = None, rule: str = "balanced"
) -> tuple[float, float]:
    """Validation BCE and F1 at logit 0 (:func:`f1_at_zero`) with one read back to the host:
    pooled, or with ``groups`` (index tensors) the mean over the groups of each (``rule="balanced"``:
    every group weighs the same, whatever its size) or the worst group's (``"worst"``: highest
    loss, lowest F1)."""
    parts = [slice(None)] if groups is None else list(groups)
    rows = []
    for g in parts:
        s, t = logits[g], y[g]
        pred, pos = s > 0, t > 0.5
        rows.append(
            torch.stack(
                [
                    F.binary_cross_entropy_with_logits(s, t).double(),
                    (pred & pos).sum().double(),
                    (pred & ~pos).sum().double(),
                    (~pred & pos).sum().double(),
                ]
            )
        )
    vals = torch.stack(rows).tolist()
    losses = [v[0] for v in vals]
    f1s = [0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn) for _, tp, fp, fn in vals]
    if rule == "worst":
        return max(losses), min(f1s)
    return sum(losses) / len(losses), sum(f1s) / len(f1s)


class Draws:
    """Random draws made on a CPU generator in blocks and moved to ``device`` once per block,
    handed out batch by batch: the same numbers as drawing each batch's share in turn (CPU
    generators give a block's values in order), without a host-to-device copy per batch.

    ``draw(gen, n)`` draws ``n`` values. The refill happens at the first :meth:`take` that runs
    past the block, i.e. in the generator's stream exactly where the per-batch draw would be.
    """

    def __init__(
        self, draw: Callable[[torch.Generator, int], Tensor], gen: torch.Generator, block: int, device: torch.device
    ):
        self.draw, self.gen, self.block, self.device = draw, gen, block, device
        self.buf: Tensor | None = None
        self.at = 0

    def take(self, n: int) -> Tensor:
        if self.buf is not None and self.at + n <= self.buf.shape[0]:
            out = self.buf[self.at : self.at + n]
            self.at += n
            return out
        head = self.buf[self.at :] if self.buf is not None else None
        need = n - (0 if head is None else head.shape[0])
        self.buf, self.at = self.draw(self.gen, max(self.block, need)).to(self.device), need
        fresh = self.buf[:need]
        return fresh if head is None or head.shape[0] == 0 else torch.cat([head, fresh])


def default_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def train_loop(
    params: Sequence[nn.Parameter],
    batch_loss: Callable[[Tensor, Tensor], Tensor],
    evaluate: Callable[[], tuple[float, float]],
    data: Rows | SequenceBatches,
    scaler: nn.Module,
    cfg: TrainConfig,
    device: torch.device,
    gen: torch.Generator,
    *,
    desc: str,
    verbose: bool,
    records: list[dict[str, Any]],
    tags: dict[str, Any],
) -> dict[str, Any]:
    """AdamW + ReduceLROnPlateau + gradient clipping; keeps the epoch with the best validation loss.

    ``batch_loss(rows, positions)`` returns the loss of one minibatch of standardised rows (with
    :class:`SequenceBatches`: whole sequences' rows and the sequences' ids);
    ``evaluate()`` returns ``(val_loss, val_f1)``; ``scaler`` standardises raw rows. The state
    before training is a candidate too (epoch -1): for a new TPC degree that is lambda_k = 0,
    i.e. the previous truncation, so training a degree never worsens the validation loss.
    Stops after ``cfg.patience`` epochs without improvement (None: run every epoch). On return
    ``params`` hold the best state. Used for the TPC degrees and the baselines alike.
    """
    params = list(params)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=cfg.plateau_factor)
    with torch.no_grad():
        val_loss0, val_f1_0 = evaluate()
    best = {"val_loss": val_loss0 if cfg.keep_best else math.inf, "val_f1": val_f1_0, "epoch": -1}
    best_state = [p.detach().clone() for p in params]
    bar = tqdm(range(cfg.epochs), desc=desc, disable=not verbose, leave=False, unit="epoch")
    for epoch in bar:
        total = torch.zeros((), device=device)
        count = 0
        for xb, idx in data.batches(scaler, device, cfg.batch_size, gen):
            loss = batch_loss(xb, idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            total += loss.detach() * len(idx)
            count += len(idx)
        with torch.no_grad():
            val_loss, val_f1 = evaluate()
        lr = opt.param_groups[0]["lr"]
        sched.step(val_loss)
        train_loss = float(total) / max(count, 1)
        records.append(
            {**tags, "epoch": epoch, "train_loss": train_loss, "val_loss": val_loss, "val_f1": val_f1, "lr": lr}
        )
        if not math.isfinite(train_loss):
            raise TPCHooksError(
                f"training diverged ({desc}, epoch {epoch}: loss is {train_loss}); lower lr or the rank, "
                "or check the features"
            )
        if val_loss < best["val_loss"] or not cfg.keep_best:
            best = {"val_loss": val_loss, "val_f1": val_f1, "epoch": epoch}
            best_state = [p.detach().clone() for p in params]
        bar.set_postfix(val_loss=f"{val_loss:.4f}", val_f1=f"{val_f1:.4f}")
        if cfg.patience is not None and epoch - best["epoch"] > cfg.patience:
            break
    with torch.no_grad():
        for p, s in zip(params, best_state, strict=True):
            p.copy_(s)
    return best
