"""What a ``vllm.LLM`` needs to be monitored: its engine arguments (this module imports no vLLM)."""

import os
from typing import Any

WORKER = "tpc_hooks.adapters._vllm_worker.TPCHooksWorker"


def vllm_engine_args() -> dict[str, Any]:
    """The ``vllm.LLM`` arguments a monitored engine needs, to pass beside your own.

    The hooks run in vLLM's V1 model runner in eager mode (``VLLM_USE_V2_MODEL_RUNNER=0`` is set
    in this process's environment, which the engine's workers inherit, unless you set it).

    Example:
        >>> from tpc_hooks.adapters import vllm_engine_args
        >>> sorted(vllm_engine_args())
        ['enable_prefix_caching', 'enforce_eager', 'worker_extension_cls']
    """
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    return {"worker_extension_cls": WORKER, "enforce_eager": True, "enable_prefix_caching": False}
