"""``train_monitor(validation=...)``: the user's own validation prompts choose the site, ``C``, the orders
and the threshold, and the fit trains on every training prompt. Checked against the same prompts joined
and split by position (bit-identical), scikit-learn's probe on the same rows, a threshold taken by
sorting independently read scores, and ``tpc.evaluate``'s probe."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import StandardScaler
from test_outside_evaluation import BENIGN, HARMFUL, SETS, SITE, _by_hand
from tiny_models import hf_llama, nnsight_lm

import tpc_hooks as tpc
from tpc_hooks import TPCHooksError
from tpc_hooks.training import _train, _train_monitor, _train_request

TRAIN, Y_TR = HARMFUL[:6] + BENIGN[:6], np.array([1] * 6 + [0] * 6)
VAL, Y_VA = HARMFUL[6:] + BENIGN[6:], np.array([1] * 4 + [0] * 4)
ARGS = dict(degree=2, rank=2, epochs=2, target_fpr=0.25, recipe=tpc.recipes.default(prune_orders=False), verbose=False)


@pytest.fixture(scope="module")
def lm():
    return nnsight_lm(hf_llama())


@pytest.fixture(scope="module")
def given(lm):
    return tpc.train_monitor(lm, TRAIN, Y_TR, SITE, validation=(VAL, Y_VA), **ARGS)


def _rows(lm, texts):
    return tpc.collect(lm, texts, SITE, chat_template=True, progress=False)[SITE].double().numpy()


def test_the_fit_reads_every_training_prompt_and_chooses_on_the_validation_prompts(lm, monkeypatch):
    seen = []
    real = _train.fit

    def spy(*args, **kwargs):
        seen.append(args[:4])
        return real(*args, **kwargs)

    monkeypatch.setattr(_train, "fit", spy)
    mon = tpc.train_monitor(lm, TRAIN, Y_TR, SITE, validation=(VAL, Y_VA), **ARGS)
    X_tr, y_tr, X_va, y_va = seen[-1]
    np.testing.assert_allclose(np.asarray(X_tr, dtype=np.float64), _rows(lm, TRAIN), atol=1e-5)
    np.testing.assert_allclose(np.asarray(X_va, dtype=np.float64), _rows(lm, VAL), atol=1e-5)
    Xt, Xv = np.asarray(X_tr, dtype=np.float64), np.asarray(X_va, dtype=np.float64)
    assert list(y_tr) == list(Y_TR) and list(y_va) == list(Y_VA) and mon.report["n_train"] == len(TRAIN)
    # order 1 against scikit-learn: trained on every training prompt, C by AUROC on the validation prompts
    sc = StandardScaler().fit(Xt)
    Cs = tpc.FitConfig().resolved().Cs
    fits = [LogisticRegression(C=C, max_iter=500).fit(sc.transform(Xt), Y_TR) for C in Cs]
    aucs = [roc_auc_score(Y_VA, f.decision_function(sc.transform(Xv))) for f in fits]
    at = Cs.index(mon.head.history.selected[1]["C"])
    assert aucs[at] == pytest.approx(max(aucs))
    np.testing.assert_allclose(mon.head.linear.detach().double().numpy(), fits[at].coef_.ravel(), atol=1e-3)
    # the intercept within 5e-3: the head standardises in float32, and on 12 rows a dimension of tiny
    # spread moves scikit-learn's intercept by that much between float32 and float64 inputs
    got = mon.head(torch.as_tensor(Xv, dtype=torch.float32), order=1).detach().double().numpy()
    np.testing.assert_allclose(got, fits[at].decision_function(sc.transform(Xv)), atol=5e-3)
    # the threshold: target_fpr of the benign validation prompts, by sorting their scores
    benign = [t for t, y in zip(VAL, Y_VA, strict=True) if y == 0]
    assert mon.threshold == pytest.approx(_by_hand(mon.score(lm, benign).probs.double().numpy(), 0.25), abs=1e-5)
    split = mon.report["split"]
    assert (split["validation"], split["n_val"]) == ("given", len(VAL)) and "val_fraction" not in split


def test_it_is_the_joined_prompts_split_by_position(lm, given, monkeypatch):
    """Bit-identical to training on the prompts and the validation prompts joined, with the split
    forced to the positions and no refit on every prompt: given validation prompts change where the
    split falls and that nothing trains on them, nothing else."""
    n = len(TRAIN)
    monkeypatch.setattr(
        _train_request, "split_positions", lambda items, *a, **k: (np.arange(n), np.arange(n, len(items)))
    )
    monkeypatch.setattr(_train_monitor, "refits", lambda *a: False)
    joined = tpc.train_monitor(lm, TRAIN + VAL, np.r_[Y_TR, Y_VA], SITE, val_fraction=0.4, **ARGS)
    a, b = given.head.state_dict(), joined.head.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert given.threshold == joined.threshold


def test_evaluate_trains_its_probe_on_every_training_prompt(lm, given):
    ev = tpc.evaluate(lm, given, TRAIN, Y_TR, validation=(VAL, Y_VA), sets=SETS, fpr=0.25, n_sharegpt=0, verbose=False)
    Xt, Xv = _rows(lm, TRAIN), _rows(lm, VAL)
    sc = StandardScaler().fit(Xt)
    lr = LogisticRegression(C=ev.probe_C, max_iter=2000).fit(sc.transform(Xt), Y_TR)
    t = _by_hand(lr.decision_function(sc.transform(Xv[Y_VA == 0])), 0.25)
    shifted = _rows(lm, SETS["shifted"].texts)
    assert ev.n_everyday == int((Y_VA == 0).sum())
    assert ev.shares["probe"]["shifted"] == pytest.approx(
        float((lr.decision_function(sc.transform(shifted)) > t).mean())
    )
    with pytest.raises(TPCHooksError, match="pass the same validation= here"):
        tpc.evaluate(lm, given, TRAIN, Y_TR, sets=SETS, n_sharegpt=0, verbose=False)
    with pytest.raises(TPCHooksError, match="not the ones the monitor chose on"):
        tpc.evaluate(lm, given, TRAIN, Y_TR, validation=(VAL[::-1], list(Y_VA[::-1])), sets=SETS, n_sharegpt=0)


@pytest.mark.parametrize(
    "validation, kw, message",
    [
        (VAL, {}, r"validation must be \(prompts, labels\)"),
        ((VAL, Y_VA, None, None), {}, "of length 4"),
        ((VAL, Y_VA[:-1]), {}, "validation labels has 7 labels"),
        ((VAL, [0] * 8), {}, "validation labels has only one class"),
        ((VAL + [TRAIN[0].upper() + "  "], [*Y_VA, 1]), {}, "validation holds 1 of the training prompts"),
        ((VAL, Y_VA), {"sources": ["chat"] * 12}, r"give validation=\(prompts, labels, sources\) too"),
        ((VAL, Y_VA, ["chat"] * 8), {}, "pass sources= for them too"),
        ((VAL, Y_VA, ["chat"] * 7), {"sources": ["chat"] * 12}, "validation prompt"),
    ],
)
def test_bad_validation_is_refused_before_the_model_runs(validation, kw, message, monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("the model ran")

    monkeypatch.setattr(_train_request, "get_adapter", no_model)
    with pytest.raises(TPCHooksError, match=message):
        tpc.train_monitor(object(), TRAIN, Y_TR, SITE, validation=validation, **{**ARGS, **kw})
