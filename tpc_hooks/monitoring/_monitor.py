"""A monitor: a TPC head bound to a hook point, a pooling and a decision policy. It scores prompts
offline and explains its scores, is calibrated (``_calibrate``), scores while a model generates from the
model's own forward passes (``_monitor_generation``: its own decode loop, ``watch``, and Hugging Face
``generate``'s stopping criterion and logits processor), and saves to the same directory format as a head
(``_monitor_saving``; never unpickled).
"""

import os
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError
from ..activations import Adapter, get_adapter, pad, pad_id, pooled_batches, token_batches
from ..data import check_prompts
from ..head import (
    TPC,
    Cascade,
    CascadeResult,
    FixedOrder,
    Policy,
    prefix_result,
    stack_results,
    to_saved,
)
from ..pooling import aggregate as aggregate_logits
from ..pooling import pool_prefixes, scored
from ..sae import check_sae, describe_sae, sae_dims, sae_encode
from ..sae import sae_identity as sae_identity_of
from ..saving import (
    CONFIG_FILE,
    HubMixin,
    files_of,
    monitor_card,
    read_dir,
    read_files,
    write_dir,
)
from . import _generation
from ._answers import conversation_ids, read_ids
from ._calibrate import CalibrationMethods
from ._explain import Explanation, explain
from ._monitor_config import ACTIONS, MonitorConfig
from ._monitor_generation import GenerationMethods
from ._monitor_saving import read_saved, saved_config
from ._records import GenerationRun, LastRun, TokenScores
from ._settings import Setting


