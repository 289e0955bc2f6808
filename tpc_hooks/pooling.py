"""Mask-aware pooling of per-token activations into one vector per sequence.

``mean`` averages the attended tokens, ``last`` takes the last attended token, ``max`` the
per-feature maximum over attended tokens. Left or right padding gives the same result,
because only the mask decides which positions count. :class:`RunningPool` does the same
incrementally for generation (prompt first, then one token per step).
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ._errors import TPCHooksError

POOLINGS = ("mean", "last", "max")


def check_pooling(how: str) -> str:
    if how not in POOLINGS:
        raise TPCHooksError(f"pooling must be one of {list(POOLINGS)}; got {how!r}")
    return how


def pool(acts: Float[Tensor, "batch pos d_model"], mask: Int[Tensor, "batch pos"] | Tensor, how: str = "mean") -> Float[Tensor, "batch d_model"]:
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
        if self.how == "mean":
            s, c = a.masked_fill(~m[..., None], 0.0).sum(1), m.sum(1, keepdim=True)
            self.total = s if self.total is None else self.total + s
            self.count = c if self.count is None else self.count + c
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

    def value(self) -> Float[Tensor, "batch d_model"]:
        if self.how == "mean":
            if self.total is None:
                raise TPCHooksError("RunningPool.value() called before any update")
            return self.total / self.count.clamp_min(1)
        if self.state is None:
            raise TPCHooksError("RunningPool.value() called before any update")
        return self.state
