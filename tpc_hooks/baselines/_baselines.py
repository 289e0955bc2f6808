"""The paper's baselines (App. C) and the one fitter that trains them.

* :class:`BilinearProbe`: ``w0 + <w, z> + ||A z||^2`` (``z^T A^T A z``, symmetric like the TPC);
* :class:`MLPProbe`: one hidden ReLU layer, its width matched to a truncation's parameters;
* :class:`EarlyExitMLP`: an N-exit MLP whose exit n is matched to ``P_{:n}``, trained jointly,
  with its own cascade (:func:`early_exit_cascade`, the TPC cascade's exit loop).

Every baseline standardises inside the module (scaler fitted on the training rows, as
:func:`tpc_hooks.fit` does) and is trained by :func:`fit_baseline` on the shared loop.
"""

import functools
import inspect
import logging
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from .._errors import TPCHooksError
from ..head import (
    TPC,
    CascadeResult,
    Cost,
    History,
    Scaler,
    TrainConfig,
    check_int,
    exit_loop,
    prepare_activations,
    thresholds,
)
from ..training import default_device, f1_at_zero, split_data, train_loop

log = logging.getLogger(__name__)


def _drop(h: Tensor, p: float, gen: torch.Generator | None) -> Tensor:
    """Inverted dropout with an explicit generator (so equal seeds give equal models)."""
    if gen is None or p <= 0:
        return h
    keep = torch.rand(h.shape, generator=gen, device=h.device) >= p
    return h * keep / (1 - p)


