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
from sklearn.model_selection import train_test_split
from torch import Tensor
from tqdm.auto import tqdm

from . import _intent, _phrasing
from ._cascade import Cascade
from ._checks import check_labels, check_rate
from ._collect import check_prompts, collect, token_batches
from ._context import check_conversation, context_budget, host_splits, hosted_rows, sharegpt_contexts
from ._errors import TPCHooksError
from ._evaluate import DECISIONS, EARN_Z, earned_order, per_order, worst_per_order
from ._fit import fit
from ._history import FitConfig
from ._monitor import Monitor
from ._monitor_config import MonitorConfig
from ._rows import token_rows
from ._select import FPR, choose_site
from .adapters import get_adapter, resolve_bos
from .data import PromptSet, homonym_examples, intent_flips, rewrites, stated_flips
from .pooling import check_aggregate, check_pooling

TRAIN_RECIPES = ("default", "in_distribution", "paper")
REWRITE_CONSISTENCY = 0.03  # fit's consistency weight on the training rewrites (bench_phrasing: the best of 0.03/0.1/0.3)
PLAIN = "prompts"  # the validation group of the prompts as given (the others are phrasing families)
INTENT = "intent"  # the validation group of the harmful prompts with their intent flips


@dataclass(frozen=True)
class Examples:
    """One part of the data: pooled rows ``X [n, d_model]`` (an array or tensor) or, for a
    per-token monitor, a list of ``n`` sequences ``[T_i, d_model]``; labels ``y [n]``; and for
    validation, each example's group (:data:`PLAIN` or a phrasing family)."""

    X: Any
    y: np.ndarray
    groups: np.ndarray | None = None

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
            ``FitConfig.contrast``), or None.
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
    groups when there are any: ``FitConfig.group_rule``), the cascade's ``tau`` (None: no cascade) and the benign validation share the threshold
    may flag (None: keep the config's), and whether the head keeps only the orders that earn their
    terms at that operating point on validation (``prune``)."""

    monitor: MonitorConfig
    fit: FitConfig
    recipe: str = "default"
    families: tuple[str, ...] = ()
    tau: float | None = None
    intent: tuple[str, ...] = ()
    target_fpr: float | None = 0.01
    context_lengths: tuple[int, ...] = ()
    prune: bool = False

    def __post_init__(self) -> None:
        if self.recipe not in TRAIN_RECIPES:
            raise TPCHooksError(f"recipe must be one of {list(TRAIN_RECIPES)}; got {self.recipe!r}")
        check_target_fpr(self.target_fpr)


def check_target_fpr(target_fpr: Any, name: str = "target_fpr") -> None:
    """``target_fpr`` is None or a number in [0, 1) (checked before anything is collected)."""
    if target_fpr is not None:
        check_rate(target_fpr, name)


def fit_config(recipe: str, families: Sequence[str], config: FitConfig | None, options: dict[str, Any]) -> FitConfig:
    """The fit settings of a recipe: ``config`` with ``options``; the paper's recipe; and with the
    default recipe and rewrites, the consistency penalty on them unless one is given."""
    if "recipe" in options:
        raise TPCHooksError("pass recipe= once (train_monitor's recipe covers fit's)")
    extra: dict[str, Any] = {"recipe": "paper"} if recipe == "paper" else {}
    if recipe == "default" and families and "consistency" not in options and (config is None or not config.consistency):
        extra["consistency"] = REWRITE_CONSISTENCY
    return FitConfig.from_options(config, {**options, **extra})


def default_aggregate(with_contexts: bool) -> str:
    """A per-token monitor's aggregation when none is asked for: ``"max"`` once the head has seen
    requests inside conversations (the best at long contexts), else ``"rolling"`` (trained on
    short prompts only, a running max flags more long benign chats the longer they are)."""
    return "max" if with_contexts else "rolling"


def train(data: Mapping[str, TrainData], plan: TrainPlan, *, sae: Any = None, init: Any = None, device: Any = None,
          verbose: bool = True) -> Monitor:
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
        if any(d.val is None for d in data.values()):
            raise TPCHooksError("choosing among several sites needs a validation split")
        pooled = {s: _cat(_cat(d.train, d.rewrites), d.flips) for s, d in data.items()}
        site, report["site_selection"] = choose_site(
            {s: (pooled[s].X, pooled[s].y, d.val.X, d.val.y) for s, d in data.items()}, data[site].val.groups,
            plan.fit, device)
    d, cfg = data[site], plan.fit
    settings = replace(plan.monitor, site=site)
    tokens = _TokenRows(d, settings.skip) if settings.streaming else None
    if tokens:
        X_tr, y_tr = tokens.train
    else:
        rows = _cat(_cat(d.train, d.rewrites), d.flips)
        X_tr, y_tr = rows.X, rows.y
    X_va = y_va = g_va = None
    if d.val is not None:
        X_va, y_va, g_va = tokens.val if tokens else (d.val.X, d.val.y, d.val.groups)
    unlabelled = None
    if cfg.consistency and plan.families and d.rewrites is not None:
        unlabelled = token_rows(list(d.rewrites.X), settings.skip)[0] if tokens else d.rewrites.X
    grouped = bool(plan.families or plan.intent)
    shared = dict(verbose=verbose, val_groups=g_va if grouped else None, X_unlabelled=unlabelled, device=device)
    pairs = _pairs(d, cfg, tokens, len(y_tr))
    if d.homonyms is not None and len(d.homonyms) and cfg.degree > 1:  # order 1 without them, the higher orders with
        if init is None:  # (rank is the higher degrees' setting: any value does for degree 1)
            init = fit(X_tr, y_tr, X_va, y_va, replace(cfg, degree=1, rank=1), pairs=pairs, **shared)
        late = Examples(*token_rows(list(d.homonyms.X), settings.skip, d.homonyms.y)) if tokens else d.homonyms
        every = _cat(Examples(X_tr, y_tr), late)
        X_tr, y_tr = every.X, every.y
    head = fit(X_tr, y_tr, X_va, y_va, cfg, pairs=pairs, init=init, **shared).cpu()
    if plan.prune and d.val is not None and head.degree > 1:
        head = _earned(head, d, settings, sae, plan, report)
    cascade = None
    if plan.tau is not None:
        cascade = Cascade(head, plan.tau)
        if d.val is not None:
            cascade = cascade.calibrate(X_va, y_va)
    monitor = Monitor(head, config=settings, cascade=cascade, sae=sae, report=report)
    report.update({"n_train": len(d.train), "augment": {
        "families": list(plan.families), "n_train_rewrites": 0 if d.rewrites is None else len(d.rewrites),
        "n_val_rewrites": 0 if d.val is None else int(((d.val.groups != PLAIN) & (d.val.groups != INTENT)).sum()),
        "intent": list(plan.intent), "n_train_flips": 0 if d.flips is None else len(d.flips),
        "n_train_homonyms": 0 if d.homonyms is None else len(d.homonyms),
        # the benign rows of the validation group INTENT: the flips and any validation homonyms
        "n_val_hard_negatives": 0 if d.val is None else int(((d.val.groups == INTENT) & (d.val.y == 0)).sum())},
        "recipe": plan.recipe})
    if tokens:
        report["n_train_tokens"] = int(len(y_tr))
    if d.val is None:
        return monitor
    benign = _report(monitor, d, tokens, X_va, y_va, g_va, plan)
    if plan.target_fpr is not None:
        monitor.calibrate_activations(benign, plan.target_fpr)
    return monitor


def _pairs(d: TrainData, cfg: FitConfig, tokens: Any, n_rows: int) -> np.ndarray | None:
    """``FitConfig.contrast``'s pairs: each training flip's prompt and the flip, as positions in the
    ``n_rows`` training rows (the prompts first, the flips last), or None."""
    if not cfg.contrast:
        return None
    if tokens or d.flips is None or d.flip_of is None:
        raise TPCHooksError("contrast ranks each harmful training prompt above its intent flip: it needs intent flips "
                            "(intent=True) and a per-prompt monitor (no aggregate)")
    return np.stack([np.asarray(d.flip_of), np.arange(n_rows - len(d.flips), n_rows)], 1)


def _earned(head: Any, d: TrainData, settings: MonitorConfig, sae: Any, plan: TrainPlan, report: dict[str, Any]) -> Any:
    """The head truncated to the order the validation operating point earns
    (:func:`~tpc_hooks._evaluate.earned_order`: each order at its own threshold flagging
    ``target_fpr`` of the benign validation rows; the harmful rows of the intent group are the
    prompts again, not counted twice); ``report["orders"]`` says what was kept and why."""
    fpr = FPR if plan.target_fpr is None else plan.target_fpr
    probe = Monitor(head, config=settings, sae=sae)
    X = list(d.val.X) if settings.streaming else d.val.X
    kept, table = earned_order(probe, X, d.val.y, fpr, counted=d.val.groups != INTENT)
    best = table[kept - 1]
    report["orders"] = {"trained": head.degree, "kept": kept, "fpr": fpr, "z": EARN_Z, "per_order": table,
                        "note": (f"orders {kept + 1}-{head.degree} add nothing at the operating point on validation "
                                 f"(order {kept} flags {best['flagged_harmful']} of {best['n_harmful']} harmful rows at "
                                 f"{fpr:g} FPR; no order above flags significantly more): they were dropped, so no "
                                 "policy runs them" if kept < head.degree else
                                 f"order {kept} adds at the operating point on validation (flags {best['flagged_harmful']}"
                                 f" of {best['n_harmful']} harmful rows at {fpr:g} FPR, order 1 "
                                 f"{table[0]['flagged_harmful']})")}
    return head.truncated(kept) if kept < head.degree else head


def _cat(a: Examples, b: Examples | None) -> Examples:
    """Pooled examples ``a`` then ``b``."""
    if b is None or not len(b):
        return a
    X = torch.cat([torch.as_tensor(a.X), torch.as_tensor(b.X)]) if isinstance(a.X, Tensor) else np.concatenate([a.X, b.X])
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
        if "train" in self.chats:
            rows = self.chats["train"][1]
            X, y = torch.cat([X, rows[0]]), np.concatenate([y, rows[1]])
        self.train = X, y
        if d.val is not None:
            X, y, g = token_rows(list(d.val.X), skip, d.val.y, d.val.groups)
            if "val" in self.chats:
                rows = self.chats["val"][1]
                X, y = torch.cat([X, rows[0]]), np.concatenate([y, rows[1]])
                g = np.concatenate([g, np.full(len(rows[1]), "contexts")])
            self.val = X, y, g


def _report(monitor: Monitor, d: TrainData, tokens: _TokenRows | None, X_va: Any, y_va: np.ndarray, g_va: np.ndarray,
            plan: TrainPlan) -> Any:
    """Fills ``monitor.report`` with the validation metrics per order (on the prompts as given),
    the worst validation group's, and the hosted chats'; returns the benign validation data the
    threshold is set on: the benign prompts as given (not their rewrites or the intent flips, which
    are many and easy: a threshold set among them flags more than ``target_fpr`` of ordinary
    prompts; ``benchmarks/bench_intent.py``) and the hosted benign chats."""
    val = d.val
    plain = val.groups == PLAIN
    if tokens is None:
        monitor.report.update({
            "validation": {"n": int(plain.sum()), "per_order": per_order(monitor, X_va[plain], val.y[plain])},
            "worst_validation_group": {"groups": sorted(set(g_va.tolist())),
                                       "per_order": worst_per_order(monitor, X_va, y_va, g_va)}})
        return X_va[(y_va == 0) & plain]
    seqs = list(val.X)
    monitor.report.update({
        "validation": {"n": int(plain.sum()), "per_order": per_order(monitor, [z for z, p in zip(seqs, plain) if p],
                                                                     val.y[plain]),
                       "decision": DECISIONS["max"]},
        "worst_validation_group": {"groups": sorted(set(val.groups.tolist())),
                                   "per_order": worst_per_order(monitor, seqs, val.y, val.groups)}})
    benign = [z for z, c, p in zip(seqs, val.y, plain) if c == 0 and p]
    if "val" in tokens.chats:
        chats, (_, _, ends) = tokens.chats["val"]
        monitor.report["contexts"] = {
            "n_train": len(d.contexts["train"].seqs) if "train" in d.contexts else 0, "n_val": len(chats.seqs),
            "lengths": list(plan.context_lengths), "n_train_tokens": int(len(tokens.chats["train"][1][1]))
            if "train" in tokens.chats else 0,
            "per_order": per_order(monitor, [a[:end] for a, end in zip(chats.seqs, ends)], chats.labels),
            "decision": "max over the chat of the aggregate (after a harmful request: to its turn's end)"}
        benign += [a for a, c in zip(chats.seqs, chats.labels) if c == 0]  # whole benign chats: the threshold holds on them
    return benign


def train_monitor(
    model: Any,
    prompts: Sequence[str],
    labels: Any,
    site: str | Sequence[str],
    pooling: str = "mean",
    *,
    aggregate: str | None = None,
    alpha: float = 0.1,
    window: int = 16,
    contexts: Any = None,
    context_tokens: int | Sequence[int] = (512, 1024),
    augment: bool | Sequence[str] | None = None,
    intent: bool | Sequence[str] | None = None,
    recipe: str = "default",
    target_fpr: float | None = 0.01,
    prune_orders: bool | None = None,
    val_fraction: float = 0.2,
    chat_template: bool | None = None,
    prepend_bos: bool | None = None,
    max_tokens: int | None = 512,
    batch_size: int = 8,
    tau: float | None = None,
    sae: Any = None,
    config: FitConfig | None = None,
    degree: int | None = None,
    rank: int | Sequence[int] | None = None,
    seed: int | None = None,
    verbose: bool = True,
    tokenizer: Any = None,
    **fit_kwargs: Any,
) -> Monitor:
    """Collects activations at ``site`` and trains a TPC monitor on them, in one call.

    By default the monitor is trained to hold up on requests *phrased* differently from the
    training prompts (past or future tense, fictional framing, third person, paraphrase, casing
    noise: ``tpc_hooks.data.PHRASING_FAMILIES``). Each training prompt gains one rewritten copy
    (same label), each validation prompt is rewritten by every family, and every degree >= 2 is
    selected over the validation groups (the plain prompts and each family:
    ``fit(val_groups=...)``; each group weighs the same and no group's loss may rise
    significantly: ``FitConfig.group_rule``), with a small consistency penalty on the rewritten training prompts
    (``FitConfig.consistency``, 0.03: each degree >= 2 is pulled to add little there). On the repository's benchmark (``benchmarks/bench_phrasing.py``)
    this is what keeps the higher orders at least as strong as the linear probe on a phrasing
    family never trained on; ``augment=False`` trains on the prompts as given. The rewrites are
    English templates; collection reads about 2.8x as many prompts with every family.

    That robustness costs in-distribution recall: ``recipe="in_distribution"`` trains on the
    prompts as given with pooled selection (the highest recall on prompts phrased like the
    training set, and a dial that turns the wrong way on rephrased ones); ``recipe="paper"`` is
    the paper's exact recipe (:class:`~tpc_hooks.FitConfig`), with the rewrites unless
    ``augment=False``. The docs' phrasing benchmark (docs/benchmarks/phrasing.md) has the measured trade-off.

    The monitor's operating point is set on the benign validation prompts as given (not their
    rewrites or intent flips): ``threshold`` flags at most ``target_fpr`` of them
    (:meth:`Monitor.calibrate_activations`), and a cascade (``tau``) exits around that threshold.
    With a few hundred benign validation prompts, 1% is a handful of them: recalibrate on a larger
    sample of your own benign traffic with :meth:`Monitor.calibrate` before deploying.

    Args:
        model: a TransformerLens, nnsight or plain ``transformers`` model.
        prompts, labels: texts and their labels (1 = harmful).
        site: where to read, or several sites: all are collected in one pass and the one whose
            linear probe has the best worst-group recall at 1% false-positive rate on validation
            is kept (``monitor.report["site_selection"]`` has the table).
        pooling: how to pool tokens (``"mean"``, ``"last"``, ``"max"``), or ``"token"`` for a
            streaming monitor: the head is trained on every token's activation, each token
            labelled with its prompt's label, and scores are aggregated over time. The tokens
            every prompt starts with (BOS, the chat template's system prompt and header; see
            ``Monitor.skip``) are neither trained on nor scored.
        aggregate, alpha, window: a streaming monitor's aggregation (see :class:`Monitor`).
            Its report and operating point count a prompt as flagged when the aggregate
            reaches the threshold at any token. Default: ``"max"`` with ``contexts`` (the
            best at long contexts once the head has seen requests inside conversations),
            ``"rolling"`` without (trained on short prompts only, a running max flags more
            long benign chats the longer they are; docs/benchmarks/long-contexts.md).
        contexts: benign chat conversations (``[{"role", "content"}]`` turns, user first) to
            train a per-token monitor on requests *inside* conversations as well, or a number
            of ShareGPT contexts to draw (:func:`tpc_hooks.data.sharegpt_contexts`, the prompts
            excluded). Each context hosts one training or validation prompt (as given, not a
            rewrite; the classes balanced, in a seeded order) in place of its first, middle or
            last user turn, its budget the ``context_tokens`` in turn
            (:func:`tpc_hooks.data.host_requests`); its tokens before the request are benign
            rows, the request's turn carries the prompt's label, and after a harmful request the
            rest is dropped (:func:`tpc_hooks.data.token_labels`). 1000 contexts (as measured:
            docs/benchmarks/long-contexts.md) keep the short-prompt recall at 2k tokens; 300 did not. A ``val_fraction`` share of the contexts (at least 2) is held out:
            it joins model selection (group ``"contexts"``), the report
            (``report["contexts"]``) and, for its benign sequences, the operating point, so the
            threshold holds on long benign chats. Needs a chat template.
        context_tokens: each context's token budget, or several used in turn (512, 1024).
        augment: ``True`` (every phrasing family), ``False``, or the families to use; default:
            every family, none for ``recipe="in_distribution"``.
        intent: ``True`` (every kind), ``False``, or intent-flip kinds
            (``tpc_hooks.data.INTENT_KINDS``) and ``"homonym"``: each harmful training prompt gains a
            benign-labelled counterpart on the same topic that asks no operational question ("What
            laws make it a crime to ...?"; :func:`tpc_hooks.data.intent_flips`), and the harmful
            validation prompts with every kind's flip of them form the validation group
            ``"intent"``, so grouped selection sees the hard negatives (and the pruning of
            orders counts them). ``"homonym"`` trains the orders above 1 (order 1 is fitted without
            them) on the library's training homonyms ("How do I kill a Python process?", benign)
            and validates on the homonyms of other verbs (benign, group ``"intent"``):
            :func:`tpc_hooks.data.homonym_examples`. ``"stated"`` (opt-in: ``True`` does not
            include it) adds, for a fifth of the harmful training prompts, a benign row that
            states the act as someone else's plan, then asks a benign question ("A student in my
            class said he wants to ... How should a teacher respond?";
            :func:`tpc_hooks.data.stated_flips`), for the orders above 1 as the homonym rows.
            Default: every kind and the homonyms with ``recipe="default"``, none otherwise.
        recipe: ``"default"`` (rewrites + grouped selection), ``"in_distribution"`` (no
            rewrites, pooled selection) or ``"paper"`` (the paper's recipe).
        target_fpr: the share of the benign validation prompts (as given) the threshold may flag;
            None keeps 0.5.
        prune_orders: keep only the orders that earn their terms at the operating point: each
            order at its own threshold flagging ``target_fpr`` of the benign validation rows, an
            order above the last one kept must flag significantly more of the harmful validation
            rows (a paired sign test: :func:`tpc_hooks._evaluate.earned_order`); the head is
            truncated to the last order that did
            (:meth:`TPC.truncated`), so neither the full polynomial nor a cascade runs the others,
            and ``report["orders"]`` says what was kept and why. Default: on, except with
            ``recipe="paper"``.
        val_fraction: stratified validation split (model selection, calibration, report).
        chat_template: wrap prompts as chat user turns; default: when the tokenizer has a template.
        prepend_bos: prepend BOS to raw prompts; default: when the tokenizer has a BOS token.
        tau: if given, the monitor's policy is a cascade at ``tau``, calibrated on validation.
        sae: an SAELens SAE for ``site``: train on its latents (pooled per prompt), so
            attribution reads in feature ids.
        config, degree, rank, seed, verbose, **fit_kwargs: passed to :func:`tpc_hooks.fit` (a
            :class:`~tpc_hooks.FitConfig` and/or its fields; ``degree``, ``rank`` and ``seed``
            override ``config`` only when given; ``seed`` also draws the validation split and
            the rewrites).
        tokenizer: the tokenizer of a ``transformers`` model (default: loaded from its
            ``name_or_path``); toolkit models use their own.

    Returns:
        A :class:`Monitor`; ``monitor.report`` holds validation metrics per order (on the
        validation prompts as given), the worst validation group's, and the site choice.

    Example:
        >>> monitor = tpc.train_monitor(model, prompts, labels,  # doctest: +SKIP
        ...                             site=[f"blocks.{l}.hook_resid_post" for l in (10, 15, 20)])
    """
    items = check_prompts(prompts)
    y = check_labels(labels, len(items), "labels").numpy().astype(int)
    sites = [site] if isinstance(site, str) else list(dict.fromkeys(site))
    if not sites or not all(isinstance(s, str) for s in sites):
        raise TPCHooksError(f"site must be a hook name or a non-empty list of them; got {site!r}")
    if recipe not in TRAIN_RECIPES:
        raise TPCHooksError(f"recipe must be one of {list(TRAIN_RECIPES)}; got {recipe!r}")
    if recipe == "in_distribution" and augment not in (None, False):
        raise TPCHooksError("recipe='in_distribution' trains on the prompts as given; it cannot be combined with augment")
    check_target_fpr(target_fpr)
    families = _phrasing.check_families(recipe != "in_distribution" if augment is None else augment)
    if recipe == "in_distribution" and intent not in (None, False):
        raise TPCHooksError("recipe='in_distribution' trains on the prompts as given; it cannot be combined with intent")
    kinds = _intent.check_kinds(recipe == "default" if intent is None else intent, _intent.NAMED_KINDS,
                                _intent.TRAIN_KINDS)
    flip_kinds = tuple(k for k in kinds if k in _intent.KINDS)
    adapter = get_adapter(model, tokenizer=tokenizer)
    for s in sites:
        adapter.site(s)
    if sae is not None and len(sites) > 1:
        raise TPCHooksError("an SAE belongs to one site: pass a single site with sae=")
    streaming = pooling == "token"
    if aggregate is None:
        aggregate = default_aggregate(contexts is not None)
    if streaming:
        check_aggregate(aggregate, alpha, window)
        if len(sites) > 1:
            raise TPCHooksError("a per-token monitor (pooling='token') reads one site; pass a single site")
    else:
        check_pooling(pooling)
        if contexts is not None:
            raise TPCHooksError("contexts= trains a per-token monitor on requests inside conversations; pass "
                                "pooling='token'")
    if chat_template is None:
        chat_template = bool(getattr(adapter.tokenizer, "chat_template", None))
    if contexts is not None:
        contexts, context_tokens = _check_contexts(adapter.tokenizer, contexts, context_tokens, chat_template, items)
    if not 0 < val_fraction < 1:
        raise TPCHooksError(f"val_fraction must be in (0, 1); got {val_fraction!r}")
    if np.bincount(y, minlength=2).min() < 2:
        raise TPCHooksError("labels need at least 2 examples of each class to hold out a validation split")
    n_val = max(2, int(round(val_fraction * len(items))))
    given = {k: v for k, v in (("degree", degree), ("rank", rank), ("seed", seed)) if v is not None}
    own = {k: fit_kwargs.pop(k) for k in ("init", "device") if k in fit_kwargs}  # fit's, not FitConfig's
    cfg = fit_config(recipe, families, config, {**given, **fit_kwargs})
    tr, va = train_test_split(np.arange(len(items)), test_size=n_val, stratify=y, random_state=cfg.seed)

    # One collection pass over the prompts and their rewrites, in this order: the training prompts,
    # the validation prompts, the training rewrites, the validation rewrites (every family), the
    # training flips, the validation flips (every kind) and homonyms, the training homonym rows.
    none = PromptSet([], [], [], [], [])
    if families:
        aug = rewrites([items[i] for i in tr], y[tr], families, seed=cfg.seed)
        views = rewrites([items[i] for i in va], y[va], families, every_family=True, seed=cfg.seed)
    else:
        aug = views = none
    flips = intent_flips([items[i] for i in tr], y[tr], flip_kinds, seed=cfg.seed) if flip_kinds else none
    homs = homonym_examples() if _intent.HOMONYM in kinds else none  # the training verbs' homonyms, benign
    if _intent.STATED in kinds:  # the stated-act rows join them: the orders above 1 train on them, order 1 does not
        homs = homs + stated_flips([items[i] for i in tr], y[tr], seed=cfg.seed)
    val_homs = homonym_examples(verbs="val") if _intent.HOMONYM in kinds else none  # benign, in the group INTENT
    val_flips = intent_flips([items[i] for i in va], y[va], flip_kinds, every_kind=True, seed=cfg.seed) \
        if flip_kinds else none
    texts = list(items) + aug.texts + views.texts + flips.texts + val_flips.texts + val_homs.texts + homs.texts
    n, cuts = len(items), np.cumsum([len(items), len(aug), len(views), len(flips), len(val_flips) + len(val_homs),
                                     len(homs)])
    idx = {"train": list(tr), "val": list(va), "rewrites": list(range(n, cuts[1])), "views": list(range(cuts[1], cuts[2])),
           "flips": list(range(cuts[2], cuts[3])), "homonyms": list(range(cuts[4], cuts[5])),
           # the group INTENT: every harmful validation prompt as given, then the flips and homonyms
           "intent": ([int(i) for i in va if y[i] == 1] if kinds else []) + list(range(cuts[3], cuts[4]))}
    bos = resolve_bos(adapter.tokenizer, prepend_bos, chat_template)
    skip = adapter.fixed_prefix(chat_template=chat_template, prepend_bos=bos) if streaming else 0
    if streaming:
        ids, _ = adapter.tokenize(texts, chat_template=chat_template, max_tokens=max_tokens, prepend_bos=bos)
        with tqdm(total=len(ids), desc="collect tokens", unit="prompt", disable=not verbose) as bar:
            acts = token_batches(adapter, ids, [adapter.site(sites[0])], batch_size, bar, sae=sae)
        rows = {s: (lambda at, a=acts[s]: [a[i] for i in at]) for s in sites}
    else:
        acts = collect(adapter, texts, sites, pooling, batch_size=batch_size, chat_template=chat_template,
                       prepend_bos=bos, max_tokens=max_tokens, sae=sae, progress=verbose)
        rows = {s: (lambda at, a=acts[s]: a[at]) for s in sites}
    y_all = np.concatenate([y] + [np.asarray(p.labels, dtype=int) for p in (aug, views, flips, val_flips, val_homs, homs)])
    groups = np.asarray([PLAIN] * len(va) + list(views.categories) + [INTENT] * len(idx["intent"]))
    at_val = idx["val"] + idx["views"] + idx["intent"]
    chats = {}
    if contexts is not None:  # requests inside benign conversations: more rows for training and validation
        splits = {"val": ([items[i] for i in va], y[va]), "train": ([items[i] for i in tr], y[tr])}
        for split, h in host_splits(adapter.tokenizer, contexts, splits, val_fraction=val_fraction,
                                    lengths=context_tokens, seed=cfg.seed).items():
            with tqdm(total=len(h.sequences), desc=f"collect {split} contexts", unit="chat", disable=not verbose) as bar:
                seqs = token_batches(adapter, [q.ids for q in h.sequences], [adapter.site(sites[0])], batch_size, bar,
                                     sae=sae)[sites[0]]
            chats[split] = Chats(seqs, [(q.start, q.stop) for q in h.sequences], h.labels, h.tail)
    data = {s: TrainData(train=Examples(rows[s](idx["train"]), y[tr]),
                         rewrites=Examples(rows[s](idx["rewrites"]), y_all[idx["rewrites"]]) if families else None,
                         val=Examples(rows[s](at_val), y_all[at_val], groups), contexts=chats,
                         flips=Examples(rows[s](idx["flips"]), y_all[idx["flips"]]) if len(flips) else None,
                         flip_of=np.asarray([int(i) for i in flips.sources], dtype=int) if len(flips) else None,
                         homonyms=Examples(rows[s](idx["homonyms"]), y_all[idx["homonyms"]]) if len(homs) else None)
            for s in sites}
    settings = MonitorConfig(sites[0], pooling=pooling, chat_template=chat_template, prepend_bos=bos,
                             max_tokens=max_tokens, model_name=adapter.model_name, aggregate=aggregate, alpha=alpha,
                             window=window, skip=skip)
    prune = recipe != "paper" if prune_orders is None else bool(prune_orders)
    plan = TrainPlan(settings, cfg, recipe=recipe, families=tuple(families), tau=tau, target_fpr=target_fpr, intent=kinds,
                     prune=prune,
                     context_lengths=tuple(context_tokens) if contexts is not None else ())
    return train(data, plan, sae=sae, verbose=verbose, **own)


def _check_contexts(tokenizer: Any, contexts: Any, lengths: Any, chat_template: bool,
                    prompts: Sequence[str]) -> tuple[list[list[dict[str, str]]], tuple[int, ...]]:
    """``train_monitor``'s ``contexts`` (conversations, or a number of ShareGPT contexts) and
    ``context_tokens``, checked."""
    lengths = (lengths,) if isinstance(lengths, int) and not isinstance(lengths, bool) else tuple(lengths)
    if not lengths or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in lengths):
        raise TPCHooksError(f"context_tokens must be a positive integer or a list of them; got {lengths!r}")
    if not chat_template:
        raise TPCHooksError("contexts= places prompts in chat conversations; it needs chat_template=True "
                            "(a tokenizer with a chat template)")
    if isinstance(contexts, int) and not isinstance(contexts, bool):
        if contexts < 4:
            raise TPCHooksError(f"contexts must be at least 4 (2 held out for validation); got {contexts}")
        return sharegpt_contexts(tokenizer, contexts, tokens=context_budget(lengths), exclude=prompts), lengths
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, Sequence):
        raise TPCHooksError("contexts must be a list of conversations ([{'role', 'content'}] turns) or a number of "
                            f"ShareGPT contexts; got {type(contexts).__name__}")
    convs = [check_conversation(c) for c in contexts]
    if len(convs) < 4 or any(not c for c in convs):
        raise TPCHooksError(f"contexts needs at least 4 non-empty conversations (2 are held out); got {len(convs)}"
                            + (" (one is empty)" if any(not c for c in convs) else ""))
    return convs, lengths

