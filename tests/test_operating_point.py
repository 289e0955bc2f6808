"""Operating points: a monitor's threshold set at a false-positive rate, and cascades centred on it."""

import math
import tempfile
from pathlib import Path

import pytest
import torch

import tpc_hooks as tpc
from conftest import random_head
from tpc_hooks.metrics import threshold_at_fpr
from tpc_hooks.monitoring._calibrate import fpr_interval

SITE = "blocks.1.hook_resid_post"


def small_head(seed=0):
    head = random_head(d_model=6, degree=3, ranks=(3, 2), dtype=torch.float32, seed=seed)
    with torch.no_grad():  # logits of a few units: float32 probabilities do not saturate
        head.linear.mul_(0.2)
        for k in head.degrees:
            head.lambdas[str(k)].mul_(0.02)
    return head


def benign(n, seed):
    return torch.randn(n, 6, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("fpr", [0.0, 0.01, 0.05, 0.2])
def test_threshold_flags_at_most_the_target_share_of_its_benign_rows(fpr):
    mon = tpc.Monitor(small_head(), SITE)
    z = benign(1000, 1)
    mon.calibrate_activations(z, fpr)
    probs = torch.sigmoid(mon.head(z))
    flagged = int((probs >= mon.threshold).sum())
    # exactly floor(fpr * n) rows lie above the threshold (no ties among continuous scores)
    assert flagged == math.floor(fpr * 1000 + 1e-9) == mon.report["operating_point"]["flagged"]
    assert mon.report["operating_point"] == {
        "fpr": fpr,
        "n_benign": 1000,
        "flagged": flagged,
        "threshold": mon.threshold,
        "fpr_interval_95": list(fpr_interval(1000, flagged)),
    }


def test_the_interval_holds_the_rate_on_new_benign_rows_95_times_in_100():
    """Calibrated on 100 benign rows, again and again: the rate each threshold flags on 20,000 new
    rows of the same law falls inside its recorded interval in about 95% of the draws."""
    mon = tpc.Monitor(small_head(), SITE)
    fresh = torch.sigmoid(mon.head(benign(20000, 99)))
    inside = []
    for draw in range(300):
        mon.calibrate_activations(benign(100, 1000 + draw), 0.02)
        lo, hi = mon.report["operating_point"]["fpr_interval_95"]
        rate = float((fresh > mon.threshold).double().mean())
        inside.append(lo <= rate <= hi)
    assert 0.91 <= sum(inside) / len(inside) <= 0.99


def test_the_interval_is_the_order_statistics_law():
    """Against a hand computation: the rate above the k-th largest of n uniform scores, simulated."""
    g = torch.Generator().manual_seed(0)
    rates = torch.sort(torch.rand(20000, 40, generator=g), dim=1, descending=True).values[:, 2]  # k = 3
    lo, hi = fpr_interval(40, 2)
    rate = 1 - rates
    # 20,000 draws: a 2.5% tail share has a standard error of 0.0011; Beta(3, 37) (one off in n) misses by 0.0034
    assert abs(float((rate < lo).double().mean()) - 0.025) < 0.003
    assert abs(float((rate > hi).double().mean()) - 0.025) < 0.003
    with pytest.raises(tpc.TPCHooksError, match="flagged < n_benign"):
        fpr_interval(3, 3)


@pytest.mark.parametrize("n, flagged", [(40, 2), (170, 1), (12, 0), (500, 9)])
def test_the_interval_ends_are_the_binomial_tails(n, flagged):
    """Exactly, by a hand-written binomial sum: the share of new uniform scores above the k-th
    largest of n is at most x when at least k of the n scores exceed 1 - x, so P(rate <= x) is
    P(Binomial(n, x) >= k), which is 2.5% at the interval's low end and 97.5% at its high end.
    A law one off in n or k misses by far more than the tolerance."""

    def at_least(k, x):
        return sum(math.comb(n, j) * x**j * (1 - x) ** (n - j) for j in range(k, n + 1))

    lo, hi = fpr_interval(n, flagged)
    assert at_least(flagged + 1, lo) == pytest.approx(0.025, abs=1e-9)
    assert at_least(flagged + 1, hi) == pytest.approx(0.975, abs=1e-9)


def test_held_out_benign_rows_are_flagged_at_the_target_rate_within_sampling_error():
    mon = tpc.Monitor(small_head(), SITE).calibrate_activations(benign(4000, 2), 0.05)
    held_out = torch.sigmoid(mon.head(benign(40000, 3)))
    rate = float((held_out >= mon.threshold).double().mean())
    # the threshold is the 95th percentile of 4000 draws: its coverage has sd sqrt(.05 * .95 / 4000) ~ 0.0034
    assert abs(rate - 0.05) < 4 * math.sqrt(0.05 * 0.95 / 4000) + 4 * math.sqrt(0.05 * 0.95 / 40000)


def test_ties_never_push_the_flagged_share_over_the_target():
    mon = tpc.Monitor(small_head(), SITE)
    z = benign(50, 4).repeat(20, 1)  # every score 20 times
    mon.calibrate_activations(z, 0.03)
    assert int((torch.sigmoid(mon.head(z)) >= mon.threshold).sum()) <= 30


def test_with_a_cascade_the_bound_holds_for_the_cascade_and_its_exits_are_centred():
    head = small_head()
    z = benign(2000, 5)
    y = (torch.sigmoid(head(z)) > torch.rand(2000, generator=torch.Generator().manual_seed(6))).long()
    mon = tpc.Monitor(head, SITE, cascade=tpc.Cascade(head, 0.1).calibrate(z, y))
    mon.calibrate_activations(z[y == 0], 0.02)
    full = mon.cascade.with_thresholds(0.0)(z[y == 0]).probs
    t_full = threshold_at_fpr(full.double().numpy(), 0.02)
    assert mon.cascade.center == pytest.approx(t_full, rel=1e-6) and mon.cascade.tau == 0.1
    out = mon.policy()(z[y == 0])
    assert int((out.probs >= mon.threshold).sum()) <= math.floor(0.02 * int((y == 0).sum()))
    assert mon.policy(cascade=0.3).center == mon.cascade.center  # a tau passed at scoring time keeps the centre


def test_a_monitor_without_cascade_centres_the_cascade_it_is_asked_for():
    mon = tpc.Monitor(small_head(), SITE).calibrate_activations(benign(500, 7), 0.01)
    c = mon.policy(cascade=0.2)
    assert c.center == mon.threshold and c.tau == 0.2


def test_bad_calibration_input_is_refused_and_changes_nothing():
    mon = tpc.Monitor(small_head(), SITE)
    z = benign(100, 8)
    for bad, match in ((z[:, :5], "d_model"), (torch.full((3, 6), math.nan), "NaN"), (z[:0], "empty|no rows|at least")):
        with pytest.raises(tpc.TPCHooksError, match=match):
            mon.calibrate_activations(bad, 0.01)
    for fpr in (-0.1, 1.0):
        with pytest.raises(tpc.TPCHooksError, match=r"fpr must be a number in \[0, 1\)"):
            mon.calibrate_activations(z, fpr)
    assert mon.threshold == 0.5 and "operating_point" not in mon.report
    hot = small_head()
    with torch.no_grad():
        hot.bias.fill_(200.0)  # logits of 200: beyond any float64 probability below 1
    with pytest.raises(tpc.TPCHooksError, match="no probability threshold below 1"):
        tpc.Monitor(hot, SITE).calibrate_activations(z, 0.01)


@pytest.mark.parametrize("cascade", [False, True])
def test_a_threshold_is_set_where_float32_probabilities_saturate(cascade):
    """Benign logits around 25: every float32 probability is exactly 1, yet the monitor flags at
    most the target share, because it compares decision logits with logit(threshold); the flags
    of generation-time scoring (one step) are the same rows."""
    head = small_head()
    with torch.no_grad():
        head.bias.fill_(25.0)
        head.linear.mul_(2.0)
    z = benign(1000, 9)
    with torch.no_grad():
        assert bool((torch.sigmoid(head(z)) == 1.0).all())  # the old, probability-space threshold had no room
    mon = tpc.Monitor(head, SITE, cascade=tpc.Cascade(head, 0.1) if cascade else None).calibrate_activations(z, 0.05)
    assert 0.5 < mon.threshold < 1
    res = mon.policy()(z)
    cut = math.log(mon.threshold) - math.log1p(-mon.threshold)  # by hand: the decision logit against logit(threshold)
    flagged = int((res.decision_logits >= cut).sum())
    assert flagged == 50 == mon.report["operating_point"]["flagged"]
    assert torch.equal(res.probs, torch.sigmoid(res.decision_logits))
    step = mon._step_policy()(z)  # the per-step path of generate / watch / HF generate
    from tpc_hooks.metrics._rule import flagged as rule

    assert torch.equal(rule(step.decision_logits, mon.threshold), res.decision_logits >= cut)


def test_threshold_and_centred_cascade_survive_save_and_load(tmp_path):
    head = small_head()
    mon = tpc.Monitor(head, SITE, cascade=tpc.Cascade(head, 0.1))
    mon.calibrate_activations(benign(300, 9), 0.05)
    back = tpc.Monitor.from_pretrained(mon.save_pretrained(tmp_path / "m"))
    assert back.threshold == mon.threshold and back.report["operating_point"] == mon.report["operating_point"]
    assert (back.cascade.lower, back.cascade.upper, back.cascade.center) == (
        mon.cascade.lower,
        mon.cascade.upper,
        mon.cascade.center,
    )
    z = benign(50, 10)
    assert torch.equal(back.policy()(z).probs, mon.policy()(z).probs)


def _by_hand(mon, z, names):
    """Per source: (inputs, flagged) at the monitor's threshold, counted from the policy's decision logits."""
    from tpc_hooks.metrics._rule import flagged as rule

    hit = rule(mon.policy()(z).decision_logits, mon.threshold).numpy()
    return {
        s: (sum(1 for n in names if n == s), int(sum(h for h, n in zip(hit, names, strict=True) if n == s)))
        for s in set(names)
    }


@pytest.mark.parametrize("cascade", [False, True])
def test_sources_report_each_sources_rate_at_the_threshold_set_on_all_of_them(cascade):
    """The threshold is the one set without sources; each source's count, rate and exact interval
    (Clopper-Pearson, from the Beta quantiles by hand) are those of the rows it names."""
    from scipy.stats import beta

    z = torch.cat([benign(300, 11), benign(100, 12) * 1.6])  # a second source, more spread: flagged more
    names = ["forum"] * 300 + ["support"] * 100

    def make():
        head = small_head()
        return tpc.Monitor(head, SITE, cascade=tpc.Cascade(head, 0.1) if cascade else None)

    plain = make().calibrate_activations(z, 0.02)
    mon = make().calibrate_activations(z, 0.02, sources=names)
    op = mon.report["operating_point"]
    assert mon.threshold == plain.threshold and op["flagged"] == plain.report["operating_point"]["flagged"]
    assert list(op["by_source"]) == ["forum", "support"]
    for s, (n, k) in _by_hand(mon, z, names).items():
        got = op["by_source"][s]
        assert (got["n"], got["flagged"], got["rate"]) == (n, k, k / n)
        lo = beta.ppf(0.025, k, n - k + 1) if k else 0.0
        hi = beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
        assert got["rate_interval_95"] == pytest.approx([lo, hi], abs=1e-9)
    rates = {s: v["rate"] for s, v in op["by_source"].items()}
    assert op["spread"] == [min(rates.values()), max(rates.values())] and op["worst_source"] == "support"
    assert rates["support"] > rates["forum"]
    back = tpc.Monitor.from_pretrained(mon.save_pretrained(Path(tempfile.mkdtemp()) / "m"))
    assert back.report["operating_point"] == op


def test_sources_of_logged_peaks_and_of_benign_sequences():
    """The same report from a server's peak scores and from a per-token monitor's sequences."""
    mon = tpc.Monitor(small_head(), SITE)
    peaks = torch.sigmoid(mon.head(benign(200, 13))).tolist()
    names = ["a" if i % 4 else "b" for i in range(200)]
    op = mon.calibrate(peaks=peaks, fpr=0.05, sources=names).report["operating_point"]
    hit = [p >= mon.threshold for p in peaks]
    for s in ("a", "b"):
        assert op["by_source"][s]["flagged"] == sum(h for h, n in zip(hit, names, strict=True) if n == s)
    assert sum(v["flagged"] for v in op["by_source"].values()) == op["flagged"]
    stream = tpc.Monitor(small_head(), SITE, pooling="token", aggregate="max")
    seqs = [benign(5 + i % 7, 100 + i) for i in range(60)]
    names = ["x" if i < 40 else "y" for i in range(60)]
    op = stream.calibrate_activations(seqs, 0.05, sources=names).report["operating_point"]
    peak = [float(stream._aggregated(stream.policy(), z)[1].max()) for z in seqs]
    cut = math.log(stream.threshold) - math.log1p(-stream.threshold)
    assert [op["by_source"][s]["flagged"] for s in ("x", "y")] == [
        sum(p >= cut for p, n in zip(peak, names, strict=True) if n == s) for s in ("x", "y")
    ]
    assert (op["by_source"]["x"]["n"], op["by_source"]["y"]["n"]) == (40, 20)


@pytest.mark.parametrize(
    "bad, match",
    [
        (["a"] * 99, "one name per benign input"),
        ("forum", "list of source names"),
        (["a"] * 99 + [" "], "empty name"),
        (7, "list of source names"),
    ],
)
def test_bad_sources_are_refused_and_change_nothing(bad, match):
    mon = tpc.Monitor(small_head(), SITE)
    with pytest.raises(tpc.TPCHooksError, match=match):
        mon.calibrate_activations(benign(100, 14), 0.01, sources=bad)
    assert mon.threshold == 0.5 and "operating_point" not in mon.report
