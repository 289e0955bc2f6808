"""Reading activations from a model: :func:`~tpc_hooks.collect` (pooled or per-token rows at any
site, through the adapters) and the :class:`~tpc_hooks.ActivationStore` it can write to disk; and
what every toolkit's adapter shares: the interface (:class:`~tpc_hooks.adapters.Adapter`), the
registry that finds a model's adapter (:func:`~tpc_hooks.adapters.get_adapter`, which imports the
toolkit's module under ``tpc_hooks.adapters`` by name), the site grammar, batching and the Hugging
Face decode loop (the public face of these: :mod:`tpc_hooks.adapters`).
"""

from ._adapter import Adapter as Adapter
from ._adapter import get_adapter as get_adapter
from ._batching import pad as pad
from ._batching import pad_id as pad_id
from ._batching import positions as positions
from ._batching import resolve_bos as resolve_bos
from ._collect import collect as collect
from ._collect import cost_line as cost_line
from ._collect import from_start as from_start
from ._collect import pooled_batches as pooled_batches
from ._collect import prompts_digest as prompts_digest
from ._collect import token_batches as token_batches
from ._hf import BRANCH as BRANCH
from ._hf import LAYERS as LAYERS
from ._hf import HFShape as HFShape
from ._hf import InputSpy as InputSpy
from ._hf import StopPass as StopPass
from ._hf import branch_points as branch_points
from ._hf import check_site as check_site
from ._hf import decoder_layers as decoder_layers
from ._hf import find_layers as find_layers
from ._hf import first as first
from ._hf import hook_site as hook_site
from ._hf import judge_branches as judge_branches
from ._hf import lm_head as lm_head
from ._hf import observe_layers as observe_layers
from ._hf import this_thread as this_thread
from ._parts import Block as Block
from ._parts import Heads as Heads
from ._parts import StreamParts as StreamParts
from ._parts import assemble as assemble
from ._parts import hf_parts as hf_parts
from ._parts import norm_gain as norm_gain
from ._parts import scalar_fit as scalar_fit
from ._sites import KINDS as KINDS
from ._sites import Site as Site
from ._sites import hook_name as hook_name
from ._sites import parse_site as parse_site
from ._store import ActivationStore as ActivationStore
