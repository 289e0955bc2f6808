"""What the Hugging Face adapters share (plain ``transformers`` and nnsight): the rule that finds
a model's decoder layers (:func:`find_layers`), and plain PyTorch hooks on a ``transformers``
model (:class:`InputSpy` and :class:`StopPass` serve the TransformerLens adapter's hooks too).

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


def text_config(config: Any) -> Any:
    """The config of a model's text decoder: ``config.get_text_config(decoder=True)`` where
    transformers has it (a multimodal checkpoint keeps it under ``text_config``), else ``config``."""
    get = getattr(config, "get_text_config", None)
    if callable(get):
        try:
            return get(decoder=True)
        except (TypeError, ValueError):
            return get()
    return config


def config_int(config: Any, names: tuple[str, ...], what: str) -> int:
    """The first of ``names`` that ``config``'s text config sets (transformers' attribute maps
    resolve ``n_layer``, ``n_embd``... to the usual names on most families)."""
    c = text_config(config)
    for name in names:
        value = getattr(c, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise TPCHooksError(f"{type(config).__name__} gives no {what} (looked for {', '.join(names)} in its text config "
                        f"{type(c).__name__})")


N_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
D_MODEL = ("hidden_size", "n_embd", "d_model", "dim")


class HFShape:
    """``d_model`` and ``n_layers`` from a Hugging Face config (``self.model.config``), read from
    its text decoder's config (:func:`text_config`)."""

    model: Any

    @property
    def d_model(self) -> int:
        return config_int(self.model.config, D_MODEL, "hidden size")

    @property
    def n_layers(self) -> int:
        return config_int(self.model.config, N_LAYERS, "layer count")


# The exceptions to :func:`find_layers`' rule: Hugging Face ``config.model_type`` -> attribute path
# of the decoder-layer list, for a family the rule would get wrong. None is known: the rule finds
# every family the tests build (docs: "Models").
LAYERS: dict[str, str] = {}

_NOT_TEXT = ("vision", "visual", "audio", "image", "speech", "encoder", "mtp", "projector")


def find_layers(model: Any, toolkit: str) -> list[str]:
    """The attribute path (from ``model``) of its decoder-layer list: the one ``nn.ModuleList``
    holding as many modules as the text config has layers, inside the text decoder.

    The rule, in order: an entry of :data:`LAYERS` (the exceptions); else, among the module lists
    of the length the text config gives (:func:`text_config`), those inside the module that
    transformers' ``get_decoder()`` returns (a multimodal checkpoint's language model), not under
    a vision, audio or encoder tower; the shallowest if several remain. An error names the lists
    found when none fits.
    """
    import torch.nn as nn

    mtype = getattr(model.config, "model_type", None)
    if mtype in LAYERS:
        path = LAYERS[mtype].split(".")
        decoder_layers(model, path)
        return path
    n = config_int(model.config, N_LAYERS, "layer count")
    lists = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.ModuleList) and name]
    fits = [(name, mod) for name, mod in lists if len(mod) == n]
    inside = _decoder_prefix(model)
    if inside is not None:
        fits = [(name, mod) for name, mod in fits if inside == "" or name.startswith(inside + ".")]
    fits = [(name, mod) for name, mod in fits
            if not any(word in part.lower() for part in name.split(".") for word in _NOT_TEXT)]
    if not fits:
        found = ", ".join(f"{name} ({len(mod)})" for name, mod in lists[:12]) or "none"
        raise TPCHooksError(
            f"could not find the decoder layers of this {type(model).__name__} (model_type {mtype!r}, {toolkit}): its "
            f"text config has {n} layers and no module list of that length sits in its text decoder; module lists "
            f"found: {found}. Add its path to tpc_hooks.adapters.transformers.LAYERS[{mtype!r}] (the nnsight "
            "adapter reads the same table)")
    return min(fits, key=lambda f: (f[0].count("."), f[0]))[0].split(".")


def _decoder_prefix(model: Any) -> str | None:
    """The module path of ``model.get_decoder()`` (transformers' accessor for the text decoder), or
    None when the model has none that is one of its submodules."""
    get = getattr(model, "get_decoder", None)
    if not callable(get):
        return None
    try:
        dec = get()
    except Exception:  # noqa: BLE001 - an accessor a family does not implement
        return None
    if dec is None:
        return None
    for name, mod in model.named_modules():
        if mod is dec:
            return name
    return None


def lm_head(model: Any) -> Any:
    """``model``'s output embeddings (its LM head): a clear error for a bare base model, which
    has decoder layers but no next-token logits to generate with."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is None:
        raise TPCHooksError(f"{type(model).__name__} has no LM head (get_output_embeddings() is None); pass the "
                            "causal-LM class (AutoModelForCausalLM, or the checkpoint's ...ForConditionalGeneration), "
                            "not the bare base model or another head")
    return head


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
        missing mask is all ones, made on ``device``: no host-to-device copy per step).

        A call whose mask covers earlier positions while its KV cache holds none ran without
        them (a wrapper that drops the cache): refused, since every score from it would be wrong."""
        m = self.mask
        if self.past == 0 and m is not None and m.dim() == 2 and m.shape[1] > n_new:
            raise TPCHooksError(cache_dropped(0, int(m.shape[1]) - n_new, "a forward pass of generate"))
        if m is None or m.dim() != 2 or m.shape[1] < n_new or m.shape[0] != batch:
            m = torch.ones(batch, n_new, dtype=torch.long, device=device)
        return m[:, -n_new:], self.past == 0


def cache_dropped(held: int, fed: int, where: str) -> str:
    """The error of a KV cache that did not grow (see :meth:`InputSpy.step` and the decode loop)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            return f"no {name}"

    return (f"the model's KV cache did not grow during generation ({held} positions held before {where}, after {fed} "
            "fed): every step after the first would run without the earlier tokens and score wrong. Known cause: "
            "transformers >= 5.24 passes the cache as `cache`, which TransformerLens' TransformerBridge (3.9 and 4.3) "
            f"does not hand on (installed: {installed('transformers')}, {installed('transformer-lens')}); install "
            "'transformers<5.24' (pip install 'tpc-hooks[transformer-lens]' pins it) or monitor the Hugging Face "
            "model directly")


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
