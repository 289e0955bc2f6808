"""What the Hugging Face adapters share (plain ``transformers`` and nnsight): the rule that finds
a model's decoder layers (:func:`find_layers`), and plain PyTorch hooks on a ``transformers``
model (:class:`InputSpy` and :class:`StopPass` serve the TransformerLens adapter's hooks too).

Residual sites map to decoder-layer inputs and outputs: the input of layer L is
``blocks.L.hook_resid_pre`` and its output ``blocks.L.hook_resid_post`` (Hugging Face's
``hidden_states[L + 1]``). ``hook_attn_out``, ``hook_resid_mid`` and ``hook_mlp_out`` are read
at the layer's children (:func:`branch_points`), checked on the model before first use
(:func:`branch_verdicts`). Nothing here imports ``transformers`` or nnsight.
"""

import inspect
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError
from ._sites import KINDS, Site, hook_name


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
    raise TPCHooksError(
        f"{type(config).__name__} gives no {what} (looked for {', '.join(names)} in its text config {type(c).__name__})"
    )


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
    fits = [
        (name, mod)
        for name, mod in fits
        if not any(word in part.lower() for part in name.split(".") for word in _NOT_TEXT)
    ]
    if not fits:
        found = ", ".join(f"{name} ({len(mod)})" for name, mod in lists[:12]) or "none"
        raise TPCHooksError(
            f"could not find the decoder layers of this {type(model).__name__} (model_type {mtype!r}, {toolkit}): its "
            f"text config has {n} layers and no module list of that length sits in its text decoder; module lists "
            f"found: {found}. Add its path to tpc_hooks.adapters.transformers.LAYERS[{mtype!r}] (the nnsight "
            "adapter reads the same table)"
        )
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
        raise TPCHooksError(
            f"{type(model).__name__} has no LM head (get_output_embeddings() is None); pass the "
            "causal-LM class (AutoModelForCausalLM, or the checkpoint's ...ForConditionalGeneration), "
            "not the bare base model or another head"
        )
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


def module_input(args: tuple, kwargs: dict) -> Tensor:
    """The hidden states a decoder layer, norm or MLP is called with (first positional argument,
    else the ``hidden_states`` keyword, else the first tensor keyword)."""
    if args:
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    return next(v for v in kwargs.values() if isinstance(v, Tensor))


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
        # transformers >= 5.24 passes the KV cache as ``cache``
        # (``past_key_values`` before; TransformerLens: ``past_kv_cache``)
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

    return (
        f"the model's KV cache did not grow during generation ({held} positions held before {where}, after {fed} "
        "fed): every step after the first would run without the earlier tokens and score wrong. Known cause: "
        "transformers >= 5.24 passes the cache as `cache`, which TransformerLens' TransformerBridge (3.9 and 4.3) "
        f"does not hand on (installed: {installed('transformers')}, {installed('transformer-lens')}); install "
        "'transformers<5.24' (pip install 'tpc-hooks[transformer-lens]' pins it) or monitor the Hugging Face "
        "model directly"
    )


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
    spy = InputSpy()

    def on_acts(tensor: Tensor) -> None:
        mask, fresh = spy.step(tensor.shape[1], tensor.shape[0], tensor.device)
        fn(tensor.detach(), mask, fresh)

    h1 = hf.register_forward_pre_hook(this_thread(spy), with_kwargs=True)
    try:
        h2 = hook_site(layers, site, on_acts)
        try:
            yield
        finally:
            h2.remove()
    finally:
        h1.remove()


# ---------------------------------------------------------------------- the two branches of a decoder layer
BRANCH = ("attn_out", "mid", "mlp_out")
ATTENTION = ("self_attn", "attn", "attention", "self_attention", "linear_attn", "mixer", "mamba")
_MLP = ("mlp", "block_sparse_moe", "feed_forward", "moe", "ffn", "shared_mlp")
_PRE_MLP_NORM = ("pre_feedforward_layernorm", "post_attention_layernorm", "ffn_norm", "pre_mlp_layernorm", "ln_2")


