"""Plain ``transformers`` adapter: a Hugging Face causal LM (``AutoModelForCausalLM``) as it is.

Site names and the decoder layers are those of the nnsight adapter (one rule for both, which
finds the layer list from the model itself, a multimodal checkpoint's language model included;
:data:`LAYERS` holds its exceptions): the input of decoder layer L is
``blocks.L.hook_resid_pre``, its output ``blocks.L.hook_resid_post``, and ``hook_attn_out``,
``hook_resid_mid``, ``hook_mlp_out`` are read at the layer's attention, norm and MLP modules
where a check on the model finds they add up (``resid_pre + attn_out = resid_mid``,
``resid_mid + mlp_out = resid_post``). Collection runs the model's own forward with PyTorch forward
hooks on the decoder layers and stops it after the deepest site needed; generation, ``watch``
and the :meth:`~tpc_hooks.Monitor.stopping_criteria` read the same hooks during the model's
own forward passes (KV cache on).

A Hugging Face model carries no tokenizer: pass ``tokenizer=``, or it is loaded once per model
with ``AutoTokenizer.from_pretrained(model.name_or_path)`` (a local folder, or a hub id when the
network is there).

Example:
    >>> import tpc_hooks as tpc  # doctest: +SKIP
    >>> from transformers import AutoModelForCausalLM, AutoTokenizer  # doctest: +SKIP
    >>> model = AutoModelForCausalLM.from_pretrained(path)  # doctest: +SKIP
    >>> acts = tpc.collect(model, ["How do I bake bread?"], "blocks.6.hook_resid_post",  # doctest: +SKIP
    ...                    tokenizer=AutoTokenizer.from_pretrained(path))
"""

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError
from ..activations import LAYERS as LAYERS  # the discovery rule's exceptions, shared with the nnsight adapter
from ..activations import (
    Adapter,
    HFShape,
    Site,
    StopPass,
    check_site,
    decoder_layers,
    find_layers,
    hook_site,
    lm_head,
    observe_layers,
    positions,
)

# Tokenizers loaded from ``name_or_path``, one per model, so repeated calls do not reload them.
_LOADED: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()

__all__ = ["TransformersAdapter", "make_adapter", "default_tokenizer", "LAYERS"]


class TransformersAdapter(HFShape, Adapter):
    toolkit = "transformers"

    def __init__(self, model: Any, tokenizer: Any = None):
        super().__init__(model)
        lm_head(model)  # fail now, not mid-generation, on a bare base model
        self._path = find_layers(model, "transformers")
        self._tokenizer = tokenizer

    def _layers(self) -> Any:
        return decoder_layers(self.model, self._path)

    def site(self, name: str) -> Site:
        """:meth:`Adapter.site`, and for a branch site a check that this layer offers it
        (:func:`~tpc_hooks.activations._hf.branch_verdicts`, one short pass the first time)."""
        s = super().site(name)
        check_site(self.model, self._layers(), s, self.toolkit)
        return s

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = default_tokenizer(self.model)
        return self._tokenizer

    @property
    def model_name(self) -> str:
        return str(_name_or_path(self.model) or getattr(self.model.config, "model_type", "transformers"))

    @torch.no_grad()
    def forward_sites(self, input_ids: Tensor, attention_mask: Tensor, sites: list[Site]) -> dict[str, Tensor]:
        """One forward pass of the model with hooks on the decoder layers; the hook of the
        deepest site ends it (no later layer, no final norm, no LM head). Hooks are removed
        however the pass ends."""
        layers = self._layers()
        deepest = max(sites, key=lambda s: s.depth)
        saved: dict[str, Tensor] = {}

        def keep(site: Site, tensor: Tensor) -> None:
            saved[site.name] = tensor.detach()
            if site == deepest:
                raise StopPass

        handles = []
        try:
            for s in sites:

                def keep_site(tensor: Tensor, s: Site = s) -> None:
                    keep(s, tensor)

                handles.append(hook_site(layers, s, keep_site))
            ids, mask = input_ids.to(self.device), attention_mask.to(self.device)
            try:
                self.model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False)
            except StopPass:
                pass
        finally:
            for h in handles:
                h.remove()
        missing = [s.name for s in sites if s.name not in saved]
        if missing:
            raise TPCHooksError(f"the hooks at {missing} did not fire; is the site valid for this model?")
        return saved

    @contextmanager
    def observe(self, site: Site, fn: Callable[[Tensor, Tensor, bool], None]) -> Iterator[None]:
        """Plain PyTorch hooks on the model's decoder layer (see :meth:`Adapter.observe`)."""
        with observe_layers(self.model, self._layers(), site, fn):
            yield

    def hf_model(self) -> Any:
        return self.model


def _name_or_path(model: Any) -> str:
    return str(getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "") or "")


def default_tokenizer(model: Any) -> Any:
    """``AutoTokenizer.from_pretrained(model.name_or_path)``, loaded once per model.

    Raises:
        TPCHooksError: the model has no ``name_or_path``, or no tokenizer loads from it.
    """
    if model in _LOADED:
        return _LOADED[model]
    name = _name_or_path(model)
    if not name:
        raise TPCHooksError(
            f"this {type(model).__name__} carries no tokenizer and has no name_or_path to load one from; "
            "pass tokenizer= (e.g. tokenizer=AutoTokenizer.from_pretrained(path))"
        )
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as err:  # OSError, hub validation/network errors, a missing tokenizer file...
        raise TPCHooksError(
            f"could not load a tokenizer for this {type(model).__name__} from name_or_path={name!r} "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); pass tokenizer="
        ) from err
    _LOADED[model] = tok
    return tok


def make_adapter(model: Any, tokenizer: Any = None) -> TransformersAdapter:
    return TransformersAdapter(model, tokenizer=tokenizer)
