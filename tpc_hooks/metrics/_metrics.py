"""Classification metrics for monitors (the face: :mod:`tpc_hooks.metrics`)."""

from typing import Any

import numpy as np
import torch

from .._errors import TPCHooksError
from ._checks import check_labels


def _np(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def false_rejection_rate(y_true: Any, y_pred: Any) -> float:
    """Share of benign inputs (label 0) flagged as harmful: FP / (FP + TN). NaN if no benign input."""
    yt, yp = _np(y_true), _np(y_pred)
    benign = yt == 0
    return float(yp[benign].mean()) if benign.any() else float("nan")


def expected_calibration_error(y_true: Any, probs: Any, n_bins: int = 15) -> float:
    """Top-label ECE with ``n_bins`` equal-width confidence bins (Guo et al., 2017).

    Confidence is ``max(p, 1 - p)``; a bin's gap is |accuracy - mean confidence| weighted by
    its share of inputs.
    """
    yt, p = _np(y_true), _np(probs)
    if yt.shape != p.shape or yt.ndim != 1 or len(yt) == 0:
        raise TPCHooksError(f"y_true and probs must be 1-D and of equal length; got {yt.shape} and {p.shape}")
    pred = (p >= 0.5).astype(np.float64)
    conf = np.where(pred == 1, p, 1 - p)
    correct = (pred == yt).astype(np.float64)
    edges = np.linspace(0.5, 1.0, n_bins + 1)
    which = np.clip(np.searchsorted(edges, conf, side="right") - 1, 0, n_bins - 1)
    ece = 0.0
    for b in range(n_bins):
        m = which == b
        if m.any():
            ece += m.mean() * abs(correct[m].mean() - conf[m].mean())
    return float(ece)


def classification_metrics(
    y_true: Any, scores: Any, *, from_logits: bool = True, threshold: float = 0.5
) -> dict[str, float | int]:
    """F1, precision, recall, accuracy, false-rejection rate, AUROC and ECE of a binary scorer.

    Args:
        y_true: labels in {0, 1} (1 = harmful).
        scores: logits (default) or probabilities (``from_logits=False``) of the harmful class.
        threshold: probability at or above which an input is flagged.

    Example:
        >>> m = classification_metrics([0, 1, 1, 0], [-2.0, 1.5, -0.1, 0.3])
        >>> round(m["f1"], 3), round(m["frr"], 3)
        (0.5, 0.5)
    """
    from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score, roc_auc_score

    s = _np(scores)
    yt = check_labels(y_true, len(s), "y_true", need_both=False).numpy()
    with np.errstate(over="ignore"):  # exp(-s) overflows to inf for s < -709: the probability is then 0, as wanted
        probs = 1 / (1 + np.exp(-s)) if from_logits else s
    pred = (probs >= threshold).astype(int)
    both = 0 < yt.sum() < len(yt)
    return {
        "n": int(len(yt)),
        "f1": float(f1_score(yt, pred, zero_division=0)),
        "precision": float(precision_score(yt, pred, zero_division=0)),
        "recall": float(recall_score(yt, pred, zero_division=0)),
        "accuracy": float(accuracy_score(yt, pred)),
        "frr": false_rejection_rate(yt, pred),
        "auroc": float(roc_auc_score(yt, s)) if both else float("nan"),
        "ece": expected_calibration_error(yt, probs),
    }


def threshold_at_fpr(benign_scores: Any, fpr: float = 0.01) -> float:
    """The score threshold that flags at most ``fpr`` of ``benign_scores`` (flag: score > threshold).

    The threshold is one of the benign scores: the ``floor(fpr * n)``-th largest counted from
    the top, so that exactly that many (fewer under ties) benign rows lie strictly above it. Set it
    on benign *validation* rows and apply it unchanged to new data.

    Args:
        benign_scores: scores (logits or probabilities: any monotone scale) of benign rows.
        fpr: the false-positive rate allowed, in [0, 1).

    Raises:
        TPCHooksError: no scores, a NaN score, or ``fpr`` outside [0, 1).

    Example:
        >>> threshold_at_fpr([0.1, 0.4, 0.2, 0.9, 0.3], fpr=0.2)  # one of five may lie above
        0.4
    """
    s = np.sort(_np(benign_scores).astype(np.float64).ravel())
    if s.size == 0 or np.isnan(s).any():
        raise TPCHooksError(f"threshold_at_fpr needs at least one benign score and no NaN; got {s.size} scores")
    if not 0 <= fpr < 1:
        raise TPCHooksError(f"fpr must be in [0, 1); got {fpr}")
    return float(s[s.size - 1 - int(np.floor(fpr * s.size + 1e-9))])


def recall_at_fpr(y_true: Any, scores: Any, benign_reference: Any, fpr: float = 0.01) -> dict[str, float]:
    """Recall and false-positive rate on ``(y_true, scores)`` at the threshold that flags ``fpr`` of
    ``benign_reference`` (benign validation scores; see :func:`threshold_at_fpr`).

    The false-positive rate on new data can differ from ``fpr``: it is reported, not assumed.

    Returns:
        ``{"recall", "fpr", "threshold"}``; recall (fpr) is NaN when ``y_true`` has no harmful (benign) row.

    Example:
        >>> r = recall_at_fpr([0, 0, 1, 1], [0.1, 0.5, 0.45, 0.9], benign_reference=[0.1, 0.2, 0.3, 0.4], fpr=0.0)
        >>> r["recall"], r["fpr"], r["threshold"]
        (1.0, 0.5, 0.4)
    """
    s = _np(scores).astype(np.float64)
    yt = check_labels(y_true, len(s), "y_true", need_both=False).numpy()
    t = threshold_at_fpr(benign_reference, fpr)
    flagged = s > t
    return {
        "recall": float(flagged[yt == 1].mean()) if (yt == 1).any() else float("nan"),
        "fpr": float(flagged[yt == 0].mean()) if (yt == 0).any() else float("nan"),
        "threshold": t,
    }


def worst_group(y_true: Any, scores: Any, groups: Any, fpr: float = 0.01, benign: Any = None) -> dict[str, float]:
    """The worst group's recall at ``fpr`` (threshold from the benign rows of every group together, or
    from the rows ``benign`` marks: those a monitor's threshold is set on),
    AUROC and F1 at logit 0, each taken over the groups separately; a group without harmful rows
    (or without both classes, for AUROC) has no value and is skipped, and none at all is NaN.
    Model selection by worst group and :func:`tpc_hooks.choose_site` use it.

    Example:
        >>> worst_group([0, 1, 0, 1], [-1.0, 2.0, -2.0, 0.5], ["a", "a", "b", "b"], fpr=0.0)["recall_at_fpr"]
        1.0
    """
    s = _np(scores).astype(np.float64)
    y = check_labels(y_true, len(s), "y_true", need_both=False).numpy()
    g = np.asarray(groups)
    ref = s[y == 0] if benign is None else s[np.asarray(benign, bool)]
    per_group: dict[str, list[float]] = {"recall_at_fpr": [], "auroc": [], "f1": []}
    for name in dict.fromkeys(g.tolist()):
        m = g == name
        metrics = classification_metrics(y[m], s[m])
        per_group["recall_at_fpr"].append(recall_at_fpr(y[m], s[m], ref, fpr)["recall"])
        per_group["auroc"].append(metrics["auroc"])
        per_group["f1"].append(metrics["f1"] if (y[m] == 1).any() else np.nan)
    return {k: float(min((v for v in vals if not np.isnan(v)), default=np.nan)) for k, vals in per_group.items()}
