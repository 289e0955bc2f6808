"""Monitoring inside Hugging Face ``generate``: a ``StoppingCriteria`` that stops the rows a
monitor flags and a ``LogitsProcessor`` that forces EOS on them (behind
:meth:`Monitor.stopping_criteria` and :meth:`Monitor.logits_processor`).

Both read the monitor's site from the model's own forward passes through the adapter's
``observe`` hooks (KV cache on, no second pass), keep the monitor's running pool per row and
score it every step on the model's device; their per-row decision is a bool tensor that never
leaves the device. One object serves one ``generate`` call. Its hooks are attached when it is
made and given back as soon as every row has ended, by ``close()`` or at the end of a ``with``
block, or when the object is garbage-collected: the hooks reach only a :class:`_Run`, never
the object, so the inline form (``stopping_criteria=[monitor.stopping_criteria(model)]``)
frees it, and removes them, when ``generate`` returns or its exception is dropped.
Imported only when one is asked for (it imports ``transformers``).
"""

import weakref
from contextlib import ExitStack
from typing import Any

import torch
from torch import Tensor
from transformers import LogitsProcessor, StoppingCriteria

from .._errors import TPCHooksError
from ..activations import Adapter, Site
from ..head import Together
from ..metrics import flagged
from ._generation import Lane, lanes_of, score_lanes, stacked
from ._records import GenerationRun


