"""Classification metrics for monitors: scikit-learn where it has them, ECE and FRR here.

The folder also holds what the package's other folders share of it (not in ``__all__``): the one
flag rule of every monitoring run (``flagged``: a score at or above the threshold, NaN flagged) and
the checks of labels and rates.
"""

from ._checks import as_tensor as as_tensor
from ._checks import check_labels as check_labels
from ._checks import check_rate as check_rate
from ._metrics import classification_metrics as classification_metrics
from ._metrics import expected_calibration_error as expected_calibration_error
from ._metrics import false_rejection_rate as false_rejection_rate
from ._metrics import recall_at_fpr as recall_at_fpr
from ._metrics import threshold_at_fpr as threshold_at_fpr
from ._metrics import worst_group as worst_group
from ._rule import flagged as flagged

__all__ = [
    "classification_metrics",
    "threshold_at_fpr",
    "recall_at_fpr",
    "worst_group",
    "false_rejection_rate",
    "expected_calibration_error",
]
