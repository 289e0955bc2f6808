import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score, roc_auc_score
from sklearn.preprocessing import StandardScaler

import tpc_hooks as tpc
from tpc_hooks import ActivationStore

FAST = dict(rank=4, epochs=8, batch_size=256, verbose=False)


def test_scaler_and_degree_one_equal_sklearn(problem):
    Xtr, ytr, Xva, yva, Xte, _ = problem
    head = tpc.fit(Xtr, ytr, Xva, yva, degree=2, Cs=(1.0,), **FAST)
    sc = StandardScaler().fit(Xtr)
    np.testing.assert_allclose(head.scaler.mean.numpy(), sc.mean_, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(head.scaler.scale.numpy(), sc.scale_, rtol=1e-5)
    clf = LogisticRegression(C=1.0, max_iter=500).fit(sc.transform(Xtr), ytr)
    want = clf.decision_function(sc.transform(Xte))
    got = head(torch.tensor(Xte), order=1).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_rows_standardised_block_by_block_and_held_once_train_as_before(problem, monkeypatch):
    """The scaler's moments are summed and the rows standardised in blocks (here of 7 rows):
    scikit-learn's StandardScaler on the whole rows agrees; validation rows that are the training
    rows themselves (a refit's), held once, train the same head, bit for bit, as a copy of them."""
    from tpc_hooks.training._engine import _rows

    Xtr, ytr, Xva, yva, Xte, _ = problem
    monkeypatch.setattr(_rows, "_MOMENT_ELEMENTS", 7 * Xtr.shape[1])
    head = tpc.fit(Xtr, ytr, Xva, yva, degree=2, Cs=(1.0,), **FAST)
    sc = StandardScaler().fit(Xtr)
    np.testing.assert_allclose(head.scaler.mean.numpy(), sc.mean_, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(head.scaler.scale.numpy(), sc.scale_, rtol=1e-5)
    z = torch.tensor(Xte)
    np.testing.assert_allclose(
        head(z, order=1).detach().numpy(),
        LogisticRegression(C=1.0, max_iter=500).fit(sc.transform(Xtr), ytr).decision_function(sc.transform(Xte)),
        rtol=1e-4,
        atol=1e-4,
    )
    shared = tpc.fit(Xtr, ytr, Xtr, ytr, degree=2, Cs=(1.0,), **FAST)
    copied = tpc.fit(Xtr, ytr, Xtr.copy(), ytr.copy(), degree=2, Cs=(1.0,), **FAST)
    for (name, a), b in zip(shared.state_dict().items(), copied.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    "settings, metric", [({"recipe": "paper"}, "f1"), ({"probe_metric": "f1"}, "f1"), ({}, "auroc")]
)
def test_C_is_chosen_by_the_validation_metric(problem, settings, metric):
    Xtr, ytr, Xva, yva, _, _ = problem
    Cs = (10.0, 0.01, 0.0001)
    head = tpc.fit(Xtr, ytr, Xva, yva, degree=1, Cs=Cs, **FAST, **settings)
    sc = StandardScaler().fit(Xtr)
    fits = [LogisticRegression(C=C, max_iter=500).fit(sc.transform(Xtr), ytr) for C in Cs]
    f1s = [f1_score(yva, lr.predict(sc.transform(Xva))) for lr in fits]
    aucs = [roc_auc_score(yva, lr.decision_function(sc.transform(Xva))) for lr in fits]
    want = f1s if metric == "f1" else aucs
    assert head.history.selected[1]["C"] == Cs[int(np.argmax(want))]
    assert head.history.selected[1][f"val_{metric}"] == pytest.approx(max(want))
    assert head.history.config.probe_metric == metric


def test_higher_degrees_leave_lower_truncations_bit_identical(problem):
    Xtr, ytr, Xva, yva, Xte, _ = problem
    z = torch.tensor(Xte)
    h3 = tpc.fit(Xtr, ytr, Xva, yva, degree=3, seed=5, **FAST)
    h5 = tpc.fit(Xtr, ytr, Xva, yva, degree=5, init=h3, seed=5, **FAST)
    with torch.no_grad():
        for n in (1, 2, 3):
            assert torch.equal(h3(z, order=n), h5(z, order=n))
    for name, p in h3.state_dict().items():
        assert torch.equal(p, h5.state_dict()[name]), name
    assert not torch.equal(h5.lambdas["4"], torch.zeros(4))
    # one fit to degree 4 trains degrees 1..3 exactly as a fit to degree 3 does
    h4 = tpc.fit(Xtr, ytr, Xva, yva, degree=4, seed=5, **FAST)
    with torch.no_grad():
        for n in (1, 2, 3):
            assert torch.equal(h3(z, order=n), h4(z, order=n))


def test_fixed_seed_gives_identical_heads(problem):
    Xtr, ytr, Xva, yva, _, _ = problem
    a = tpc.fit(Xtr, ytr, Xva, yva, degree=3, seed=1, dropout=0.2, **FAST)
    b = tpc.fit(Xtr, ytr, Xva, yva, degree=3, seed=1, dropout=0.2, **FAST)
    c = tpc.fit(Xtr, ytr, Xva, yva, degree=3, seed=2, dropout=0.2, **FAST)
    for name, p in a.state_dict().items():
        assert torch.equal(p, b.state_dict()[name]), name
    assert not torch.equal(a.factors["2"], c.factors["2"])


def test_best_validation_epoch_is_kept(problem):
    Xtr, ytr, Xva, yva, _, _ = problem
    head = tpc.fit(Xtr, ytr, Xva, yva, degree=3, lr=3e-2, trust_region=False, shrink=False, **FAST)
    for k in (2, 3):
        recs = head.history.for_degree(k)
        assert [r["epoch"] for r in recs] == list(range(FAST["epochs"]))
        best = min(recs, key=lambda r: r["val_loss"])
        assert head.history.selected[k]["best_epoch"] == best["epoch"]
        s = head(torch.tensor(Xva), order=k).detach().double()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(s, torch.tensor(yva, dtype=torch.float64))
        assert float(loss) == pytest.approx(best["val_loss"], rel=1e-4)


def test_progressive_training_gains_over_the_linear_probe(problem):
    Xtr, ytr, Xva, yva, Xte, yte = problem
    head = tpc.fit(Xtr, ytr, Xva, yva, degree=3, rank=8, epochs=40, batch_size=256, verbose=False)
    z = torch.tensor(Xte)
    f1 = [f1_score(yte, (head(z, order=n) > 0).numpy()) for n in (1, 2, 3)]
    assert f1[1] > f1[0] + 0.03 and f1[2] > f1[0] + 0.03, f1


def test_joint_mode_trains_every_term(problem):
    Xtr, ytr, Xva, yva, _, _ = problem
    head = tpc.fit(Xtr, ytr, Xva, yva, degree=3, mode="joint", **FAST)
    assert head.history.mode == "joint"
    assert not torch.equal(head.linear, torch.zeros(12))
    assert not torch.equal(head.lambdas["3"], torch.zeros(4))
    assert len(head.history.for_degree(3)) == FAST["epochs"]


def test_sweep_selects_best_validation_f1(problem):
    Xtr, ytr, Xva, yva, _, _ = problem
    head = tpc.fit(Xtr, ytr, Xva, yva, degree=2, sweep={"lr": [1e-4, 3e-2], "dropout": [0.0, 0.5]}, **FAST)
    recs = [r for r in head.history.records if r["degree"] == 2]
    assert {r["trial"] for r in recs} == {0, 1, 2, 3}
    best_per_trial = {t: min((r for r in recs if r["trial"] == t), key=lambda r: r["val_loss"]) for t in range(4)}
    chosen = max(best_per_trial.items(), key=lambda kv: (kv[1]["val_f1"], -kv[1]["val_loss"]))[0]
    assert head.history.selected[2]["trial"] == chosen


def test_validation_split_is_stratified_and_reproducible(problem):
    Xtr, ytr, *_ = problem
    a = tpc.fit(Xtr, ytr, degree=2, **FAST)
    b = tpc.fit(Xtr, ytr, degree=2, **FAST)
    assert torch.equal(a.factors["2"], b.factors["2"])
    assert a.history.selected[1]["val_f1"] > 0.5


def test_store_training_streams_and_matches(tmp_path, problem):
    Xtr, ytr, Xva, yva, Xte, yte = problem
    store = ActivationStore.create(tmp_path / "acts", d_model=12)
    for a in range(0, len(Xtr), 400):
        store.append(Xtr[a : a + 400])
    mem = tpc.fit(Xtr, ytr, Xva, yva, degree=2, Cs=(1.0,), **FAST)
    disk = tpc.fit(store, ytr, Xva, yva, degree=2, Cs=(1.0,), chunk_rows=300, **FAST)
    torch.testing.assert_close(disk.scaler.mean, mem.scaler.mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(disk.linear, mem.linear, rtol=1e-4, atol=1e-4)
    streamed = tpc.fit(store, ytr, Xva, yva, degree=1, Cs=(1.0,), linear_solver="lbfgs", chunk_rows=300, **FAST)
    torch.testing.assert_close(streamed.linear, mem.linear, rtol=2e-3, atol=2e-3)
    z = torch.tensor(Xte)
    f1_mem = f1_score(yte, (mem(z) > 0).numpy())
    f1_disk = f1_score(yte, (disk(z) > 0).numpy())
    assert abs(f1_mem - f1_disk) < 0.05


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda X, y: (X[:0], y[:0]), "X_train is empty"),
        (lambda X, y: (X, y[:-1]), "y_train has 1499 labels but the features have 1500 rows"),
        (lambda X, y: (X, np.zeros_like(y)), r"only one class: all 1500 labels are 0 \(benign\)"),
        (lambda X, y: (X, y * 2), r"binary labels 0 \(benign\) and 1 \(harmful\); found \[2.0\]"),
        (
            lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 30, np.inf, X), y),
            r"X_train contains 1 NaN/inf value\(s\), first at index \(2, 6\)",
        ),
        (lambda X, y: (X[:, None], y), r"X_train must be a 2-D array \[n_samples, d_model\]"),
    ],
)
def test_bad_training_input(problem, mutate, message):
    X, y = mutate(problem[0], problem[1])
    with pytest.raises(tpc.TPCHooksError, match=message):
        tpc.fit(X, y, degree=2, **FAST)


