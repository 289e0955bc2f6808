"""Per-request scoring for a serving engine (:class:`RequestScores`): the rule of
:class:`~tpc_hooks.monitoring._generation.StepScores`, for requests that join and leave a running batch.

A serving engine (vLLM) packs the tokens of many requests into one flat forward pass: a
request may bring its whole prompt, a chunk of it, or the one token it decodes. Each request
keeps its own running pool (or per-token aggregate); the policy runs once per pass on every
request's new rows together.
"""

import copy
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..head import Cascade, CascadeResult, forget_packs, freeze_packs
from ..pooling import RunningPool
from ._generation import StepScores, unscored

FIELDS = ("logits", "probs", "decision_logits", "exit_order", "flops")


def _part(res: CascadeResult, a: int, b: int) -> CascadeResult:
    return CascadeResult(
        logits=res.logits[a:b],
        probs=res.probs[a:b],
        decision_logits=res.decision_logits[a:b],
        exit_order=res.exit_order[a:b],
        flops=res.flops[a:b],
        degree=res.degree,
    )


def _pick(res: CascadeResult, index: Tensor | slice) -> CascadeResult:
    return CascadeResult(**{f: getattr(res, f)[index] for f in FIELDS}, degree=res.degree)


def _cat(parts: list[CascadeResult]) -> CascadeResult:
    return CascadeResult(
        **{f: torch.cat([getattr(p, f) for p in parts]) for f in FIELDS},  # type: ignore[arg-type]  # Tensor fields
        degree=parts[0].degree,
    )


def _frozen(obj: Any) -> Any:
    """A copy of a running state whose tensors are its own (a snapshot later updates cannot reach)."""
    out = copy.copy(obj)
    for k, v in vars(obj).items():
        if isinstance(v, Tensor):
            setattr(out, k, v.clone())
    return out


def _stacked(objs: list[Any]) -> Any:
    """One state object for a batch of requests: each tensor attribute of ``objs`` (a batch of
    one each) concatenated along the batch; everything else from the first."""
    out = copy.copy(objs[0])
    for k, v in vars(objs[0]).items():
        if isinstance(v, Tensor):
            setattr(out, k, torch.cat([getattr(o, k) for o in objs]))
    return out


def _unstacked(batched: Any, objs: list[Any]) -> None:
    """The batch's new state back into each request's object (views, one per request)."""
    for k, v in vars(batched).items():
        if isinstance(v, Tensor):
            for o, part in zip(objs, v.split(1), strict=True):
                setattr(o, k, part)


