"""Shared by the tutorials: small, balanced slices of the packaged prompt set."""

import os

from tpc_hooks.data import PromptSet, default_prompt_set

SMALL = os.environ.get("TPC_TUTORIAL_SMALL") == "1"  # CI runs the tutorials on small inputs


def balanced(ps: PromptSet, n: int) -> PromptSet:
    """The first ``n // 2`` prompts of each class, in order."""
    idx = [i for i, y in enumerate(ps.labels) if y == 1][: n // 2] + [i for i, y in enumerate(ps.labels) if y == 0][: n // 2]
    return ps.subset(sorted(idx))


def prompt_sets(n_train: int = 600, n_test: int = 200) -> dict[str, PromptSet]:
    """Train / val / test / held-out slices (smaller under ``TPC_TUTORIAL_SMALL=1``)."""
    if SMALL:
        n_train, n_test = 80, 40
    sets = default_prompt_set(seed=0)
    return {"train": balanced(sets["train"], n_train), "val": balanced(sets["val"], n_test),
            "test": balanced(sets["test"], n_test), "heldout": balanced(sets["heldout"], n_test)}
