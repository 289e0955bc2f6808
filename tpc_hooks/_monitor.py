"""A monitor: a TPC head bound to a hook point, a pooling and a decision policy.

It scores prompts offline, watches a model generate (reading the activations the model
computes anyway, with its KV cache) and saves to the same directory format as a head.
"""

import math
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from . import _format, _generation, _kernel
from ._checks import check_labels
from ._errors import TPCHooksError
from .adapters import Adapter, get_adapter, pad, pad_id, parse_site, resolve_bos
from ._cascade import Cascade, CascadeResult
from ._collect import check_prompts, collect, pooled_batches, token_batches
from ._generation import GenerateLog, GenerationRun, MonitorEvent, WatchLog
from .pooling import aggregate as aggregate_logits, check_aggregate, check_pooling, check_skip, scored
from ._history import FitConfig
from ._polynomial import TPC, from_saved, to_saved
from ._sae import check_sae, dims as sae_dims, encode as sae_encode, identity as sae_identity


@dataclass
class Monitor:
    """A trained TPC head + the site it reads + pooling + tokenisation + decision policy.

    Attributes:
        head: the :class:`~tpc_hooks.TPC`.
        site: TransformerLens hook name it reads (``blocks.L.hook_resid_post``).
        pooling: ``"mean"``, ``"last"`` or ``"max"`` (the activations of a prefix pooled, then
            scored), or ``"token"``: every token scored and the logits aggregated over time
            (a streaming monitor; see ``aggregate``).
        chat_template: whether prompts are wrapped in the tokenizer's chat template.
        prepend_bos: whether a BOS token is prepended to raw prompts (None: when the
            tokenizer has one).
        max_tokens: prompt truncation used when it was trained.
        model_name: the model it was trained on (informational; ``d_model`` is enforced).
        cascade: the default policy (thresholds + per-order calibration), or None to score
            with the full polynomial.
        threshold: probability at or above which an input is flagged. Compared in logit space
            (``result.decision_logits >= logit(threshold)``, in float32), so thresholds set by
            :meth:`calibrate` stay meaningful where float32 probabilities reach 1.
        last_generate_log: the :class:`~tpc_hooks.GenerateLog` of the latest Hugging Face
            ``generate`` call served by one of its :meth:`stopping_criteria` or
            :meth:`logits_processor` (None before any; not saved, not compared).
        sae: an SAELens SAE when the head reads SAE latents (``head.d_model == d_sae``): the
            site's activations are encoded per token before pooling. Its identity (sizes,
            recorded release/id/hook, weights hash) is saved, and a different SAE is refused.
        aggregate, alpha, window: how a per-token monitor (``pooling="token"``) turns the
            per-token logits ``s_1..s_t`` of a prefix into its logit: ``"mean"``, ``"max"``,
            ``"ema"`` (``e_t = alpha * s_t + (1 - alpha) * e_{t-1}``, ``e_1 = s_1``) or
            ``"rolling"`` (the mean of the last ``window`` logits; the default: on long benign
            conversations its false-positive rate stays put as they grow, where a running
            ``"max"``'s climbs with every token; benchmarks/bench_streaming.py); see
            :func:`tpc_hooks.pooling.aggregate`. Ignored by prefix-pooled monitors.
        skip: a per-token monitor's leading tokens that are never scored: the fixed prefix every
            sequence starts with (BOS, the chat template's system prompt and user header), which
            carries no information about the request and would otherwise put the same floor
            under every sequence's maximum. :func:`train_monitor` sets it from the tokenizer
            (:meth:`~tpc_hooks.adapters.Adapter.fixed_prefix`); 0 scores every token.
    """

    head: TPC
    site: str
    pooling: str = "mean"
    chat_template: bool = False
    prepend_bos: bool | None = None
    max_tokens: int | None = 512
    model_name: str | None = None
    cascade: Cascade | None = None
    threshold: float = 0.5
    report: dict[str, Any] = field(default_factory=dict)
    sae: Any = None
    sae_identity: dict[str, Any] | None = None
    aggregate: str = "rolling"
    alpha: float = 0.1
    window: int = 16
    skip: int = 0
    last_generate_log: GenerateLog | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.head, TPC):
            raise TPCHooksError(f"Monitor needs a tpc_hooks.TPC head; got {type(self.head).__name__}")
        parse_site(self.site)
        if self.pooling != "token":
            check_pooling(self.pooling)
        self.aggregate, self.alpha, self.window = check_aggregate(self.aggregate, self.alpha, self.window)
        self.skip = check_skip(self.skip)
        if not 0 < self.threshold < 1:
            raise TPCHooksError(f"threshold must be in (0, 1); got {self.threshold!r}")
        if self.cascade is not None and self.cascade.head is not self.head:
            raise TPCHooksError("the monitor's cascade must wrap the monitor's own head")
        if self.sae is not None:
            ident = sae_identity(self.sae)
            if self.sae_identity is not None and self.sae_identity.get("weights_sha256") != ident["weights_sha256"]:
                raise TPCHooksError(
                    f"this monitor was trained on SAE latents of {_describe(self.sae_identity)}, and the SAE given "
                    f"differs ({_describe(ident)}); pass the SAE it was trained with"
                )
            if sae_dims(self.sae)[1] != self.head.d_model:
                raise TPCHooksError(f"the SAE has d_sae={sae_dims(self.sae)[1]} but the head reads {self.head.d_model} features")
            self.sae_identity = ident
        elif self.sae_identity is not None:
            raise TPCHooksError(f"this monitor reads SAE latents of {_describe(self.sae_identity)}; pass sae= "
                                "(Monitor.load(path, sae=...))")

    @property
    def streaming(self) -> bool:
        """Whether this is a per-token monitor (``pooling="token"``)."""
        return self.pooling == "token"

    def _features(self, acts: Tensor) -> Tensor:
        """What the head reads from per-token activations: SAE latents when the monitor has an SAE."""
        return acts if self.sae is None else sae_encode(self.sae, acts)

    # ------------------------------------------------------------------ checks
    def _adapter(self, model: Any, tokenizer: Any = None) -> Adapter:
        adapter = get_adapter(model, tokenizer=tokenizer)
        adapter.site(self.site)
        if self.sae is not None:
            check_sae(self.sae, adapter.d_model, self.site)
        elif adapter.d_model != self.head.d_model:
            raise TPCHooksError(
                f"monitor expects d_model={self.head.d_model} at {self.site!r} but the model produces "
                f"{adapter.d_model}; was it trained on another model ({self.model_name or 'unknown'})?"
            )
        self._follow(adapter.device)
        return adapter

    # ------------------------------------------------------------------ scoring
    def policy(self, order: int | None = None, cascade: float | Cascade | None = None) -> Callable[[Tensor], CascadeResult]:
        """The scoring rule: a fixed truncation ``order``; a cascade (a threshold ``tau``, used
        with this monitor's calibration, or a :class:`~tpc_hooks.Cascade` on this head); or by
        default the monitor's own cascade, else the full polynomial."""
        if order is not None and cascade is not None:
            raise TPCHooksError("pass order= (a fixed truncation) or cascade= (a threshold or Cascade), not both")
        if isinstance(cascade, Cascade):
            if cascade.head is not self.head:
                raise TPCHooksError("cascade= must wrap this monitor's head (Cascade(monitor.head, ...))")
            return cascade
        if cascade is not None:
            base = self.cascade or Cascade(self.head).centered(self.threshold)
            return base.with_thresholds(float(cascade), center=base.center)
        if order is None and self.cascade is not None:
            return self.cascade
        return _Fixed(self.head, self.head.check_order(order))

    def _step_policy(self, order: int | None = None, cascade: float | Cascade | None = None) -> Callable[[Tensor], CascadeResult]:
        """:meth:`policy` for the per-step path of generation: the same scores with no host
        synchronisation (non-finite rows score NaN instead of raising; see :meth:`Cascade.step`)."""
        return self.policy(order, cascade).step

    # ------------------------------------------------------------------ device
    def to(self, device: str | torch.device) -> "Monitor":
        """Moves the head (and so the cascade, which shares it) to ``device``; returns ``self``.

        Not usually needed: a monitor moves to its model's device when it is first used with
        that model (``score``, ``generate``, ``watch``, the ``generate`` hooks), and scores
        there in float32 whatever the model's dtype.

        Example:
            >>> monitor.to("cuda")  # doctest: +SKIP
        """
        self.head.to(device)
        return self

    def _follow(self, device: torch.device) -> None:
        # a lazily loaded model (nnsight before its first trace) sits on the meta device: no weights to follow
        if device.type != "meta" and self.head.bias.device != device:
            self.head.to(device)

    @torch.no_grad()
    def score(self, model: Any, prompts: Sequence[str] | None = None, *, tokens: Sequence[Sequence[int]] | None = None,
              order: int | None = None, cascade: float | Cascade | None = None, batch_size: int = 8,
              tokenizer: Any = None) -> CascadeResult:
        """Scores prompts (or already tokenised sequences) offline.

        Args:
            model: the model to read (its d_model and site must match).
            prompts: texts, tokenised as the monitor was trained (chat template, truncation).
            tokens: token id lists instead of texts (e.g. ``run.sequences[b][:n]``).
            order, cascade: a fixed truncation, or a cascade threshold / :class:`~tpc_hooks.Cascade`
                (see :meth:`policy`).
            tokenizer: the tokenizer of a ``transformers`` model (default: loaded from its
                ``name_or_path``); toolkit models use their own.

        Returns:
            A :class:`~tpc_hooks.CascadeResult`: ``logits``, ``probs``, ``exit_order``, ``flops``.
        """
        adapter = self._adapter(model, tokenizer)
        if (prompts is None) == (tokens is None):
            raise TPCHooksError("pass prompts or tokens (exactly one)")
        if tokens is None:
            ids, _ = adapter.tokenize(check_prompts(prompts), chat_template=self.chat_template, max_tokens=self.max_tokens,
                                      prepend_bos=self.prepend_bos)
        else:
            ids = [list(map(int, t)) for t in tokens]
            if not ids or any(len(t) == 0 for t in ids):
                raise TPCHooksError("tokens must be a non-empty list of non-empty token id lists")
        site = adapter.site(self.site)
        if self.streaming:  # the aggregate after each prompt's last token
            per = self._token_pass(adapter, ids, site, self.policy(order, cascade), batch_size)
            return _stack_results([_at(res, agg, -1) for res, agg in per])
        z = pooled_batches(adapter, ids, [site], self.pooling, batch_size, sae=self.sae)[site.name]
        return self.policy(order, cascade)(z)

    def _token_pass(self, adapter: Adapter, ids: list[list[int]], site: Any, rule: Callable[[Tensor], CascadeResult],
                    batch_size: int) -> list[tuple[CascadeResult, Tensor]]:
        """A per-token monitor offline: for each sequence, the rule's result for every token
        ``[T]`` and the aggregated logit after every token ``[T]`` (inputs are checked, so
        NaN/inf is an error here)."""
        return [self._aggregated(rule, z) for z in self._token_acts(adapter, ids, site, batch_size)]

    def _aggregated(self, rule: Callable[[Tensor], CascadeResult], z: Tensor) -> tuple[CascadeResult, Tensor]:
        """One sequence's per-token results ``[T]`` (the ``skip`` leading tokens cost no FLOPs) and
        the aggregated logit after every token ``[T]`` (``-inf`` over the skipped prefix)."""
        res = rule(z)
        ones = torch.ones(1, z.shape[0], device=res.logits.device)
        on = scored(ones, self.skip)[0]
        res = replace(res, flops=res.flops.masked_fill(~on.to(res.flops.device), 0))
        return res, aggregate_logits(res.logits[None], ones, self.aggregate, self.alpha, self.window, self.skip)[0]

    def _token_acts(self, adapter: Adapter, ids: list[list[int]], site: Any, batch_size: int) -> list[Tensor]:
        """Each sequence's per-token features ``[T, d]`` (SAE latents with an SAE), batched by
        length, one forward pass per batch."""
        return token_batches(adapter, ids, [site], batch_size, sae=self.sae, to_host=False)[site.name]

    # ------------------------------------------------------------------ operating point
    @torch.no_grad()
    def calibrate(self, model: Any, benign_prompts: Sequence[str], fpr: float = 0.01, *, batch_size: int = 8,
                  tokenizer: Any = None) -> "Monitor":
        """Sets :attr:`threshold` so that at most ``fpr`` of ``benign_prompts`` is flagged.

        The prompts are scored as :meth:`score` does (this monitor's pooling and policy); see
        :meth:`calibrate_activations` for what is set and recorded (``tokenizer``: as in
        :meth:`score`). Returns ``self``.

        Example:
            >>> monitor.calibrate(model, benign_validation_prompts, fpr=0.01)  # doctest: +SKIP
            >>> monitor.threshold, monitor.report["operating_point"]["flagged"]  # doctest: +SKIP
        """
        adapter = self._adapter(model, tokenizer)
        ids, _ = adapter.tokenize(check_prompts(benign_prompts), chat_template=self.chat_template,
                                  max_tokens=self.max_tokens, prepend_bos=self.prepend_bos)
        site = adapter.site(self.site)
        if self.streaming:
            return self.calibrate_activations(self._token_acts(adapter, ids, site, batch_size), fpr)
        z = pooled_batches(adapter, ids, [site], self.pooling, batch_size, sae=self.sae)[site.name]
        return self.calibrate_activations(z, fpr)

    @torch.no_grad()
    def calibrate_activations(self, benign: Any, fpr: float = 0.01) -> "Monitor":
        """Sets :attr:`threshold` from pooled activations ``[n, d_model]`` of benign inputs, so that
        at most ``fpr`` of them is flagged (``prob >= threshold``). A per-token monitor takes a
        list of per-token activations ``[T_i, d_model]``, one per benign sequence, and counts a
        sequence as flagged when its aggregated score reaches the threshold at any token (the
        maximum over the sequence: what a monitor streaming it would see).

        With a cascade, its exits are first centred on the full order's threshold
        (:meth:`Cascade.centered`: an order settles a row only when it is clearly on one side of
        the threshold in use), then the threshold is set on the cascade's own probabilities, so
        the bound holds for the policy that runs. ``report["operating_point"]`` records the
        target, the benign count and how many were flagged. Returns ``self``.

        Raises:
            TPCHooksError: no rows, wrong ``d_model``, NaN/inf, ``fpr`` outside [0, 1), or a benign
                tail saturated at probability 1 (no threshold below 1 can separate it).
        """
        from .metrics import threshold_at_fpr
        from ._checks import check_features

        if self.streaming:
            if isinstance(benign, (Tensor, np.ndarray)) or not isinstance(benign, Sequence) or not benign:
                raise TPCHooksError("a per-token monitor calibrates on a non-empty list of per-token activations "
                                    "[T_i, d_model], one per benign sequence (or use calibrate(model, prompts))")
            seqs = [check_features(z, f"benign sequence {i}", self.head.d_model).float() for i, z in enumerate(benign)]
            decisions_of = lambda rule: torch.stack([self._aggregated(rule, z)[1].max() for z in seqs])
            n = len(seqs)
        else:
            z = check_features(benign, "benign activations", self.head.d_model).float()
            decisions_of = lambda rule: rule(z).decision_logits
            n = z.shape[0]
        if not 0 <= fpr < 1:
            raise TPCHooksError(f"fpr must be in [0, 1); got {fpr!r}")
        if self.cascade is not None:
            full = decisions_of(self.cascade.with_thresholds(0.0))
            self.cascade = self.cascade.centered(_above(full, threshold_at_fpr(full.double().cpu().numpy(), fpr)))
        decisions = decisions_of(self.policy())
        self.threshold = _above(decisions, threshold_at_fpr(decisions.double().cpu().numpy(), fpr))
        flagged = int(_generation.flagged(decisions, self.threshold).sum())
        self.report["operating_point"] = {"fpr": float(fpr), "n_benign": n, "flagged": flagged,
                                          "threshold": self.threshold, **({"by": "max over tokens"} if self.streaming else {})}
        return self

    @torch.no_grad()
    def token_scores(self, model: Any, prompt: str, *, order: int | None = None,
                     cascade: float | Cascade | None = None, tokenizer: Any = None) -> "TokenScores":
        """The monitor's score of every prefix of one prompt, from a single forward pass.

        Returns ``(token strings, result)`` (a :class:`TokenScores`, which also renders with
        ``.to_html()``); ``result.probs[t]`` scores the first ``t + 1`` tokens (a per-token
        monitor: the aggregate after token ``t``). Hand it to :func:`tpc_hooks.views.colored_tokens` for circuitsvis. ``tokenizer``:
        as in :meth:`score`.
        """
        adapter = self._adapter(model, tokenizer)
        site = adapter.site(self.site)
        (ids,), _ = adapter.tokenize(check_prompts([prompt]), chat_template=self.chat_template,
                                     max_tokens=self.max_tokens, prepend_bos=self.prepend_bos)
        tokens = [adapter.tokenizer.decode([t]) for t in ids]
        if self.streaming:  # every token scored, the aggregate after each
            res, agg = self._token_pass(adapter, [ids], site, self.policy(order, cascade), 1)[0]
            return TokenScores(tokens, CascadeResult(logits=agg, probs=torch.sigmoid(agg), exit_order=res.exit_order,
                                                     flops=res.flops.cumsum(0), degree=res.degree, decision_logits=agg),
                               self.threshold,
                               min(self.skip, len(tokens)))
        x, mask = pad([ids], pad_id(adapter.tokenizer), "right")
        acts = self._features(adapter.forward_sites(x, mask, [site])[site.name][0].float())  # [T, D]
        if self.pooling == "mean":  # the monitor's pooling of every prefix, only the one it uses
            prefixes = acts.cumsum(0) / torch.arange(1, acts.shape[0] + 1, device=acts.device, dtype=acts.dtype)[:, None]
        elif self.pooling == "max":
            prefixes = acts.cummax(0).values
        else:
            prefixes = acts
        return TokenScores(tokens, self.policy(order, cascade)(prefixes), self.threshold)

    # ------------------------------------------------------------------ generation
    def generate(self, model: Any, prompts: Sequence[str], max_new_tokens: int = 32, action: str | Callable = "flag", *,
                 order: int | None = None, cascade: float | Cascade | None = None, do_sample: bool = False,
                 temperature: float = 1.0,
                 seed: int = 0, stop_at_eos: bool = True, tokenizer: Any = None) -> GenerationRun:
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
        return _generation.generate(self, model, prompts, max_new_tokens, action, order=order, cascade=cascade,
                                    do_sample=do_sample, temperature=temperature, seed=seed, stop_at_eos=stop_at_eos,
                                    tokenizer=tokenizer)

    def watch(self, model: Any, *, order: int | None = None, cascade: float | Cascade | None = None,
              on_flag: Callable[[MonitorEvent], Any] | None = None,
              tokenizer: Any = None) -> AbstractContextManager["WatchLog"]:
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

    def stopping_criteria(self, model: Any, *, order: int | None = None, cascade: float | Cascade | None = None,
                          eos_token_id: int | list[int] | None = None, tokenizer: Any = None) -> Any:
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
        hooks are gone: ``sc.log``, or :attr:`last_generate_log` for the inline form.

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
            :class:`~tpc_hooks.GenerateLog`) holds the step scores per row and first flagged
            steps of the ``generate`` call it served.

        Raises:
            TPCHooksError: a model without Hugging Face ``generate`` (``HookedTransformer``); from
                inside ``generate``: a criterion used for a second ``generate`` call or after
                ``close()``, or made but not passed to the ``generate`` that runs its model.

        Example:
            >>> out = hf_model.generate(**batch, max_new_tokens=32,  # doctest: +SKIP
            ...                         stopping_criteria=[monitor.stopping_criteria(hf_model, tokenizer=tok)])
            >>> monitor.last_generate_log.stopped_at  # doctest: +SKIP
            >>> with monitor.stopping_criteria(hf_model, tokenizer=tok) as sc:  # doctest: +SKIP
            ...     out = hf_model.generate(**batch, max_new_tokens=32, stopping_criteria=[sc])
            >>> sc.log.stopped_at, sc.log.scores[0]  # doctest: +SKIP
        """
        from ._hf_generate import MonitorStoppingCriteria

        return MonitorStoppingCriteria(self, model, tokenizer=tokenizer, order=order, cascade=cascade,
                                       eos_token_id=eos_token_id)

    def logits_processor(self, model: Any, *, order: int | None = None, cascade: float | Cascade | None = None,
                         eos_token_id: int | list[int] | None = None, tokenizer: Any = None) -> Any:
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
            >>> monitor.last_generate_log.first_flagged  # doctest: +SKIP
        """
        from ._hf_generate import MonitorLogitsProcessor

        return MonitorLogitsProcessor(self, model, tokenizer=tokenizer, order=order, cascade=cascade,
                                      eos_token_id=eos_token_id)

    # ------------------------------------------------------------------ saving
    def _config(self) -> dict[str, Any]:
        cfg, _ = to_saved(self.head)
        cfg["monitor"] = {
            "site": self.site, "pooling": self.pooling, "chat_template": self.chat_template,
            "prepend_bos": self.prepend_bos,
            "max_tokens": self.max_tokens, "threshold": self.threshold,
            **({"aggregate": self.aggregate, "alpha": self.alpha, "window": self.window, "skip": self.skip}
               if self.streaming else {}),
            "model": {"name": self.model_name, "d_model": self.head.d_model},
            "cascade": None if self.cascade is None else self.cascade.to_dict(),
            "report": self.report,
            "sae": self.sae_identity,
        }
        return cfg

    def save(self, path: str | os.PathLike) -> Path:
        """Saves head and policy to a directory (``config.json`` + ``model.safetensors``)."""
        return _format.write_dir(path, self._config(), to_saved(self.head)[1])

    def save_pretrained(self, directory: str | os.PathLike, *, card: bool = True) -> Path:
        """:meth:`save` plus a generated model card (``README.md``: model, site, pooling, data,
        F1/recall per order, threshold, how to load). Returns the directory."""
        from ._hub import save_pretrained

        return save_pretrained(self, directory, card=card)

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, *, sae: Any = None, revision: str | None = None,
                        token: str | bool | None = None, cache_dir: str | os.PathLike | None = None) -> "Monitor":
        """Loads a monitor from a local directory or a Hugging Face hub repository id
        (``"user/repo"``, downloaded with ``huggingface_hub``; needs the network). Never unpickles.

        Example:
            >>> monitor = tpc.Monitor.from_pretrained("user/smollm2-harm-monitor")  # doctest: +SKIP
        """
        from ._hub import from_pretrained

        return from_pretrained(cls, name_or_path, revision=revision, token=token, cache_dir=cache_dir, sae=sae)

    def push_to_hub(self, repo_id: str, *, private: bool | None = None, token: str | bool | None = None,
                    commit_message: str = "Upload tpc-hooks monitor", revision: str | None = None) -> Any:
        """Uploads :meth:`save_pretrained`'s directory to a hub model repository (created if
        missing) with ``huggingface_hub``; returns its commit info."""
        from ._hub import push_to_hub

        return push_to_hub(self, repo_id, private=private, token=token, commit_message=commit_message, revision=revision)

    @classmethod
    def load(cls, path: str | os.PathLike, *, sae: Any = None) -> "Monitor":
        """Loads a monitor saved by :meth:`save` (strict; never unpickles).

        A monitor trained on SAE latents needs its SAE again (``sae=``); a different one is refused.
        """
        cfg, tensors = _format.read_dir(path)
        where = Path(path) / _format.CONFIG_FILE
        head = from_saved(cfg, tensors, where)
        mon = cfg.get("monitor")
        if not isinstance(mon, dict):
            raise TPCHooksError(f"{where} describes a bare head, not a monitor; load it with TPC.load and wrap it: "
                                "Monitor(head, site=...)")
        site = _format.require(mon, "site", str, where)
        model = mon.get("model") or {}
        if not isinstance(model, dict):
            raise TPCHooksError(f"{where}: monitor.model must be an object {{\"name\", \"d_model\"}}; got {model!r}")
        if model.get("d_model", head.d_model) != head.d_model:
            raise TPCHooksError(f"{where}: monitor.model.d_model={model.get('d_model')} disagrees with d_model={head.d_model}")
        cascade = None
        if mon.get("cascade") is not None:
            c = mon["cascade"]
            try:
                cascade = Cascade.from_dict(head, c)
            except (KeyError, TypeError, ValueError) as err:
                raise TPCHooksError(f"{where}: monitor.cascade is malformed ({err})") from None
        try:
            return cls(head=head, site=site, pooling=mon.get("pooling", "mean"), chat_template=bool(mon.get("chat_template", False)),
                       prepend_bos=mon.get("prepend_bos"),
                       max_tokens=mon.get("max_tokens"), model_name=model.get("name"), cascade=cascade,
                       threshold=float(mon.get("threshold", 0.5)), report=dict(mon.get("report") or {}),
                       sae=sae, sae_identity=mon.get("sae"), aggregate=mon.get("aggregate", "max"),
                       alpha=mon.get("alpha", 0.1), window=mon.get("window", 16), skip=mon.get("skip", 0))
        except (TypeError, ValueError) as err:  # TPCHooksError is a ValueError; float()/dict() of a bad value too
            raise TPCHooksError(f"{where}: {err}") from None


