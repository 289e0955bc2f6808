"""Monitored generation: the decode loop behind :meth:`Monitor.generate`, the hooks behind
:meth:`Monitor.watch`, and the per-step scoring rule they and the Hugging Face ``generate``
hooks share (:class:`StepScores`). What they record is in ``_records``.

Both read the site's activations from the model's own forward passes (through the adapter),
keep a running pool per sequence and score it with the monitor's policy every step.
"""

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError
from ..activations import pad, pad_id
from ..data import check_prompts
from ..head import Cascade, CascadeResult, Together, forget_packs
from ..metrics import flagged
from ..pooling import RunningAggregate, RunningPool, scored
from ._monitor_config import STOPPING
from ._records import GenerationRun, MonitorEvent, WatchLog, warn_nonfinite


class StepScores:
    """THE rule a monitor applies to each forward pass while a model generates (used by
    :meth:`Monitor.generate`, :meth:`Monitor.watch` and the Hugging Face ``generate`` hooks).

    :meth:`update` takes the new positions' activations ``[B, n, d_model]`` and their mask and
    returns the monitor's :class:`~tpc_hooks.CascadeResult` per row for everything the row has
    seen since :meth:`reset`. A prefix-pooled monitor pools the activations (running mean, last
    or max) and scores the pooled vector; a per-token monitor (``pooling="token"``) scores every
    new token and aggregates the logits over time (:class:`~tpc_hooks.pooling.RunningAggregate`):
    ``logits`` is the aggregate, ``probs`` its sigmoid, ``exit_order`` the newest token's order
    and ``flops`` what the row's tokens have cost so far (as :meth:`Monitor.score` counts a
    prefix). A response monitor (``reads="answer"``) pools nothing of a pass marked ``prompt``;
    a row with no answer token pooled yet scores logit ``-inf`` (:func:`unscored`). Nothing is read
    back to the host.
    """

    def __init__(
        self,
        monitor: Any,
        order: int | None = None,
        cascade: float | Cascade | None = None,
        *,
        rule: Callable[[Tensor], CascadeResult] | None = None,
    ):
        self.monitor = monitor
        if rule is None:
            # the weights are read afresh for every generation: edits through .data (which no version
            # counter sees) between two generations reach the per-step path
            forget_packs(monitor.head)
            rule = monitor._step_policy(order, cascade)
        self.rule = rule
        self.state: Any = None
        self.spent: Tensor | int | None = None  # 0 before a per-token monitor's first pass
        self.answered = False  # a response monitor has pooled an answer row (see started)

    def reset(self) -> None:
        self.state = self.spent = None
        self.answered = False

    def update(self, acts: Tensor, mask: Tensor, prompt: bool = False) -> CascadeResult:
        return self.finish(self.rule(self.inputs(acts, mask, prompt)), mask)

    def inputs(self, acts: Tensor, mask: Tensor, prompt: bool = False) -> Tensor:
        """The first half of :meth:`update`: the rows the policy scores for this pass, ``[B, D]``
        (the running pool) or ``[B * n, D]`` (a per-token monitor's new tokens). ``prompt``: the
        pass computes the prompt (a response monitor pools none of it)."""
        feats = self.monitor._features(acts)
        if self.monitor.pooling != "token":
            return self.pool(feats, mask, prompt)
        B, n, D = feats.shape
        return feats.reshape(B * n, D)

    def finish(self, res: CascadeResult, mask: Tensor) -> CascadeResult:
        """The second half of :meth:`update`: the policy's result on :meth:`inputs` -> the step's."""
        if self.monitor.pooling == "token":
            return self.fold(res, mask)
        return unscored(res, self.state.empty()) if self.monitor.answers else res

    def pool(self, feats: Tensor, mask: Tensor, prompt: bool = False) -> Tensor:
        """A prefix-pooled monitor: adds ``feats [B, n, D]`` to the running pool, returns it ``[B, D]``
        (a response monitor: a pass marked ``prompt`` adds nothing; rows with nothing pooled yet
        are zeros, which :meth:`finish` scores ``-inf``)."""
        if self.state is None:
            self.state = RunningPool(self.monitor.pooling)
        if not self.monitor.answers:
            self.state.update(feats, mask)
            return self.state.value()
        if not prompt and feats.shape[1]:
            self.state.update(feats, mask)
            self.answered = True  # rows of a serving engine's request are all real: one of them is pooled
        empty = self.state.empty()
        if empty is None:  # nothing pooled in any row yet
            return feats.new_zeros(feats.shape[0], feats.shape[2], dtype=torch.float32)
        return self.state.value().masked_fill(empty[:, None], 0.0)

    def started(self) -> bool:
        """Whether the running state has seen a row (the serving engine's batched decode step needs
        one): a response monitor's pool once an answer row was pooled, any other state once made.
        Read on the host, with no device synchronisation (a serving engine asks every step)."""
        if self.state is None:
            return False
        return self.answered or not (self.monitor.answers and isinstance(self.state, RunningPool))

    def fold(self, res: CascadeResult, mask: Tensor) -> CascadeResult:
        """A per-token monitor: folds the new tokens' results (``res`` over ``B * n`` rows, ``mask
        [B, n]``) into the running aggregate; returns the aggregate per row."""
        mon = self.monitor
        if self.state is None:
            self.state, self.spent = RunningAggregate(mon.aggregate, mon.alpha, mon.window, mon.skip, mon.top_k), 0
        assert self.spent is not None  # set with the state
        B, n = mask.shape
        m = mask.to(res.logits.device).bool()
        on = scored(m, mon.skip, self.state.seen)  # before update: the tokens this pass scores
        agg = self.state.update(res.logits.reshape(B, n), m)
        newest = torch.where(m, torch.arange(n, device=m.device), -1).amax(1).clamp_min(0)[:, None]
        self.spent = self.spent + res.flops.reshape(B, n).masked_fill(~on, 0).sum(1)
        return CascadeResult(
            logits=agg,
            probs=torch.sigmoid(agg),
            decision_logits=agg,
            exit_order=res.exit_order.reshape(B, n).gather(1, newest)[:, 0],
            flops=self.spent,
            degree=res.degree,
        )