class _Run:
    """What the hooks touch: the per-row pool, liveness and log of one ``generate`` call, and
    the hooks themselves. It never refers to the criterion or processor that owns it, so the
    model's hooks do not keep that one alive, and its ``weakref.finalize`` can remove them."""

    def __init__(
        self,
        monitor: Any,
        adapter: Adapter,
        sites: list[Site],
        *,
        what: str,
        usage: str,
        lanes: list[Lane],
        eos: Tensor | None,
    ):
        self.monitor, self.what, self.usage = monitor, what, usage
        self.lanes = lanes  # a lone monitor: one lane, which stops; a MonitorSet: one per member, each its own action
        # the members whose policies share a shape are scored in one stacked evaluation (unless the set says not)
        self.together = Together(stacked=stacked(monitor))
        self.eos = eos
        self.started = False  # a pass of this generation has been scored
        self.hit: Tensor | None = None
        self.decided = False
        self.served = False  # generate has called the object: its one generation has begun
        self.finished = False  # the hooks were given back because every row had ended
        self.length = 0  # input_ids' length at the last call
        self.t = 0
        self.forced: Tensor | None = None
        self.stack: ExitStack | None = None
        stack = ExitStack()
        stack.enter_context(adapter.observe_sites(sites, self.on_acts))
        self.stack = stack

    @property
    def log(self) -> Any:
        """A lone monitor's run; a set's runs by name (:class:`~tpc_hooks.MonitorSetRun`)."""
        return self.monitor._result({lane.name: lane.log for lane in self.lanes})

    def close(self) -> None:
        stack, self.stack = self.stack, None
        if stack is not None:
            stack.close()

    # ------------------------------------------------------------------ per forward pass
    def on_acts(self, acts: dict[str, Tensor], mask: Tensor, fresh: bool) -> None:
        try:
            self._on_acts(acts, mask, fresh)
        except BaseException:
            self.close()
            raise

    def _on_acts(self, acts: dict[str, Tensor], mask: Tensor, fresh: bool) -> None:
        B, device = mask.shape[0], next(iter(acts.values())).device
        continuing_prefill = not fresh and self.started and not self.decided and mask.shape[1] > 1
        if fresh or not self.started:
            if self.served:  # a pass after this object's generation is not its to score; a second generate
                self.close()  # that passes it is refused at its first call
                return
            for lane in self.lanes:
                lane.scores.reset()
                lane.log = GenerationRun._recording(lane.threshold, lane.what)
                if not lane.stops:  # a member that only flags stops no row
                    lane.log._flags["stopped_at"] = [None] * B
            self.started = True
            self.monitor.last_run = self.log
            self.t = 0
            self.live = torch.ones(B, dtype=torch.bool, device=device)
            self.stopped = torch.zeros(B, dtype=torch.bool, device=device)  # the processor forces EOS on these
            self.done = torch.zeros(B, dtype=torch.bool, device=device)
        elif not continuing_prefill:  # a decode step: rows that ended at the last step are out
            if not self.decided:
                raise TPCHooksError(
                    f"the model ran another decode step but generate did not call this {self.what} after the last "
                    f"one: pass it to generate, {self.usage}"
                )
            self.live = self.live & ~self.done
            self.t += 1
        hit = torch.zeros(B, dtype=torch.bool, device=device)
        prompt = fresh or continuing_prefill or self.t == 0  # the prompt's pass(es)
        for lane, res in zip(self.lanes, score_lanes(self.lanes, acts, mask, self.together, prompt), strict=True):
            if prompt:  # the prompt's tokens are cut by it
                lane.log._prompt_mask(mask, first=not continuing_prefill)
            if continuing_prefill:  # a chunked prefill: the prompt's step is not over
                lane.log._replace_last(res, self.live)
            else:
                lane.log._append(res, self.live)
            if lane.stops:
                hit = hit | flagged(res.decision_logits, lane.threshold).to(device)
        self.hit = hit
        self.decided = False

    # ------------------------------------------------------------------ per call from generate
    def stop(self, input_ids: Tensor) -> Tensor:
        """The criterion's step: the rows to stop."""
        self._check_call(input_ids)
        assert self.hit is not None  # _check_call refuses a call before the first pass
        stop = self.live & self.hit
        # generate has appended this step's token: an EOS there ends the row, as generate's own criterion does
        self.done = stop | self._ended(input_ids)
        for lane in self.lanes:  # every appended token: the run's sequences are cut from it
            lane.log._set_inputs(input_ids, complete=True)
        self._called(input_ids, self.live & ~self.done)
        return stop.to(input_ids.device)

    def force_eos(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        """The processor's step: ``scores`` with EOS forced on the stopped rows."""
        self._check_call(input_ids)
        assert self.hit is not None  # _check_call refuses a call before the first pass
        if self.t > 0:  # a row whose last token is EOS ended before this step's forward pass
            self.live = self.live & ~self._ended(input_ids)
            for lane in self.lanes:
                lane.log._replace_last(live=self.live)
        stop = self.live & self.hit
        self.stopped = self.stopped | stop
        self.done = stop
        self._called(input_ids, self.live & ~stop)
        forced = self.forced
        if (
            forced is None
            or forced.shape[-1] != scores.shape[-1]
            or forced.device != scores.device
            or forced.dtype != scores.dtype
        ):
            forced = self.forced = torch.full(
                (1, scores.shape[-1]), float("-inf"), dtype=scores.dtype, device=scores.device
            )
            assert self.eos is not None  # the logits processor is not made without one
            forced[0, int(self.eos[0])] = 0.0
        return torch.where(self.stopped.to(scores.device)[:, None], forced, scores)

    def _check_call(self, input_ids: Tensor) -> None:
        if self.stack is None:
            if self.finished and self.hit is not None and input_ids.shape == (self.hit.shape[0], self.length + 1):
                ended = "flagged" if self.eos is None else f"flagged, or an EOS token among {self.eos.tolist()}"
                raise TPCHooksError(
                    f"generate went on after every row had ended by this {self.what}'s account ({ended}); if "
                    f"generate ends rows on other tokens, pass the same eos_token_id= to {self.what}"
                )
            if self.served:
                raise TPCHooksError(
                    f"this {self.what} already served a generate call (its log is .log); make a new one for each "
                    f"call, {self.usage}"
                )
            raise TPCHooksError(
                f"this {self.what} is closed and its hooks are removed; make a new one for each "
                f"generate call, {self.usage}"
            )
        if self.hit is None:
            raise TPCHooksError(
                f"this {self.what} saw no forward pass of its model; is the model passed to "
                f"{self.what} the one generating?"
            )
        if input_ids.shape[0] != self.hit.shape[0]:
            raise TPCHooksError(
                f"generate passed {input_ids.shape[0]} rows but the model's last forward pass had "
                f"{self.hit.shape[0]}; beam search is not supported (use num_beams=1)"
            )

    def _called(self, input_ids: Tensor, going_on: Tensor) -> None:
        self.decided = self.served = True
        self.length = input_ids.shape[1]
        # one bool to the host per step (generate reads its own each step too): when no row goes on, there is
        # no forward pass left to read, and the hooks are given back now
        if not bool(going_on.any()):
            self.finished = True
            self.close()

    def _ended(self, input_ids: Tensor) -> Tensor:
        """Rows whose last token is an EOS token."""
        if self.eos is None:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=self.live.device)
        self.eos = self.eos.to(input_ids.device)
        return torch.isin(input_ids[:, -1], self.eos).to(self.live.device)


