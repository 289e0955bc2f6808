"""Mask-aware pooling and the streaming aggregations (the face: :mod:`tpc_hooks.pooling`)."""

import bisect
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from .._errors import TPCHooksError

POOLINGS = ("mean", "last", "max")


def check_pooling(how: Any) -> str:
    if how not in POOLINGS:
        raise TPCHooksError(f"pooling must be one of {list(POOLINGS)}; got {how!r}")
    return how


def pool(
    acts: Float[Tensor, "batch pos d_model"], mask: Int[Tensor, "batch pos"] | Tensor, how: str = "mean"
) -> Float[Tensor, "batch d_model"]:
    """Pools ``acts`` over the positions where ``mask`` is 1 (float32 result).

    Example:
        >>> a = torch.arange(12.).reshape(1, 4, 3)
        >>> pool(a, torch.tensor([[0, 1, 1, 0]]), "mean")
        tensor([[4.5000, 5.5000, 6.5000]])
    """
    check_pooling(how)
    if not bool(mask.bool().any(1).all()):  # checked where the mask is (the host, when it was built there)
        raise TPCHooksError("a sequence has no attended token to pool (empty prompt?)")
    m = mask.to(acts.device).bool()
    a = acts.float()
    if how == "mean":
        return a.masked_fill(~m[..., None], 0.0).sum(1) / m.sum(1, keepdim=True)
    if how == "max":
        return a.masked_fill(~m[..., None], float("-inf")).amax(1)
    pos = torch.arange(m.shape[1], device=m.device).expand_as(m)
    last = torch.where(m, pos, -1).amax(1)
    return a[torch.arange(a.shape[0], device=a.device), last]


def pool_prefixes(acts: Float[Tensor, "pos d_model"], how: str) -> Float[Tensor, "pos d_model"]:
    """Every prefix of one sequence pooled: row ``t`` is ``acts[: t + 1]`` pooled by ``how`` (what a
    monitor scores after each token; :class:`RunningPool` gives the same row by row).

    Example:
        >>> pool_prefixes(torch.tensor([[1.0], [3.0], [2.0]]), "mean").ravel().tolist()
        [1.0, 2.0, 2.0]
    """
    check_pooling(how)
    if how == "mean":
        return acts.cumsum(0) / torch.arange(1, acts.shape[0] + 1, device=acts.device, dtype=acts.dtype)[:, None]
    if how == "max":
        return acts.cummax(0).values
    return acts


class RunningPool:
    """Pooled vector per sequence, updated as tokens arrive (for monitoring generation)."""

    def __init__(self, how: str):
        self.how = check_pooling(how)
        self.total: Tensor | None = None
        self.count: Tensor | None = None
        self.state: Tensor | None = None

    def update(self, acts: Float[Tensor, "batch pos d_model"], mask: Tensor) -> None:
        """Adds the positions of ``acts`` where ``mask`` is 1 (rows with none are unchanged)."""
        m = mask.to(acts.device).bool()
        a = acts.float()
        c = m.sum(1, keepdim=True)
        self.count = c if self.count is None else self.count + c
        if self.how == "mean":
            s = a.masked_fill(~m[..., None], 0.0).sum(1)
            self.total = s if self.total is None else self.total + s
            return
        has = m.any(1)
        if self.how == "max":
            new = a.masked_fill(~m[..., None], float("-inf")).amax(1)
            self.state = new if self.state is None else torch.maximum(self.state, new)
            return
        pos = torch.arange(m.shape[1], device=m.device).expand_as(m)
        last = torch.where(m, pos, 0).amax(1)
        new = a[torch.arange(a.shape[0], device=a.device), last]
        if self.state is None:
            self.state = new.masked_fill(~has[:, None], 0.0)
        else:
            self.state = torch.where(has[:, None], new, self.state)

    def empty(self) -> Tensor | None:
        """Per row, whether no position has been pooled yet (None before any update)."""
        return None if self.count is None else self.count[:, 0] == 0

    @staticmethod
    def add_rows(pools: "list[RunningPool]", rows: Float[Tensor, "n d_model"]) -> Float[Tensor, "n d_model"]:
        """One new row for each of ``pools`` (each a batch of one that has seen a row): the
        same numbers as ``pool.update(row[None, None], ones)`` on each, in a few tensor
        operations for all of them (a serving engine's decode step). Returns the pooled rows; the
        pools never hold a view of ``rows``."""
        a, how = rows.float(), pools[0].how
        count = torch.cat([_seen(p.count) for p in pools]) + 1
        for p, c in zip(pools, count.split(1), strict=True):
            p.count = c
        if how == "mean":
            total = torch.cat([_seen(p.total) for p in pools]) + a
            for p, t in zip(pools, total.split(1), strict=True):
                p.total = t
            return total / count.clamp_min(1)
        # "last" keeps a copy: ``rows`` may be an engine's output buffer, which its next pass overwrites
        new = a.clone() if how == "last" else torch.maximum(torch.cat([_seen(p.state) for p in pools]), a)
        for p, v in zip(pools, new.split(1), strict=True):
            p.state = v
        return new

    def value(self) -> Float[Tensor, "batch d_model"]:
        if self.how == "mean":
            if self.total is None:
                raise TPCHooksError("RunningPool.value() called before any update")
            assert self.count is not None  # set together with total
            return self.total / self.count.clamp_min(1)
        if self.state is None:
            raise TPCHooksError("RunningPool.value() called before any update")
        return self.state


