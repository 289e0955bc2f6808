import numpy as np
import pytest
from sklearn.metrics import f1_score, precision_score, recall_score, roc_auc_score

from tpc_hooks import TPCHooksError
from tpc_hooks.metrics import classification_metrics, expected_calibration_error, false_rejection_rate
from tpc_hooks.training._engine._loop import f1_at_zero


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


def test_recall_at_fpr_is_the_best_recall_sklearn_s_roc_curve_allows():
    from sklearn.metrics import roc_curve

    from tpc_hooks.metrics import recall_at_fpr, threshold_at_fpr

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 700)
    s = rng.standard_normal(700) + 1.2 * y
    fpr_grid, tpr_grid, _ = roc_curve(y, s)
    for fpr in (0.0, 0.01, 0.05, 0.2):
        got = recall_at_fpr(y, s, s[y == 0], fpr)
        assert got["recall"] == pytest.approx(tpr_grid[fpr_grid <= fpr + 1e-12].max())
        assert got["fpr"] <= fpr + 1e-12
        assert got["threshold"] == threshold_at_fpr(s[y == 0], fpr)
    with pytest.raises(TPCHooksError, match=r"fpr must be in \[0, 1\)"):
        threshold_at_fpr([0.1, 0.2], 1.0)
    with pytest.raises(TPCHooksError, match="at least one benign score"):
        threshold_at_fpr([], 0.01)
