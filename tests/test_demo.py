"""`tpc-hooks demo --quick` end to end on the packaged model and prompt set (about 7 minutes alone)."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import tpc_hooks as tpc
from tpc_hooks import offline

try:
    offline.gguf_path()
    from tpc_hooks.data import default_prompt_set  # noqa: F401
except tpc.TPCHooksError as err:
    pytest.skip(str(err), allow_module_level=True)

pytestmark = pytest.mark.slow  # the packaged model and prompt set, end to end


def quick_demo(out, *extra):
    proc = subprocess.run(
        [sys.executable, "-m", "tpc_hooks", "demo", "--quick", "--no-progress", *extra, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=3600,  # a guard against a hang, not a speed check (a slow core takes several times a fast one's)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    return out, quick_demo(out)


def test_quick_demo_writes_a_complete_run(default_run):
    out, proc = default_run
    assert "F1 by order, heldout" in proc.stdout
    res = json.loads((out / "results.json").read_text())
    assert set(res["sizes"]) == {"train", "val", "test", "heldout"}
    methods = {r["method"] for r in res["f1"]["test"]}
    assert methods == set(res["methods"]) and {r["method"] for r in res["f1"]["heldout"]} == methods
    assert [r["tau"] for r in res["cascade"]["tpc"]] == [r["tau"] for r in res["cascade"]["early_exit"]]
    assert res["cascade"]["tpc"][-1]["relative_flops"] == 1.0  # tau=0.5: every prompt stops at the linear probe
    assert len(res["live"]) == 4 and all(len(g["scores"]) >= 1 for g in res["live"])
    assert sum(res["attribution"]["by_order"]) == pytest.approx(res["attribution"]["logit"], abs=1e-3)
    report = (out / "report.md").read_text()
    feats = res["attribution"]["sae"]  # the same decision in the features of the packaged prompts' SAE
    assert feats["reconstruction"]["l0"] <= 32 and feats["top_features"] and feats["labels"]
    assert set(feats["labels"]) <= {str(u) for u, _ in feats["top_features"]} | {
        str(u) for ps in feats["top_pairs"].values() for i, j, _ in ps for u in (i, j)
    }
    assert "features of an SAE" in report and (out / "attribution.html").read_text().count("<table>") == 6
    for part in ("F1 by order, test", "TPC cascade", "Live monitored generations", "Attribution", "Time per stage"):
        assert part in report
    for plot in ("f1_by_order.png", "cascade.png", "exit_orders.png", "calibration.png", "attribution.png"):
        assert (out / plot).stat().st_size > 1000
    mon = tpc.Monitor.from_pretrained(out / "monitor")
    assert mon.site == res["site"] and mon.chat_template and mon.cascade is not None
    # what a deployment sees: the saved monitor is train_monitor's, and its row is its own threshold on the test split
    dep = res["deployment"]
    assert "What a deployment sees" in report and mon.report["recipe"] == "default"
    assert (
        mon.report["augment"]["intent"] == [] and mon.report["augment"]["n_train_rewrites"] == 0
    )  # the prompts as given
    assert [r["order"] for r in dep["rows"]] == [str(n) for n in range(1, mon.head.degree + 1)] + ["deployed"]
    assert dep["orders"]["kept"] == mon.head.degree and set(dep["n_hard"]) >= {"homonym", "law", "fiction"}
    op = mon.report["operating_point"]  # the threshold's rate on each source of the benign validation prompts
    everyday = {k: v for k, v in op["by_source"].items() if k in op["everyday"]}  # the threshold is set on these
    assert op["everyday"] == ["calibration", "gsm8k", "sharegpt"] and dep["by_source"] == op["by_source"]
    assert (
        op["by_source"]["calibration"]["n"] == 200 == mon.report["split"]["n_calibration"]
    )  # ShareGPT outside the set
    assert sum(v["n"] for v in everyday.values()) == op["n_benign"] < sum(v["n"] for v in op["by_source"].values())
    assert sum(v["flagged"] for v in everyday.values()) == op["flagged"] and "sharegpt, wrapped" in op["by_source"]
    assert "flags of each source's" in report
    # beside a probe trained on its own rows, on the sets another hand built (40 prompts of each in a quick run)
    outside = res["outside"]
    assert list(outside["sets"]) == [
        "test harmful",
        "test benign",
        "edgy",
        "counterparts",
        "past",
        "future",
        "harmbench",
        "refusal_benign",
        "sharegpt",
    ]
    assert all(0 < v["n"] <= 40 for v in outside["sets"].values()) and outside["sets"]["edgy"]["n_seen"] > 0
    assert set(outside["shares"]) == {
        "probe",
        "monitor, deployed",
        *(f"order {n}" for n in range(1, mon.head.degree + 1)),
    }
    assert outside["markdown"] in report and (out / "outside.md").read_text().strip() == outside["markdown"].strip()
    assert (out / "outside.png").stat().st_size > 1000
    from tpc_hooks.cli._demo import _subsample
    from tpc_hooks.data import default_prompt_set

    labels = np.asarray(_subsample(default_prompt_set(seed=0)["test"], 160, 0).labels)
    X = torch.as_tensor(tpc.ActivationStore.open(out / "activations" / "test" / res["site"]).to_numpy())
    with torch.no_grad():  # the monitor's rule: its policy's logit at or above logit(threshold)
        flagged = (mon.policy()(X).logits.double() >= np.log(mon.threshold / (1 - mon.threshold))).numpy()
    assert len(labels) == len(X) and dep["rows"][-1]["recall"] == pytest.approx(
        flagged[labels == 1].mean(), abs=1.01 / labels.sum()
    )


def test_the_demo_monitor_on_the_plain_transformers_model_generates_the_same_text(default_run):
    """The monitor the demo deployed, on the same model through the transformers adapter: the same
    activations, so the same monitored generations and scores as the demo's own (TransformerLens)."""
    from tpc_hooks.adapters import get_adapter
    from tpc_hooks.offline import load_model

    out, _ = default_run
    live = json.loads((out / "results.json").read_text())["live"]
    mon = tpc.Monitor.from_pretrained(out / "monitor")
    model = load_model(toolkit="transformers")
    run = mon.generate(model, [g["prompt"] for g in live], max_new_tokens=8, action="stop")
    tok = get_adapter(model).tokenizer
    assert [tok.decode(run.generated(b), skip_special_tokens=True) for b in range(len(live))] == [
        g["generated"] for g in live
    ]
    assert any(g["generated"] for g in live)
    for b, g in enumerate(live):  # the demo's scores are rounded to 3 decimals; activations equal to float noise
        assert [float(v) for v in run.scores[b]] == pytest.approx(g["scores"], abs=2e-3)
        assert run.stopped_at[b] == g["stopped_at"]
