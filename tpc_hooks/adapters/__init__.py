"""Adapters between tpc-hooks and interpretability toolkits.

The adapter is chosen from the model's type; a toolkit module is imported only when a
model of that toolkit is passed in (so ``import tpc_hooks`` imports no toolkit).

The folder holds one module per toolkit (``transformer_lens``, ``nnsight``, ``transformers``) and
``vllm/``, everything tpc-hooks runs with vLLM, split by process: the wire between them
(``_wire``), the driver's adapter (``vllm/__init__``), the worker (``worker/``), ``tpc-hooks serve``
(``server/``) and the declared surface of vLLM it relies on (``contract/``). What every adapter
shares (the interface, the registry that finds a model's adapter by its type, sites, batching)
lives in ``tpc_hooks.activations``; the registry imports a toolkit's module by name, when a model
of that toolkit arrives.

Public here: :func:`get_adapter` (the adapter for a model), :class:`Adapter` (its interface:
``tokenize``, ``forward_sites``, ``forward_parts``, ``decode``, ``observe``), :class:`StreamParts` (what
``forward_parts`` reads: each model part's share of a site's activations), :func:`parse_site` / :class:`Site`
(TransformerLens hook names), and the batching helpers :func:`pad` (left or right padding
with an attention mask), :func:`pad_id`, :func:`positions` (position ids from a mask) and
:func:`resolve_bos`.

Example:
    >>> from tpc_hooks.adapters import pad, parse_site
    >>> ids, mask = pad([[5, 6, 7], [8]], pad_token=0, side="left")
    >>> ids.tolist(), mask.tolist()
    ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    >>> parse_site("blocks.6.hook_resid_post").layer
    6
"""

from ..activations import Adapter as Adapter
from ..activations import Site as Site
from ..activations import StreamParts as StreamParts
from ..activations import get_adapter as get_adapter
from ..activations import pad as pad
from ..activations import pad_id as pad_id
from ..activations import parse_site as parse_site
from ..activations import positions as positions
from ..activations import resolve_bos as resolve_bos
from ._sae_lens import read_sae as read_sae
from .vllm import vllm_engine_args as vllm_engine_args

__all__ = [
    "Adapter",
    "Site",
    "StreamParts",
    "get_adapter",
    "pad",
    "pad_id",
    "parse_site",
    "positions",
    "resolve_bos",
    "vllm_engine_args",
]
