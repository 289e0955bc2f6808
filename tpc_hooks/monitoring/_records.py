"""What a monitored generation leaves behind: one record, :class:`GenerationRun`, whatever drove
the model (:meth:`Monitor.generate`'s own loop, the Hugging Face ``generate`` hooks, or
:meth:`Monitor.watch`), plus the per-call :class:`WatchLog` of ``watch`` and the
:class:`MonitorEvent` a callback sees.
"""

import html
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError, deprecated
from ..head import CascadeResult
from ..metrics import flagged
from ..views import generation_html, token_scores_html


@dataclass(frozen=True)
class MonitorEvent:
    """What a callback ``action`` sees when a generating sequence is flagged."""

    row: int
    step: int
    score: float
    exit_order: int
    tokens: list[int]
    monitor: str | None = None  # the member of a MonitorSet that flagged it (None: a lone monitor)


_PER_ROW = ("scores", "logits", "exit_orders", "flops", "decision_logits")


class GenerationRun:
    """A monitored generation, per sequence ``b``, whatever drove it.

    ``sequences[b]``: prompt tokens (as they were fed, without padding) + generated tokens.
    ``scores[b][t]``: the monitor's probability for ``sequences[b][:prompt_lengths[b] + t]`` (t = 0
    is the prompt alone: the pre-generation gate), one step per forward pass the row took part in
    (``generate`` never feeds back a sequence's last token, so ``len(scores[b])`` is the number of
    tokens appended to row ``b``). ``exit_orders``, ``flops`` and ``logits`` follow the same
    steps, and ``decision_logits``: the logits the flags compare with ``logit(threshold)``
    (``scores`` are their sigmoid; empty in a run built by hand, whose flags then read
    ``scores``). ``flagged[b]``: flagged at any step; ``first_flagged[b]``: that step or None
    (the detection latency, in generated tokens); ``stopped_at[b]``: the step at which the
    action stopped it, or None. ``threshold``: the monitor's at the time.

    Who fills it: :meth:`Monitor.generate` (everything); ``stopping_criteria`` and
    ``logits_processor`` inside Hugging Face ``generate`` (``.log`` and
    ``monitor.last_run``; a flagged row is stopped at its first flagged step; a logits
    processor never sees the last token ``generate`` appends, so its run has no ``sequences``);
    ``watch`` (``log.run``: the latest sequences, no tokens). While a model generates, the steps
    stay on its device; the first read copies them to the host once. ``GenerateLog`` is an old
    name of this class.

    In Jupyter the run renders as its text coloured token by token (:meth:`to_html`).

    Example:
        >>> import torch, tpc_hooks as tpc
        >>> run = tpc.GenerationRun(sequences=[[5, 6, 7]], prompt_lengths=[2], scores=[torch.tensor([0.2, 0.9])],
        ...                         logits=[torch.tensor([-1.4, 2.2])], exit_orders=[torch.tensor([1, 2])],
        ...                         flops=[torch.tensor([9, 30])], flagged=[True], first_flagged=[1], stopped_at=[None])
        >>> run.generated(0), run.steps
        ([7], 2)
    """

    def __init__(
        self,
        sequences: list[list[int]] | None = None,
        prompt_lengths: list[int] | None = None,
        scores: list[Tensor] | None = None,
        logits: list[Tensor] | None = None,
        exit_orders: list[Tensor] | None = None,
        flops: list[Tensor] | None = None,
        flagged: list[bool] | None = None,
        first_flagged: list[int | None] | None = None,
        stopped_at: list[int | None] | None = None,
        threshold: float = 0.5,
        tokenizer: Any = None,
        decision_logits: list[Tensor] | None = None,
    ):
        self._inputs: dict[str, Any] = {}
        self._sequences, self._prompt_lengths = sequences, prompt_lengths
        self.threshold, self.tokenizer = float(threshold), tokenizer
        given = {
            "scores": scores,
            "logits": logits,
            "exit_orders": exit_orders,
            "flops": flops,
            "decision_logits": [] if decision_logits is None else decision_logits,
        }
        self._given: dict[str, Any] | None = given
        self._flags: dict[str, Any] = {"flagged": flagged, "first_flagged": first_flagged, "stopped_at": stopped_at}
        self._results: list[CascadeResult] = []
        self._live: list[Tensor] = []
        self._host: dict[str, Any] | None = None
        self._what = "the monitor"

    @classmethod
    def _recording(cls, threshold: float, what: str) -> "GenerationRun":
        """An empty run that a driver fills step by step (``_append``), on the model's device."""
        run = cls(threshold=threshold)
        run._given, run._what = None, what
        return run

    def __repr__(self) -> str:
        n = len(self.scores)
        return (
            f"GenerationRun(rows={n}, steps={self.steps}, threshold={self.threshold:.6g}, "
            f"flagged={sum(self.flagged)}/{n}, stopped={sum(s is not None for s in self.stopped_at)}/{n})"
        )

    # ------------------------------------------------------------------ recording
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
        """Every recorded step on the host (one copy, then cached), with the NaN warning."""
        if self._host is None:
            if not self._results:
                self._host = {"live": torch.zeros(0, 0, dtype=torch.bool)}
            else:

                def stack(xs):
                    return torch.stack(xs).cpu()

                self._host = {
                    "live": stack(self._live),
                    "scores": stack([r.probs.float() for r in self._results]),
                    "logits": stack([r.logits.float() for r in self._results]),
                    "decision_logits": stack([r.decision_logits.float() for r in self._results]),
                    "exit_orders": stack([r.exit_order for r in self._results]),
                    "flops": stack([r.flops for r in self._results]),
                }
                warn_nonfinite(self._host["scores"], self._host["live"], self._what)
        return self._host

    def _rows(self, key: str) -> list[Tensor]:
        if self._given is not None:
            return self._given[key]
        h = self._copy()
        if key not in h:
            return []
        return [h[key][h["live"][:, b], b] for b in range(h["live"].shape[1])]

    # ------------------------------------------------------------------ per row
    scores = property(lambda self: self._rows("scores"), doc="Probabilities per row (1-D each, over its steps).")
    logits = property(lambda self: self._rows("logits"), doc="Raw logits per row (a cascade: uncalibrated).")
    exit_orders = property(lambda self: self._rows("exit_orders"), doc="Cascade exit order per row and step.")
    flops = property(lambda self: self._rows("flops"), doc="FLOPs per row and step.")
    decision_logits = property(
        lambda self: self._rows("decision_logits"), doc="The logits the flags compare with ``logit(threshold)``."
    )

    @property
    def first_flagged(self) -> list[int | None]:
        """Per row: the first flagged step, or None (NaN counts as flagged)."""
        if self._flags["first_flagged"] is not None:
            return self._flags["first_flagged"]
        if self.decision_logits:
            return [first_hit(flagged(d, self.threshold)) for d in self.decision_logits]
        return [first_hit((s >= self.threshold) | s.isnan()) for s in self.scores]

    @property
    def flagged(self) -> list[bool]:
        """Per row: flagged at any step."""
        if self._flags["flagged"] is not None:
            return self._flags["flagged"]
        return [f is not None for f in self.first_flagged]

    @property
    def stopped_at(self) -> list[int | None]:
        """Per row: the step at which the action stopped it, or None (inside Hugging Face
        ``generate``: the first flagged step)."""
        if self._flags["stopped_at"] is not None:
            return self._flags["stopped_at"]
        return self.first_flagged

    @property
    def steps(self) -> int:
        """Forward passes recorded (step 0 is the prompt): the longest row's number of steps."""
        if self._given is None:
            return len(self._results)
        return max((len(s) for s in self._given["scores"] or []), default=0)

    @property
    def live(self) -> Tensor:
        """``[steps, batch]`` bool: the rows each step scored (unfinished ones)."""
        if self._given is None:
            return self._copy()["live"]
        n = [len(s) for s in self._given["scores"] or []]
        return torch.arange(max(n, default=0))[:, None] < torch.tensor(n, dtype=torch.long)[None, :]

    # ------------------------------------------------------------------ tokens
    def generated(self, b: int) -> list[int]:
        """The generated tokens of sequence ``b``."""
        if self.sequences is None:
            raise TPCHooksError(
                "this run has no token sequences (a logits_processor never sees the last token "
                "generate appends; watch sees no tokens); take them from generate's output"
            )
        lengths = self.prompt_lengths
        assert lengths is not None  # recorded with the sequences
        return self.sequences[b][lengths[b] :]

    def texts(self, tokenizer: Any) -> list[str]:
        """The generated text of every sequence."""
        return [tokenizer.decode(self.generated(b), skip_special_tokens=True) for b in range(len(self.scores))]

    def _set_inputs(self, input_ids: Tensor, complete: bool) -> None:
        """A Hugging Face run: the latest ``input_ids`` (a reference; ``complete``: every appended
        token is in it, as a stopping criterion sees them), from which :attr:`sequences` is cut."""
        self._inputs.update(ids=input_ids, complete=complete)
        if complete:
            self._sequences = self._prompt_lengths = None  # cut again on the next read

    def _prompt_mask(self, mask: Tensor, first: bool) -> None:
        """A Hugging Face run: the attention mask of the prompt's pass (or passes, chunked)."""
        self._inputs["masks"] = [mask] if first else self._inputs.get("masks", []) + [mask]

    @property
    def sequences(self) -> list[list[int]] | None:
        """Per row: prompt tokens (without padding) + generated tokens; None where the driver
        never saw them all."""
        if self._sequences is None and self._inputs.get("complete") and self._inputs.get("masks"):
            self._cut_sequences()
        return self._sequences

    @sequences.setter
    def sequences(self, value: list[list[int]] | None) -> None:
        self._sequences = value

    @property
    def prompt_lengths(self) -> list[int] | None:
        """Per row: the number of prompt tokens in ``sequences[b]``."""
        if self._prompt_lengths is None and self._inputs.get("complete") and self._inputs.get("masks"):
            self._cut_sequences()
        return self._prompt_lengths

    @prompt_lengths.setter
    def prompt_lengths(self, value: list[int] | None) -> None:
        self._prompt_lengths = value

    def _cut_sequences(self) -> None:
        mask = torch.cat([m.bool() for m in self._inputs["masks"]], 1).cpu()
        ids, P = self._inputs["ids"].cpu(), mask.shape[1]
        n = [len(s) for s in self.scores]
        prompts = [ids[b, :P][mask[b]].tolist() for b in range(len(n))]
        self.sequences = [p + ids[b, P : P + n[b]].tolist() for b, p in enumerate(prompts)]
        self.prompt_lengths = [len(p) for p in prompts]

    # ------------------------------------------------------------------ views
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
        if self.sequences is None:
            raise TPCHooksError(
                "this run has no token sequences to show (a logits_processor never sees the last token "
                "generate appends; watch sees no tokens)"
            )
        return generation_html(self, tokenizer=tok, threshold=self.threshold, rows=rows)

    def _repr_html_(self) -> str:
        if self.tokenizer is not None and self.sequences is not None:
            return str(self.to_html())
        return f"<pre>{html.escape(repr(self))}</pre>"


