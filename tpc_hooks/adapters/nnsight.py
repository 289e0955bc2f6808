"""nnsight adapter: ``LanguageModel`` / ``TransformersModel`` wrapping a Hugging Face model.

Residual sites map to decoder-layer inputs and outputs (one table below): the input of
layer L is ``blocks.L.hook_resid_pre`` and its output ``blocks.L.hook_resid_post``.
Hugging Face layers expose no tensor between attention and MLP, so ``hook_resid_mid`` is
not offered. Collection reads inside ``model.trace(...)`` (stopped after the deepest site;
``remote=True`` goes to NDIF). Generation and ``watch`` use plain PyTorch hooks on the wrapped
modules, which see the same tensors without a trace per token.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError
from ._base import Adapter, InputSpy, Site, positions

# Hugging Face ``config.model_type`` -> attribute path of the decoder-layer list.
LAYERS: dict[str, str] = {
    "llama": "model.layers",
    "mistral": "model.layers",
    "mixtral": "model.layers",
    "qwen2": "model.layers",
    "qwen2_moe": "model.layers",
    "qwen3": "model.layers",
    "qwen3_moe": "model.layers",
    "gemma": "model.layers",
    "gemma2": "model.layers",
    "gemma3_text": "model.layers",
    "phi3": "model.layers",
    "olmo2": "model.layers",
    "gpt2": "transformer.h",
    "gpt_neox": "gpt_neox.layers",
}


def _first(x: Any) -> Tensor:
    return x[0] if isinstance(x, tuple) else x


class NNsightAdapter(Adapter):
    toolkit = "nnsight"
    kinds = ("pre", "post")

    def __init__(self, model: Any, remote: bool = False):
        super().__init__(model)
        self.remote = remote
        mtype = getattr(model.config, "model_type", None)
        if mtype not in LAYERS:
            raise TPCHooksError(
                f"no site table for Hugging Face model_type {mtype!r}; supported: {sorted(LAYERS)}. "
                "Add an entry to tpc_hooks.adapters.nnsight.LAYERS (the attribute path of its decoder layers)"
            )
        self._path = LAYERS[mtype].split(".")
        if getattr(model, "tokenizer", None) is None:
            raise TPCHooksError("this nnsight model has no tokenizer; pass tokenizer= to LanguageModel")

    def _layers(self) -> Any:
        mod = self.model
        for part in self._path:
            mod = getattr(mod, part)
        return mod

    @property
    def d_model(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def n_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

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
        return {name: _first(v).detach() for name, v in saved.items()}

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
        layer = hf
        for part in self._path:
            layer = getattr(layer, part)
        layer = layer[site.layer]
        spy = InputSpy()

        def on_acts(tensor: Tensor) -> None:
            mask, fresh = spy.step(tensor.shape[1], tensor.shape[0])
            fn(tensor.detach(), mask, fresh)

        if site.kind == "pre":
            h2 = layer.register_forward_pre_hook(lambda mod, args, kwargs: on_acts(
                args[0] if args else kwargs["hidden_states"]), with_kwargs=True)
        else:
            h2 = layer.register_forward_hook(lambda mod, args, out: on_acts(_first(out)))
        h1 = hf.register_forward_pre_hook(spy, with_kwargs=True)
        try:
            yield
        finally:
            h1.remove()
            h2.remove()


def make_adapter(model: Any, remote: bool = False) -> NNsightAdapter:
    return NNsightAdapter(model, remote=remote)
