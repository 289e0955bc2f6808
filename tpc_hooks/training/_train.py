"""The training recipe: activations in, a calibrated :class:`~tpc_hooks.Monitor` with its report out.

:func:`tpc_hooks.train_monitor` (activations collected from a model) and ``tpc-hooks train``
(activations read from the stores ``tpc-hooks collect`` wrote) both build a :class:`TrainData`
per candidate site and a :class:`TrainPlan`, and call :func:`train`, so the two cannot drift:
the same rows give the same monitor, bit for bit.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._errors import TPCHooksError
from ..data import hosted_rows
from ..head import Cascade, FitConfig
from ..metrics import check_rate
from ..monitoring import Monitor, MonitorConfig, everyday_present
from ._engine import fit, token_rows
from ._evaluate import DECISIONS, EARN_Z, earned_order, per_order, worst_per_order
from ._select import FPR, choose_site

REWRITE_CONSISTENCY = (
    0.03  # fit's consistency weight on the training rewrites (bench_phrasing: the best of 0.03/0.1/0.3)
)
PLAIN = "prompts"  # the validation group of the prompts as given (the others are phrasing families)
INTENT = "intent"  # the validation group of the harmful prompts with their intent flips
CALIBRATION = (
    "calibration"  # the validation group (and source) of train_monitor's calibration prompts: benign, rates only
)


@dataclass(frozen=True)
class Examples:
    """One part of the data: pooled rows ``X [n, d_model]`` (an array or tensor) or, for a
    per-token monitor, a list of ``n`` sequences ``[T_i, d_model]``; labels ``y [n]``; and for
    validation, each example's group (:data:`PLAIN` or a phrasing family) and, when the prompts'
    sources are known, each example's source (the threshold's rate per source is reported)."""

    X: Any
    y: np.ndarray
    groups: np.ndarray | None = None
    sources: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class Chats:
    """Requests hosted in benign conversations (``contexts``): each chat's per-token activations
    ``[T_i, d_model]``, its request's token span, its request's label, and how many tokens after
    a harmful request's turn stay harmful rows (:func:`tpc_hooks.data.token_labels`)."""

    seqs: list[Any]
    spans: list[tuple[int, int]]
    labels: np.ndarray
    tail: int


@dataclass(frozen=True)
class TrainData:
    """What one site offers the recipe.

    Attributes:
        train: the training prompts as given.
        rewrites: their phrasing rewrites (trained on; with the default recipe also the rows
            of the consistency penalty), or None.
        val: the validation prompts as given (group :data:`PLAIN`), then their rewrites (group:
            the family), then the harmful ones again with their intent flips (group
            :data:`INTENT`), or None (no threshold, no report, an uncalibrated cascade).
        flips: benign-labelled intent flips of the harmful training prompts (trained on; not
            rows of the consistency penalty: the higher orders are free to model them), or None.
        flip_of: per flip, the position in ``train`` of the prompt it flips (the pairs of
            ``FitConfig.experimental["contrast"]``), or None.
        homonyms: rows only the degrees above 1 train on (the homonym rows,
            :func:`tpc_hooks.data.homonym_examples`): order 1 is fitted without them, then the
            higher orders are fitted on every row, these too, or None.
        contexts: ``{"train": Chats, "val": Chats}`` for a per-token monitor trained on requests
            inside conversations (either may be missing).
    """

    train: Examples
    rewrites: Examples | None = None
    val: Examples | None = None
    contexts: dict[str, Chats] = field(default_factory=dict)
    flips: Examples | None = None
    flip_of: np.ndarray | None = None
    homonyms: Examples | None = None