class MonitorSetRun(Mapping[str, GenerationRun]):
    """A :class:`~tpc_hooks.MonitorSet`'s monitored generation: each member's
    :class:`GenerationRun` under its name (``run["harm"].scores[b]``), all over the same
    sequences, plus per row the step it was stopped at and the member that stopped it.

    Example:
        >>> import torch, tpc_hooks as tpc
        >>> one = lambda s: tpc.GenerationRun(sequences=[[5, 6, 7]], prompt_lengths=[2], scores=[torch.tensor(s)],
        ...                                   logits=[torch.tensor(s)], exit_orders=[torch.tensor([1, 1])],
        ...                                   flops=[torch.tensor([1, 1])])
        >>> run = tpc.MonitorSetRun({"harm": one([0.1, 0.9]), "pii": one([0.7, 0.2])})
        >>> run.flagged_by, run["harm"].first_flagged
        ([['harm', 'pii']], [1])
    """

    def __init__(self, runs: Mapping[str, GenerationRun]):
        if not runs:
            raise TPCHooksError("a MonitorSetRun needs at least one member's run")
        self._runs = dict(runs)

    def __getitem__(self, name: str) -> GenerationRun:
        if name not in self._runs:
            raise KeyError(f"{name!r} is not a member of this run ({list(self._runs)})")
        return self._runs[name]

    def __iter__(self) -> Any:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)

    def __repr__(self) -> str:
        first = self._first
        n = len(first.scores)
        return (
            f"MonitorSetRun(members={list(self._runs)}, rows={n}, steps={first.steps}, "
            f"stopped={sum(s is not None for s in self.stopped_at)}/{n})"
        )

    @property
    def _first(self) -> GenerationRun:
        return next(iter(self._runs.values()))

    # ------------------------------------------------------------------ shared by the members
    sequences = property(lambda self: self._first.sequences, doc="Per row: prompt + generated tokens (shared).")
    prompt_lengths = property(lambda self: self._first.prompt_lengths, doc="Per row: prompt tokens in ``sequences``.")
    tokenizer = property(lambda self: self._first.tokenizer)

    def generated(self, b: int) -> list[int]:
        """The generated tokens of sequence ``b``."""
        return self._first.generated(b)

    def texts(self, tokenizer: Any) -> list[str]:
        """The generated text of every sequence."""
        return self._first.texts(tokenizer)

    # ------------------------------------------------------------------ per row, across the members
    @property
    def stopped_at(self) -> list[int | None]:
        """Per row: the step at which a stopping member ended it, or None."""
        per = [run.stopped_at for run in self._runs.values()]
        return [min((s for s in col if s is not None), default=None) for col in zip(*per, strict=True)]

    @property
    def stopped_by(self) -> list[str | None]:
        """Per row: the member that stopped it (the first in the set's order when several
        flagged the same step), or None."""
        names, per = list(self._runs), [run.stopped_at for run in self._runs.values()]
        return [
            None if at is None else names[[s == at for s in col].index(True)]
            for at, col in zip(self.stopped_at, zip(*per, strict=True), strict=True)
        ]

    @property
    def flagged_by(self) -> list[list[str]]:
        """Per row: the members that flagged it at some step, in the set's order."""
        per = {name: run.flagged for name, run in self._runs.items()}
        return [[name for name in per if per[name][b]] for b in range(len(self._first.scores))]

    # ------------------------------------------------------------------ views
    def to_html(
        self, monitor: str | None = None, rows: int | Sequence[int] | None = None, *, tokenizer: Any = None
    ) -> Any:
        """One member's run as a page (:meth:`GenerationRun.to_html`; default: the first member)."""
        return self[monitor if monitor is not None else next(iter(self._runs))].to_html(rows, tokenizer=tokenizer)

    def _repr_html_(self) -> str:
        return "".join(f"<h4>{html.escape(name)}</h4>{run._repr_html_()}" for name, run in self._runs.items())


