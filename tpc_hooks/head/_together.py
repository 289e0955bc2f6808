"""Several policies scored on one pass together: the members of a monitor set that read the
same site (:class:`Together`).

A policy's per-step path (:meth:`~tpc_hooks.Cascade.step`, :meth:`FixedOrder.step
<tpc_hooks.head._policy.FixedOrder.step>`) is a fixed number of small tensor operations
(37 for a gated cascade), each a kernel launch on a GPU. ``K`` policies of the same shape (same
width, degree or order, packed rank, gate and ``escalate_only``) are evaluated here as one
stacked computation: their inputs ``[K, n, d]``, standardised with each head's own scaler, one
matmul per member over its packed factors, and the exit rule of :meth:`Cascade.step
<tpc_hooks.Cascade.step>` with each member's calibration and exit thresholds broadcast over
``K``. Every element is computed by the same operations as when the member is scored alone, so
each result is the same bits (tested); the matmuls stay one per member because a batched one
rounds differently. Policies of another shape or class, or inputs of another row count, are
scored alone.
"""

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from . import _kernel
from ._cascade import Cascade, CascadeResult, step_exits
from ._policy import FixedOrder

_KEEP = 8  # stacks a Together keeps (a hot swap makes a new group; the oldest stack is dropped)


def _policy(rule: Any) -> Any:
    """The policy whose per-step rule ``rule`` is (None: not a policy's ``step``)."""
    policy = getattr(rule, "__self__", None)
    return policy if type(policy) in (Cascade, FixedOrder) and getattr(rule, "__name__", "") == "step" else None


def _key(policy: Any, z: Tensor) -> tuple | None:
    """What policies must share to be stacked with ``policy`` scoring ``z`` (None: scored alone)."""
    if policy is None or z.dim() != 2:
        return None
    head = policy.head
    order = head.degree if isinstance(policy, Cascade) else policy.order
    # the packed rank and the trust region are checked when the stack is made (_Stack.same)
    return (
        type(policy),
        order,
        head.d_model,
        head.gate,
        head.escalate_only,
        head.bias.dtype,
        head.bias.device,
        tuple(z.shape),
    )


class _Stack:
    """The stacked tensors of ``K`` policies of one shape, rebuilt when a member's packed
    weights are rebuilt (:func:`~tpc_hooks.head._kernel._packed` follows their parameters)."""

    def __init__(self, policies: Sequence[Any]):
        self.policies = list(policies)
        self.made: tuple = ((), ())  # what the stacked tensors were made from: (objects, values)
        self.tensors: tuple = ()
        self.same = True  # the members' packed ranks and trust regions agree (else each is scored alone)

    def _tensors(self, like: Tensor) -> tuple:
        heads = [p.head for p in self.policies]
        cascade = isinstance(self.policies[0], Cascade)
        order = heads[0].degree if cascade else self.policies[0].order
        packs = [_kernel._packed(h, order, like) for h in heads]
        steps = [p._step_tensors(like) for p in self.policies] if cascade else []
        # the packs (rebuilt when a parameter changes), held so an identity is not reused while compared,
        # and what the packs do not cover: the scalers (their version counters) and the exit thresholds
        made = (*packs, *(s[0] for s in steps))
        seen = tuple((h.scaler.mean._version, h.scaler.scale._version) for h in heads) + tuple(
            (p.lower, p.upper) for p in self.policies if cascade
        )
        if (
            len(made) != len(self.made[0])
            or any(a is not b for a, b in zip(made, self.made[0], strict=True))
            or seen != self.made[1]
        ):
            self.made, self.same = (
                (made, seen),
                len({(pk[6], _kernel.gating(h)) for pk, h in zip(packs, heads, strict=True)}) == 1,
            )
            if not self.same:
                self.tensors = ()
                return self.tensors
            with torch.no_grad():
                lo, hi, exps, lam, bias = (torch.stack([pk[i] for pk in packs]) for i in range(1, 6))
                w = [pk[0] for pk in packs]  # each member's own packed factors (the matmuls stay per member)
                mean = torch.stack([h.scaler.mean.to(like.dtype) for h in heads])[:, None]
                scale = torch.stack([h.scaler.scale.to(like.dtype) for h in heads])[:, None]
                calib = None
                if cascade:
                    exits = [(_kernel.logit_of(p.lower), _kernel.logit_of(p.upper)) for p in self.policies]
                    bounds = torch.tensor(exits, dtype=like.dtype).to(like.device)[:, None, :]
                    calib = (
                        torch.stack([s[0] for s in steps])[:, None],
                        torch.stack([s[1] for s in steps])[:, None],
                        torch.stack([s[2] for s in steps]),
                        bounds[..., :1],
                        bounds[..., 1:],
                    )
            self.tensors = (
                w,
                lo[:, None],
                hi[:, None],
                exps[:, None],
                lam[:, None],
                bias[:, None],
                packs[0][6],
                order,
                mean,
                scale,
                calib,
            )
        return self.tensors

    @torch.no_grad()
    def step(self, zs: Sequence[Tensor]) -> list[CascadeResult]:
        head = self.policies[0].head
        z = torch.stack(list(zs))
        if not z.is_floating_point() or z.dtype in (torch.float16, torch.bfloat16):
            z = z.float()
        z = z.to(device=head.bias.device, dtype=torch.promote_types(z.dtype, head.bias.dtype))
        got = self._tensors(z)
        if not self.same:
            return [p.step(x) for p, x in zip(self.policies, zs, strict=True)]
        w, lo, hi, exps, lam, bias, r, order, mean, scale, calib = got
        K, n = z.shape[0], z.shape[1]
        ok = z.abs().amax(-1) < math.inf  # as _kernel.stream_rows, per member
        zs_ = (torch.where(ok[..., None], z, 0.0) - mean) / scale
        # one matmul per member, on its own factors, into its own tensor, from rows 64-byte aligned as
        # its own would be: a batched matmul, or one reading or writing a misaligned slice of a shared
        # tensor, may round differently from the member's own
        aligned = n * z.shape[2] * zs_.element_size() % 64 == 0
        p = torch.stack([(zs_[k] if aligned else zs_[k].clone()) @ w[k] for k in range(K)])
        s, left = _kernel.packed_logits(head, p, lo, hi, exps, lam, bias, order, r)
        if calib is None:  # FixedOrder: every row exits at the order
            s = _kernel.nan_rows(s[..., -1], ok)
            return [self.policies[k]._result(s[k]) for k in range(K)]
        fields = step_exits(head, s, left, ok, *calib)
        # the exits are all Tensor fields, which mypy cannot match to their names
        return [
            CascadeResult(**{f: v[k] for f, v in fields.items()}, degree=head.degree)  # type: ignore[arg-type]
            for k in range(K)
        ]


