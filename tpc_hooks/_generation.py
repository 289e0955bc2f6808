"""Monitored generation: the decode loop behind :meth:`Monitor.generate`, the hooks behind
:meth:`Monitor.watch`, and the records they return (:class:`GenerateLog` is filled by the
monitor's ``stopping_criteria`` / ``logits_processor`` inside Hugging Face ``generate``).

Both read the site's activations from the model's own forward passes (through the adapter),
keep a running pool per sequence and score it with the monitor's policy every step.
"""

import html
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ._cascade import Cascade, CascadeResult
from ._collect import check_prompts
from ._errors import TPCHooksError
from ._kernel import flagged
from .adapters import pad, pad_id
from .pooling import RunningAggregate, RunningPool, scored
from .views import generation_html


@dataclass(frozen=True)
class MonitorEvent:
    """What a callback ``action`` sees when a generating sequence is flagged."""

    row: int
    step: int
    score: float
    exit_order: int
    tokens: list[int]


@dataclass
class GenerationRun:
    """Monitored generation, per sequence ``b``.

    ``sequences[b]``: prompt tokens (as the monitor tokenised them) + generated tokens, no
    padding. ``scores[b][t]``: the monitor's probability for ``sequences[b][:prompt_lengths[b] + t]``
    (t = 0 is the prompt alone: the pre-generation gate). ``exit_orders``, ``flops`` and
    ``logits`` follow the same steps, and ``decision_logits``: the logits the flags compare with
    ``logit(threshold)`` (``scores`` are their sigmoid; empty in a run built by hand, whose
    flags then read ``scores``). ``flagged[b]``: flagged at any step; ``first_flagged[b]``:
    that step or None (the detection latency, in generated tokens); ``stopped_at[b]``: the step
    at which the action stopped it, or None. ``threshold``: the monitor's at the time.

    In Jupyter the run renders as its text coloured token by token (:meth:`to_html`).
    """

    sequences: list[list[int]]
    prompt_lengths: list[int]
    scores: list[Tensor]
    logits: list[Tensor]
    exit_orders: list[Tensor]
    flops: list[Tensor]
    flagged: list[bool]
    first_flagged: list[int | None]
    stopped_at: list[int | None]
    threshold: float = 0.5
    tokenizer: Any = field(default=None, repr=False, compare=False)
    decision_logits: list[Tensor] = field(default_factory=list, repr=False)

    def to_html(self, rows: int | Sequence[int] | None = None, *, tokenizer: Any = None) -> Any:
        """The run as a page: every row's text coloured token by token by the monitor's score,
        flagged steps and exit orders marked (:func:`tpc_hooks.views.generation_html`; save it
        with ``.save(path)``). ``tokenizer``: default, the one the run was generated with.

        Example:
            >>> run = monitor.generate(model, prompts, action="stop")  # doctest: +SKIP
            >>> run.to_html().save("run.html")  # doctest: +SKIP
        """
        tok = tokenizer if tokenizer is not None else self.tokenizer
        if tok is None:
            raise TPCHooksError("this run carries no tokenizer to show its tokens; pass tokenizer=")
        return generation_html(self, tokenizer=tok, threshold=self.threshold, rows=rows)

    def _repr_html_(self) -> str:
        return str(self.to_html()) if self.tokenizer is not None else f"<pre>{html.escape(repr(self))}</pre>"

    def generated(self, b: int) -> list[int]:
        """The generated tokens of sequence ``b``."""
        return self.sequences[b][self.prompt_lengths[b]:]

    def texts(self, tokenizer: Any) -> list[str]:
        """The generated text of every sequence."""
        return [tokenizer.decode(self.generated(b), skip_special_tokens=True) for b in range(len(self.sequences))]