def _at(res: CascadeResult, agg: Tensor, t: int) -> CascadeResult:
    """A per-token monitor's result for the prefix ending at token ``t``: the aggregate, the
    token's exit order, and the FLOPs of every token up to it."""
    t = t % agg.shape[0]
    return CascadeResult(logits=agg[t:t + 1], probs=torch.sigmoid(agg[t:t + 1]), exit_order=res.exit_order[t:t + 1],
                         flops=res.flops[:t + 1].sum(0, keepdim=True), degree=res.degree, decision_logits=agg[t:t + 1])


def _stack_results(parts: Sequence[CascadeResult]) -> CascadeResult:
    cat = lambda k: torch.cat([getattr(r, k) for r in parts])
    return CascadeResult(logits=cat("logits"), probs=cat("probs"), exit_order=cat("exit_order"), flops=cat("flops"),
                         degree=parts[0].degree, decision_logits=cat("decision_logits"))


class TokenScores(tuple):
    """What :meth:`Monitor.token_scores` returns: a ``(tokens, result)`` pair (it unpacks as one)
    that also renders: :meth:`to_html`, and in Jupyter the prompt coloured token by token."""

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
        from .views import token_scores_html

        return token_scores_html(self.tokens, self.result, threshold=self.threshold, unscored=self.skip)

    def _repr_html_(self) -> str:
        return str(self.to_html())


