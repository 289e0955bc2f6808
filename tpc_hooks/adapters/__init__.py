"""Adapters between tpc-hooks and interpretability toolkits.

The adapter is chosen from the model's type; a toolkit module is imported only when a
model of that toolkit is passed in (so ``import tpc_hooks`` imports no toolkit).

Public here: :func:`get_adapter` (the adapter for a model), :class:`Adapter` (its interface:
``tokenize``, ``forward_sites``, ``decode``, ``observe``), :func:`parse_site` / :class:`Site`
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

from ._adapter import Adapter as Adapter
from ._adapter import get_adapter as get_adapter
from ._batching import pad as pad
from ._batching import pad_id as pad_id
from ._batching import positions as positions
from ._batching import resolve_bos as resolve_bos
from ._sites import Site as Site
from ._sites import parse_site as parse_site
from ._vllm_args import CONFIG as CONFIG
from ._vllm_args import FAN as FAN
from ._vllm_args import KEY as KEY
from ._vllm_args import OFF as OFF
from ._vllm_args import OPT_OUT as OPT_OUT
from ._vllm_args import RPC_ARM_SET as RPC_ARM_SET
from ._vllm_args import RPC_CONTRACT as RPC_CONTRACT
from ._vllm_args import RPC_REVIEW as RPC_REVIEW
from ._vllm_args import RPC_SET_SUMMARIES as RPC_SET_SUMMARIES
from ._vllm_args import RPC_SITES as RPC_SITES
from ._vllm_args import RPC_SWAP as RPC_SWAP
from ._vllm_args import STOP as STOP
from ._vllm_args import WORKER as WORKER
from ._vllm_args import disabled as disabled
from ._vllm_args import ident as ident
from ._vllm_args import keyed as keyed
from ._vllm_args import own_setting as own_setting
from ._vllm_args import pack as pack
from ._vllm_args import request_settings as request_settings
from ._vllm_args import unexposed as unexposed
from ._vllm_args import vllm_engine_args as vllm_engine_args
from ._vllm_args import worker_error as worker_error

__all__ = [
    "Adapter",
    "Site",
    "get_adapter",
    "pad",
    "pad_id",
    "parse_site",
    "positions",
    "resolve_bos",
    "vllm_engine_args",
]