@dataclass(frozen=True)
class TrainPlan:
    """How to train: the monitor's settings (its ``site`` is replaced by the chosen one when
    several sites are offered; its threshold is set by calibration), the fit settings, the
    recipe's name, phrasing families and intent-flip kinds (selection over the validation
    groups when there are any: ``FitConfig.group_rule``), the cascade's ``tau`` (None: no cascade)
    and the benign validation share the threshold may flag (None: keep the config's), and whether
    the head keeps only the orders that earn their terms at that operating point on validation and
    hold order 1's recall on every validation group (``prune``). ``shifts``: phrasing families the
    validation prompts are rewritten in but the fit neither trains nor selects on (constructions it
    never saw: the floor's test of the higher orders). ``everyday``: the sources (of the prompts'
    ``sources``) whose benign validation prompts set the threshold (None: every benign validation
    prompt). Validation rows of the group :data:`CALIBRATION` (everyday benign traffic,
    unlabelled) only set rates: the threshold and each order's in the pruning; neither the fit nor
    the site choice reads them. ``refit``: the caller refits the head on every prompt and sets the
    threshold after (``train_monitor`` without ``validation=``), so :func:`train` sets none."""

    monitor: MonitorConfig
    fit: FitConfig
    recipe: str = "default"
    families: tuple[str, ...] = ()
    tau: float | None = None
    intent: tuple[str, ...] = ()
    target_fpr: float | None = 0.01
    context_lengths: tuple[int, ...] = ()
    prune: bool = False
    shifts: tuple[str, ...] = ()
    everyday: tuple[str, ...] | None = None
    refit: bool = False


def val_sources(prompt_sources: Any, groups: np.ndarray) -> np.ndarray | None:
    """Each validation row's source: the prompts' own for the first rows (the prompts as given),
    then each other row's group name (a phrasing family, :data:`INTENT`); None when the prompts'
    sources are unknown.

    Example:
        >>> val_sources(["alpaca", "harmbench"], np.array(["prompts", "prompts", "past", "intent"])).tolist()
        ['alpaca', 'harmbench', 'past', 'intent']
    """
    if prompt_sources is None:
        return None
    given = np.asarray(prompt_sources, dtype=object)
    return np.concatenate([given, np.asarray(groups)[len(given) :].astype(object)])


def check_target_fpr(target_fpr: Any, name: str = "target_fpr") -> None:
    """``target_fpr`` is None or a number in [0, 1) (checked before anything is collected)."""
    if target_fpr is not None:
        check_rate(target_fpr, name)


def fit_config(recipe: str, families: Sequence[str], config: FitConfig | None, options: dict[str, Any]) -> FitConfig:
    """The fit settings of a recipe: ``config`` with ``options``; the paper's recipe; and with the
    training rewrites (any recipe but the paper's), the consistency penalty on them unless one is given."""
    if "recipe" in options:
        raise TPCHooksError("pass recipe= once (train_monitor's recipe covers fit's)")
    extra: dict[str, Any] = {"recipe": "paper"} if recipe == "paper" else {}
    if recipe != "paper" and families and "consistency" not in options and (config is None or not config.consistency):
        extra["consistency"] = REWRITE_CONSISTENCY
    return FitConfig.from_options(config, {**options, **extra})


def objective_for(cfg: FitConfig, settings: MonitorConfig) -> FitConfig:
    """The fit's objective for a monitor: a per-token monitor that aggregates by ``"sctopk"`` trains on
    that aggregate (its ``window`` and ``top_k``) unless ``objective="token"`` is asked for; the
    segment objective is refused anywhere else."""
    sctopk = settings.streaming and settings.aggregate == "sctopk"
    if cfg.objective is None and sctopk:
        return replace(cfg, objective="sctopk", window=settings.window, top_k=settings.top_k)
    if cfg.objective == "sctopk":
        if not sctopk:
            raise TPCHooksError(
                "objective='sctopk' trains the aggregate a per-token monitor decides on: it needs pooling='token' "
                "and aggregate='sctopk'"
            )
        if (cfg.window, cfg.top_k) != (settings.window, settings.top_k):
            raise TPCHooksError(
                f"the fit's segments (window={cfg.window}, top_k={cfg.top_k}) differ from the monitor's "
                f"(window={settings.window}, top_k={settings.top_k}); leave the fit's unset"
            )
    return cfg


def default_aggregate(with_contexts: bool) -> str:
    """A per-token monitor's aggregation when none is asked for: ``"max"`` once the head has seen
    requests inside conversations (the best at long contexts), else ``"rolling"`` (trained on
    short prompts only, a running max flags more long benign chats the longer they are)."""
    return "max" if with_contexts else "rolling"


