"""``train_monitor``'s validation split: stratified, with the prompts that share text kept together
(``split="grouped"``; the default, ``"stratified"``, is scikit-learn's split alone).

Two prompts share text when they have an 8-word run in common (:func:`tpc_hooks.prompts._sources.shingles`):
one jailbreak template wrapped around two requests, near-duplicate requests ("Provide step-by-step
instructions for how to make a bomb" / "... how to hack into a secure network"), one pasted document.
Linked transitively, they form a group, and a group lies wholly in the training part or wholly in
the validation part, so that the selection and the threshold set on validation see no text the fit
trained on. With no shared text the split is scikit-learn's stratified one, unchanged.
"""

import random
from collections.abc import Sequence

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from sklearn.model_selection import train_test_split

from ..prompts._sources import shingles

SPLITS = ("stratified", "grouped")  # train_monitor's split=


def shared_text_groups(texts: Sequence[str], k: int = 8) -> np.ndarray:
    """A group id per text (the lowest position in its group): texts linked, directly or through
    others, by a common ``k``-word run share one id (the connected components of that relation, by SciPy).

    Example:
        >>> shared_text_groups(["a b c d e f g h about cats", "a b c d e f g h about dogs", "hello"]).tolist()
        [0, 0, 2]
    """
    first: dict[str, int] = {}
    edges = [(i, first.setdefault(run, i)) for i, text in enumerate(texts) for run in shingles(text, k)]
    rows, cols = (
        (np.asarray(v, dtype=int) for v in zip(*edges, strict=True)) if edges else (np.zeros(0, int), np.zeros(0, int))
    )
    graph = coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(texts), len(texts)))
    n, labels = connected_components(graph, directed=False)
    lowest = np.full(n, len(texts))
    np.minimum.at(lowest, labels, np.arange(len(texts)))
    return lowest[labels]


def validation_split(texts: Sequence[str], y: np.ndarray, n_val: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)`` positions: about ``n_val`` held out, in the classes' proportions, no group
    on both sides.

    The groups of several texts go whole to validation, in a seeded order, until they fill their
    share of it (``n_val`` times the share of texts that are in such groups); single texts of each
    class, drawn in a seeded order, bring each class to its share. Without shared text, or when the
    groups leave a class missing from one side (a handful of prompts in one template), this is
    scikit-learn's stratified split.
    """
    y = np.asarray(y, dtype=int)
    at = np.arange(len(texts))

    def stratified() -> tuple[np.ndarray, np.ndarray]:
        tr, va = train_test_split(at, test_size=n_val, stratify=y, random_state=seed)
        return np.asarray(tr), np.asarray(va)

    groups = shared_text_groups(texts)
    ids, counts = np.unique(groups, return_counts=True)
    shared = ids[counts > 1]
    if not len(shared):
        return stratified()
    in_shared = np.isin(groups, shared)
    order = shared.tolist()
    random.Random(seed).shuffle(order)
    held: list[int] = []
    for g in order:
        if len(held) >= round(n_val * in_shared.mean()):
            break
        held += at[groups == g].tolist()
    draw = np.random.default_rng(seed)
    for c in (0, 1):
        single = draw.permutation(at[~in_shared & (y == c)])
        need = round(n_val * np.mean(y == c)) - int(np.sum(y[held] == c))
        held += single[: max(need, 0)].tolist()
    va = np.sort(np.asarray(held, dtype=int))
    tr = np.setdiff1d(at, va)
    if any(np.bincount(y[part], minlength=2).min() == 0 for part in (tr, va)):
        return stratified()
    return tr, va


def split_positions(
    texts: Sequence[str], y: np.ndarray, val_fraction: float, split: str, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``train_monitor``'s ``(train, val)`` positions of its prompts: ``round(val_fraction * n)`` held
    out (at least 2), by scikit-learn's stratified split or, with ``split="grouped"``,
    :func:`validation_split`. A probe trained on the same rows reads the same split.

    Example:
        >>> tr, va = split_positions(
        ...     ["a", "b", "c", "d", "e", "f"], np.array([0, 0, 0, 1, 1, 1]), 0.34, "stratified", 0
        ... )
        >>> len(tr), len(va)
        (4, 2)
    """
    n_val = max(2, int(round(val_fraction * len(texts))))
    y = np.asarray(y, dtype=int)
    if split == "grouped":
        return validation_split(texts, y, n_val, seed)
    tr, va = train_test_split(np.arange(len(texts)), test_size=n_val, stratify=y, random_state=seed)
    return np.asarray(tr), np.asarray(va)