def unscored(res: CascadeResult, empty: Tensor | None) -> CascadeResult:
    """``res`` with the rows in ``empty`` (``[B]`` bool; None: every row) unscored: logit ``-inf``,
    probability 0, no FLOPs (a response monitor before its first answer token: never flagged)."""
    if empty is None:
        empty = torch.ones(res.logits.shape[0], dtype=torch.bool, device=res.logits.device)
    e = empty.to(res.logits.device)
    if not e.shape[0]:
        return res
    neg = torch.tensor(float("-inf"), device=res.logits.device, dtype=res.logits.dtype)
    return CascadeResult(
        logits=torch.where(e, neg, res.logits),
        probs=res.probs.masked_fill(e.to(res.probs.device), 0.0),
        decision_logits=torch.where(
            e.to(res.decision_logits.device), neg.to(res.decision_logits.dtype), res.decision_logits
        ),
        exit_order=res.exit_order,
        flops=res.flops.masked_fill(e.to(res.flops.device), 0),
        degree=res.degree,
    )


class Lane:
    """One monitor's part in a monitored pass: the site it reads, its running scores, its
    threshold, whether its flags end a row (``action="stop"``) and the run it records. A
    :class:`Monitor` runs as one lane (named ``""``); a :class:`~tpc_hooks.MonitorSet` as one
    per member, all fed by the same forward passes (each site read once)."""

    def __init__(self, name: str, monitor: Any, scores: StepScores, action: Any, what: str):
        self.name, self.monitor, self.scores = name, monitor, scores
        self.site = monitor.site
        self.threshold = float(monitor.threshold)
        self.stops = not callable(action) and action in STOPPING  # a callable action is decided by the loop itself
        self.what = f"{what} ({name})" if name else what
        self.log = GenerationRun._recording(self.threshold, self.what)

    def update(self, acts: dict[str, Tensor], mask: Tensor, prompt: bool = False) -> CascadeResult:
        return self.scores.update(acts[self.site], mask, prompt)