class _Fixed:
    """A fixed truncation as a policy: called offline (inputs checked), or per generation step
    through :meth:`step` (no host synchronisation)."""

    def __init__(self, head: TPC, order: int):
        self.head, self.order, self.cost = head, order, head.cost(order).flops

    def _result(self, s: Tensor) -> CascadeResult:
        return CascadeResult(logits=s, probs=torch.sigmoid(s), exit_order=torch.full_like(s, self.order, dtype=torch.long),
                             flops=torch.full_like(s, self.cost, dtype=torch.long), degree=self.head.degree,
                             decision_logits=s)

    @torch.no_grad()
    def __call__(self, z: Tensor) -> CascadeResult:
        return self._result(self.head(z, order=self.order))

    @torch.no_grad()
    def step(self, z: Tensor) -> CascadeResult:
        zs, ok = _kernel.stream_rows(self.head, z)
        return self._result(_kernel.nan_rows(_kernel.stream_logits(self.head, zs, self.order)[0][:, -1], ok))


def _above(like: Tensor, z: float) -> float:
    """The lowest probability threshold that leaves a decision logit of ``z`` unflagged, by the
    monitors' rule (:func:`~tpc_hooks._generation.flagged`: in logit space, in ``like``'s dtype, so
    it does not saturate) and, where ``z``'s float32 probability is below 1, by ``prob >=
    threshold`` on that probability too; checked to lie in (0, 1)."""
    at = torch.tensor([z], dtype=like.dtype)
    target = torch.nextafter(at, torch.tensor([math.inf], dtype=like.dtype))
    t = float(torch.sigmoid(target.double()))
    while 0 < t < 1 and bool(_generation.flagged(at, t)):  # rounding at large logits: the next float64 up
        t = math.nextafter(t, 1.0)
    p_up = float(np.nextafter(torch.sigmoid(at.float()).numpy()[0], np.float32(1)))  # above z's float32 probability
    if p_up < 1:
        t = max(t, p_up)
    if t >= 1:
        raise TPCHooksError(f"the benign scores' tail is at logit {z:.4g}: no probability threshold below 1 keeps it "
                            "unflagged (the benign rows look harmful to this monitor; check the prompts and labels)")
    return max(t, math.ulp(0.0))


