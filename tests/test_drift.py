"""A served monitor's flag rates (``tpc-hooks serve``'s drift gauges), held to a rolling count
computed independently on a replayed stream whose flag rate is known and then shifts."""

import numpy as np
import pytest

from tpc_hooks import TPCHooksError
from tpc_hooks.adapters.vllm._server.drift import FlagRate


def stream(rng, parts):
    """Flags drawn at each part's rate, one part after another."""
    return np.concatenate([rng.random(n) < p for n, p in parts])


def test_the_rates_equal_an_independent_rolling_count_and_each_crossing_is_reported_once():
    rng = np.random.default_rng(0)
    window, target, band = 500, 0.01, 2.0
    flags = stream(rng, [(3000, 0.01), (2000, 0.06), (3000, 0.01)])  # calibrated, then drifting, then back
    rate = FlagRate(target, window, band)
    events = [(i, e) for i, f in enumerate(flags) if (e := rate.add(bool(f))) is not None]
    # independently: the share flagged among the last `window` requests after each one
    csum = np.concatenate([[0], np.cumsum(flags)])
    idx = np.arange(len(flags))
    rolling = (csum[idx + 1] - csum[np.maximum(idx + 1 - window, 0)]) / np.minimum(idx + 1, window)
    assert rate.recent == pytest.approx(rolling[-1])
    assert rate.lifetime == pytest.approx(flags.mean()) and rate.seen == len(flags)
    out = (rolling < target / band) | (rolling > target * band)
    out[: window - 1] = False  # judged once the window is full
    changes = [
        (i, "left" if out[i] else "back")
        for i in range(window - 1, len(flags))
        if out[i] != (out[i - 1] if i >= window else False)
    ]
    assert events == changes
    # the shift to 6% is noticed within one window of it, on the high side, and its end likewise
    first = next(i for i, e in events if i >= 3000 and e == "left")
    assert first < 3000 + window and rolling[first] > target * band
    assert any(e == "back" and 5000 <= i < 5000 + window for i, e in events)


def test_without_a_target_the_rates_are_kept_and_nothing_is_judged():
    rate = FlagRate(None, window=3)
    assert [rate.add(f) for f in (True, True, True, False)] == [None] * 4
    assert rate.recent == pytest.approx(2 / 3) and rate.lifetime == 0.75 and rate.bounds is None


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"window": 0}, "positive number"),
        ({"window": -3}, "positive number"),
        ({"band": 1.0}, "factor above 1"),
        ({"target": 1.5}, r"share in \[0, 1\]"),
    ],
)
def test_bad_settings_are_refused(kw, match):
    with pytest.raises(TPCHooksError, match=match):
        FlagRate(**{"target": 0.01, **kw})