def _seen(t: Tensor | None) -> Tensor:
    assert t is not None, "RunningPool.add_rows needs pools that have seen a row"
    return t


# ---------------------------------------------------------------------- per-token scores over time
AGGREGATES = ("mean", "max", "ema", "rolling", "sctopk")
TOP_K = 8  # sctopk: how many of the best segments must agree (its default)


def check_skip(skip: Any) -> int:
    """Checks a streaming monitor's number of unscored leading tokens."""
    if isinstance(skip, bool) or not isinstance(skip, (int, np.integer)) or skip < 0:
        raise TPCHooksError(f"skip (leading tokens not scored) must be an integer >= 0; got {skip!r}")
    return int(skip)


def scored(mask: Tensor, skip: int, seen: Tensor | None = None) -> Tensor:
    """The attended positions of ``mask [B, n]`` that are scored: all but each row's first
    ``skip`` attended tokens, counting the ``seen [B]`` attended tokens of earlier chunks."""
    m = mask.bool()
    if skip == 0:
        return m
    rank = m.long().cumsum(1) + (0 if seen is None else seen[:, None])  # 1-based index of each attended token
    return m & (rank > skip)


def check_aggregate(how: Any, alpha: Any, window: Any, top_k: Any = TOP_K) -> tuple[str, float, int]:
    """Checks a streaming monitor's aggregation settings (``top_k``: of ``sctopk``)."""
    if how not in AGGREGATES:
        raise TPCHooksError(f"aggregate must be one of {list(AGGREGATES)}; got {how!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
        raise TPCHooksError(f"alpha (the EMA's weight on the newest token) must be in (0, 1]; got {alpha!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise TPCHooksError(
            f"window (tokens in the rolling mean, or in a segment of sctopk) must be a positive integer; got {window!r}"
        )
    check_top_k(top_k)
    return how, float(alpha), window


def check_top_k(top_k: Any) -> int:
    """Checks ``sctopk``'s number of segments that must agree."""
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise TPCHooksError(f"top_k (the segments sctopk averages) must be a positive integer; got {top_k!r}")
    return int(top_k)


def aggregate(
    logits: Float[Tensor, "batch pos"],
    mask: Tensor,
    how: str,
    alpha: float = 0.1,
    window: int = 16,
    skip: int = 0,
    top_k: int = TOP_K,
) -> Float[Tensor, "batch pos"]:
    """The aggregated score after every position of per-token logits (padding skipped).

    The first ``skip`` attended positions of every row are not scored (a streaming monitor's
    fixed prefix: the chat template's system prompt and header, identical in every sequence).
    With ``s_1..s_t`` a row's scored per-token logits up to position ``t``:

    * ``mean``: ``(s_1 + ... + s_t) / t``;
    * ``max``: ``max(s_1, ..., s_t)``;
    * ``ema``: ``e_1 = s_1``, ``e_t = alpha * s_t + (1 - alpha) * e_{t-1}``;
    * ``rolling``: the mean of the last ``min(t, window)`` logits;
    * ``sctopk`` (segment top-k, He et al., arXiv 2604.14865): every run of ``window`` consecutive
      scored logits is a segment scored by its mean; the aggregate is the mean of the ``top_k`` best
      segments so far (all of them while fewer exist), so a flag needs several segments to agree,
      not one token; before the first whole segment, the mean of the logits so far.

    A padded position carries the row's previous value; before a row's first scored token the
    value is ``-inf`` (nothing seen yet: probability 0, never flagged). Computed over whole
    sequences at once in float64 (cumulative sums, a linear filter for the EMA) and returned in
    the logits' dtype; :class:`RunningAggregate` computes the same values incrementally, token
    by token (equal up to float32 rounding).

    Example:
        >>> aggregate(torch.tensor([[1., 3., 2.]]), torch.ones(1, 3), "rolling", window=2)
        tensor([[1.0000, 2.0000, 2.5000]])
        >>> aggregate(torch.tensor([[9., 3., 2.]]), torch.ones(1, 3), "max", skip=1)
        tensor([[-inf, 3., 3.]])
        >>> aggregate(torch.tensor([[4., 0., 2., 6.]]), torch.ones(1, 4), "sctopk", window=2, top_k=2)
        tensor([[4.0000, 2.0000, 1.5000, 3.0000]])
    """
    how, alpha, window = check_aggregate(how, alpha, window, top_k)
    skip = check_skip(skip)
    m = scored(mask.to(logits.device).bool(), skip)
    out = torch.full(logits.shape, float("nan"), dtype=torch.float64)
    for b in range(logits.shape[0]):
        at = m[b].nonzero().flatten().cpu()
        if len(at):
            out[b, at] = torch.from_numpy(
                _aggregate_1d(
                    logits[b, at.to(logits.device)].detach().double().cpu().numpy(), how, alpha, window, top_k
                )
            )
    last = torch.where(m.cpu(), torch.arange(m.shape[1]), -1).cummax(1).values  # the newest attended position
    carried = out.gather(1, last.clamp_min(0)).masked_fill(last < 0, float("-inf"))
    return carried.to(device=logits.device, dtype=logits.dtype)


def _aggregate_1d(s: np.ndarray, how: str, alpha: float, window: int, top_k: int = TOP_K) -> np.ndarray:
    n = np.arange(1, len(s) + 1)
    if how == "mean":
        return np.cumsum(s) / n
    if how == "sctopk":
        return _segment_top_k(s, window, top_k)
    if how == "max":
        return np.maximum.accumulate(s)
    if how == "rolling":
        c = np.concatenate([[0.0], np.cumsum(s)])
        lo = np.maximum(n - window, 0)
        return (c[n] - c[lo]) / (n - lo)
    from scipy.signal import lfilter  # e_t = alpha s_t + (1 - alpha) e_{t-1}, started at e_1 = s_1

    return lfilter([alpha], [1.0, alpha - 1.0], s, zi=[(1 - alpha) * s[0]])[0]


def _segment_top_k(s: np.ndarray, window: int, top_k: int) -> np.ndarray:
    """``sctopk`` after every logit of ``s``: the mean of the ``top_k`` best means of ``window`` consecutive
    logits so far (the mean so far before the first)."""
    c = np.concatenate([[0.0], np.cumsum(s)])
    out = c[1:] / np.arange(1, len(s) + 1)
    best: list[float] = []  # the top_k segment means so far, ascending
    for end in range(window, len(s) + 1):
        bisect.insort(best, (c[end] - c[end - window]) / window)
        if len(best) > top_k:
            best.pop(0)
        out[end - 1] = sum(best) / len(best)
    return out


class RunningAggregate:
    """:func:`aggregate` incrementally: O(1) state per row (``window`` logits for ``rolling``; for
    ``sctopk`` the last ``window - 1`` logits and the ``top_k`` best segment means so far).

    ``update(logits [B, n], mask [B, n])`` adds the attended new positions in order (each row's
    first ``skip`` attended tokens are not scored) and returns each row's aggregated score after
    them ``[B]`` (``-inf`` for a row with no scored token yet). Everything stays on the logits'
    device; nothing is read back to the host.
    """

    def __init__(self, how: str, alpha: float = 0.1, window: int = 16, skip: int = 0, top_k: int = TOP_K):
        self.how, self.alpha, self.window = check_aggregate(how, alpha, window, top_k)
        self.top_k = check_top_k(top_k)
        self.skip = check_skip(skip)
        self.seen: Tensor | None = None  # [B] attended tokens so far, scored or not
        self.value: Tensor | None = None  # [B] the aggregate (NaN before any token)
        self.count: Tensor | None = None  # [B] attended tokens so far
        self.total: Tensor | None = None  # [B] mean: the running sum
        self.ring: Tensor | None = None  # [B, window] rolling: the last logits (slot = count % window)
        self.tail: Tensor | None = None  # [B, window - 1] sctopk: the last scored logits, newest last
        self.best: Tensor | None = None  # [B, top_k] sctopk: the best segment means so far, descending (-inf: none)

    def _start(self, like: Tensor) -> None:
        B = like.shape[0]
        self.value = torch.full((B,), float("nan"), dtype=like.dtype, device=like.device)
        self.count = torch.zeros(B, dtype=torch.long, device=like.device)
        self.seen = torch.zeros(B, dtype=torch.long, device=like.device)
        self.total = torch.zeros(B, dtype=like.dtype, device=like.device)
        if self.how == "rolling":
            self.ring = torch.zeros(B, self.window, dtype=like.dtype, device=like.device)
        if self.how == "sctopk":
            self.tail = torch.zeros(B, self.window - 1, dtype=like.dtype, device=like.device)
            self.best = torch.full((B, self.top_k), float("-inf"), dtype=like.dtype, device=like.device)

    def update(self, logits: Tensor, mask: Tensor) -> Tensor:
        if self.value is None:
            self._start(logits)
        assert self.value is not None and self.count is not None and self.seen is not None and self.total is not None
        if logits.shape[1] == 0:
            return self._out()
        attended = mask.to(logits.device).bool()
        m = scored(attended, self.skip, self.seen)
        self.seen = self.seen + attended.sum(1)
        if self.how == "mean":  # one sum for all new positions
            self.total = self.total + logits.masked_fill(~m, 0.0).sum(1)
            self.count = self.count + m.sum(1)
            self.value = torch.where(self.count > 0, self.total / self.count.clamp_min(1), self.value)
            return self._out()
        if self.how == "max":
            new = logits.masked_fill(~m, float("-inf")).amax(1)
            has = m.any(1)
            self.value = torch.where(has, torch.where(self.count > 0, torch.maximum(self.value, new), new), self.value)
            self.count = self.count + m.sum(1)
            return self._out()
        if self.how == "sctopk":
            return self._segments(logits, m)
        # ema and rolling: the whole chunk at once (a prompt of any length costs a few ops)
        rank = m.long().cumsum(1)  # 1-based rank of each scored new position
        k = rank[:, -1:]  # [B, 1] scored new positions per row
        if self.how == "ema":  # e_K = (1-a)^K e_0 + sum_i a (1-a)^(K-i) s_i, with e_0 = s_1 on an empty row
            first = logits.gather(1, (rank == 0).long().sum(1, keepdim=True).clamp_max(logits.shape[1] - 1))[:, 0]
            start = torch.where(self.count > 0, self.value, first)
            decay = torch.pow(1 - self.alpha, (k - rank).to(logits.dtype))
            fresh = (self.alpha * decay * logits).masked_fill(~m, 0.0).sum(1)
            nxt = torch.pow(1 - self.alpha, k[:, 0].to(logits.dtype)) * start + fresh
        else:  # the last `window` scored positions go to their ring slots; the rest would be overwritten
            assert self.ring is not None  # _start makes it for "rolling"
            keep = m & (rank > k - self.window)
            slot = torch.where(keep, (self.count[:, None] + rank - 1) % self.window, self.window)
            ring = torch.cat(
                [self.ring, self.ring.new_zeros(len(self.ring), 1)], 1
            )  # column `window`: discarded writes
            self.ring = ring.scatter(1, slot, logits)[:, : self.window]
            n = (self.count + k[:, 0]).clamp(1, self.window)
            filled = torch.arange(self.window, device=logits.device)[None, :] < n[:, None]
            nxt = self.ring.masked_fill(~filled, 0.0).sum(1) / n
        self.value = torch.where(k[:, 0] > 0, nxt, self.value)
        self.count = self.count + k[:, 0]
        return self._out()

    def _segments(self, logits: Tensor, m: Tensor) -> Tensor:
        """``sctopk`` on a chunk at once: the new scored logits (packed left) after the held tail, every
        whole segment ending at one of them scored by its mean, merged into the best so far."""
        assert self.tail is not None and self.best is not None and self.count is not None and self.total is not None
        B, n = logits.shape
        w, dev = self.window, logits.device
        k = m.sum(1)  # new scored positions per row
        order = torch.sort((~m).to(torch.int8), dim=1, stable=True).indices  # scored positions first, in order
        new = logits.gather(1, order).masked_fill(torch.arange(n, device=dev)[None, :] >= k[:, None], 0.0)
        held = self.count.clamp(max=w - 1)  # logits in the tail (right-aligned)
        ext = torch.cat([self.tail, new], 1)  # [B, w - 1 + n]; the valid run: [w - 1 - held, w - 1 + k)
        c = torch.nn.functional.pad(ext.cumsum(1), (1, 0))
        end = torch.arange(w - 1, w - 1 + n, device=dev)  # a segment ending at each new position
        means = (c[:, end + 1] - c[:, end + 1 - w]) / w
        whole = (end[None, :] < (w - 1 + k)[:, None]) & ((end[None, :] - (w - 1) + 1 + held[:, None]) >= w)
        cand = means.masked_fill(~whole, float("-inf"))
        self.best = torch.cat([self.best, cand], 1).topk(self.top_k, dim=1).values
        last = (w - 1 + k)[:, None] - (w - 1) + torch.arange(w - 1, device=dev)[None, :]  # the newest w - 1
        self.tail = ext.gather(1, last.clamp_min(0)).masked_fill(last < 0, 0.0)
        self.total = self.total + new.sum(1)
        self.count = self.count + k
        found = torch.isfinite(self.best)
        top = self.best.masked_fill(~found, 0.0).sum(1) / found.sum(1).clamp_min(1)
        self.value = torch.where(found[:, 0], top, self.total / self.count.clamp_min(1))
        return self._out()

    def _out(self) -> Tensor:
        assert self.value is not None and self.count is not None  # called from update, after _start
        return self.value.masked_fill(self.count == 0, float("-inf"))
