"""The degree-1 probe: scikit-learn's logistic regression (the paper's), C chosen by
validation F1; a streamed L-BFGS on the same objective for stores too large for memory."""

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..._errors import TPCHooksError
from ...head import TPC
from ._loop import f1_at_zero
from ._rows import Rows

_SKLEARN_MAX_BYTES = 2 << 30


def _sklearn_logreg(Xs: np.ndarray, y: np.ndarray, C: float, max_iter: int) -> tuple[np.ndarray, float, bool]:
    """scikit-learn's ``LogisticRegression`` (the paper's probe): ``(coef, intercept, converged)``."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        clf = LogisticRegression(C=C, max_iter=max_iter).fit(Xs, y)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return clf.coef_.ravel().copy(), float(clf.intercept_[0]), converged


def _streamed_logreg(
    data: Rows, scaler: nn.Module, y: Tensor, C: float, max_iter: int, device: torch.device
) -> tuple[np.ndarray, float]:
    """scikit-learn's L2 logistic regression objective, minimised by full-batch L-BFGS with the
    gradient accumulated chunk by chunk (for stores that do not fit in memory)."""
    w = torch.zeros(data.d, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.zeros(1, dtype=torch.float64, device=device, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w, b],
        max_iter=max_iter,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        history_size=20,
    )
    y_d = y.to(device, torch.float64)

    def closure():
        opt.zero_grad()
        total = torch.zeros((), dtype=torch.float64, device=device)
        for pos, x in data.chunks(scaler, device):
            s = x.double() @ w + b
            part = F.binary_cross_entropy_with_logits(s, y_d[torch.as_tensor(pos, device=device)], reduction="sum")
            part.backward()
            total += part.detach()
        reg = (w * w).sum() / (2 * C)
        reg.backward()
        return total + reg.detach()

    opt.step(closure)
    return w.detach().cpu().numpy(), float(b.detach())


def fit_probe(
    head: TPC,
    tr: Rows,
    y_tr: Tensor,
    va: Rows,
    y_va: Tensor,
    Cs: Sequence[float],
    max_iter: int,
    solver: str,
    device: torch.device,
    records: list[dict[str, Any]],
    metric: str = "f1",
) -> dict[str, Any]:
    """The degree-1 probe: one fit per C, the best by validation ``metric`` kept (``"f1"`` at logit 0 or
    ``"auroc"``, scikit-learn's; ties: lower validation loss)."""
    from sklearn.metrics import roc_auc_score

    small = tr.in_memory or tr.n * tr.d * 4 <= _SKLEARN_MAX_BYTES
    if solver == "auto":
        solver = "sklearn" if small else "lbfgs"
    if solver == "sklearn":
        # the rows standardised once (held in memory) as they are, else standardised chunk by chunk
        held = tr.std if tr.std is not None else tr.map(head.scaler, device, lambda x: x)
        Xs, ys = held.cpu().numpy(), y_tr.numpy()

        def solve(C):
            return _sklearn_logreg(Xs, ys, C, max_iter)
    elif solver == "lbfgs":

        def solve(C):
            return (*_streamed_logreg(tr, head.scaler, y_tr, C, max_iter, device), True)
    else:
        raise TPCHooksError(f"linear_solver must be 'auto', 'sklearn' or 'lbfgs'; got {solver!r}")
    yv = y_va.double()
    best = None
    for C in Cs:
        coef, intercept, converged = solve(C)
        w = torch.as_tensor(coef, dtype=torch.float64, device=device)

        def logits(x: Tensor, w: Tensor = w, intercept: float = intercept) -> Tensor:
            return x.double() @ w + intercept

        s = va.map(head.scaler, device, logits).cpu()
        val_loss, val_f1 = float(F.binary_cross_entropy_with_logits(s, yv)), f1_at_zero(s, yv)
        both = bool(0 < float(yv.sum()) < len(yv))
        val_auroc = float(roc_auc_score(yv.numpy(), s.numpy())) if both else float("nan")
        records.append(
            {
                "degree": 1,
                "trial": len(records),
                "epoch": 0,
                "C": C,
                "train_loss": None,
                "val_loss": val_loss,
                "val_f1": val_f1,
                "val_auroc": val_auroc,
                "lr": None,
                "converged": converged,
            }
        )
        score = val_auroc if metric == "auroc" and both else val_f1
        if best is None or (-score, val_loss) < best[0]:
            best = (
                (-score, val_loss),
                coef,
                intercept,
                {
                    "C": C,
                    "trial": len(records) - 1,
                    "val_f1": val_f1,
                    "val_auroc": val_auroc,
                    "val_loss": val_loss,
                    "solver": solver,
                    "metric": metric,
                },
            )
    assert best is not None  # Cs is never empty
    _, coef, intercept, chosen = best
    with torch.no_grad():
        head.linear.copy_(torch.as_tensor(coef, dtype=torch.float32))
        head.bias.fill_(intercept)
    return chosen
