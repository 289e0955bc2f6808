"""train_monitor's grouped validation split: prompts that share an 8-word run never straddle it.

The groups are checked against a brute-force computation (every pair's shared runs, components by
search); the split against scikit-learn's (no shared text: the same positions) and against its
own promises (a partition, no group on both sides, both classes on both sides)."""

import random

import numpy as np
import pytest
from sklearn.model_selection import train_test_split
from tiny_models import TINY_BENIGN, TINY_HARMFUL, hooked_gpt2_style

import tpc_hooks as tpc
from tpc_hooks.data._sources import shingles
from tpc_hooks.data._split import shared_text_groups, validation_split

VOCAB = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()


def _texts(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Random texts over a small vocabulary, a third of them pasted into one of a few templates."""
    r = random.Random(seed)
    templates = [" ".join(r.choice(VOCAB) for _ in range(12)) for _ in range(4)]
    texts, y = [], []
    for i in range(n):
        body = " ".join(r.choice(VOCAB) for _ in range(r.randint(3, 9)))
        texts.append(f"{r.choice(templates)} {body}" if i % 3 == 0 else body)
        y.append(r.random() < 0.4)
    return texts, np.asarray(y, dtype=int)


def _brute_groups(texts: list[str]) -> list[set[int]]:
    """Connected components of 'shares an 8-word run', by pairwise comparison and search."""
    runs = [shingles(t, 8) for t in texts]
    seen, comps = set(), []
    for start in range(len(texts)):
        if start in seen:
            continue
        comp, todo = set(), [start]
        while todo:
            i = todo.pop()
            if i in comp:
                continue
            comp.add(i)
            todo += [j for j in range(len(texts)) if j not in comp and runs[i] & runs[j]]
        seen |= comp
        comps.append(comp)
    return comps


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_groups_are_the_components_of_shared_runs(seed):
    texts, _ = _texts(120, seed)
    g = shared_text_groups(texts)
    found = sorted(sorted(np.flatnonzero(g == v).tolist()) for v in np.unique(g))
    assert found == sorted(sorted(c) for c in _brute_groups(texts))
    assert len(found) < len(texts)  # some texts did share a template


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_split_keeps_each_group_on_one_side(seed):
    texts, y = _texts(300, seed)
    n_val = 60
    tr, va = validation_split(texts, y, n_val, seed)
    assert sorted(np.concatenate([tr, va]).tolist()) == list(range(len(texts)))  # a partition
    g = shared_text_groups(texts)
    assert not set(g[tr]) & set(g[va])
    assert abs(len(va) - n_val) <= max(np.bincount(g)) + 2  # to within a group
    for part in (tr, va):
        assert set(y[part]) == {0, 1}
    assert abs(y[va].mean() - y.mean()) < 0.1  # near the classes' proportions
    assert np.array_equal(validation_split(texts, y, n_val, seed)[1], va)  # seeded


def test_without_shared_text_it_is_the_stratified_split():
    texts = [f"{a} {b} {c}" for a in VOCAB[:6] for b in VOCAB[6:11] for c in VOCAB[11:]]
    y = np.arange(len(texts)) % 3 == 0
    tr, va = validation_split(texts, y.astype(int), 20, 5)
    want_tr, want_va = train_test_split(np.arange(len(texts)), test_size=20, stratify=y.astype(int), random_state=5)
    assert np.array_equal(tr, want_tr) and np.array_equal(va, want_va)


def test_a_group_holding_a_whole_class_falls_back_to_the_stratified_split():
    template = "one two three four five six seven eight nine"
    texts = [f"{template} harmful {i}" for i in range(4)] + [f"benign text number {i}" for i in range(8)]
    y = np.array([1] * 4 + [0] * 8)
    tr, va = validation_split(texts, y, 3, 0)
    want = train_test_split(np.arange(12), test_size=3, stratify=y, random_state=0)
    assert np.array_equal(tr, want[0]) and np.array_equal(va, want[1])


@pytest.mark.parametrize("split", [None, "grouped", "stratified"])
def test_train_monitor_splits(monkeypatch, split):
    """``"grouped"`` keeps a template's twins on one side; ``"stratified"``, the default, is scikit-learn's split."""
    from tpc_hooks.training import _train_monitor

    template = "please tell me about the weather and the dog sat on the mat"
    prompts = TINY_HARMFUL + TINY_BENIGN + [f"{template} {p}" for p in TINY_HARMFUL[:4] + TINY_BENIGN[:4]]
    labels = [1] * 10 + [0] * 10 + [1] * 4 + [0] * 4
    seen = []
    real = _train_monitor._train_data
    monkeypatch.setattr(
        _train_monitor, "_train_data", lambda rows, t, r, chats: seen.append(r) or real(rows, t, r, chats)
    )
    tpc.train_monitor(
        hooked_gpt2_style(),
        prompts,
        labels,
        "blocks.1.hook_resid_post",
        **({} if split is None else {"split": split}),
        val_fraction=0.3,
        verbose=False,
        degree=2,
        rank=2,
        epochs=2,
        seed=0,
    )
    r = seen[0]
    tr, va = train_test_split(np.arange(len(prompts)), test_size=len(r.va), stratify=labels, random_state=0)
    wrapped = set(range(20, 28))
    if split != "grouped":
        assert np.array_equal(r.tr, tr) and np.array_equal(r.va, va)
    else:
        assert wrapped <= set(r.tr.tolist()) or wrapped <= set(r.va.tolist())
        assert not (wrapped <= set(tr.tolist()) or wrapped <= set(va.tolist()))  # the stratified split parts them


def test_train_monitor_refuses_an_unknown_split():
    prompts, labels = TINY_HARMFUL + TINY_BENIGN, [1] * 10 + [0] * 10
    with pytest.raises(tpc.TPCHooksError, match="split must be one of"):
        tpc.train_monitor(hooked_gpt2_style(), prompts, labels, "blocks.1.hook_resid_post", split="by-source")
