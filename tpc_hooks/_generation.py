"""Monitored generation: the decode loop behind :meth:`Monitor.generate`, the hooks behind
:meth:`Monitor.watch`, and the records they return (:class:`GenerateLog` is filled by the
monitor's ``stopping_criteria`` / ``logits_processor`` inside Hugging Face ``generate``).

Both read the site's activations from the model's own forward passes (through the adapter),
keep a running pool per sequence and score it with the monitor's policy every step.
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ._cascade import Cascade, CascadeResult
from ._collect import check_prompts
from ._errors import TPCHooksError
from .adapters._base import pad, pad_id
from .pooling import RunningPool


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
    ``logits`` follow the same steps. ``flagged[b]``: flagged at any step; ``first_flagged[b]``:
    that step or None; ``stopped_at[b]``: the step at which the action stopped it, or None.
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
    """

    results: list[CascadeResult] = field(default_factory=list)
    fresh: list[bool] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)

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

    def __init__(self, threshold: float):
        self.threshold = float(threshold)
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
                              "exit": stack([r.exit_order for r in self._results]),
                              "flops": stack([r.flops for r in self._results])}
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
    def first_flagged(self) -> list[int | None]:
        out = []
        for p in self.scores:
            hits = (p >= self.threshold).nonzero().flatten()
            out.append(int(hits[0]) if len(hits) else None)
        return out

    @property
    def flagged(self) -> list[bool]:
        return [f is not None for f in self.first_flagged]

    @property
    def stopped_at(self) -> list[int | None]:
        return self.first_flagged


@torch.no_grad()
def generate(monitor: Any, model: Any, prompts: Sequence[str], max_new_tokens: int = 32, action: str | Callable = "flag", *,
             order: int | None = None, cascade: float | Cascade | None = None, do_sample: bool = False,
             temperature: float = 1.0, seed: int = 0, stop_at_eos: bool = True, tokenizer: Any = None) -> GenerationRun:
    """See :meth:`tpc_hooks.Monitor.generate`."""
    adapter = monitor._adapter(model, tokenizer=tokenizer)
    items = check_prompts(prompts)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise TPCHooksError(f"max_new_tokens must be an integer >= 0; got {max_new_tokens!r}")
    if not (action in ("flag", "stop") or callable(action)):
        raise TPCHooksError(f"action must be 'flag', 'stop' or a callable; got {action!r}")
    if do_sample and not temperature > 0:
        raise TPCHooksError(f"temperature must be positive; got {temperature!r}")
    site = adapter.site(monitor.site)
    score_fn = monitor.policy(order, cascade)
    tok = adapter.tokenizer
    ids, _ = adapter.tokenize(items, chat_template=monitor.chat_template, max_tokens=monitor.max_tokens,
                              prepend_bos=monitor.prepend_bos)
    input_ids, mask = pad(ids, pad_id(tok), "left")
    B = len(ids)
    eos = getattr(tok, "eos_token_id", None) if stop_at_eos else None
    gen = torch.Generator().manual_seed(seed)
    seqs = [list(t) for t in ids]
    rec: dict[str, list[list]] = {k: [[] for _ in range(B)] for k in ("scores", "logits", "exit", "flops")}
    first_flag: list[int | None] = [None] * B
    stopped: list[int | None] = [None] * B
    live = torch.ones(B, dtype=torch.bool)
    pool = RunningPool(monitor.pooling)
    step = [0]

    def on_step(acts: Tensor, step_mask: Tensor, last_logits: Tensor):
        t = step[0]
        pool.update(monitor._features(acts), step_mask)
        rows = live.nonzero().flatten()
        res = score_fn(pool.value()[rows.to(acts.device)])
        probs, logits_, exits, flops = (x.tolist() for x in (res.probs, res.logits, res.exit_order, res.flops))
        done = torch.zeros(B, dtype=torch.bool)
        for j, b in enumerate(rows.tolist()):
            p = probs[j]
            rec["scores"][b].append(p)
            rec["logits"][b].append(logits_[j])
            rec["exit"][b].append(exits[j])
            rec["flops"][b].append(flops[j])
            if p >= monitor.threshold:
                if first_flag[b] is None:
                    first_flag[b] = t
                stop = action == "stop" or (callable(action) and bool(action(
                    MonitorEvent(row=b, step=t, score=p, exit_order=exits[j], tokens=list(seqs[b])))))
                if stop:
                    stopped[b] = t
                    done[b] = True
            if t > 0 and eos is not None and seqs[b][-1] == eos:
                done[b] = True
        live.logical_and_(~done)
        if t == max_new_tokens or not live.any():
            return None
        if do_sample:  # the seeded generator lives on the CPU
            logits = last_logits.float().cpu()
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen).flatten()
        else:  # greedy needs B indices, not the [B, vocab] logits, on the host
            nxt = last_logits.argmax(-1).cpu()
        nxt = torch.where(live, nxt, torch.full_like(nxt, pad_id(tok)))
        for b in live.nonzero().flatten().tolist():
            seqs[b].append(int(nxt[b]))
        step[0] = t + 1
        return nxt, live.clone()

    adapter.decode(input_ids, mask, site, max_new_tokens, on_step)
    as_t = lambda rows, dt: [torch.tensor(r, dtype=dt) for r in rows]
    return GenerationRun(
        sequences=seqs, prompt_lengths=[len(t) for t in ids],
        scores=as_t(rec["scores"], torch.float32), logits=as_t(rec["logits"], torch.float32),
        exit_orders=as_t(rec["exit"], torch.long), flops=as_t(rec["flops"], torch.long),
        flagged=[f is not None for f in first_flag], first_flagged=first_flag, stopped_at=stopped,
    )


@contextmanager
def watch(monitor: Any, model: Any, *, order: int | None = None, cascade: float | Cascade | None = None,
          on_flag: Callable[[MonitorEvent], Any] | None = None, tokenizer: Any = None) -> Iterator[WatchLog]:
    """See :meth:`tpc_hooks.Monitor.watch`."""
    adapter = monitor._adapter(model, tokenizer=tokenizer)
    site = adapter.site(monitor.site)
    score_fn = monitor.policy(order, cascade)
    log = WatchLog()
    state = {"pool": None}

    def on_acts(acts: Tensor, mask: Tensor, fresh: bool) -> None:
        if fresh or state["pool"] is None:
            state["pool"] = RunningPool(monitor.pooling)
        state["pool"].update(monitor._features(acts), mask)
        with torch.no_grad():
            res = score_fn(state["pool"].value())
        log.results.append(res)
        log.fresh.append(fresh)
        log.new_tokens.append(int(acts.shape[1]))
        if on_flag is not None:
            # one host copy per step, not one per flagged row
            flagged, probs, exits = (res.probs >= monitor.threshold).tolist(), res.probs.tolist(), res.exit_order.tolist()
            for b in (b for b, f in enumerate(flagged) if f):
                on_flag(MonitorEvent(row=b, step=len(log) - 1, score=probs[b], exit_order=exits[b], tokens=[]))

    with adapter.observe(site, on_acts):
        yield log
