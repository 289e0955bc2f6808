"""Training a TPC: the degree-1 probe, then progressive (or joint) training of higher degrees.

Progressive training (paper §3.2.1): degree 1 is scikit-learn's ``LogisticRegression`` on the
standardised features, C chosen by validation F1; then each degree k = 2..N is trained alone
with everything before it frozen, on the BCE of ``sigmoid(P_{:k})``. The frozen prefix's
logits are computed once per degree, not once per batch.
"""

import copy
import itertools
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ._checks import check_features, check_labels
from ._errors import TPCHooksError
from .polynomial import TPC
from .store import ActivationStore

log = logging.getLogger(__name__)

PAPER_CS = (100.0, 10.0, 1.0, 0.1, 0.01, 0.001)
RECIPES = ("default", "paper")
PAPER_GRID = {"lr": (1e-3, 5e-4, 1e-4), "weight_decay": (0.01, 0.1, 1.0), "dropout": (0.0, 0.2, 0.5)}


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser settings for one training run (paper App. C.1 defaults)."""

    epochs: int = 50
    batch_size: int = 1024
    lr: float = 1e-3
    weight_decay: float = 0.01
    dropout: float = 0.0
    grad_clip: float = 1.0
    plateau_factor: float = 0.5
    patience: int | None = 10
    l1: float = 0.0
    keep_best: bool = True

    def __post_init__(self):
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 1:
            raise TPCHooksError(f"epochs must be a positive integer; got {self.epochs!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise TPCHooksError(f"batch_size must be a positive integer; got {self.batch_size!r}")
        if not self.lr > 0:
            raise TPCHooksError(f"lr must be positive; got {self.lr!r}")
        if not self.weight_decay >= 0:
            raise TPCHooksError(f"weight_decay must be >= 0; got {self.weight_decay!r}")
        if not 0 <= self.dropout < 1:
            raise TPCHooksError(f"dropout must be in [0, 1); got {self.dropout!r}")
        if not self.l1 >= 0:
            raise TPCHooksError(f"l1 must be >= 0; got {self.l1!r}")
        if self.patience is not None and (isinstance(self.patience, bool) or not isinstance(self.patience, int)
                                          or self.patience < 0):
            raise TPCHooksError(f"patience must be None or an integer >= 0; got {self.patience!r}")


@dataclass
class History:
    """What training did: one record per (degree, trial, epoch) and the choice made per degree.

    ``records`` rows have ``degree, trial, epoch, train_loss, val_loss, val_f1, lr``.
    ``selected[k]`` holds the chosen hyperparameters, trial and best epoch of degree ``k``
    (for degree 1: the chosen ``C``; with shrinkage, ``scale``: the per-order scale folded into
    ``lambda_k``). ``settings`` records the recipe and robustness options ``fit`` used.
    """

    mode: str
    records: list[dict[str, Any]] = field(default_factory=list)
    selected: dict[int, dict[str, Any]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def for_degree(self, k: int) -> list[dict[str, Any]]:
        """Per-epoch records of the selected trial of degree ``k``."""
        trial = self.selected.get(k, {}).get("trial", 0)
        return [r for r in self.records if r["degree"] == k and r["trial"] == trial]

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "records": self.records, "selected": {str(k): v for k, v in self.selected.items()},
                "settings": self.settings}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "History":
        return cls(mode=d.get("mode", "progressive"), records=list(d.get("records", [])),
                   selected={int(k): v for k, v in d.get("selected", {}).items()}, settings=dict(d.get("settings", {})))

    def to_dataframe(self):
        """The records as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.records)


