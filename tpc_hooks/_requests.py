"""Per-request scoring for a serving engine (:class:`RequestScores`): the rule of
:class:`~tpc_hooks._generation.StepScores`, for requests that join and leave a running batch.

A serving engine (vLLM) packs the tokens of many requests into one flat forward pass: a
request may bring its whole prompt, a chunk of it, or the one token it decodes. Each request
keeps its own running pool (or per-token aggregate); the policy runs once per pass on every
request's new rows together.
"""

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ._cascade import Cascade, CascadeResult
from ._generation import StepScores
from ._kernel import forget_packs

FIELDS = ("logits", "probs", "decision_logits", "exit_order", "flops")


def _part(res: CascadeResult, a: int, b: int) -> CascadeResult:
    return CascadeResult(logits=res.logits[a:b], probs=res.probs[a:b], decision_logits=res.decision_logits[a:b],
                         exit_order=res.exit_order[a:b], flops=res.flops[a:b], degree=res.degree)


def _cat(parts: list[CascadeResult]) -> CascadeResult:
    return CascadeResult(**{f: torch.cat([getattr(p, f) for p in parts]) for f in FIELDS}, degree=parts[0].degree)


class RequestScores:
    """Running scores per request, keyed by the engine's request id.

    :meth:`update` takes one forward pass's pieces ``(request, rows [n, d_model], complete)``
    (``complete``: the request has now computed its whole prompt, so its newest row ends a
    step) and returns, for the complete ones, the monitor's result of everything the request
    has seen: the same numbers :class:`~tpc_hooks._generation.StepScores` gives a batch of one.
    Each request's results are kept, one per step (step 0: the prompt), until :meth:`take`.

    Example:
        >>> import torch, tpc_hooks as tpc
        >>> mon = tpc.Monitor(tpc.TPC(4, 2, 2), "blocks.0.hook_resid_post")
        >>> rs = RequestScores(mon)
        >>> ids, res = rs.update([("a", torch.randn(3, 4), True), ("b", torch.randn(2, 4), False)])
        >>> ids, res.probs.shape
        (['a'], torch.Size([1]))
        >>> sorted(rs.take())
        ['a']
    """

    def __init__(self, monitor: Any, order: int | None = None, cascade: float | Cascade | None = None):
        self.monitor = monitor
        forget_packs(monitor.head)
        self.rule = monitor._step_policy(order, cascade)
        self.states: dict[str, StepScores] = {}
        self.records: dict[str, list[CascadeResult]] = {}

    def restart(self, request: str) -> None:
        """The request's pool starts over (its tokens are computed again from the first, as after
        a preemption); the steps recorded so far stay."""
        if request in self.states:
            self.states[request].reset()

    def steps(self, request: str) -> int:
        """Steps recorded for ``request`` so far."""
        return len(self.records.get(request, ()))

    def update(self, pieces: Sequence[tuple[str, Tensor, bool]]) -> tuple[list[str], CascadeResult | None]:
        if not pieces:
            return [], None
        mon = self.monitor
        device = mon.head.bias.device
        feats = mon._features(torch.cat([rows for _, rows, _ in pieces]).to(device).float())
        sizes = [int(rows.shape[0]) for _, rows, _ in pieces]
        ends = torch.tensor(sizes).cumsum(0).tolist()
        states = [self.states.setdefault(rid, StepScores(mon, rule=self.rule)) for rid, _, _ in pieces]
        done = [rid for rid, _, complete in pieces if complete]
        if mon.pooling != "token":
            pooled = [st.pool(feats[e - n:e][None], torch.ones(1, n, device=device)) for st, n, e in zip(states, sizes, ends)]
            keep = [v for v, (_, _, complete) in zip(pooled, pieces) if complete]
            res = self.rule(torch.cat(keep)) if keep else None
        else:
            every = self.rule(feats)
            parts = [st.fold(_part(every, e - n, e), torch.ones(1, n, device=device))
                     for st, n, e in zip(states, sizes, ends)]
            keep = [p for p, (_, _, complete) in zip(parts, pieces) if complete]
            res = _cat(keep) if keep else None
        for j, rid in enumerate(done):
            self.records.setdefault(rid, []).append(_part(res, j, j + 1))
        return done, res

    def take(self, requests: Sequence[str] | None = None) -> dict[str, dict[str, Tensor]]:
        """The recorded steps of ``requests`` (default: all) as tensors ``[steps]`` per field on
        the host; forgets them and their running state."""
        out = {}
        for rid in list(self.records if requests is None else requests):
            recs = self.records.pop(rid, [])
            self.states.pop(rid, None)
            if recs:
                out[rid] = {f: torch.cat([getattr(r, f) for r in recs]).cpu() for f in FIELDS}
        if requests is None:
            self.states.clear()
        return out

    def forget(self, request: str) -> None:
        """Drops a request's state and records."""
        self.states.pop(request, None)
        self.records.pop(request, None)
