"""Training rows held in memory or streamed from an :class:`~tpc_hooks.ActivationStore`,
and the train/validation split every trainer uses."""

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..._errors import TPCHooksError
from ...activations import ActivationStore
from ...head import check_features
from ...metrics import check_labels

_MOMENT_ELEMENTS = 1 << 22  # the elements of one block standardised or summed at a time (32 MB in float64)


class Rows:
    """Training rows held in memory (one tensor) or on disk (an ActivationStore), optionally a
    subset of rows; yields standardised chunks. Stores are streamed chunk by chunk."""

    def __init__(self, source: Tensor | ActivationStore, rows: np.ndarray | None = None, chunk_rows: int = 65536):
        self.source = source
        self.rows = rows
        self.chunk_rows = chunk_rows
        self.std: Tensor | None = None  # standardised rows, when held in memory

    @property
    def in_memory(self) -> bool:
        return isinstance(self.source, Tensor)

    @property
    def n(self) -> int:
        return len(self.rows) if self.rows is not None else self.source.shape[0]

    @property
    def d(self) -> int:
        return self.source.shape[1]

    def subset(self, rows: np.ndarray) -> "Rows":
        """The rows ``rows`` (sorted positions into this data set) as a new data set."""
        base = rows if self.rows is None else self.rows[rows]
        if isinstance(self.source, Tensor):  # in memory
            return Rows(self.source[torch.as_tensor(base)], None, self.chunk_rows)
        return Rows(self.source, np.asarray(base), self.chunk_rows)

    def _n_chunks(self) -> int:
        total = self.source.shape[0] if self.in_memory else len(self.source)
        return max(1, math.ceil(total / self.chunk_rows))

    def _raw_chunk(self, i: int) -> tuple[np.ndarray, Tensor]:
        """Chunk ``i``: ``(positions, rows)``; positions index into this data set (0..n-1)."""
        a = i * self.chunk_rows
        if isinstance(self.source, Tensor):  # in memory
            b = min(a + self.chunk_rows, self.n)
            return np.arange(a, b), self.source[a:b]
        store: ActivationStore = self.source
        b = min(a + self.chunk_rows, len(store))
        block = store.read(a, b)
        if self.rows is None:
            return np.arange(a, b), torch.from_numpy(block)
        lo, hi = np.searchsorted(self.rows, [a, b])
        return np.arange(lo, hi), torch.from_numpy(block[self.rows[lo:hi] - a])

    def raw_chunks(self) -> Iterator[tuple[np.ndarray, Tensor]]:
        for i in range(self._n_chunks()):
            pos, x = self._raw_chunk(i)
            if len(pos):
                yield pos, x

    def fit_scaler(self) -> tuple[Tensor, Tensor]:
        """Mean and population std per feature (float64, merged chunk by chunk; a zero std
        becomes 1, as in scikit-learn's StandardScaler)."""
        count, mean, m2 = 0, None, None
        step = max(1, _MOMENT_ELEMENTS // self.d)  # rows per float64 block: a block's copy stays small
        for _, chunk in self.raw_chunks():
            for a in range(0, chunk.shape[0], step):
                x = chunk[a : a + step].to(torch.float64, copy=True)  # summed in place: never the rows
                n_b = x.shape[0]
                mean_b = x.mean(0)
                m2_b = x.sub_(mean_b).square_().sum(0)
                if mean is None or m2 is None:  # the first block
                    count, mean, m2 = n_b, mean_b, m2_b
                else:
                    delta = mean_b - mean
                    tot = count + n_b
                    mean = mean + delta * (n_b / tot)
                    m2 = m2 + m2_b + delta**2 * (count * n_b / tot)
                    count = tot
        assert mean is not None and m2 is not None  # the rows are not empty
        scale = (m2 / count).sqrt()
        scale = torch.where(scale < 10 * torch.finfo(torch.float64).eps, torch.ones_like(scale), scale)
        return mean.float(), scale.float()

    def hold_standardized(self, scaler: nn.Module, device: torch.device) -> None:
        """Standardises once and keeps the result (in-memory data only); once held, nothing (the
        validation rows of a fit whose validation rows are its training rows: one ``Rows``)."""
        if isinstance(self.source, Tensor) and self.std is None:
            src = self.source.to(device)
            std = torch.empty_like(src)
            step = max(1, _MOMENT_ELEMENTS // max(self.d, 1))
            for a in range(0, src.shape[0], step):  # block by block: no full-size intermediate
                std[a : a + step] = scaler(src[a : a + step])
            self.std = std

    def _chunk(self, i: int, scaler: nn.Module, device: torch.device) -> tuple[np.ndarray, Tensor]:
        if self.std is not None:
            a = i * self.chunk_rows
            b = min(a + self.chunk_rows, self.n)
            return np.arange(a, b), self.std[a:b]
        pos, x = self._raw_chunk(i)
        return pos, scaler(x.to(device))

    def chunks(self, scaler: nn.Module, device: torch.device) -> Iterator[tuple[np.ndarray, Tensor]]:
        """Standardised chunks ``(positions, rows)`` in row order."""
        for i in range(self._n_chunks()):
            pos, x = self._chunk(i, scaler, device)
            if len(pos):
                yield pos, x

    def batches(
        self, scaler: nn.Module, device: torch.device, batch_size: int, gen: torch.Generator
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Shuffled minibatches ``(standardised rows, positions)``. In memory: one permutation
        of all rows. On disk: chunks in a random order, rows permuted within each chunk."""
        if self.std is not None:  # the epoch's order goes to the device once, not once per batch
            perm = torch.randperm(self.n, generator=gen).to(self.std.device)
            for a in range(0, self.n, batch_size):
                idx = perm[a : a + batch_size]
                yield self.std[idx], idx
            return
        for i in torch.randperm(self._n_chunks(), generator=gen).tolist():
            pos, x = self._chunk(i, scaler, device)
            perm = torch.randperm(x.shape[0], generator=gen)
            pos_t = torch.as_tensor(pos)
            for a in range(0, x.shape[0], batch_size):
                idx = perm[a : a + batch_size]
                yield x[idx.to(x.device)], pos_t[idx]

    def map(self, scaler: nn.Module, device: torch.device, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """Applies ``fn`` to standardised chunks and concatenates the results in row order."""
        outs = [fn(x) for _, x in self.chunks(scaler, device)]
        return torch.cat(outs) if outs else torch.zeros(0, device=device)


def as_rows(X: Any, name: str, d_model: int | None = None, device: torch.device | None = None) -> Rows:
    """Checked rows: a store as is (streamed chunk by chunk), anything else in memory, moved to
    ``device`` once and checked there."""
    if isinstance(X, ActivationStore):
        if len(X) == 0:
            raise TPCHooksError(f"{name} is an empty activation store ({X.path})")
        if d_model is not None and X.d_model != d_model:
            raise TPCHooksError(f"{name} has d_model={X.d_model} but the head expects d_model={d_model}")
        return Rows(X)
    return Rows(check_features(X, name, d_model, device=device).float())


def split_data(
    X: Any,
    y: Any,
    X_val: Any,
    y_val: Any,
    val_fraction: float,
    seed: int,
    d_model: int | None = None,
    device: torch.device | None = None,
) -> tuple[Rows, Tensor, Rows, Tensor]:
    """Checks the inputs and returns (train, y_train, val, y_val); without a validation set,
    holds out a stratified ``val_fraction`` of the training rows. In-memory rows are moved to
    ``device`` once (labels stay on the host)."""
    data = as_rows(X, "X_train", d_model, device)
    y_all = check_labels(y, data.n, "y_train")
    if (X_val is None) != (y_val is None):
        raise TPCHooksError(
            "pass both X_val and y_val, or neither (a stratified split of the training data is then used)"
        )
    if X_val is X and y_val is y and not isinstance(X, ActivationStore):  # refit: rows held once, not twice
        return data, y_all, data, y_all
    if X_val is not None:
        va = as_rows(X_val, "X_val", data.d, device)
        return data, y_all, va, check_labels(y_val, va.n, "y_val")
    if not 0 < val_fraction < 1:
        raise TPCHooksError(f"val_fraction must be in (0, 1); got {val_fraction!r}")
    y_np = y_all.numpy().astype(int)
    counts = np.bincount(y_np, minlength=2)
    if counts.min() < 2:
        raise TPCHooksError(
            f"y_train has only {counts.min()} example(s) of class {int(counts.argmin())}; at least 2 per class are "
            "needed to hold out a validation split (or pass X_val, y_val)"
        )
    from sklearn.model_selection import train_test_split

    n_val = max(2, int(round(val_fraction * data.n)))
    tr_idx, va_idx = train_test_split(np.arange(data.n), test_size=n_val, stratify=y_np, random_state=seed)
    tr_idx, va_idx = np.sort(tr_idx), np.sort(va_idx)
    return data.subset(tr_idx), y_all[tr_idx], data.subset(va_idx), y_all[va_idx]


def token_rows(seqs: list[Any], skip: int, *per_seq: Any) -> tuple[Any, ...]:
    """A per-token monitor's rows: every position of each sequence ``[T_i, d]`` (tensors or
    arrays) after its first ``skip`` (the fixed prefix), stacked, then each of ``per_seq``
    (per-sequence values: labels, group names) repeated once per row of its sequence.

    Returns ``(rows [N, d] tensor, *repeated [N] arrays)``."""
    parts = [torch.as_tensor(z[skip:]) for z in seqs]
    return (
        torch.cat(parts),
        *(np.concatenate([np.full(len(p), v) for p, v in zip(parts, vals, strict=True)]) for vals in per_seq),
    )