def test_bad_training_options(problem):
    Xtr, ytr, Xva, yva, _, _ = problem
    with pytest.raises(tpc.TPCHooksError, match="X_val has d_model=11 but the head expects d_model=12"):
        tpc.fit(Xtr, ytr, Xva[:, :11], yva, **FAST)
    with pytest.raises(tpc.TPCHooksError, match="pass both X_val and y_val"):
        tpc.fit(Xtr, ytr, Xva, **FAST)
    with pytest.raises(tpc.TPCHooksError, match="mode must be 'progressive' or 'joint'"):
        tpc.fit(Xtr, ytr, mode="greedy", **FAST)
    with pytest.raises(tpc.TPCHooksError, match="dropout must be in"):
        tpc.fit(Xtr, ytr, dropout=1.0, **FAST)
    with pytest.raises(tpc.TPCHooksError, match="group_rule must be 'balanced' or 'worst'; got 'mean'"):
        tpc.fit(Xtr, ytr, group_rule="mean", **FAST)
    small = tpc.fit(Xtr, ytr, Xva, yva, degree=2, **FAST)
    with pytest.raises(tpc.TPCHooksError, match="X_train has d_model=11 but the head expects d_model=12"):
        tpc.fit(Xtr[:, :11], ytr, degree=3, init=small, **FAST)
    with pytest.raises(tpc.TPCHooksError, match="degree=1 is below init's degree 2"):
        tpc.fit(Xtr, ytr, degree=1, init=small, **FAST)


