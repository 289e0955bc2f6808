"""Whether a served monitor's threshold still means what it meant: :class:`FlagRate`, the share
of requests it flags over a rolling window and over the server's life, beside the rate it was
calibrated to. ``tpc-hooks serve`` exports them as Prometheus gauges and logs a warning when the
rolling rate leaves a band around the target (and when it comes back). No vLLM import."""

from collections import deque

from ...._errors import TPCHooksError


class FlagRate:
    """The flag rate of one monitor's scored requests.

    Args:
        target: the rate the monitor was calibrated to (its report's ``operating_point.fpr``:
            the share of benign validation prompts its threshold flags), or None when unknown.
        window: how many of the latest scored requests the rolling rate covers.
        band: the rolling rate is in band while within ``[target / band, target * band]``; it is
            judged once the window is full.

    :meth:`add` returns ``"left"`` when a request takes the rolling rate out of the band,
    ``"back"`` when one brings it back, else None (one event per crossing, not per request).
    Note that a served request is flagged when any of its steps is (prompt and generated
    tokens), so served traffic flags somewhat more than the prompt-level target even without drift.

    Example:
        >>> rate = FlagRate(target=0.01, window=4, band=2.0)
        >>> [rate.add(f) for f in (False, False, False, True)]
        [None, None, None, 'left']
        >>> rate.recent, rate.lifetime
        (0.25, 0.25)
    """

    def __init__(self, target: float | None, window: int = 1000, band: float = 2.0):
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise TPCHooksError(f"the drift window must be a positive number of requests; got {window!r}")
        if not band > 1:
            raise TPCHooksError(
                f"the drift band must be a factor above 1 (2: from half to twice the target); got {band!r}"
            )
        if target is not None and not 0 <= target <= 1:
            raise TPCHooksError(f"a target flag rate is a share in [0, 1]; got {target!r}")
        self.target, self.window, self.band = target, window, float(band)
        self._recent: deque[bool] = deque(maxlen=window)
        self._hits = 0  # flagged among the window's requests
        self.seen = self.flagged = 0
        self.out = False

    @property
    def recent(self) -> float | None:
        """The flag rate over the last ``window`` scored requests (None before any)."""
        return self._hits / len(self._recent) if self._recent else None

    @property
    def lifetime(self) -> float | None:
        """The flag rate over every scored request so far (None before any)."""
        return self.flagged / self.seen if self.seen else None

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The band ``(low, high)`` the rolling rate is held to, or None without a target."""
        return None if self.target is None else (self.target / self.band, min(1.0, self.target * self.band))

    def add(self, flagged: bool) -> str | None:
        """Counts one scored request; returns ``"left"``/``"back"`` when the band is crossed."""
        if len(self._recent) == self.window:
            self._hits -= self._recent[0]
        self._recent.append(bool(flagged))
        self._hits += bool(flagged)
        self.seen += 1
        self.flagged += bool(flagged)
        if self.bounds is None or len(self._recent) < self.window:
            return None
        low, high = self.bounds
        recent = self.recent
        assert recent is not None  # the window is full
        out = not low <= recent <= high
        if out == self.out:
            return None
        self.out = out
        return "left" if out else "back"
