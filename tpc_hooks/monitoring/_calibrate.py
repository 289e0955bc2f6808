"""How a monitor's threshold is set: from benign activations, or from the peak scores a server
logged for traffic marked benign (the body of :meth:`~tpc_hooks.Monitor.calibrate`)."""

import math
import warnings
from collections.abc import Sequence
from typing import Any, no_type_check

import numpy as np
import torch
from torch import Tensor
from typing_extensions import Self

from .._errors import TPCHooksError
from ..activations import pooled_batches
from ..data import check_prompts
from ..head import check_features, threshold_above
from ..metrics import check_rate, threshold_at_fpr
from ..metrics import flagged as flag_rule


@no_type_check  # no runtime type-checking wrapper: the warning names the caller
def activations(monitor: Any, benign: Any, fpr: float, sources: Any = None, everyday: Any = None) -> Any:
    """:meth:`~tpc_hooks.Monitor.calibrate_activations`."""
    fpr = check_rate(fpr, "fpr")
    if monitor.streaming:
        if isinstance(benign, (Tensor, np.ndarray)) or not isinstance(benign, Sequence) or not benign:
            raise TPCHooksError(
                "a per-token monitor calibrates on a non-empty list of per-token activations "
                "[T_i, d_model], one per benign sequence (or use calibrate(model, prompts))"
            )
        seqs = [check_features(z, f"benign sequence {i}", monitor.head.d_model).float() for i, z in enumerate(benign)]

        def decisions_of(rule):
            return torch.stack([monitor._aggregated(rule, z)[1].max() for z in seqs])

        n = len(seqs)
    else:
        z = check_features(benign, "benign activations", monitor.head.d_model).float()

        def decisions_of(rule):
            return rule(z).decision_logits

        n = z.shape[0]
    sources = check_sources(sources, n)
    on = everyday_rows(sources, everyday)
    _warn_few(fpr, n if on is None else int(on.sum()), 5)  # the caller of Monitor.calibrate_activations
    if monitor.cascade is not None:
        full = decisions_of(monitor.cascade.with_thresholds(0.0))
        s = full.double().cpu().numpy()
        monitor.cascade = monitor.cascade.centered(
            threshold_above(full, threshold_at_fpr(s if on is None else s[on], fpr))
        )
    return _set(
        monitor,
        decisions_of(monitor.policy()),
        fpr,
        {"by": "max over tokens"} if monitor.streaming else {},
        sources,
        on,
    )


def prompts(
    monitor: Any,
    model: Any,
    benign_prompts: Any,
    fpr: Any,
    sources: Any,
    everyday: Any,
    batch_size: Any,
    tokenizer: Any,
) -> Any:
    """:meth:`~tpc_hooks.Monitor.calibrate` on benign prompts: every argument checked before the
    forward pass, the prompts read as :meth:`~tpc_hooks.Monitor.score` reads them, then
    :func:`activations`."""
    check_rate(fpr, "fpr")
    texts = check_prompts(benign_prompts)
    everyday_rows(check_sources(sources, len(texts)), everyday)
    adapter = monitor._adapter(model, tokenizer)
    ids, _ = adapter.tokenize(
        texts, chat_template=monitor.chat_template, max_tokens=monitor.max_tokens, prepend_bos=monitor.prepend_bos
    )
    site = adapter.site(monitor.site)
    z = (
        monitor._token_acts(adapter, ids, site, batch_size)
        if monitor.streaming
        else pooled_batches(adapter, ids, [site], monitor.pooling, batch_size, sae=monitor.sae)[site.name]
    )
    return monitor.calibrate_activations(z, fpr, sources=sources, everyday=everyday)


@no_type_check  # no runtime type-checking wrapper: the warning names the caller
def from_peaks(monitor: Any, peaks: Any, fpr: float, sources: Any = None, everyday: Any = None) -> Any:
    """The threshold from the peak scores (probabilities) of requests marked benign: at most
    ``fpr`` of them reach it."""
    fpr = check_rate(fpr, "fpr")
    p = torch.as_tensor(np.asarray(peaks, dtype=np.float64)).ravel()
    if p.numel() == 0 or not bool(((p >= 0) & (p <= 1)).all()):
        raise TPCHooksError(
            f"peaks must be a non-empty list of scores in [0, 1]; got {p.numel()} values"
            + (f", e.g. {float(p[~((p >= 0) & (p <= 1))][0])}" if p.numel() else "")
        )
    sources = check_sources(sources, p.numel())
    on = everyday_rows(sources, everyday)
    _warn_few(fpr, p.numel() if on is None else int(on.sum()), 4)  # the caller of Monitor.calibrate
    return _set(monitor, torch.logit(p), fpr, {"by": "peak scores a server logged"}, sources, on)


