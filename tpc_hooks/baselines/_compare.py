"""``compare``: the TPC and the paper's baselines trained on one split, every order scored."""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._errors import TPCHooksError
from ..head import TPC, Cost, truncations
from ..metrics import check_labels, classification_metrics
from ..training import Rows, as_rows, default_device, fit
from ._baselines import _Baseline, fit_baseline, matched_early_exit_widths, matched_mlp_width

log = logging.getLogger(__name__)

METHODS = ("linear", "bilinear", "mlp", "early_exit", "tpc", "tpc_paper", "tpc_joint")
_METRICS = ("f1", "precision", "recall", "accuracy", "frr", "auroc", "ece")


def fit_linear(X_train: Any, y_train: Any, X_val: Any = None, y_val: Any = None, **kw: Any) -> TPC:
    """The paper's linear probe: ``tpc_hooks.fit(..., degree=1)`` (scikit-learn logistic regression).

    Args:
        X_train, y_train, X_val, y_val: as in :func:`tpc_hooks.fit`.
        **kw: other keyword arguments of :func:`tpc_hooks.fit` (``Cs``, ``max_iter``, ``seed``, ...).

    Returns:
        A degree-1 :class:`~tpc_hooks.TPC`.

    Raises:
        TPCHooksError: ``degree`` passed, or bad input.

    Example:
        >>> from tpc_hooks.baselines import fit_linear
        >>> from tpc_hooks.synthetic import make_problem
        >>> X, y = make_problem(n=300, d_model=8, seed=0)
        >>> fit_linear(X, y, verbose=False).degree
        1
    """
    if "degree" in kw:
        raise TPCHooksError(
            f"fit_linear always fits degree 1; got degree={kw['degree']!r} (use tpc_hooks.fit for more)"
        )
    return fit(X_train, y_train, X_val, y_val, degree=1, **kw)


# ---------------------------------------------------------------------- comparison
@dataclass
class Comparison:
    """Test-set results of :func:`compare`: one row per (method, order).

    Attributes:
        rows: dicts with ``method, order, params, flops, f1, precision, recall, accuracy,
            frr, auroc, ece``.
        models: the trained models by method (``"mlp"``: a list, one per order).
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    models: dict[str, Any] = field(default_factory=dict)

    @torch.no_grad()
    def evaluate(self, X: Any, y: Any, device: str | torch.device | None = None) -> list[dict[str, Any]]:
        """Rows like :attr:`rows` for the trained models on other data (e.g. a held-out source)."""
        first = next(iter(self.models.values()))
        d_model = (first[0] if isinstance(first, list) else first).d_model
        data = as_rows(X, "X", d_model)
        y_t = check_labels(y, data.n, "y", need_both=False)
        dev = default_device(device)
        rows = []
        for method, model in self.models.items():
            for order, cost, logits in _scored(method, model, data, dev):
                m = classification_metrics(y_t, logits)
                rows.append(
                    {
                        "method": method,
                        "order": order,
                        "params": cost.params,
                        "flops": cost.flops,
                        **{k: m[k] for k in _METRICS},
                    }
                )
        return rows

    @torch.no_grad()
    def logits(self, X: Any, device: str | torch.device | None = None) -> dict[tuple[str, int], np.ndarray]:
        """Every trained method's logit at every order on ``X``: ``{(method, order): [n]}``, for
        metrics :attr:`rows` lacks (recall at a fixed false-positive rate, for one)."""
        first = next(iter(self.models.values()))
        data = as_rows(X, "X", (first[0] if isinstance(first, list) else first).d_model)
        dev = default_device(device)
        return {
            (method, order): logits.double().numpy()
            for method, model in self.models.items()
            for order, _, logits in _scored(method, model, data, dev)
        }

    def to_dataframe(self):
        """The rows as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def to_markdown(self, digits: int = 4) -> str:
        """The rows as a Markdown table (floats rounded to ``digits`` places)."""
        cols = ["method", "order", "params", "flops", *_METRICS]
        fmt = [f"{v:.{digits}f}" if isinstance(v, float) else str(v) for r in self.rows for v in (r[c] for c in cols)]
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        for i in range(0, len(fmt), len(cols)):
            lines.append("| " + " | ".join(fmt[i : i + len(cols)]) + " |")
        return "\n".join(lines)


_BASELINE_KW = ("epochs", "batch_size", "lr", "weight_decay", "dropout", "patience", "sweep", "val_fraction")
_ROBUST_KW = ("trust_region", "gate", "shrink", "escalate_only", "experimental", "margin", "decay_growth", "l1")
_TPC_KW = _BASELINE_KW + ("Cs", "max_iter", "linear_solver") + _ROBUST_KW


@torch.no_grad()
def _test_logits(model: TPC | _Baseline, test: Rows, dev: torch.device, fn: Callable[[Tensor], Tensor]) -> Tensor:
    return test.map(model.scaler, dev, lambda zs: fn(zs).reshape(zs.shape[0], -1)).cpu()


