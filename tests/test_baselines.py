"""Baselines (paper App. C): forward passes, cost accounting, matching, cascade, training, compare()."""

import itertools

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import tpc_hooks as tpc
from tpc_hooks import baselines as B
from tpc_hooks.synthetic import make_problem
from tpc_hooks.training._engine._loop import f1_at_zero

D = 8


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    torch.manual_seed(0)
    np.random.seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: thread start-up would dominate on a busy 2-core machine
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def splits():
    """Train / val / test of one synthetic problem (world 0), drawn with different seeds."""
    return [make_problem(n=n, d_model=D, seed=s, world=0) for n, s in ((600, 0), (300, 1), (400, 2))]


FAST = {"epochs": 25, "batch_size": 64, "lr": 1e-2, "verbose": False}


def _random_scaler(module):
    with torch.no_grad():
        module.scaler.mean.copy_(torch.randn(module.d_model))
        module.scaler.scale.copy_(torch.rand(module.d_model) + 0.5)


def _std(module, z):
    return (z.double() - module.scaler.mean.double()) / module.scaler.scale.double()


def _accuracy(y, logits):
    return float(((np.asarray(logits) > 0) == (np.asarray(y) == 1)).mean())


# ---------------------------------------------------------------------- forward passes
def test_bilinear_forward_matches_hand_loop():
    probe = B.BilinearProbe(D, rank=3)
    _random_scaler(probe)
    with torch.no_grad():
        probe.bias.fill_(0.3)
        probe.linear.copy_(torch.randn(D))
    z = torch.randn(5, D)
    zs = _std(probe, z)
    M = probe.A.detach().double().T @ probe.A.detach().double()  # A^T A materialised
    w = probe.linear.detach().double()
    expected = torch.zeros(5, dtype=torch.float64)
    for b in range(5):
        expected[b] = 0.3 + sum(w[i] * zs[b, i] for i in range(D))
        expected[b] += sum(zs[b, i] * M[i, j] * zs[b, j] for i in range(D) for j in range(D))
    torch.testing.assert_close(probe(z).double(), expected, rtol=1e-5, atol=1e-5)
    assert probe(z[0]).shape == ()


@pytest.mark.parametrize("hidden", [0, 5])
def test_mlp_forward_matches_manual_matmuls(hidden):
    mlp = B.MLPProbe(D, hidden=hidden).eval()
    _random_scaler(mlp)
    z = torch.randn(6, D)
    zs = _std(mlp, z)
    W_out, b_out = mlp.out.weight.detach().double(), mlp.out.bias.detach().double()
    if hidden:
        h = (zs @ mlp.inp.weight.detach().double().T + mlp.inp.bias.detach().double()).clamp(min=0)
    else:
        h = zs
    expected = (h @ W_out.T + b_out)[:, 0]
    torch.testing.assert_close(mlp(z).double(), expected, rtol=1e-5, atol=1e-5)


