"""The Hugging Face decode loop: a causal LM run one token per forward pass with its KV cache."""

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError
from ._batching import positions
from ._hf import StopPass, cache_dropped, cache_kwarg
from ._sites import Site


def hf_decode(
    adapter: Any,
    hf: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    site: Site | Sequence[Site] | None,
    max_new_tokens: int,
    on_step: Any,
) -> None:
    """The default :meth:`~tpc_hooks.adapters.Adapter.decode` (documented there): ``adapter``'s
    underlying Hugging Face model ``hf`` driven directly, the sites read through ``adapter.observe_sites``."""
    from transformers import DynamicCache

    seen: dict[str, Any] = {"last": False}
    sites = [site] if isinstance(site, Site) else list(site or ())

    def read(acts: dict[str, Tensor], m: Tensor, fresh: bool) -> None:
        seen["acts"] = acts[site.name] if isinstance(site, Site) else acts
        if seen["last"]:  # nothing after the deepest site is needed: end the pass here
            raise StopPass

    watch = adapter.observe_sites(sites, read) if sites else nullcontext()
    # no padding, known on the host without reading the device: like HF generate, pass no mask (the model
    # then checks none per step, a sync on a GPU); a row that ends is fed padding nobody reads
    unpadded = attention_mask.device.type == "cpu" and bool(attention_mask.all())
    ids, mask = input_ids.to(adapter.device), attention_mask.to(adapter.device)
    step_mask = mask
    logits: Tensor | None = None
    cached = 0  # positions already in the cache
    with watch:
        cache, cache_name = _cache(DynamicCache, hf), cache_kwarg(hf)
        for i in range(max_new_tokens + 1):
            seen["last"] = i == max_new_tokens and i > 0
            n = ids.shape[1]
            if unpadded:
                kw = {"position_ids": torch.arange(cached, cached + n, device=adapter.device).expand(ids.shape[0], n)}
            else:
                kw = {"attention_mask": mask, "position_ids": positions(mask)[:, -n:]}
            cached += n
            if not (seen["last"] and not sites):
                try:
                    out = hf(input_ids=ids, **kw, **{cache_name: cache}, use_cache=True, logits_to_keep=1)
                    logits = out.logits[:, -1]
                    _check_cache(cache, cached)
                except StopPass:
                    pass
            acts = seen.pop("acts", None)
            if sites and acts is None:
                raise TPCHooksError(
                    f"the hook at {max(sites, key=lambda s: s.depth).name} did not fire; is the site "
                    "valid for this model?"
                )
            nxt = on_step(acts, step_mask, logits)
            if nxt is None:
                return
            tokens, live = nxt
            ids = tokens.to(adapter.device)[:, None]
            step_mask = live.long()[:, None].to(adapter.device)
            if not unpadded:
                mask = torch.cat([mask, step_mask], dim=1)


def _cache(cls: Any, hf: Any) -> Any:
    """A KV cache whose layers are the model's kinds (sliding-window, linear-attention and
    state-space layers keep their own state), from its config; transformers before the
    per-layer caches (< 4.56) take no config and have no such layers."""
    try:
        return cls(config=hf.config)
    except TypeError:
        return cls()


def _check_cache(cache: Any, fed: int) -> None:
    """A full pass must leave every position fed so far in the KV cache (a shape, read on the
    host: no device sync). A cache that does not grow means the model ran each step without the
    earlier tokens, and every step score after the first would be wrong: refused, with the fix."""
    held = int(cache.get_seq_length())
    if held < fed:
        raise TPCHooksError(cache_dropped(held, fed, "the next decode step"))