@dataclass
class WatchLog:
    """What :meth:`Monitor.watch` saw: one entry per forward pass of the model.

    ``results[i]`` is the policy's :class:`~tpc_hooks.CascadeResult` for every row after
    call ``i`` (the score of everything that row has seen since its last fresh call);
    ``fresh[i]`` says whether call ``i`` started new sequences (no KV cache before it).
    ``threshold`` is the monitor's; :attr:`first_flagged` gives the detection latency.
    """

    results: list[CascadeResult] = field(default_factory=list)
    fresh: list[bool] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    threshold: float = 0.5

    @property
    def first_flagged(self) -> list[int | None]:
        """Per row of the latest sequences (the calls since the last fresh one): the first call
        at which the row was flagged, counted from that fresh call (0: the prompt's own pass;
        with ``generate``, call t has seen t generated tokens), or None. NaN counts as flagged."""
        if not self.results:
            return []
        start = max((i for i, f in enumerate(self.fresh) if f), default=0)
        width = self.results[start].probs.shape[0]
        calls = [r.decision_logits for r in self.results[start:] if r.probs.shape[0] == width]
        return [first_hit(h) for h in flagged(torch.stack(calls).float().cpu(), self.threshold).T]

    @property
    def scores(self) -> list[Tensor]:
        """Probabilities per call (``[batch]`` each)."""
        return [r.probs for r in self.results]

    def __len__(self) -> int:
        return len(self.results)