class Monitor(GenerationMethods, CalibrationMethods, HubMixin, LastRun):
    """A trained TPC head + the settings it reads and decides with (:class:`~tpc_hooks.MonitorConfig`:
    site, pooling, tokenisation, aggregation, threshold) + a decision policy.

    Args:
        head: the :class:`~tpc_hooks.TPC`.
        site: TransformerLens hook name it reads (``blocks.L.hook_resid_post``); or pass ``config``.
        config: a :class:`~tpc_hooks.MonitorConfig` (default: built from ``site`` and ``settings``).
        cascade: the default policy (a :class:`~tpc_hooks.Cascade` on ``head``: thresholds +
            per-order calibration), or None to score with the full polynomial.
        report: what training measured (validation metrics per order, the operating point, ...).
        sae: an SAELens SAE when the head reads SAE latents (``head.d_model == d_sae``): the
            site's activations are encoded per token before pooling. Its identity (sizes,
            recorded release/id/hook, weights hash) is saved, and a different SAE is refused.
        sae_identity: the identity recorded with a saved monitor (checked against ``sae``).
        **settings: any field of :class:`~tpc_hooks.MonitorConfig` (``pooling``,
            ``chat_template``, ``prepend_bos``, ``max_tokens``, ``model_name``, ``threshold``,
            ``aggregate``, ``alpha``, ``window``, ``skip``, ``reads``, ``top_k``); with ``config``, they
            override it.

    Every setting reads as an attribute (``monitor.site``, ``monitor.threshold``, ...); assigning
    one replaces :attr:`config` and is validated (``monitor.threshold = float("nan")`` is an
    error, not a monitor that never flags).

    Attributes:
        last_run: the :class:`~tpc_hooks.GenerationRun` of the latest Hugging Face ``generate``
            call served by one of its :meth:`stopping_criteria` or :meth:`logits_processor` (None
            before any; not saved). ``last_generate_log``: its deprecated name.

    Example:
        >>> import tpc_hooks as tpc
        >>> mon = tpc.Monitor(tpc.TPC(8, 2, 2), "blocks.1.hook_resid_post", pooling="max")
        >>> mon.pooling, mon.config.threshold
        ('max', 0.5)
    """

    site: Setting[str] = Setting()
    pooling: Setting[str] = Setting()
    chat_template: Setting[bool] = Setting()
    prepend_bos: Setting[bool | None] = Setting()
    max_tokens: Setting[int | None] = Setting()
    model_name: Setting[str | None] = Setting()
    threshold: Setting[float] = Setting()
    aggregate: Setting[str] = Setting()
    alpha: Setting[float] = Setting()
    window: Setting[int] = Setting()
    skip: Setting[int] = Setting()
    reads: Setting[str] = Setting()
    top_k: Setting[int] = Setting()

    def __init__(
        self,
        head: TPC,
        site: str | None = None,
        *,
        config: MonitorConfig | None = None,
        cascade: Cascade | None = None,
        report: dict[str, Any] | None = None,
        sae: Any = None,
        sae_identity: dict[str, Any] | None = None,
        **settings: Any,
    ):
        unknown = sorted(set(settings) - {f.name for f in fields(MonitorConfig)})
        if unknown:
            raise TPCHooksError(
                f"Monitor got unknown settings {unknown}; the settings are MonitorConfig's fields: "
                f"{[f.name for f in fields(MonitorConfig)]}"
            )
        if site is not None:
            settings["site"] = site
        if config is None:
            if "site" not in settings:
                raise TPCHooksError(
                    "Monitor needs site= (the hook name it reads, e.g. 'blocks.6.hook_resid_post') or config="
                )
            config = MonitorConfig(**settings)
        elif not isinstance(config, MonitorConfig):
            raise TPCHooksError(f"config must be a tpc_hooks.MonitorConfig; got {type(config).__name__}")
        elif settings:
            config = replace(config, **settings)
        self._cascade: Cascade | None = None
        self.head, self.cascade, self.config = head, cascade, config
        self.report: dict[str, Any] = {} if report is None else report
        self.sae, self.sae_identity = sae, sae_identity
        self.last_run: GenerationRun | None = None
        if self.sae is not None:
            ident = sae_identity_of(self.sae)
            if self.sae_identity is not None and self.sae_identity.get("weights_sha256") != ident["weights_sha256"]:
                raise TPCHooksError(
                    f"this monitor was trained on SAE latents of {describe_sae(self.sae_identity)}, and the SAE given "
                    f"differs ({describe_sae(ident)}); pass the SAE it was trained with"
                )
            if sae_dims(self.sae)[1] != self.head.d_model:
                raise TPCHooksError(
                    f"the SAE has d_sae={sae_dims(self.sae)[1]} but the head reads {self.head.d_model} features"
                )
            self.sae_identity = ident
        elif self.sae_identity is not None:
            raise TPCHooksError(
                f"this monitor reads SAE latents of {describe_sae(self.sae_identity)}; pass sae= "
                "(Monitor.from_pretrained(path, sae=...))"
            )

    @property
    def head(self) -> TPC:
        """The :class:`~tpc_hooks.TPC`. Assigning another is checked: a cascade on the old head must
        go first (``monitor.cascade = None``, or a :class:`~tpc_hooks.Cascade` on the new head)."""
        return self._head

    @head.setter
    def head(self, head: Any) -> None:
        if not isinstance(head, TPC):
            raise TPCHooksError(f"Monitor needs a tpc_hooks.TPC head; got {type(head).__name__}")
        if self._cascade is not None and self._cascade.head is not head:
            raise TPCHooksError(
                "this monitor's cascade wraps the old head and would go on scoring with it; set "
                "monitor.cascade = None (or a Cascade on the new head: tpc.Cascade(head, tau)) first, "
                "then assign the head"
            )
        self._head = head

    @property
    def cascade(self) -> Cascade | None:
        """The default policy: a :class:`~tpc_hooks.Cascade` on :attr:`head`, or None (the full
        polynomial). Assigning one on another head is refused."""
        return self._cascade

    @cascade.setter
    def cascade(self, cascade: Any) -> None:
        if cascade is not None and (not isinstance(cascade, Cascade) or cascade.head is not self._head):
            raise TPCHooksError(
                "the monitor's cascade must wrap the monitor's own head: tpc.Cascade(monitor.head, tau)"
                if isinstance(cascade, Cascade)
                else f"cascade must be a tpc_hooks.Cascade or None; got {type(cascade).__name__}"
            )
        self._cascade = cascade

    def __repr__(self) -> str:
        policy = (
            "full polynomial" if self.cascade is None else f"cascade({self.cascade.lower:g}, {self.cascade.upper:g})"
        )
        return (
            f"Monitor({self.site!r}, pooling={self.pooling!r}{', reads=' + repr(self.reads) if self.answers else ''}, "
            f"d_model={self.head.d_model}, degree={self.head.degree}, "
            f"threshold={self.threshold:.6g}, policy={policy})"
        )

    @property
    def streaming(self) -> bool:
        """Whether this is a per-token monitor (``pooling="token"``)."""
        return self.pooling == "token"

    @property
    def answers(self) -> bool:
        """Whether this is a response monitor (``reads="answer"``): it pools the answer only and
        never flags the prompt alone."""
        return self.reads == "answer"

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
    def policy(self, order: int | None = None, cascade: float | Cascade | None = None) -> Policy:
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
        return FixedOrder(self.head, order)

    def _members(self, action: Any) -> list[tuple[str, "Monitor", Any]]:
        """What a monitored loop runs: this monitor alone, under the name ``""`` (a
        :class:`~tpc_hooks.MonitorSet` gives one entry per member)."""
        if not (action in ACTIONS or callable(action)):
            raise TPCHooksError(f"action must be 'flag', 'stop' or a callable; got {action!r}")
        return [("", self, action)]

    def _result(self, runs: dict[str, Any]) -> Any:
        """What a monitored loop returns from its runs by name: this monitor's own."""
        return runs[""]

    def _step_policy(
        self, order: int | None = None, cascade: float | Cascade | None = None
    ) -> Callable[[Tensor], CascadeResult]:
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
    def score(
        self,
        model: Any,
        prompts: Sequence[str] | None = None,
        *,
        responses: Sequence[str] | None = None,
        tokens: Sequence[Sequence[int]] | None = None,
        answer_starts: Sequence[int] | None = None,
        order: int | None = None,
        cascade: float | Cascade | None = None,
        batch_size: int = 8,
        tokenizer: Any = None,
    ) -> CascadeResult:
        """Scores prompts, or conversations (a prompt and its answer), or already tokenised
        sequences offline.

        A response monitor (``reads="answer"``) scores conversations: ``responses`` (one per
        prompt), or ``tokens`` with ``answer_starts`` (e.g. ``run.sequences`` and
        ``run.prompt_lengths`` of a generation: its own ids, which retokenising the text can split
        otherwise). It pools the answer's tokens only: the score of a generation's last step. A
        prompt monitor given ``responses`` scores the whole conversation, as generation does.

        Args:
            model: the model to read (its d_model and site must match).
            prompts: texts, tokenised as the monitor was trained (chat template, truncation).
            responses: an answer per prompt (encoded with no special token after the prompt's ids,
                the assistant's turn opened by the chat template); a conversation past
                ``max_tokens`` keeps the answer's tokens that fit, with a warning.
            tokens: token id lists instead of texts (e.g. ``run.sequences[b][:n]``).
            answer_starts: with ``tokens``, for a response monitor: where each answer starts.
            order, cascade: a fixed truncation, or a cascade threshold / :class:`~tpc_hooks.Cascade`
                (see :meth:`policy`).
            tokenizer: the tokenizer of a ``transformers`` model (default: loaded from its
                ``name_or_path``); toolkit models use their own.

        Returns:
            A :class:`~tpc_hooks.CascadeResult`: ``logits``, ``probs``, ``exit_order``, ``flops``;
            ``flagged`` at the monitor's :attr:`threshold`.
        """
        adapter = self._adapter(model, tokenizer)
        ids, starts = read_ids(self, adapter, prompts, responses, tokens, answer_starts)
        site, rule = adapter.site(self.site), self.policy(order, cascade)
        if self.streaming:  # the aggregate after each prompt's last token
            res = stack_results(
                [prefix_result(r, agg, -1) for r, agg in self._token_pass(adapter, ids, site, rule, batch_size)]
            )
        else:
            pooled = pooled_batches(adapter, ids, [site], self.pooling, batch_size, sae=self.sae, starts=starts)
            res = rule(pooled[site.name])
        return replace(res, threshold=self.threshold)

    def explain(
        self,
        model: Any,
        prompts: Sequence[str] | None = None,
        *,
        responses: Sequence[str] | None = None,
        tokens: Sequence[Sequence[int]] | None = None,
        answer_starts: Sequence[int] | None = None,
        heads: bool = False,
        order: int | None = None,
        cascade: float | Cascade | None = None,
        batch_size: int = 8,
        tokenizer: Any = None,
        progress: bool = False,
    ) -> Explanation:
        """Why the monitor scores what it scores: each row's logit split exactly over the tokens it read
        and over the parts of the model that wrote them (the embedding, each block's attention or each
        of its heads, and each MLP), from one forward pass per batch.

        The logit's Euler split (each order's term is its gradient over its degree dotted with the
        input) holds along any sum that makes the pooled vector: positions (mean, max, last pooling) and
        model parts (what each block adds to the residual stream up to :attr:`site`); a per-token monitor
        weighs each token's own split as its aggregate does. ``baseline + by_token[b].sum() == baseline +
        by_component[b].sum() == logit[b]``. Reads prompts, conversations and token ids as :meth:`score`
        does; every local adapter (TransformerLens ``HookedTransformer`` and ``TransformerBridge``, nnsight,
        plain transformers), not a vLLM engine (load the checkpoint locally).

        Args:
            heads: split each attention layer by head (``"blocks.{l}.attn.{h}"``, its output bias apart),
                where a head reaches the stream through a map that is linear given the pass (its
                normalisation's scale held fixed; an error otherwise).
            order, cascade: the scoring policy, as in :meth:`score` (default: the monitor's own).
            progress: a progress bar over the prompts.
            prompts, responses, tokens, answer_starts, batch_size, tokenizer: as in :meth:`score`.

        Returns:
            An :class:`~tpc_hooks.Explanation` (``.top_tokens(b)``, ``.top_components(b)``, ``.to_html(b)``,
            ``.plot(b)``, ``.to_dataframe()``; ``.attribution``: the same rows by order, neuron and pair).

        Example:
            >>> ex = monitor.explain(model, ["How do I kill a Python process that hangs?"])  # doctest: +SKIP
            >>> ex.top_tokens(0, k=2), ex.top_components(0, k=2)  # doctest: +SKIP
            >>> ex.to_html(0)  # doctest: +SKIP
        """
        return explain(
            self,
            model,
            prompts,
            responses=responses,
            tokens=tokens,
            answer_starts=answer_starts,
            heads=heads,
            order=order,
            cascade=cascade,
            batch_size=batch_size,
            tokenizer=tokenizer,
            progress=progress,
        )

    def _reading(self) -> dict[str, Any]:
        """How this monitor tokenises what it reads (the settings :meth:`Adapter.tokenize` takes)."""
        return {"chat_template": self.chat_template, "max_tokens": self.max_tokens, "prepend_bos": self.prepend_bos}

    def _token_pass(
        self,
        adapter: Adapter,
        ids: list[list[int]],
        site: Any,
        rule: Callable[[Tensor], CascadeResult],
        batch_size: int,
    ) -> list[tuple[CascadeResult, Tensor]]:
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
        return res, aggregate_logits(
            res.logits[None], ones, self.aggregate, self.alpha, self.window, self.skip, self.top_k
        )[0]

    def _token_acts(self, adapter: Adapter, ids: list[list[int]], site: Any, batch_size: int) -> list[Tensor]:
        """Each sequence's per-token features ``[T, d]`` (SAE latents with an SAE), batched by
        length, one forward pass per batch."""
        return token_batches(adapter, ids, [site], batch_size, sae=self.sae, to_host=False)[site.name]

    @torch.no_grad()
    def token_scores(
        self,
        model: Any,
        prompt: str,
        *,
        response: str | None = None,
        order: int | None = None,
        cascade: float | Cascade | None = None,
        tokenizer: Any = None,
    ) -> "TokenScores":
        """The monitor's score of every prefix of one prompt (or of one conversation: ``response``,
        the answer to it), from a single forward pass.

        Returns ``(token strings, result)`` (a :class:`TokenScores`, which also renders with
        ``.to_html()``); ``result.probs[t]`` scores the first ``t + 1`` tokens (a per-token
        monitor: the aggregate after token ``t``). A response monitor needs ``response``: the
        prompt's tokens score 0 (unscored) and token ``t`` of the answer scores its first ``t + 1``
        tokens pooled, the step ``t + 1`` of a generation. Hand it to
        :func:`tpc_hooks.views.colored_tokens` for circuitsvis. ``tokenizer``: as in :meth:`score`.
        """
        adapter = self._adapter(model, tokenizer)
        site = adapter.site(self.site)
        if response is None and self.answers:
            raise TPCHooksError('this is a response monitor (reads="answer"): pass response=, the answer to score')
        if response is None:
            (ids,), _ = adapter.tokenize(
                check_prompts([prompt]),
                chat_template=self.chat_template,
                max_tokens=self.max_tokens,
                prepend_bos=self.prepend_bos,
            )
            start = 0
        else:
            (ids,), (start,) = conversation_ids(adapter, [prompt], [response], **self._reading(), what="token_scores")
        tokens = [adapter.tokenizer.decode([t]) for t in ids]
        if self.streaming:  # every token scored, the aggregate after each
            res, agg = self._token_pass(adapter, [ids], site, self.policy(order, cascade), 1)[0]
            return TokenScores(
                tokens,
                CascadeResult(
                    logits=agg,
                    probs=torch.sigmoid(agg),
                    exit_order=res.exit_order,
                    flops=res.flops.cumsum(0),
                    degree=res.degree,
                    decision_logits=agg,
                ),
                self.threshold,
                min(self.skip, len(tokens)),
            )
        x, mask = pad([ids], pad_id(adapter.tokenizer), "right")
        with adapter.exclusive():
            acts = adapter.forward_sites(x, mask, [site])[site.name][0].float()  # [T, D]
        acts = self._features(acts)
        if not self.answers:
            prefixes = pool_prefixes(acts, self.pooling)  # the monitor's pooling of every prefix
            return TokenScores(tokens, self.policy(order, cascade)(prefixes), self.threshold)
        prefixes = torch.cat([acts.new_zeros(start, acts.shape[1]), pool_prefixes(acts[start:], self.pooling)])
        empty = torch.arange(len(ids), device=acts.device) < start  # the prompt: no answer token pooled yet
        res = _generation.unscored(self.policy(order, cascade)(prefixes), empty)
        return TokenScores(tokens, res, self.threshold, start)

    # ------------------------------------------------------------ the saved form
    _hub_commit_message = "Upload tpc-hooks monitor"

    def _config(self) -> dict[str, Any]:
        return saved_config(self)

    def _save_dir(self, path: str | os.PathLike) -> Path:
        """Writes head and policy to a directory (``config.json`` + ``model.safetensors``);
        :meth:`save_pretrained` adds the model card."""
        return write_dir(path, self._config(), to_saved(self.head)[1])

    def model_card(self, *, repo_id: str | None = None) -> str:
        """The model card :meth:`save_pretrained` writes (``README.md``): model, site, pooling,
        threshold, cascade, the head, and the training data and metrics ``report`` records.
        ``save_pretrained``, ``from_pretrained`` (``sae=`` for a monitor on SAE latents) and
        ``push_to_hub`` come from :class:`~tpc_hooks.saving._hub.HubMixin`."""
        return monitor_card(self, repo_id=repo_id)

    @classmethod
    def _load_dir(cls, path: str | os.PathLike, *, sae: Any = None) -> Any:
        """Loads a monitor saved by :meth:`save_pretrained` (strict; never unpickles).

        A monitor trained on SAE latents needs its SAE again (``sae=``); a different one is refused.
        """
        return cls._from_saved(*read_dir(path), Path(path) / CONFIG_FILE, sae=sae)

    @classmethod
    def _from_saved(cls, cfg: dict[str, Any], tensors: dict[str, Any], where: Path, *, sae: Any = None) -> Any:
        """A monitor from its saved config and tensors (``where``: the config file errors name)."""
        head, kw = read_saved(cfg, tensors, where)
        try:
            return cls(head, sae=sae, **kw)
        except (TypeError, ValueError) as err:  # TPCHooksError is a ValueError
            raise TPCHooksError(f"{where}: {err}") from None


def saved_files(monitor: Monitor) -> tuple[bytes, bytes]:
    """The bytes of the monitor's ``config.json`` and ``model.safetensors``, as ``save_pretrained``
    writes them, without touching the disk."""
    return files_of(monitor._config(), to_saved(monitor.head)[1])


def from_files(text: bytes, data: bytes, where: str | os.PathLike) -> Monitor:
    """The monitor saved as these bytes of ``config.json`` and ``model.safetensors`` (``where``: the
    directory errors name), checked as ``from_pretrained`` checks a directory."""
    return Monitor._from_saved(*read_files(text, data, where), Path(where) / CONFIG_FILE)