def score_lanes(
    lanes: Sequence[Lane], acts: dict[str, Tensor], mask: Tensor, together: Together, prompt: bool = False
) -> list[CascadeResult]:
    """Every lane's result for one pass, the lanes whose policies share a shape scored together
    (:class:`~tpc_hooks.head._together.Together`: one stacked evaluation; each lane's result
    is the one it gets alone). ``prompt``: the pass computes the prompt (response monitors pool
    none of it)."""
    if len(lanes) == 1:
        return [lanes[0].update(acts, mask, prompt)]
    zs = [lane.scores.inputs(acts[lane.site], mask, prompt) for lane in lanes]
    got = together.step([(lane.scores.rule, z) for lane, z in zip(lanes, zs, strict=True)])
    return [lane.scores.finish(res, mask) for lane, res in zip(lanes, got, strict=True)]


def stacked(monitor: Any) -> bool:
    """Whether a monitored loop stacks the lanes of ``monitor`` whose policies share a shape: a
    :class:`~tpc_hooks.MonitorSet`'s :attr:`~tpc_hooks.MonitorSet.stacked`; a lone monitor's one
    lane, True."""
    return getattr(monitor, "stacked", True)


def lanes_of(
    monitor: Any, what: str, *, order: int | None = None, cascade: float | Cascade | None = None, action: Any = "flag"
) -> list[Lane]:
    """The lanes a monitor (with ``order``/``cascade``) or a set (each member with its own
    policy; ``action``: one for all, a dict by name, or None for the set's) runs."""
    members = monitor._members(action)
    if (order is not None or cascade is not None) and members[0][0]:
        raise TPCHooksError(
            "a MonitorSet scores each member with its own policy: set order/cascade on the member "
            "(monitor.cascade = ...), not on the set's call"
        )
    return [Lane(name, m, StepScores(m, order, cascade), act, what) for name, m, act in members]