# ---------------------------------------------------------------------- data
class _Data:
    """Training rows held in memory (one tensor) or on disk (an ActivationStore), optionally a
    subset of rows; yields standardised chunks. Stores are streamed chunk by chunk."""

    def __init__(self, source: Tensor | ActivationStore, rows: np.ndarray | None = None, chunk_rows: int = 65536):
        self.source = source
        self.rows = rows
        self.chunk_rows = chunk_rows
        self.std: Tensor | None = None  # standardised rows, when held in memory

    @property
    def in_memory(self) -> bool:
        return isinstance(self.source, Tensor)

    @property
    def n(self) -> int:
        return len(self.rows) if self.rows is not None else self.source.shape[0]

    @property
    def d(self) -> int:
        return self.source.shape[1]

    def subset(self, rows: np.ndarray) -> "_Data":
        """The rows ``rows`` (sorted positions into this data set) as a new data set."""
        base = rows if self.rows is None else self.rows[rows]
        if self.in_memory:
            return _Data(self.source[torch.as_tensor(base)], None, self.chunk_rows)
        return _Data(self.source, np.asarray(base), self.chunk_rows)

    def _n_chunks(self) -> int:
        total = self.source.shape[0] if self.in_memory else len(self.source)
        return max(1, math.ceil(total / self.chunk_rows))

    def _raw_chunk(self, i: int) -> tuple[np.ndarray, Tensor]:
        """Chunk ``i``: ``(positions, rows)``; positions index into this data set (0..n-1)."""
        a = i * self.chunk_rows
        if self.in_memory:
            b = min(a + self.chunk_rows, self.n)
            return np.arange(a, b), self.source[a:b]
        store: ActivationStore = self.source
        b = min(a + self.chunk_rows, len(store))
        block = store.read(a, b)
        if self.rows is None:
            return np.arange(a, b), torch.from_numpy(block)
        lo, hi = np.searchsorted(self.rows, [a, b])
        return np.arange(lo, hi), torch.from_numpy(block[self.rows[lo:hi] - a])

    def raw_chunks(self) -> Iterator[tuple[np.ndarray, Tensor]]:
        for i in range(self._n_chunks()):
            pos, x = self._raw_chunk(i)
            if len(pos):
                yield pos, x

    def fit_scaler(self) -> tuple[Tensor, Tensor]:
        """Mean and population std per feature (float64, merged chunk by chunk; a zero std
        becomes 1, as in scikit-learn's StandardScaler)."""
        count, mean, m2 = 0, None, None
        for _, x in self.raw_chunks():
            x = x.double()
            n_b = x.shape[0]
            mean_b = x.mean(0)
            m2_b = ((x - mean_b) ** 2).sum(0)
            if mean is None:
                count, mean, m2 = n_b, mean_b, m2_b
            else:
                delta = mean_b - mean
                tot = count + n_b
                mean = mean + delta * (n_b / tot)
                m2 = m2 + m2_b + delta**2 * (count * n_b / tot)
                count = tot
        scale = (m2 / count).sqrt()
        scale = torch.where(scale < 10 * torch.finfo(torch.float64).eps, torch.ones_like(scale), scale)
        return mean.float(), scale.float()

    def hold_standardized(self, scaler: nn.Module, device: torch.device) -> None:
        """Standardises once and keeps the result (in-memory data only)."""
        if self.in_memory:
            self.std = scaler(self.source.to(device))

    def _chunk(self, i: int, scaler: nn.Module, device: torch.device) -> tuple[np.ndarray, Tensor]:
        if self.std is not None:
            a = i * self.chunk_rows
            b = min(a + self.chunk_rows, self.n)
            return np.arange(a, b), self.std[a:b]
        pos, x = self._raw_chunk(i)
        return pos, scaler(x.to(device))

    def chunks(self, scaler: nn.Module, device: torch.device) -> Iterator[tuple[np.ndarray, Tensor]]:
        """Standardised chunks ``(positions, rows)`` in row order."""
        for i in range(self._n_chunks()):
            pos, x = self._chunk(i, scaler, device)
            if len(pos):
                yield pos, x

    def batches(self, scaler: nn.Module, device: torch.device, batch_size: int, gen: torch.Generator) -> Iterator[tuple[Tensor, Tensor]]:
        """Shuffled minibatches ``(standardised rows, positions)``. In memory: one permutation
        of all rows. On disk: chunks in a random order, rows permuted within each chunk."""
        if self.std is not None:
            perm = torch.randperm(self.n, generator=gen)
            for a in range(0, self.n, batch_size):
                idx = perm[a:a + batch_size]
                yield self.std[idx.to(self.std.device)], idx
            return
        for i in torch.randperm(self._n_chunks(), generator=gen).tolist():
            pos, x = self._chunk(i, scaler, device)
            perm = torch.randperm(x.shape[0], generator=gen)
            pos_t = torch.as_tensor(pos)
            for a in range(0, x.shape[0], batch_size):
                idx = perm[a:a + batch_size]
                yield x[idx.to(x.device)], pos_t[idx]

    def map(self, scaler: nn.Module, device: torch.device, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """Applies ``fn`` to standardised chunks and concatenates the results in row order."""
        outs = [fn(x) for _, x in self.chunks(scaler, device)]
        return torch.cat(outs) if outs else torch.zeros(0, device=device)


def _as_data(X: Any, name: str, d_model: int | None = None) -> _Data:
    if isinstance(X, ActivationStore):
        if len(X) == 0:
            raise TPCHooksError(f"{name} is an empty activation store ({X.path})")
        if d_model is not None and X.d_model != d_model:
            raise TPCHooksError(f"{name} has d_model={X.d_model} but the head expects d_model={d_model}")
        return _Data(X)
    return _Data(check_features(X, name, d_model).float())
# ---------------------------------------------------------------------- metrics used in the loop
def f1_at_zero(logits: Tensor, y: Tensor) -> float:
    """F1 of ``logits > 0`` against binary ``y`` (0 when there is no true or predicted positive)."""
    pred = logits > 0
    pos = y > 0.5
    tp = (pred & pos).sum().item()
    fp = (pred & ~pos).sum().item()
    fn = (~pred & pos).sum().item()
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


# ---------------------------------------------------------------------- the generic loop
def train_loop(
    params: Sequence[nn.Parameter],
    batch_loss: Callable[[Tensor, Tensor], Tensor],
    evaluate: Callable[[], tuple[float, float]],
    data: _Data,
    scaler: nn.Module,
    cfg: TrainConfig,
    device: torch.device,
    gen: torch.Generator,
    *,
    desc: str,
    verbose: bool,
    records: list[dict[str, Any]],
    tags: dict[str, Any],
) -> dict[str, Any]:
    """AdamW + ReduceLROnPlateau + gradient clipping; keeps the epoch with the best validation loss.

    ``batch_loss(rows, positions)`` returns the loss of one minibatch of standardised rows;
    ``evaluate()`` returns ``(val_loss, val_f1)``; ``scaler`` standardises raw rows. The state
    before training is a candidate too (epoch -1): for a new TPC degree that is lambda_k = 0,
    i.e. the previous truncation, so training a degree never worsens the validation loss.
    Stops after ``cfg.patience`` epochs without improvement (None: run every epoch). On return
    ``params`` hold the best state. Used for the TPC degrees and the baselines alike.
    """
    params = list(params)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=cfg.plateau_factor)
    with torch.no_grad():
        val_loss0, val_f1_0 = evaluate()
    best = {"val_loss": val_loss0 if cfg.keep_best else math.inf, "val_f1": val_f1_0, "epoch": -1}
    best_state = [p.detach().clone() for p in params]
    bar = tqdm(range(cfg.epochs), desc=desc, disable=not verbose, leave=False, unit="epoch")
    for epoch in bar:
        total = torch.zeros((), device=device)
        count = 0
        for xb, idx in data.batches(scaler, device, cfg.batch_size, gen):
            loss = batch_loss(xb, idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            total += loss.detach() * len(idx)
            count += len(idx)
        with torch.no_grad():
            val_loss, val_f1 = evaluate()
        lr = opt.param_groups[0]["lr"]
        sched.step(val_loss)
        train_loss = float(total) / max(count, 1)
        records.append({**tags, "epoch": epoch, "train_loss": train_loss, "val_loss": val_loss, "val_f1": val_f1, "lr": lr})
        if not math.isfinite(train_loss):
            raise TPCHooksError(
                f"training diverged ({desc}, epoch {epoch}: loss is {train_loss}); lower lr or the rank, or check the features"
            )
        if val_loss < best["val_loss"] or not cfg.keep_best:
            best = {"val_loss": val_loss, "val_f1": val_f1, "epoch": epoch}
            best_state = [p.detach().clone() for p in params]
        bar.set_postfix(val_loss=f"{val_loss:.4f}", val_f1=f"{val_f1:.4f}")
        if cfg.patience is not None and epoch - best["epoch"] > cfg.patience:
            break
    with torch.no_grad():
        for p, s in zip(params, best_state):
            p.copy_(s)
    return best


# ---------------------------------------------------------------------- degree 1
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


def _streamed_logreg(data: _Data, scaler: nn.Module, y: Tensor, C: float, max_iter: int,
                     device: torch.device) -> tuple[np.ndarray, float]:
    """scikit-learn's L2 logistic regression objective, minimised by full-batch L-BFGS with the
    gradient accumulated chunk by chunk (for stores that do not fit in memory)."""
    w = torch.zeros(data.d, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.zeros(1, dtype=torch.float64, device=device, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=max_iter, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-9, tolerance_change=1e-12, history_size=20)
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


def _fit_linear(head: TPC, tr: _Data, y_tr: Tensor, va: _Data, y_va: Tensor, Cs: Sequence[float], max_iter: int,
                solver: str, device: torch.device, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The degree-1 probe: one fit per C, the best validation F1 kept (ties: lower validation loss)."""
    small = tr.in_memory or tr.n * tr.d * 4 <= _SKLEARN_MAX_BYTES
    if solver == "auto":
        solver = "sklearn" if small else "lbfgs"
    if solver == "sklearn":
        Xs, ys = tr.map(head.scaler, device, lambda x: x).cpu().numpy(), y_tr.numpy()
        solve = lambda C: _sklearn_logreg(Xs, ys, C, max_iter)
    elif solver == "lbfgs":
        solve = lambda C: (*_streamed_logreg(tr, head.scaler, y_tr, C, max_iter, device), True)
    else:
        raise TPCHooksError(f"linear_solver must be 'auto', 'sklearn' or 'lbfgs'; got {solver!r}")
    yv = y_va.double()
    best = None
    for C in Cs:
        coef, intercept, converged = solve(C)
        w = torch.as_tensor(coef, dtype=torch.float64, device=device)
        s = va.map(head.scaler, device, lambda x: x.double() @ w + intercept).cpu()
        val_loss, val_f1 = float(F.binary_cross_entropy_with_logits(s, yv)), f1_at_zero(s, yv)
        records.append({"degree": 1, "trial": len(records), "epoch": 0, "C": C, "train_loss": None,
                        "val_loss": val_loss, "val_f1": val_f1, "lr": None, "converged": converged})
        if best is None or (-val_f1, val_loss) < best[0]:
            best = ((-val_f1, val_loss), coef, intercept,
                    {"C": C, "trial": len(records) - 1, "val_f1": val_f1, "val_loss": val_loss, "solver": solver})
    _, coef, intercept, chosen = best
    with torch.no_grad():
        head.linear.copy_(torch.as_tensor(coef, dtype=torch.float32))
        head.bias.fill_(intercept)
    return chosen


# ---------------------------------------------------------------------- degrees >= 2
def _grid(sweep: bool | dict[str, Sequence[float]], cfg: TrainConfig) -> list[TrainConfig]:
    if sweep is False or sweep is None:
        return [cfg]
    grid = dict(PAPER_GRID) if sweep is True else dict(sweep)
    unknown = set(grid) - set(PAPER_GRID)
    if unknown:
        raise TPCHooksError(f"sweep keys must be among {sorted(PAPER_GRID)}; got {sorted(unknown)}")
    keys = sorted(grid)
    return [TrainConfig(**{**asdict(cfg), **dict(zip(keys, vals))}) for vals in itertools.product(*(grid[k] for k in keys))]


def _init_degree(head: TPC, k: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed * 1009 + k)
    with torch.no_grad():
        u = torch.randn(head.d_model, head.rank_of(k), generator=gen) / head.d_model**0.5
        head.factors[str(k)].copy_(u)
        head.lambdas[str(k)].zero_()


def _train_degree(head: TPC, k: int, tr: _Data, y_tr: Tensor, va: _Data, y_va: Tensor, configs: list[TrainConfig],
                  seed: int, device: torch.device, verbose: bool, records: list[dict[str, Any]],
                  shrink: bool = False, bounds_margin: float | None = None) -> dict[str, Any]:
    with torch.no_grad():
        prefix_tr = tr.map(head.scaler, device, lambda x: head._logits_std(x, k - 1))
        prefix_va = va.map(head.scaler, device, lambda x: head._logits_std(x, k - 1))
    y_tr_d, y_va_d = y_tr.to(device), y_va.to(device)
    U, lam = head.factors[str(k)], head.lambdas[str(k)]
    best: dict[str, Any] | None = None
    best_params = None
    for trial, cfg in enumerate(configs):
        _init_degree(head, k, seed)
        gen = torch.Generator().manual_seed(seed * 7919 + k * 31 + trial)

        def batch_loss(xb: Tensor, idx: Tensor, cfg: TrainConfig = cfg, gen: torch.Generator = gen) -> Tensor:
            idx = idx.to(device)
            prefix = prefix_tr[idx]
            if cfg.dropout > 0:
                keep = (torch.rand(idx.shape[0], generator=gen) >= cfg.dropout).to(device, prefix.dtype)
                prefix = prefix * keep / (1 - cfg.dropout)
            logits = prefix + (xb @ U).pow(k) @ lam
            loss = F.binary_cross_entropy_with_logits(logits, y_tr_d[idx])
            return loss + cfg.l1 * U.abs().sum() if cfg.l1 else loss

        def evaluate() -> tuple[float, float]:
            s = prefix_va + va.map(head.scaler, device, lambda x: head._term_std(x, k))
            return float(F.binary_cross_entropy_with_logits(s, y_va_d)), f1_at_zero(s, y_va_d)

        tags = {"degree": k, "trial": trial, "lr_init": cfg.lr, "weight_decay": cfg.weight_decay, "dropout": cfg.dropout}
        desc = f"degree {k}" + (f" trial {trial + 1}/{len(configs)}" if len(configs) > 1 else "")
        res = train_loop([U, lam], batch_loss, evaluate, tr, head.scaler, cfg, device, gen,
                         desc=desc, verbose=verbose, records=records, tags=tags)
        key = (-res["val_f1"], res["val_loss"])
        if best is None or key < (-best["val_f1"], best["val_loss"]):
            best = {**res, "trial": trial, "best_epoch": res["epoch"], "lr": cfg.lr,
                    "weight_decay": cfg.weight_decay, "dropout": cfg.dropout}
            best_params = (U.detach().clone(), lam.detach().clone())
    with torch.no_grad():
        U.copy_(best_params[0])
        lam.copy_(best_params[1])
    if bounds_margin is not None:
        _set_bounds(head, tr, [k], bounds_margin, device)
    with torch.no_grad():
        if shrink:
            term_va = va.map(head.scaler, device, lambda x: head._term_std(x, k))
            scale, loss = _fit_order_scale(prefix_va, term_va, y_va_d)
            lam.mul_(scale)
            best["scale"], best["val_loss_scaled"] = scale, loss
    best.pop("epoch", None)
    return best


SHRINK_GRID = tuple(i / 20 for i in range(21))


def _fit_order_scale(prefix: Tensor, term: Tensor, y: Tensor) -> tuple[float, float]:
    """The per-order scale ``s`` in ``SHRINK_GRID`` (0, 0.05, ..., 1) that minimises the validation
    BCE of ``prefix + s * term`` (ties: the smaller ``s``). ``s = 0`` is the lower truncation."""
    best = (math.inf, 0.0)
    for s in SHRINK_GRID:
        loss = float(F.binary_cross_entropy_with_logits(prefix + s * term, y))
        if loss < best[0] - 1e-12:
            best = (loss, s)
    return best[1], best[0]


def _train_joint(head: TPC, tr: _Data, y_tr: Tensor, va: _Data, y_va: Tensor, configs: list[TrainConfig],
                 seed: int, device: torch.device, verbose: bool, records: list[dict[str, Any]]) -> dict[str, Any]:
    params = [head.bias, head.linear] + [p for k in head.degrees for p in (head.factors[str(k)], head.lambdas[str(k)])]
    y_tr_d, y_va_d = y_tr.to(device), y_va.to(device)
    best, best_params = None, None
    for trial, cfg in enumerate(configs):
        with torch.no_grad():
            head.bias.zero_()
            head.linear.zero_()
        for k in head.degrees:
            _init_degree(head, k, seed)
        gen = torch.Generator().manual_seed(seed * 7919 + trial)

        def batch_loss(xb: Tensor, idx: Tensor) -> Tensor:
            return F.binary_cross_entropy_with_logits(head._logits_std(xb, head.degree), y_tr_d[idx.to(device)])

        def evaluate() -> tuple[float, float]:
            s = va.map(head.scaler, device, lambda x: head._logits_std(x, head.degree))
            return float(F.binary_cross_entropy_with_logits(s, y_va_d)), f1_at_zero(s, y_va_d)

        tags = {"degree": head.degree, "trial": trial, "lr_init": cfg.lr, "weight_decay": cfg.weight_decay, "dropout": 0.0}
        res = train_loop(params, batch_loss, evaluate, tr, head.scaler, cfg, device, gen, desc="joint", verbose=verbose,
                         records=records, tags=tags)
        key = (-res["val_f1"], res["val_loss"])
        if best is None or key < (-best["val_f1"], best["val_loss"]):
            best = {**res, "trial": trial, "best_epoch": res["epoch"], "lr": cfg.lr, "weight_decay": cfg.weight_decay}
            best_params = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, s in zip(params, best_params):
            p.copy_(s)
    best.pop("epoch", None)
    return best


# ---------------------------------------------------------------------- data splitting
def split_data(X: Any, y: Any, X_val: Any, y_val: Any, val_fraction: float, seed: int,
               d_model: int | None = None) -> tuple[_Data, Tensor, _Data, Tensor]:
    """Checks the inputs and returns (train, y_train, val, y_val); without a validation set,
    holds out a stratified ``val_fraction`` of the training rows."""
    data = _as_data(X, "X_train", d_model)
    y_all = check_labels(y, data.n, "y_train")
    if (X_val is None) != (y_val is None):
        raise TPCHooksError("pass both X_val and y_val, or neither (a stratified split of the training data is then used)")
    if X_val is not None:
        va = _as_data(X_val, "X_val", data.d)
        return data, y_all, va, check_labels(y_val, va.n, "y_val")
    if not 0 < val_fraction < 1:
        raise TPCHooksError(f"val_fraction must be in (0, 1); got {val_fraction!r}")
    y_np = y_all.numpy().astype(int)
    counts = np.bincount(y_np, minlength=2)
    if counts.min() < 2:
        raise TPCHooksError(
            f"y_train has only {counts.min()} example(s) of class {int(counts.argmin())}; at least 2 per class are "
            "needed to hold out a validation split (or pass X_val, y_val)"
        )
    from sklearn.model_selection import train_test_split

    n_val = max(2, int(round(val_fraction * data.n)))
    tr_idx, va_idx = train_test_split(np.arange(data.n), test_size=n_val, stratify=y_np, random_state=seed)
    tr_idx, va_idx = np.sort(tr_idx), np.sort(va_idx)
    return data.subset(tr_idx), y_all[tr_idx], data.subset(va_idx), y_all[va_idx]


@torch.no_grad()
def _set_bounds(head: TPC, data: _Data, degrees: Sequence[int], margin: float, device: torch.device) -> None:
    """The trust region of ``degrees`` from the training rows, read chunk by chunk."""
    for k in degrees:
        lo = hi = None
        for _, x in data.chunks(head.scaler, device):
            p = x @ head.factors[str(k)]
            lo = p.min(0).values if lo is None else torch.minimum(lo, p.min(0).values)
            hi = p.max(0).values if hi is None else torch.maximum(hi, p.max(0).values)
        head._put_bounds(k, lo, hi, margin)


def _default_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


# ---------------------------------------------------------------------- public entry point
def fit(
    X_train: Any,
    y_train: Any,
    X_val: Any = None,
    y_val: Any = None,
    *,
    degree: int = 5,
    rank: int | Sequence[int] = 64,
    mode: str = "progressive",
    epochs: int = 50,
    batch_size: int = 1024,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    dropout: float = 0.0,
    patience: int | None | str = "auto",
    l1: float = 0.0,
    recipe: str = "default",
    trust_region: bool | None = None,
    margin: float = 0.0,
    gate: bool | None = None,
    shrink: bool | None = None,
    decay_growth: float = 1.0,
    escalate_only: bool = False,
    sweep: bool | dict[str, Sequence[float]] = False,
    Cs: Sequence[float] = PAPER_CS,
    max_iter: int = 500,
    val_fraction: float = 0.2,
    init: TPC | None = None,
    linear_solver: str = "auto",
    chunk_rows: int = 65536,
    seed: int = 0,
    device: str | torch.device | None = None,
    verbose: bool = True,
) -> TPC:
    """Trains a TPC on activations ``X`` [n, d_model] and binary labels ``y`` (1 = harmful).

    ``mode="progressive"`` (the paper's method): degree 1 is scikit-learn's
    ``LogisticRegression`` (``C`` from ``Cs`` by validation F1, ties by validation loss) on
    the standardised features; then each degree k = 2..N is trained alone with everything
    before it frozen, so every truncation is a classifier and truncations < k never change.
    ``mode="joint"`` trains all terms together on the full polynomial's loss (the paper's
    ablation; its truncations are usually poor classifiers).

    Args:
        X_train, y_train: training activations (array, tensor or
            :class:`~tpc_hooks.store.ActivationStore` for data larger than RAM) and labels.
        X_val, y_val: validation data for model selection; if omitted, a stratified
            ``val_fraction`` of the training rows is held out.
        degree, rank: highest degree N and the CP rank (an int, or ``[R_2, ..., R_N]``).
        epochs, batch_size, lr, weight_decay, dropout: AdamW settings per degree. ``dropout``
            drops the frozen prefix's logit per sample (the paper's TPC dropout).
        patience: stop a degree after this many epochs without a better validation loss
            (the best epoch is kept either way); None runs all ``epochs``. ``"auto"``: 10, or
            None with ``recipe="paper"``. The untrained degree (lambda_k = 0) is a candidate, so
            a degree never makes the validation loss worse than the truncation below it.
        recipe: ``"default"`` (the robust settings below) or ``"paper"``: the paper's exact
            recipe, the plain polynomial trained for all ``epochs`` per degree and kept as it
            ends (no best-epoch or untrained candidate, no trust region, no shrinkage), to
            reproduce its results.
        trust_region: clip each projection ``<U_k[:, r], z_std>`` to its range on the training
            rows (widened by ``margin`` times that range), so no degree-k term can exceed what it
            reached in training on an unfamiliar input (see :meth:`TPC.set_bounds`). Default: on,
            except for ``recipe="paper"`` and ``mode="joint"``.
        gate: score inputs that leave the trust region with the linear probe at every order
            from the degree they leave it at (see :meth:`TPC.set_bounds`; the cascade logs
            them). Default: on whenever the trust region is.
        shrink: after each degree is trained, scale its ``lambda_k`` by ``s`` in {0, 0.05, ..., 1}
            chosen by validation loss (shrinkage toward the lower truncation; ``s = 0`` is the
            lower truncation). Default: on, except for ``recipe="paper"`` and ``mode="joint"``.
            Most useful when the validation set holds a source the training set lacks.
        escalate_only: the higher orders may raise a row's harm logit but never clear a row the
            linear probe flags (``logit_n = max(logit_n, logit_1)`` where ``logit_1 > 0``): every
            order's recall is then at least the linear probe's on any data, at some cost in
            false positives. Off by default.
        decay_growth: degree k's weight decay is ``weight_decay * decay_growth ** (k - 2)``
            (regularisation growing with the order); 1 keeps it constant.
        l1: L1 penalty ``l1 * sum |U_k|`` on each degree's factors (progressive mode), so each
            interaction term leans on few neurons or SAE features; 0 disables it.
        sweep: ``True`` for the paper's grid (lr x weight decay x dropout, chosen per degree
            by validation F1), or a dict with some of those keys.
        Cs, max_iter: the degree-1 probe's C sweep and iteration cap.
        init: a trained head to extend: its degrees (and scaler, trust region, gate and
            ``escalate_only``) are kept bit-identical and only the degrees above ``init.degree``
            are trained; ``rank`` then gives the rank of the added degrees (an int, or one entry
            per added degree).
        linear_solver: ``"auto"`` (scikit-learn in memory, streamed L-BFGS on the same objective
            for stores over 2 GiB), ``"sklearn"`` or ``"lbfgs"``.
        chunk_rows: rows read from a store at a time (peak memory is O(chunk_rows x d_model)).
        seed: seeds the initialisation, shuffling and dropout; equal seeds give equal heads.
        device: where to train (default: CUDA if available). The head is returned there.
        verbose: progress bars.

    Returns:
        The trained :class:`TPC`, with ``head.history`` (a :class:`History`).

    Raises:
        TPCHooksError: on bad input (shape, NaN/inf, labels not binary or one class, ...).

    Example:
        >>> import tpc_hooks as tpc
        >>> from tpc_hooks.synthetic import make_problem
        >>> X, y = make_problem(n=600, d_model=16, seed=0)
        >>> head = tpc.fit(X, y, degree=3, rank=4, epochs=5, verbose=False)
        >>> head.degree, len(head.history.for_degree(2))
        (3, 5)
    """
    if mode not in ("progressive", "joint"):
        raise TPCHooksError(f"mode must be 'progressive' or 'joint'; got {mode!r}")
    if recipe not in RECIPES:
        raise TPCHooksError(f"recipe must be one of {sorted(RECIPES)}; got {recipe!r}")
    paper = recipe == "paper"
    trust_region_arg, gate_arg = trust_region, gate
    if paper and (trust_region or shrink or gate or escalate_only):
        raise TPCHooksError("recipe='paper' is the plain polynomial: it cannot be combined with trust_region, gate, "
                            "shrink or escalate_only")
    trust_region = (not paper and mode == "progressive") if trust_region is None else bool(trust_region)
    if shrink and mode == "joint":
        raise TPCHooksError("shrink scales each degree after it is trained alone; it needs mode='progressive'")
    shrink = (not paper and mode == "progressive") if shrink is None else bool(shrink)
    if gate and not trust_region:
        raise TPCHooksError("gate=True needs the trust region (trust_region=True): the gate fires when an input leaves it")
    gate = trust_region if gate is None else bool(gate)
    if patience == "auto":
        patience = None if paper else 10
    if not (isinstance(decay_growth, (int, float)) and not isinstance(decay_growth, bool) and decay_growth > 0):
        raise TPCHooksError(f"decay_growth must be a positive number; got {decay_growth!r}")
    if not (isinstance(margin, (int, float)) and not isinstance(margin, bool) and 0 <= margin < math.inf):
        raise TPCHooksError(f"margin must be a finite number >= 0; got {margin!r}")
    cfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay, dropout=dropout,
                      patience=patience, l1=l1, keep_best=not paper)
    configs = _grid(sweep, cfg)
    if not Cs:
        raise TPCHooksError("Cs must list at least one inverse regularisation strength")
    dev = _default_device(device)
    d_model = init.d_model if init is not None else None
    tr, y_tr, va, y_va = split_data(X_train, y_train, X_val, y_val, val_fraction, seed, d_model)
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise TPCHooksError(f"chunk_rows must be a positive integer; got {chunk_rows!r}")
    tr.chunk_rows = va.chunk_rows = chunk_rows

    if init is not None:
        if mode != "progressive":
            raise TPCHooksError("init= extends a head progressively; it cannot be combined with mode='joint'")
        if degree < init.degree:
            raise TPCHooksError(f"degree={degree} is below init's degree {init.degree}; truncate with head(z, order=n) instead")
        extra = degree - init.degree
        ranks = list(init.ranks) + ([rank] * extra if isinstance(rank, int) else list(rank))
        with torch.random.fork_rng(devices=[]):
            head = TPC(init.d_model, degree, ranks)
        head.load_state_dict(init.state_dict(), strict=False)
        for k in init.degrees:
            b = init.bounds(k)
            setattr(head, f"bounds_{k}", None if b is None else b.detach().clone())
        # init's truncations must not change: its trust region, gate and escalate_only carry over as they are
        if init.degree > 1:
            if (trust_region_arg is not None and bool(trust_region_arg) != init.has_bounds) or \
                    (gate_arg is not None and bool(gate_arg) != init.gate):
                raise TPCHooksError(f"init= keeps init's trust_region={init.has_bounds} and gate={init.gate} (changing them "
                                    "would change its truncations); leave trust_region and gate unset")
            trust_region = init.has_bounds
        if escalate_only and not init.escalate_only:
            raise TPCHooksError("init= keeps init's escalate_only=False (changing it would change its truncations)")
        gate, escalate_only = init.gate, init.escalate_only
        history = copy.deepcopy(init.history) if isinstance(init.history, History) else History(mode="progressive")
        start = init.degree + 1
    else:
        with torch.random.fork_rng(devices=[]):  # the initial factors are redrawn per degree from `seed`
            head = TPC(tr.d, degree, rank)
        mean, scale = tr.fit_scaler()
        with torch.no_grad():
            head.scaler.mean.copy_(mean)
            head.scaler.scale.copy_(scale)
        history = History(mode=mode)
        start = 1
    head.to(dev)
    for p in head.parameters():
        p.requires_grad_(False)
    tr.hold_standardized(head.scaler, dev)
    va.hold_standardized(head.scaler, dev)

    if mode == "joint":
        for p in head.parameters():
            p.requires_grad_(True)
        history.selected[head.degree] = _train_joint(head, tr, y_tr, va, y_va, configs, seed, dev, verbose, history.records)
    else:
        if start == 1:
            recs: list[dict[str, Any]] = []
            history.selected[1] = _fit_linear(head, tr, y_tr, va, y_va, Cs, max_iter, linear_solver, dev, recs)
            history.records.extend(recs)
            log.info("degree 1: C=%s, val F1 %.4f", history.selected[1]["C"], history.selected[1]["val_f1"])
        for k in range(max(start, 2), degree + 1):
            U, lam = head.factors[str(k)], head.lambdas[str(k)]
            U.requires_grad_(True)
            lam.requires_grad_(True)
            wd = [TrainConfig(**{**asdict(c), "weight_decay": c.weight_decay * decay_growth ** (k - 2)}) for c in configs]
            history.selected[k] = _train_degree(head, k, tr, y_tr, va, y_va, wd, seed, dev, verbose, history.records,
                                                shrink=shrink, bounds_margin=margin if trust_region else None)
            U.requires_grad_(False)
            lam.requires_grad_(False)
            log.info("degree %d: val F1 %.4f (epoch %d)", k, history.selected[k]["val_f1"], history.selected[k]["best_epoch"])
    if trust_region and head.degree > 1:
        _set_bounds(head, tr, [k for k in head.degrees if head.bounds(k) is None], margin, dev)  # joint mode
        head.gate = bool(gate)
    head.escalate_only = bool(escalate_only)
    history.settings = {"recipe": recipe, "trust_region": trust_region, "margin": margin, "gate": head.gate,
                        "shrink": shrink, "escalate_only": head.escalate_only, "decay_growth": decay_growth,
                        "patience": patience}
    for p in head.parameters():
        p.requires_grad_(True)
    head.history = history
    return head.eval()