def logits(monitor: Any, decisions: Any, fpr: float, how: str, sources: Any = None, everyday: Any = None) -> Any:
    """The threshold from decision logits of benign inputs scored elsewhere (``how`` says by what,
    e.g. heads that never trained on them: out-of-fold scores), recorded as :func:`activations`
    records it. No cascade: its exits would need the same inputs' truncations."""
    fpr = check_rate(fpr, "fpr")
    if monitor.cascade is not None:
        raise TPCHooksError("a monitor with a cascade is calibrated on activations (calibrate_activations)")
    s = torch.as_tensor(np.asarray(decisions, dtype=np.float64)).ravel()
    if s.numel() == 0 or not bool(torch.isfinite(s).all()):
        raise TPCHooksError(f"decisions must be a non-empty list of finite logits; got {s.numel()} values")
    sources = check_sources(sources, s.numel())
    on = everyday_rows(sources, everyday)
    _warn_few(fpr, s.numel() if on is None else int(on.sum()), 5)  # the caller of train_monitor
    return _set(monitor, s, fpr, {"by": how}, sources, on)


@no_type_check  # no runtime type-checking wrapper: the warning names the caller
def _warn_few(fpr: float, n: int, stacklevel: int) -> None:
    if 0 < fpr * n < 1:
        warnings.warn(
            f"calibrating at fpr={fpr:g} on {n} benign input(s): one flag would already be a rate of "
            f"{1 / n:.3g}, so the threshold keeps all {n} unflagged and the rate it reaches on new benign "
            f"traffic is unmeasured; calibrate on at least {math.ceil(1 / fpr)} benign inputs",
            UserWarning,
            stacklevel=stacklevel,
        )


def fpr_interval(n_benign: int, flagged: int, confidence: float = 0.95) -> tuple[float, float]:
    """Where the false-positive rate on new benign inputs lies, with probability ``confidence``, for
    a threshold set among ``n_benign`` benign scores with ``flagged`` of them above it.

    Such a threshold is the ``(flagged + 1)``-th largest of the scores, and the share of new
    benign scores (drawn like them, continuous) above the ``k``-th largest of ``n`` is distributed
    as Beta(k, n + 1 - k): the central interval of that law (SciPy). With few benign inputs it is
    wide: 1% of 170 prompts is one of them, and the rate on new traffic lies between 0.14% and
    3.2%.

    Example:
        >>> [round(v, 4) for v in fpr_interval(170, 1)]
        [0.0014, 0.0323]
    """
    from scipy.stats import beta

    if not 0 <= flagged < n_benign:
        raise TPCHooksError(f"fpr_interval needs 0 <= flagged < n_benign; got {flagged} of {n_benign}")
    k = flagged + 1
    lo, hi = beta.ppf([(1 - confidence) / 2, (1 + confidence) / 2], k, n_benign + 1 - k)
    return float(lo), float(hi)


@no_type_check  # no runtime type-checking wrapper: the warning names the caller
def _set(
    monitor: Any,
    decisions: Tensor,
    fpr: float,
    how: dict[str, str],
    sources: np.ndarray | None = None,
    on: np.ndarray | None = None,
) -> Any:
    """The threshold that leaves all but ``fpr`` of the benign ``decisions`` (logits) unflagged (only
    the rows ``on``, the everyday sources', when given), recorded with the interval of the rate it
    flags on new benign traffic like them (:func:`fpr_interval`) and, with ``sources``, the rate it
    flags on each source's inputs (:func:`rates_by_source`)."""
    scores = decisions.double().cpu().numpy()
    monitor.threshold = threshold_above(decisions, threshold_at_fpr(scores if on is None else scores[on], fpr))
    hit = flag_rule(decisions, monitor.threshold).cpu().numpy()
    counted = hit if on is None else hit[on]
    flagged, n = int(counted.sum()), int(counted.size)
    monitor.report["operating_point"] = {
        "fpr": float(fpr),
        "n_benign": n,
        "flagged": flagged,
        "threshold": monitor.threshold,
        "fpr_interval_95": list(fpr_interval(n, flagged)),
        **how,
    }
    if sources is not None:
        monitor.report["operating_point"].update(rates_by_source(hit, sources))
    if on is not None:
        monitor.report["operating_point"]["everyday"] = sorted(set(sources[on].tolist()))
    return monitor


