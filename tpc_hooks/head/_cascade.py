"""The cascade (paper Alg. 1): add orders one at a time, exit once confident.

Evaluation is incremental: the order-k projections are computed only for rows still
undecided after order k-1, and nothing computed for a row is computed again. Optional
per-order calibration (temperature and bias, fitted by NLL on validation data) makes one
threshold mean the same confidence at every order.
"""

import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from .._errors import TPCHooksError
from ..metrics import check_labels, classification_metrics, expected_calibration_error
from . import _kernel
from ._checks import check_features
from ._polynomial import TPC

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CascadeResult:
    """Per-row outcome of a cascade.

    Attributes:
        logits: the head's raw logits at the exit order, ``== head(z, order=exit_order)``.
        probs: the (calibrated) probability the exit decision used.
        exit_order: the order each row exited at, 1..N.
        flops: FLOPs spent on each row (sum of the orders evaluated, paper Table 2).
        gated: rows the head's gate handed to the linear probe (their projections at the exit
            order left the trust region; their logit is order 1's). All False without a gate.
        decision_logits: the logit the decision reads, ``probs == sigmoid(decision_logits)``: the
            calibrated logit at the exit order (a cascade), the raw logit (one order), the
            aggregate (a per-token monitor). A monitor flags ``decision_logits >=
            logit(threshold)``, which does not saturate where float32 probabilities reach 1.
            None (a result built by hand) means ``logit(probs)``.
        threshold: the probability threshold :attr:`flagged` applies (a monitor's own, in the
            results :meth:`~tpc_hooks.Monitor.score` returns); None: 0.5.
    """

    logits: Float[Tensor, " batch"]
    probs: Float[Tensor, " batch"]
    exit_order: Int[Tensor, " batch"]
    flops: Int[Tensor, " batch"]
    degree: int
    gated: Any = None
    decision_logits: Any = None
    threshold: float | None = None

    def __post_init__(self):
        if self.decision_logits is None:
            object.__setattr__(self, "decision_logits", torch.logit(self.probs))

    @property
    def flagged(self) -> Tensor:
        """Bool per row: flagged as harmful, by the monitors' rule at :attr:`threshold`
        (:func:`~tpc_hooks.head._kernel.flagged`), or calibrated probability >= 0.5 without one."""
        return self.probs >= 0.5 if self.threshold is None else _kernel.flagged(self.decision_logits, self.threshold)

    @property
    def mean_flops(self) -> float:
        return float(self.flops.double().mean()) if self.flops.numel() else 0.0

    def exit_histogram(self) -> list[int]:
        """How many rows exited at each order 1..N."""
        return torch.bincount(self.exit_order.flatten(), minlength=self.degree + 1)[1:].tolist()


def prefix_result(res: CascadeResult, agg: Tensor, t: int) -> CascadeResult:
    """A per-token monitor's result for the prefix ending at token ``t``: the aggregate, the
    token's exit order, and the FLOPs of every token up to it."""
    t = t % agg.shape[0]
    return CascadeResult(
        logits=agg[t : t + 1],
        probs=torch.sigmoid(agg[t : t + 1]),
        exit_order=res.exit_order[t : t + 1],
        flops=res.flops[: t + 1].sum(0, keepdim=True),
        degree=res.degree,
        decision_logits=agg[t : t + 1],
    )


def stack_results(parts: Sequence[CascadeResult]) -> CascadeResult:
    """One result of the rows of ``parts``, in order."""

    def cat(k):
        return torch.cat([getattr(r, k) for r in parts])

    return CascadeResult(
        logits=cat("logits"),
        probs=cat("probs"),
        exit_order=cat("exit_order"),
        flops=cat("flops"),
        degree=parts[0].degree,
        decision_logits=cat("decision_logits"),
    )


def step_exits(
    head: TPC, s: Tensor, left: Tensor, ok: Tensor, temps: Any, biases: Any, cum: Tensor, lo: Any, hi: Any
) -> dict[str, Tensor]:
    """:meth:`Cascade.step`'s exits, on the device: from every order's logit ``s [..., n, N]``, the
    rows out of the trust region per order ``left``, the finite rows ``ok [..., n]``, each order's
    temperature and bias and cumulative FLOPs ``cum [..., N]``, and the exit thresholds ``lo, hi``
    as logits (broadcast against ``s``). Any leading dimensions: several cascades of one shape
    stacked on a first one (``head._together``) exit by the same operations. Returns the fields of
    a :class:`CascadeResult` (all but ``degree``), each ``[..., n]``."""
    c = s / temps + biases  # each order's calibrated logit: the exit decision reads it
    go_on = (c > lo) & (c < hi)
    gate = _kernel.gating(head)
    if gate:  # left the trust region at an order: order 1 decides there, and the row exits
        c = torch.where(left, c[..., :1], c)
        go_on = go_on & ~left
    # a row exits at the first order that settles it: the number of leading orders that leave it open
    at = go_on[..., :-1].cumprod(-1, dtype=torch.int64).sum(-1, keepdim=True)
    d = _kernel.nan_rows(c.gather(-1, at)[..., 0], ok)
    return {
        "logits": _kernel.nan_rows(s.gather(-1, at)[..., 0], ok),
        "probs": torch.sigmoid(d),
        "exit_order": at[..., 0] + 1,
        "flops": cum.gather(-1, at[..., 0]),
        "gated": left.gather(-1, at)[..., 0] if gate else torch.zeros_like(ok),
        "decision_logits": d,
    }


