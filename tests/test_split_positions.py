"""``tpc_hooks.data.split_positions``: the training and validation positions ``train_monitor`` splits
its prompts into, public, with its input checked.

The positions are checked against the rows the monitor's fit was handed (collected apart, by
``tpc.collect``) and against its report; the grouped split's own promises are tests/test_split.py's."""

import numpy as np
import pytest
import torch
from tiny_models import TINY_BENIGN, TINY_HARMFUL, hooked_gpt2_style

import tpc_hooks as tpc
from tpc_hooks.data import SPLITS, split_positions
from tpc_hooks.training import _train_monitor

TEMPLATE = "please tell me about the weather and the dog sat on the mat"
PROMPTS = TINY_HARMFUL + TINY_BENIGN + [f"{TEMPLATE} {p}" for p in TINY_HARMFUL[:4] + TINY_BENIGN[:4]]
LABELS = [1] * 10 + [0] * 10 + [1] * 4 + [0] * 4
SITE = "blocks.1.hook_resid_post"


@pytest.mark.parametrize("split", SPLITS)
def test_the_positions_are_the_ones_train_monitor_trained_on(monkeypatch, split):
    handed = []
    real = _train_monitor.train
    monkeypatch.setattr(_train_monitor, "train", lambda data, plan, **kw: handed.append(data) or real(data, plan, **kw))
    model = hooked_gpt2_style()
    mon = tpc.train_monitor(
        model, PROMPTS, LABELS, SITE, split=split, val_fraction=0.3, seed=3, degree=2, rank=2, epochs=2, verbose=False
    )
    recorded = mon.report["split"]
    tr, va = split_positions(PROMPTS, LABELS, recorded["val_fraction"], recorded["split"], recorded["seed"])
    assert (recorded["split"], recorded["seed"]) == (split, 3)
    assert len(tr) == mon.report["n_train"]
    rows = tpc.collect(model, PROMPTS, SITE, "mean", chat_template=mon.chat_template, progress=False)[SITE]
    data = handed[0][SITE]
    torch.testing.assert_close(torch.as_tensor(data.train.X), rows[tr])
    assert np.array_equal(data.train.y, np.asarray(LABELS)[tr])
    torch.testing.assert_close(torch.as_tensor(data.val.X[: len(va)]), rows[va])  # the prompts as given come first


def test_the_defaults_are_train_monitors():
    a = split_positions(PROMPTS, LABELS)
    b = split_positions(PROMPTS, np.asarray(LABELS), 0.2, "stratified", 0)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    tr, va = a
    assert len(va) == round(0.2 * len(PROMPTS)) and sorted([*tr, *va]) == list(range(len(PROMPTS)))
    assert np.bincount(np.asarray(LABELS)[va]).min() >= 1


@pytest.mark.parametrize(
    "args, kw, message",
    [
        (
            (PROMPTS, LABELS),
            {"split": "by-source"},
            r"split must be one of \['stratified', 'grouped'\]; got 'by-source'",
        ),
        ((PROMPTS, LABELS), {"val_fraction": 1.0}, r"val_fraction must be in \(0, 1\); got 1.0"),
        ((PROMPTS, LABELS), {"val_fraction": 0.0}, r"val_fraction must be in \(0, 1\); got 0.0"),
        ((PROMPTS, LABELS), {"val_fraction": 0.95}, "holds out 27 of 28 prompts, leaving 1 to train on"),
        ((PROMPTS, LABELS[:-1]), {}, "labels has 27 entries but texts has 28; give one label per text"),
        ((PROMPTS, [2] * len(PROMPTS)), {}, "labels must hold binary labels"),
        ((PROMPTS, [1] + [0] * (len(PROMPTS) - 1)), {}, "labels need at least 2 examples of each class"),
        ((PROMPTS, [0] * len(PROMPTS)), {}, "labels need at least 2 examples of each class"),
        (("one string", [1]), {}, "texts must be a list of strings, not one string"),
        (([], []), {}, "texts is empty"),
    ],
    ids=[
        "split",
        "val_fraction-1",
        "val_fraction-0",
        "val_fraction-leaves-1",
        "length",
        "not-binary",
        "one-of-a-class",
        "one-class",
        "one-string",
        "empty",
    ],
)
def test_bad_input_is_refused(args, kw, message):
    with pytest.raises(tpc.TPCHooksError, match=message):
        split_positions(*args, **kw)


def test_train_monitor_refuses_bad_split_settings_with_the_same_words():
    model = hooked_gpt2_style()
    for kw, message in (
        ({"val_fraction": 1.0}, r"val_fraction must be in \(0, 1\)"),
        ({"split": "by-source"}, "split must be one of"),
        ({"val_fraction": 0.95}, "holds out 27 of 28 prompts"),
    ):
        with pytest.raises(tpc.TPCHooksError, match=message):
            tpc.train_monitor(model, PROMPTS, LABELS, SITE, verbose=False, **kw)