def _describe(ident: dict[str, Any]) -> str:
    name = "/".join(str(v) for v in (ident.get("release"), ident.get("sae_id")) if v) or ident.get("class", "SAE")
    return f"{name} (d_sae={ident.get('d_sae')}, weights {str(ident.get('weights_sha256'))[:12]})"


TRAIN_RECIPES = ("default", "in_distribution", "paper")
REWRITE_CONSISTENCY = 0.03  # fit's consistency weight on the training rewrites (bench_phrasing: the best of 0.03/0.1/0.3)


def train_monitor(
    model: Any,
    prompts: Sequence[str],
    labels: Any,
    site: str | Sequence[str],
    pooling: str = "mean",
    *,
    aggregate: str | None = None,
    alpha: float = 0.1,
    window: int = 16,
    contexts: Any = None,
    context_tokens: int | Sequence[int] = (512, 1024),
    augment: bool | Sequence[str] | None = None,
    recipe: str = "default",
    target_fpr: float | None = 0.01,
    val_fraction: float = 0.2,
    chat_template: bool | None = None,
    prepend_bos: bool | None = None,
    max_tokens: int | None = 512,
    batch_size: int = 8,
    tau: float | None = None,
    sae: Any = None,
    config: FitConfig | None = None,
    degree: int | None = None,
    rank: int | Sequence[int] | None = None,
    seed: int | None = None,
    verbose: bool = True,
    tokenizer: Any = None,
    **fit_kwargs: Any,
) -> Monitor:
    """Collects activations at ``site`` and trains a TPC monitor on them, in one call.

    By default the monitor is trained to hold up on requests *phrased* differently from the
    training prompts (past or future tense, fictional framing, third person, paraphrase, casing
    noise: ``tpc_hooks.data.PHRASING_FAMILIES``). Each training prompt gains one rewritten copy
    (same label), each validation prompt is rewritten by every family, and every degree >= 2 is
    selected for the *worst* validation group (the plain prompts and each family:
    ``fit(val_groups=...)``), with a small consistency penalty on the rewritten training prompts
    (``FitConfig.consistency``, 0.03: each degree >= 2 is pulled to add little there). On the repository's benchmark (``benchmarks/bench_phrasing.py``)
    this is what keeps the higher orders at least as strong as the linear probe on a phrasing
    family never trained on; ``augment=False`` trains on the prompts as given. The rewrites are
    English templates; collection reads about 2.8x as many prompts with every family.

    That robustness costs in-distribution recall: ``recipe="in_distribution"`` trains on the
    prompts as given with pooled selection (the highest recall on prompts phrased like the
    training set, and a dial that turns the wrong way on rephrased ones); ``recipe="paper"`` is
    the paper's exact recipe (:class:`~tpc_hooks.FitConfig`), with the rewrites unless
    ``augment=False``. The README's phrasing section has the measured trade-off.

    The monitor's operating point is set on the benign validation prompts (and their rewrites):
    ``threshold`` flags at most ``target_fpr`` of them (:meth:`Monitor.calibrate_activations`), and a
    cascade (``tau``) exits around that threshold.

    Args:
        model: a TransformerLens, nnsight or plain ``transformers`` model.
        prompts, labels: texts and their labels (1 = harmful).
        site: where to read, or several sites: all are collected in one pass and the one whose
            linear probe has the best worst-group recall at 1% false-positive rate on validation
            is kept (``monitor.report["site_selection"]`` has the table).
        pooling: how to pool tokens (``"mean"``, ``"last"``, ``"max"``), or ``"token"`` for a
            streaming monitor: the head is trained on every token's activation, each token
            labelled with its prompt's label, and scores are aggregated over time. The tokens
            every prompt starts with (BOS, the chat template's system prompt and header; see
            ``Monitor.skip``) are neither trained on nor scored.
        aggregate, alpha, window: a streaming monitor's aggregation (see :class:`Monitor`).
            Its report and operating point count a prompt as flagged when the aggregate
            reaches the threshold at any token. Default: ``"max"`` with ``contexts`` (the
            best at long contexts once the head has seen requests inside conversations),
            ``"rolling"`` without (trained on short prompts only, a running max flags more
            long benign chats the longer they are; README, "Long contexts").
        contexts: benign chat conversations (``[{"role", "content"}]`` turns, user first) to
            train a per-token monitor on requests *inside* conversations as well, or a number
            of ShareGPT contexts to draw (:func:`tpc_hooks.data.sharegpt_contexts`, the prompts
            excluded). Each context hosts one training or validation prompt (as given, not a
            rewrite; the classes balanced, in a seeded order) in place of its first, middle or
            last user turn, its budget the ``context_tokens`` in turn
            (:func:`tpc_hooks.data.host_requests`); its tokens before the request are benign
            rows, the request's turn carries the prompt's label, and after a harmful request the
            rest is dropped (:func:`tpc_hooks.data.token_labels`). 1000 contexts (as measured:
            README, "Long contexts") keep the short-prompt recall at 2k tokens; 300 did not. A ``val_fraction`` share of the contexts (at least 2) is held out:
            it joins model selection (group ``"contexts"``), the report
            (``report["contexts"]``) and, for its benign sequences, the operating point, so the
            threshold holds on long benign chats. Needs a chat template.
        context_tokens: each context's token budget, or several used in turn (512, 1024).
        augment: ``True`` (every phrasing family), ``False``, or the families to use; default:
            every family, none for ``recipe="in_distribution"``.
        recipe: ``"default"`` (rewrites + worst-family selection), ``"in_distribution"`` (no
            rewrites, pooled selection) or ``"paper"`` (the paper's recipe).
        target_fpr: the benign validation share the threshold may flag; None keeps 0.5.
        val_fraction: stratified validation split (model selection, calibration, report).
        chat_template: wrap prompts as chat user turns; default: when the tokenizer has a template.
        prepend_bos: prepend BOS to raw prompts; default: when the tokenizer has a BOS token.
        tau: if given, the monitor's policy is a cascade at ``tau``, calibrated on validation.
        sae: an SAELens SAE for ``site``: train on its latents (pooled per prompt), so
            attribution reads in feature ids.
        config, degree, rank, seed, verbose, **fit_kwargs: passed to :func:`tpc_hooks.fit` (a
            :class:`~tpc_hooks.FitConfig` and/or its fields; ``degree``, ``rank`` and ``seed``
            override ``config`` only when given; ``seed`` also draws the validation split and
            the rewrites).
        tokenizer: the tokenizer of a ``transformers`` model (default: loaded from its
            ``name_or_path``); toolkit models use their own.

    Returns:
        A :class:`Monitor`; ``monitor.report`` holds validation metrics per order (on the
        validation prompts as given), the worst validation group's, and the site choice.

    Example:
        >>> monitor = tpc.train_monitor(model, prompts, labels,  # doctest: +SKIP
        ...                             site=[f"blocks.{l}.hook_resid_post" for l in (10, 15, 20)])
    """
    from sklearn.model_selection import train_test_split

    from . import _phrasing
    from ._fit import fit
    from .data import PromptSet, rewrites
    from ._select import choose_site, worst_group
    from .metrics import classification_metrics

    items = check_prompts(prompts)
    y = check_labels(labels, len(items), "labels").numpy().astype(int)
    sites = [site] if isinstance(site, str) else list(dict.fromkeys(site))
    if not sites or not all(isinstance(s, str) for s in sites):
        raise TPCHooksError(f"site must be a hook name or a non-empty list of them; got {site!r}")
    if recipe not in TRAIN_RECIPES:
        raise TPCHooksError(f"recipe must be one of {list(TRAIN_RECIPES)}; got {recipe!r}")
    if recipe == "in_distribution" and augment not in (None, False):
        raise TPCHooksError("recipe='in_distribution' trains on the prompts as given; it cannot be combined with augment")
    families = _phrasing.check_families(recipe != "in_distribution" if augment is None else augment)
    adapter = get_adapter(model, tokenizer=tokenizer)
    for s in sites:
        adapter.site(s)
    if sae is not None and len(sites) > 1:
        raise TPCHooksError("an SAE belongs to one site: pass a single site with sae=")
    streaming = pooling == "token"
    if aggregate is None:
        aggregate = "rolling" if contexts is None else "max"
    if streaming:
        check_aggregate(aggregate, alpha, window)
        if len(sites) > 1:
            raise TPCHooksError("a per-token monitor (pooling='token') reads one site; pass a single site")
    else:
        check_pooling(pooling)
        if contexts is not None:
            raise TPCHooksError("contexts= trains a per-token monitor on requests inside conversations; pass "
                                "pooling='token'")
    if chat_template is None:
        chat_template = bool(getattr(adapter.tokenizer, "chat_template", None))
    if contexts is not None:
        contexts, context_tokens = _check_contexts(adapter.tokenizer, contexts, context_tokens, chat_template, items)
    if not 0 < val_fraction < 1:
        raise TPCHooksError(f"val_fraction must be in (0, 1); got {val_fraction!r}")
    if np.bincount(y, minlength=2).min() < 2:
        raise TPCHooksError("labels need at least 2 examples of each class to hold out a validation split")
    n_val = max(2, int(round(val_fraction * len(items))))
    given = {k: v for k, v in (("degree", degree), ("rank", rank), ("seed", seed)) if v is not None}
    own = {k: fit_kwargs.pop(k) for k in ("init", "device") if k in fit_kwargs}  # fit's, not FitConfig's
    if "recipe" in fit_kwargs:
        raise TPCHooksError("pass recipe= once (train_monitor's recipe covers fit's)")
    fit_recipe = {"recipe": "paper"} if recipe == "paper" else {}
    if recipe == "default" and families and "consistency" not in fit_kwargs and (config is None or not config.consistency):
        fit_recipe["consistency"] = REWRITE_CONSISTENCY
    cfg = FitConfig.from_options(config, {**given, **fit_kwargs, **fit_recipe})
    tr, va = train_test_split(np.arange(len(items)), test_size=n_val, stratify=y, random_state=cfg.seed)

    # One collection pass over the prompts and their rewrites; rows are addressed by index into `texts`.
    texts, y_all, va_rows, groups = list(items), list(y), list(va), ["prompts"] * len(va)
    if families:
        aug = rewrites([items[i] for i in tr], y[tr], families, seed=cfg.seed)
        views = rewrites([items[i] for i in va], y[va], families, every_family=True, seed=cfg.seed)
    else:
        aug = views = PromptSet([], [], [], [], [])
    tr_rows = list(tr) + list(range(len(texts), len(texts) + len(aug)))
    texts += aug.texts
    y_all += aug.labels
    va_rows += range(len(texts), len(texts) + len(views))
    groups += views.categories
    texts += views.texts
    y_all += views.labels
    y_all = np.asarray(y_all)
    bos = resolve_bos(adapter.tokenizer, prepend_bos, chat_template)
    y_tr, y_va, g_va = y_all[tr_rows], y_all[va_rows], np.asarray(groups)
    if streaming:
        return _train_token_monitor(
            adapter, texts, y_all, tr_rows, va_rows, g_va, n_plain_tr=len(tr), plain_va=list(va), site=sites[0],
            cfg=cfg, families=families, own=own, tau=tau, target_fpr=target_fpr, chat_template=chat_template, bos=bos,
            max_tokens=max_tokens, batch_size=batch_size, sae=sae, verbose=verbose, recipe=recipe,
            stream=(aggregate, alpha, window), n_aug=(len(aug), len(views)),
            contexts=None if contexts is None else (contexts, context_tokens, val_fraction))
    X = collect(adapter, texts, sites, pooling, batch_size=batch_size, chat_template=chat_template, prepend_bos=bos,
                max_tokens=max_tokens, sae=sae, progress=verbose)
    val_groups = g_va if families else None
    report: dict[str, Any] = {}
    if len(sites) > 1:
        chosen, table = choose_site({s: (X[s][tr_rows], y_tr, X[s][va_rows], y_va) for s in sites}, g_va, cfg,
                                    own.get("device"))
        report["site_selection"] = table
    else:
        chosen = sites[0]
    Xs = X[chosen]
    unlabelled = Xs[tr_rows[len(tr):]] if cfg.consistency and families else None  # the training rewrites
    head = fit(Xs[tr_rows], y_tr, Xs[va_rows], y_va, cfg, verbose=verbose, val_groups=val_groups,
               X_unlabelled=unlabelled, **own).cpu()
    Xv_plain = Xs[va]
    cascade = Cascade(head, tau).calibrate(Xs[va_rows], y_va) if tau is not None else None
    with torch.no_grad():
        per_order = [classification_metrics(y[va], head(Xv_plain, order=n)) for n in range(1, head.degree + 1)]
        worst = [worst_group(y_va, head(Xs[va_rows], order=n).double().numpy(), g_va) for n in range(1, head.degree + 1)]
    report.update({"validation": {"n": len(va), "per_order": per_order},
                   "worst_validation_group": {"groups": sorted(set(groups)), "per_order": worst},
                   "n_train": len(tr), "augment": {"families": list(families), "n_train_rewrites": len(aug),
                                                   "n_val_rewrites": len(views)}})
    report["recipe"] = recipe
    monitor = Monitor(head=head, site=chosen, pooling=pooling, chat_template=chat_template, prepend_bos=bos,
                      max_tokens=max_tokens, model_name=adapter.model_name, cascade=cascade, report=report, sae=sae)
    if target_fpr is not None:
        monitor.calibrate_activations(Xs[va_rows][y_va == 0], target_fpr)
    return monitor


