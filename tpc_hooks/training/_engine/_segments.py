"""The segment top-k objective (``FitConfig.objective="sctopk"``; He et al., arXiv 2604.14865): a
per-token head trained on each sequence's aggregated logit, not on its tokens one by one.

A sequence's rows are consecutive rows of the training data. Its per-token logits ``z_1..z_T`` give
segment scores (the mean of every ``window`` consecutive logits), and its logit is the mean of the
``top_k`` best segments (all of them while fewer exist; the token mean when no whole segment fits):
the value :func:`tpc_hooks.pooling.aggregate` gives after the sequence's last token, or (``streamed``,
the default) the highest value it gives after any prefix: what a streaming monitor flags on. The loss is the
BCE of that logit plus, on benign sequences, ``segvar`` times the variance of their segment scores
weighted by ``sigmoid(score / SEGVAR_TAU)``: a benign sequence may not hold a few segments that stand
out."""

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..._errors import TPCHooksError
from ._rows import Rows

SEGVAR_TAU = 2.0  # the temperature of the segment weights in the variance penalty (the published setting)


def segment_top_k(
    z: Tensor, lengths: Tensor, window: int, top_k: int, *, scores: bool = False, streamed: bool = False
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """Each sequence's segment top-k logit from the per-token logits ``z [..., N]`` of sequences laid end
    to end (``lengths [S]``, summing to ``N``): ``[..., S]``, differentiable. ``streamed``: the highest
    value the aggregate takes after any prefix of the sequence instead of after its last token (the
    mean of the first ``t`` logits while ``t < window``, then the mean of the first segments while fewer
    than ``top_k`` exist; from there on the top-k mean can only grow, so the final value bounds the
    rest). ``scores=True`` also returns the segment scores ``[..., S, W]`` and which of them exist
    ``[S, W]`` (``W`` = the longest sequence's segments, at least 1)."""
    n_seq = lengths.shape[0]
    t_max = int(lengths.max()) if n_seq else 0
    starts = torch.cumsum(lengths, 0) - lengths
    at = torch.arange(max(t_max, window), device=z.device)
    inside = at < lengths[:, None]  # [S, T]
    padded = z[..., (starts[:, None] + at).clamp_max(max(z.shape[-1] - 1, 0))] * inside  # [..., S, T], 0 outside
    mean = padded.sum(-1) / lengths.clamp_min(1)
    c = F.pad(padded.cumsum(-1), (1, 0))
    seg = (c[..., window:] - c[..., :-window]) / window  # [..., S, W]: the segment starting at each position
    n_seg = (lengths - window + 1).clamp_min(0)  # [S]
    exists = torch.arange(seg.shape[-1], device=z.device) < n_seg[:, None]
    kk = min(top_k, seg.shape[-1])
    top = seg.masked_fill(~exists, float("-inf")).topk(kk, dim=-1).values  # descending
    taken = torch.arange(kk, device=z.device) < n_seg.clamp_max(top_k)[:, None]
    agreed = torch.where(taken, top, 0.0).sum(-1) / n_seg.clamp(1, top_k)
    out = torch.where(n_seg > 0, agreed, mean)
    if streamed:
        early = min(window - 1, padded.shape[-1])
        prefix = (c[..., 1 : early + 1] / torch.arange(1, early + 1, device=z.device)).masked_fill(
            ~inside[:, :early], float("-inf")
        )
        few = max(min(top_k - 1, seg.shape[-1]), 0)  # fewer than top_k segments: the mean of those there are
        first = (seg[..., :few].cumsum(-1) / torch.arange(1, few + 1, device=z.device)).masked_fill(
            ~exists[:, :few], float("-inf")
        )
        if early or few:  # window 1 and top_k 1: every prefix's aggregate is its last token's, the max already
            out = torch.maximum(out, torch.cat([prefix, first], -1).amax(-1))
    return (out, seg, exists) if scores else out


def segment_variance(seg: Tensor, exists: Tensor, tau: float = SEGVAR_TAU) -> Tensor:
    """Per sequence, the variance of its segment scores ``seg [S, W]`` weighted by ``sigmoid(score / tau)``
    (0 for a sequence with fewer than two segments)."""
    w = torch.sigmoid(seg / tau) * exists
    total = w.sum(-1).clamp_min(1e-12)
    centre = (w * seg.masked_fill(~exists, 0.0)).sum(-1) / total
    return (w * (seg.masked_fill(~exists, 0.0) - centre[:, None]).square()).sum(-1) / total


def sequence_lengths(lengths: Any, n_rows: int, name: str) -> np.ndarray:
    """Checked row counts of the sequences laid end to end in ``name``'s ``n_rows`` rows."""
    arr = np.asarray(lengths) if isinstance(lengths, (list, tuple, np.ndarray, Tensor)) else np.zeros((0, 0))
    if arr.ndim != 1 or not len(arr) or not np.issubdtype(arr.dtype, np.integer) or (arr < 1).any():
        shown = repr(lengths)[:200]
        raise TPCHooksError(f"{name} must be a non-empty list of positive integers (rows per sequence); got {shown}")
    if int(arr.sum()) != n_rows:
        raise TPCHooksError(
            f"{name} counts {int(arr.sum())} rows in {len(arr)} sequences, but the data has {n_rows} rows; each "
            "sequence's rows are consecutive rows, every row in one sequence"
        )
    return arr.astype(np.int64)


class Sequences:
    """The sequences of one split: each one's rows (consecutive), its label (1 when any of its rows is
    labelled 1: a chat holding a harmful request is harmful) and the objective's settings."""

    def __init__(
        self,
        lengths: np.ndarray,
        y_rows: Tensor,
        window: int,
        top_k: int,
        segvar: float,
        device: torch.device,
        streamed: bool = True,
    ):
        self.window, self.top_k, self.segvar, self.streamed = window, top_k, segvar, streamed
        self.lengths_np = lengths
        self.starts_np = np.cumsum(lengths) - lengths
        self.lengths = torch.as_tensor(lengths, device=device)
        self.n = len(lengths)
        self.y = torch.as_tensor(np.maximum.reduceat(y_rows.cpu().numpy(), self.starts_np), device=device).float()

    def first_rows(self) -> np.ndarray:
        """Each sequence's first row (what a per-row value such as a group is read from)."""
        return self.starts_np

    def reduce(self, z: Tensor) -> Tensor:
        """Every sequence's logit from the per-token logits of all rows ``z [..., N]``."""
        out = segment_top_k(z, self.lengths, self.window, self.top_k, streamed=self.streamed)
        assert isinstance(out, Tensor)
        return out

    def rows_of(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """The rows of sequences ``ids`` (in that order, laid end to end) and their lengths."""
        ids_np = ids.cpu().numpy()
        lengths = self.lengths_np[ids_np]
        rows = np.concatenate([np.arange(a, a + n) for a, n in zip(self.starts_np[ids_np], lengths, strict=True)])
        return torch.as_tensor(rows, device=self.lengths.device), torch.as_tensor(lengths, device=self.lengths.device)

    def loss(self, z: Tensor, ids: Tensor, lengths: Tensor) -> Tensor:
        """The objective on sequences ``ids`` from their rows' logits ``z`` (laid end to end): BCE of the
        segment top-k logit, plus the weighted segment variance of the benign ones."""
        out = segment_top_k(z, lengths, self.window, self.top_k, scores=bool(self.segvar), streamed=self.streamed)
        y = self.y[ids.to(self.y.device)]
        if not self.segvar:
            assert isinstance(out, Tensor)
            return F.binary_cross_entropy_with_logits(out, y)
        logit, seg, exists = out
        return (
            F.binary_cross_entropy_with_logits(logit, y)
            + self.segvar * ((1 - y) * segment_variance(seg, exists)).mean()
        )


class SequenceBatches:
    """Training rows served whole sequences at a time (what :func:`train_loop` iterates): an epoch
    shuffles the sequences and fills each batch with sequences up to ``batch_size`` rows (at least one).
    Yields ``(standardised rows of the batch's sequences, laid end to end; the sequences' ids)``."""

    def __init__(self, rows: Rows, seqs: Sequences):
        if rows.std is None:
            raise TPCHooksError(
                'objective="sctopk" needs the training rows in memory (an array or tensor), not an ActivationStore'
            )
        self.rows, self.seqs = rows, seqs
        self.n = rows.n

    def batches(
        self, scaler: Any, device: torch.device, batch_size: int, gen: torch.Generator
    ) -> Iterator[tuple[Tensor, Tensor]]:
        std = self.rows.std
        assert std is not None  # checked when built
        order = torch.randperm(self.seqs.n, generator=gen).numpy()
        sizes = self.seqs.lengths_np[order]
        ends = np.cumsum(sizes)
        a = 0
        while a < len(order):
            b = max(a + 1, int(np.searchsorted(ends, (ends[a - 1] if a else 0) + batch_size, side="right")))
            ids = torch.as_tensor(order[a:b])
            rows, _ = self.seqs.rows_of(ids)
            yield std[rows.to(std.device)], ids
            a = b
