import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

import tpc_hooks as tpc
from conftest import random_head
from tpc_hooks.head import _kernel


def reference_cascade(head, z, lower, upper, temps=None, biases=None):
    """Paper Alg. 1, one row at a time, from head(z, order=n)."""
    temps = temps or [1.0] * head.degree
    biases = biases or [0.0] * head.degree
    orders, logits = [], []
    for row in z:
        for n in range(1, head.degree + 1):
            s = float(head(row, order=n).detach())
            p = 1 / (1 + math.exp(-(s / temps[n - 1] + biases[n - 1])))
            if not (lower < p < upper):
                break
        orders.append(n)
        logits.append(s)
    return torch.tensor(orders), torch.tensor(logits, dtype=torch.float64)


@pytest.fixture
def head_and_z():
    head = random_head(d_model=6, degree=4, ranks=(3, 2, 4), dtype=torch.float32)
    with torch.no_grad():
        head.bias.zero_()
        for k in head.degrees:
            head.lambdas[str(k)].mul_(0.05)
    return head, torch.randn(300, 6) * 0.7


def test_tau_zero_runs_every_order_and_equals_full_head(head_and_z):
    head, z = head_and_z
    out = tpc.Cascade(head, tau=0.0)(z)
    assert (out.exit_order == head.degree).all()
    torch.testing.assert_close(out.logits, head(z).detach())
    assert (out.flops == head.cost().flops).all()


def test_tau_half_stops_at_the_linear_probe(head_and_z):
    head, z = head_and_z
    out = tpc.Cascade(head, tau=0.5)(z)
    assert (out.exit_order == 1).all()
    torch.testing.assert_close(out.logits, head(z, order=1).detach())
    assert (out.flops == head.cost(1).flops).all()


@pytest.mark.parametrize("lower, upper", [(0.3, 0.7), (0.1, 0.9), (0.2, 0.6)])
def test_rows_match_reference_algorithm(head_and_z, lower, upper):
    head, z = head_and_z
    out = tpc.Cascade(head, lower=lower, upper=upper)(z)
    orders, logits = reference_cascade(head, z, lower, upper)
    assert len(set(orders.tolist())) > 1  # the case exercises several exit orders
    assert torch.equal(out.exit_order, orders)
    torch.testing.assert_close(out.logits.double(), logits, rtol=1e-5, atol=1e-5)
    per_row = torch.stack([head(z[i], order=int(out.exit_order[i])) for i in range(len(z))]).detach()
    torch.testing.assert_close(out.logits, per_row, rtol=1e-5, atol=1e-5)
    assert out.flops.tolist() == [head.cost(int(e)).flops for e in out.exit_order]
    assert sum(out.exit_histogram()) == len(z)


def test_higher_orders_see_only_undecided_rows(head_and_z, monkeypatch):
    head, z = head_and_z
    seen = {}
    original = _kernel.term

    def counting(h, zs, k, **kw):
        seen[k] = seen.get(k, 0) + zs.shape[0]
        return original(h, zs, k, **kw)

    monkeypatch.setattr(_kernel, "term", counting)
    out = tpc.Cascade(head, tau=0.3)(z)
    for k in head.degrees:
        assert seen.get(k, 0) == int((out.exit_order >= k).sum())


def test_calibration_is_the_nll_optimum(head_and_z):
    head, z = head_and_z
    with torch.no_grad():
        y = (torch.sigmoid(3 * head(z) + 0.5) > torch.rand(len(z))).long()
    c = tpc.Cascade(head, tau=0.2).calibrate(z, y)
    yn = y.double().numpy()
    for order in range(1, head.degree + 1):
        s = head(z, order=order).detach().double().numpy()

        def nll(ab, s=s):
            return np.mean(np.logaddexp(0, ab[0] * s + ab[1]) - yn * (ab[0] * s + ab[1]))

        a, b = minimize(nll, [1.0, 0.0], method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-12}).x
        assert 1 / c.temperatures[order - 1] == pytest.approx(a, rel=1e-3)
        assert c.biases[order - 1] == pytest.approx(b, abs=1e-3)
        rep = c.calibration_report[order - 1]
        assert rep["nll_after"] <= rep["nll_before"] + 1e-12
    orders, logits = reference_cascade(head, z, 0.2, 0.8, c.temperatures, c.biases)
    out = c(z)
    assert torch.equal(out.exit_order, orders)
    restored = tpc.Cascade.from_dict(head, c.to_dict())
    assert torch.equal(restored(z).exit_order, out.exit_order)


