"""Shared by the tutorials: small, balanced slices of the packaged prompt set."""

import os
import shutil
import socket
import sys
from pathlib import Path

from tpc_hooks.data import PromptSet, default_prompt_set

SMALL = os.environ.get("TPC_TUTORIAL_SMALL") == "1"  # CI runs the tutorials on small inputs


def balanced(ps: PromptSet, n: int) -> PromptSet:
    """The first ``n // 2`` prompts of each class, in order."""
    idx = [i for i, y in enumerate(ps.labels) if y == 1][: n // 2] + [i for i, y in enumerate(ps.labels) if y == 0][
        : n // 2
    ]
    return ps.subset(sorted(idx))


def prompt_sets(n_train: int = 600, n_test: int = 200) -> dict[str, PromptSet]:
    """Train / val / test / held-out slices (smaller under ``TPC_TUTORIAL_SMALL=1``)."""
    if SMALL:
        n_train, n_test = 80, 40
    sets = default_prompt_set(seed=0)
    return {
        "train": balanced(sets["train"], n_train),
        "val": balanced(sets["val"], n_test),
        "test": balanced(sets["test"], n_test),
        "heldout": balanced(sets["heldout"], n_test),
    }


def vllm_python() -> str:
    """The Python of an environment with vLLM, where the serving tutorial starts its server:
    ``$TPC_HOOKS_VLLM_PYTHON``, else the ``.venv-vllm`` that ``make vllm-env`` builds beside the
    tutorials, else this Python if it has vLLM."""
    import importlib.util

    named = os.environ.get("TPC_HOOKS_VLLM_PYTHON")
    venv = Path(__file__).resolve().parent.parent / ".venv-vllm" / "bin" / "python"
    if named:
        return shutil.which(named) or named
    if venv.exists():
        return str(venv)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise RuntimeError(
        "no environment with vLLM: run `make vllm-env` (or set TPC_HOOKS_VLLM_PYTHON to the python of one)"
    )


def free_port() -> int:
    """A TCP port nothing listens on, on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
