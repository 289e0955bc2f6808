"""The one flag rule of every monitoring run, offline and during generation, in every adapter and
in the vLLM worker; the views colour by it too."""

import math

from torch import Tensor


def threshold_logit(threshold: float) -> float:
    """``logit(threshold)`` in float64 (``flagged`` compares decision logits with it)."""
    return math.log(threshold) - math.log1p(-threshold)


def flagged(decision_logits: Tensor, threshold: float) -> Tensor:
    """THE flag rule of a monitoring run: ``decision_logit >= logit(threshold)`` (the same as
    ``prob >= threshold``, compared in logit space, in the logits' own dtype, so it does not
    saturate where a float32 probability reaches 1), and a NaN (a step whose activations held
    NaN/inf) counts as flagged: the monitor fails closed.

    Example:
        >>> import torch
        >>> flagged(torch.tensor([-1.0, 0.0, float("nan")]), 0.5).tolist()
        [False, True, True]
    """
    return (decision_logits >= threshold_logit(threshold)) | decision_logits.isnan()
