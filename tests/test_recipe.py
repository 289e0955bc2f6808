"""One recipe, two doors: ``train_monitor`` (collects from the model) and ``tpc-hooks collect`` ->
``tpc-hooks train`` (stores on disk) give the same monitor from the same prompts, bit for bit.

The CLI is handed the split ``train_monitor`` draws (recomputed here with scikit-learn's
``train_test_split``, the same call) and writes the same phrasing rewrites; everything after
that is the CLI's own reading of its stores."""

import json

import numpy as np
import pytest
import torch
from sklearn.model_selection import train_test_split
from tiny_models import TINY_BENIGN, TINY_HARMFUL, hooked_gpt2_style, prompt_set

import tpc_hooks as tpc
from tpc_hooks.cli import _models as cli_models
from tpc_hooks.cli import _verbs as cli

pytest.importorskip("transformer_lens")

SITE = "blocks.1.hook_resid_post"
PROMPTS, LABELS = TINY_HARMFUL + TINY_BENIGN, np.array([1] * 10 + [0] * 10)
FIT = dict(degree=2, rank=2, epochs=2, seed=0)


@pytest.fixture(scope="module")
def model():
    return hooked_gpt2_style()


def _sets(val_fraction: float):
    """train_monitor's split of PROMPTS, as PromptSets for the CLI's collect."""
    n_val = max(2, int(round(val_fraction * len(PROMPTS))))
    tr, va = train_test_split(np.arange(len(PROMPTS)), test_size=n_val, stratify=LABELS, random_state=FIT["seed"])
    return {name: prompt_set([PROMPTS[i] for i in idx], LABELS[idx]) for name, idx in (("train", tr), ("val", va))}


def _saved(path):
    cfg = json.loads((path / "config.json").read_text())
    mon = cfg.pop("monitor")
    for door_only in ("model", "prepend_bos"):  # what each door knows of the model, not what it trained
        mon.pop(door_only)
    return cfg, mon, (path / "model.safetensors").read_bytes()


def _write_stores(acts, data, plan, pooling):
    """The rows train_monitor handed the recipe, written as the stores ``tpc-hooks collect`` writes:
    ``train``, ``aug``, ``flips``, ``homonyms``, ``val`` and one ``val-<group>`` split per validation group."""
    from tpc_hooks.training._train import PLAIN

    meta = {"pooling": pooling, "fixed_prefix": plan.monitor.skip, "prepend_bos": plan.monitor.prepend_bos}
    parts = {"train": (data.train.X, data.train.y)}
    if data.rewrites is not None:
        parts["aug"] = (data.rewrites.X, data.rewrites.y)
    if data.flips is not None:
        parts["flips"] = (data.flips.X, data.flips.y)
    if data.homonyms is not None:
        parts["homonyms"] = (data.homonyms.X, data.homonyms.y)
    for group in dict.fromkeys(data.val.groups.tolist()):
        at = np.flatnonzero(data.val.groups == group)
        X = data.val.X[at] if pooling != "token" else [data.val.X[i] for i in at]
        parts["val" if group == PLAIN else f"val-{group}"] = (X, data.val.y[at])
    for split, (X, y) in parts.items():
        st = tpc.ActivationStore.create(acts / split / SITE, 32, meta=meta, sequences=pooling == "token")
        if pooling == "token":
            st.append(torch.cat(list(X)).numpy(), lengths=[len(z) for z in X])
        else:
            st.append(X.numpy())
        (acts / split / "labels.json").write_text(json.dumps(y.tolist()))
    (acts / "collect.json").write_text(
        json.dumps(
            {
                "model": "tiny",
                "sites": [SITE],
                "pooling": pooling,
                "chat_template": plan.monitor.chat_template,
                "max_tokens": plan.monitor.max_tokens,
            }
        )
    )


