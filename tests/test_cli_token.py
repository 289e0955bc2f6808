"""``tpc-hooks collect --pooling token`` -> ``train`` (a per-token monitor) -> ``evaluate`` -> ``monitor``,
on a tiny in-process TransformerLens model (the CLI's model loader is replaced; nothing is downloaded).

Independent computations: the trained monitor's scores from ``evaluate`` against ``Monitor.score`` and
``Monitor.token_scores`` (fresh forward passes); its ``skip`` against ``Adapter.fixed_prefix``."""

import json

import numpy as np
import pytest
import torch
from tiny_models import TINY_BENIGN, TINY_HARMFUL, hooked_gpt2_style, tiny_chats, tiny_splits

import tpc_hooks as tpc
from tpc_hooks import metrics
from tpc_hooks.adapters import get_adapter
from tpc_hooks.cli import _models as cli_models
from tpc_hooks.cli import _verbs as cli
from tpc_hooks.cli import main

pytest.importorskip("transformer_lens")

SITE = "blocks.1.hook_resid_post"
HARMFUL, BENIGN = TINY_HARMFUL, TINY_BENIGN


def _sets(args):
    return tiny_splits()


@pytest.fixture(scope="module")
def model():
    return hooked_gpt2_style()


@pytest.fixture
def tiny_cli(monkeypatch, model):
    monkeypatch.setattr(cli_models, "load_named", lambda name, toolkit: model)
    monkeypatch.setattr(cli, "prompt_sets", lambda args: (_sets(args), None))
    return model


