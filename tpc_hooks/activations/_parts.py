"""What each part of a model writes into the residual stream up to a site, read in one forward pass:
the embedding, and every block's attention and MLP (or each attention head). The face:
:meth:`~tpc_hooks.adapters.Adapter.forward_parts`, which :meth:`~tpc_hooks.Monitor.explain` reads.

The residual stream at ``blocks.L.hook_resid_post`` is what entered the first block plus what every
block up to ``L`` added: ``h = embed + sum_l (attn_l + mlp_l)``. A block's parts are read as
differences of the stream around it, ``attn_l = mid_l - in_l`` and ``mlp_l = out_l - mid_l``
(``mid_l`` the stream between attention and MLP), so in float64 they sum to the site's activations
exactly, whatever the block does before it adds (a sandwich norm, a scaled branch). In a parallel
block (attention and MLP both read the block's input: GPT-J, GPT-NeoX) attention's part is its
branch's output and the MLP's the rest of what the block adds. A block that also rescales the
stream or adds a third term (Gemma 4's per-layer input and layer scalar) has it in its MLP part:
the part of a block read after its attention.

Per head (``heads=True``), attention's part is split at its output projection ``o = W_O x + b``:
head ``h`` carries ``g * (W_O[:, h] x_h)`` and the bias ``g * b`` is a part of its own, where ``g``
maps ``o`` into the stream for that pass: 1, a constant (Granite's residual multiplier) or a
normalisation's scale and weight (a norm after attention: Gemma, OLMo), each fitted on the pass
and checked. The MLP's part is then the rest of the block's, so the split stays exact.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError
from ._hf import ATTENTION, StopPass, branch_points, first, module_input, text_config, this_thread
from ._sites import Site

# the child of an attention-like module that projects its heads back into the stream
_PROJ = ("o_proj", "out_proj", "dense", "c_proj", "wo", "o")
# how many heads the mixer named so splits into (its output projection's input is heads x head width)
_HEADS = {
    "linear_attn": ("linear_num_value_heads",),
    "mamba": ("mamba_n_heads", "mamba_num_heads"),
    "mixer": ("mamba_n_heads", "mamba_num_heads", "num_attention_heads"),
}
_ATTN_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
_REL = 1e-3  # how far a fitted map may miss, relative to what it maps (float32 rounding is ~1e-6)


def inner(module: Any) -> Any:
    """The module a toolkit wraps (TransformerBridge keeps the Hugging Face one as
    ``_original_component``), or the module itself."""
    return getattr(module, "_original_component", module)


@dataclass
class Heads:
    """One attention layer's heads as they reached the stream in a pass: the output projection's
    input ``x [B, T, H * d_head]``, its weight ``W [d_model, H * d_head]`` and bias ``[d_model]``
    (or None), and ``gain``, what maps the projection's output into the stream (a float, or per
    position and coordinate ``[B, T, d_model]``)."""

    x: Tensor
    W: Tensor
    bias: Tensor | None
    n: int
    gain: Any = 1.0

    def columns(self, w: Tensor) -> Tensor:
        """Each head's (and the bias's) contribution ``[B, T, H (+1)]`` along weights ``w [B, T, D]``."""
        v = w * (self.gain if isinstance(self.gain, float) else self.gain.to(w))
        u = v @ self.W.to(w)  # [B, T, H * d_head]
        B, T, _ = u.shape
        cols = (self.x.to(w).view(B, T, self.n, -1) * u.view(B, T, self.n, -1)).sum(-1)
        if self.bias is not None:
            cols = torch.cat([cols, (v * self.bias.to(w)).sum(-1, keepdim=True)], -1)
        return cols


@dataclass
class Block:
    """What one block added to the stream in a pass: the stream entering it (``inp``), between its
    attention and MLP (``mid``; None in a parallel block), leaving it (``out``; None when the site
    comes before its MLP), attention's branch output as added (``attn``: a parallel block's, or the
    site's own at ``hook_attn_out``), and its heads."""

    layer: int
    inp: Tensor | None = None
    mid: Tensor | None = None
    out: Tensor | None = None
    attn: Tensor | None = None
    heads: Heads | None = None
    mlp_out: Tensor | None = None  # the MLP branch's output (the site hook_mlp_out)


def _dot(x: Tensor, w: Tensor) -> Tensor:
    return (x.to(w) * w).sum(-1, keepdim=True)