class GenerateLog:
    """What a monitor saw inside Hugging Face ``generate``, per row ``b`` of the batch
    (:meth:`Monitor.stopping_criteria`, :meth:`Monitor.logits_processor`).

    ``scores[b][t]`` is the monitor's probability for row ``b``'s prompt (without its padding)
    plus its first ``t`` generated tokens: t = 0 is the prompt alone (the pre-generation gate),
    then one step per forward pass that ``generate`` ran while row ``b`` was unfinished. A row
    is finished after the step that flagged it or that gave it an EOS token; ``generate``
    never feeds back a sequence's last token, so ``len(scores[b])`` is the number of tokens
    ``generate`` appended to row ``b`` (padding after its end not counted). ``logits``,
    ``exit_orders`` and ``flops`` follow the same steps. ``flagged[b]``: ``prob >= threshold``
    at some step; ``first_flagged[b]``: that step or None; ``stopped_at[b]`` equals it (a flagged
    row is stopped at that step). ``live``: ``[steps, batch]``, which rows each step scored.

    While ``generate`` runs, the steps stay on the model's device (no host copy per step); the
    first read copies them to the host once.
    """

    def __init__(self, threshold: float, what: str = "the monitor inside generate"):
        self.threshold, self._what = float(threshold), what
        self._results: list[CascadeResult] = []
        self._live: list[Tensor] = []
        self._host: dict[str, Any] | None = None

    def _append(self, result: CascadeResult, live: Tensor) -> None:
        self._results.append(result)
        self._live.append(live)
        self._host = None

    def _replace_last(self, result: CascadeResult | None = None, live: Tensor | None = None) -> None:
        if result is not None:
            self._results[-1] = result
        if live is not None:
            self._live[-1] = live
        self._host = None

    def _copy(self) -> dict[str, Any]:
        if self._host is None:
            if not self._results:
                self._host = {"live": torch.zeros(0, 0, dtype=torch.bool)}
            else:
                stack = lambda xs: torch.stack(xs).cpu()
                self._host = {"live": stack(self._live), "probs": stack([r.probs.float() for r in self._results]),
                              "logits": stack([r.logits.float() for r in self._results]),
                              "decision": stack([r.decision_logits.float() for r in self._results]),
                              "exit": stack([r.exit_order for r in self._results]),
                              "flops": stack([r.flops for r in self._results])}
                warn_nonfinite(self._host["probs"], self._host["live"], self._what)
        return self._host

    def _rows(self, key: str) -> list[Tensor]:
        h = self._copy()
        return [h[key][h["live"][:, b], b] for b in range(h["live"].shape[1])]

    @property
    def steps(self) -> int:
        """Forward passes seen (step 0 is the prompt)."""
        return len(self._results)

    @property
    def live(self) -> Tensor:
        """``[steps, batch]`` bool: the rows each step scored (unfinished ones)."""
        return self._copy()["live"]

    @property
    def scores(self) -> list[Tensor]:
        """Probabilities per row (1-D each, over that row's steps)."""
        return self._rows("probs")

    @property
    def logits(self) -> list[Tensor]:
        return self._rows("logits")

    @property
    def exit_orders(self) -> list[Tensor]:
        return self._rows("exit")

    @property
    def flops(self) -> list[Tensor]:
        return self._rows("flops")

    @property
    def decision_logits(self) -> list[Tensor]:
        """The logits the flags compare with ``logit(threshold)`` (``scores`` are their sigmoid)."""
        return self._rows("decision")

    @property
    def first_flagged(self) -> list[int | None]:
        return [first_hit(flagged(d, self.threshold)) for d in self.decision_logits]

    @property
    def flagged(self) -> list[bool]:
        return [f is not None for f in self.first_flagged]

    @property
    def stopped_at(self) -> list[int | None]:
        return self.first_flagged


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
    prefix). Nothing is read back to the host.
    """

    def __init__(self, monitor: Any, order: int | None = None, cascade: float | Cascade | None = None):
        self.monitor = monitor
        self.rule = monitor._step_policy(order, cascade)
        self.state: Any = None
        self.spent: Tensor | None = None

    def reset(self) -> None:
        self.state = self.spent = None

    def update(self, acts: Tensor, mask: Tensor) -> CascadeResult:
        mon = self.monitor
        feats = mon._features(acts)
        if mon.pooling != "token":
            if self.state is None:
                self.state = RunningPool(mon.pooling)
            self.state.update(feats, mask)
            return self.rule(self.state.value())
        if self.state is None:
            self.state, self.spent = RunningAggregate(mon.aggregate, mon.alpha, mon.window, mon.skip), 0
        B, n, D = feats.shape
        res = self.rule(feats.reshape(B * n, D))
        m = mask.to(res.logits.device).bool()
        on = scored(m, mon.skip, self.state.seen)  # before update: the tokens this pass scores
        agg = self.state.update(res.logits.reshape(B, n), m)
        newest = torch.where(m, torch.arange(n, device=m.device), -1).amax(1).clamp_min(0)[:, None]
        self.spent = self.spent + res.flops.reshape(B, n).masked_fill(~on, 0).sum(1)
        return CascadeResult(logits=agg, probs=torch.sigmoid(agg), decision_logits=agg,
                             exit_order=res.exit_order.reshape(B, n).gather(1, newest)[:, 0],
                             flops=self.spent, degree=res.degree)


def first_hit(hits: Tensor) -> int | None:
    """The first index where a 1-D bool tensor is True, or None (the detection step)."""
    at = hits.nonzero().flatten()
    return int(at[0]) if len(at) else None


def warn_nonfinite(probs: Tensor, live: Tensor | None, what: str) -> None:
    """Warns once when a monitoring run scored a step NaN (``probs``/``live``: ``[steps, batch]``
    on the host)."""
    bad = probs.isnan() if live is None else probs.isnan() & live
    if bool(bad.any()):
        step, row = (int(i) for i in bad.nonzero()[0])
        warnings.warn(
            f"{what}: the monitor's site held NaN/inf activations at {int(bad.sum())} scored step(s) (first: row {row}, "
            f"step {step}); those scores are NaN and count as flagged. An overflowing float16 forward pass is a "
            "common cause", RuntimeWarning, stacklevel=3)


@torch.no_grad()
def generate(monitor: Any, model: Any, prompts: Sequence[str], max_new_tokens: int = 32, action: str | Callable = "flag", *,
             order: int | None = None, cascade: float | Cascade | None = None, do_sample: bool = False,
             temperature: float = 1.0, seed: int = 0, stop_at_eos: bool = True, tokenizer: Any = None) -> GenerationRun:
    """See :meth:`tpc_hooks.Monitor.generate`.

    Every step's scores, liveness and tokens stay on the model's device and reach the host once,
    at the end. Per step the loop reads one bool back (whether any row goes on, as Hugging
    Face ``generate`` does); a callable ``action`` also reads the flagged rows, since it decides
    on the host.
    """
    adapter = monitor._adapter(model, tokenizer=tokenizer)
    items = check_prompts(prompts)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise TPCHooksError(f"max_new_tokens must be an integer >= 0; got {max_new_tokens!r}")
    if not (action in ("flag", "stop") or callable(action)):
        raise TPCHooksError(f"action must be 'flag', 'stop' or a callable; got {action!r}")
    if do_sample and not temperature > 0:
        raise TPCHooksError(f"temperature must be positive; got {temperature!r}")
    site = adapter.site(monitor.site)
    scores_ = StepScores(monitor, order, cascade)
    threshold = float(monitor.threshold)
    tok = adapter.tokenizer
    ids, _ = adapter.tokenize(items, chat_template=monitor.chat_template, max_tokens=monitor.max_tokens,
                              prepend_bos=monitor.prepend_bos)
    input_ids, mask = pad(ids, pad_id(tok), "left")
    B = len(ids)
    eos = getattr(tok, "eos_token_id", None) if stop_at_eos else None
    log = GenerateLog(threshold, "monitor.generate")  # per step: the scores and the rows scored (live ones)
    tokens: list[Tensor] = []  # per step after the first: the token fed to each row (pad on ended rows)
    fed: list[Tensor] = []  # ... and which rows it was fed to
    stopped: list[int | None] = [None] * B  # for a callable action: the step it asked to stop
    state: dict[str, Any] = {"t": 0, "live": None, "gen": None}

    def row_tokens(b: int) -> list[int]:
        if not tokens:
            return list(ids[b])
        tk, on = torch.stack(tokens)[:, b].tolist(), torch.stack(fed)[:, b].tolist()
        return list(ids[b]) + [x for x, f in zip(tk, on) if f]

    def on_step(acts: Tensor, step_mask: Tensor, last_logits: Tensor):
        t, device = state["t"], last_logits.device
        live = state["live"] if t else torch.ones(B, dtype=torch.bool, device=device)
        res = scores_.update(acts, step_mask)
        log._append(res, live)
        hit = live & flagged(res.decision_logits, threshold).to(device)
        done = hit if action == "stop" else torch.zeros_like(live)
        if callable(action):
            rows = hit.nonzero().flatten().tolist()  # the callable decides on the host, now
            if rows:
                probs, exits = res.probs[rows].tolist(), res.exit_order[rows].tolist()
                for j, b in enumerate(rows):
                    if action(MonitorEvent(row=b, step=t, score=probs[j], exit_order=exits[j], tokens=row_tokens(b))):
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

    adapter.decode(input_ids, mask, site, max_new_tokens, on_step)
    seqs = [list(t) for t in ids]
    if tokens:
        tk, on = torch.stack(tokens).cpu(), torch.stack(fed).cpu()
        seqs = [seqs[b] + tk[on[:, b], b].tolist() for b in range(B)]
    first_flag = log.first_flagged  # the one host copy of every step (and the NaN warning)
    if action == "stop":
        stopped = list(first_flag)
    return GenerationRun(
        sequences=seqs, prompt_lengths=[len(t) for t in ids], scores=log.scores, logits=log.logits,
        exit_orders=log.exit_orders, flops=log.flops,
        flagged=[f is not None for f in first_flag], first_flagged=first_flag, stopped_at=stopped,
        threshold=threshold, tokenizer=tok, decision_logits=log.decision_logits,
    )


@contextmanager
def watch(monitor: Any, model: Any, *, order: int | None = None, cascade: float | Cascade | None = None,
          on_flag: Callable[[MonitorEvent], Any] | None = None, tokenizer: Any = None) -> Iterator[WatchLog]:
    """See :meth:`tpc_hooks.Monitor.watch`."""
    adapter = monitor._adapter(model, tokenizer=tokenizer)
    site = adapter.site(monitor.site)
    scores_ = StepScores(monitor, order, cascade)
    threshold = float(monitor.threshold)
    log = WatchLog(threshold=threshold)

    def on_acts(acts: Tensor, mask: Tensor, fresh: bool) -> None:
        if fresh:
            scores_.reset()
        with torch.no_grad():
            res = scores_.update(acts, mask)
        log.results.append(res)
        log.fresh.append(fresh)
        log.new_tokens.append(int(acts.shape[1]))
        if on_flag is not None:
            # the callback decides on the host: one copy per step, not one per flagged row
            hits, probs, exits = flagged(res.decision_logits, threshold).tolist(), res.probs.tolist(), res.exit_order.tolist()
            for b in (b for b, f in enumerate(hits) if f):
                on_flag(MonitorEvent(row=b, step=len(log) - 1, score=probs[b], exit_order=exits[b], tokens=[]))

    with adapter.observe(site, on_acts):
        yield log
    if log.results:  # one read at the end: did any call score NaN?
        bad = torch.stack([r.probs.isnan().sum() for r in log.results]).cpu()
        if bool(bad.any()):
            warnings.warn(
                f"monitor.watch: the monitor's site held NaN/inf activations in {int((bad > 0).sum())} of {len(bad)} "
                f"forward passes (first: call {int(bad.nonzero()[0])}); those rows' scores are NaN and count as "
                "flagged. An overflowing float16 forward pass is a common cause", RuntimeWarning, stacklevel=3)
