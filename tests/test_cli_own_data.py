"""A user's own labelled file through the command line: ``collect`` splits it as ``train_monitor``
splits its prompts, and ``train`` refits as ``train_monitor`` refits, so the two paths give the same
calibrated monitor (the independent computation: ``train_monitor`` on the same rows); ``evaluate``
reads the file by its own columns. On a tiny in-process TransformerLens model (the CLI's model loader
is replaced; nothing is downloaded)."""

import csv
import json

import numpy as np
import pytest
from tiny_models import TINY_BENIGN, TINY_HARMFUL, hooked_gpt2_style

import tpc_hooks as tpc
from tpc_hooks.cli import _models as cli_models
from tpc_hooks.cli import main

pytest.importorskip("transformer_lens")

SITE = "blocks.1.hook_resid_post"
FIT = ["--degree", "2", "--rank", "2", "--epochs", "3"]


@pytest.fixture(scope="module")
def model():
    return hooked_gpt2_style()


def _rows():
    """40 labelled prompts of the tiny vocabulary, harmful and benign interleaved as a user's file is."""
    harmful = TINY_HARMFUL + [f"{t} please now" for t in TINY_HARMFUL]
    benign = TINY_BENIGN + [f"{t} for my friend" for t in TINY_BENIGN]
    return [row for pair in zip(harmful, benign, strict=True) for row in ((pair[0], "1"), (pair[1], "0"))]


@pytest.fixture
def mine(tmp_path):
    path = tmp_path / "mine.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["prompt", "is_harmful"])
        w.writerows(_rows())
    return path


def _collect(mine, acts, *extra):
    cols = ["--dataset", str(mine), "--text-column", "prompt", "--label-column", "is_harmful"]
    args = ["collect", *cols, "--sites", SITE, "--out", str(acts), "--batch-size", "1", "--no-progress", *extra]
    return main(args)


def test_collect_train_equals_train_monitor(tmp_path, mine, model, monkeypatch, capsys):
    monkeypatch.setattr(cli_models, "load_named", lambda name, toolkit: model)
    acts, mon_dir = tmp_path / "acts", tmp_path / "monitor"
    assert _collect(mine, acts) == 0
    out = capsys.readouterr().out
    assert "collect: " in out and "forward passes: 40 prompts (train 32, val 8)" in out  # said before it runs
    record = json.loads((acts / "collect.json").read_text())["split"]
    texts, labels = [t for t, _ in _rows()], [int(v) for _, v in _rows()]
    tr, va = tpc.data.split_positions(texts, labels, val_fraction=0.2, seed=0)
    assert record["positions"] == {"train": tr.tolist(), "val": va.tolist()}
    assert json.loads((acts / "train" / "labels.json").read_text()) == [labels[i] for i in tr]

    assert main(["train", "--acts", str(acts), "--out", str(mon_dir), *FIT, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "threshold" in out and "stays 0.5" not in out
    refit = tpc.Monitor.from_pretrained(mon_dir).report["refit"]
    assert f"then refit on all 40 prompts (training and validation): site {SITE}, C={refit['C']:g}" in out
    cli_mon = tpc.Monitor.from_pretrained(mon_dir)

    py_mon = tpc.train_monitor(
        model, texts, labels, SITE, degree=2, rank=2, epochs=3, seed=0, batch_size=1, verbose=False
    )
    assert cli_mon.report["refit"]["n"] == py_mon.report["refit"]["n"] == 40
    assert cli_mon.head.degree == py_mon.head.degree
    assert cli_mon.threshold == pytest.approx(py_mon.threshold, rel=1e-5, abs=1e-7)
    probe = texts[:6] + ["hello world is nice please", "kill the dog now"]
    got, want = cli_mon.score(model, probe), py_mon.score(model, probe)
    np.testing.assert_allclose(got.probs.numpy(), want.probs.numpy(), rtol=1e-5, atol=1e-6)
    assert got.flagged.tolist() == want.flagged.tolist()
    assert cli_mon.report["split"]["seed"] == py_mon.report["split"]["seed"] == 0
    assert cli_mon.report["split"]["val_fraction"] == py_mon.report["split"]["val_fraction"]


def test_test_split_is_held_out_first(tmp_path, mine, model, monkeypatch, capsys):
    monkeypatch.setattr(cli_models, "load_named", lambda name, toolkit: model)
    acts = tmp_path / "acts"
    assert _collect(mine, acts, "--test-fraction", "0.25", "--no-augment", "--no-intent") == 0
    sizes = json.loads((acts / "collect.json").read_text())["splits"]
    assert sizes == {"train": 24, "val": 6, "test": 10}
    test_labels = json.loads((acts / "test" / "labels.json").read_text())
    assert sorted(test_labels) == [0] * 5 + [1] * 5  # stratified


def test_bad_fractions_refused_before_the_model(tmp_path, mine, monkeypatch, capsys):
    monkeypatch.setattr(cli_models, "load_named", lambda name, toolkit: pytest.fail("model loaded"))
    assert _collect(mine, tmp_path / "a", "--val-fraction", "1.5") == 2
    assert "--val-fraction must be in (0, 1)" in capsys.readouterr().err
