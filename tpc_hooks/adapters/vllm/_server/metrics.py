"""What ``tpc-hooks serve`` counts in ``/metrics``, labelled by monitor: requests scored,
flagged, stopped, opted out and with NaN/inf activations, each request's peak score, the review
log's entries, and each monitor's flag rate against the rate it was calibrated to (its drift)."""

import logging

from prometheus_client import Counter, Gauge, Histogram

from .drift import FlagRate

LONE = "default"  # the metrics' monitor label of a lone, unnamed --monitor DIR
_BY = ["monitor"]
SCORED = Counter("tpc_hooks_requests_scored", "Requests the monitor scored (choices, each its own request)", _BY)
FLAGS = Counter("tpc_hooks_requests_flagged", "Requests flagged at some step", _BY)
STOPS = Counter("tpc_hooks_requests_stopped", "Requests the monitor stopped", _BY)
OPTED = Counter("tpc_hooks_requests_opted_out", "Requests sent with tpc_hooks_monitor=false (or .NAME=false)", _BY)
NONFINITE = Counter(
    "tpc_hooks_requests_nonfinite", "Requests whose activations turned NaN/inf (answered with an error)", _BY
)
PEAK = Histogram(
    "tpc_hooks_peak_score",
    "Each scored request's highest score",
    _BY,
    buckets=(0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0),
)
REVIEWED = Counter(
    "tpc_hooks_review_log_entries",
    "Review-log entries: written, dropped (the queue was full) or failed (the disk refused them)",
    ["outcome"],
)
RATE = Gauge(
    "tpc_hooks_flag_rate",
    "Share of scored requests flagged: over the last --drift-window requests "
    "(window=recent), since the server started (window=lifetime), and the rate the monitor was calibrated "
    "to (window=target)",
    ["monitor", "window"],
)
log = logging.getLogger("tpc_hooks.serve")


def count(s: dict | None, label: str, rates: dict[str, FlagRate]) -> None:
    """One choice's summary (None: opted out) into its monitor's metrics and flag rates (``rates``:
    by label, the server's)."""
    if s is None:
        OPTED.labels(label).inc()
        return
    if "error" in s:
        return
    SCORED.labels(label).inc()
    FLAGS.labels(label).inc(s["flagged"])
    drift(label, s["flagged"], rates)
    STOPS.labels(label).inc(s["stopped_at"] is not None)
    if s["nonfinite_step"] is not None:
        NONFINITE.labels(label).inc()
    elif s["peak_score"] is not None:
        PEAK.labels(label).observe(s["peak_score"])


def labels(name: str, target: float | None, rates: dict[str, FlagRate], window: int, band: float) -> None:
    """A monitor's metric series from the start, at zero, and its flag rates (into ``rates``, by
    label; ``window``, ``band``: --drift-window, --drift-band)."""
    label = name or LONE
    for metric in (SCORED, FLAGS, STOPS, OPTED, NONFINITE, PEAK):
        metric.labels(label)
    rates[label] = FlagRate(target, int(window), band)
    if target is not None:
        RATE.labels(label, "target").set(target)


def drift(label: str, flagged: bool, rates: dict[str, FlagRate]) -> None:
    """One scored request into its monitor's flag rates; the gauges follow, and a crossing of the
    band is logged."""
    rate = rates.get(label)
    if rate is None:
        return
    event = rate.add(flagged)
    RATE.labels(label, "recent").set(rate.recent)
    RATE.labels(label, "lifetime").set(rate.lifetime)
    if event == "left":  # a crossing needs a target and a full window
        assert rate.bounds is not None and rate.recent is not None and rate.target is not None
        low, high = rate.bounds
        log.warning(
            "monitor %s flagged %.2f%% of the last %d scored requests, outside [%.2f%%, %.2f%%] around the rate "
            "it was calibrated to (%.2f%%): its threshold may no longer mean what it meant; recalibrate it on "
            "benign traffic",
            label,
            100 * rate.recent,
            rate.window,
            100 * low,
            100 * high,
            100 * rate.target,
        )
    elif event == "back":
        assert rate.recent is not None and rate.target is not None
        log.warning(
            "monitor %s is back inside its band: %.2f%% of the last %d scored requests flagged (target %.2f%%)",
            label,
            100 * rate.recent,
            rate.window,
            100 * rate.target,
        )