def test_early_exit_forward_matches_manual_chain():
    ee = B.EarlyExitMLP(D, widths=[5, 3, 4])
    _random_scaler(ee)
    z = torch.randn(7, D)
    h = _std(ee, z)
    cols = [h @ ee.heads[0].weight.detach().double().T + ee.heads[0].bias.detach().double()]
    for layer, head in zip(ee.layers, ee.heads[1:], strict=False):
        h = (h @ layer.weight.detach().double().T + layer.bias.detach().double()).clamp(min=0)
        cols.append(h @ head.weight.detach().double().T + head.bias.detach().double())
    expected = torch.cat(cols, dim=1)
    torch.testing.assert_close(ee.exits(z).double(), expected, rtol=1e-5, atol=1e-5)
    for n in range(1, 5):
        torch.testing.assert_close(ee(z, exit=n).double(), expected[:, n - 1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ee(z), ee(z, exit=4))
    assert ee.exits(z.reshape(7, 1, D)).shape == (7, 1, 4)


# ---------------------------------------------------------------------- costs
def test_param_counts_equal_module_parameters():
    for rank in (1, 3):
        probe = B.BilinearProbe(D, rank=rank)
        assert probe.cost().params == sum(p.numel() for p in probe.parameters()) == D + 1 + rank * D
        assert probe.cost().flops == D + rank * D + rank
    for hidden in (0, 1, 7):
        mlp = B.MLPProbe(D, hidden=hidden)
        assert mlp.cost().params == sum(p.numel() for p in mlp.parameters())
        assert mlp.cost().flops == (hidden * D + hidden if hidden else D)


def test_early_exit_costs_by_hand():
    ee = B.EarlyExitMLP(D, widths=[5, 3, 4])
    # exit n alone: layers 2..n (K_{m-1} K_m weights + K_m biases) and head n (K_n + 1)
    hand = {
        1: (D + 1, D),
        2: (8 * 5 + 5 + 6, 8 * 5 + 5),
        3: (45 + 3 * 5 + 3 + 4, 40 + 15 + 3),
        4: (45 + 18 + 3 * 4 + 4 + 5, 40 + 15 + 12 + 4),
    }
    for n, (params, flops) in hand.items():
        assert (ee.cost(n).order, ee.cost(n).params, ee.cost(n).flops) == (n, params, flops)
        own = list(ee.layers[: n - 1]) + [ee.heads[n - 1]]
        assert ee.cost(n).params == sum(p.numel() for m in own for p in m.parameters())
    assert ee.cost() == ee.cost(4)
    # a cascade to exit n runs every head on the way: 8 | +40+5 | +15+3 | +12+4
    assert ee.cascade_flops() == [8, 53, 71, 87]


# ---------------------------------------------------------------------- parameter matching
# (6, 3, 2): P_{:2} has 21 params and K = 2, 3 give 17, 25 -- a tie, broken towards the smaller K
HEADS = [(8, 3, 2), (16, 5, 4), (12, 4, [3, 7, 1]), (32, 2, 64), (6, 1, 4), (6, 3, 2)]


@pytest.mark.parametrize("d_model,degree,rank", HEADS)
def test_matched_mlp_width_is_brute_force_argmin(d_model, degree, rank):
    head = tpc.TPC(d_model, degree, rank)
    assert B.matched_mlp_width(head, 1) == 0
    for n in range(2, degree + 1):
        target = head.cost(n).params
        ks = np.arange(1, target + 2)
        brute = int(ks[np.argmin(np.abs(ks * (d_model + 2) + 1 - target))])
        assert B.matched_mlp_width(head, n) == brute
        assert B.MLPProbe(d_model, brute).cost().params == brute * (d_model + 2) + 1


@pytest.mark.parametrize("d_model,degree,rank", HEADS)
def test_matched_early_exit_widths_is_greedy_brute_force(d_model, degree, rank):
    head = tpc.TPC(d_model, degree, rank)
    widths = B.matched_early_exit_widths(head)
    assert len(widths) == degree - 1
    chosen: list[int] = []
    for n in range(2, degree + 1):
        target = head.cost(n).params
        ks = range(1, target + 2)
        errors = [abs(B.EarlyExitMLP(d_model, chosen + [k]).cost(n).params - target) for k in ks]
        chosen.append(int(ks[int(np.argmin(errors))]))
    assert widths == chosen


# ---------------------------------------------------------------------- cascade
def _spread_early_exit(z):
    """An EE-MLP whose every exit has large logits of both signs on ``z``, so both thresholds bite."""
    ee = B.EarlyExitMLP(D, widths=[6, 5, 4]).eval()
    with torch.no_grad():
        for p in ee.parameters():
            p.mul_(3.0)
        centre = ee.exits(z).median(0).values
        for head, c in zip(ee.heads, centre, strict=True):
            head.bias.sub_(c)
    return ee


def test_early_exit_cascade_extremes():
    z = torch.randn(40, D)
    ee = _spread_early_exit(z)
    full = B.early_exit_cascade(ee, z, tau=0.0)
    torch.testing.assert_close(full.logits, ee(z))
    assert full.exit_order.tolist() == [4] * 40
    assert full.flops.tolist() == [ee.cascade_flops()[-1]] * 40
    first = B.early_exit_cascade(ee, z, tau=0.5)
    torch.testing.assert_close(first.logits, ee(z, exit=1))
    assert first.exit_order.tolist() == [1] * 40 and first.flops.tolist() == [D] * 40
    assert isinstance(first, tpc.CascadeResult) and first.degree == 4


def test_early_exit_cascade_follows_algorithm_1():
    z = torch.randn(200, D)
    ee = _spread_early_exit(z)
    tau = 0.1
    out = B.early_exit_cascade(ee, z, tau=tau)
    probs = torch.sigmoid(ee.exits(z).double())
    for b in range(200):
        confident = [n for n in range(1, 5) if not tau < probs[b, n - 1] < 1 - tau]
        expected = confident[0] if confident else 4
        assert out.exit_order[b] == expected
        torch.testing.assert_close(out.logits[b], ee(z[b], exit=expected))
        assert out.flops[b] == ee.cascade_flops()[expected - 1]
    assert min(out.exit_histogram()) >= 5  # every exit was taken by some rows
    confident_high = [(probs[b, out.exit_order[b] - 1] >= 1 - tau).item() for b in range(200) if out.exit_order[b] < 4]
    assert 0 < sum(confident_high) < len(confident_high)  # rows exited on both sides
    torch.testing.assert_close(out.probs, torch.sigmoid(out.logits))


# ---------------------------------------------------------------------- training
def test_scaler_is_fitted_on_training_rows(splits):
    (X, y), (Xv, yv), _ = splits
    mlp = B.fit_mlp(X, y, Xv, yv, hidden=4, epochs=1, verbose=False)
    np.testing.assert_allclose(mlp.scaler.mean.numpy(), X.astype(np.float64).mean(0), rtol=1e-6)
    np.testing.assert_allclose(mlp.scaler.scale.numpy(), X.astype(np.float64).std(0), rtol=1e-6)


def test_trained_baselines_beat_chance(splits):
    (X, y), (Xv, yv), (Xt, yt) = splits
    zt = torch.as_tensor(Xt)
    mlp = B.fit_mlp(X, y, Xv, yv, hidden=16, **FAST)
    bil = B.fit_bilinear(X, y, Xv, yv, rank=4, **FAST)
    ee = B.fit_early_exit(X, y, Xv, yv, widths=[16, 16], **FAST)
    chance = max(yt.mean(), 1 - yt.mean())
    with torch.no_grad():
        for model in (mlp, bil, ee):
            assert _accuracy(yt, model(zt)) > chance + 0.15
        assert _accuracy(yt, ee(zt, exit=1)) > chance + 0.15
    assert mlp.history.mode == "mlp" and len(mlp.history.for_degree(1)) == FAST["epochs"]


def test_training_is_seeded_and_leaves_global_rng_alone(splits):
    (X, y), (Xv, yv), _ = splits
    kw = {"hidden": 6, "epochs": 2, "batch_size": 64, "dropout": 0.3, "verbose": False}
    state = torch.get_rng_state()
    a = B.fit_mlp(X, y, Xv, yv, seed=3, **kw)
    assert torch.equal(torch.get_rng_state(), state)
    b = B.fit_mlp(X, y, Xv, yv, seed=3, **kw)
    c = B.fit_mlp(X, y, Xv, yv, seed=4, **kw)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    assert not torch.equal(a.inp.weight, c.inp.weight)
    B.fit_early_exit(X, y, Xv, yv, widths=[3], epochs=1, verbose=False)
    B.fit_bilinear(X, y, Xv, yv, rank=2, epochs=1, verbose=False)
    assert torch.equal(torch.get_rng_state(), state)


def test_sweep_keeps_the_trial_with_best_val_f1(splits):
    (X, y), (Xv, yv), _ = splits
    ee = B.fit_early_exit(
        X,
        y,
        Xv,
        yv,
        widths=[4],
        epochs=3,
        batch_size=64,
        verbose=False,
        sweep={"lr": (1e-4, 3e-2), "dropout": (0.0, 0.5)},
    )
    recs = ee.history.records
    trials = sorted({r["trial"] for r in recs})
    assert trials == [0, 1, 2, 3]
    best_epoch = {t: min((r for r in recs if r["trial"] == t), key=lambda r: r["val_loss"]) for t in trials}
    expected = min(trials, key=lambda t: (-best_epoch[t]["val_f1"], best_epoch[t]["val_loss"]))
    assert ee.history.selected[1]["trial"] == expected
    # the returned weights are that trial's best epoch: its validation metrics reproduce
    with torch.no_grad():
        s = ee.exits(torch.as_tensor(Xv))
    f1s = [f1_at_zero(s[:, j], torch.as_tensor(yv, dtype=torch.float32)) for j in range(2)]
    assert np.mean(f1s) == pytest.approx(best_epoch[expected]["val_f1"], abs=1e-6)


def test_float64_features_train_and_score(splits):
    (X, y), (Xv, yv), _ = splits
    bil = B.fit_bilinear(X.astype(np.float64), y, Xv.astype(np.float64), yv, rank=2, epochs=2, verbose=False)
    assert bil(torch.as_tensor(Xv, dtype=torch.float64)).dtype == torch.float32


# ---------------------------------------------------------------------- compare()
def test_compare_rows_and_independent_tpc_metrics(splits):
    (X, y), (Xv, yv), (Xt, yt) = splits
    res = B.compare(X, y, Xv, yv, Xt, yt, degree=3, rank=2, epochs=3, batch_size=128, verbose=False)
    keys = [(r["method"], r["order"]) for r in res.rows]
    expected = [("linear", 1), ("bilinear", 2)] + [
        (m, n) for m, n in itertools.product(("mlp", "early_exit", "tpc", "tpc_paper", "tpc_joint"), (1, 2, 3))
    ]
    assert keys == expected
    assert (
        res.models["tpc"].has_bounds and not res.models["tpc_paper"].has_bounds
    )  # robust default vs the paper's recipe
    assert res.models["tpc_paper"].history.settings["recipe"] == "paper"
    rows = {(r["method"], r["order"]): r for r in res.rows}
    head = res.models["tpc"]
    zt = torch.as_tensor(Xt)
    for n in (1, 2, 3):
        with torch.no_grad():
            s = head(zt, order=n).numpy()
        pred, pos = s > 0, yt == 1
        tp = (pred & pos).sum()
        row = rows[("tpc", n)]
        assert row["f1"] == pytest.approx(2 * tp / (pred.sum() + pos.sum()))
        assert row["accuracy"] == pytest.approx(_accuracy(yt, s))
        assert row["recall"] == pytest.approx(tp / pos.sum())
        assert row["frr"] == pytest.approx((pred & ~pos).sum() / (~pos).sum())
        assert row["auroc"] == pytest.approx(roc_auc_score(yt, s))
        assert (row["params"], row["flops"]) == (head.cost(n).params, head.cost(n).flops)
        mlp = res.models["mlp"][n - 1]
        assert mlp.hidden == B.matched_mlp_width(head, n)
        assert rows[("mlp", n)]["params"] == sum(p.numel() for p in mlp.parameters())
        assert rows[("early_exit", n)]["params"] == res.models["early_exit"].cost(n).params
    # the linear probe is the TPC's degree 1: same fit, same row
    assert {k: v for k, v in rows[("linear", 1)].items() if k != "method"} == {
        k: v for k, v in rows[("tpc", 1)].items() if k != "method"
    }
    assert rows[("bilinear", 2)]["params"] == D + 1 + 2 * D
    table = res.to_markdown()
    assert table.splitlines()[0].startswith("| method | order | params | flops | f1 |")
    assert len(table.splitlines()) == len(res.rows) + 2
    pd = pytest.importorskip("pandas")
    assert isinstance(res.to_dataframe(), pd.DataFrame) and len(res.to_dataframe()) == len(res.rows)


# ---------------------------------------------------------------------- bad input
def test_bad_input_raises_with_useful_messages(splits):
    (X, y), (Xv, yv), (Xt, yt) = splits
    with pytest.raises(tpc.TPCHooksError, match=r"z has d_model=7 but the head expects d_model=8"):
        B.MLPProbe(D, hidden=4)(torch.randn(3, 7))
    with pytest.raises(tpc.TPCHooksError, match=r"X_val has d_model=7 but the head expects d_model=8"):
        B.fit_bilinear(X, y, Xv[:, :7], yv, rank=2, epochs=1, verbose=False)
    with pytest.raises(tpc.TPCHooksError, match=r"y_train has only one class: all 600 labels are 0"):
        B.fit_mlp(X, np.zeros_like(y), Xv, yv, hidden=2, epochs=1, verbose=False)
    with pytest.raises(tpc.TPCHooksError, match=r"exit must be an integer in 1\.\.3 .* got 4"):
        B.EarlyExitMLP(D, widths=[2, 2])(torch.randn(2, D), exit=4)
    with pytest.raises(tpc.TPCHooksError, match=r"each width must be an integer >= 1; got 0"):
        B.EarlyExitMLP(D, widths=[3, 0])
    with pytest.raises(tpc.TPCHooksError, match=r"tau must be in \[0, 0.5\]; got 0.7"):
        B.early_exit_cascade(B.EarlyExitMLP(D, widths=[2]), torch.randn(2, D), tau=0.7)
    with pytest.raises(tpc.TPCHooksError, match=r"fit_linear always fits degree 1"):
        B.fit_linear(X, y, degree=2)
    with pytest.raises(tpc.TPCHooksError, match=r"methods must be a non-empty subset of .*'svm'"):
        B.compare(X, y, Xv, yv, Xt, yt, methods=("svm",))
    with pytest.raises(tpc.TPCHooksError, match=r"unknown keyword\(s\) \['epoch'\]"):
        B.compare(X, y, Xv, yv, Xt, yt, epoch=3)
    with pytest.raises(tpc.TPCHooksError, match=r"X_test has d_model=7 but the head expects d_model=8"):
        B.compare(X, y, Xv, yv, Xt[:, :7], yt)


def test_comparison_evaluate_rescores_the_same_models():
    from tpc_hooks.baselines import compare
    from tpc_hooks.synthetic import make_problem

    X, y = make_problem(n=500, d_model=8, seed=0, world=1)
    Xt, yt = make_problem(n=200, d_model=8, seed=1, world=1)
    res = compare(
        X[:400],
        y[:400],
        X[400:],
        y[400:],
        Xt,
        yt,
        degree=2,
        rank=2,
        methods=("tpc", "mlp", "early_exit"),
        epochs=2,
        verbose=False,
    )
    again = res.evaluate(Xt, yt)
    assert [(r["method"], r["order"]) for r in again] == [(r["method"], r["order"]) for r in res.rows]
    for a, b in zip(again, res.rows, strict=True):
        assert a["f1"] == pytest.approx(b["f1"]) and a["auroc"] == pytest.approx(b["auroc"])


def test_comparison_logits_are_the_scores_behind_its_rows():
    from tpc_hooks.metrics import classification_metrics

    X, y = make_problem(n=500, d_model=8, seed=0)
    Xt, yt = make_problem(n=200, d_model=8, seed=1)
    res = B.compare(
        X[:400], y[:400], X[400:], y[400:], Xt, yt, degree=2, rank=2, methods=("tpc", "mlp"), epochs=2, verbose=False
    )
    got = res.logits(Xt)
    assert sorted(got) == [("mlp", 1), ("mlp", 2), ("tpc", 1), ("tpc", 2)]
    with torch.no_grad():
        assert np.allclose(got[("tpc", 2)], res.models["tpc"](torch.as_tensor(Xt)).double().numpy(), atol=1e-5)
    for row in res.rows:
        assert classification_metrics(yt, got[(row["method"], row["order"])])["f1"] == pytest.approx(row["f1"])