@torch.no_grad()
def generate(
    monitor: Any,
    model: Any,
    prompts: Sequence[str],
    max_new_tokens: int = 32,
    action: str | Callable | Mapping[str, str] | None = "flag",
    *,
    order: int | None = None,
    cascade: float | Cascade | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
    stop_at_eos: bool = True,
    tokenizer: Any = None,
) -> Any:
    """See :meth:`tpc_hooks.Monitor.generate` (and :meth:`tpc_hooks.MonitorSet.generate`: ``monitor``
    a set, whose lanes share every pass; returns a :class:`~tpc_hooks.MonitorSetRun`).

    Every step's scores, liveness and tokens stay on the model's device and reach the host once,
    at the end. Per step the loop reads one bool back (whether any row goes on, as Hugging
    Face ``generate`` does); a callable ``action`` also reads the flagged rows, since it decides
    on the host.
    """
    adapter = monitor._adapter(model, tokenizer=tokenizer)
    items = check_prompts(prompts)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise TPCHooksError(f"max_new_tokens must be an integer >= 0; got {max_new_tokens!r}")
    lanes = lanes_of(monitor, "monitor.generate", order=order, cascade=cascade, action=action)
    together = Together(stacked=stacked(monitor))
    if do_sample and not temperature > 0:
        raise TPCHooksError(f"temperature must be positive; got {temperature!r}")
    sites = [adapter.site(lane.site) for lane in lanes]
    tok = adapter.tokenizer
    ids, _ = adapter.tokenize(
        items, chat_template=monitor.chat_template, max_tokens=monitor.max_tokens, prepend_bos=monitor.prepend_bos
    )
    if adapter.engine:
        return _engine_run(
            monitor,
            adapter,
            ids,
            max_new_tokens,
            action,
            order=order,
            cascade=cascade,
            do_sample=do_sample,
            temperature=temperature,
            seed=seed,
            stop_at_eos=stop_at_eos,
        )
    input_ids, mask = pad(ids, pad_id(tok), "left")
    B = len(ids)
    eos = getattr(tok, "eos_token_id", None) if stop_at_eos else None
    tokens: list[Tensor] = []  # per step after the first: the token fed to each row (pad on ended rows)
    fed: list[Tensor] = []  # ... and which rows it was fed to
    stopped: list[int | None] = [None] * B  # for a callable action: the step it asked to stop
    state: dict[str, Any] = {"t": 0, "live": None, "gen": None}

    def row_tokens(b: int) -> list[int]:
        if not tokens:
            return list(ids[b])
        tk, on = torch.stack(tokens)[:, b].tolist(), torch.stack(fed)[:, b].tolist()
        return list(ids[b]) + [x for x, f in zip(tk, on, strict=True) if f]

    def on_step(acts: dict[str, Tensor], step_mask: Tensor, last_logits: Tensor):
        t, device = state["t"], last_logits.device
        live = state["live"] if t else torch.ones(B, dtype=torch.bool, device=device)
        done = torch.zeros_like(live)
        for lane, res in zip(lanes, score_lanes(lanes, acts, step_mask, together, prompt=t == 0), strict=True):
            lane.log._append(res, live)
            hit = live & flagged(res.decision_logits, lane.threshold).to(device)
            if lane.stops:
                done = done | hit
            if callable(action):
                rows = hit.nonzero().flatten().tolist()  # the callable decides on the host, now
                if rows:
                    probs, exits = res.probs[rows].tolist(), res.exit_order[rows].tolist()
                    for j, b in enumerate(rows):
                        if action(
                            MonitorEvent(row=b, step=t, score=probs[j], exit_order=exits[j], tokens=row_tokens(b))
                        ):
                            stopped[b] = t
                            done[b] = True
        if t > 0 and eos is not None:  # the token fed at this step was EOS: the row ends after it is scored
            done = done | (tokens[-1] == eos)
        live = live & ~done
        state["live"] = live
        if t == max_new_tokens or not bool(live.any()):  # the loop's own read each step, as in HF generate
            return None
        if do_sample:
            if state["gen"] is None:
                state["gen"] = torch.Generator(device=device).manual_seed(seed)
            probs_next = torch.softmax(last_logits.float() / temperature, -1)
            nxt = torch.multinomial(probs_next, 1, generator=state["gen"]).flatten()
        else:
            nxt = last_logits.argmax(-1)
        nxt = torch.where(live, nxt, torch.full_like(nxt, pad_id(tok)))
        tokens.append(nxt)
        fed.append(live)
        state["t"] = t + 1
        return nxt, live

    with adapter.exclusive():  # the loop's passes are this thread's alone
        adapter.decode(input_ids, mask, sites, max_new_tokens, on_step)
    seqs = [list(t) for t in ids]
    if tokens:
        tk, on = torch.stack(tokens).cpu(), torch.stack(fed).cpu()
        seqs = [seqs[b] + tk[on[:, b], b].tolist() for b in range(B)]
    for lane in lanes:
        log = lane.log
        log.sequences, log.prompt_lengths, log.tokenizer = seqs, [len(t) for t in ids], tok
        if not lane.stops:  # "stop": each row's first flagged step
            log._flags["stopped_at"] = stopped if callable(action) else [None] * B
        log._copy()  # the one host copy of every step (and the NaN warning), before the run is returned
    return monitor._result({lane.name: lane.log for lane in lanes})


def _engine_run(
    monitor: Any,
    adapter: Any,
    ids: list[list[int]],
    max_new_tokens: int,
    action: Any,
    *,
    order: int | None,
    cascade: float | Cascade | None,
    **sampling: Any,
) -> Any:
    """:func:`generate` through a serving engine that runs its own loop and scores in its workers
    (vLLM): the steps come back per request (and per member of a set), the runs are built from them."""
    if callable(action):
        raise TPCHooksError(
            f"a callable action decides on the host every step; {adapter.toolkit} scores and stops "
            "requests inside its workers: use action='flag' or 'stop'"
        )
    if isinstance(cascade, Cascade):  # a Cascade object travels as the monitor's own
        monitor.policy(cascade=cascade)  # checks it wraps this head
        monitor = type(monitor)(monitor.head, config=monitor.config, cascade=cascade)
        cascade = None
    got = adapter.generate(
        monitor,
        ids,
        max_new_tokens,
        action,
        order=order,
        cascade=None if cascade is None else float(cascade),
        **sampling,
    )
    return monitor._result(
        {
            name: _engine_rows(m, adapter, ids, got["tokens"], got["runs"][name])
            for name, m, _ in monitor._members(action)
        }
    )


