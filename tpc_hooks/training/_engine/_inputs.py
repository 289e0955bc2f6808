"""``fit``'s optional inputs, checked: validation groups, the segment objective's sequences, the
consistency penalty's unlabelled rows and the contrast loss's pairs."""

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..._errors import TPCHooksError
from ...head import FitConfig
from ._rows import Rows, as_rows
from ._segments import Sequences, sequence_lengths


def val_group_rows(val_groups: Any, n_val: int, given: bool) -> list[Tensor] | None:
    """The validation rows of each group (index tensors), or ``None`` for pooled selection."""
    if val_groups is None:
        return None
    if not given:
        raise TPCHooksError("val_groups labels the rows of X_val; pass X_val and y_val with it")
    labels = np.asarray(val_groups).reshape(-1)
    if labels.shape[0] != n_val:
        raise TPCHooksError(f"val_groups needs one label per validation row ({n_val}); got {labels.shape[0]}")
    return [torch.as_tensor(np.flatnonzero(labels == g)) for g in dict.fromkeys(labels.tolist())]


def sequence_splits(
    cfg: FitConfig,
    sequences: Any,
    val_sequences: Any,
    tr: Rows,
    y_tr: Tensor,
    va: Rows,
    y_va: Tensor,
    given: bool,
    pairs: Any,
    device: torch.device,
) -> tuple[Sequences, Sequences] | None:
    """The training and validation sequences of ``objective="sctopk"`` (None for the per-row objective)."""
    if cfg.objective != "sctopk":
        if sequences is not None or val_sequences is not None:
            raise TPCHooksError("sequences and val_sequences are read by objective='sctopk'; set it with them")
        return None
    if sequences is None or val_sequences is None or not given:
        raise TPCHooksError(
            "objective='sctopk' trains on whole sequences: pass sequences= (rows per training sequence) and "
            "X_val, y_val with val_sequences= (rows per validation sequence)"
        )
    if pairs is not None:
        raise TPCHooksError("pairs (the contrast loss) rank rows; they cannot be combined with objective='sctopk'")
    if not tr.in_memory:
        raise TPCHooksError("objective='sctopk' needs the training rows in memory (an array or tensor), not a store")
    out = tuple(
        Sequences(sequence_lengths(lengths, rows.n, name), y, cfg.window, cfg.top_k, cfg.segvar, device, cfg.streamed)
        for lengths, rows, y, name in ((sequences, tr, y_tr, "sequences"), (val_sequences, va, y_va, "val_sequences"))
    )
    return out[0], out[1]


def unlabelled_rows(X: Any, d: int, cfg: FitConfig, device: torch.device) -> Rows | None:
    """The rows the consistency penalty reads (held in memory), or None."""
    if X is None:
        if cfg.consistency:
            raise TPCHooksError("consistency > 0 needs X_unlabelled (the rows where higher orders should add nothing)")
        return None
    if not cfg.consistency:
        raise TPCHooksError("X_unlabelled is only read by the consistency penalty; set consistency > 0 with it")
    if cfg.mode != "progressive":
        raise TPCHooksError("consistency applies to degrees trained one at a time; it needs mode='progressive'")
    rows = as_rows(X, "X_unlabelled", d, device)
    if not rows.in_memory:
        raise TPCHooksError("X_unlabelled must fit in memory (an array or tensor), not an ActivationStore")
    return rows


def pair_rows(pairs: Any, given: bool, tr: Rows, y: Tensor, cfg: FitConfig, device: torch.device) -> Tensor | None:
    """The contrast loss's (harmful, counterpart) training-row pairs as a ``[m, 2]`` tensor, or None."""
    if pairs is None:
        if cfg.experimental["contrast"]:
            raise TPCHooksError("contrast > 0 needs pairs (each harmful training row with its benign counterpart)")
        return None
    if not cfg.experimental["contrast"]:
        raise TPCHooksError("pairs are only read by the contrast loss; set contrast > 0 with them")
    if cfg.mode != "progressive":
        raise TPCHooksError("contrast applies to degrees trained one at a time; it needs mode='progressive'")
    if not given:
        raise TPCHooksError("pairs index X_train's rows; pass X_val and y_val so that none of them is held out")
    if not tr.in_memory:
        raise TPCHooksError("pairs need the training rows in memory (an array or tensor), not an ActivationStore")
    arr = np.asarray(pairs)
    if arr.ndim != 2 or arr.shape[1] != 2 or arr.shape[0] == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise TPCHooksError(
            f"pairs must be a non-empty [m, 2] array of integer row indices; got shape {arr.shape} "
            f"and dtype {arr.dtype}"
        )
    if arr.min() < 0 or arr.max() >= tr.n:
        raise TPCHooksError(f"pairs index rows 0..{tr.n - 1} of X_train; got {int(arr.min())}..{int(arr.max())}")
    yy = y.numpy()
    if (yy[arr[:, 0]] != 1).any() or (yy[arr[:, 1]] != 0).any():
        raise TPCHooksError("each pair is (a harmful row, label 1; its benign counterpart, label 0)")
    return torch.as_tensor(arr, dtype=torch.long, device=device)
