"""Training settings (frozen, validated on construction) and the record of what training did."""

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .._errors import TPCHooksError, deprecated

PAPER_CS = (100.0, 10.0, 1.0, 0.1, 0.01, 0.001)
PROBE_CS = (1.0, 0.1, 0.01, 0.001)  # a probe's usual sweep: C >= 10 on a few thousand rows fits in-distribution detail
PAPER_GRID = {"lr": (1e-3, 5e-4, 1e-4), "weight_decay": (0.01, 0.1, 1.0), "dropout": (0.0, 0.2, 0.5)}
MODES = ("progressive", "joint")
RECIPES = ("default", "paper")
LINEAR_SOLVERS = ("auto", "sklearn", "lbfgs")
PROBE_METRICS = ("auto", "auroc", "f1")
GROUP_RULES = ("balanced", "worst")
OBJECTIVES = ("token", "sctopk")
SEQUENCE_FIELDS = ("objective", "window", "top_k", "segvar", "streamed")  # saved only by a head trained on sequences


def _positive_int(value: Any, name: str, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TPCHooksError(f"{name} must be a positive integer; got {value!r}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
        _positive_int(self.epochs, "epochs")
        _positive_int(self.batch_size, "batch_size")
        if not self.lr > 0:
            raise TPCHooksError(f"lr must be positive; got {self.lr!r}")
        if not self.weight_decay >= 0:
            raise TPCHooksError(f"weight_decay must be >= 0; got {self.weight_decay!r}")
        if not 0 <= self.dropout < 1:
            raise TPCHooksError(f"dropout must be in [0, 1); got {self.dropout!r}")
        if not self.l1 >= 0:
            raise TPCHooksError(f"l1 must be >= 0; got {self.l1!r}")
        if self.patience is not None and (
            isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 0
        ):
            raise TPCHooksError(f"patience must be None or an integer >= 0; got {self.patience!r}")

    def grid(self, sweep: bool | dict[str, Sequence[float]] | None) -> list["TrainConfig"]:
        """This config, or one per point of the ``sweep`` grid (``True``: the paper's)."""
        if sweep is False or sweep is None:
            return [self]
        grid = dict(PAPER_GRID) if sweep is True else dict(sweep)
        unknown = set(grid) - set(PAPER_GRID)
        if unknown:
            raise TPCHooksError(f"sweep keys must be among {sorted(PAPER_GRID)}; got {sorted(unknown)}")
        keys = sorted(grid)
        return [
            replace(self, **dict(zip(keys, vals, strict=True)))  # type: ignore[arg-type]  # float fields only
            for vals in itertools.product(*(grid[k] for k in keys))
        ]


def _experimental(value: Any) -> dict[str, float]:
    """``FitConfig.experimental``: every option, the given ones checked (None: all off)."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise TPCHooksError(
            f"experimental must be a dict with some of {list(EXPERIMENTAL)}; got {type(value).__name__}"
        )
    unknown = sorted(set(value) - set(EXPERIMENTAL))
    if unknown:
        raise TPCHooksError(f"experimental takes {list(EXPERIMENTAL)}; got {unknown}")
    out = {**EXPERIMENTAL, **value}
    for name in ("l1", "contrast", "margin"):
        if not (_number(out[name]) and 0 <= out[name] < math.inf):
            raise TPCHooksError(f"{name} must be a finite number >= 0; got {out[name]!r}")
    if not (_number(out["decay_growth"]) and 0 < out["decay_growth"] < math.inf):
        raise TPCHooksError(f"decay_growth must be a positive number; got {out['decay_growth']!r}")
    return out


# FitConfig.experimental's options and their defaults (off): once FitConfig's own fields
EXPERIMENTAL = {"l1": 0.0, "contrast": 0.0, "margin": 0.0, "decay_growth": 1.0}
# a saved head's history.config: FitConfig's fields in the order they are written, the experimental ones flat
SAVED_ORDER = (
    "degree", "rank", "mode", "recipe", "epochs", "batch_size", "lr", "weight_decay", "dropout", "patience", "l1",
    "consistency", "contrast", "trust_region", "margin", "gate", "shrink", "decay_growth", "group_rule",
    "escalate_only", "sweep", "Cs", "max_iter", "probe_metric", "val_fraction", "linear_solver", "chunk_rows", "seed",
)  # fmt: skip


@dataclass(frozen=True)
class FitConfig:
    """Every setting of :func:`tpc_hooks.fit`, checked when it is built, recorded in
    ``head.history.config``. Pass one to ``fit(..., config=cfg)`` or the same names as keywords.

    Attributes:
        degree, rank: highest degree N and the CP rank (an int, or ``[R_2, ..., R_N]``).
        mode: ``"progressive"`` (the paper's method: degree 1 is scikit-learn's
            ``LogisticRegression``, then each degree trained alone with everything below frozen)
            or ``"joint"`` (all terms together: the paper's ablation).
        recipe: the fit's half of a :mod:`tpc_hooks.recipes` preset, stored as its name:
            ``tpc.recipes.paper()`` (``"paper"``) is the paper's exact recipe, the plain polynomial
            trained for all ``epochs`` per degree and kept as it ends; any other preset
            (``"default"``) the robust settings below.
        epochs, batch_size, lr, weight_decay, dropout: AdamW settings per degree. ``dropout``
            drops the frozen prefix's logit per sample (the paper's TPC dropout).
        patience: stop a degree after this many epochs without a better validation loss (the
            best epoch is kept either way); None runs all ``epochs``. ``"auto"``: 10, or None
            with ``recipe="paper"``. The untrained degree (lambda_k = 0) is a candidate, so a
            degree never makes the validation loss worse than the truncation below it.
        trust_region: clip each projection ``<U_k[:, r], z_std>`` to its range on the training
            rows (see :meth:`TPC.set_bounds`). None: on,
            except for ``recipe="paper"`` and ``mode="joint"``.
        gate: score inputs that leave the trust region with the linear probe from the degree
            they leave it at. None: on whenever the trust region is.
        shrink: after each degree is trained, scale its ``lambda_k`` by ``s`` in {0, 0.05, ..., 1}
            chosen by validation loss (``s = 0`` is the lower truncation). None: on, except for
            ``recipe="paper"`` and ``mode="joint"``.
        group_rule: how ``fit(..., val_groups=...)`` selects degrees k >= 2 over the validation
            groups: ``"balanced"`` (early stopping and the grid point by the mean of the groups'
            loss and F1, each group weighing the same whatever its size; the shrinkage scale by
            that mean among the scales that hurt no group significantly) or ``"worst"`` (by the
            worst group's; the scale only where it lowers every group's loss: one group the
            higher orders cannot help, e.g. typo-noised prompts, then zeroes them).
        escalate_only: higher orders may raise a row's harm logit but never clear a row the
            linear probe flags, so every order's recall is at least the linear probe's.
        consistency: with ``fit(..., X_unlabelled=...)``, degree k's loss adds
            ``consistency * mean(term_k(x_u) ** 2)`` over a minibatch of those rows: the degree is
            pulled to add nothing there, so its truncation agrees with the one below (progressive mode).
        sweep: ``True`` for the paper's grid (lr x weight decay x dropout, chosen per degree by
            validation F1), or a dict with some of those keys.
        Cs, max_iter: the degree-1 probe's C sweep and iteration cap. ``Cs=None``: the paper's
            (100 ... 0.001) with ``recipe="paper"``, else 1 ... 0.001 (a weaker regularisation
            won validation AUROC by a hair and lost recall on rephrased requests:
            docs/benchmarks/constructions.md, "Order 1's C grid").
        probe_metric: how the degree-1 probe's C is chosen on validation: ``"auroc"`` (ranking:
            what a threshold set at a fixed false-positive rate reads), ``"f1"`` (at logit 0: the
            paper's), or ``"auto"``: F1 with ``recipe="paper"``, else AUROC. Ties: lower loss.
        val_fraction: the stratified share of training rows held out when no validation set
            is given.
        objective: what each row's logit is trained against. ``"token"`` (None means it): its own
            label, row by row. ``"sctopk"`` (segment top-k, He et al., arXiv 2604.14865): rows are
            the tokens of sequences (``fit(..., sequences=, val_sequences=)``) and each sequence's
            logit is the mean of its ``top_k`` best segment means of ``window`` consecutive token
            logits (what a per-token monitor with ``aggregate="sctopk"`` decides on), trained by its
            BCE plus ``segvar`` times the sigmoid-weighted variance of a benign sequence's segment
            scores; degree 1 starts from the per-token probe and is trained on that loss (the probe
            kept when the validation sequences' loss prefers it), every higher degree on the loss of
            its truncation, the validation sequences selecting.
        window, top_k, segvar: the segment top-k objective's settings (16, 8, 0.01: the published ones).
        streamed: the segment objective's sequence logit is the highest aggregate over every prefix of
            the sequence (True: what a streaming monitor flags on, early prefixes included, where the
            aggregate is still the mean of a few tokens) or the aggregate after its last token
            (False: the published objective; it leaves those prefixes untrained:
            docs/benchmarks/segments.md).
        linear_solver: ``"auto"`` (scikit-learn in memory, streamed L-BFGS on the same objective
            for stores over 2 GiB), ``"sklearn"`` or ``"lbfgs"``.
        chunk_rows: rows read from a store at a time (peak memory O(chunk_rows x d_model)).
        seed: seeds the initialisation, shuffling and dropout; equal seeds give equal heads.
        experimental: the options no benchmark shows a win for, in one dict, each off by default
            and kept for experiments (``FitConfig(experimental={"l1": 1e-4})``; given flat, as
            ``l1=``, they still work and warn):

            * ``l1``: L1 penalty ``l1 * sum |U_k|`` on each degree's factors (progressive mode).
              A loss: held-out F1 at order 5 0.627-0.633 against 0.648 without
              (docs/benchmarks/l1.md).
            * ``contrast``: with ``fit(..., pairs=...)`` (harmful training rows, each with a benign
              counterpart on its topic: its intent flip), degree k's loss adds
              ``contrast * mean(softplus(s(benign) - s(harmful)))`` over a minibatch of the pairs,
              ``s`` the truncation's logit (progressive mode). No win: recall at order 5, layer
              15, 73.6 (1) and 74.1 (10) against 74.5 without (docs/benchmarks/intent.md).
            * ``margin``: widen each trust-region bound by this fraction of its range. No win:
              held-out F1 64.5 against 64.6, and less protection on the synthetic shift
              (benchmarks/results/bench_robustness.md).
            * ``decay_growth``: degree k's weight decay is ``weight_decay * decay_growth ** (k -
              2)``. No win: x3 per degree, held-out F1 64.6 = 64.6 (same page).

    Example:
        >>> import tpc_hooks as tpc
        >>> cfg = tpc.FitConfig(degree=3, rank=8, recipe=tpc.recipes.paper())
        >>> cfg.recipe
        'paper'
        >>> cfg.resolved().trust_region, cfg.resolved().patience
        (False, None)
        >>> tpc.FitConfig(lr=-1.0)
        Traceback (most recent call last):
        ...
        tpc_hooks.TPCHooksError: lr must be positive; got -1.0
    """

    degree: int = 5
    rank: int | Sequence[int] = 64
    mode: str = "progressive"
    recipe: Any = "default"  # "default" | "paper", or a tpc.recipes preset (stored as its fit's name)
    epochs: int = 50
    batch_size: int = 1024
    lr: float = 1e-3
    weight_decay: float = 0.01
    dropout: float = 0.0
    patience: int | None | str = "auto"
    consistency: float = 0.0
    trust_region: bool | None = None
    gate: bool | None = None
    shrink: bool | None = None
    group_rule: str = "balanced"
    escalate_only: bool = False
    sweep: bool | dict[str, Sequence[float]] = False
    Cs: Sequence[float] | None = None
    max_iter: int = 500
    probe_metric: str = "auto"
    val_fraction: float = 0.2
    linear_solver: str = "auto"
    chunk_rows: int = 65536
    seed: int = 0
    objective: str | None = None
    window: int = 16
    top_k: int = 8
    segvar: float = 0.01
    streamed: bool = True
    experimental: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "experimental", _experimental(self.experimental))
        if isinstance(self.rank, list):
            object.__setattr__(self, "rank", tuple(self.rank))
        if self.Cs is not None:
            object.__setattr__(self, "Cs", tuple(self.Cs))
        if self.mode not in MODES:
            raise TPCHooksError(f"mode must be 'progressive' or 'joint'; got {self.mode!r}")
        if not isinstance(self.recipe, str) and isinstance(getattr(self.recipe, "fit", None), str):
            object.__setattr__(self, "recipe", self.recipe.fit)  # a tpc.recipes preset: the fit's half of it
        if self.recipe not in RECIPES:
            raise TPCHooksError(
                f"recipe must be a tpc.recipes preset (its fit: {sorted(RECIPES)}); got {self.recipe!r}"
            )
        paper = self.recipe == "paper"
        if paper and (self.trust_region or self.shrink or self.gate or self.escalate_only):
            raise TPCHooksError(
                "recipe='paper' is the plain polynomial: it cannot be combined with trust_region, gate, "
                "shrink or escalate_only"
            )
        if self.shrink and self.mode == "joint":
            raise TPCHooksError("shrink scales each degree after it is trained alone; it needs mode='progressive'")
        if self.gate and not self.resolved_trust_region:
            raise TPCHooksError(
                "gate=True needs the trust region (trust_region=True): the gate fires when an input leaves it"
            )
        if self.group_rule not in GROUP_RULES:
            raise TPCHooksError(f"group_rule must be 'balanced' or 'worst'; got {self.group_rule!r}")
        if not (_number(self.consistency) and 0 <= self.consistency < math.inf):
            raise TPCHooksError(f"consistency must be a finite number >= 0; got {self.consistency!r}")
        self.train_config().grid(self.sweep)  # checks the optimiser settings and the grid
        if self.Cs is not None and not self.Cs:
            raise TPCHooksError("Cs must list at least one inverse regularisation strength")
        if self.probe_metric not in PROBE_METRICS:
            raise TPCHooksError(f"probe_metric must be one of {list(PROBE_METRICS)}; got {self.probe_metric!r}")
        if self.linear_solver not in LINEAR_SOLVERS:
            raise TPCHooksError(f"linear_solver must be 'auto', 'sklearn' or 'lbfgs'; got {self.linear_solver!r}")
        if isinstance(self.chunk_rows, bool) or not isinstance(self.chunk_rows, int) or self.chunk_rows < 1:
            raise TPCHooksError(f"chunk_rows must be a positive integer; got {self.chunk_rows!r}")
        if self.objective is not None and self.objective not in OBJECTIVES:
            raise TPCHooksError(f"objective must be one of {list(OBJECTIVES)}; got {self.objective!r}")
        if self.objective == "sctopk" and self.mode != "progressive":
            raise TPCHooksError("objective='sctopk' trains degree by degree; it needs mode='progressive'")
        _positive_int(self.window, "window")
        _positive_int(self.top_k, "top_k")
        if not (_number(self.segvar) and 0 <= self.segvar < math.inf):
            raise TPCHooksError(f"segvar must be a finite number >= 0; got {self.segvar!r}")
        if not isinstance(self.streamed, bool):
            raise TPCHooksError(f"streamed must be True or False; got {self.streamed!r}")

    @classmethod
    def from_options(cls, config: "FitConfig | None", options: dict[str, Any]) -> "FitConfig":
        """``config`` (default: all defaults) with ``options`` (field names) replaced."""
        if config is not None and not isinstance(config, FitConfig):
            raise TPCHooksError(f"config must be a tpc_hooks.FitConfig; got {type(config).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names - set(EXPERIMENTAL))
        if unknown:
            raise TPCHooksError(
                f"fit() got unknown setting(s) {unknown}; the settings are FitConfig's fields: {sorted(names)}"
            )
        options = dict(options)
        flat = {k: options.pop(k) for k in EXPERIMENTAL if k in options}
        for k in flat:
            deprecated(
                f"{k}=", f"experimental={{{k!r}: ...}} (FitConfig.experimental: no benchmark shows a win for {k})"
            )
        config = replace(config or cls(), **options)
        if flat:
            config = replace(config, experimental={**config.experimental, **flat})
        return config

    @property
    def _patience(self) -> int | None:
        if self.patience == "auto":
            return None if self.recipe == "paper" else 10
        return self.patience  # type: ignore[return-value]  # any other string: TrainConfig rejects it

    @property
    def resolved_trust_region(self) -> bool:
        if self.trust_region is None:
            return self.recipe != "paper" and self.mode == "progressive"
        return bool(self.trust_region)

    def resolved(self) -> "FitConfig":
        """The same settings with every ``None``/``"auto"`` replaced by what it means here."""
        paper = self.recipe == "paper"
        trust = self.resolved_trust_region
        return replace(
            self,
            trust_region=trust,
            gate=trust if self.gate is None else bool(self.gate),
            shrink=(not paper and self.mode == "progressive") if self.shrink is None else bool(self.shrink),
            patience=self._patience,
            probe_metric=("f1" if paper else "auroc") if self.probe_metric == "auto" else self.probe_metric,
            Cs=(PAPER_CS if paper else PROBE_CS) if self.Cs is None else self.Cs,
        )

    def train_config(self) -> TrainConfig:
        """The optimiser settings of one degree (before any ``decay_growth``)."""
        return TrainConfig(
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            weight_decay=self.weight_decay,
            dropout=self.dropout,
            patience=self._patience,
            l1=self.experimental["l1"],
            keep_best=self.recipe != "paper",
        )

    def settings(self) -> dict[str, Any]:
        """The recipe and robustness options, resolved, as ``History.settings`` reports them."""
        r = self.resolved()
        return {
            "recipe": r.recipe,
            "trust_region": r.trust_region,
            "margin": r.experimental["margin"],
            "gate": r.gate,
            "shrink": r.shrink,
            "escalate_only": r.escalate_only,
            "decay_growth": r.experimental["decay_growth"],
            "patience": r.patience,
            "group_rule": r.group_rule,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable fields (saved in ``config.json`` with the head's history)."""
        d = asdict(self)
        d.update(d.pop("experimental"))  # saved flat, where they were fields of their own
        d["rank"] = list(self.rank) if isinstance(self.rank, tuple) else self.rank
        d["Cs"] = None if self.Cs is None else list(self.Cs)
        if isinstance(self.sweep, dict):
            d["sweep"] = {k: list(v) for k, v in self.sweep.items()}
        sequence = SEQUENCE_FIELDS if self.objective == "sctopk" else ()  # other heads' files unchanged
        return {k: d[k] for k in SAVED_ORDER + sequence}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FitConfig":
        names = {f.name for f in fields(cls)} - {"experimental"}
        experimental = {k: d[k] for k in EXPERIMENTAL if k in d}
        # a record that lacks group_rule: its head was selected by the worst group; probe_metric: its C by F1
        kept = {k: v for k, v in d.items() if k in names}
        # a segment-objective record without streamed: trained on each sequence's final aggregate
        legacy = {"streamed": False} if d.get("objective") == "sctopk" else {}
        return cls(**{"group_rule": "worst", "probe_metric": "f1", **legacy, **kept}, experimental=experimental)


@dataclass
class History:
    """What training did: one record per (degree, trial, epoch) and the choice made per degree.

    ``records`` rows have ``degree, trial, epoch, train_loss, val_loss, val_f1, lr``.
    ``selected[k]`` holds the chosen hyperparameters, trial and best epoch of degree ``k``
    (for degree 1: the chosen ``C``; with shrinkage, ``scale``: the per-order scale folded into
    ``lambda_k``). ``config`` is the :class:`FitConfig` ``fit`` used, resolved (None for
    baselines); :attr:`settings` its recipe and robustness options as a dict.
    """

    mode: str
    records: list[dict[str, Any]] = field(default_factory=list)
    selected: dict[int, dict[str, Any]] = field(default_factory=dict)
    config: FitConfig | None = None
    # settings read from a file written before the FitConfig was recorded
    recorded_settings: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def settings(self) -> dict[str, Any]:
        """Recipe and robustness options (``recipe``, ``trust_region``, ``gate``, ``shrink``, ...)."""
        return self.config.settings() if self.config is not None else self.recorded_settings

    def for_degree(self, k: int) -> list[dict[str, Any]]:
        """Per-epoch records of the selected trial of degree ``k``."""
        trial = self.selected.get(k, {}).get("trial", 0)
        return [r for r in self.records if r["degree"] == k and r["trial"] == trial]

    def to_dict(self) -> dict[str, Any]:
        d = {
            "mode": self.mode,
            "records": self.records,
            "selected": {str(k): v for k, v in self.selected.items()},
            "settings": self.settings,
        }
        if self.config is not None:
            d["config"] = self.config.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "History":
        """The record of :meth:`to_dict`, checked (a wrong type is a :class:`TPCHooksError`)."""
        for key, kind in (("records", list), ("selected", dict), ("settings", dict)):
            if key in d and not isinstance(d[key], kind):
                raise TPCHooksError(
                    f"history.{key} must be a JSON {'array' if kind is list else 'object'}; got {type(d[key]).__name__}"
                )
        if not all(isinstance(k, str) and k.isdigit() for k in d.get("selected", {})):
            raise TPCHooksError(
                f'history.selected must be keyed by degree ("1", "2", ...); got {list(d.get("selected", {}))[:5]}'
            )
        config = None
        if isinstance(d.get("config"), dict):
            try:
                config = FitConfig.from_dict(d["config"])
            except (TPCHooksError, TypeError):
                config = None  # a record written by another version: the records still load
        return cls(
            mode=d.get("mode", "progressive"),
            records=list(d.get("records", [])),
            selected={int(k): v for k, v in d.get("selected", {}).items()},
            config=config,
            recorded_settings=dict(d.get("settings", {})),
        )

    def to_dataframe(self):
        """The records as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.records)