@dataclass
class StreamParts:
    """The parts of one batch's activations at a site, by model component.

    ``names`` (``"embed"``, ``"blocks.{li}.attn"`` or ``"blocks.{li}.attn.{h}"`` and
    ``"blocks.{li}.attn.bias"``, ``"blocks.{li}.mlp"``) in the order the model computes them;
    ``site`` ``[B, T, D]`` the site's activations as the model computed them;
    :meth:`contributions` each part's share of a linear form of the stream.
    """

    names: list[str]
    site: Tensor
    terms: list[Callable[[Tensor], Tensor]] = field(default_factory=list)

    def contributions(self, w: Tensor) -> Tensor:
        """``[B, T, C]`` float64: ``<part_c[b, t], w[b, t]>`` for each part ``c``, from weights
        ``w [B, T, D]``; summed over ``c`` it is ``<site[b, t], w[b, t]>`` (exact in float64 but
        for a head split's rounding, which goes to its block's MLP part)."""
        w = w.to(device=self.site.device, dtype=torch.float64)
        cols = torch.cat([term(w) for term in self.terms], -1)
        if cols.shape[-1] != len(self.names):
            raise AssertionError(f"{cols.shape[-1]} columns for {len(self.names)} parts")
        return cols

    def vectors(self) -> Tensor:
        """The parts themselves ``[B, T, C, D]`` float64 (memory: C times the site's): each part's
        contribution along every basis direction, for checks and for readers who want the vectors."""
        B, T, D = self.site.shape
        eye = torch.eye(D, dtype=torch.float64, device=self.site.device)
        out = torch.empty(B, T, len(self.names), D, dtype=torch.float64, device=self.site.device)
        for i in range(D):
            out[..., i] = self.contributions(eye[i].expand(B, T, D))
        return out


def assemble(site: Site, embed: Tensor | None, blocks: Sequence[Block], site_acts: Tensor) -> StreamParts:
    """The parts of ``site_acts`` from the streams read in a pass (:class:`Block` per layer up to
    the site; ``embed`` what entered the first block)."""
    names: list[str] = []
    terms: list[Callable[[Tensor], Tensor]] = []
    if site.kind in ("attn_out", "mlp_out"):  # a branch's output: one part (or its heads)
        (b,) = blocks
        if site.kind == "mlp_out":
            names.append(f"blocks.{b.layer}.mlp")
            terms.append(lambda w: _dot(site_acts, w))
        elif b.heads is None:
            names.append(f"blocks.{b.layer}.attn")
            terms.append(lambda w: _dot(site_acts, w))
        else:
            names += _head_names(b)
            terms.append(b.heads.columns)
        return StreamParts(names, site_acts, terms)
    assert embed is not None
    names.append("embed")
    terms.append(lambda w: _dot(embed, w))
    for b in blocks:
        names += _head_names(b) if b.heads is not None else [f"blocks.{b.layer}.attn"]
        if b.out is not None:
            names.append(f"blocks.{b.layer}.mlp")
        terms.append(_block_term(b))
    return StreamParts(names, site_acts, terms)


def _head_names(b: Block) -> list[str]:
    assert b.heads is not None
    names = [f"blocks.{b.layer}.attn.{h}" for h in range(b.heads.n)]
    return names + ([f"blocks.{b.layer}.attn.bias"] if b.heads.bias is not None else [])


def _block_term(b: Block) -> Callable[[Tensor], Tensor]:
    """Block ``b``'s columns: attention's part (or its heads), then the MLP's when the site is past it."""

    def attn_part(w: Tensor) -> Tensor:  # [B, T, 1]
        if b.mid is not None:
            assert b.inp is not None
            return _dot(b.mid.double() - b.inp.double(), w)
        assert b.attn is not None
        return _dot(b.attn, w)

    def term(w: Tensor) -> Tensor:
        cols = b.heads.columns(w) if b.heads is not None else attn_part(w)
        if b.out is None:
            return cols
        assert b.inp is not None
        whole = _dot(b.out.double() - b.inp.double(), w)  # everything the block added
        return torch.cat([cols, whole - cols.sum(-1, keepdim=True)], -1)

    return term


# ---------------------------------------------------------------------- checks of a pass's reading
def _close(a: Tensor, b: Tensor, *, scale: Tensor | None = None) -> bool:
    """``a`` and ``b`` agree to :data:`_REL` of ``a``'s size, plus the rounding of one addition to
    the stream (``scale``: the stream's own size)."""
    a, b = a.double(), b.double()
    tol = _REL * a.norm() + (0.0 if scale is None else 8 * torch.finfo(scale.dtype).eps * scale.double().norm())
    return bool((a - b).norm() <= tol + 1e-30)


