"""What every adapter provides, and how one is chosen for a model."""

import importlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError
from ._batching import positions, resolve_bos
from ._hf import decoder_layers, find_layers, model_lock
from ._hf_loop import hf_decode
from ._parts import StreamParts, hf_parts
from ._sites import KINDS, Site, hook_name, parse_site

# model class (module prefix, class name) -> adapter module; matched on the type's MRO, so
# nothing is imported to decide.
_ADAPTERS = (
    ("transformer_lens", "HookedTransformer", "transformer_lens"),
    ("transformer_lens", "TransformerBridge", "transformer_lens"),
    ("nnsight", "LanguageModel", "nnsight"),
    ("nnsight", "TransformersModel", "nnsight"),
    ("transformers", "PreTrainedModel", "transformers"),
    ("vllm", "LLM", "vllm"),
)

# what each toolkit's users change to wrap a model with another tokenizer
_TOKENIZER_FIX = {
    "nnsight": "LanguageModel(hf_model, tokenizer=tok)",
    "TransformerLens": "HookedTransformer.from_pretrained(..., tokenizer=tok) or "
    "TransformerBridge.boot_transformers(..., tokenizer=tok)",
}


class Adapter:
    """Base class: tokenisation, site checking and the interface toolkit adapters implement.

    Subclasses set ``kinds`` (the residual sites their toolkit exposes) and implement
    :meth:`forward_sites` and :meth:`decode`.
    """

    kinds: tuple[str, ...] = KINDS
    toolkit: str = ""
    engine = False  # a serving engine that runs its own decode loop (``generate`` instead of ``decode``)

    def __init__(self, model: Any):
        self.model = model

    # ------------------------------------------------------------------ facts
    @property
    def d_model(self) -> int:
        raise NotImplementedError

    @property
    def n_layers(self) -> int:
        raise NotImplementedError

    @property
    def tokenizer(self) -> Any:
        raise NotImplementedError

    @property
    def model_name(self) -> str:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live (CPU for a model without any)."""
        try:
            return next(self.model.parameters()).device
        except StopIteration:
            return torch.device("cpu")

    def site_names(self) -> list[str]:
        """Every valid site of this model, shallowest first."""
        return [Site(layer, k).name for layer in range(self.n_layers) for k in KINDS if k in self.kinds]

    def site(self, name: str) -> Site:
        """Parses and checks a site against this model; the error lists what is valid."""
        try:
            s = parse_site(name)
        except TPCHooksError:
            s = None
        if s is None or s.layer >= self.n_layers or s.kind not in self.kinds:
            valid = self.site_names()
            shown = ", ".join(valid[:3] + ["...", valid[-1]]) if len(valid) > 4 else ", ".join(valid)
            why = (
                ""
                if s is None
                else (
                    f" (the model has {self.n_layers} layers: 0..{self.n_layers - 1})"
                    if s.layer >= self.n_layers
                    else f" ({self.toolkit} exposes {', '.join(hook_name(k) for k in KINDS if k in self.kinds)} here)"
                )
            )
            raise TPCHooksError(f"site {name!r} is not valid for this {self.toolkit} model{why}; valid sites: {shown}")
        return s

    # ------------------------------------------------------------------ tokens
    def tokenize(
        self, prompts: list[str], *, chat_template: bool, max_tokens: int | None, prepend_bos: bool | None = None
    ) -> tuple[list[list[int]], int]:
        """Tokenises with the model's Hugging Face tokenizer, the same way in every adapter.

        Toolkits change tokenizer defaults (TransformerLens turns on ``add_bos_token``), so
        special tokens are never left to the tokenizer: texts are encoded with
        ``add_special_tokens=False`` and the BOS token is prepended when ``prepend_bos``
        (see :func:`resolve_bos`). With ``chat_template`` each prompt is the user turn of the
        tokenizer's chat template plus the generation prompt, and the template supplies its
        own special tokens.

        Returns ``(token id lists, n_truncated)``.
        """
        texts, bos = self._texts(prompts, chat_template, prepend_bos)
        ids = [self._encode(t, bos) for t in texts]
        n_trunc = 0
        if max_tokens is not None:
            n_trunc = sum(len(i) > max_tokens for i in ids)
            ids = [i[:max_tokens] for i in ids]
        if any(len(i) == 0 for i in ids):
            raise TPCHooksError("a prompt tokenises to zero tokens; remove empty prompts")
        return ids, n_trunc

    def _texts(self, prompts: list[str], chat_template: bool, prepend_bos: bool | None) -> tuple[list[str], int | None]:
        """The texts :meth:`tokenize` encodes (chat-template wrapped or raw) and the BOS id it prepends."""
        tok = self.tokenizer
        if chat_template:
            if not getattr(tok, "chat_template", None):
                raise TPCHooksError(
                    "chat_template=True but this tokenizer has no chat template; pass chat_template=False"
                )
            return [
                tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                for p in prompts
            ], None
        return list(prompts), tok.bos_token_id if resolve_bos(tok, prepend_bos, chat_template) else None

    def _encode(self, text: str, bos: int | None) -> list[int]:
        return ([bos] if bos is not None else []) + list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def fixed_prefix(self, *, chat_template: bool, prepend_bos: bool | None = None) -> int:
        """How many leading tokens every prompt starts with whatever its text, as :meth:`tokenize`
        wraps it: BOS, and with ``chat_template`` the template's system prompt and user header.

        Two one-character prompts are wrapped; the text they share before the prompt is
        encoded, and the count is the tokens that encoding and both prompts' encodings start
        with (so a tokenizer that merges the header's last characters into the prompt's first
        token, or maps both prompts to the same unknown token, gives a shorter prefix, never a
        longer one).

        Example:
            >>> adapter.fixed_prefix(chat_template=True)  # doctest: +SKIP
            24
        """
        (ta, tb), bos = self._texts(["A", "7"], chat_template, prepend_bos)
        shared = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb)))
        seqs = [self._encode(ta[:shared], bos), self._encode(ta, bos), self._encode(tb, bos)]
        return next((i for i, col in enumerate(zip(*seqs, strict=False)) if len(set(col)) > 1), min(map(len, seqs)))

    # ------------------------------------------------------------------ model
    def forward_sites(self, input_ids: Tensor, attention_mask: Tensor, sites: list[Site]) -> dict[str, Tensor]:
        """Per-token activations ``[batch, pos, d_model]`` at ``sites`` from one forward pass
        that stops after the deepest layer needed."""
        raise NotImplementedError

    @contextmanager
    def observe(self, site: Site, fn: Callable[[Tensor, Tensor, bool], None]) -> Iterator[None]:
        """Calls ``fn(acts [B, T, D], new_mask [B, T], fresh)`` after every forward pass the
        model makes inside the block, whoever starts it; hooks are removed on exit."""
        raise NotImplementedError
        yield  # pragma: no cover

    @contextmanager
    def observe_sites(
        self, sites: Sequence[Site], fn: Callable[[dict[str, Tensor], Tensor, bool], None]
    ) -> Iterator[None]:
        """:meth:`observe` for several sites at once: ``fn(acts {site name: [B, T, D]}, new_mask,
        fresh)`` once per forward pass, when the deepest of ``sites`` has been computed (each
        site read once, however many readers it has); hooks are removed on exit."""
        order = sorted(set(sites), key=lambda s: s.depth)
        if not order:
            raise TPCHooksError("observe_sites needs at least one site")
        got: dict[str, Tensor] = {}

        def reader(site: Site, deepest: bool) -> Callable[[Tensor, Tensor, bool], None]:
            def read(acts: Tensor, mask: Tensor, fresh: bool) -> None:
                got[site.name] = acts
                if deepest:  # the pass has reached every site: hand them over, start the next pass afresh
                    seen = dict(got)
                    got.clear()
                    fn(seen, mask, fresh)

            return read

        with ExitStack() as stack:
            for i, site in enumerate(order):
                stack.enter_context(self.observe(site, reader(site, i == len(order) - 1)))
            yield

    def forward_parts(
        self, input_ids: Tensor, attention_mask: Tensor, site: Site, *, heads: bool = False
    ) -> StreamParts:
        """What each part of the model (the embedding, every block's attention or its heads, and MLP)
        wrote into the residual stream up to ``site``, from one forward pass that stops once the site
        is read (:class:`~tpc_hooks.activations._parts.StreamParts`: their contributions to any linear
        form of the site's activations, summing to its own).

        This default reads the underlying Hugging Face model's decoder layers with plain PyTorch hooks
        (:func:`~tpc_hooks.activations._parts.hf_parts`); a toolkit without one overrides it.
        """
        hf = self.hf_model()
        if hf is None:
            raise NotImplementedError(f"{type(self).__name__} reads no model parts")
        ids, mask = input_ids.to(self.device), attention_mask.to(self.device)
        return hf_parts(
            lambda: hf(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False),
            decoder_layers(hf, find_layers(hf, self.toolkit)),
            site,
            heads=heads,
            config=hf.config,
            model_name=self.model_name,
        )

    def hf_model(self) -> Any:
        """The underlying Hugging Face model, when there is one (None for HookedTransformer)."""
        return None

    def exclusive(self) -> Any:
        """The lock around a pass tpc-hooks drives through this model (one per underlying model,
        shared by every adapter of it; re-entrant). See :func:`~tpc_hooks.activations._hf.model_lock`."""
        hf = self.hf_model() if self.toolkit != "TransformerLens" else None
        return model_lock(hf if hf is not None else self.model)

    def answer(self, ids: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """A serving engine's greedy answers to tokenised prompts, each up to and including its EOS
        (``engine`` adapters only: the others answer through :meth:`decode`)."""
        raise NotImplementedError(f"{type(self).__name__} answers through decode()")

    @torch.no_grad()
    def decode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        site: Site | Sequence[Site] | None,
        max_new_tokens: int,
        on_step: Any,
    ) -> None:
        """Runs the prompt, then one token per forward pass with the model's KV cache.

        After every forward pass ``on_step(acts [B, t, D], mask [B, t], last_logits [B, V])``
        returns ``(next_tokens [B], live [B] bool)`` to feed one more step, or None to end.
        ``site=None`` attaches no hook and passes ``acts=None`` (the unmonitored baseline); a
        list of sites passes ``acts`` as ``{site name: [B, t, D]}``, each site read once.
        Hooks are removed however the loop ends.

        This default drives the underlying Hugging Face model directly, as its own ``generate``
        does (Hugging Face cache, positions from the mask, only the last position through the
        LM head, no mask at all when a host ``attention_mask`` has no padding), and reads the
        site through :meth:`observe`. The last pass (the token after ``max_new_tokens``, fed
        only to be scored) stops at the (deepest) site's layer, or is not run when there is no site: its
        ``last_logits`` are the pass before's, and ``on_step`` must return None for it.
        """
        hf = self.hf_model()
        if hf is None:
            raise NotImplementedError
        hf_decode(self, hf, input_ids, attention_mask, site, max_new_tokens, on_step)


def get_adapter(model: Any, *, remote: bool = False, tokenizer: Any = None) -> Adapter:
    """Picks the adapter for ``model`` from its type (TransformerLens, nnsight or plain transformers).

    Args:
        model: a TransformerLens ``HookedTransformer``/``TransformerBridge``, an nnsight
            ``LanguageModel``/``TransformersModel``, a Hugging Face ``transformers`` causal LM
            (``AutoModelForCausalLM``), or an :class:`Adapter` (returned as is).
        remote: run nnsight traces on NDIF (nnsight models only).
        tokenizer: the Hugging Face tokenizer, for a ``transformers`` model (which carries none;
            default: ``AutoTokenizer.from_pretrained(model.name_or_path)``, loaded when first
            needed). A toolkit model tokenises with its own tokenizer: passing one that differs
            from it (another vocabulary, special tokens or chat template) is an error, not an
            override, so a monitor never reads a model through a tokenizer it was not given.

    Raises:
        TPCHooksError: for a model of no supported toolkit, ``remote`` on a non-nnsight model, or
            a ``tokenizer`` that disagrees with the toolkit model's own.

    Example:
        >>> get_adapter(object())  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        tpc_hooks.TPCHooksError: no adapter for builtins.object; pass a TransformerLens HookedTransformer or
        TransformerBridge, an nnsight LanguageModel, or a transformers PreTrainedModel (AutoModelForCausalLM)
    """
    if isinstance(model, Adapter):
        adapter = model
    else:
        for cls in type(model).__mro__:
            match = next(
                (m for prefix, name, m in _ADAPTERS if cls.__name__ == name and cls.__module__.split(".")[0] == prefix),
                None,
            )
            if match is not None:
                break
        else:
            raise TPCHooksError(
                f"no adapter for {type(model).__module__}.{type(model).__name__}; pass a TransformerLens "
                "HookedTransformer or TransformerBridge, an nnsight LanguageModel, or a transformers PreTrainedModel "
                "(AutoModelForCausalLM)"
            )
        mod = importlib.import_module(f"tpc_hooks.adapters.{match}")  # a plugin, found by name
        if match == "nnsight":
            adapter = mod.make_adapter(model, remote=remote)
        elif remote:
            kind = "a transformers" if match == "transformers" else "a TransformerLens"
            raise TPCHooksError(
                f"remote=True runs on NDIF through nnsight; this is {kind} model "
                "(wrap it: nnsight.LanguageModel(model, tokenizer=tok))"
            )
        elif match == "transformers":
            return mod.make_adapter(model, tokenizer=tokenizer)
        else:
            adapter = mod.make_adapter(model)
    if tokenizer is not None and not same_tokenizer(tokenizer, adapter.tokenizer):
        fix = _TOKENIZER_FIX.get(adapter.toolkit, "the tokenizer the model was built with")
        raise TPCHooksError(
            f"tokenizer= differs from the one this {adapter.toolkit} model carries (vocabulary, special tokens or chat "
            f"template); tpc-hooks tokenises with the model's own tokenizer, so drop tokenizer= or wrap the model with "
            f"the one you mean: {fix}"
        )
    return adapter


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two Hugging Face tokenizers tokenise alike for tpc-hooks: the same object, or the
    same vocabulary, BOS/EOS/pad ids and chat template (toolkits may reload the tokenizer they
    are given, e.g. TransformerLens with ``add_bos_token``, which tpc-hooks never relies on)."""
    if a is b:
        return True
    try:
        if any(
            getattr(a, k, None) != getattr(b, k, None)
            for k in ("bos_token_id", "eos_token_id", "pad_token_id", "chat_template")
        ):
            return False
        return a.get_vocab() == b.get_vocab()
    except (AttributeError, TypeError, NotImplementedError):
        return False