class RequestScores:
    """Running scores per request, keyed by the engine's request id.

    :meth:`update` takes one forward pass's pieces ``(request, rows [n, d_model], complete)``
    (``complete``: the request has now computed its whole prompt, so its newest row ends a
    step) and returns, for the complete ones, the monitor's result of everything the request
    has seen: the same numbers :class:`~tpc_hooks.monitoring._generation.StepScores` gives a batch of one.
    Each request's results are kept, one per step (step 0: the prompt), until :meth:`take`.
    With ``cuts``, it also hands ``keep(request, offset, state)`` the request's running state
    after each given number of its new rows (a serving engine keeps it per KV block), and
    :meth:`restore` starts a request from such a state (its prefix read from the engine's cache).

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

    def __init__(
        self, monitor: Any, order: int | None = None, cascade: float | Cascade | None = None, *, frozen: bool = False
    ):
        self.monitor = monitor
        forget_packs(monitor.head)
        if frozen:  # the caller owns the head: its parameters cannot change while it scores
            freeze_packs(monitor.head)
        self.rule = monitor._step_policy(order, cascade)
        self.states: dict[str, StepScores] = {}
        self.records: dict[str, list[tuple[Any, ...]]] = {}  # per step: the FIELDS' values
        self.keep_inputs = False  # True: `inputs` holds what the last update's results scored (a review log reads it)
        self.inputs: Tensor | None = None
        self._pending: Any = None  # between begin and end: what end needs to finish the pass

    def restart(self, request: str) -> None:
        """The request's pool starts over (its tokens are computed again from the first, as after
        a preemption); the steps recorded so far stay."""
        if request in self.states:
            self.states[request].reset()

    def snapshot(self, request: str) -> Any:
        """The request's running state, as :meth:`restore` takes it back (a copy)."""
        st = self.states[request]
        return _frozen(st.state), (st.spent.clone() if isinstance(st.spent, Tensor) else st.spent)

    def restore(self, request: str, snapshot: Any) -> None:
        """The request goes on from ``snapshot`` (what :meth:`snapshot` gave for the same prefix)."""
        st = self.states.setdefault(request, StepScores(self.monitor, rule=self.rule))
        st.state, st.spent = copy.copy(snapshot[0]), snapshot[1]
        st.answered = True  # a response monitor's states are kept only after an answer row

    def steps(self, request: str) -> int:
        """Steps recorded for ``request`` so far."""
        return len(self.records.get(request, ()))

    def update(
        self,
        pieces: Sequence[tuple[str, Tensor, bool]],
        cuts: Sequence[Sequence[int]] | None = None,
        keep: Callable[[str, int, Any], None] | None = None,
    ) -> tuple[list[str], CascadeResult | None]:
        if not pieces:
            return [], None
        return self.update_flat(
            [rid for rid, _, _ in pieces],
            torch.cat([rows for _, rows, _ in pieces]),
            [int(rows.shape[0]) for _, rows, _ in pieces],
            [c for _, _, c in pieces],
            cuts,
            keep,
        )

    def update_flat(
        self,
        requests: Sequence[str],
        rows: Tensor,
        sizes: Sequence[int],
        complete: Sequence[bool],
        cuts: Sequence[Sequence[int]] | None = None,
        keep: Callable[[str, int, Any], None] | None = None,
    ) -> tuple[list[str], CascadeResult | None]:
        """:meth:`update` with the pieces' rows already in one tensor ``[sum(sizes), d_model]``, in
        the order of ``requests`` (a serving engine's flat batch: no copy of the rows)."""
        z = self.begin(requests, rows, sizes, complete, cuts, keep)
        return self.end(None if z is None else self.rule(z))

    def begin(
        self,
        requests: Sequence[str],
        rows: Tensor,
        sizes: Sequence[int],
        complete: Sequence[bool],
        cuts: Sequence[Sequence[int]] | None = None,
        keep: Callable[[str, int, Any], None] | None = None,
    ) -> Tensor | None:
        """The first half of :meth:`update_flat`: the rows its policy scores for this pass (the
        pools of the requests that complete a step, or a per-token monitor's every new row), or
        None when nothing is scored. :meth:`end` takes the policy's result on them (several
        monitors' policies can score their halves together in between)."""
        self._pending = None
        if not requests:
            return None
        cuts = [()] * len(requests) if cuts is None else cuts
        mon = self.monitor
        feats = mon._features(rows.to(mon.head.bias.device).float())
        if mon.pooling == "token":  # every new row is scored; the pieces are folded in afterwards (end)
            self._pending = (requests, feats, sizes, complete, cuts, keep)
            return feats
        z, self._pending = self._pieces(None, requests, feats, sizes, complete, cuts, keep)
        return z

    def end(self, res: CascadeResult | None) -> tuple[list[str], CascadeResult | None]:
        """The second half of :meth:`update_flat`: the policy's result on what :meth:`begin`
        returned -> the requests that completed a step and their results (recorded)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return [], None
        if self.monitor.pooling == "token":
            _, (done, res) = self._pieces(res, *pending)
        else:
            done, pooled, empty = pending
            if self.keep_inputs:  # each done request's pool
                self.inputs = pooled
            if empty is not None and res is not None:  # a response monitor's requests with no answer token yet
                res = unscored(res, empty)
        if not done:
            return [], None
        vals = [getattr(res, f).tolist() for f in FIELDS]
        for j, rid in enumerate(done):
            self.records.setdefault(rid, []).append(tuple(v[j] for v in vals))
        return done, res

    def _pieces(
        self,
        every: CascadeResult | None,
        requests: Sequence[str],
        feats: Tensor,
        sizes: Sequence[int],
        complete: Sequence[bool],
        cuts: Sequence[Sequence[int]],
        keep: Callable[[str, int, Any], None] | None,
    ) -> tuple[Tensor | None, tuple]:
        """Pools (or folds ``every``, a per-token monitor's result on every new row) each piece
        into its request's state; returns ``(rows to score, (done requests, pools, unscored))`` for
        a pooled monitor (``unscored``: a response monitor's done requests with no answer token
        pooled, else None), ``(None, (done requests, result))`` for a per-token one. A response
        monitor's pieces carry answer rows only (the engine leaves the prompt's out): a piece of no
        row that completes a step is the prompt's end, step 0."""
        mon = self.monitor
        device = mon.head.bias.device
        ends = list(itertools.accumulate(sizes))
        states = [self.states.setdefault(rid, StepScores(mon, rule=self.rule)) for rid in requests]
        # one token each, with a running state (every decode step): one batched update for all of them
        group = [k for k, (st, n) in enumerate(zip(states, sizes, strict=True)) if n == 1 and st.started()]
        grouped = set(group)
        alone = [k for k in range(len(requests)) if k not in grouped]
        token = mon.pooling == "token"
        outs: list[Any] = []  # per piece: its pooled vector [1, D] or its result (one row)
        got: CascadeResult | Tensor
        order: list[int] = []
        if group:
            every_row = len(group) == len(feats)  # the usual decode step: one row per request, all of them
            last = slice(None) if every_row else torch.tensor([ends[k] - 1 for k in group], device=device)
            if token:
                batch = StepScores(mon, rule=self.rule)
                batch.state = _stacked([states[k].state for k in group])
                assert every is not None  # end() passes a per-token monitor's result
                # a request with a running state has spent a Tensor of FLOPs (mypy sees int | None too)
                batch.spent = torch.cat([states[k].spent for k in group])  # type: ignore[misc]
                got = batch.fold(_pick(every, last), torch.ones(len(group), 1, device=device))
                _unstacked(batch.state, [states[k].state for k in group])
                for k, part in zip(group, batch.spent.split(1), strict=True):
                    states[k].spent = part
            else:
                got = RunningPool.add_rows([states[k].state for k in group], feats if every_row else feats[last])
            outs.append(got)
            order += group
            for k in group:
                if cuts[k]:
                    assert keep is not None  # cuts come with keep
                    keep(requests[k], 1, self.snapshot(requests[k]))
        for k in alone:
            n, e = sizes[k], ends[k]
            marks = [c for c in cuts[k] if 0 < c < n]
            for lo, hi in zip([0, *marks], [*marks, n], strict=True):  # a kept state splits the rows at its offset
                ones = torch.ones(1, hi - lo, device=device)
                a, b = e - n + lo, e - n + hi
                if token:
                    assert every is not None  # end() passes a per-token monitor's result
                    got = states[k].fold(_part(every, a, b), ones)
                else:
                    got = states[k].pool(feats[a:b][None], ones)
                if hi in cuts[k]:
                    assert keep is not None  # cuts come with keep
                    keep(requests[k], hi, self.snapshot(requests[k]))
            outs.append(got)
            order += [k]
        done_k = [k for k in sorted(order) if complete[k]]
        done = [requests[k] for k in done_k]
        if not done:
            return None, (([], None) if token else ([], None, None))
        place = {k: i for i, k in enumerate(order)}
        at = [place[k] for k in done_k]
        pick = slice(None) if at == list(range(len(order))) else torch.tensor(at, device=device)
        if token:
            if self.keep_inputs:  # each done request's newest token row
                self.inputs = feats[torch.tensor([ends[k] - 1 for k in done_k], device=device)]
            return None, (done, _pick(_cat(outs) if len(outs) > 1 else outs[0], pick))
        pooled = torch.cat(outs) if len(outs) > 1 else outs[0]
        pooled = pooled if isinstance(pick, slice) else pooled[pick]
        empty = None
        if mon.answers:  # a response monitor: which done requests have pooled no answer token yet
            empty = torch.tensor([not states[k].started() for k in done_k], device=device)
        return pooled, (done, pooled, empty)

    def take(self, requests: Sequence[str] | None = None) -> dict[str, dict[str, Tensor]]:
        """The recorded steps of ``requests`` (default: all) as tensors ``[steps]`` per field on
        the host; forgets them and their running state."""
        out = {}
        for rid in list(self.records if requests is None else requests):
            recs = self.records.pop(rid, [])
            self.states.pop(rid, None)
            if recs:
                cols = list(zip(*recs, strict=True))
                out[rid] = {
                    f: torch.tensor(c, dtype=torch.long if f in ("exit_order", "flops") else torch.float32)
                    for f, c in zip(FIELDS, cols, strict=True)
                }
        if requests is None:
            self.states.clear()
        return out

    def forget(self, request: str) -> None:
        """Drops a request's state and records."""
        self.states.pop(request, None)
        self.records.pop(request, None)