def test_collect_train_evaluate_monitor_per_token(tmp_path, tiny_cli, capsys):
    model = tiny_cli
    acts, mon_dir = tmp_path / "acts", tmp_path / "monitor"
    assert main(["collect", "--pooling", "token", "--sites", SITE, "--out", str(acts), "--no-progress"]) == 0
    assert "per-token rows" in capsys.readouterr().out
    skip = get_adapter(model).fixed_prefix(chat_template=True)
    assert skip == 1  # the tiny chat template's "<s>"
    ids, _ = get_adapter(model).tokenize(_sets(None)["train"].texts, chat_template=True, max_tokens=512)
    st = tpc.ActivationStore.open(acts / "train" / SITE)
    assert st.holds_sequences and st.meta["pooling"] == "token" and st.meta["fixed_prefix"] == skip
    assert st.lengths().tolist() == [len(i) for i in ids]
    splits = {p.name for p in acts.iterdir() if p.is_dir()}
    assert {"train", "val", "test", "aug"} <= splits and any(s.startswith("val-") for s in splits)

    assert (
        main(
            [
                "train",
                "--acts",
                str(acts),
                "--out",
                str(mon_dir),
                "--degree",
                "2",
                "--rank",
                "2",
                "--epochs",
                "2",
                "--aggregate",
                "ema",
                "--alpha",
                "0.3",
                "--keep-all-orders",
                "--recipe",
                "intent",
                "--tau",
                "0.2",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    mon = tpc.Monitor.from_pretrained(mon_dir)
    assert mon.streaming and (mon.aggregate, mon.alpha, mon.skip) == ("ema", 0.3, skip)
    assert mon.site == SITE and mon.chat_template and mon.cascade is not None
    # training rows: every token after the fixed prefix of the training prompts, their rewrites, intent flips
    # and homonym rows
    n_rows = sum(
        len(s) - skip
        for p in ("train", "aug", "flips", "homonyms")
        for s in tpc.ActivationStore.open(acts / p / SITE).sequences()
    )
    assert mon.report["n_train_tokens"] == n_rows and f"trained on {n_rows} token rows" in out
    # the operating point: the benign validation prompts as given (not their rewrites or intent flips)
    n_benign = json.loads((acts / "val" / "labels.json").read_text()).count(0)
    op = mon.report["operating_point"]
    assert op["n_benign"] == n_benign and op["by"] == "max over tokens"
    assert f"flags {op['flagged']} of {n_benign} benign validation sequences at any token" in out

    test = _sets(None)["test"]
    for decision in ("last", "max"):
        e = tmp_path / f"{decision}.json"
        assert (
            main(
                [
                    "evaluate",
                    "--monitor",
                    str(mon_dir),
                    "--acts",
                    str(acts),
                    "--splits",
                    "test",
                    "--decision",
                    decision,
                    "--json",
                    str(e),
                ]
            )
            == 0
        )
        ev = json.loads(e.read_text())["test"]
        assert len(ev["per_order"]) == 2 and ev["cascade"] and ev["cascade"][-1]["relative_flops"] >= 1.0
        if decision == "last":  # the aggregate after the last token: what Monitor.score returns
            want = mon.score(model, test.texts, order=2).logits
        else:  # the highest aggregate over the prompt's tokens
            want = torch.stack([mon.token_scores(model, t, order=2).result.logits.max() for t in test.texts])
        np.testing.assert_allclose(ev["logits"], want.double().numpy(), rtol=1e-4, atol=1e-4)
        assert ev["per_order"][-1]["auroc"] == pytest.approx(metrics.classification_metrics(test.labels, want)["auroc"])
    out = capsys.readouterr().out
    assert "one score per prompt: the max over tokens of the aggregate (ema; the first 1 tokens not scored)" in out
    assert "the aggregate after the last token" in out and "mean FLOPs per token / linear" in out

    assert main(["monitor", "--monitor", str(mon_dir), "--prompt", HARMFUL[0], "--max-new-tokens", "3"]) == 0
    assert "step 0 (prompt only): score" in capsys.readouterr().out


def test_mixing_token_and_pooled_stores_is_a_clear_error(tmp_path, tiny_cli, capsys):
    pooled, tok = tmp_path / "pooled", tmp_path / "tok"
    assert main(["collect", "--sites", SITE, "--out", str(pooled), "--no-augment", "--no-progress"]) == 0
    assert (
        main(["collect", "--pooling", "token", "--sites", SITE, "--out", str(tok), "--no-augment", "--no-progress"])
        == 0
    )
    common = ["--degree", "2", "--rank", "2", "--epochs", "2", "--no-progress"]
    capsys.readouterr()

    def fails(argv, *parts):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tpc-hooks {argv[0]}: ") and err.count("\n") == 1, err
        for part in parts:
            assert part in err, err

    fails(
        ["train", "--acts", str(pooled), "--out", str(tmp_path / "m"), "--aggregate", "max", *common],
        "--aggregate set how a per-token monitor aggregates",
        "holds pooled rows (pooling 'mean')",
    )
    fails(["train", "--acts", str(pooled), "--out", str(tmp_path / "m"), "--window", "4", *common], "--window")
    fails(["train", "--acts", str(pooled), "--out", str(tmp_path / "m"), "--top-k", "2", *common], "--top-k set how")
    fails(
        ["train", "--acts", str(tok), "--out", str(tmp_path / "m"), "--aggregate", "sctopk", "--top-k", "0", *common],
        "top_k (the segments sctopk averages) must be a positive integer; got 0",
    )
    fails(
        ["train", "--acts", str(tok), "--out", str(tmp_path / "m"), "--site", "auto", *common],
        "a per-token monitor reads one site: pass --site",
    )
    fails(
        ["train", "--acts", str(tok), "--out", str(tmp_path / "m"), "--aggregate", "ema", "--alpha", "2", *common],
        "alpha (the EMA's weight on the newest token) must be in (0, 1]; got 2.0",
    )
    # collect.json says per-token, a split holds pooled rows (two collections in one directory)
    cfg = json.loads((pooled / "collect.json").read_text())
    (pooled / "collect.json").write_text(json.dumps({**cfg, "pooling": "token"}))
    fails(
        ["train", "--acts", str(pooled), "--out", str(tmp_path / "m"), *common],
        f"{pooled / 'train' / SITE} holds pooled rows (pooling 'mean'), but a per-token monitor",
        "--pooling token",
    )
    (pooled / "collect.json").write_text(json.dumps(cfg))

    assert main(["train", "--acts", str(pooled), "--out", str(tmp_path / "mean"), *common]) == 0
    assert main(["train", "--acts", str(tok), "--out", str(tmp_path / "token"), *common]) == 0
    assert tpc.Monitor.from_pretrained(tmp_path / "token").aggregate == "rolling"  # the default
    segments = ["--aggregate", "sctopk", "--window", "3", "--top-k", "2"]
    assert main(["train", "--acts", str(tok), "--out", str(tmp_path / "sc"), *segments, *common]) == 0
    sc = tpc.Monitor.from_pretrained(tmp_path / "sc")
    assert (sc.aggregate, sc.window, sc.top_k) == ("sctopk", 3, 2)
    cfg = sc.head.history.config  # trained on the aggregate it decides on, its segments the monitor's
    assert (cfg.objective, cfg.window, cfg.top_k) == ("sctopk", 3, 2)
    rows = ["--objective", "token"]
    assert main(["train", "--acts", str(tok), "--out", str(tmp_path / "sc-rows"), *segments, *rows, *common]) == 0
    assert tpc.Monitor.from_pretrained(tmp_path / "sc-rows").head.history.config.objective is None
    fails(
        ["train", "--acts", str(tok), "--out", str(tmp_path / "m"), "--objective", "sctopk", *common],
        "objective='sctopk' trains the aggregate a per-token monitor decides on",
    )
    fails(
        ["evaluate", "--monitor", str(tmp_path / "mean"), "--acts", str(tok), "--splits", "test"],
        f"{tok / 'test' / SITE} holds per-token rows (tpc-hooks collect --pooling token), but the monitor",
        "(pooling 'mean') reads pooled rows",
    )
    fails(
        ["evaluate", "--monitor", str(tmp_path / "token"), "--acts", str(pooled), "--splits", "test"],
        "holds pooled rows (pooling 'mean'), but the per-token monitor",
    )
    fails(
        [
            "evaluate",
            "--monitor",
            str(tmp_path / "mean"),
            "--acts",
            str(pooled),
            "--splits",
            "test",
            "--decision",
            "max",
        ],
        "--decision chooses how a per-token monitor scores a prompt",
        "pools ('mean')",
    )
    fails(
        ["attribute", "--monitor", str(tmp_path / "token"), "--prompt", HARMFUL[0]],
        "is a per-token monitor",
        "tpc.attribute(monitor, rows)",
    )


def test_collect_contexts_then_train_learns_from_the_hosted_chats(tmp_path, tiny_cli, monkeypatch, capsys):
    """collect --contexts writes ctx-train / ctx-val (chats hosting train / val prompts, their
    request spans); train adds their rows exactly as token_labels labels them, calibrates on the
    benign held-out chats too, and defaults to aggregate max; --no-contexts leaves them out."""
    from tpc_hooks.data import token_labels

    monkeypatch.setattr(cli, "_conversations", lambda tokenizer, n, tokens, exclude: tiny_chats(n))
    acts = tmp_path / "acts"
    assert (
        main(
            [
                "collect",
                "--pooling",
                "token",
                "--sites",
                SITE,
                "--out",
                str(acts),
                "--no-augment",
                "--no-intent",
                "--contexts",
                "10",
                "--context-tokens",
                "20",
                "30",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "ctx-train" in out and "ctx-val" in out
    tok = get_adapter(tiny_cli).tokenizer
    sets = _sets(None)
    n_rows = {}
    for split, prompts, n in (("ctx-train", sets["train"].texts, 8), ("ctx-val", sets["val"].texts, 2)):
        labels = json.loads((acts / split / "labels.json").read_text())
        spans = json.loads((acts / split / "spans.json").read_text())
        seqs = tpc.ActivationStore.open(acts / split / SITE).sequences()
        assert len(labels) == len(seqs) == len(spans["spans"]) == n and sorted(set(labels)) == [0, 1]
        sizes = {len(tok(t, add_special_tokens=False)["input_ids"]) for t in prompts}  # the split's own prompts
        for (start, stop), z in zip(spans["spans"], seqs, strict=True):
            assert 1 <= start < stop <= len(z) and stop - start in sizes
        n_rows[split] = sum(
            len(token_labels(len(z), a, b, c, skip=1, tail=spans["tail"])[1])
            for z, (a, b), c in zip(seqs, spans["spans"], labels, strict=True)
        )
    common = ["--degree", "2", "--rank", "2", "--epochs", "2", "--no-progress"]
    assert main(["train", "--acts", str(acts), "--out", str(tmp_path / "with"), *common]) == 0
    out = capsys.readouterr().out
    assert main(["train", "--acts", str(acts), "--out", str(tmp_path / "without"), "--no-contexts", *common]) == 0
    capsys.readouterr()
    with_, without = tpc.Monitor.from_pretrained(tmp_path / "with"), tpc.Monitor.from_pretrained(tmp_path / "without")
    assert (with_.aggregate, without.aggregate) == ("max", "rolling")
    assert with_.report["n_train_tokens"] == without.report["n_train_tokens"] + n_rows["ctx-train"]
    assert (with_.report["contexts"]["n_train"], with_.report["contexts"]["n_val"]) == (8, 2)
    assert "contexts" not in without.report
    n_benign_chats = json.loads((acts / "ctx-val" / "labels.json").read_text()).count(0)
    assert with_.report["operating_point"]["n_benign"] == without.report["operating_point"]["n_benign"] + n_benign_chats
    assert "8 ctx-train, 2 ctx-val chats included" in out
    # a damaged spans file is a clear error
    (acts / "ctx-val" / "spans.json").write_text(json.dumps({"spans": [[0, 1]], "tail": 2}))
    assert main(["train", "--acts", str(acts), "--out", str(tmp_path / "bad"), *common]) == 2
    assert "does not hold one request span per chat" in capsys.readouterr().err
    assert main(["collect", "--sites", SITE, "--out", str(tmp_path / "pooled"), "--contexts", "10"]) == 2
    assert "needs --pooling token" in capsys.readouterr().err