class TokenScores(tuple):
    """What :meth:`Monitor.token_scores` returns: a ``(tokens, result)`` pair (it unpacks as one)
    that also renders: :meth:`to_html`, and in Jupyter the prompt coloured token by token."""

    threshold: float
    skip: int

    def __new__(cls, tokens: list[str], result: CascadeResult, threshold: float, skip: int = 0):
        obj = super().__new__(cls, (tokens, result))
        obj.threshold, obj.skip = float(threshold), int(skip)
        return obj

    @property
    def tokens(self) -> list[str]:
        return self[0]

    @property
    def result(self) -> CascadeResult:
        return self[1]

    def to_html(self) -> Any:
        """The prompt with each token coloured by the score of the prefix it ends, flagged prefixes
        and exit orders marked (:func:`tpc_hooks.views.token_scores_html`; ``.save(path)``)."""
        return token_scores_html(self.tokens, self.result, threshold=self.threshold, unscored=self.skip)

    def _repr_html_(self) -> str:
        return str(self.to_html())


@dataclass
class WatchLog:
    """What :meth:`Monitor.watch` saw: one entry per forward pass of the model.

    ``results[i]`` is the policy's :class:`~tpc_hooks.CascadeResult` for every row after
    call ``i`` (the score of everything that row has seen since its last fresh call);
    ``fresh[i]`` says whether call ``i`` started new sequences (no KV cache before it).
    ``threshold`` is the monitor's; :attr:`first_flagged` gives the detection latency and
    :attr:`run` the latest sequences as a :class:`GenerationRun`.
    """

    results: list[CascadeResult] = field(default_factory=list)
    fresh: list[bool] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    threshold: float = 0.5

    def _latest(self) -> list[CascadeResult]:
        """The calls of the latest sequences: from the last fresh call on, of its width."""
        if not self.results:
            return []
        start = max((i for i, f in enumerate(self.fresh) if f), default=0)
        width = self.results[start].probs.shape[0]
        return [r for r in self.results[start:] if r.probs.shape[0] == width]

    @property
    def run(self) -> GenerationRun:
        """The latest sequences (the calls since the last fresh one) as a :class:`GenerationRun`:
        step t of row b is call t's score of it (no tokens: ``watch`` reads activations only)."""
        run = GenerationRun._recording(self.threshold, "monitor.watch")
        for r in self._latest():
            run._append(r, torch.ones(r.probs.shape[0], dtype=torch.bool, device=r.probs.device))
        return run

    @property
    def first_flagged(self) -> list[int | None]:
        """Per row of the latest sequences (the calls since the last fresh one): the first call
        at which the row was flagged, counted from that fresh call (0: the prompt's own pass;
        with ``generate``, call t has seen t generated tokens), or None. NaN counts as flagged."""
        calls = [r.decision_logits for r in self._latest()]
        if not calls:
            return []
        return [first_hit(h) for h in flagged(torch.stack(calls).float().cpu(), self.threshold).T]

    @property
    def scores(self) -> list[Tensor]:
        """Probabilities per call (``[batch]`` each)."""
        return [r.probs for r in self.results]

    def __len__(self) -> int:
        return len(self.results)


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
            f"{what}: the monitor's site held NaN/inf activations at {int(bad.sum())} scored step(s) "
            f"(first: row {row}, step {step}); those scores are NaN and count as flagged. An overflowing float16 "
            "forward pass is a common cause",
            RuntimeWarning,
            stacklevel=3,
        )


class LastRun:
    """``last_run``: the record of the latest Hugging Face ``generate`` call that a monitor's (or a
    set's) ``stopping_criteria`` or ``logits_processor`` served (None before any; not saved).
    ``last_generate_log`` is its deprecated name (it warns once)."""

    last_run: Any = None

    @property
    def last_generate_log(self) -> Any:
        deprecated(f"{type(self).__name__}.last_generate_log", f"{type(self).__name__}.last_run")
        return self.last_run

    @last_generate_log.setter
    def last_generate_log(self, value: Any) -> None:
        deprecated(f"{type(self).__name__}.last_generate_log", f"{type(self).__name__}.last_run")
        self.last_run = value