def test_float64_input_trains_like_float32_and_leaves_global_rng_alone(problem):
    Xtr, ytr, Xva, yva, _, _ = problem
    before = torch.random.get_rng_state()
    a = tpc.fit(Xtr, ytr, Xva, yva, degree=2, **FAST)
    assert torch.equal(torch.random.get_rng_state(), before)
    b = tpc.fit(Xtr.astype(np.float64), ytr, Xva.astype(np.float64), yva, degree=2, **FAST)
    for name, p in a.state_dict().items():
        assert torch.equal(p, b.state_dict()[name]), name


def _val_loss(head, X, y, order):
    s = head(torch.tensor(X), order=order).detach().double()
    return float(torch.nn.functional.binary_cross_entropy_with_logits(s, torch.tensor(y, dtype=torch.float64)))


def test_a_degree_never_worsens_validation_loss(problem):
    Xtr, ytr, Xva, yva, _, _ = problem
    wild = tpc.fit(Xtr, ytr, Xva, yva, degree=3, lr=5.0, **{**FAST, "epochs": 3})  # training only hurts here
    for k in (2, 3):
        assert _val_loss(wild, Xva, yva, k) <= _val_loss(wild, Xva, yva, k - 1) + 1e-6
        if wild.history.selected[k]["best_epoch"] == -1:
            assert torch.equal(wild.lambdas[str(k)], torch.zeros(4))
    assert any(wild.history.selected[k]["best_epoch"] == -1 for k in (2, 3))


