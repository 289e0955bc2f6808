"""What runs in vLLM's worker processes: the worker (``_worker``: vLLM's worker class, extended, which
vLLM loads by the name ``vllm_engine_args`` gives it), its remote calls (``_control``), the monitors it
runs and what they hold (``_armed``), the prefix cache's running states (``_prefix``), the model
classes that return the residual stream (``_models``) and the worker's half of the live checks of the
contract (``_recorder``). Nothing here is imported before vLLM loads the worker, but by the live checks.
"""

from .recorder import CHECKS as CHECKS
from .recorder import RPC as RPC
from .recorder import Problem as Problem
from .recorder import isinstance_of as isinstance_of
from .recorder import plain as plain
from .recorder import same as same
