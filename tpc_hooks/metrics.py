"""Classification metrics for monitors: scikit-learn where it has them, ECE and FRR here."""

from typing import Any

import numpy as np
import torch

from ._checks import check_labels
from ._errors import TPCHooksError


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


def classification_metrics(y_true: Any, scores: Any, *, from_logits: bool = True, threshold: float = 0.5) -> dict[str, float | int]:
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
