"""Validation of user-supplied features and labels, shared by every entry point."""

from typing import Any

import torch

from .._errors import TPCHooksError
from ..metrics import as_tensor

_HALF = (torch.float16, torch.bfloat16)


def check_features(
    x: Any, name: str = "X", d_model: int | None = None, *, min_rows: int = 1, device: torch.device | str | None = None
) -> torch.Tensor:
    """Checks a feature matrix ``[n, d_model]`` and returns it as float32 (float64 kept).

    With ``device`` the rows are moved there first (one copy, in their own dtype) and checked
    there: on a GPU the NaN/inf scan runs on the device, not on the host.

    Raises:
        TPCHooksError: wrong rank, no rows, wrong ``d_model``, or a NaN/inf entry.
    """
    t = as_tensor(x, name)
    if t.dim() != 2:
        raise TPCHooksError(f"{name} must be a 2-D array [n_samples, d_model]; got shape {tuple(t.shape)}")
    if t.shape[0] < min_rows:
        raise TPCHooksError(f"{name} is empty: it has {t.shape[0]} rows; at least {min_rows} needed")
    check_width(t, name, d_model)
    if device is not None:
        t = t.to(device)
    t = t.float() if t.dtype != torch.float64 else t
    check_finite(t, name)
    return t


def check_width(t: torch.Tensor, name: str, d_model: int | None) -> None:
    if d_model is not None and t.shape[-1] != d_model:
        raise TPCHooksError(
            f"{name} has d_model={t.shape[-1]} but the head expects d_model={d_model}; "
            "were these activations collected from another model or site?"
        )


def check_finite(t: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(t).all()):
        bad = (~torch.isfinite(t)).nonzero()
        first = tuple(bad[0].tolist())
        raise TPCHooksError(
            f"{name} contains {bad.shape[0]} NaN/inf value(s), first at index {first}; "
            "drop or repair those rows (an overflowing float16 forward pass is a common cause)"
        )


def prepare_activations(z: Any, d_model: int, like: torch.Tensor, *, promote: bool) -> tuple[torch.Tensor, torch.Size]:
    """Checks activations ``[..., d_model]`` for a module whose parameters look like ``like``.

    Returns the rows flattened to ``[n, d_model]`` on ``like``'s device, and the batch shape.
    Half precision is scored in float32. With ``promote``, float64 input stays float64 (the
    TPC computes in the wider type); otherwise rows take ``like``'s dtype.
    """
    if not isinstance(z, torch.Tensor):
        raise TPCHooksError(f"expected a torch.Tensor of activations [..., {d_model}]; got {type(z).__name__}")
    if z.dim() == 0:
        raise TPCHooksError(f"expected activations of shape [..., {d_model}]; got a scalar")
    check_width(z, "z", d_model)
    if not z.is_floating_point() or z.dtype in _HALF:
        z = z.float()
    dtype = torch.promote_types(z.dtype, like.dtype) if promote else like.dtype
    z = z.to(device=like.device, dtype=dtype)
    check_finite(z, "z")
    return z.reshape(-1, d_model), z.shape[:-1]