def _engine_rows(
    monitor: Any, adapter: Any, ids: list[list[int]], tokens: list[list[int]], got: list[dict[str, Any]]
) -> GenerationRun:
    """One monitor's :class:`GenerationRun` from the steps an engine's workers recorded."""

    def as_tensor(k, dtype):
        return [torch.tensor(r[k], dtype=dtype) for r in got]

    run = GenerationRun(
        sequences=[list(p) + t for p, t in zip(ids, tokens, strict=True)],
        prompt_lengths=[len(p) for p in ids],
        scores=as_tensor("probs", torch.float32),
        logits=as_tensor("logits", torch.float32),
        decision_logits=as_tensor("decision_logits", torch.float32),
        exit_orders=as_tensor("exit_order", torch.long),
        flops=as_tensor("flops", torch.long),
        threshold=float(monitor.threshold),
        tokenizer=adapter.tokenizer,
    )
    run._flags["stopped_at"] = [r["stopped_at"] for r in got]
    steps = max((len(s) for s in run.scores), default=0)
    padded = torch.full((steps, len(ids)), 0.0)
    for b, s in enumerate(run.scores):
        padded[: len(s), b] = s
    warn_nonfinite(padded, None, "monitor.generate")
    return run


@contextmanager
def watch(
    monitor: Any,
    model: Any,
    *,
    order: int | None = None,
    cascade: float | Cascade | None = None,
    on_flag: Callable[[MonitorEvent], Any] | None = None,
    tokenizer: Any = None,
) -> Iterator[Any]:
    """See :meth:`tpc_hooks.Monitor.watch` (a set: one :class:`WatchLog` per member, by name)."""
    adapter = monitor._adapter(model, tokenizer=tokenizer)
    lanes = lanes_of(monitor, "monitor.watch", order=order, cascade=cascade)
    sites = [adapter.site(lane.site) for lane in lanes]
    logs = [WatchLog(threshold=lane.threshold) for lane in lanes]

    together = Together(stacked=stacked(monitor))

    def on_acts(acts: dict[str, Tensor], mask: Tensor, fresh: bool) -> None:
        if fresh:
            for lane in lanes:
                lane.scores.reset()
        with torch.no_grad():  # a call's first pass computes the prompt
            results = score_lanes(lanes, acts, mask, together, prompt=fresh)
        for lane, log, res in zip(lanes, logs, results, strict=True):
            log.results.append(res)
            log.fresh.append(fresh)
            log.new_tokens.append(int(mask.shape[1]))
            if on_flag is not None:
                # the callback decides on the host: one copy per step, not one per flagged row
                hits = flagged(res.decision_logits, lane.threshold).tolist()
                probs, exits = res.probs.tolist(), res.exit_order.tolist()
                for b in (b for b, f in enumerate(hits) if f):
                    on_flag(
                        MonitorEvent(
                            row=b,
                            step=len(log) - 1,
                            score=probs[b],
                            exit_order=exits[b],
                            tokens=[],
                            monitor=lane.name or None,
                        )
                    )

    with adapter.observe_sites(sites, on_acts):
        yield logs[0] if not lanes[0].name else {lane.name: log for lane, log in zip(lanes, logs, strict=True)}
    for lane, log in zip(lanes, logs, strict=True):
        if log.results:  # one read at the end: did any call score NaN?
            bad = torch.stack([r.probs.isnan().sum() for r in log.results]).cpu()
            if bool(bad.any()):
                warnings.warn(
                    f"{lane.what}: the monitor's site held NaN/inf activations in {int((bad > 0).sum())} of {len(bad)} "
                    f"forward passes (first: call {int(bad.nonzero()[0])}); those rows' scores are NaN and count as "
                    "flagged. An overflowing float16 forward pass is a common cause",
                    RuntimeWarning,
                    stacklevel=3,
                )
