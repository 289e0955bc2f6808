"""Classification metrics for monitors: scikit-learn where it has them, ECE and FRR here."""

from .head._metrics import classification_metrics as classification_metrics
from .head._metrics import expected_calibration_error as expected_calibration_error
from .head._metrics import false_rejection_rate as false_rejection_rate
from .head._metrics import recall_at_fpr as recall_at_fpr
from .head._metrics import threshold_at_fpr as threshold_at_fpr
from .head._metrics import worst_group as worst_group

__all__ = [
    "classification_metrics",
    "threshold_at_fpr",
    "recall_at_fpr",
    "worst_group",
    "false_rejection_rate",
    "expected_calibration_error",
]
