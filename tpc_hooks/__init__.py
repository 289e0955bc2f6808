"""tpc-hooks: truncated polynomial classifiers on a language model's activations.

A TPC is a degree-N polynomial in a residual-stream vector with symmetric CP weights,
trained degree by degree so that every truncation is itself a classifier (degree 1 is the
linear probe). Importing this package imports no interpretability toolkit.
"""

from ._errors import TPCHooksError as TPCHooksError
from .attribution import Attribution as Attribution
from .attribution import attribute as attribute
from .cascade import Cascade as Cascade
from .cascade import CascadeResult as CascadeResult
from .collect import collect as collect
from .monitor import GenerationRun as GenerationRun
from .monitor import Monitor as Monitor
from .monitor import MonitorEvent as MonitorEvent
from .monitor import WatchLog as WatchLog
from .monitor import train_monitor as train_monitor
from .polynomial import TPC as TPC
from .polynomial import Cost as Cost
from .store import ActivationStore as ActivationStore
from .training import History as History
from .training import fit as fit
from . import baselines as baselines  # a module: tpc.baselines.compare(...)

__version__ = "0.1.0"

__all__ = [
    "TPC",
    "Cost",
    "fit",
    "History",
    "Cascade",
    "CascadeResult",
    "ActivationStore",
    "collect",
    "train_monitor",
    "Monitor",
    "MonitorEvent",
    "GenerationRun",
    "WatchLog",
    "attribute",
    "Attribution",
    "TPCHooksError",
]
