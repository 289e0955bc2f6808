"""What a ``vllm.LLM`` needs to be monitored: its engine arguments (this module imports no vLLM)."""

import os
from typing import Any

WORKER = "tpc_hooks.serving._vllm_worker.TPCHooksWorker"
STOP = "tpc_hooks.serving._vllm_worker:TPCHooksStop"


def vllm_engine_args() -> dict[str, Any]:
    """The ``vllm.LLM`` arguments a monitored engine needs, to pass beside your own.

    A worker extension (the hooks that read the residual stream and score it), the logits
    processor that ends a stopped request in the step it is flagged (add your own logits
    processors to its list), and eager mode: the hooks run in vLLM's V1 model runner
    (``VLLM_USE_V2_MODEL_RUNNER=0`` is set in this process's environment, which the engine's
    workers inherit, unless you set it). Prefix caching stays as you set it: monitored
    requests skip reading the cache (a cached block is never recomputed, so its tokens would
    never reach the monitor) and the others use it.

    Example:
        >>> from tpc_hooks.adapters import vllm_engine_args
        >>> sorted(vllm_engine_args())
        ['enforce_eager', 'logits_processors', 'worker_extension_cls']
    """
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    return {"worker_extension_cls": WORKER, "enforce_eager": True, "logits_processors": [STOP]}
