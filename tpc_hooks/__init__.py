"""tpc-hooks: truncated polynomial classifiers on a language model's activations.

A TPC is a degree-N polynomial in a residual-stream vector with symmetric CP weights,
trained degree by degree so that every truncation is itself a classifier (degree 1 is the
linear probe). Importing this package imports no interpretability toolkit.
"""

import warnings

from . import baselines as baselines  # a module: tpc.baselines.compare(...)
from . import data as data  # a module: tpc.data.default_prompt_set(...), tpc.data.EVERYDAY_SOURCES
from . import recipes as recipes  # a module: tpc.recipes.default(), tpc.recipes.intent(), ...
from ._errors import TPCHooksError as TPCHooksError
from .activations import ActivationStore as ActivationStore
from .activations import collect as collect
from .head import TPC as TPC
from .head import Attribution as Attribution
from .head import Cascade as Cascade
from .head import CascadeResult as CascadeResult
from .head import Cost as Cost
from .head import FitConfig as FitConfig
from .head import FixedOrder as FixedOrder
from .head import History as History
from .head import Policy as Policy
from .head import attribute as attribute
from .monitoring import Answers as Answers
from .monitoring import Explanation as Explanation
from .monitoring import GenerationRun as GenerationRun
from .monitoring import Monitor as Monitor
from .monitoring import MonitorConfig as MonitorConfig
from .monitoring import MonitorEvent as MonitorEvent
from .monitoring import MonitorSet as MonitorSet
from .monitoring import MonitorSetRun as MonitorSetRun
from .monitoring import TokenScores as TokenScores
from .monitoring import WatchLog as WatchLog
from .monitoring import generate_answers as generate_answers
from .training import Evaluation as Evaluation
from .training import choose_site as choose_site
from .training import evaluate as evaluate
from .training import evaluate_activations as evaluate_activations
from .training import fit as fit
from .training import train_monitor as train_monitor
from .views import logged_peaks as logged_peaks
from .views import read_review_log as read_review_log

__version__ = "0.1.0"

__all__ = [
    "TPC",
    "Cost",
    "fit",
    "FitConfig",
    "History",
    "Cascade",
    "CascadeResult",
    "FixedOrder",
    "Policy",
    "ActivationStore",
    "collect",
    "train_monitor",
    "choose_site",
    "evaluate",
    "evaluate_activations",
    "Evaluation",
    "Monitor",
    "MonitorConfig",
    "MonitorSet",
    "read_review_log",
    "logged_peaks",
    "MonitorSetRun",
    "MonitorEvent",
    "TokenScores",
    "GenerationRun",
    "WatchLog",
    "generate_answers",
    "Answers",
    "attribute",
    "Attribution",
    "Explanation",
    "TPCHooksError",
]


def __getattr__(name: str):
    # GenerateLog (what the Hugging Face generate hooks recorded) is now GenerationRun, the one record of a
    # monitored generation whatever drove it; the old name keeps working, with a warning.
    if name == "TrainConfig":  # the baselines' training settings: tpc_hooks.baselines.TrainConfig
        from ._errors import deprecated
        from .head import TrainConfig

        deprecated("tpc_hooks.TrainConfig", "tpc_hooks.baselines.TrainConfig (the baselines' training settings)")
        return TrainConfig
    if name == "GenerateLog":
        warnings.warn(
            "tpc_hooks.GenerateLog is now tpc_hooks.GenerationRun (one record for every monitored "
            "generation); use that name",
            DeprecationWarning,
            stacklevel=2,
        )
        return GenerationRun
    raise AttributeError(f"module 'tpc_hooks' has no attribute {name!r}")
