"""nnsight adapter: ``LanguageModel`` / ``TransformersModel`` wrapping a Hugging Face model.

Residual sites map to decoder-layer inputs and outputs, the decoder layers found by the rule
shared with the plain ``transformers`` adapter (``find_layers`` in ``_hf.py``; ``LAYERS`` holds
its exceptions): the input of layer L is
``blocks.L.hook_resid_pre`` and its output ``blocks.L.hook_resid_post``; Hugging Face layers
expose no tensor between attention and MLP, so ``hook_resid_mid`` is not offered.
Collection reads inside ``model.trace(...)`` (stopped after the deepest site; ``remote=True``
goes to NDIF). Generation and ``watch`` use plain PyTorch hooks on the wrapped modules, which
see the same tensors without a trace per token.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from ..head._errors import TPCHooksError
from ._adapter import Adapter
from ._batching import positions
from ._hf import LAYERS as LAYERS  # the discovery rule's exceptions, shared with the transformers adapter
from ._hf import HFShape, decoder_layers, first, find_layers, observe_layers
from ._sites import Site

__all__ = ["NNsightAdapter", "make_adapter", "LAYERS"]


class NNsightAdapter(HFShape, Adapter):
    toolkit = "nnsight"
    kinds = ("pre", "post")

    def __init__(self, model: Any, remote: bool = False):
        super().__init__(model)
        self.remote = remote
        self._path = find_layers(model._module, "nnsight")
        if getattr(model, "tokenizer", None) is None:
            raise TPCHooksError("this nnsight model has no tokenizer; pass tokenizer= to LanguageModel")

    def _layers(self) -> Any:
        mod = self.model
        for part in self._path:
            mod = getattr(mod, part)
        return mod

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    @property
    def model_name(self) -> str:
        return str(getattr(self.model.config, "_name_or_path", "") or getattr(self.model.config, "model_type", "nnsight"))

    @property
    def device(self) -> torch.device:
        try:
            return next(self.model._module.parameters()).device
        except (AttributeError, StopIteration):
            return torch.device("cpu")

    @torch.no_grad()
    def forward_sites(self, input_ids: Tensor, attention_mask: Tensor, sites: list[Site]) -> dict[str, Tensor]:
        ordered = sorted(sites, key=lambda s: (s.layer, s.kind != "pre"))
        layers = self._layers()
        ids, mask = input_ids.to(self.device), attention_mask.to(self.device)
        saved: dict[str, Any] = {}
        with self.model.trace(ids, attention_mask=mask, position_ids=positions(mask), remote=self.remote) as tracer:
            for s in ordered:
                layer = layers[s.layer]
                saved[s.name] = (layer.input if s.kind == "pre" else layer.output).save()
            tracer.stop()
        return {name: first(v).detach() for name, v in saved.items()}

    def hf_model(self) -> Any:
        return self.model._module

    def decode(self, *args: Any, **kwargs: Any) -> None:
        """The shared Hugging Face decode loop (see :meth:`Adapter.decode`): a trace per token
        would cost more than the monitor itself, and plain hooks on nnsight's modules read the
        same tensors."""
        if self.remote:
            raise TPCHooksError("monitored generation runs locally; remote=True is supported for collection only")
        return super().decode(*args, **kwargs)

    @contextmanager
    def observe(self, site: Site, fn: Callable[[Tensor, Tensor, bool], None]) -> Iterator[None]:
        """Plain PyTorch hooks on the wrapped Hugging Face modules: they see every forward pass,
        inside or outside an nnsight trace, and are removed on exit."""
        if self.remote:
            raise TPCHooksError("watch() observes local forward passes; it cannot follow remote (NDIF) execution")
        hf = self.model._module
        with observe_layers(hf, decoder_layers(hf, self._path), site, fn):
            yield


def make_adapter(model: Any, remote: bool = False) -> NNsightAdapter:
    return NNsightAdapter(model, remote=remote)
