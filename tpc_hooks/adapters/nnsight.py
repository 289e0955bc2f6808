"""nnsight adapter: ``LanguageModel`` / ``TransformersModel`` wrapping a Hugging Face model.

Residual sites map to decoder-layer inputs and outputs, the decoder layers found by the rule
shared with the plain ``transformers`` adapter (``find_layers`` in ``_hf.py``; ``LAYERS`` holds
its exceptions): the input of layer L is
``blocks.L.hook_resid_pre`` and its output ``blocks.L.hook_resid_post``; ``hook_attn_out``,
``hook_resid_mid`` and ``hook_mlp_out`` are the layer's attention, norm and MLP modules' inputs
or outputs, as in the ``transformers`` adapter (checked on the model before first use).
Collection reads inside ``model.trace(...)`` (stopped after the deepest site; ``remote=True``
goes to NDIF). Generation and ``watch`` use plain PyTorch hooks on the wrapped modules, which
see the same tensors without a trace per token.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError
from ..activations import (
    BRANCH,
    Adapter,
    HFShape,
    Site,
    branch_points,
    check_site,
    decoder_layers,
    find_layers,
    first,
    observe_layers,
    positions,
)
from ..activations import LAYERS as LAYERS  # the discovery rule's exceptions, shared with the transformers adapter

__all__ = ["NNsightAdapter", "make_adapter", "LAYERS"]


class NNsightAdapter(HFShape, Adapter):
    toolkit = "nnsight"

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
        return str(
            getattr(self.model.config, "_name_or_path", "") or getattr(self.model.config, "model_type", "nnsight")
        )

    @property
    def device(self) -> torch.device:
        try:
            return next(self.model._module.parameters()).device
        except (AttributeError, StopIteration):
            return torch.device("cpu")

    @torch.no_grad()
    def forward_sites(self, input_ids: Tensor, attention_mask: Tensor, sites: list[Site]) -> dict[str, Tensor]:
        ordered = sorted(sites, key=lambda s: s.depth)  # a trace reads modules in the order they run
        layers = self._layers()
        hf_layers = decoder_layers(self.model._module, self._path)
        ids, mask = input_ids.to(self.device), attention_mask.to(self.device)
        saved: dict[str, Any] = {}
        with self.model.trace(ids, attention_mask=mask, position_ids=positions(mask), remote=self.remote) as tracer:
            for s in ordered:
                module, read_input = layers[s.layer], s.kind == "pre"
                if s.kind in BRANCH:
                    child, read_input = branch_points(hf_layers[s.layer])[s.kind]
                    module = getattr(module, child)
                saved[s.name] = (module.input if read_input else module.output).save()
            tracer.stop()
        return {name: first(v).detach() for name, v in saved.items()}

    def hf_model(self) -> Any:
        return self.model._module

    def site(self, name: str) -> Site:
        """:meth:`Adapter.site`, and for a branch site a check that this layer offers it (one
        short local pass the first time; with ``remote=True``, where no local pass runs, only
        the residual stream at layer boundaries is offered)."""
        s = super().site(name)
        if s.kind in BRANCH and self.remote:
            raise TPCHooksError(
                f"{s.name}: with remote=True the nnsight adapter reads hook_resid_pre and "
                "hook_resid_post (a branch site is checked on a local forward pass first)"
            )
        if s.kind in BRANCH and getattr(self.model, "dispatched", True) is False:
            self.model.dispatch()  # a model loaded lazily has meta weights until its first trace
        check_site(self.model._module, decoder_layers(self.model._module, self._path), s, self.toolkit)
        return s

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
