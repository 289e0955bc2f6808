"""``train_monitor``'s validation split: stratified, with the prompts that share text kept together
(``split="grouped"``; the default, ``"stratified"``, is scikit-learn's split alone).

Two prompts share text when they have an 8-word run in common (:func:`tpc_hooks.data._sources.shingles`):
one jailbreak template wrapped around two requests, near-duplicate requests ("Provide step-by-step
instructions for how to make a bomb" / "... how to hack into a secure network"), one pasted document.
Linked transitively, they form a group, and a group lies wholly in the training part or wholly in
the validation part, so that the selection and the threshold set on validation see no text the fit
trained on. With no shared text the split is scikit-learn's stratified one, unchanged.
"""

import numbers
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from sklearn.model_selection import train_test_split

from .._errors import TPCHooksError
from ..metrics import check_labels
from ._sources import shingles

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


def check_split(y: np.ndarray, val_fraction: Any, split: Any) -> int:
    """The split's settings checked against binary labels ``y`` (each error says what was expected):
    ``val_fraction`` in (0, 1), a known ``split``, at least 2 prompts of each class, and at least 2
    prompts left on each side. Returns the number of validation prompts, ``round(val_fraction * n)``
    (at least 2)."""
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real) or not 0 < float(val_fraction) < 1:
        raise TPCHooksError(f"val_fraction must be in (0, 1); got {val_fraction!r}")
    if not isinstance(split, str) or split not in SPLITS:
        raise TPCHooksError(f"split must be one of {list(SPLITS)}; got {split!r}")
    if np.bincount(y, minlength=2).min() < 2:
        raise TPCHooksError("labels need at least 2 examples of each class to hold out a validation split")
    n = len(y)
    n_val = max(2, int(round(float(val_fraction) * n)))
    if n - n_val < 2:
        raise TPCHooksError(
            f"val_fraction={val_fraction!r} holds out {n_val} of {n} prompts, leaving {n - n_val} to train on; "
            "each side needs at least 2: lower val_fraction or add prompts"
        )
    return n_val


def split_positions(
    texts: Sequence[str], labels: Any, val_fraction: float = 0.2, split: str = "stratified", seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The ``(train, val)`` positions :func:`~tpc_hooks.train_monitor` splits its prompts into, for the
    same ``val_fraction``, ``split`` and ``seed`` (its defaults here too): ``round(val_fraction * n)``
    held out (at least 2), in the classes' proportions, by scikit-learn's stratified split or, with
    ``split="grouped"``, with the prompts that share an 8-word run kept on one side. A probe trained
    on the training positions' rows and chosen on the validation positions' reads the monitor's own
    split (``monitor.report["split"]`` records the settings).

    Args:
        texts: the prompts, as given to ``train_monitor``.
        labels: their labels (1 = harmful), one per prompt.
        val_fraction: the share held out for validation, in (0, 1).
        split: ``"stratified"`` or ``"grouped"`` (:data:`SPLITS`).
        seed: draws the split (``train_monitor``'s ``seed``).

    Returns:
        Two integer arrays of positions into ``texts``: the training prompts and the validation
        prompts, disjoint, together every position.

    Raises:
        TPCHooksError: texts that are not a non-empty list of non-empty strings, labels that are not
            binary or not one per text, ``val_fraction`` outside (0, 1), an unknown ``split``, fewer
            than 2 prompts of a class, or fewer than 2 prompts left on a side.

    Example:
        >>> from tpc_hooks.data import split_positions
        >>> texts = [f"prompt {i}" for i in range(10)]
        >>> tr, va = split_positions(texts, [0, 1] * 5, val_fraction=0.2, seed=0)
        >>> len(tr), len(va), sorted([*tr, *va]) == list(range(10))
        (8, 2, True)
    """
    items = check_prompts(texts, "texts")
    n_labels = len(labels) if hasattr(labels, "__len__") else None
    if n_labels is not None and n_labels != len(items):
        raise TPCHooksError(f"labels has {n_labels} entries but texts has {len(items)}; give one label per text")
    y = check_labels(labels, len(items), "labels", need_both=False).numpy().astype(int)
    n_val = check_split(y, val_fraction, split)
    if split == "grouped":
        return validation_split(items, y, n_val, seed)
    tr, va = train_test_split(np.arange(len(items)), test_size=n_val, stratify=y, random_state=seed)
    return np.asarray(tr), np.asarray(va)


def check_prompts(prompts: Any, name: str = "prompts") -> list[str]:
    if isinstance(prompts, str):
        raise TPCHooksError(f"{name} must be a list of strings, not one string; wrap it: [{prompts[:30]!r}...]")
    try:
        items = list(prompts)
    except TypeError:
        raise TPCHooksError(f"{name} must be a list of strings; got {type(prompts).__name__}") from None
    if not items:
        raise TPCHooksError(f"{name} is empty; pass at least one prompt")
    bad = [i for i, p in enumerate(items) if not isinstance(p, str) or not p.strip()]
    if bad:
        raise TPCHooksError(f"{name} must hold non-empty strings; entries {bad[:5]} are not")
    for i, p in enumerate(items):
        try:
            p.encode("utf-8")
        except UnicodeEncodeError as err:  # a lone surrogate: no tokenizer can encode it
            raise TPCHooksError(
                f"{name}[{i}] is not valid Unicode text: it holds a lone surrogate {p[err.start]!r} at position "
                f"{err.start}; clean it first, e.g. text.encode('utf-8', 'replace').decode('utf-8')"
            ) from None
    return items
