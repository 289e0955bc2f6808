"""Adapters between tpc-hooks and interpretability toolkits.

The adapter is chosen from the model's type; a toolkit module is imported only when a
model of that toolkit is passed in (so ``import tpc_hooks`` imports no toolkit).
"""

from .base import Adapter as Adapter
from .base import get_adapter as get_adapter
from .base import parse_site as parse_site