@pytest.mark.parametrize(
    "pooling, recipe", [("mean", "intent"), ("max", "default"), ("token", "phrasing"), ("mean", "in_distribution")]
)
def test_train_monitor_and_the_cli_train_the_same_monitor_from_the_same_rows(
    tmp_path, monkeypatch, model, pooling, recipe
):
    from tpc_hooks.training import _train, _train_monitor

    seen = []
    real = _train.train

    def spy(data, plan, **kw):
        return seen.append((data, plan)) or real(data, plan, **kw)

    monkeypatch.setattr(_train_monitor, "train", spy)  # train_monitor's last step
    monkeypatch.setattr(cli, "train", spy)  # the CLI's own reference to the recipe
    api = tpc.train_monitor(
        model,
        PROMPTS,
        LABELS,
        SITE,
        pooling,
        recipe=tpc.recipes.named(recipe),
        tau=0.2,
        val_fraction=0.2,
        verbose=False,
        **FIT,
    )
    api.save_pretrained(tmp_path / "api")
    ((data, plan),) = seen
    acts = tmp_path / "acts"
    _write_stores(acts, data[SITE], plan, pooling)
    assert (
        cli.main(
            [
                "train",
                "--acts",
                str(acts),
                "--out",
                str(tmp_path / "cli"),
                "--degree",
                "2",
                "--rank",
                "2",
                "--epochs",
                "2",
                "--tau",
                "0.2",
                "--recipe",
                recipe,
                "--no-progress",
            ]
        )
        == 0
    )
    assert len(seen) == 2  # the CLI went through the same recipe
    cfg_cli, mon_cli, w_cli = _saved(tmp_path / "cli")
    cfg_api, mon_api, w_api = _saved(tmp_path / "api")
    assert w_cli == w_api  # the head, bit for bit
    assert cfg_cli == cfg_api  # shape, trust region, training history and settings
    # train_monitor records how it split its prompts (what tpc.evaluate re-splits by); the CLI trains on
    # splits tpc-hooks collect already made, so its report has no such record
    assert mon_api["report"].pop("split") == {
        "val_fraction": 0.2,
        "split": "stratified",
        "seed": FIT.get("seed", 0),
        "n_calibration": 0,
    }
    assert "split" not in mon_cli["report"]
    # ... and the forward passes its one collection took (the CLI's collect says its own before it runs)
    assert mon_api["report"].pop("forward_passes")["prompts"] == len(PROMPTS)
    assert mon_cli == mon_api  # site, pooling, threshold, cascade calibration, the whole report
    z = torch.randn(5, 32)
    assert torch.equal(tpc.Monitor.from_pretrained(tmp_path / "cli").policy()(z).logits, api.policy()(z).logits)


def test_the_cli_collects_the_rows_train_monitor_collects(tmp_path, monkeypatch, model):
    """The CLI's collect writes the prompts of train_monitor's split and the same phrasing rewrites;
    their activations agree up to batching (prompts are batched per split there, all at once here)."""
    from tpc_hooks.training import _train, _train_monitor

    seen = []
    real = _train.train
    monkeypatch.setattr(_train_monitor, "train", lambda data, plan, **kw: seen.append(data) or real(data, plan, **kw))
    tpc.train_monitor(
        model, PROMPTS, LABELS, SITE, recipe=tpc.recipes.intent(), tau=0.2, val_fraction=0.2, verbose=False, **FIT
    )
    monkeypatch.setattr(cli_models, "load_named", lambda name, toolkit: model)
    monkeypatch.setattr(cli, "prompt_sets", lambda args: (_sets(0.2), None))
    acts = tmp_path / "acts"
    assert cli.main(["collect", "--sites", SITE, "--out", str(acts), "--no-progress"]) == 0
    d = seen[0][SITE]

    def store(split):
        return torch.from_numpy(tpc.ActivationStore.open(acts / split / SITE).to_numpy())

    torch.testing.assert_close(store("train"), d.train.X, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(store("aug"), d.rewrites.X, rtol=1e-5, atol=1e-5)
    from tpc_hooks.data import PHRASING_FAMILIES

    val = torch.cat([store("val")] + [store(f"val-{f}") for f in PHRASING_FAMILIES] + [store("val-intent")])
    torch.testing.assert_close(val, d.val.X, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(store("flips"), d.flips.X, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(store("homonyms"), d.homonyms.X, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "token"])
def test_train_monitor_reports_the_thresholds_rate_on_each_source_of_its_benign_validation_prompts(model, pooling):
    """Sources change no threshold; the report counts the benign prompts of each source the
    threshold was set on (every prompt's out-of-fold score when the monitor is refit on every
    prompt, else the split train_monitor draws) and the flags add up to the operating point's."""
    names = [f"src{i % 3}" for i in range(len(PROMPTS))]
    kw = dict(val_fraction=0.3, target_fpr=0.34, verbose=False, **FIT)  # 1 of the 3 benign validation prompts
    plain = tpc.train_monitor(model, PROMPTS, LABELS, SITE, pooling, **kw)
    mon = tpc.train_monitor(model, PROMPTS, LABELS, SITE, pooling, sources=names, **kw)
    op = mon.report["operating_point"]
    assert mon.threshold == plain.threshold and op["flagged"] == plain.report["operating_point"]["flagged"]
    n_val = max(2, int(round(0.3 * len(PROMPTS))))
    _, va = train_test_split(np.arange(len(PROMPTS)), test_size=n_val, stratify=LABELS, random_state=FIT["seed"])
    rows = range(len(PROMPTS)) if "refit" in mon.report else va
    assert ("refit" in mon.report) == (pooling != "token")  # a per-token monitor keeps its split
    benign = [names[i] for i in rows if LABELS[i] == 0]
    assert {s: v["n"] for s, v in op["by_source"].items()} == {s: benign.count(s) for s in set(benign)}
    assert sum(v["flagged"] for v in op["by_source"].values()) == op["flagged"]
    assert op["spread"] == [
        min(v["rate"] for v in op["by_source"].values()),
        max(v["rate"] for v in op["by_source"].values()),
    ]
    with pytest.raises(tpc.TPCHooksError, match=r"one name per prompt \(20\); got 19"):
        tpc.train_monitor(model, PROMPTS, LABELS, SITE, pooling, sources=names[:-1], **kw)