def scalar_fit(target: Tensor, x: Tensor) -> float:
    """The number ``m`` that makes ``m * x`` closest to ``target`` (least squares; 1 for ``x == 0``)."""
    x2 = float((x.double() ** 2).sum())
    return 1.0 if x2 == 0 else float((target.double() * x.double()).sum()) / x2


def norm_gain(norm: Any, o: Tensor, y: Tensor, where: str) -> Tensor:
    """The map ``y = c_t * g * o`` of a normalisation after attention, for the pass that gave
    ``o -> y`` (``[B, T, D]``): ``g`` the norm's weight, read as the norm's output on a constant
    vector (RMS-normalising it leaves the weight), and ``c_t`` fitted per position. Returns
    ``c_t * g`` ``[B, T, D]`` float64; an error when ``y`` is no such map of ``o`` (a LayerNorm,
    which also centres)."""
    D = o.shape[-1]
    with torch.no_grad():
        probe = torch.full((1, 1, D), 1e3, dtype=o.dtype, device=o.device)
        g = first(norm(probe)).double().reshape(D)
    go = o.double() * g
    c = (y.double() * go).sum(-1, keepdim=True) / (go * go).sum(-1, keepdim=True).clamp_min(1e-300)
    gain = c * g
    if not _close(y, gain * o.double()):
        raise TPCHooksError(
            f"{where}: the normalisation after attention ({type(inner(norm)).__name__}) is not a scale per position "
            "times a weight, so its heads' parts are not linear given the pass; explain with heads=False"
        )
    return gain


# ---------------------------------------------------------------------- Hugging Face models
@dataclass
class _Seen:
    """What the hooks of one Hugging Face layer kept during a pass."""

    inp: Tensor | None = None
    mid: Tensor | None = None
    out: Tensor | None = None
    attn: Tensor | None = None  # the attention branch's output
    mlp: Tensor | None = None  # the MLP branch's output
    x: Tensor | None = None  # the output projection's input
    o: Tensor | None = None  # and its output
    attn_name: str = ""  # the layer's attention-like child
    parallel: bool | None = None  # settled once the stream between the branches is read (:func:`_settle`)
    m: float = 1.0  # what attention's output is multiplied by as it is added (Granite's residual multiplier)


def _projection(attn: Any, where: str) -> tuple[str, Any]:
    """The output projection of an attention-like module: its child named like one, with a 2-D weight."""
    kids = dict(inner(attn).named_children())
    for name in _PROJ:
        mod = kids.get(name)
        weight = getattr(inner(mod), "weight", None) if mod is not None else None
        if isinstance(weight, Tensor) and weight.dim() == 2:
            return name, mod
    raise TPCHooksError(
        f"{where}: {type(inner(attn)).__name__} has no output projection named {', '.join(_PROJ)}, so its heads "
        "cannot be split; explain with heads=False"
    )


def _proj_weight(proj: Any, n_in: int) -> tuple[Tensor, Tensor | None]:
    """``W [d_out, n_in]`` and bias of a projection (``nn.Linear``, or GPT-2's ``Conv1D`` whose weight is
    stored the other way round)."""
    mod = inner(proj)
    W = mod.weight.detach()
    if type(mod).__name__ == "Conv1D" or (W.shape[1] != n_in and W.shape[0] == n_in):
        W = W.T
    b = getattr(mod, "bias", None)
    return W, (b.detach() if isinstance(b, Tensor) else None)


def _n_heads(config: Any, attn_name: str, width: int, where: str) -> int:
    c = text_config(config)
    for name in _HEADS.get(attn_name, _ATTN_HEADS):
        n = getattr(c, name, None)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0 and width % n == 0:
            return n
    raise TPCHooksError(
        f"{where}: could not tell how the {width} inputs of its output projection split into heads (looked for "
        f"{', '.join(_HEADS.get(attn_name, _ATTN_HEADS))} in the config); explain with heads=False"
    )


