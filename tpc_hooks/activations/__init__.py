"""Reading activations from a model: :func:`~tpc_hooks.collect` (pooled or per-token rows at any
site, through the adapters) and the :class:`~tpc_hooks.ActivationStore` it can write to disk.
"""

from ._collect import collect as collect
from ._collect import cost_line as cost_line
from ._collect import pooled_batches as pooled_batches
from ._collect import prompts_digest as prompts_digest
from ._collect import token_batches as token_batches
from ._store import ActivationStore as ActivationStore