def check_sources(sources: Any, n: int, per: str = "benign input") -> np.ndarray | None:
    """One source name per benign input (``calibrate``'s ``sources``; ``train_monitor``'s: one ``per``
    prompt), as an array of strings, or None."""
    if sources is None:
        return None
    if isinstance(sources, (str, bytes)) or not isinstance(sources, (Sequence, np.ndarray)):
        raise TPCHooksError(f"sources must be a list of source names, one per {per}; got {type(sources).__name__}")
    names = [str(v) for v in sources]
    if len(names) != n:
        raise TPCHooksError(f"sources needs one name per {per} ({n}); got {len(names)}")
    if any(not v.strip() for v in names):
        raise TPCHooksError(f"sources has an empty name; give every {per} the name of where it comes from")
    return np.asarray(names, dtype=object)


def everyday_rows(sources: np.ndarray | None, everyday: Any) -> np.ndarray | None:
    """The rows of the everyday sources (``everyday``: names among ``sources``), the rows a threshold
    is set on; None (every row) without ``everyday``. The other sources are reported, not calibrated on.

    Example:
        >>> everyday_rows(np.array(["chat", "chat, wrapped", "math"], dtype=object), ["chat", "math"]).tolist()
        [True, False, True]
    """
    if everyday is None:
        return None
    if sources is None:
        raise TPCHooksError("everyday names sources of everyday benign traffic: it needs sources= (one name per input)")
    if isinstance(everyday, (str, bytes)) or not isinstance(everyday, (Sequence, np.ndarray, set, frozenset)):
        raise TPCHooksError(f"everyday must be a list of source names; got {type(everyday).__name__}")
    names = {str(v) for v in everyday}
    unknown = sorted(names - set(sources.tolist()))
    if unknown or not names:
        raise TPCHooksError(
            f"everyday names sources the inputs do not have: {unknown or 'none given'}; the sources "
            f"are {sorted(set(sources.tolist()))}"
        )
    return np.isin(sources, sorted(names))


def everyday_present(everyday: Any, sources: np.ndarray | None) -> Any:
    """``everyday`` without the names ``sources`` lacks (a small split may hold no prompt of one),
    all of it when none is present (:func:`everyday_rows` then says what is missing); None stays None.

    Example:
        >>> everyday_present(["chat", "math"], np.array(["chat", "chat, wrapped"], dtype=object))
        ['chat']
    """
    if everyday is None or sources is None:
        return everyday
    have = set(sources.tolist())
    return [n for n in everyday if n in have] or list(everyday)


def rates_by_source(hit: np.ndarray, sources: np.ndarray) -> dict[str, Any]:
    """How a threshold set on a mixture of benign sources treats each of them: per source, the
    inputs, how many the threshold flags, the rate, and the exact (Clopper-Pearson) 95% interval of
    the rate on new inputs of that source (SciPy's ``binomtest``); the lowest and highest rate
    (``spread``) and the source flagged most (``worst_source``). A threshold at 1% of the mixture
    can flag far more of one source than of another (docs/benchmarks/constructions.md).

    Example:
        >>> import numpy as np
        >>> out = rates_by_source(np.array([True, False, False, False]), np.array(["a", "a", "b", "b"]))
        >>> out["spread"], out["worst_source"], out["by_source"]["a"]["flagged"]
        ([0.0, 0.5], 'a', 1)
    """
    from scipy.stats import binomtest

    by_source: dict[Any, dict[str, Any]] = {}
    for name in dict.fromkeys(sources.tolist()):
        at = sources == name
        k, m = int(hit[at].sum()), int(at.sum())
        ci = binomtest(k, m).proportion_ci(0.95)
        by_source[name] = {"n": m, "flagged": k, "rate": k / m, "rate_interval_95": [float(ci.low), float(ci.high)]}
    rates = [v["rate"] for v in by_source.values()]
    return {
        "by_source": by_source,
        "spread": [min(rates), max(rates)],
        "worst_source": max(by_source, key=lambda s: by_source[s]["rate"]),
    }


