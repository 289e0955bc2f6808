"""What the Hugging Face adapters share (plain ``transformers`` and nnsight): the one table of
decoder layers, and plain PyTorch hooks on a ``transformers`` model.

Residual sites map to decoder-layer inputs and outputs: the input of layer L is
``blocks.L.hook_resid_pre`` and its output ``blocks.L.hook_resid_post`` (Hugging Face's
``hidden_states[L + 1]``). Hugging Face layers expose no tensor between attention and MLP, so
``hook_resid_mid`` is not offered. Nothing here imports ``transformers`` or nnsight.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor

from .._errors import TPCHooksError
from ._base import InputSpy, Site


class HFShape:
    """``d_model`` and ``n_layers`` from a Hugging Face config (``self.model.config``)."""

    model: Any

    @property
    def d_model(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def n_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

# Hugging Face ``config.model_type`` -> attribute path of the decoder-layer list, from the
# causal-LM class (``AutoModelForCausalLM``).
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


def layer_path(config: Any, toolkit: str) -> list[str]:
    """The attribute path of the decoder layers for a Hugging Face config, from :data:`LAYERS`."""
    mtype = getattr(config, "model_type", None)
    if mtype not in LAYERS:
        raise TPCHooksError(
            f"no site table for Hugging Face model_type {mtype!r} ({toolkit}); supported: {sorted(LAYERS)}. "
            "Add an entry to tpc_hooks.adapters.transformers.LAYERS (the attribute path of its decoder layers; "
            "the nnsight adapter reads the same table)"
        )
    return LAYERS[mtype].split(".")


def decoder_layers(hf: Any, path: list[str]) -> Any:
    """The decoder-layer list of ``hf`` at ``path``; a clear error when the model lacks it."""
    mod = hf
    for part in path:
        if not hasattr(mod, part):
            raise TPCHooksError(
                f"{type(hf).__name__} has no {'.'.join(path)} (its decoder layers); pass the causal-LM class "
                "(AutoModelForCausalLM), not the bare base model or another head"
            )
        mod = getattr(mod, part)
    return mod


def first(x: Any) -> Tensor:
    """The hidden states of a decoder layer's output (a tensor in transformers 5, a tuple before)."""
    return x[0] if isinstance(x, tuple) else x


def layer_input(args: tuple, kwargs: dict) -> Tensor:
    return args[0] if args else kwargs["hidden_states"]


@contextmanager
def observe_layers(hf: Any, layers: Any, site: Site, fn: Callable[[Tensor, Tensor, bool], None]) -> Iterator[None]:
    """Plain PyTorch hooks on a ``transformers`` model: ``fn(acts, new_mask, fresh)`` after every
    forward pass of ``hf`` (whoever calls it, inside or outside ``generate``); removed on exit."""
    layer = layers[site.layer]
    spy = InputSpy()

    def on_acts(tensor: Tensor) -> None:
        mask, fresh = spy.step(tensor.shape[1], tensor.shape[0], tensor.device)
        fn(tensor.detach(), mask, fresh)

    h1 = hf.register_forward_pre_hook(spy, with_kwargs=True)
    try:
        if site.kind == "pre":
            h2 = layer.register_forward_pre_hook(lambda mod, args, kwargs: on_acts(layer_input(args, kwargs)),
                                                 with_kwargs=True)
        else:
            h2 = layer.register_forward_hook(lambda mod, args, out: on_acts(first(out)))
        try:
            yield
        finally:
            h2.remove()
    finally:
        h1.remove()
