"""TransformerLens adapter: ``HookedTransformer`` (3.x) and ``TransformerBridge`` (3.x, 4.x).

Hooks are attached with the model's own ``model.hooks(...)`` context manager, which removes
them in ``finally``; the monitor's hook only stores the tensor and returns None (a hook
that returns a value would replace the activation).

Generation: ``HookedTransformer`` runs a manual loop over its own forward with
``TransformerLensKeyValueCache`` and an explicit attention mask (its ``generate`` computes wrong
positions for models with learned absolute position embeddings under the KV cache). The
bridge's hook points live inside the rewired Hugging Face layers, so it uses the shared
Hugging Face decode loop of :class:`~tpc_hooks.adapters.Adapter`.
"""

import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .._errors import TPCHooksError
from ..activations import (
    BRANCH,
    KINDS,
    Adapter,
    Block,
    Heads,
    InputSpy,
    Site,
    StreamParts,
    assemble,
    decoder_layers,
    find_layers,
    hf_parts,
    hook_name,
    judge_branches,
    norm_gain,
    positions,
    scalar_fit,
    this_thread,
)

__all__ = ["TransformerLensAdapter", "make_adapter"]


_BRIDGE_VERDICTS: "weakref.WeakKeyDictionary[Any, dict[str, str | None]]" = weakref.WeakKeyDictionary()


class _Capture:
    """Forward hooks that keep the last tensor seen at each site and change nothing.

    Keyed by our site name, not ``hook.name``: the bridge reports aliases
    (``blocks.L.hook_out`` for ``blocks.L.hook_resid_post``).
    """

    def __init__(self):
        self.seen: dict[str, Tensor] = {}

    def hook(self, key: str) -> Callable[[Tensor, Any], None]:
        def keep(tensor: Tensor, hook: Any) -> None:
            self.seen[key] = tensor.detach()

        return keep

    def take(self, key: str) -> Tensor:
        if key not in self.seen:
            raise TPCHooksError(f"the hook at {key} did not fire; is the site valid for this model?")
        return self.seen.pop(key)


class BridgeRefusal(NamedTuple):
    """Why the bridge is refused on a family, and which releases lift it."""

    why: str
    fixed_in: int | None = None  # the first TransformerLens major version that runs it right (None: none yet)
    transformers_from: tuple[int, int] | None = None  # refused only from this transformers release on


# Families TransformerBridge loads but does not run as the model does, by Hugging Face model_type (measured
# on tiny random checkpoints, tests/test_families.py). The adapter refuses them rather than score wrong rows.
_GDN = (
    "TransformerLens 3's gated delta net bridge reads causal_conv1d_fn from the layer, which transformers "
    "5.24 no longer sets (AttributeError in the forward); TransformerLens 4, or transformers < 5.24, runs it"
)
BRIDGE_REFUSED: dict[str, BridgeRefusal] = {
    "deepseek_v3": BridgeRefusal(
        "the bridge's residual stream differs from the model's own hidden states (MLA "
        "attention: up to 5e-3 apart where float32 rounding gives 1e-6; TransformerLens 4 "
        "runs it right)",
        fixed_in=4,
    ),
    "granitemoehybrid": BridgeRefusal(
        'the bridge\'s forward fails on this hybrid ("Original component not set for model.rotary_emb")'
    ),
    **dict.fromkeys(
        ("qwen3_5", "qwen3_5_text", "qwen3_next"), BridgeRefusal(_GDN, fixed_in=4, transformers_from=(5, 24))
    ),
}


def _major_minor(package: str) -> tuple[int, int] | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = version(package).split(".")[:2]
        return int(major), int(minor)
    except (PackageNotFoundError, ValueError):
        return None


def bridge_refusal(model_type: str | None) -> str | None:
    """Why the installed TransformerLens' bridge is refused for ``model_type`` (None: it is not)."""
    if model_type not in BRIDGE_REFUSED:
        return None
    rule = BRIDGE_REFUSED[model_type]
    tl = _major_minor("transformer-lens")
    if rule.fixed_in is not None and tl is not None and tl[0] >= rule.fixed_in:
        return None
    hf = _major_minor("transformers")
    if rule.transformers_from is not None and hf is not None and hf < rule.transformers_from:
        return None
    return rule.why