def hf_parts(
    run: Callable[[], Any],
    layers: Any,
    site: Site,
    *,
    heads: bool,
    config: Any,
    model_name: str,
) -> StreamParts:
    """The parts of a Hugging Face model's stream at ``site`` from one forward pass ``run()`` (which
    the hooks end once the site is read): hooks on the decoder layers ``layers`` (a toolkit's wrappers
    are looked through, :func:`inner`) and, per block, where :func:`~tpc_hooks.activations._hf.branch_points`
    says its attention ends and its MLP starts."""
    L = site.layer
    full = range(L) if site.kind in ("pre", "mid") else range(L + 1) if site.kind == "post" else range(0)
    seen = {li: _Seen() for li in range(L + 1)}
    handles: list[Any] = []
    site_acts: dict[str, Tensor] = {}

    def keep(li: int, what: str, stop: bool = False) -> Callable[[Tensor], None]:
        def fn(t: Tensor) -> None:
            setattr(seen[li], what, t.detach())
            if what == "mid" and seen[li].attn is not None and seen[li].inp is not None:
                _settle(seen[li], f"layer {li} of {model_name}", branch_points(inner(layers[li]))["mid"][0], heads)
            if stop:
                site_acts["site"] = t.detach()
                raise StopPass

        return fn

    def pre(module: Any, fn: Callable[[Tensor], None]) -> None:
        handles.append(
            module.register_forward_pre_hook(this_thread(lambda m, a, k: fn(module_input(a, k))), with_kwargs=True)
        )

    def post(module: Any, fn: Callable[[Tensor], None], *, like_input: bool = False) -> None:
        def hook(m: Any, args: tuple, kwargs: dict, out: Any) -> None:
            t = first(out)
            if like_input:  # an MoE block that returns its rows flattened (Llama 4)
                given = module_input(args, kwargs)
                if t.shape != given.shape and t.numel() == given.numel():
                    t = t.view(given.shape)
            fn(t)

        handles.append(module.register_forward_hook(this_thread(hook), with_kwargs=True))

    def points(li: int) -> dict[str, tuple[str, bool]]:
        pts = branch_points(inner(layers[li]))
        if not pts:
            kids = ", ".join(n for n, _ in inner(layers[li]).named_children())
            raise TPCHooksError(
                f"explain reads what attention and the MLP of each block add; layer {li} of {model_name} "
                f"({type(inner(layers[li])).__name__}) has no child that reads as attention and MLP ({kids})"
            )
        return pts

    def watch_heads(li: int) -> None:
        kids = dict(inner(layers[li]).named_children())
        attn_name = next(n for n in ATTENTION if n in kids)
        _, proj = _projection(kids[attn_name], f"layer {li} of {model_name}")
        pre(proj, keep(li, "x"))
        post(proj, keep(li, "o"))
        seen[li].attn_name = attn_name

    try:
        if site.kind in ("attn_out", "mlp_out"):
            child, _ = points(L)[site.kind]
            layer = inner(layers[L])
            if site.kind == "attn_out" and heads:
                watch_heads(L)
            post(
                getattr(layer, child), keep(L, "attn" if site.kind == "attn_out" else "mlp", stop=True), like_input=True
            )
        else:
            pre(layers[0], keep(0, "inp", stop=site.kind == "pre" and L == 0))
            for li in full:
                pts = points(li)
                layer = inner(layers[li])
                if li > 0:
                    pre(layers[li], keep(li, "inp"))
                pre(getattr(layer, pts["mid"][0]), keep(li, "mid"))
                post(getattr(layer, pts["attn_out"][0]), keep(li, "attn"), like_input=True)
                post(layers[li], keep(li, "out", stop=site.kind == "post" and li == L))
                if heads:
                    watch_heads(li)
            if site.kind == "pre" and L > 0:
                pre(layers[L], keep(L, "inp", stop=True))
            if site.kind == "mid":
                pts = points(L)
                layer = inner(layers[L])
                if L > 0:
                    pre(layers[L], keep(L, "inp"))
                post(getattr(layer, pts["attn_out"][0]), keep(L, "attn"), like_input=True)
                if heads:
                    watch_heads(L)
                pre(getattr(layer, pts["mid"][0]), keep(L, "mid", stop=True))
        try:
            with torch.no_grad():
                run()
        except StopPass:
            pass
    finally:
        for h in handles:
            h.remove()
    if "site" not in site_acts:
        raise TPCHooksError(f"the hooks of {site.name} did not fire in {model_name}'s forward pass")
    return _hf_blocks(site, seen, full, layers, heads, config, model_name, site_acts["site"])