def test_early_stopping_counts_epochs_since_the_best(problem):
    Xtr, ytr, Xva, yva, _, _ = problem
    head = tpc.fit(Xtr, ytr, Xva, yva, degree=3, patience=2, lr=3e-2, **{**FAST, "epochs": 40})
    for k in (2, 3):
        recs = head.history.for_degree(k)
        best = head.history.selected[k]["best_epoch"]
        assert len(recs) == min(40, best + 2 + 2)
        assert all(r["val_loss"] >= head.history.selected[k]["val_loss"] for r in recs)
    full = tpc.fit(Xtr, ytr, Xva, yva, degree=2, patience=None, lr=3e-2, **{**FAST, "epochs": 12})
    assert len(full.history.for_degree(2)) == 12


def test_l1_concentrates_the_factors(problem):
    Xtr, ytr, Xva, yva, _, _ = problem
    kw = {**FAST, "epochs": 25, "rank": 6}
    plain = tpc.fit(Xtr, ytr, Xva, yva, degree=2, lr=1e-2, patience=None, **kw)
    sparse = tpc.fit(Xtr, ytr, Xva, yva, degree=2, lr=1e-2, patience=None, experimental={"l1": 1e-2}, **kw)

    def share_of_mass_in_top_quarter(U):  # per factor column, how concentrated |U| is
        a = U.detach().abs()
        top = a.topk(a.shape[0] // 4, dim=0).values.sum(0)
        return float((top / a.sum(0)).mean())

    assert share_of_mass_in_top_quarter(sparse.factors["2"]) > share_of_mass_in_top_quarter(plain.factors["2"]) + 0.05
    assert float(sparse.factors["2"].abs().sum()) < float(plain.factors["2"].abs().sum())
    with pytest.raises(tpc.TPCHooksError, match="l1 must be a finite number >= 0"):
        tpc.fit(Xtr, ytr, experimental={"l1": -1.0}, **FAST)


def test_consistency_pulls_higher_orders_to_add_nothing_on_the_unlabelled_rows(problem):
    Xtr, ytr, Xva, yva, Xte, _ = problem
    Xu = Xte[:400]
    z = torch.tensor(Xu)
    free = tpc.fit(Xtr, ytr, Xva, yva, degree=3, seed=3, shrink=False, **FAST)
    held = tpc.fit(Xtr, ytr, Xva, yva, degree=3, seed=3, shrink=False, X_unlabelled=Xu, consistency=30.0, **FAST)
    with torch.no_grad():
        assert torch.equal(free(z, order=1), held(z, order=1))  # degree 1 is the probe either way
        t_free, t_held = free.terms(z)[:, 1:], held.terms(z)[:, 1:]
    for k in (0, 1):  # each higher degree's term on the unlabelled rows, mean square
        assert float(t_held[:, k].square().mean()) < 0.5 * float(t_free[:, k].square().mean())
    assert held.history.config.consistency == 30.0


def test_contrast_ranks_each_harmful_row_above_its_counterpart(problem):
    """The contrast loss lowers the pairs' ranking loss at the higher orders (the objective it adds),
    leaves degree 1 (the probe) bit-identical, and is recorded in the config."""
    Xtr, ytr, Xva, yva, _, _ = problem
    pos, neg = np.flatnonzero(ytr == 1)[:150], np.flatnonzero(ytr == 0)[:150]
    pairs = np.stack([pos, neg], 1)
    z = torch.tensor(Xtr)
    free = tpc.fit(Xtr, ytr, Xva, yva, degree=3, seed=3, shrink=False, **FAST)
    held = tpc.fit(
        Xtr, ytr, Xva, yva, degree=3, seed=3, shrink=False, pairs=pairs, experimental={"contrast": 30.0}, **FAST
    )

    def rank_loss(head, order):
        with torch.no_grad():
            s = head(z, order=order).double()
        return float(torch.nn.functional.softplus(s[neg] - s[pos]).mean())

    with torch.no_grad():
        assert torch.equal(free(z, order=1), held(z, order=1))
    assert rank_loss(held, 3) < rank_loss(free, 3)
    assert held.history.config.experimental["contrast"] == 30.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(pairs="pairs"), "only read by the contrast loss"),
        (dict(experimental={"contrast": 1.0}), "contrast > 0 needs pairs"),
        (dict(experimental={"contrast": -1.0}, pairs="pairs"), "contrast must be a finite number"),
        (dict(experimental={"contrast": 1.0}, pairs="swapped"), "each pair is"),
        (dict(experimental={"contrast": 1.0}, pairs="outside"), "pairs index rows"),
        (dict(experimental={"contrast": 1.0}, pairs="flat"), r"\[m, 2\]"),
        (
            dict(experimental={"contrast": 1.0}, pairs="pairs", mode="joint", trust_region=False, shrink=False),
            "needs mode='progressive'",
        ),
    ],
)
def test_bad_contrast_settings(problem, kwargs, message):
    Xtr, ytr, Xva, yva, _, _ = problem
    pairs = np.stack([np.flatnonzero(ytr == 1)[:5], np.flatnonzero(ytr == 0)[:5]], 1)
    named = {"pairs": pairs, "swapped": pairs[:, ::-1], "outside": pairs + len(ytr), "flat": pairs[:, 0]}
    kwargs = {k: named.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(tpc.TPCHooksError, match=message):
        tpc.fit(Xtr, ytr, Xva, yva, degree=2, **FAST, **kwargs)
    with pytest.raises(tpc.TPCHooksError, match="pass X_val and y_val"):
        tpc.fit(Xtr, ytr, degree=2, pairs=pairs, experimental={"contrast": 1.0}, **FAST)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(X_unlabelled="Xu"), "only read by the consistency penalty"),
        (dict(consistency=1.0), "consistency > 0 needs X_unlabelled"),
        (dict(consistency=-1.0, X_unlabelled="Xu"), "consistency must be a finite number"),
        (
            dict(consistency=1.0, X_unlabelled="Xu", mode="joint", trust_region=False, shrink=False),
            "needs mode='progressive'",
        ),
        (dict(consistency=1.0, X_unlabelled="narrow"), "d_model"),
    ],
)
def test_bad_consistency_settings(problem, kwargs, message):
    Xtr, ytr, Xva, yva, Xte, _ = problem
    kwargs = {
        k: {"Xu": Xte[:50], "narrow": Xte[:50, :5]}.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()
    }
    with pytest.raises(tpc.TPCHooksError, match=message):
        tpc.fit(Xtr, ytr, Xva, yva, degree=2, **FAST, **kwargs)