def train(
    data: Mapping[str, TrainData],
    plan: TrainPlan,
    *,
    sae: Any = None,
    init: Any = None,
    device: Any = None,
    verbose: bool = True,
) -> Monitor:
    """Trains, calibrates and reports a monitor: chooses the site (several offered), fits the
    head (:func:`tpc_hooks.fit`), wraps it in a cascade calibrated on validation, measures every
    order on validation, and sets the threshold on the benign validation prompts as given (group
    :data:`PLAIN`) and the hosted benign chats.

    Args:
        data: site -> its :class:`TrainData` (every site the same prompts in the same order).
        plan: the :class:`TrainPlan`.
        sae: the SAE whose latents the rows are (see :class:`~tpc_hooks.Monitor`).
        init, device, verbose: passed to :func:`tpc_hooks.fit`.

    Returns:
        The :class:`~tpc_hooks.Monitor`; ``report`` holds ``validation`` (metrics per order on the
        validation prompts as given), ``worst_validation_group``, ``n_train``, ``augment``,
        ``recipe``, and where they apply ``site_selection``, ``n_train_tokens``, ``contexts`` and
        ``operating_point``.
    """
    if not data:
        raise TPCHooksError("no site to train on")
    report: dict[str, Any] = {}
    site = next(iter(data))
    if len(data) > 1:
        vals = {s: d.val for s, d in data.items() if d.val is not None}
        if len(vals) < len(data):
            raise TPCHooksError("choosing among several sites needs a validation split")
        pooled = {s: _cat(_cat(d.train, d.rewrites), d.flips) for s, d in data.items()}
        val = vals[site]
        groups = _groups(val)
        # the default recipe chooses as the floor's probe does: on the prompts as given (its shifts judge
        # the orders), without the calibration prompts (with them, SmolLM2's seed 0 took a layer 20 points
        # below the probe on a shift)
        seen = ~np.isin(groups, [*plan.shifts, CALIBRATION])
        site, report["site_selection"] = choose_site(
            {s: (pooled[s].X, pooled[s].y, _take(v.X, seen), v.y[seen]) for s, v in vals.items()},
            groups[seen],
            plan.fit,
            device,
            benign=_calibrated(val, plan)[seen],
        )
    d = data[site]
    if d.val is not None and plan.everyday is not None:
        _calibrated(d.val, plan)  # no everyday benign validation prompt: refused before anything is trained
    settings = replace(plan.monitor, site=site)
    cfg = objective_for(plan.fit, settings)
    tokens = _TokenRows(d, settings.skip) if settings.streaming else None
    if tokens:
        X_tr, y_tr = tokens.train
    else:
        rows = _cat(_cat(d.train, d.rewrites), d.flips)
        X_tr, y_tr = rows.X, rows.y
    X_va = y_va = g_va = None
    if d.val is not None:
        X_va, y_va, g_va = tokens.val if tokens else (d.val.X, d.val.y, _groups(d.val))
    unlabelled = None
    if cfg.consistency and plan.families and d.rewrites is not None:
        unlabelled = token_rows(list(d.rewrites.X), settings.skip)[0] if tokens else d.rewrites.X
    X_fit, y_fit, g_fit = X_va, y_va, g_va
    sequences: dict[str, Any] = tokens.sequences() if tokens and cfg.objective == "sctopk" else {}
    unfit = [*plan.shifts, CALIBRATION]  # the fit neither trains nor selects on the held-out constructions (or traffic)
    if y_va is not None and g_va is not None and np.isin(g_va, unfit).any():
        seen = ~np.isin(g_va, unfit)
        X_fit, y_fit, g_fit = _take(X_va, seen), y_va[seen], g_va[seen]
        if sequences and tokens and tokens.val_lengths is not None:
            sequences["val_sequences"] = tokens.val_lengths[~np.isin(tokens.val_groups, unfit)]
    # selection over groups: the trained families, the intent group, the hosted chats (a group of their own)
    grouped = bool(plan.families or plan.intent or (tokens and "val" in tokens.chats))
    shared = dict(verbose=verbose, val_groups=g_fit if grouped else None, X_unlabelled=unlabelled, device=device)
    pairs = _pairs(d, cfg, tokens, len(y_tr))
    if d.homonyms is not None and len(d.homonyms) and cfg.degree > 1:  # order 1 without them, the higher orders with
        if init is None:  # (rank is the higher degrees' setting: any value does for degree 1)
            once = replace(cfg, degree=1, rank=1)
            init = fit(X_tr, y_tr, X_fit, y_fit, once, pairs=pairs, **sequences, **shared)
        late = Examples(*token_rows(list(d.homonyms.X), settings.skip, d.homonyms.y)) if tokens else d.homonyms
        every = _cat(Examples(X_tr, y_tr), late)
        X_tr, y_tr = every.X, every.y
        if sequences and tokens:
            sequences["sequences"] = np.concatenate([tokens.train_lengths, _lengths(d.homonyms.X, settings.skip)])
    head = fit(X_tr, y_tr, X_fit, y_fit, cfg, pairs=pairs, init=init, **sequences, **shared).cpu()
    if plan.prune and d.val is not None and head.degree > 1:
        head = _earned(head, d, settings, sae, plan, report)
    cascade = None
    if plan.tau is not None:
        cascade = Cascade(head, plan.tau)
        if d.val is not None:
            cascade = cascade.calibrate(X_va, y_va)
    monitor = Monitor(head, config=settings, cascade=cascade, sae=sae, report=report)
    report.update(
        {
            "n_train": len(d.train),
            "augment": {
                "families": list(plan.families),
                "n_train_rewrites": 0 if d.rewrites is None else len(d.rewrites),
                "n_val_rewrites": 0
                if d.val is None
                else int(((_groups(d.val) != PLAIN) & (_groups(d.val) != INTENT)).sum()),
                "intent": list(plan.intent),
                "n_train_flips": 0 if d.flips is None else len(d.flips),
                "n_train_homonyms": 0 if d.homonyms is None else len(d.homonyms),
                # the benign rows of the validation group INTENT: the flips and any validation homonyms
                "n_val_hard_negatives": 0
                if d.val is None
                else int(((_groups(d.val) == INTENT) & (d.val.y == 0)).sum()),
            },
            "recipe": plan.recipe,
        }
    )
    if tokens:
        report["n_train_tokens"] = int(len(y_tr))
    if d.val is None:
        return monitor
    assert y_va is not None and g_va is not None  # set with d.val
    benign, sources = _report(monitor, d, tokens, X_va, y_va, g_va, plan)
    if plan.target_fpr is not None and not plan.refit:
        monitor.calibrate_activations(
            benign, plan.target_fpr, sources=sources, everyday=everyday_present(plan.everyday, sources)
        )
    return monitor