def _scored(method: str, model: Any, data: Rows, dev: torch.device) -> list[tuple[int, Cost, Tensor]]:
    """``(order, cost, logits)`` per order of one trained method (an MLP list: one per order)."""
    if method in ("tpc", "tpc_paper", "tpc_joint", "linear"):
        orders = range(1, model.degree + 1)
        s = _test_logits(model, data, dev, lambda zs: torch.stack(truncations(model, zs, model.degree), -1))
        return [(n, model.cost(n), s[:, n - 1]) for n in orders]
    if method == "bilinear":
        return [(2, model.cost(), _test_logits(model, data, dev, model._outputs_std)[:, 0])]
    if method == "mlp":
        return [(n, m.cost(), _test_logits(m, data, dev, m._outputs_std)[:, 0]) for n, m in enumerate(model, 1)]
    s = _test_logits(model, data, dev, model._outputs_std)
    return [(n, model.cost(n), s[:, n - 1]) for n in range(1, model.n_exits + 1)]


def compare(
    X_train: Any,
    y_train: Any,
    X_val: Any,
    y_val: Any,
    X_test: Any,
    y_test: Any,
    *,
    degree: int = 5,
    rank: int | Sequence[int] = 64,
    methods: Sequence[str] = METHODS,
    seed: int = 0,
    device: str | torch.device | None = None,
    verbose: bool = True,
    **train_kw: Any,
) -> Comparison:
    """Trains the TPC and the paper's baselines on one split and scores every order on the test set.

    Rows: ``"tpc"``/``"tpc_paper"``/``"tpc_joint"`` (progressive TPC with the default robust
    settings / the paper's exact recipe / joint TPC) and ``"early_exit"`` give one row
    per order or exit 1..N at that order's own cost; ``"mlp"`` trains one MLP per order,
    parameter-matched to ``P_{:n}`` (:func:`matched_mlp_width`); ``"linear"`` (order 1) and
    ``"bilinear"`` (order 2, rank ``R_2``) give one row each.

    Args:
        X_train, y_train, X_val, y_val: as in :func:`tpc_hooks.fit` (``X_val=y_val=None``
            holds out a stratified split of the training rows).
        X_test, y_test: the data every row is scored on.
        degree, rank: the TPC's N and CP rank(s); the MLPs and early-exit MLP are matched to it.
        methods: a subset of ``("linear", "bilinear", "mlp", "early_exit", "tpc", "tpc_paper", "tpc_joint")``.
        seed, device, verbose: as in :func:`tpc_hooks.fit`.
        **train_kw: ``epochs, batch_size, lr, weight_decay, dropout, sweep, val_fraction`` for
            every method; ``Cs, max_iter, linear_solver`` for the linear probe and the TPCs.

    Returns:
        A :class:`Comparison`.

    Raises:
        TPCHooksError: an unknown method or keyword, or bad input.

    Example:
        >>> from tpc_hooks.baselines import compare
        >>> from tpc_hooks.synthetic import make_problem
        >>> X, y = make_problem(n=400, d_model=8, seed=0)
        >>> Xt, yt = make_problem(n=200, d_model=8, seed=1)
        >>> res = compare(X[:300], y[:300], X[300:], y[300:], Xt, yt, degree=2, rank=2,
        ...               methods=("tpc", "mlp"), epochs=2, verbose=False)
        >>> [(r["method"], r["order"]) for r in res.rows]
        [('tpc', 1), ('tpc', 2), ('mlp', 1), ('mlp', 2)]
    """
    if isinstance(methods, str):
        methods = (methods,)
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise TPCHooksError(f"methods must be a non-empty subset of {list(METHODS)}; got {list(methods)!r}")
    bad = sorted(set(train_kw) - set(_TPC_KW))
    if bad:
        raise TPCHooksError(f"compare() got unknown keyword(s) {bad}; training keywords are {list(_TPC_KW)}")
    train = as_rows(X_train, "X_train")
    with torch.random.fork_rng(devices=[]):  # the untrained shell only supplies each order's cost
        shell = TPC(train.d, degree, rank)
    test = as_rows(X_test, "X_test", train.d)
    y_te = check_labels(y_test, test.n, "y_test", need_both=False)
    dev = default_device(device)
    common = {"seed": seed, "device": dev, "verbose": verbose}
    base_kw = {k: v for k, v in train_kw.items() if k in _BASELINE_KW} | common
    tpc_kw = dict(train_kw) | common
    data = (X_train, y_train, X_val, y_val)
    out = Comparison()
    for method in dict.fromkeys(methods):
        log.info("compare: training %s", method)
        if method in ("tpc", "tpc_paper", "tpc_joint", "linear"):
            kw: dict[str, Any] = {
                "degree": degree,
                "rank": rank,
                "mode": "joint" if method == "tpc_joint" else "progressive",
            }
            if method == "tpc_paper":
                kw["recipe"] = "paper"
            own = {k: v for k, v in tpc_kw.items() if method == "tpc" or k not in _ROBUST_KW}
            out.models[method] = fit_linear(*data, **own) if method == "linear" else fit(*data, **(kw | own))
        elif method == "bilinear":
            out.models[method] = fit_baseline(
                "bilinear", *data, rank=shell.ranks[0] if shell.ranks else rank, **base_kw
            )
        elif method == "mlp":
            out.models[method] = [
                fit_baseline("mlp", *data, hidden=matched_mlp_width(shell, n), **base_kw) for n in range(1, degree + 1)
            ]
        else:
            out.models[method] = fit_baseline("early_exit", *data, widths=matched_early_exit_widths(shell), **base_kw)
        for order, cost, logits in _scored(method, out.models[method], test, dev):
            m = classification_metrics(y_te, logits)
            out.rows.append(
                {
                    "method": method,
                    "order": order,
                    "params": cost.params,
                    "flops": cost.flops,
                    **{k: m[k] for k in _METRICS},
                }
            )
    return out
