"""A monitor's generation entry points (:class:`GenerationMethods`, which :class:`~tpc_hooks.Monitor`
inherits): its own decode loop (``generate``), ``watch``, and the Hugging Face ``generate`` hooks (a
stopping criterion and a logits processor). The loop itself is ``_generation``; the hooks, ``_hf_generate``.
"""

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..head import Cascade
from . import _generation
from ._records import GenerationRun, MonitorEvent, WatchLog


class GenerationMethods:
    """What a monitor does while a model generates (mixed into :class:`~tpc_hooks.Monitor`)."""

    def generate(
        self,
        model: Any,
        prompts: Sequence[str],
        max_new_tokens: int = 32,
        action: str | Callable = "flag",
        *,
        order: int | None = None,
        cascade: float | Cascade | None = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        seed: int = 0,
        stop_at_eos: bool = True,
        tokenizer: Any = None,
    ) -> GenerationRun:
        """Generates from ``prompts`` while scoring every step from the model's own forward passes.

        At each step the running pooled vector (prompt + tokens so far) is scored with the
        policy; step 0 is the prompt alone. Sequences are left-padded and batched; the KV cache
        is used. Scores equal :meth:`score` on the same prefix (tested). The monitor scores on
        the model's device and keeps every step there until the end; the loop reads one bool
        per step back to the host (whether any row goes on, as Hugging Face ``generate`` does;
        a callable ``action`` also reads the flagged rows). A step whose activations hold
        NaN/inf scores NaN, counts as flagged and raises a ``RuntimeWarning`` at the end.

        Args:
            action: ``"flag"`` (record only), ``"stop"`` (end a sequence at its first flagged
                step; the others continue) or a callable ``f(MonitorEvent) -> bool`` called for
                each flagged step; returning True stops that sequence.
            do_sample, temperature, seed: greedy decoding by default. The sampling generator
                lives on the model's device (seeded by ``seed``), so a GPU and a CPU draw
                different samples from the same seed.
            stop_at_eos: end a sequence after it emits the tokenizer's EOS token.
            tokenizer: the tokenizer of a ``transformers`` model (default: loaded from its
                ``name_or_path``); toolkit models use their own.

        Returns:
            A :class:`GenerationRun`.
        """
        return _generation.generate(
            self,
            model,
            prompts,
            max_new_tokens,
            action,
            order=order,
            cascade=cascade,
            do_sample=do_sample,
            temperature=temperature,
            seed=seed,
            stop_at_eos=stop_at_eos,
            tokenizer=tokenizer,
        )

    def watch(
        self,
        model: Any,
        *,
        order: int | None = None,
        cascade: float | Cascade | None = None,
        on_flag: Callable[[MonitorEvent], Any] | None = None,
        tokenizer: Any = None,
    ) -> AbstractContextManager["WatchLog"]:
        """Scores every forward pass ``model`` makes inside the block (your own ``generate`` too).

        A call without a KV cache starts new sequences; calls that continue a cache add their
        tokens to each row's running pool. Pass ``attention_mask`` with padded batches (Hugging
        Face ``generate`` does) so padding is not pooled. Hooks are removed however the block ends.
        ``tokenizer``: as in :meth:`score` (not needed to watch). To stop flagged rows inside
        ``generate``, see :meth:`stopping_criteria`.

        Example:
            >>> with monitor.watch(lm) as log:  # doctest: +SKIP
            ...     lm._module.generate(**batch, max_new_tokens=20)
            >>> log.scores[-1]  # doctest: +SKIP
        """
        return _generation.watch(self, model, order=order, cascade=cascade, on_flag=on_flag, tokenizer=tokenizer)

    def stopping_criteria(
        self,
        model: Any,
        *,
        order: int | None = None,
        cascade: float | Cascade | None = None,
        eos_token_id: int | list[int] | None = None,
        tokenizer: Any = None,
    ) -> Any:
        """A ``transformers.StoppingCriteria`` that stops the rows this monitor flags, inside the
        model's own ``generate``.

        Every forward pass ``generate`` makes (KV cache on) is read at :attr:`site` by a hook; each
        row's running pool is scored with the policy, and the rows with ``prob >= threshold`` are
        stopped (a per-row bool tensor: the other rows go on, token for token as without the
        monitor). The pool, the decision and the log stay where the activations are; the
        criterion reads one bool per step (whether any row goes on), as ``generate`` does. As
        with any stopping criterion, ``generate`` has already appended the token of the step that
        is stopped, and pads a finished row only when it has an EOS token (the model's
        ``generation_config`` usually names one); :meth:`logits_processor` puts EOS in its place.

        One criterion serves one ``generate`` call. Its hooks are attached when it is made and
        removed as soon as every row has ended (flagged, or an EOS token), by ``close()``
        (idempotent), at the end of a ``with`` block however it ends, or when the criterion is
        garbage-collected. So the inline form below leaves no hook behind once ``generate``
        returns, or once its exception is handled (CPython frees the criterion then). A criterion
        you keep in a variable keeps its hooks while rows are unfinished (``max_new_tokens``
        reached): call ``sc.close()``, use ``with``, or drop it. The log stays readable after the
        hooks are gone: ``sc.log``, or :attr:`last_run` for the inline form.

        Works with whatever drives the Hugging Face model's ``generate`` (greedy or sampling,
        ``num_beams=1``): a ``transformers`` model, nnsight's ``lm._module``, a TransformerBridge's
        ``original_model``.

        Args:
            model: the model ``generate`` runs (or its toolkit wrapper).
            order, cascade: the scoring policy (see :meth:`policy`).
            eos_token_id: the EOS ids that end a row, when ``generate`` is given others than the
                model's ``generation_config`` (the log needs to know when a row ended).
            tokenizer: as in :meth:`score` (only its EOS id is read, when no other names one).

        Returns:
            A ``StoppingCriteria`` (also a context manager); its ``log`` (a
            :class:`~tpc_hooks.GenerationRun`) holds the step scores per row and first flagged
            steps of the ``generate`` call it served.

        Raises:
            TPCHooksError: a model without Hugging Face ``generate`` (``HookedTransformer``); from
                inside ``generate``: a criterion used for a second ``generate`` call or after
                ``close()``, or made but not passed to the ``generate`` that runs its model.

        Example:
            >>> out = hf_model.generate(**batch, max_new_tokens=32,  # doctest: +SKIP
            ...                         stopping_criteria=[monitor.stopping_criteria(hf_model, tokenizer=tok)])
            >>> monitor.last_run.stopped_at  # doctest: +SKIP
            >>> with monitor.stopping_criteria(hf_model, tokenizer=tok) as sc:  # doctest: +SKIP
            ...     out = hf_model.generate(**batch, max_new_tokens=32, stopping_criteria=[sc])
            >>> sc.log.stopped_at, sc.log.scores[0]  # doctest: +SKIP
        """
        from ._hf_generate import MonitorStoppingCriteria

        return MonitorStoppingCriteria(
            self, model, tokenizer=tokenizer, order=order, cascade=cascade, eos_token_id=eos_token_id, action="stop"
        )

    def logits_processor(
        self,
        model: Any,
        *,
        order: int | None = None,
        cascade: float | Cascade | None = None,
        eos_token_id: int | list[int] | None = None,
        tokenizer: Any = None,
    ) -> Any:
        """A ``transformers.LogitsProcessor`` that forces EOS on the rows this monitor flags, for
        code paths that take processors but no stopping criteria.

        As :meth:`stopping_criteria` (same hooks, scores, log, lifetime: inline, ``close()`` or
        ``with``), except that a row flagged at step ``t`` gets an EOS token in place of its next
        token (and at every later step), so it ends with ``t`` generated tokens plus EOS;
        ``generate``'s own EOS criterion then finishes it. ``eos_token_id`` (default: the model's
        ``generation_config``, else ``tokenizer.eos_token_id``) must name an EOS token; the first
        one is forced. The hooks are removed early when every row is forced to EOS; a row that
        picks EOS itself is known to have ended only at the next step, so when the last rows end
        that way the hooks go when the processor is closed or freed.

        Example:
            >>> out = hf_model.generate(**batch, max_new_tokens=32,  # doctest: +SKIP
            ...                         logits_processor=[monitor.logits_processor(hf_model, tokenizer=tok)])
            >>> monitor.last_run.first_flagged  # doctest: +SKIP
        """
        from ._hf_generate import MonitorLogitsProcessor

        return MonitorLogitsProcessor(
            self, model, tokenizer=tokenizer, order=order, cascade=cascade, eos_token_id=eos_token_id, action="stop"
        )
