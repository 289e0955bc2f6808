"""The checks of labels and rates that every entry point shares (the head's, the training's, the
metrics' own): binary labels matched one to one with rows, and a false-positive rate."""

from typing import Any

import numpy as np
import torch

from .._errors import TPCHooksError


def as_tensor(x: Any, name: str) -> torch.Tensor:
    """Turns an array-like into a floating tensor without copying when possible."""
    if isinstance(x, torch.Tensor):
        t = x
    else:
        try:
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as err:
            raise TPCHooksError(
                f"{name} must be an array or tensor of numbers; got {type(x).__name__} ({err})"
            ) from None
    if not (
        t.is_floating_point() or t.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)
    ):
        raise TPCHooksError(f"{name} must hold real numbers; got dtype {t.dtype}")
    return t


def check_labels(y: Any, n: int, name: str = "y", *, need_both: bool = True) -> torch.Tensor:
    """Checks binary labels of length ``n`` and returns them as float32 {0., 1.}."""
    t = as_tensor(y, name)
    if t.dim() != 1:
        raise TPCHooksError(f"{name} must be 1-D [n_samples]; got shape {tuple(t.shape)}")
    if t.shape[0] != n:
        raise TPCHooksError(
            f"{name} has {t.shape[0]} labels but the features have {n} rows; they must match one to one"
        )
    if n == 0:
        raise TPCHooksError(f"{name} is empty")
    t = t.double()
    if not bool(((t == 0) | (t == 1)).all()):
        bad = sorted({float(v) for v in t[(t != 0) & (t != 1)].unique()[:5].tolist()})
        raise TPCHooksError(f"{name} must hold binary labels 0 (benign) and 1 (harmful); found {bad}")
    if need_both:
        pos = int(t.sum())
        if pos == 0 or pos == n:
            only = "1 (harmful)" if pos else "0 (benign)"
            raise TPCHooksError(
                f"{name} has only one class: all {n} labels are {only}; a classifier needs examples of both"
            )
    return t.float()


def check_rate(value: Any, name: str) -> float:
    """A false-positive rate: a number in [0, 1) (a string, a bool, NaN or 1 is refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise TPCHooksError(f"{name} must be a number in [0, 1) (the benign share that may be flagged); got {value!r}")
    return float(value)