class _Monitoring:
    """What the criterion and the processor share: the hooks' lifetime and the log."""

    _what = ""
    _usage = ""

    def __init__(
        self,
        monitor: Any,
        model: Any,
        *,
        tokenizer: Any,
        order: int | None,
        cascade: Any,
        eos_token_id: int | list[int] | None,
        action: Any,
    ):
        adapter = monitor._adapter(model, tokenizer=tokenizer)
        hf = adapter.hf_model()
        if hf is None:
            raise TPCHooksError(
                f"{self._what} works inside Hugging Face generate, and this {adapter.toolkit} model has none "
                "(HookedTransformer.generate takes no stopping criteria or logits processors); use "
                "monitor.generate(model, prompts, action='stop') or monitor.watch(model)"
            )
        eos = _eos_ids(eos_token_id, hf, tokenizer)
        self._check_eos(eos)
        lanes = lanes_of(monitor, "the monitor inside generate", order=order, cascade=cascade, action=action)
        run = _Run(
            monitor,
            adapter,
            [adapter.site(lane.site) for lane in lanes],
            what=self._what,
            usage=self._usage,
            lanes=lanes,
            eos=eos,
        )
        self._run = run
        # run.close, not a method of self: the finalizer must not keep self alive
        self._finalizer = weakref.finalize(self, run.close)

    def _check_eos(self, eos: Tensor | None) -> None:
        pass

    @property
    def log(self) -> Any:
        """The :class:`~tpc_hooks.GenerationRun` of the ``generate`` call this object served (a
        :class:`~tpc_hooks.MonitorSet`'s: a :class:`~tpc_hooks.MonitorSetRun`); it stays readable
        after the hooks are removed."""
        return self._run.log

    @property
    def active(self) -> bool:
        """Whether the hooks are attached."""
        return self._run.stack is not None

    def close(self) -> None:
        """Removes the hooks now (safe to call again; the log stays)."""
        self._finalizer()

    def __enter__(self) -> Any:
        if not self.active:
            raise TPCHooksError(
                f"this {self._what} is closed and its hooks are removed; make a new one for the "
                f"with block, as in: with monitor.{self._what}(model) as obj: ..."
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MonitorStoppingCriteria(_Monitoring, StoppingCriteria):
    """A ``transformers.StoppingCriteria`` that stops exactly the rows a monitor flags.

    Made by :meth:`Monitor.stopping_criteria`; see there. ``log`` is the
    :class:`~tpc_hooks.GenerationRun` of the ``generate`` call it served; ``close()`` removes its hooks.
    """

    _what = "stopping_criteria"
    _usage = "as in: model.generate(..., stopping_criteria=[monitor.stopping_criteria(model)])"

    def __call__(self, input_ids: Tensor, scores: Any = None, **kwargs: Any) -> Tensor:
        try:
            return self._run.stop(input_ids)
        except BaseException:
            self.close()
            raise


class MonitorLogitsProcessor(_Monitoring, LogitsProcessor):
    """A ``transformers.LogitsProcessor`` that forces EOS on the rows a monitor flags.

    Made by :meth:`Monitor.logits_processor`; see there. ``log`` is the
    :class:`~tpc_hooks.GenerationRun` of the ``generate`` call it served; ``close()`` removes its hooks.
    """

    _what = "logits_processor"
    _usage = "as in: model.generate(..., logits_processor=[monitor.logits_processor(model)])"

    def _check_eos(self, eos: Tensor | None) -> None:
        if eos is None:
            raise TPCHooksError(
                "logits_processor forces an EOS token on flagged rows, but neither eos_token_id= nor the "
                "model's generation_config (nor tokenizer=) names one; pass eos_token_id="
            )

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        try:
            return self._run.force_eos(input_ids, scores)
        except BaseException:
            self.close()
            raise


def _eos_ids(explicit: Any, hf: Any, tokenizer: Any) -> Tensor | None:
    """The EOS ids that end a row: ``explicit``, else the model's ``generation_config`` (what
    ``generate`` uses), else ``tokenizer.eos_token_id``; None when none names one."""
    ids = explicit
    if ids is None:
        ids = getattr(getattr(hf, "generation_config", None), "eos_token_id", None)
    if ids is None and tokenizer is not None:
        ids = getattr(tokenizer, "eos_token_id", None)
    if ids is None:
        return None
    items = [ids] if isinstance(ids, int) else list(ids) if isinstance(ids, (list, tuple)) else None
    if not items or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in items):
        raise TPCHooksError(f"eos_token_id must be a token id or a list of them; got {ids!r}")
    vocab = getattr(getattr(hf, "config", None), "vocab_size", None)
    if isinstance(vocab, int) and any(i >= vocab for i in items):
        raise TPCHooksError(
            f"eos_token_id {[i for i in items if i >= vocab]} names no token of this model "
            f"(vocabulary of {vocab}); pass the EOS id its tokenizer uses (tokenizer.eos_token_id)"
        )
    return torch.tensor(items, dtype=torch.long)