class CalibrationMethods:
    """How a monitor sets its threshold (mixed into :class:`~tpc_hooks.Monitor`): from benign prompts, a
    server's logged peak scores, or benign activations, by the functions above."""

    @no_type_check  # fpr is checked here, with a message that names the fix; the test-time checker would preempt it
    @torch.no_grad()
    def calibrate(
        self,
        model: Any = None,
        benign_prompts: Sequence[str] | None = None,
        fpr: float = 0.01,
        *,
        peaks: Sequence[float] | None = None,
        sources: Sequence[str] | None = None,
        everyday: Sequence[str] | None = None,
        batch_size: int = 8,
        tokenizer: Any = None,
    ) -> Self:
        """Sets :attr:`threshold` so that at most ``fpr`` of ``benign_prompts`` is flagged, or of the
        requests whose ``peaks`` (their highest score over a generation) a server logged.

        The prompts are scored as :meth:`score` does (this monitor's pooling and policy); see
        :meth:`calibrate_activations` for what is set and recorded (``tokenizer``: as in
        :meth:`score`). ``peaks``, in place of a model and prompts: the peak scores of real traffic
        you mark benign, as :func:`tpc_hooks.logged_peaks` reads them from a server's
        review log (its sampled requests); a request counts as flagged when its peak reaches the
        threshold, as the server decides. A cascade's exits are left as they are (peaks are the
        policy's own scores). ``sources``, ``everyday``: as in :meth:`calibrate_activations`.
        Returns ``self``.

        Example:
            >>> monitor.calibrate(model, benign_validation_prompts, fpr=0.01)  # doctest: +SKIP
            >>> monitor.threshold, monitor.report["operating_point"]["flagged"]  # doctest: +SKIP
            >>> monitor.calibrate(  # doctest: +SKIP
            ...     peaks=tpc.logged_peaks(tpc.read_review_log("logs/"), "harm", benign=ids)
            ... )
        """
        if peaks is not None:
            if model is not None or benign_prompts is not None:
                raise TPCHooksError("calibrate takes a model and benign prompts, or peaks, not both")
            return from_peaks(self, peaks, fpr, sources, everyday)
        if model is None or benign_prompts is None:
            raise TPCHooksError("calibrate needs a model and benign prompts (or peaks=, a server's logged peak scores)")
        return prompts(self, model, benign_prompts, fpr, sources, everyday, batch_size, tokenizer)

    @no_type_check  # as calibrate
    @torch.no_grad()
    def calibrate_activations(
        self,
        benign: Any,
        fpr: float = 0.01,
        *,
        sources: Sequence[str] | None = None,
        everyday: Sequence[str] | None = None,
    ) -> Self:
        """Sets :attr:`threshold` from pooled activations ``[n, d_model]`` of benign inputs, so that
        at most ``fpr`` of them is flagged (``prob >= threshold``). A per-token monitor takes a
        list of per-token activations ``[T_i, d_model]``, one per benign sequence, and counts a
        sequence as flagged when its aggregated score reaches the threshold at any token (the
        maximum over the sequence: what a monitor streaming it would see).

        With a cascade, its exits are first centred on the full order's threshold
        (:meth:`Cascade.centered`: an order settles a row only when it is clearly on one side of
        the threshold in use), then the threshold is set on the cascade's own probabilities, so
        the bound holds for the policy that runs. ``report["operating_point"]`` records the
        target, the benign count, how many were flagged and ``fpr_interval_95``, where the rate on
        new benign inputs drawn like them lies with 95% probability (wide on a few hundred
        inputs: 0.14-3.2% at 1% of 170). Returns ``self``.

        ``sources`` (one name per benign input: a dataset, a product surface, a customer) keeps the
        threshold on all the inputs together and adds how it treats each source:
        ``report["operating_point"]["by_source"]`` (per source: inputs, flagged, rate and the exact
        95% interval of the rate on new inputs of that source), ``"spread"`` (the lowest and
        highest rate) and ``"worst_source"``: a threshold at one percent of a mixture can flag
        several times that of one of its sources.

        ``everyday`` (names among ``sources``): the threshold is set on those sources' inputs
        only (plain user requests, not jailbreak-wrapped ones); the others are only reported.

        Raises:
            TPCHooksError: no rows, wrong ``d_model``, NaN/inf, ``fpr`` outside [0, 1), a benign
                tail saturated at probability 1 (no threshold below 1 can separate it),
                ``sources`` not one name per input, or ``everyday`` naming a source they lack.

        Example:
            >>> op = monitor.calibrate_activations(  # doctest: +SKIP
            ...     benign, 0.01, sources=names
            ... ).report["operating_point"]
            >>> op["by_source"]["forum"]["rate"], op["worst_source"]  # doctest: +SKIP
        """
        return activations(self, benign, fpr, sources, everyday)