def branch_points(layer: Any) -> dict[str, tuple[str, bool]]:
    """Where a Hugging Face decoder layer computes ``hook_attn_out``, ``hook_resid_mid`` and
    ``hook_mlp_out``, from its children's names: kind -> (child, True to read the child's input,
    False its output). Empty when the layer has no attention-like or no MLP-like child.

    The rule: attention is the first child named like one (``self_attn``, ``linear_attn``,
    ``mamba``...), the MLP likewise (``mlp``, ``block_sparse_moe``, ``feed_forward``...). A layer
    with ``post_feedforward_layernorm`` normalises each branch before the residual add (Gemma,
    OLMo 2 and 3): the branches' outputs are those two norms' outputs and the middle residual
    stream is the input of ``pre_feedforward_layernorm`` (else of the MLP). Otherwise the
    branches' outputs are attention's and the MLP's, and the middle residual stream is the input
    of the norm before the MLP (else of the MLP). :func:`branch_verdicts` checks it on the model.
    """
    kids = dict(layer.named_children())
    attn = next((n for n in ATTENTION if n in kids), None)
    mlp = next((n for n in _MLP if n in kids), None)
    if attn is None or mlp is None:
        return {}
    if "post_feedforward_layernorm" in kids and "post_attention_layernorm" in kids:
        mid = "pre_feedforward_layernorm" if "pre_feedforward_layernorm" in kids else mlp
        return {
            "attn_out": ("post_attention_layernorm", False),
            "mid": (mid, True),
            "mlp_out": ("post_feedforward_layernorm", False),
        }
    mid = next((n for n in _PRE_MLP_NORM if n in kids), mlp)
    return {"attn_out": (attn, False), "mid": (mid, True), "mlp_out": (mlp, False)}


def hook_site(layers: Any, site: Site, fn: Callable[[Tensor], None]) -> Any:
    """A forward (pre-)hook calling ``fn(tensor)`` with ``site``'s activations; returns its handle.
    ``hook_resid_pre``/``post`` are the decoder layer's input and output; the branch sites are
    read where :func:`branch_points` says."""
    layer = layers[site.layer]
    if site.kind in ("pre", "post"):
        module, read_input = layer, site.kind == "pre"
    else:
        child, read_input = branch_points(layer)[site.kind]
        module = getattr(layer, child)
    if read_input:
        return module.register_forward_pre_hook(
            this_thread(lambda mod, args, kwargs: fn(module_input(args, kwargs))), with_kwargs=True
        )
    if site.kind == "post":
        return module.register_forward_hook(this_thread(lambda mod, args, out: fn(first(out))))

    def branch_out(mod: Any, args: tuple, kwargs: dict, out: Any) -> None:
        out, given = first(out), module_input(args, kwargs)
        if out.shape != given.shape and out.numel() == given.numel():
            out = out.view(given.shape)  # an MoE block that returns its rows flattened (Llama 4)
        fn(out)

    return module.register_forward_hook(this_thread(branch_out), with_kwargs=True)


_VERDICTS: "weakref.WeakKeyDictionary[Any, dict[str, str | None]]" = weakref.WeakKeyDictionary()


