"""Collection rules for the whole repository: the modules that import vLLM or what only vLLM brings
(``prometheus_client``; they run in vLLM's workers and server) are collected, for their doctests,
only where vLLM is installed (``make test-vllm``'s environment).

Where ``TPC_CI_COUNTS`` names a file (``.ci/run`` sets it per stage), each pytest run appends one
JSON line with its counts (passed, skipped, failed, errors, deselected): the rows of CI's stage table."""

import importlib.util
import json
import os

collect_ignore = (
    []
    if importlib.util.find_spec("vllm")
    else [
        "tests/vllm_poison.py",
        "tpc_hooks/adapters/vllm/_worker/worker.py",
        "tpc_hooks/adapters/vllm/_server/serve.py",
        "tpc_hooks/adapters/vllm/_worker/models.py",
        "tpc_hooks/adapters/vllm/_server/metrics.py",
        "tpc_hooks/adapters/vllm/_server/monitors.py",
    ]
)

OUTCOMES = ("passed", "skipped", "failed", "error", "deselected", "xfailed", "xpassed")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The run's counts, as pytest's own summary line counts them, appended to ``$TPC_CI_COUNTS``."""
    path = os.environ.get("TPC_CI_COUNTS")
    if not path:
        return
    counts = {k: len(terminalreporter.stats.get(k, ())) for k in OUTCOMES}
    with open(path, "a") as f:
        f.write(json.dumps({"args": list(config.invocation_params.args), "exit": int(exitstatus), **counts}) + "\n")
