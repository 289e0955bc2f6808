"""Scoring policies: the rule that turns a head and activations into a decision.

A policy is called offline on checked activations (``policy(z)``) and per decode step on the
activations a generation produces (``policy.step(z)``: no host synchronisation; a row with
NaN/inf scores NaN instead of raising). Both return a :class:`~tpc_hooks.CascadeResult`.
:class:`~tpc_hooks.Cascade` is the adaptive policy; :class:`FixedOrder` always evaluates one
truncation.
"""

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from . import _kernel
from ._cascade import CascadeResult
from ._polynomial import TPC


@runtime_checkable
class Policy(Protocol):
    """What :class:`~tpc_hooks.Monitor` scores with: a :class:`~tpc_hooks.Cascade` or a
    :class:`FixedOrder` (or your own class with these members)."""

    head: TPC

    def __call__(self, z: Tensor) -> CascadeResult:
        """Offline: activations ``[batch, d_model]`` (checked) -> one result per row."""
        ...

    def step(self, z: Tensor) -> CascadeResult:
        """One decode step: the same scores, no host synchronisation (NaN/inf rows score NaN)."""
        ...


class FixedOrder:
    """A fixed truncation ``P_{:order}`` as a policy: every row exits at ``order``.

    Args:
        head: the :class:`~tpc_hooks.TPC`.
        order: the truncation, 1..``head.degree`` (1 is the linear probe; None: the full polynomial).

    Example:
        >>> import torch, tpc_hooks as tpc
        >>> head = tpc.TPC(8, 3, 2)
        >>> z = torch.randn(4, 8)
        >>> out = tpc.FixedOrder(head, 2)(z)
        >>> out.exit_order.tolist(), torch.equal(out.logits, head(z, order=2))
        ([2, 2, 2, 2], True)
    """

    def __init__(self, head: TPC, order: int | None = None):
        self.head, self.order = head, head.check_order(order)
        self.cost = head.cost(self.order).flops

    def __repr__(self) -> str:
        return f"FixedOrder(order={self.order}, degree={self.head.degree})"

    def _result(self, s: Tensor) -> CascadeResult:
        return CascadeResult(
            logits=s,
            probs=torch.sigmoid(s),
            exit_order=torch.full_like(s, self.order, dtype=torch.long),
            flops=torch.full_like(s, self.cost, dtype=torch.long),
            degree=self.head.degree,
            decision_logits=s,
        )

    @torch.no_grad()
    def __call__(self, z: Tensor) -> CascadeResult:
        return self._result(self.head(z, order=self.order))

    @torch.no_grad()
    def step(self, z: Tensor) -> CascadeResult:
        zs, ok = _kernel.stream_rows(self.head, z)
        return self._result(_kernel.nan_rows(_kernel.stream_logits(self.head, zs, self.order)[0][:, -1], ok))
