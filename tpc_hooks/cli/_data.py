"""The command line's one way to read labelled prompts (``demo``, ``collect``, ``evaluate``): the
packaged default set, or a user's file or hub dataset named by ``--dataset`` with its columns, read
and checked before any model loads, and split the way :func:`tpc_hooks.train_monitor` splits its
prompts, so that ``collect`` + ``train`` on a file make the monitor ``train_monitor`` makes of the
same rows.

A user's rows: an optional test split first (``--test-fraction``, stratified by label, seeded),
then the rest split by :func:`tpc_hooks.data.split_positions` (``--val-fraction``, ``--seed``),
the split ``train_monitor(prompts, labels, val_fraction=, seed=)`` draws from those rows in their
file order."""

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

from .._errors import TPCHooksError
from ..activations import prompts_digest
from ..data import PromptSet, check_labelled, default_prompt_set, load_hf_dataset, load_prompt_file, split_positions

DEFAULT = "default"


def read_prompts(args: argparse.Namespace, *, dataset: str | None = None) -> PromptSet:
    """The labelled prompts of ``--dataset`` (a local file or a hub dataset; not the packaged
    default), read with ``--text-column``, ``--label-column``, ``--source-column`` and
    ``--label-names``, and checked: both classes, no text with both labels."""
    name = args.dataset if dataset is None else dataset
    columns: dict[str, Any] = dict(
        text_column=args.text_column,
        label_column=args.label_column,
        source_column=args.source_column,
        label_names=args.label_names,
    )
    if Path(name).exists():
        ps = load_prompt_file(name, **columns)
    else:
        ps = load_hf_dataset(name, split=args.split, **columns)
    check_labelled(ps, name)
    return ps


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    """``--val-fraction`` in (0, 1) and ``--test-fraction`` in [0, 1), leaving rows to train on."""
    if not 0 < val_fraction < 1:
        raise TPCHooksError(f"--val-fraction must be in (0, 1); got {val_fraction:g}")
    if not 0 <= test_fraction < 1 or (1 - test_fraction) * (1 - val_fraction) <= 0.1:
        raise TPCHooksError(
            f"--test-fraction must be in [0, 1) and leave rows to train on with --val-fraction "
            f"{val_fraction:g}; got {test_fraction:g}"
        )


def user_splits(
    ps: PromptSet, *, val_fraction: float, test_fraction: float, seed: int
) -> tuple[dict[str, PromptSet], dict[str, Any]]:
    """A user's rows as ``train`` / ``val`` (/ ``test``) sets, and the record of the split
    (``collect.json``'s ``"split"``): the settings, the digest of the rows ``train_monitor`` would be
    given (every row but the test split's, in file order) and each split's positions among them.

    Example:
        >>> n = 20
        >>> ps = PromptSet([f"p{i}" for i in range(n)], [i % 2 for i in range(n)], ["f"] * n, [""] * n, [False] * n)
        >>> sets, record = user_splits(ps, val_fraction=0.2, test_fraction=0.0, seed=0)
        >>> {k: len(v) for k, v in sets.items()}, record["n"]
        ({'train': 16, 'val': 4}, 20)
    """
    check_fractions(val_fraction, test_fraction)
    at, test = _test_split(ps, test_fraction, seed)
    rows = ps.subset(at)
    tr, va = split_positions(rows.texts, rows.labels, val_fraction=val_fraction, seed=seed)
    sets = {"train": rows.subset(tr), "val": rows.subset(va)}
    if len(test):
        sets["test"] = ps.subset(test)
    record = {
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
        "split": "stratified",
        "seed": seed,
        "n": len(rows),
        "sha256": prompts_digest(rows.texts),
        "positions": {"train": [int(i) for i in tr], "val": [int(i) for i in va]},
    }
    return sets, record


def prompt_sets(args: argparse.Namespace) -> tuple[dict[str, PromptSet], dict[str, Any] | None]:
    """``--dataset``'s prompt sets and, for a user's data, the record of its split (None for the
    packaged default, whose splits are its own)."""
    if args.dataset == DEFAULT:
        return default_prompt_set(seed=args.seed), None
    return user_splits(
        read_prompts(args), val_fraction=args.val_fraction, test_fraction=args.test_fraction, seed=args.seed
    )


def training_rows(ps: PromptSet, record: dict[str, Any]) -> PromptSet:
    """The rows of a user's file a monitor trained on: all but its test split (``record``: a
    monitor's ``report["split"]``, with the test fraction and seed it was split by)."""
    at, _ = _test_split(ps, float(record.get("test_fraction") or 0.0), int(record.get("seed", 0)))
    return ps.subset(at)


def _test_split(ps: PromptSet, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the rows kept and of the test split held out first (stratified, seeded;
    none for ``fraction`` 0), each in file order."""
    at = np.arange(len(ps))
    if fraction <= 0:
        return at, np.zeros(0, dtype=int)
    kept, test = train_test_split(at, test_size=fraction, stratify=ps.labels, random_state=seed)
    return np.sort(kept), np.sort(test)
