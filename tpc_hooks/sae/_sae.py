"""SAE features (SAELens): encode activations into latents, identify an SAE, read its decoder.

Works on the SAE object the user passes (``encode``, ``W_dec``, ``b_dec``, ``cfg``); this module
never imports ``sae_lens``, which stays an optional extra.
"""

import hashlib
from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError


def _cfg(sae: Any, key: str, default: Any = None) -> Any:
    cfg = getattr(sae, "cfg", None)
    if cfg is None:
        return default
    if hasattr(cfg, key):
        return getattr(cfg, key)
    meta = getattr(cfg, "metadata", None)
    if meta is not None:
        try:
            return meta[key] if key in meta else getattr(meta, key, default)
        except TypeError:
            return getattr(meta, key, default)
    return default


def dims(sae: Any) -> tuple[int, int]:
    """``(d_in, d_sae)`` of an SAE."""
    if not hasattr(sae, "encode") or not hasattr(sae, "W_dec"):
        raise TPCHooksError(f"expected an SAELens SAE (with encode() and W_dec); got {type(sae).__name__}")
    d_sae, d_in = sae.W_dec.shape
    return int(d_in), int(d_sae)


def check_sae(sae: Any, d_in: int, site: str | None) -> None:
    """Checks an SAE against the activations it will read (width, and hook name if recorded)."""
    sae_in, _ = dims(sae)
    if sae_in != d_in:
        raise TPCHooksError(
            f"the SAE reads d_in={sae_in} but the site has d_model={d_in}; is it an SAE for another model?"
        )
    hook = _cfg(sae, "hook_name")
    if site is not None and hook and hook != site:
        raise TPCHooksError(f"the SAE was trained on {hook!r}, not {site!r}; pass the SAE for that site")


def decoder(sae: Any) -> tuple[Tensor, Tensor]:
    """``(W_dec [d_sae, d_in], b_dec [d_in])``; refuses SAEs whose decode is not that affine map."""
    for key in ("normalize_activations", "reshape_activations"):
        v = _cfg(sae, key)
        if v not in (None, "none"):
            raise TPCHooksError(f"projection needs decode(f) = f @ W_dec + b_dec; this SAE has {key}={v!r}")
    return sae.W_dec.detach().cpu(), sae.b_dec.detach().cpu()


def encoder(sae: Any) -> tuple[Tensor, Tensor]:
    """``(W_enc [d_in, d_sae], b [d_sae])`` with the SAE's pre-activations ``x @ W_enc + b`` (its decoder
    bias taken from the input folded into ``b``); refuses SAEs whose input is normalised or reshaped first."""
    for key in ("normalize_activations", "reshape_activations"):
        v = _cfg(sae, key)
        if v not in (None, "none"):
            raise TPCHooksError(f"the encoder is not an affine map of the input; this SAE has {key}={v!r}")
    W, b = sae.W_enc.detach(), sae.b_enc.detach()
    if _cfg(sae, "apply_b_dec_to_input", False):
        b = b - sae.b_dec.detach() @ W
    return W, b


def through_encoder(sae: Any, acts: Tensor, feats: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """Weights ``w [B, T, d_sae]`` on an SAE's latents as weights on the model's activations ``[B, T, D]``,
    and each position's share carried by the encoder's own bias ``[B, T]``: a latent the SAE leaves on is
    its pre-activation ``x @ W_enc + b`` (ReLU, JumpReLU, TopK), so with the pass's active latents held
    fixed, ``<f_t, w_t> = <x_t, W_enc (on_t * w_t)> + <on_t * b, w_t>``. Checked on the pass: an SAE
    whose active latents are not their pre-activations (a gated SAE, a normalised input) is refused."""
    try:
        W, b = encoder(sae)
    except TPCHooksError as err:
        raise TPCHooksError(f"explain splits an SAE monitor through its encoder: {err}") from None
    W, b = W.to(acts.device, torch.float64), b.to(acts.device, torch.float64)
    pre = acts.double() @ W + b
    on = feats != 0
    f = feats.double()
    if not bool(((f - pre).abs() * on).max() <= 1e-4 * pre.abs().max() + 1e-6):
        raise TPCHooksError(
            f"{type(sae).__name__}'s active latents are not their pre-activations x @ W_enc + b_enc (a gated SAE?), "
            "so its latents are not linear in the stream given the pass; explain supports ReLU, JumpReLU and "
            "TopK SAEs. Its decision by SAE feature: tpc.attribute(monitor, acts)"
        )
    wd = w.double() * on
    return wd @ W.T, (wd * b).sum(-1)


@torch.no_grad()
def encode(sae: Any, acts: Tensor) -> Tensor:
    """SAE latents of activations ``[..., d_in]`` (float32, or float64 for float64 input; on the
    activations' device)."""
    p = next(sae.parameters())
    out = torch.float64 if acts.dtype == torch.float64 else torch.float32
    return sae.encode(acts.to(device=p.device, dtype=p.dtype)).to(device=acts.device, dtype=out)


def identity(sae: Any) -> dict[str, Any]:
    """What identifies an SAE: class, sizes, recorded release/id/hook, and a hash of its weights."""
    d_in, d_sae = dims(sae)
    h = hashlib.sha256()
    for name, t in sorted(sae.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().float().contiguous().numpy().tobytes())
    return {
        "class": type(sae).__name__,
        "d_in": d_in,
        "d_sae": d_sae,
        "release": _cfg(sae, "release"),
        "sae_id": _cfg(sae, "sae_id"),
        "hook_name": _cfg(sae, "hook_name"),
        "weights_sha256": h.hexdigest(),
    }


def describe(ident: dict[str, Any]) -> str:
    """An SAE's recorded identity in a few words, for messages."""
    name = "/".join(str(v) for v in (ident.get("release"), ident.get("sae_id")) if v) or ident.get("class", "SAE")
    return f"{name} (d_sae={ident.get('d_sae')}, weights {str(ident.get('weights_sha256'))[:12]})"