def branch_verdicts(hf: Any, layers: Any, layer_index: int) -> dict[str, str | None]:
    """For each branch site of decoder layer ``layer_index``: None when :func:`branch_points` reads
    it right on this model, else why not. Checked once per layer, on one forward pass of four
    tokens: the residual stream entering the layer plus what attention adds must give the middle
    residual stream, and that plus what the MLP adds the layer's output, each to within the
    rounding of one addition; or, in a parallel block (GPT-J, GPT-NeoX), the layer's input plus
    both branches its output (:func:`judge_branches`). A block that scales a branch before adding
    it (Granite) or adds a third term (Gemma 4) has no such sites here."""
    layer = layers[layer_index]
    if layer in _VERDICTS:
        return _VERDICTS[layer]
    points = branch_points(layer)
    if not points:
        kids = ", ".join(n for n, _ in layer.named_children())
        verdict: dict[str, str | None] = dict.fromkeys(
            BRANCH, f"no child of {type(layer).__name__} reads as attention and MLP ({kids})"
        )
        _VERDICTS[layer] = verdict
        return verdict
    seen: dict[str, list[Tensor]] = {k: [] for k in ("pre", *BRANCH, "post")}

    def keeper(kind: str) -> Callable[[Tensor], None]:
        def keep(t: Tensor) -> None:
            seen[kind].append(t.detach())
            if kind == "post":
                raise StopPass

        return keep

    handles = [hook_site(layers, Site(layer_index, k), keeper(k)) for k in seen]
    try:
        device = next(hf.parameters()).device
        try:
            with torch.no_grad():
                hf(input_ids=torch.arange(1, 5, device=device)[None], use_cache=False)
        except StopPass:
            pass
    finally:
        for h in handles:
            h.remove()
    twice = [k for k, v in seen.items() if len(v) != 1]
    if twice:
        verdict = dict.fromkeys(
            BRANCH, f"the modules read for {twice} ran {[len(seen[k]) for k in twice]} times in a pass"
        )
    else:
        where = {k: f"{'input' if read else 'output'} of {child}" for k, (child, read) in points.items()}
        verdict = judge_branches({k: v[0] for k, v in seen.items()}, where)
    _VERDICTS[layer] = verdict
    return verdict


def judge_branches(once: dict[str, Tensor], where: dict[str, str]) -> dict[str, str | None]:
    """The verdicts of :func:`branch_verdicts` from one pass's tensors (``once``, by kind; a kind
    may be missing), ``where`` naming where each branch site was read. A parallel block (attention
    and MLP both read ``hook_resid_pre``: ``pre + attn_out + mlp_out = post``) offers both
    branches and no ``hook_resid_mid``."""

    def adds_up(*parts: str, to: str) -> bool:
        if any(k not in once for k in (*parts, to)) or any(once[k].shape != once[to].shape for k in parts):
            return False
        eps = torch.finfo(once[to].dtype).eps
        xs = [once[k].double() for k in parts]
        return bool(((sum(xs) - once[to].double()).abs() <= len(xs) * eps * sum(x.abs() for x in xs) + 1e-30).all())

    attn, mlp = adds_up("pre", "attn_out", to="mid"), adds_up("mid", "mlp_out", to="post")
    if not (attn or mlp) and adds_up("pre", "attn_out", "mlp_out", to="post"):
        return {
            "attn_out": None,
            "mlp_out": None,
            "mid": (
                "attention and MLP both read hook_resid_pre here (a parallel block): no residual stream lies "
                "between them"
            ),
        }
    missing = {k: f"it has no {hook_name(k)}" for k in BRANCH if k not in once}
    return {
        "attn_out": missing.get("attn_out")
        or (None if attn else f"hook_resid_pre + the {where['attn_out']} is not the {where['mid']}"),
        "mid": missing.get("mid") or (None if attn or mlp else f"neither branch adds up around the {where['mid']}"),
        "mlp_out": missing.get("mlp_out")
        or (None if mlp else f"the {where['mid']} + the {where['mlp_out']} is not the layer's output"),
    }


def check_site(hf: Any, layers: Any, site: Site, toolkit: str) -> None:
    """A clear error, naming this layer's sites, when ``site`` is a branch site
    :func:`branch_verdicts` finds this layer does not offer."""
    if site.kind not in BRANCH:
        return
    verdict = branch_verdicts(hf, layers, site.layer)
    why = verdict[site.kind]
    if why is not None:
        ok = [Site(site.layer, k).name for k in KINDS if k in ("pre", "post") or verdict.get(k) is None]
        raise TPCHooksError(
            f"{site.name} is not offered for this {type(layers[site.layer]).__name__} ({toolkit}): "
            f"{why}; this layer offers {', '.join(ok)}"
        )