def _train_token_monitor(adapter: Adapter, texts: list[str], y_all: np.ndarray, tr_rows: Sequence[Any],
                         va_rows: Sequence[Any], g_va: np.ndarray, *, n_plain_tr: int, plain_va: Sequence[Any], site: str,
                         cfg: FitConfig,
                         families: Sequence[str], own: dict[str, Any], tau: float | None, target_fpr: float | None,
                         chat_template: bool, bos: bool, max_tokens: int | None, batch_size: int, sae: Any,
                         verbose: bool, recipe: str, stream: tuple[str, float, int], n_aug: tuple[int, int],
                         contexts: tuple[list[list[dict[str, str]]], tuple[int, ...], float] | None) -> Monitor:
    """:func:`train_monitor` for ``pooling="token"``: the same prompts, rewrites, split and
    selection, on token rows (each token carries its prompt's label; validation groups too),
    plus, with ``contexts``, the rows of requests hosted in conversations."""
    from tqdm.auto import tqdm

    from ._context import host_splits, hosted_rows
    from ._fit import fit
    from .metrics import classification_metrics
    from ._rows import token_rows
    from ._select import worst_group

    ids, _ = adapter.tokenize(texts, chat_template=chat_template, max_tokens=max_tokens, prepend_bos=bos)
    skip = adapter.fixed_prefix(chat_template=chat_template, prepend_bos=bos)  # identical in every prompt: no signal
    with tqdm(total=len(ids), desc="collect tokens", unit="prompt", disable=not verbose) as bar:
        per = token_batches(adapter, ids, [adapter.site(site)], batch_size, bar, sae=sae)[site]
    X_tr, y_tr_t = token_rows([per[i] for i in tr_rows], skip, y_all[tr_rows])
    X_va, y_va_t, groups_t = token_rows([per[i] for i in va_rows], skip, y_all[va_rows], g_va)
    hosted: dict[str, Any] = {}
    if contexts is not None:  # requests inside benign conversations: more rows for training and validation
        convs, lengths, val_fraction = contexts
        splits = {name: ([texts[i] for i in idx], y_all[list(idx)])
                  for name, idx in (("val", plain_va), ("train", tr_rows[:n_plain_tr]))}
        for split, h in host_splits(adapter.tokenizer, convs, splits, val_fraction=val_fraction, lengths=lengths,
                                    seed=cfg.seed).items():
            with tqdm(total=len(h.sequences), desc=f"collect {split} contexts", unit="chat", disable=not verbose) as bar:
                acts = token_batches(adapter, [q.ids for q in h.sequences], [adapter.site(site)], batch_size, bar,
                                     sae=sae)[site]
            rows = hosted_rows(acts, [(q.start, q.stop) for q in h.sequences], h.labels, skip=skip, tail=h.tail)
            hosted[split] = (h, acts, rows)
        X_tr, y_tr_t = torch.cat([X_tr, hosted["train"][2][0]]), np.concatenate([y_tr_t, hosted["train"][2][1]])
        X_va, y_va_t = torch.cat([X_va, hosted["val"][2][0]]), np.concatenate([y_va_t, hosted["val"][2][1]])
        groups_t = np.concatenate([groups_t, np.full(len(y_va_t) - len(groups_t), "contexts")])
    unlabelled = token_rows([per[i] for i in tr_rows[n_plain_tr:]], skip)[0] if cfg.consistency and families else None
    head = fit(X_tr, y_tr_t, X_va, y_va_t, cfg, verbose=verbose,
               val_groups=groups_t if families else None, X_unlabelled=unlabelled, **own).cpu()
    cascade = Cascade(head, tau).calibrate(X_va, y_va_t) if tau is not None else None
    how, alpha, window = stream
    monitor = Monitor(head=head, site=site, pooling="token", chat_template=chat_template, prepend_bos=bos,
                      max_tokens=max_tokens, model_name=adapter.model_name, cascade=cascade, sae=sae, aggregate=how,
                      alpha=alpha, window=window, skip=skip)

    def peaks(idx: Sequence[Any], n: int) -> np.ndarray:  # each prompt's highest aggregated logit at order n
        return torch.stack([monitor._aggregated(_Fixed(head, n), per[i])[1].max() for i in idx]).double().numpy()

    y_plain = y_all[plain_va]
    per_order = [classification_metrics(y_plain, peaks(plain_va, n)) for n in range(1, head.degree + 1)]
    worst = [worst_group(y_all[va_rows], peaks(va_rows, n), g_va) for n in range(1, head.degree + 1)]
    monitor.report.update({
        "validation": {"n": len(plain_va), "per_order": per_order, "decision": "max over tokens of the aggregate"},
        "worst_validation_group": {"groups": sorted(set(g_va.tolist())), "per_order": worst},
        "n_train": n_plain_tr, "n_train_tokens": int(len(y_tr_t)), "recipe": recipe,
        "augment": {"families": list(families), "n_train_rewrites": n_aug[0], "n_val_rewrites": n_aug[1]}})
    benign = [per[i] for i in va_rows if y_all[i] == 0]
    if hosted:
        h, acts, (_, _, ends) = hosted["val"]
        val_peaks = lambda n: torch.stack([monitor._aggregated(_Fixed(head, n), a[:end])[1].max()
                                           for a, end in zip(acts, ends)]).double().numpy()
        monitor.report["contexts"] = {
            "n_train": len(hosted["train"][0].sequences), "n_val": len(h.sequences), "lengths": list(contexts[1]),
            "n_train_tokens": int(len(hosted["train"][2][1])),
            "per_order": [classification_metrics(h.labels, val_peaks(n)) for n in range(1, head.degree + 1)],
            "decision": "max over the chat of the aggregate (after a harmful request: to its turn's end)"}
        benign += [a for a, c in zip(acts, h.labels) if c == 0]  # whole benign chats: the threshold holds on them
    if target_fpr is not None:
        monitor.calibrate_activations(benign, target_fpr)
    return monitor