def _pairs(d: TrainData, cfg: FitConfig, tokens: Any, n_rows: int) -> np.ndarray | None:
    """``FitConfig.experimental["contrast"]``'s pairs: each training flip's prompt and the flip, as positions in the
    ``n_rows`` training rows (the prompts first, the flips last), or None."""
    if not cfg.experimental["contrast"]:
        return None
    if tokens or d.flips is None or d.flip_of is None:
        raise TPCHooksError(
            "contrast ranks each harmful training prompt above its intent flip: it needs intent flips "
            "(intent=True) and a per-prompt monitor (no aggregate)"
        )
    return np.stack([np.asarray(d.flip_of), np.arange(n_rows - len(d.flips), n_rows)], 1)


def _earned(head: Any, d: TrainData, settings: MonitorConfig, sae: Any, plan: TrainPlan, report: dict[str, Any]) -> Any:
    """The head truncated to the order the validation operating point earns
    (:func:`~tpc_hooks.training._evaluate.earned_order`): each order at its own threshold flagging
    ``target_fpr`` of the benign validation prompts the monitor is calibrated on (the everyday
    sources' when named); an order is kept when it flags significantly more of the harmful prompts
    (as given, and in the trained phrasing families) than the order kept below it, and on every
    validation group (each held-out family, the intent group) no fewer than order 1, the linear
    probe: the floor. ``report["orders"]`` says what was kept and, in one line, why."""
    fpr = FPR if plan.target_fpr is None else plan.target_fpr
    probe = Monitor(head, config=settings, sae=sae)
    val = d.val
    assert val is not None  # train() prunes only with a validation split
    X = list(val.X) if settings.streaming else val.X
    groups = _groups(val)
    counted = (groups != INTENT) & ~np.isin(groups, list(plan.shifts))
    kept, table = earned_order(probe, X, val.y, fpr, counted=counted, benign=_calibrated(val, plan), groups=groups)
    report["orders"] = {
        "trained": head.degree,
        "kept": kept,
        "fpr": fpr,
        "z": EARN_Z,
        "per_order": table,
        "note": _orders_note(table, kept, fpr),
    }
    return head.truncated(kept) if kept < head.degree else head


