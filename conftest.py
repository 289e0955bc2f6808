"""Collection rules for the whole repository: the modules that import vLLM or what only vLLM brings
(``prometheus_client``; they run in vLLM's workers and server) are collected, for their doctests,
only where vLLM is installed (``make test-vllm``'s environment)."""

import importlib.util

collect_ignore = (
    []
    if importlib.util.find_spec("vllm")
    else [
        "tests/vllm_poison.py",
        "tpc_hooks/serving/_vllm_worker.py",
        "tpc_hooks/serving/_vllm_serve.py",
        "tpc_hooks/serving/_vllm_models.py",
        "tpc_hooks/serving/_serve_metrics.py",
        "tpc_hooks/serving/_serve_monitors.py",
    ]
)