class TransformerLensAdapter(Adapter):
    toolkit = "TransformerLens"

    def __init__(self, model: Any):
        super().__init__(model)
        self.is_bridge = not any(c.__name__ == "HookedTransformer" for c in type(model).__mro__)
        if getattr(model, "tokenizer", None) is None:
            raise TPCHooksError("this TransformerLens model has no tokenizer; pass tokenizer= when loading it")
        if self.is_bridge:
            mtype = getattr(getattr(getattr(model, "original_model", None), "config", None), "model_type", None)
            why = bridge_refusal(mtype)
            if why is not None:
                raise TPCHooksError(
                    f"TransformerBridge on model_type {mtype!r}: {why}; monitor the "
                    "same checkpoint through the transformers or nnsight adapter (pass the Hugging Face "
                    "model, or nnsight's LanguageModel of it)"
                )

    def site(self, name: str) -> Site:
        """:meth:`Adapter.site`, and a check that this block offers it: TransformerLens has the
        hook (a parallel attention/MLP block has no ``hook_resid_mid``), and on a bridge, whose
        branch hooks alias the Hugging Face modules, that they add up (:meth:`_bridge_verdicts`)."""
        s = super().site(name)
        why = self._why_not(s.layer, s.kind)
        if why is not None:
            ok = [Site(s.layer, k).name for k in KINDS if self._why_not(s.layer, k) is None]
            raise TPCHooksError(
                f"{s.name} is not offered on this {type(self.model).__name__}'s block {s.layer}: {why}; "
                f"block {s.layer} offers {', '.join(ok) or 'none of the five block sites'}"
            )
        return s

    def _why_not(self, layer: int, kind: str) -> str | None:
        hooks = getattr(self.model, "hook_dict", None)
        if hooks is not None and Site(layer, kind).name not in hooks:
            return f"it has no {hook_name(kind)}"
        if self.is_bridge and kind in BRANCH:
            return self._bridge_verdicts(layer)[kind]
        return None

    def _bridge_verdicts(self, layer: int) -> dict[str, str | None]:
        """The bridge's branch hooks of block ``layer`` checked as the Hugging Face adapters check
        theirs (:func:`~tpc_hooks.activations._hf.branch_verdicts`): on a pass of four tokens,
        ``resid_pre + attn_out = resid_mid`` and ``resid_mid + mlp_out = resid_post`` (a Gemma 4
        block, which also adds per-layer inputs, has no such ``hook_mlp_out``)."""
        block = self.model.blocks[layer]
        if block not in _BRIDGE_VERDICTS:
            cap = _Capture()
            names = {k: Site(layer, k).name for k in KINDS if Site(layer, k).name in self.model.hook_dict}
            ids = torch.arange(1, 5, device=self.device)[None]
            with torch.no_grad(), self.model.hooks(fwd_hooks=[(n, this_thread(cap.hook(n))) for n in names.values()]):
                self._forward(ids, torch.ones_like(ids), stop_at_layer=layer + 1 if layer + 1 < self.n_layers else None)
            _BRIDGE_VERDICTS[block] = judge_branches(
                {k: cap.take(n) for k, n in names.items()}, {k: hook_name(k) for k in BRANCH}
            )
        return _BRIDGE_VERDICTS[block]

    @property
    def d_model(self) -> int:
        return int(self.model.cfg.d_model)

    @property
    def n_layers(self) -> int:
        return int(self.model.cfg.n_layers)

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    @property
    def model_name(self) -> str:
        return str(getattr(self.model.cfg, "model_name", "") or type(self.model).__name__)

    def _forward(self, ids: Tensor, mask: Tensor, **kw: Any) -> Tensor:
        if self.is_bridge:
            # the bridge runs the Hugging Face model, which needs positions counted from the mask
            kw.setdefault("position_ids", positions(mask)[:, -ids.shape[1] :])
        return self.model(ids, attention_mask=mask, **kw)

    @torch.no_grad()
    def forward_sites(self, input_ids: Tensor, attention_mask: Tensor, sites: list[Site]) -> dict[str, Tensor]:
        cap = _Capture()
        stop = max(s.layer for s in sites) + 1
        ids, mask = input_ids.to(self.device), attention_mask.to(self.device)
        with self.model.hooks(fwd_hooks=[(s.name, this_thread(cap.hook(s.name))) for s in sites]):
            self._forward(ids, mask, stop_at_layer=stop if stop < self.n_layers else None)
        return {s.name: cap.take(s.name) for s in sites}

    def hf_model(self) -> Any:
        return self.model.original_model if self.is_bridge else None

    @torch.no_grad()
    def forward_parts(
        self, input_ids: Tensor, attention_mask: Tensor, site: Site, *, heads: bool = False
    ) -> StreamParts:
        """The parts of the stream at ``site`` (see :meth:`Adapter.forward_parts`). A bridge is read at
        the Hugging Face modules it wraps, through its own forward; a ``HookedTransformer`` at its own
        hook points: ``hook_resid_pre``, ``hook_resid_mid`` and ``hook_resid_post`` around each block
        (``hook_attn_out`` in a parallel block), and ``attn.hook_z`` with ``W_O``, ``b_O`` per head."""
        ids, mask = input_ids.to(self.device), attention_mask.to(self.device)
        if self.is_bridge:
            hf = self.model.original_model
            return hf_parts(
                lambda: self._forward(ids, mask),
                decoder_layers(hf, find_layers(hf, self.toolkit)),
                site,
                heads=heads,
                config=hf.config,
                model_name=self.model_name,
            )
        return self._hooked_parts(ids, mask, site, heads)

    def _hooked_parts(self, ids: Tensor, mask: Tensor, site: Site, heads: bool) -> StreamParts:
        L, kind = site.layer, site.kind
        full = range(L) if kind in ("pre", "mid") else range(L + 1) if kind == "post" else range(0)
        upto = [*full, *([L] if kind in ("mid", "attn_out", "mlp_out") else [])]
        hooks = self.model.hook_dict
        names = ["blocks.0.hook_resid_pre", site.name]
        for li in upto:
            names += [
                f"blocks.{li}.{h}" for h in ("hook_resid_pre", "hook_resid_mid", "hook_attn_out", "hook_resid_post")
            ]
            if heads:
                names.append(f"blocks.{li}.attn.hook_z")
        cap = _Capture()
        wanted = [n for n in dict.fromkeys(names) if n in hooks]
        with self.model.hooks(fwd_hooks=[(n, this_thread(cap.hook(n))) for n in wanted]):
            self._forward(ids, mask, stop_at_layer=L + 1 if L + 1 < self.n_layers else None)
        seen = cap.seen
        where = self.model_name
        blocks = []
        for li in upto:
            b = Block(li)
            branch = seen[f"blocks.{li}.hook_attn_out"] if kind != "mlp_out" else seen[site.name]
            if kind in ("attn_out", "mlp_out"):
                target = branch.double()
            else:
                b.inp = seen[f"blocks.{li}.hook_resid_pre"]
                b.out = seen[f"blocks.{li}.hook_resid_post"] if li in full else None
                b.mid = seen.get(f"blocks.{li}.hook_resid_mid")
                if b.mid is None:  # a parallel block: attention's part is its branch
                    b.attn = branch
                target = branch.double() if b.mid is None else b.mid.double() - b.inp.double()
            if heads and kind != "mlp_out":
                b.heads = self._heads(li, seen[f"blocks.{li}.attn.hook_z"], branch, target, f"block {li} of {where}")
            blocks.append(b)
        embed = seen.get("blocks.0.hook_resid_pre") if kind not in ("attn_out", "mlp_out") else None
        return assemble(site, embed, blocks, seen[site.name])

    def _heads(self, li: int, z: Tensor, branch: Tensor, target: Tensor, where: str) -> Heads:
        """Block ``li``'s heads from ``hook_z`` ``[B, T, H, d_head]`` and ``W_O``, ``b_O``: what attention
        adds (``target``) is their sum times 1, or a normalisation's scale per position (``ln1_post``)."""
        attn = self.model.blocks[li].attn
        B, T, H, dh = z.shape
        W = attn.W_O.detach().reshape(H * dh, -1).T  # [d_model, H * d_head]
        bias = getattr(attn, "b_O", None)
        x = z.reshape(B, T, H * dh)
        o = x.double() @ W.double().T + (0 if bias is None else bias.detach().double())
        post = getattr(self.model.blocks[li], "ln1_post", None)
        gain: Any = norm_gain(post, o, branch, where) if post is not None else scalar_fit(target, o)
        if isinstance(gain, float) and abs(gain - 1) < 1e-6:
            gain = 1.0
        return Heads(
            x, W, None if bias is None else bias.detach(), H, gain if isinstance(gain, float) else gain.float()
        )

    @torch.no_grad()
    def decode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        site: Site | Sequence[Site] | None,
        max_new_tokens: int,
        on_step: Callable[[Any, Tensor, Tensor], Any],
    ) -> None:
        """The bridge uses the shared Hugging Face loop (its hook points live in the rewired HF
        layers, so they fire); HookedTransformer runs its own forward with
        ``TransformerLensKeyValueCache`` and an explicit mask, its last pass stopping after the
        (deepest) site's block (see :meth:`Adapter.decode`)."""
        if self.is_bridge:
            return super().decode(input_ids, attention_mask, site, max_new_tokens, on_step)
        from transformer_lens import TransformerLensKeyValueCache

        cap = _Capture()
        ids, step_mask = input_ids.to(self.device), attention_mask.to(self.device)
        sites = [site] if isinstance(site, Site) else list(dict.fromkeys(site or ()))  # none: the unmonitored baseline
        names = [s.name for s in sites]
        deepest = max((s.layer for s in sites), default=0)
        logits = None

        def acts() -> Any:
            if not sites:
                return None
            return cap.take(names[0]) if isinstance(site, Site) else {n: cap.take(n) for n in names}

        with self.model.hooks(fwd_hooks=[(n, this_thread(cap.hook(n))) for n in names]):
            cache = TransformerLensKeyValueCache.init_cache(self.model.cfg, self.device, ids.shape[0])
            for i in range(max_new_tokens + 1):
                # the cache keeps the mask of every earlier step; each call passes only its own
                if i < max_new_tokens or i == 0:
                    logits = self.model(ids, attention_mask=step_mask, past_kv_cache=cache)[:, -1]
                elif sites:  # the last token is fed only to be scored: up to the deepest site's block
                    self.model(ids, attention_mask=step_mask, past_kv_cache=cache, stop_at_layer=deepest + 1)
                assert logits is not None  # the first pass sets it
                nxt = on_step(acts(), step_mask, logits)
                if nxt is None:
                    return
                tokens, live = nxt
                ids = tokens.to(self.device)[:, None]
                step_mask = live.long()[:, None].to(self.device)

    @contextmanager
    def observe(self, site: Site, fn: Callable[[Tensor, Tensor, bool], None]) -> Iterator[None]:
        spy = InputSpy()
        top = getattr(self.model, "original_model", None) if self.is_bridge else self.model
        assert top is not None  # a bridge wraps its Hugging Face model
        handle = top.register_forward_pre_hook(this_thread(spy), with_kwargs=True)

        def on_acts(tensor: Tensor, hook: Any) -> None:
            mask, fresh = spy.step(tensor.shape[1], tensor.shape[0], tensor.device)
            fn(tensor.detach(), mask, fresh)

        try:
            with self.model.hooks(fwd_hooks=[(site.name, this_thread(on_acts))]):
                yield
        finally:
            handle.remove()


def make_adapter(model: Any) -> TransformerLensAdapter:
    return TransformerLensAdapter(model)
