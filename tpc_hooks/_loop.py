"""The training loop shared by every TPC degree and every baseline."""

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ._errors import TPCHooksError
from ._history import TrainConfig
from ._rows import Rows


def f1_at_zero(logits: Tensor, y: Tensor) -> float:
    """F1 of ``logits > 0`` against binary ``y`` (0 when there is no true or predicted positive)."""
    pred = logits > 0
    pos = y > 0.5
    tp = (pred & pos).sum().item()
    fp = (pred & ~pos).sum().item()
    fn = (~pred & pos).sum().item()
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def default_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def train_loop(
    params: Sequence[nn.Parameter],
    batch_loss: Callable[[Tensor, Tensor], Tensor],
    evaluate: Callable[[], tuple[float, float]],
    data: Rows,
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

    ``batch_loss(rows, positions)`` returns the loss of one minibatch of standardised rows;
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
        records.append({**tags, "epoch": epoch, "train_loss": train_loss, "val_loss": val_loss, "val_f1": val_f1, "lr": lr})
        if not math.isfinite(train_loss):
            raise TPCHooksError(
                f"training diverged ({desc}, epoch {epoch}: loss is {train_loss}); lower lr or the rank, or check the features"
            )
        if val_loss < best["val_loss"] or not cfg.keep_best:
            best = {"val_loss": val_loss, "val_f1": val_f1, "epoch": epoch}
            best_state = [p.detach().clone() for p in params]
        bar.set_postfix(val_loss=f"{val_loss:.4f}", val_f1=f"{val_f1:.4f}")
        if cfg.patience is not None and epoch - best["epoch"] > cfg.patience:
            break
    with torch.no_grad():
        for p, s in zip(params, best_state):
            p.copy_(s)
    return best
