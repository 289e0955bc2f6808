"""Training recipes as named presets, for :func:`tpc_hooks.train_monitor` and :class:`tpc_hooks.FitConfig`.

``tpc.recipes.default()`` is the floor (at its threshold it catches what a linear probe on the same
prompts catches); ``phrasing()``, ``intent()``, ``in_distribution()`` and ``paper()`` are opt-ins, each
with its price measured in docs/benchmarks/constructions.md.

Example:
    >>> import tpc_hooks as tpc
    >>> [r().name for r in (tpc.recipes.default, tpc.recipes.intent, tpc.recipes.paper)]
    ['default', 'intent', 'paper']
"""

from ._recipes import NAMES as NAMES
from ._recipes import Recipe as Recipe
from ._recipes import default as default
from ._recipes import in_distribution as in_distribution
from ._recipes import intent as intent
from ._recipes import named as named
from ._recipes import paper as paper
from ._recipes import phrasing as phrasing
from ._recipes import resolve as resolve

__all__ = ["Recipe", "NAMES", "default", "phrasing", "intent", "in_distribution", "paper", "named"]