def test_sweep_spends_less_with_larger_tau(head_and_z):
    head, z = head_and_z
    y = (torch.rand(len(z)) > 0.5).long()
    rows = tpc.Cascade(head).sweep(z, y, taus=[0.0, 0.1, 0.3, 0.5])
    flops = [r["relative_flops"] for r in rows]
    assert flops == sorted(flops, reverse=True)
    assert flops[-1] == 1.0 and rows[0]["exit_histogram"] == [0, 0, 0, len(z)]


def test_bad_thresholds(head_and_z):
    head, _ = head_and_z
    with pytest.raises(tpc.TPCHooksError, match=r"tau must be in \[0, 0.5\]; got 0.7"):
        tpc.Cascade(head, tau=0.7)
    with pytest.raises(tpc.TPCHooksError, match="pass both lower and upper"):
        tpc.Cascade(head, lower=0.1)
    with pytest.raises(tpc.TPCHooksError, match="0 <= lower <= upper <= 1"):
        tpc.Cascade(head, lower=0.8, upper=0.2)
    with pytest.raises(tpc.TPCHooksError, match="one value per order"):
        tpc.Cascade(head, temperatures=[1.0])


def test_plot_sweep_draws_one_point_per_tau(head_and_z):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from tpc_hooks.views import plot_sweep

    head, z = head_and_z
    rows = tpc.Cascade(head).sweep(z, (torch.rand(len(z)) > 0.5).long(), taus=[0.0, 0.2, 0.5])
    ax = plot_sweep(rows)
    xs, ys = ax.lines[0].get_data()
    assert list(xs) == [r["relative_flops"] for r in rows] and list(ys) == [r["f1"] for r in rows]


# ------------------------------------------------------------------ exits centred on an operating threshold
def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


@pytest.mark.parametrize("tau, center", [(0.1, 0.9), (0.2, 0.03), (0.05, 0.995)])
def test_centred_exits_sit_a_tau_margin_either_side_of_the_threshold(head_and_z, tau, center):
    head, z = head_and_z
    c = tpc.Cascade(head, tau, center=center)
    mid, margin = math.log(center / (1 - center)), math.log((1 - tau) / tau)
    assert c.lower == pytest.approx(_sigmoid(mid - margin), rel=1e-12)
    assert c.upper == pytest.approx(_sigmoid(mid + margin), rel=1e-12)
    assert (c.tau, c.center) == (tau, center)
    orders, logits = reference_cascade(head, z, c.lower, c.upper)
    out = c(z)
    assert torch.equal(out.exit_order, orders)
    assert torch.allclose(out.logits.double(), logits, atol=1e-5)
    restored = tpc.Cascade.from_dict(head, c.to_dict())
    assert (restored.lower, restored.upper, restored.tau, restored.center) == (c.lower, c.upper, tau, center)


def test_centre_one_half_is_the_plain_tau_and_bad_centres_are_refused(head_and_z):
    head, _ = head_and_z
    c = tpc.Cascade(head, 0.1, center=0.5)
    assert (c.lower, c.upper) == (0.1, 1 - 0.1) and c.to_dict().keys() == {"lower", "upper", "temperatures", "biases"}
    assert tpc.Cascade(head, 0.0, center=0.9).to_dict()["lower"] == 0.0
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(tpc.TPCHooksError, match="center must be in"):
            tpc.Cascade(head, 0.1, center=bad)
    with pytest.raises(tpc.TPCHooksError, match="center= places the symmetric tau"):
        tpc.Cascade(head, lower=0.1, upper=0.9, center=0.8)
    d = tpc.Cascade(head, 0.1, center=0.8).to_dict()
    d["upper"] = 0.5
    with pytest.raises(tpc.TPCHooksError, match="do not follow from tau"):
        tpc.Cascade.from_dict(head, d)
    moved = tpc.Cascade(head, lower=0.2, upper=0.7).centered(0.9)  # no symmetric tau: the default 0.1
    assert moved.tau == 0.1 and moved.center == 0.9