class Together:
    """Scores several step policies on one pass, stacking those of one shape (see the module).

    :meth:`step` takes ``(rule, z)`` pairs, ``rule`` a policy's per-step rule (``policy.step``,
    what :class:`~tpc_hooks.Monitor` scores a generation with), and returns each pair's result,
    equal to ``rule(z)``. It keeps the stacked weights of the groups it has seen (rebuilt when a
    member's weights change), so one ``Together`` serves a whole generation or engine.

    Args:
        stacked: False: every pair is scored by its own rule, ``[rule(z) for rule, z in pairs]``
            (the same bits; what :attr:`MonitorSet.stacked <tpc_hooks.MonitorSet.stacked>` turns
            off, to measure what stacking saves or to rule it out while debugging).

    Example:
        >>> import torch, tpc_hooks as tpc
        >>> from tpc_hooks.head._together import Together
        >>> a, b = tpc.Cascade(tpc.TPC(8, 3, 2)), tpc.Cascade(tpc.TPC(8, 3, 2))
        >>> z = torch.randn(4, 8)
        >>> ra, rb = Together().step([(a.step, z), (b.step, z)])
        >>> torch.equal(ra.logits, a.step(z).logits), torch.equal(rb.exit_order, b.step(z).exit_order)
        (True, True)
        >>> apart = Together(stacked=False).step([(a.step, z), (b.step, z)])
        >>> torch.equal(apart[0].logits, ra.logits), torch.equal(apart[1].logits, rb.logits)
        (True, True)
    """

    def __init__(self, stacked: bool = True):
        self.stacked = stacked
        self.stacks: OrderedDict[tuple, _Stack] = OrderedDict()

    def step(self, pairs: Sequence[tuple[Any, Tensor]]) -> list[CascadeResult]:
        if not self.stacked:
            return [rule(z) for rule, z in pairs]
        out: list[Any] = [None] * len(pairs)
        groups: dict[tuple, list[int]] = {}
        policies = [_policy(rule) for rule, _ in pairs]
        for i, (rule, z) in enumerate(pairs):
            key = _key(policies[i], z)
            if key is None:
                out[i] = rule(z)
            else:
                groups.setdefault(key, []).append(i)
        for at in groups.values():
            if len(at) == 1:
                out[at[0]] = pairs[at[0]][0](pairs[at[0]][1])
                continue
            ids = tuple(id(policies[i]) for i in at)
            stack = self.stacks.get(ids)
            if stack is None:
                stack = self.stacks[ids] = _Stack([policies[i] for i in at])
                while len(self.stacks) > _KEEP:
                    self.stacks.popitem(last=False)
            self.stacks.move_to_end(ids)
            for i, res in zip(at, stack.step([pairs[i][1] for i in at]), strict=True):
                out[i] = res
        return out