def _hf_blocks(
    site: Site,
    seen: dict[int, _Seen],
    full: range,
    layers: Any,
    heads: bool,
    config: Any,
    model_name: str,
    site_acts: Tensor,
) -> StreamParts:
    L = site.layer
    if site.kind in ("attn_out", "mlp_out"):
        b = Block(L)
        if site.kind == "attn_out" and heads:
            s = seen[L]
            b.heads = _hf_heads(s, s.attn, layers[L], config, f"layer {L} of {model_name}", site_acts)
        return assemble(site, None, [b], site_acts)
    blocks = []
    embed = seen[0].inp
    for li in [*full, *([L] if site.kind == "mid" else [])]:
        s = seen[li]
        where = f"layer {li} of {model_name}"
        before = seen[li - 1].out if li > 0 else None
        if s.inp is not None and before is not None and not torch.equal(s.inp, before):
            raise TPCHooksError(
                f"{where}: the stream entering it is not what layer {li - 1} left (something runs between the decoder "
                "layers), so the blocks' parts would not add up to the site; explain does not support this model"
            )
        assert s.inp is not None and s.mid is not None
        if s.parallel is None:  # the MLP's norm ran before attention returned: settled now
            _settle(s, where, branch_points(inner(layers[li]))["mid"][0], heads)
        parallel, m = bool(s.parallel), s.m
        b = Block(li, inp=s.inp, out=s.out if li in full else None)
        if parallel:
            if site.kind == "mid" and li == L:
                raise TPCHooksError(f"{site.name}: {where} is a parallel block, with no stream between its branches")
            b.attn = s.attn
        else:
            b.mid = s.mid
        if heads:
            assert s.attn is not None
            target = s.attn.double() * m
            b.heads = _hf_heads(s, target, layers[li], config, where, s.mid if not parallel else s.inp)
        blocks.append(b)
    return assemble(site, embed, blocks, site_acts)


def _settle(s: _Seen, where: str, mid_child: str, heads: bool) -> None:
    """Whether the block is parallel (the stream read between the branches is its input) and, if not, the
    multiplier ``m`` with ``mid = inp + m * attn``, checked; attention's output is then dropped unless a
    parallel block or the heads' split still need it (so a pass keeps two streams per block, not three)."""
    assert s.inp is not None and s.mid is not None and s.attn is not None
    s.parallel = torch.equal(s.mid, s.inp)  # the MLP reads the block's input: attention added nothing before it
    if s.parallel:
        return
    s.m = scalar_fit(s.mid - s.inp.double(), s.attn)
    if not _close(s.mid.double() - s.inp.double(), s.m * s.attn.double(), scale=s.mid):
        raise TPCHooksError(
            f"{where}: the stream read between attention and MLP (the input of its {mid_child}) is not the block's "
            "input plus what attention returns, so explain cannot tell attention's part from the MLP's in this block"
        )
    if not heads:
        s.attn = None


def _hf_heads(s: _Seen, target: Tensor | None, layer: Any, config: Any, where: str, stream: Tensor) -> Heads:
    """Layer's heads from the output projection's input and output seen in the pass, mapped to
    ``target`` (what attention added to the stream) and checked against it."""
    assert s.x is not None and s.o is not None and target is not None
    attn_name = s.attn_name
    n_in = s.x.shape[-1]
    proj_name, proj = _projection(getattr(inner(layer), attn_name), where)
    W, bias = _proj_weight(proj, n_in)
    o = s.x.double() @ W.double().T + (0 if bias is None else bias.double())
    if o.shape != s.o.shape or not _close(s.o, o):
        raise TPCHooksError(
            f"{where}: {type(inner(proj)).__name__} {attn_name}.{proj_name} is not a linear map of its input (or "
            "returns something else), so its heads cannot be split; explain with heads=False"
        )
    n = _n_heads(config, attn_name, n_in, where)
    points = branch_points(inner(layer))
    child = points["attn_out"][0]
    gain: Any
    if child != attn_name:  # a normalisation after attention (Gemma, OLMo): its scale per position, held fixed
        norm_gain_ = norm_gain(getattr(inner(layer), child), s.o, s.attn if s.attn is not None else target, where)
        m = scalar_fit(target, s.attn) if s.attn is not None else 1.0
        gain = norm_gain_ * m
    else:
        m = scalar_fit(target, o)
        gain = 1.0 if math.isclose(m, 1.0, rel_tol=1e-6) else m
    mapped = o * (gain if isinstance(gain, float) else gain)
    if not _close(target, mapped, scale=stream):
        raise TPCHooksError(
            f"{where}: what attention adds to the stream is not a fixed map of its output projection's, so its "
            "heads' parts are not linear given the pass; explain with heads=False"
        )
    return Heads(s.x, W, bias, n, gain if isinstance(gain, float) else gain.float())
