"""tpc-hooks: truncated polynomial classifiers on a language model's activations.

A TPC is a degree-N polynomial in a residual-stream vector with symmetric CP weights,
trained degree by degree so that every truncation is itself a classifier (degree 1 is the
linear probe). Importing this package imports no interpretability toolkit.
"""

import warnings

from ._errors import TPCHooksError as TPCHooksError
from ._attribution import Attribution as Attribution
from ._attribution import attribute as attribute
from ._cascade import Cascade as Cascade
from ._cascade import CascadeResult as CascadeResult
from ._policy import FixedOrder as FixedOrder
from ._policy import Policy as Policy
from ._collect import collect as collect
from ._records import GenerationRun as GenerationRun
from ._monitor import Monitor as Monitor
from ._monitor_config import MonitorConfig as MonitorConfig
from ._records import TokenScores as TokenScores
from ._records import MonitorEvent as MonitorEvent
from ._records import WatchLog as WatchLog
from ._train import train_monitor as train_monitor
from ._select import choose_site as choose_site
from ._polynomial import TPC as TPC
from ._polynomial import Cost as Cost
from ._store import ActivationStore as ActivationStore
from ._fit import fit as fit
from ._history import FitConfig as FitConfig
from ._history import History as History
from ._history import TrainConfig as TrainConfig
from . import baselines as baselines  # a module: tpc.baselines.compare(...)

__version__ = "0.1.0"

__all__ = [
    "TPC",
    "Cost",
    "fit",
    "FitConfig",
    "TrainConfig",
    "History",
    "Cascade",
    "CascadeResult",
    "FixedOrder",
    "Policy",
    "ActivationStore",
    "collect",
    "train_monitor",
    "choose_site",
    "Monitor",
    "MonitorConfig",
    "MonitorEvent",
    "TokenScores",
    "GenerationRun",
    "WatchLog",
    "attribute",
    "Attribution",
    "TPCHooksError",
]


def __getattr__(name: str):
    # GenerateLog (what the Hugging Face generate hooks recorded) is now GenerationRun, the one record of a
    # monitored generation whatever drove it; the old name keeps working, with a warning.
    if name == "GenerateLog":
        warnings.warn("tpc_hooks.GenerateLog is now tpc_hooks.GenerationRun (one record for every monitored "
                      "generation); use that name", DeprecationWarning, stacklevel=2)
        return GenerationRun
    raise AttributeError(f"module 'tpc_hooks' has no attribute {name!r}")