def _groups(val: Examples) -> np.ndarray:
    """A validation split's groups (validation examples always carry them)."""
    assert val.groups is not None
    return val.groups


def _calibrated(val: Examples, plan: TrainPlan) -> np.ndarray:
    """The validation rows the threshold is set on: the benign prompts as given, of the everyday
    sources when the plan names them, and the calibration prompts."""
    rows = _benign_given(val)
    if plan.everyday is not None and val.sources is not None:
        rows &= np.isin(val.sources, list(plan.everyday))
        if not rows.any():
            raise TPCHooksError(
                f"no benign validation prompt comes from the everyday sources {list(plan.everyday)}: "
                "the threshold would have nothing to be set on; raise val_fraction or give more "
                "prompts of those sources"
            )
    return rows


def _benign_given(val: Examples) -> np.ndarray:
    """The benign validation prompts as given (not their rewrites or flips) and the calibration prompts."""
    return np.isin(_groups(val), [PLAIN, CALIBRATION]) & (val.y == 0)


def _orders_note(table: list[dict[str, Any]], kept: int, fpr: float) -> str:
    """One line: the orders kept, and why each order above them was dropped."""
    first, best = table[0], table[kept - 1]
    note = (
        f"kept {'order 1' if kept == 1 else f'orders 1-{kept}'}: order {kept} flags {best['flagged_harmful']} of "
        f"{best['n_harmful']} harmful validation prompts at {fpr:g} FPR"
        + (f" (order 1: {first['flagged_harmful']})" if kept > 1 else "")
    )
    why = []
    for row in table[kept:]:
        below = row.get("below_floor") or []
        if below:
            g = below[0]
            why.append(
                f"order {row['order']} is below order 1 on {g!r} ({row['by_group'][g][0]} against "
                f"{first['by_group'][g][0]} of {first['by_group'][g][1]})"
            )
        else:
            why.append(f"order {row['order']} flags {row['flagged_harmful']}, not significantly more")
    return note + ("; dropped: " + "; ".join(why) if why else "")


def _take(X: Any, rows: np.ndarray) -> Any:
    """The ``rows`` (a mask) of pooled rows ``X`` (a tensor or an array)."""
    return X[torch.as_tensor(rows)] if isinstance(X, Tensor) else X[rows]


def _cat(a: Examples, b: Examples | None) -> Examples:
    """Pooled examples ``a`` then ``b``."""
    if b is None or not len(b):
        return a
    X = (
        torch.cat([torch.as_tensor(a.X), torch.as_tensor(b.X)])
        if isinstance(a.X, Tensor)
        else np.concatenate([a.X, b.X])
    )
    return Examples(X, np.concatenate([a.y, b.y]))


class _TokenRows:
    """A per-token monitor's rows: every token after the fixed prefix, labelled with its prompt's
    label (validation: its group too), then the rows of the hosted chats."""

    def __init__(self, d: TrainData, skip: int):
        extra = [e for e in (d.rewrites, d.flips) if e is not None]
        seqs = list(d.train.X) + [z for e in extra for z in e.X]
        labels = np.concatenate([d.train.y] + [e.y for e in extra])
        X, y = token_rows(seqs, skip, labels)
        self.chats: dict[str, tuple[Chats, Any]] = {}
        for split, c in d.contexts.items():
            self.chats[split] = (c, hosted_rows(c.seqs, c.spans, c.labels, skip=skip, tail=c.tail))
        # each sequence's rows (a prompt's tokens after the prefix; a hosted chat's rows), for the segment objective
        self.train_lengths = _lengths(seqs, skip)
        if "train" in self.chats:
            rows = self.chats["train"][1]
            X, y = torch.cat([X, rows[0]]), np.concatenate([y, rows[1]])
            self.train_lengths = np.concatenate([self.train_lengths, _chat_lengths(rows[2], skip)])
        self.train = X, y
        self.val_lengths: np.ndarray | None = None
        if d.val is not None:
            X, y, g = token_rows(list(d.val.X), skip, d.val.y, d.val.groups)
            self.val_lengths = _lengths(d.val.X, skip)
            self.val_groups = np.asarray(d.val.groups)[[len(z) > skip for z in d.val.X]]
            if "val" in self.chats:
                rows = self.chats["val"][1]
                X, y = torch.cat([X, rows[0]]), np.concatenate([y, rows[1]])
                g = np.concatenate([g, np.full(len(rows[1]), "contexts")])
                chat_lengths = _chat_lengths(rows[2], skip)
                self.val_lengths = np.concatenate([self.val_lengths, chat_lengths])
                self.val_groups = np.concatenate([self.val_groups, np.full(len(chat_lengths), "contexts")])
            self.val = X, y, g

    def sequences(self) -> dict[str, np.ndarray | None]:
        """``fit``'s ``sequences`` and ``val_sequences`` (the rows of each training and validation sequence)."""
        return {"sequences": self.train_lengths, "val_sequences": self.val_lengths}


