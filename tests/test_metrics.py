import numpy as np
import pytest
from sklearn.metrics import f1_score, precision_score, recall_score, roc_auc_score

from tpc_hooks.metrics import classification_metrics, expected_calibration_error, false_rejection_rate
from tpc_hooks._loop import f1_at_zero


def test_metrics_agree_with_sklearn_and_hand_counts():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    s = rng.normal(size=400) + 1.2 * (y - 0.5)
    m = classification_metrics(y, s)
    pred = (s >= 0).astype(int)
    assert m["f1"] == pytest.approx(f1_score(y, pred))
    assert m["precision"] == pytest.approx(precision_score(y, pred))
    assert m["recall"] == pytest.approx(recall_score(y, pred))
    assert m["auroc"] == pytest.approx(roc_auc_score(y, s))
    fp = int(((pred == 1) & (y == 0)).sum())
    tn = int(((pred == 0) & (y == 0)).sum())
    assert m["frr"] == pytest.approx(fp / (fp + tn)) == pytest.approx(false_rejection_rate(y, pred))
    import torch

    assert f1_at_zero(torch.tensor(s), torch.tensor(y)) == pytest.approx(m["f1"])


def test_ece_by_hand():
    # two bins used: confidences 0.9 (3 inputs, 2 correct) and 0.6 (1 input, correct)
    y = np.array([1, 1, 0, 0])
    p = np.array([0.9, 0.9, 0.9, 0.4])
    want = 0.75 * abs(2 / 3 - 0.9) + 0.25 * abs(1.0 - 0.6)
    assert expected_calibration_error(y, p, n_bins=5) == pytest.approx(want)
    assert expected_calibration_error(np.array([1, 0]), np.array([1.0, 0.0])) == 0.0
