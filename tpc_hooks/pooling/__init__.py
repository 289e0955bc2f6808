"""Mask-aware pooling of per-token activations into one vector per sequence.

``mean`` averages the attended tokens, ``last`` takes the last attended token, ``max`` the
per-feature maximum over attended tokens. Left or right padding gives the same result,
because only the mask decides which positions count. :class:`RunningPool` does the same
incrementally for generation (prompt first, then one token per step).

The folder is the pooling's one home: its code is in ``_pool``; the package's other folders import
it from here, the checks of a pooling's or an aggregate's settings and the rule that picks the
scored tokens included (not in ``__all__``: they serve the package).
"""

from ._pool import AGGREGATES as AGGREGATES
from ._pool import POOLINGS as POOLINGS
from ._pool import TOP_K as TOP_K
from ._pool import RunningAggregate as RunningAggregate
from ._pool import RunningPool as RunningPool
from ._pool import aggregate as aggregate
from ._pool import check_aggregate as check_aggregate
from ._pool import check_pooling as check_pooling
from ._pool import check_skip as check_skip
from ._pool import check_top_k as check_top_k
from ._pool import pool as pool
from ._pool import pool_prefixes as pool_prefixes
from ._pool import scored as scored

__all__ = [
    "POOLINGS",
    "pool",
    "RunningPool",
    "AGGREGATES",
    "aggregate",
    "RunningAggregate",
]
