"""A trained head at work on a model: the :class:`~tpc_hooks.Monitor` and its settings, the
monitored decode loop and ``watch``, the Hugging Face ``generate`` hooks, per-request scoring
for engines whose batch changes every step, and the records of a monitored generation.
"""

from ._answers import Answers as Answers
from ._answers import conversation_ids as conversation_ids
from ._answers import generate_answers as generate_answers
from ._calibrate import check_sources as check_sources
from ._calibrate import everyday_present as everyday_present
from ._calibrate import everyday_rows as everyday_rows
from ._calibrate import logits as logits
from ._explain import Explanation as Explanation
from ._monitor import Monitor as Monitor
from ._monitor import from_files as monitor_from_files  # noqa: F401
from ._monitor import saved_files as saved_files
from ._monitor_config import ACTIONS as ACTIONS
from ._monitor_config import STOPPING as STOPPING
from ._monitor_config import MonitorConfig as MonitorConfig
from ._monitor_config import monitor_specs as monitor_specs
from ._records import GenerationRun as GenerationRun
from ._records import MonitorEvent as MonitorEvent
from ._records import MonitorSetRun as MonitorSetRun
from ._records import TokenScores as TokenScores
from ._records import WatchLog as WatchLog
from ._requests import RequestScores as RequestScores
from ._set import MonitorSet as MonitorSet