def check_tau(tau: Any) -> float:
    """A cascade's ``tau``: a margin in [0, 0.5] (see :func:`thresholds`)."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 <= tau <= 0.5:
        raise TPCHooksError(f"tau must be in [0, 0.5]; got {tau!r}")
    return float(tau)


def thresholds(tau: float, lower: float | None, upper: float | None, center: float = 0.5) -> tuple[float, float]:
    """``(lower, upper)`` exit probabilities from a symmetric ``tau`` or explicit bounds.

    ``tau`` is a margin in logit space around ``center`` (the operating threshold):
    ``lower, upper = sigmoid(logit(center) -/+ logit(1 - tau))``; at ``center = 0.5`` that is
    ``tau, 1 - tau``."""
    if lower is None and upper is None:
        check_tau(tau)
        if not 0 < center < 1:
            raise TPCHooksError(f"center must be in (0, 1); got {center!r}")
        if center == 0.5:
            lower, upper = tau, 1 - tau
        elif tau == 0:
            lower, upper = 0.0, 1.0
        else:
            margin = math.log1p(-tau) - math.log(tau)
            mid = math.log(center) - math.log1p(-center)
            lower, upper = 1 / (1 + math.exp(margin - mid)), 1 / (1 + math.exp(-(mid + margin)))
    elif center != 0.5:
        raise TPCHooksError("center= places the symmetric tau margin; with explicit lower and upper leave it out")
    elif lower is None or upper is None:
        raise TPCHooksError("pass both lower and upper, or neither (then tau is used)")
    if not 0 <= lower <= upper <= 1:
        raise TPCHooksError(f"thresholds must satisfy 0 <= lower <= upper <= 1; got lower={lower}, upper={upper}")
    return float(lower), float(upper)


class Cascade:
    """Cascaded evaluation of a TPC: exit at the first order whose probability is outside
    ``(lower, upper)``; by default ``lower = tau``, ``upper = 1 - tau``.

    ``tau = 0`` evaluates every order (equals ``head(z)``); ``tau = 0.5`` stops every row at
    order 1 (the linear probe). Decisions are made in logit space, so they never saturate.

    Args:
        head: a trained :class:`~tpc_hooks.TPC`.
        tau: symmetric threshold in [0, 0.5].
        lower, upper: asymmetric thresholds instead of ``tau`` (exit as benign at
            ``p <= lower``, as harmful at ``p >= upper``).
        center: the operating threshold the decision is made at (a monitor's ``threshold``):
            ``tau`` then sets a margin of ``logit(1 - tau)`` on either side of ``logit(center)``,
            so a row exits early only when its order is clearly on one side of the threshold
            actually used. With a 1%-FPR threshold far above 0.5, an uncentred cascade would
            let order 1 settle rows (as harmful at ``p >= 1 - tau``) that the full order clears.
        temperatures, biases: per-order calibration ``p_n = sigmoid(s_n / T_n + b_n)``;
            usually set by :meth:`calibrate`.

    Example:
        >>> import torch, tpc_hooks as tpc
        >>> head = tpc.TPC(d_model=8, degree=3, rank=2)
        >>> out = tpc.Cascade(head, tau=0.1)(torch.randn(5, 8))
        >>> out.exit_order.shape, out.logits.shape
        (torch.Size([5]), torch.Size([5]))
    """

    def __init__(
        self,
        head: TPC,
        tau: float = 0.1,
        *,
        lower: float | None = None,
        upper: float | None = None,
        center: float = 0.5,
        temperatures: Sequence[float] | None = None,
        biases: Sequence[float] | None = None,
    ):
        if not isinstance(head, TPC):
            raise TPCHooksError(f"Cascade needs a tpc_hooks.TPC head; got {type(head).__name__}")
        self.head = head
        self.lower, self.upper = thresholds(tau, lower, upper, center)
        symmetric = lower is None and upper is None
        self._tau: float | None = float(tau) if symmetric else None
        self.center = float(center) if symmetric else 0.5
        n = head.degree
        self.temperatures = [1.0] * n if temperatures is None else [float(t) for t in temperatures]
        self.biases = [0.0] * n if biases is None else [float(b) for b in biases]
        if len(self.temperatures) != n or len(self.biases) != n:
            raise TPCHooksError(f"temperatures and biases need one value per order (1..{n})")
        if any(not t > 0 for t in self.temperatures):
            raise TPCHooksError(f"temperatures must be positive; got {self.temperatures}")
        self.calibration_report: list[dict[str, float]] = []

    @property
    def tau(self) -> float | None:
        """The symmetric threshold (around :attr:`center`), or None when lower/upper are asymmetric."""
        if self._tau is not None:
            return self._tau
        return self.lower if math.isclose(self.lower, 1 - self.upper) else None

    def centered(self, center: float) -> "Cascade":
        """The same head, calibration and ``tau`` (default 0.1 when built from lower/upper), with the
        exits placed around the operating threshold ``center`` (see :class:`Cascade`)."""
        return self.with_thresholds(0.1 if self.tau is None else self.tau, center=center)

    def with_thresholds(
        self, tau: float | None = None, *, lower: float | None = None, upper: float | None = None, center: float = 0.5
    ) -> "Cascade":
        """The same head and calibration with other thresholds (``center``: see :class:`Cascade`)."""
        c = Cascade(
            self.head,
            0.1 if tau is None else tau,
            lower=lower,
            upper=upper,
            center=center,
            temperatures=self.temperatures,
            biases=self.biases,
        )
        c.calibration_report = self.calibration_report
        return c

    def _calibrate(self, s: Tensor, order: int) -> Tensor:
        return s / self.temperatures[order - 1] + self.biases[order - 1]

    @torch.no_grad()
    def __call__(self, z: Float[Tensor, "*batch d_model"]) -> CascadeResult:
        """Runs the cascade on activations ``[..., d_model]`` (results are flattened to ``[batch]``)."""
        head = self.head
        zs, _ = _kernel.standardize(head, z)
        walk = _kernel.Walk(head, zs)
        gate = _kernel.gating(head)

        def advance(k: int, keep: Tensor) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
            walk.keep(keep)
            s_k, left = walk.step(k)
            c_k = self._calibrate(s_k, k)
            if not gate:
                return s_k, c_k, None, None
            d_k = c_k.clone()
            if bool(left.any()):  # left the trust region: the linear probe decides, here and for good
                d_k[left] = self._calibrate(walk.lin[left], 1)
            return s_k, c_k, d_k, left

        first = walk.logit.clone()
        s, d, exit_order, flops, gated = _kernel.exit_loop(
            first,
            self._calibrate(first, 1),
            advance,
            head.degree,
            list(itertools.accumulate(head.term_flops())),
            self.lower,
            self.upper,
        )
        if bool(gated.any()):
            log.info(
                "cascade: %d of %d rows left the trust region; scored by the linear probe",
                int(gated.sum()),
                zs.shape[0],
            )
        return CascadeResult(
            logits=s,
            probs=torch.sigmoid(d),
            exit_order=exit_order,
            flops=flops,
            degree=head.degree,
            gated=gated,
            decision_logits=d,
        )

    @torch.no_grad()
    def step(self, z: Float[Tensor, "batch d_model"]) -> CascadeResult:
        """The cascade for one step of generation, with no host synchronisation.

        Each row reports what :meth:`__call__` reports for it (the logit, probability, exit
        order and FLOPs of the order it exits at, equal up to rounding), but every order is
        evaluated for every row, all in one pass (one matmul over the head's packed factors),
        and the exits are picked on the device: a fixed number of tensor operations whatever
        the degree (37 with the gate; each a kernel launch on a GPU), where the row selection would
        synchronise at every order. ``flops`` still counts what the cascade spends on a row. A
        row with a NaN/inf activation gets NaN logits and probabilities (the monitor counts it
        as flagged) instead of an error: the decode loop is not interrupted to read a check back.
        """
        head = self.head
        zs, ok = _kernel.stream_rows(head, z)
        s, left = _kernel.stream_logits(head, zs, head.degree)
        temps, biases, cum = self._step_tensors(s)
        return CascadeResult(
            **step_exits(  # type: ignore[arg-type]  # all Tensor fields; mypy cannot match them by name
                head, s, left, ok, temps, biases, cum, _kernel.logit_of(self.lower), _kernel.logit_of(self.upper)
            ),
            degree=head.degree,
        )

    def _step_tensors(self, like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Per-order temperatures, biases and cumulative FLOPs on ``like``'s device (made once per
        calibration and device, not per generation step; with the head's packs frozen,
        :func:`~tpc_hooks.head._kernel.freeze_packs`, the calibration is not read again either)."""
        frozen = bool(self.head.__dict__.get("_stream_frozen"))
        hit = getattr(self, "_step_cache", None)
        if hit is not None and frozen and hit[2] and hit[0][-2:] == (like.dtype, like.device):
            return hit[1]  # made since the head was frozen
        key = (tuple(self.temperatures), tuple(self.biases), tuple(self.head.term_flops()), like.dtype, like.device)
        if hit is None or hit[0] != key or hit[2] != frozen:
            t = torch.tensor([self.temperatures, self.biases], dtype=like.dtype).to(like.device)
            cum = torch.tensor(list(itertools.accumulate(self.head.term_flops())), dtype=torch.int64).to(like.device)
            self._step_cache = (key, (t[0], t[1], cum), frozen)
        return self._step_cache[1]

    # ------------------------------------------------------------------ calibration
    @torch.no_grad()
    def calibrate(self, X_val: Any, y_val: Any) -> "Cascade":
        """Fits ``T_n, b_n`` per order by NLL (1-D logistic regression on the order's logit).

        Records ECE and NLL before/after per order in :attr:`calibration_report`.
        Returns ``self``.
        """
        from sklearn.linear_model import LogisticRegression

        X = check_features(X_val, "X_val", self.head.d_model)
        y = check_labels(y_val, X.shape[0], "y_val").numpy()
        terms = self.head.terms(X).double().cpu().numpy()
        cum = np.cumsum(terms, axis=1)
        self.temperatures, self.biases, self.calibration_report = [], [], []
        for order in range(1, self.head.degree + 1):
            s = cum[:, order - 1]
            clf = LogisticRegression(C=np.inf, max_iter=1000).fit(s[:, None], y)
            a, b = float(clf.coef_[0, 0]), float(clf.intercept_[0])
            if not a > 0:
                log.warning("order %d: calibration slope %.3g is not positive; keeping T=1, b=0", order, a)
                a, b = 1.0, 0.0
            self.temperatures.append(1 / a)
            self.biases.append(b)
            p0 = 1 / (1 + np.exp(-s))
            p1 = 1 / (1 + np.exp(-(a * s + b)))
            self.calibration_report.append(
                {
                    "order": order,
                    "temperature": 1 / a,
                    "bias": b,
                    "ece_before": expected_calibration_error(y, p0),
                    "ece_after": expected_calibration_error(y, p1),
                    "nll_before": _nll(y, s),
                    "nll_after": _nll(y, a * s + b),
                }
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """Thresholds and calibration, JSON-serialisable (saved with a monitor)."""
        d = {"lower": self.lower, "upper": self.upper, "temperatures": self.temperatures, "biases": self.biases}
        if self._tau is not None and self.center != 0.5:
            d.update(tau=self._tau, center=self.center)  # lower/upper follow from them; kept for readers of the file
        return d

    @classmethod
    def from_dict(cls, head: TPC, d: dict[str, Any]) -> "Cascade":
        if d.get("center") is not None:
            c = cls(head, d["tau"], center=d["center"], temperatures=d["temperatures"], biases=d["biases"])
            if not (
                math.isclose(c.lower, d["lower"], rel_tol=1e-9) and math.isclose(c.upper, d["upper"], rel_tol=1e-9)
            ):
                raise TPCHooksError(
                    f"lower/upper {d['lower']}/{d['upper']} do not follow from tau={d['tau']} and center={d['center']}"
                )
            return c
        return cls(head, lower=d["lower"], upper=d["upper"], temperatures=d["temperatures"], biases=d["biases"])

    # ------------------------------------------------------------------ sweeps
    def sweep(
        self, X: Any, y: Any, taus: Sequence[float] = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
    ) -> list[dict[str, Any]]:
        """Compute-F1 curve: for each ``tau``, F1 and mean FLOPs per input and the exit histogram.

        ``relative_flops`` is the mean FLOPs over the linear probe's (order 1) FLOPs.
        """
        X_t = check_features(X, "X", self.head.d_model)
        y_t = check_labels(y, X_t.shape[0], "y", need_both=False)
        base = self.head.cost(1).flops
        rows = []
        for tau in taus:
            out = self.with_thresholds(tau)(X_t)
            m = classification_metrics(y_t, out.probs, from_logits=False)
            rows.append(
                {
                    "tau": float(tau),
                    "f1": m["f1"],
                    "accuracy": m["accuracy"],
                    "recall": m["recall"],
                    "frr": m["frr"],
                    "mean_flops": out.mean_flops,
                    "relative_flops": out.mean_flops / base,
                    "exit_histogram": out.exit_histogram(),
                }
            )
        return rows


def _nll(y: np.ndarray, s: np.ndarray) -> float:
    return float(np.mean(np.logaddexp(0, s) - y * s))