def _check_contexts(tokenizer: Any, contexts: Any, lengths: Any, chat_template: bool,
                    prompts: Sequence[str]) -> tuple[list[list[dict[str, str]]], tuple[int, ...]]:
    """``train_monitor``'s ``contexts`` (conversations, or a number of ShareGPT contexts) and
    ``context_tokens``, checked."""
    from ._context import check_conversation, context_budget, sharegpt_contexts

    lengths = (lengths,) if isinstance(lengths, int) and not isinstance(lengths, bool) else tuple(lengths)
    if not lengths or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in lengths):
        raise TPCHooksError(f"context_tokens must be a positive integer or a list of them; got {lengths!r}")
    if not chat_template:
        raise TPCHooksError("contexts= places prompts in chat conversations; it needs chat_template=True "
                            "(a tokenizer with a chat template)")
    if isinstance(contexts, int) and not isinstance(contexts, bool):
        if contexts < 4:
            raise TPCHooksError(f"contexts must be at least 4 (2 held out for validation); got {contexts}")
        return sharegpt_contexts(tokenizer, contexts, tokens=context_budget(lengths), exclude=prompts), lengths
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, Sequence):
        raise TPCHooksError("contexts must be a list of conversations ([{'role', 'content'}] turns) or a number of "
                            f"ShareGPT contexts; got {type(contexts).__name__}")
    convs = [check_conversation(c) for c in contexts]
    if len(convs) < 4 or any(not c for c in convs):
        raise TPCHooksError(f"contexts needs at least 4 non-empty conversations (2 are held out); got {len(convs)}"
                            + (" (one is empty)" if any(not c for c in convs) else ""))
    return convs, lengths