def _lengths(seqs: Any, skip: int) -> np.ndarray:
    """Rows per sequence of :func:`token_rows` (a sequence no longer than the prefix has none)."""
    n = np.asarray([len(z) - skip for z in seqs], dtype=np.int64)
    return n[n > 0]


def _chat_lengths(ends: Sequence[int], skip: int) -> np.ndarray:
    """Rows per hosted chat (its rows run from the prefix's end to ``end``)."""
    n = np.asarray(ends, dtype=np.int64) - skip
    return n[n > 0]


def _report(
    monitor: Monitor,
    d: TrainData,
    tokens: _TokenRows | None,
    X_va: Any,
    y_va: np.ndarray,
    g_va: np.ndarray,
    plan: TrainPlan,
) -> tuple[Any, np.ndarray | None]:
    """Fills ``monitor.report`` with the validation metrics per order (on the prompts as given),
    the worst validation group's, and the hosted chats'; returns the benign validation data the
    threshold is set on: the benign prompts as given (not their rewrites or the intent flips, which
    are many and easy: a threshold set among them flags more than ``target_fpr`` of ordinary
    prompts; ``benchmarks/internals/bench_intent.py``), the calibration prompts and the hosted benign chats,
    with their sources when the prompts' are known (the chats': ``"contexts"``), else None."""
    val = d.val
    assert val is not None  # train() reports only with a validation split
    groups = _groups(val)
    plain = groups == PLAIN
    on = _benign_given(val)
    sources = None if val.sources is None else val.sources[on]
    if tokens is None:
        monitor.report.update(
            {
                "validation": {"n": int(plain.sum()), "per_order": per_order(monitor, X_va[plain], val.y[plain])},
                "worst_validation_group": {
                    "groups": sorted(set(g_va.tolist())),
                    "per_order": worst_per_order(monitor, X_va, y_va, g_va),
                },
            }
        )
        return X_va[on], sources
    seqs = list(val.X)
    monitor.report.update(
        {
            "validation": {
                "n": int(plain.sum()),
                "per_order": per_order(monitor, [z for z, p in zip(seqs, plain, strict=True) if p], val.y[plain]),
                "decision": DECISIONS["max"],
            },
            "worst_validation_group": {
                "groups": sorted(set(groups.tolist())),
                "per_order": worst_per_order(monitor, seqs, val.y, groups),
            },
        }
    )
    benign = [z for z, p in zip(seqs, on, strict=True) if p]
    if "val" in tokens.chats:
        chats, (_, _, ends) = tokens.chats["val"]
        monitor.report["contexts"] = {
            "n_train": len(d.contexts["train"].seqs) if "train" in d.contexts else 0,
            "n_val": len(chats.seqs),
            "lengths": list(plan.context_lengths),
            "n_train_tokens": int(len(tokens.chats["train"][1][1])) if "train" in tokens.chats else 0,
            "per_order": per_order(monitor, [a[:end] for a, end in zip(chats.seqs, ends, strict=True)], chats.labels),
            "decision": "max over the chat of the aggregate (after a harmful request: to its turn's end)",
        }
        benign += [
            a for a, c in zip(chats.seqs, chats.labels, strict=True) if c == 0
        ]  # whole benign chats: the threshold holds on them
        if sources is not None:
            sources = np.concatenate(
                [sources, np.full(int((np.asarray(chats.labels) == 0).sum()), "contexts", dtype=object)]
            )
    return benign, sources
