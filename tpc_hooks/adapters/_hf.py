"""What the Hugging Face adapters share (plain ``transformers`` and nnsight): the one table of
decoder layers, and plain PyTorch hooks on a ``transformers`` model (:class:`InputSpy` and
:class:`StopPass` serve the TransformerLens adapter's hooks too).

Residual sites map to decoder-layer inputs and outputs: the input of layer L is
``blocks.L.hook_resid_pre`` and its output ``blocks.L.hook_resid_post`` (Hugging Face's
``hidden_states[L + 1]``). Hugging Face layers expose no tensor between attention and MLP, so
``hook_resid_mid`` is not offered. Nothing here imports ``transformers`` or nnsight.
"""

import inspect
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from ..head._errors import TPCHooksError
from ._sites import Site


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


def this_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a hook that acts only in the thread that made it: a forward pass another thread
    runs through the same model (its own scoring, its own ``generate``) passes it by. Every hook
    tpc-hooks attaches goes through this, so threads sharing a model never see each other's
    activations and never end each other's passes."""
    owner = threading.get_ident()

    def hook(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == owner:
            return fn(*args, **kwargs)
        return None

    return hook


_LOCKS: "weakref.WeakKeyDictionary[Any, threading.RLock]" = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model: Any) -> threading.RLock:
    """The lock of the passes tpc-hooks drives through ``model`` (collection, scoring, its own
    decode loop): one at a time per model, so a toolkit's own per-model state (TransformerLens'
    hook context levels, an nnsight trace) is never shared by two threads. Passes the user drives
    (``watch``, the ``generate`` hooks) take no lock: their hooks act only in their own thread."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock


class StopPass(Exception):
    """Raised by a hook to end a forward pass once the activations it needs are read (caught by
    the adapter that raised it; never reaches the user)."""


CACHE_KWARGS = ("cache", "past_key_values", "past_kv_cache")  # a forward's KV-cache argument, by name


def cache_kwarg(hf: Any) -> str:
    """The name under which ``hf``'s forward takes its KV cache: ``"cache"`` (transformers >= 5.24),
    else ``"past_key_values"``."""
    try:
        params = inspect.signature(hf.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


class InputSpy:
    """A forward pre-hook (with kwargs) that records the attention mask of each call and how
    many positions its KV cache already held (0 for a fresh call)."""

    def __init__(self):
        self.mask: Tensor | None = None
        self.past = 0

    def __call__(self, module: Any, args: tuple, kwargs: dict) -> None:
        self.mask = kwargs.get("attention_mask")
        # transformers >= 5.24 passes the KV cache as ``cache`` (``past_key_values`` before; TransformerLens: ``past_kv_cache``)
        cache = next((kwargs[k] for k in CACHE_KWARGS if kwargs.get(k) is not None), None)
        self.past = _cache_length(cache)

    def step(self, n_new: int, batch: int, device: torch.device | None = None) -> tuple[Tensor, bool]:
        """Mask of the ``n_new`` positions just computed, and whether the call was fresh (a
        missing mask is all ones, made on ``device``: no host-to-device copy per step)."""
        m = self.mask
        if m is None or m.dim() != 2 or m.shape[1] < n_new or m.shape[0] != batch:
            m = torch.ones(batch, n_new, dtype=torch.long, device=device)
        return m[:, -n_new:], self.past == 0


def _cache_length(cache: Any) -> int:
    if cache is None:
        return 0
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    entries = getattr(cache, "entries", None)  # TransformerLens' cache
    if entries:
        keys = getattr(entries[0], "past_keys", None)
        return int(keys.shape[1]) if keys is not None else 0
    return 0


@contextmanager
def observe_layers(hf: Any, layers: Any, site: Site, fn: Callable[[Tensor, Tensor, bool], None]) -> Iterator[None]:
    """Plain PyTorch hooks on a ``transformers`` model: ``fn(acts, new_mask, fresh)`` after every
    forward pass of ``hf`` (whoever calls it, inside or outside ``generate``); removed on exit."""
    layer = layers[site.layer]
    spy = InputSpy()

    def on_acts(tensor: Tensor) -> None:
        mask, fresh = spy.step(tensor.shape[1], tensor.shape[0], tensor.device)
        fn(tensor.detach(), mask, fresh)

    h1 = hf.register_forward_pre_hook(this_thread(spy), with_kwargs=True)
    try:
        if site.kind == "pre":
            h2 = layer.register_forward_pre_hook(this_thread(lambda mod, args, kwargs: on_acts(layer_input(args, kwargs))),
                                                 with_kwargs=True)
        else:
            h2 = layer.register_forward_hook(this_thread(lambda mod, args, out: on_acts(first(out))))
        try:
            yield
        finally:
            h2.remove()
    finally:
        h1.remove()
