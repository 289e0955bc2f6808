"""Mask-aware pooling of per-token activations into one vector per sequence.

``mean`` averages the attended tokens, ``last`` takes the last attended token, ``max`` the
per-feature maximum over attended tokens. Left or right padding gives the same result,
because only the mask decides which positions count. :class:`RunningPool` does the same
incrementally for generation (prompt first, then one token per step).
"""

from .head._pooling import AGGREGATES as AGGREGATES
from .head._pooling import POOLINGS as POOLINGS
from .head._pooling import RunningAggregate as RunningAggregate
from .head._pooling import RunningPool as RunningPool
from .head._pooling import aggregate as aggregate
from .head._pooling import pool as pool

__all__ = [
    "POOLINGS",
    "pool",
    "RunningPool",
    "AGGREGATES",
    "aggregate",
    "RunningAggregate",
]