class _Baseline(nn.Module):
    """Shared input handling: a ``scaler`` submodule and ``_outputs_std`` on standardised rows."""

    def __init__(self, d_model: int):
        super().__init__()
        check_int(d_model, "d_model", 1)
        self.d_model = d_model
        self.history: Any = None
        self.scaler = Scaler(d_model)

    def _prepare(self, z: Tensor) -> tuple[Tensor, torch.Size]:
        return prepare_activations(z, self.d_model, self.scaler.mean, promote=False)

    def _outputs_std(
        self, zs: Float[Tensor, "n d_model"], dropout: float = 0.0, gen: torch.Generator | None = None
    ) -> Float[Tensor, "n outputs"]:
        raise NotImplementedError

    def standardize(self, z: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        """Returns ``(z - scaler.mean) / scaler.scale`` (the module's own units)."""
        z2, batch = self._prepare(z)
        return self.scaler(z2).reshape(*batch, self.d_model)

    def forward(self, z: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch"]:
        """Logits ``[*batch]`` for activations ``[*batch, d_model]`` (scored in the module's dtype).

        Raises:
            TPCHooksError: not a tensor, wrong ``d_model``, or NaN/inf in ``z``.
        """
        z2, batch = self._prepare(z)
        return self._outputs_std(self.scaler(z2))[:, -1].reshape(batch)

    def probs(self, z: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch"]:
        """``sigmoid(self(z))``: the probability of the harmful class."""
        return torch.sigmoid(self(z))


class BilinearProbe(_Baseline):
    """Low-rank bilinear probe ``s = w0 + <w, z_std> + ||A z_std||^2`` with ``A`` [rank, d_model].

    ``||A z||^2 = z^T (A^T A) z``: the symmetric quadratic form of the paper (Hewitt & Liang,
    2019). Training dropout drops whole rank-one terms ``(<A_r, z>)^2``.

    Args:
        d_model: width of the activations.
        rank: number of rows ``R`` of ``A``.

    Example:
        >>> import torch
        >>> from tpc_hooks.baselines import BilinearProbe
        >>> probe = BilinearProbe(d_model=8, rank=3)
        >>> probe(torch.randn(5, 8)).shape, probe.cost().params
        (torch.Size([5]), 33)
    """

    def __init__(self, d_model: int, rank: int = 64):
        super().__init__(d_model)
        self.rank = check_int(rank, "rank", 1)
        self.bias = nn.Parameter(torch.zeros(1))
        self.linear = nn.Parameter(torch.zeros(d_model))
        # E||A z||^2 = 1 for standardised z at initialisation
        self.A = nn.Parameter(torch.randn(rank, d_model) / (d_model * rank) ** 0.5)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, rank={self.rank}"

    def _outputs_std(
        self, zs: Float[Tensor, "n d_model"], dropout: float = 0.0, gen: torch.Generator | None = None
    ) -> Float[Tensor, "n 1"]:
        zs = zs.to(self.A.dtype)
        squares = _drop((zs @ self.A.T).square(), dropout, gen)
        return (self.bias + zs @ self.linear + squares.sum(-1))[:, None]

    def cost(self) -> Cost:
        """``params = D + 1 + R D``; ``flops = D + R D + R`` (one multiply-add per square).

        ``order`` is 1: the probe has a single output.
        """
        d, r = self.d_model, self.rank
        return Cost(order=1, params=d + 1 + r * d, flops=d + r * d + r)


class MLPProbe(_Baseline):
    """One-hidden-layer MLP probe: ``Linear(D, K) -> ReLU -> dropout -> Linear(K, 1)``.

    ``hidden=0`` is a plain linear layer (the paper's order-1 MLP, matched to the linear probe).

    Args:
        d_model: width of the activations ``D``.
        hidden: hidden width ``K`` (0 for a linear layer).

    Example:
        >>> import torch
        >>> from tpc_hooks.baselines import MLPProbe
        >>> mlp = MLPProbe(d_model=8, hidden=4)
        >>> mlp(torch.randn(5, 8)).shape, mlp.cost().params
        (torch.Size([5]), 41)
    """

    def __init__(self, d_model: int, hidden: int = 64):
        super().__init__(d_model)
        self.hidden = check_int(hidden, "hidden", 0)
        self.inp = nn.Linear(d_model, hidden) if hidden else None
        self.out = nn.Linear(hidden or d_model, 1)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, hidden={self.hidden}"

    def _outputs_std(
        self, zs: Float[Tensor, "n d_model"], dropout: float = 0.0, gen: torch.Generator | None = None
    ) -> Float[Tensor, "n 1"]:
        zs = zs.to(self.out.weight.dtype)
        h = zs if self.inp is None else _drop(torch.relu(self.inp(zs)), dropout, gen)
        return self.out(h)

    def cost(self) -> Cost:
        """``params = K (D + 2) + 1``, ``flops = K D + K`` (``D + 1`` and ``D`` when ``K = 0``).

        ``order`` is 1: the probe has a single output. Biases count as parameters, not FLOPs.
        """
        d, k = self.d_model, self.hidden
        if k == 0:
            return Cost(order=1, params=d + 1, flops=d)
        return Cost(order=1, params=k * (d + 2) + 1, flops=k * d + k)


def _check_widths(widths: Any) -> tuple[int, ...]:
    if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence):
        raise TPCHooksError(f"widths must be a list of hidden widths [K_2, ..., K_N]; got {widths!r}")
    return tuple(check_int(k, "each width", 1) for k in widths)


class EarlyExitMLP(_Baseline):
    """Early-exit MLP (BranchyNet): exit 1 is linear on ``z``; exit n >= 2 reads ``f_n o ... o f_2(z)``.

    ``f_n(x) = ReLU(W_n x + b_n)`` with ``W_n`` [K_n, K_{n-1}] and ``K_1 = D``; exit n is
    ``Linear(K_n, 1)``. All exits are trained jointly (sum of their BCE losses); training
    dropout acts on the hidden units.

    Args:
        d_model: width of the activations ``D``.
        widths: hidden widths ``[K_2, ..., K_N]`` (N - 1 entries; empty for a linear probe).

    Example:
        >>> import torch
        >>> from tpc_hooks.baselines import EarlyExitMLP
        >>> ee = EarlyExitMLP(d_model=8, widths=[4, 3])
        >>> z = torch.randn(5, 8)
        >>> ee.exits(z).shape, ee(z, exit=2).shape, ee.cost(2).params, ee.cascade_flops()
        (torch.Size([5, 3]), torch.Size([5]), 41, [8, 44, 59])
    """

    def __init__(self, d_model: int, widths: Sequence[int]):
        super().__init__(d_model)
        self.widths = _check_widths(widths)
        dims = self._dims
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=False))
        self.heads = nn.ModuleList(nn.Linear(k, 1) for k in dims)

    @property
    def _dims(self) -> list[int]:
        return [self.d_model, *self.widths]

    @property
    def n_exits(self) -> int:
        """Number of exits N."""
        return len(self.widths) + 1

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, widths={list(self.widths)}"

    def _check_exit(self, exit: int | None) -> int:
        if exit is None:
            return self.n_exits
        if isinstance(exit, bool) or not isinstance(exit, int) or not 1 <= exit <= self.n_exits:
            raise TPCHooksError(
                f"exit must be an integer in 1..{self.n_exits} for this {self.n_exits}-exit MLP; got {exit!r}"
            )
        return exit

    def _outputs_std(
        self, zs: Float[Tensor, "n d_model"], dropout: float = 0.0, gen: torch.Generator | None = None
    ) -> Float[Tensor, "n exits"]:
        first = self.heads[0]
        assert isinstance(first, nn.Linear)  # every head is (a ModuleList's item is typed Module)
        zs = zs.to(first.weight.dtype)
        outs, h = [self.heads[0](zs)], zs
        for layer, head in zip(self.layers, self.heads[1:], strict=False):
            h = _drop(torch.relu(layer(h)), dropout, gen)
            outs.append(head(h))
        return torch.cat(outs, dim=-1)

    def _exit_std(self, zs: Tensor, n: int) -> Tensor:
        h = zs
        for layer in self.layers[: n - 1]:
            h = torch.relu(layer(h))
        return self.heads[n - 1](h).squeeze(-1)

    def forward(self, z: Float[Tensor, "*batch d_model"], exit: int | None = None) -> Float[Tensor, "*batch"]:
        """Logits of exit ``exit`` (1..N; the last when None), computing only the layers it needs.

        Raises:
            TPCHooksError: wrong ``d_model``, NaN/inf in ``z``, or ``exit`` out of range.
        """
        n = self._check_exit(exit)
        z2, batch = self._prepare(z)
        return self._exit_std(self.scaler(z2), n).reshape(batch)

    def exits(self, z: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch n_exits"]:
        """Logits of every exit: column ``n - 1`` is exit n."""
        z2, batch = self._prepare(z)
        return self._outputs_std(self.scaler(z2)).reshape(*batch, self.n_exits)

    def _layer_cost(self, n: int) -> tuple[int, int]:
        """(params, flops) of hidden layer ``f_n``, n >= 2."""
        a, b = self._dims[n - 2], self._dims[n - 1]
        return a * b + b, a * b

    def cost(self, exit: int | None = None) -> Cost:
        """Parameters and FLOPs of computing exit n alone: layers ``f_2..f_n`` and head n.

        One multiply-add is one FLOP; biases count as parameters, not FLOPs.
        """
        n = self._check_exit(exit)
        k_n = self._dims[n - 1]
        params, flops = k_n + 1, k_n
        for m in range(2, n + 1):
            p, f = self._layer_cost(m)
            params, flops = params + p, flops + f
        return Cost(order=n, params=params, flops=flops)

    def cascade_flops(self) -> list[int]:
        """Cumulative FLOPs of a cascade that stops at exit n (n = 1..N): every layer and head on the way."""
        out = [self.d_model]
        for n in range(2, self.n_exits + 1):
            out.append(out[-1] + self._layer_cost(n)[1] + self._dims[n - 1])
        return out


BASELINES: dict[str, type[_Baseline]] = {"bilinear": BilinearProbe, "mlp": MLPProbe, "early_exit": EarlyExitMLP}


# ---------------------------------------------------------------------- parameter matching
def _closest_width(fan_in: int, budget: int) -> int:
    """The K >= 1 minimising ``|K (fan_in + 2) + 1 - budget|`` (the smaller K on a tie)."""
    lo = max(1, (budget - 1) // (fan_in + 2))
    return min((lo, lo + 1), key=lambda k: (abs(k * (fan_in + 2) + 1 - budget), k))


def matched_mlp_width(head: TPC, order: int) -> int:
    """Hidden width K whose :class:`MLPProbe` (``K (D + 2) + 1`` parameters) is closest to ``P_{:order}``.

    Order 1 returns 0: the paper matches the linear probe with a plain linear layer.

    Example:
        >>> import tpc_hooks as tpc
        >>> from tpc_hooks.baselines import matched_mlp_width
        >>> head = tpc.TPC(d_model=16, degree=3, rank=4)
        >>> [matched_mlp_width(head, n) for n in (1, 2, 3)]
        [0, 5, 8]
    """
    if not isinstance(head, TPC):
        raise TPCHooksError(f"matched_mlp_width needs a tpc_hooks.TPC; got {type(head).__name__}")
    target = head.cost(order)
    return 0 if target.order == 1 else _closest_width(head.d_model, target.params)


def matched_early_exit_widths(head: TPC) -> list[int]:
    """Widths ``[K_2, ..., K_N]`` chosen greedily so that exit n's own parameters (layers
    ``f_2..f_n`` and head n) are as close as possible to ``head.cost(n).params``.

    Example:
        >>> import tpc_hooks as tpc
        >>> from tpc_hooks.baselines import matched_early_exit_widths
        >>> matched_early_exit_widths(tpc.TPC(d_model=16, degree=3, rank=4))
        [5, 10]
    """
    if not isinstance(head, TPC):
        raise TPCHooksError(f"matched_early_exit_widths needs a tpc_hooks.TPC; got {type(head).__name__}")
    widths, spent, fan_in = [], 0, head.d_model
    for n in head.degrees:
        k = _closest_width(fan_in, head.cost(n).params - spent)
        widths.append(k)
        spent += fan_in * k + k
        fan_in = k
    return widths


# ---------------------------------------------------------------------- cascade
@torch.no_grad()
def early_exit_cascade(
    model: EarlyExitMLP,
    z: Float[Tensor, "*batch d_model"],
    tau: float = 0.1,
    *,
    lower: float | None = None,
    upper: float | None = None,
) -> CascadeResult:
    """Paper Alg. 1 over an :class:`EarlyExitMLP`'s exits: stop at the first exit whose
    probability is outside ``(lower, upper)`` (default ``(tau, 1 - tau)``, decided in logit space).

    Only rows still undecided go through the next layer; ``flops`` is
    ``model.cascade_flops()[exit - 1]`` per row, so the result compares directly with
    :class:`tpc_hooks.Cascade`'s.

    Returns:
        A :class:`~tpc_hooks.CascadeResult` (``probs = sigmoid(logits)``; no calibration).

    Raises:
        TPCHooksError: thresholds out of range, or bad ``z``.

    Example:
        >>> import torch
        >>> from tpc_hooks.baselines import EarlyExitMLP, early_exit_cascade
        >>> ee = EarlyExitMLP(d_model=8, widths=[4, 3])
        >>> early_exit_cascade(ee, torch.randn(6, 8), tau=0.5).exit_histogram()
        [6, 0, 0]
    """
    if not isinstance(model, EarlyExitMLP):
        raise TPCHooksError(f"early_exit_cascade needs an EarlyExitMLP; got {type(model).__name__}")
    lower, upper = thresholds(tau, lower, upper)
    z2, _ = model._prepare(z)
    state = {"h": model.scaler(z2)}

    def advance(n: int, keep: Tensor) -> tuple[Tensor, Tensor, None, None]:
        state["h"] = torch.relu(model.layers[n - 2](state["h"][keep]))
        s_n = model.heads[n - 1](state["h"]).squeeze(-1)
        return s_n, s_n, None, None

    first = model.heads[0](state["h"]).squeeze(-1)
    s, _, exit_order, flops, _ = exit_loop(first, first, advance, model.n_exits, model.cascade_flops(), lower, upper)
    return CascadeResult(
        logits=s, probs=torch.sigmoid(s), exit_order=exit_order, flops=flops, degree=model.n_exits, decision_logits=s
    )


# ---------------------------------------------------------------------- training
_KIND_NAMES: dict[type, str] = {cls: name for name, cls in BASELINES.items()}


def _kind(kind: "str | type[_Baseline]") -> "type[_Baseline]":
    if isinstance(kind, str) and kind in BASELINES:
        return BASELINES[kind]
    if isinstance(kind, type) and kind in _KIND_NAMES:
        return kind
    raise TPCHooksError(f"kind must be one of {sorted(BASELINES)} or their classes; got {kind!r}")


def fit_baseline(
    kind: "str | type[_Baseline]",
    X_train: Any,
    y_train: Any,
    X_val: Any = None,
    y_val: Any = None,
    *,
    config: TrainConfig | None = None,
    sweep: bool | dict[str, Sequence[float]] = False,
    val_fraction: float = 0.2,
    seed: int = 0,
    device: str | torch.device | None = None,
    verbose: bool = True,
    **kwargs: Any,
) -> "_Baseline":
    """Trains one of the paper's baselines on the BCE summed over its outputs.

    Every grid point starts from the same seeded initialisation; the one with the best
    validation F1 (mean over outputs; ties by validation loss) is returned in eval mode with
    ``.history``. The scaler is fitted on the training rows, as :func:`tpc_hooks.fit` does.

    Args:
        kind: ``"bilinear"`` (:class:`BilinearProbe`, all weights jointly), ``"mlp"``
            (:class:`MLPProbe`) or ``"early_exit"`` (:class:`EarlyExitMLP`, all exits jointly:
            epochs kept by the summed validation loss, grid points by the exits' mean F1); or
            the class itself.
        X_train, y_train, X_val, y_val: as in :func:`tpc_hooks.fit`.
        config: a :class:`~tpc_hooks.baselines.TrainConfig` (AdamW, ``ReduceLROnPlateau``, clipping,
            early stopping; ``dropout`` drops the hidden units or rank-one terms).
        sweep, val_fraction, seed, device, verbose: as in :func:`tpc_hooks.fit`.
        **kwargs: the model's own arguments (``rank=`` for the bilinear probe, ``hidden=`` for
            the MLP, ``widths=`` for the early-exit MLP) and any :class:`~tpc_hooks.baselines.TrainConfig`
            field overriding ``config`` (``epochs``, ``lr``, ``weight_decay``, ``patience``, ...).

    Returns:
        The trained model (eval mode) with ``.history``.

    Raises:
        TPCHooksError: bad input (shape, NaN/inf, labels not binary or one class, ...).

    Example:
        >>> from tpc_hooks.baselines import fit_baseline
        >>> from tpc_hooks.synthetic import make_problem
        >>> X, y = make_problem(n=300, d_model=8, seed=0)
        >>> fit_baseline("mlp", X, y, hidden=4, epochs=2, verbose=False).cost().params
        41
        >>> fit_baseline("early_exit", X, y, widths=[4, 3], epochs=2, verbose=False).n_exits
        3
    """
    cls = _kind(kind)
    names = {f.name for f in fields(TrainConfig)}
    train_kw = {k: v for k, v in kwargs.items() if k in names}
    model_kw = {k: v for k, v in kwargs.items() if k not in names}
    configs = replace(config or TrainConfig(), **train_kw).grid(sweep)
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "d_model"}
    if set(model_kw) - accepted:
        raise TPCHooksError(
            f"{_KIND_NAMES[cls]} baseline got unknown argument(s) {sorted(set(model_kw) - accepted)}; it "
            f"takes {sorted(accepted)} and TrainConfig's fields {sorted(names)}"
        )
    kind = _KIND_NAMES[cls]
    dev = default_device(device)
    tr, y_tr, va, y_va = split_data(X_train, y_train, X_val, y_val, val_fraction, seed)
    mean, scale = tr.fit_scaler()
    y_tr_d, y_va_d = y_tr.to(dev), y_va.to(dev)
    history = History(mode=kind)
    best, best_key = None, None
    for trial, cfg in enumerate(configs):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = cls(tr.d, **model_kw)
        with torch.no_grad():
            model.scaler.mean.copy_(mean)
            model.scaler.scale.copy_(scale)
        model.to(dev).train()
        if trial == 0:
            tr.hold_standardized(model.scaler, dev)
            va.hold_standardized(model.scaler, dev)
        gen = torch.Generator().manual_seed(seed * 7919 + trial)
        drop_gen = torch.Generator(device=dev).manual_seed(seed * 7919 + trial)
        p = float(cfg.dropout)

        def batch_loss(
            xb: Tensor, idx: Tensor, model: _Baseline = model, p: float = p, drop_gen: torch.Generator = drop_gen
        ) -> Tensor:
            out = model._outputs_std(xb, p, drop_gen)
            y = y_tr_d[idx.to(dev)][:, None].expand_as(out)
            return F.binary_cross_entropy_with_logits(out, y, reduction="none").mean(0).sum()

        def evaluate(model: _Baseline = model) -> tuple[float, float]:
            out = va.map(model.scaler, dev, model._outputs_std)
            y = y_va_d[:, None].expand_as(out)
            loss = F.binary_cross_entropy_with_logits(out, y, reduction="none").mean(0).sum()
            return float(loss), float(np.mean([f1_at_zero(out[:, j], y_va_d) for j in range(out.shape[1])]))

        tags = {
            "degree": 1,
            "trial": trial,
            "lr_init": cfg.lr,
            "weight_decay": cfg.weight_decay,
            "dropout": cfg.dropout,
        }
        desc = kind + (f" trial {trial + 1}/{len(configs)}" if len(configs) > 1 else "")
        res = train_loop(
            list(model.parameters()),
            batch_loss,
            evaluate,
            tr,
            model.scaler,
            cfg,
            dev,
            gen,
            desc=desc,
            verbose=verbose,
            records=history.records,
            tags=tags,
        )
        key = (-res["val_f1"], res["val_loss"])
        if best_key is None or key < best_key:
            best, best_key = model, key
            history.selected = {
                1: {
                    "val_f1": res["val_f1"],
                    "val_loss": res["val_loss"],
                    "trial": trial,
                    "best_epoch": res["epoch"],
                    "lr": cfg.lr,
                    "weight_decay": cfg.weight_decay,
                    "dropout": cfg.dropout,
                }
            }
    assert best is not None  # the grid has at least one config
    best.history = history
    return best.eval()


fit_bilinear = functools.partial(fit_baseline, "bilinear")
fit_bilinear.__doc__ = (
    '``fit_baseline("bilinear", X_train, y_train, X_val, y_val, rank=..., ...)``: a :class:`BilinearProbe`.'
)
fit_mlp = functools.partial(fit_baseline, "mlp")
fit_mlp.__doc__ = '``fit_baseline("mlp", X_train, y_train, X_val, y_val, hidden=..., ...)``: an :class:`MLPProbe`.'
fit_early_exit = functools.partial(fit_baseline, "early_exit")
fit_early_exit.__doc__ = (
    '``fit_baseline("early_exit", X_train, y_train, X_val, y_val, widths=..., ...)``: an :class:`EarlyExitMLP`.'
)
