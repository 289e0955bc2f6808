"""``tpc-hooks train``'s recipe on the stores ``tpc-hooks collect`` wrote: the rows
:func:`tpc_hooks.train_monitor` would collect (the prompts, the phrasing rewrites, the validation
families, the intent flips and homonyms, hosted chats), read back from the stores that exist, and
the plan ``train`` runs on them."""

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import TPCHooksError
from ..data import INTENT_KINDS, PHRASING_FAMILIES
from ..monitoring import MonitorConfig, everyday_rows
from ..recipes import Recipe
from ._collected import CONTEXT_SPLITS, PooledStores, TokenStores, check_split, collect_config
from ._options import TrainOptions
from ._refit import settle
from ._train import PLAIN, TrainData, TrainPlan


@dataclass(frozen=True)
class StoresRun:
    """What :func:`plan_from_stores` read and decided: each site's rows, the plan, the site chosen
    (or ``"auto"``), whether the rows are per token, the hosted-chat splits read, and the record
    of a user's data split as ``train_monitor`` splits it (``collect.json``'s ``"split"``), when the
    head is refit on every prompt after :func:`~tpc_hooks.training._train.train` (:func:`finish`)."""

    data: dict[str, TrainData]
    plan: TrainPlan
    site: str
    per_token: bool
    hosted: list[str]
    acts: Path
    sites: list[str]
    split: dict[str, Any] | None = None


def plan_from_stores(
    acts: Path,
    options: TrainOptions,
    *,
    site: str | None,
    intent_stores: bool,
    contexts: bool,
    keep_all_orders: bool,
    stream_flags: tuple[str, ...] = (),
) -> StoresRun:
    """Checks the stores against the options (checked when built; each error here names the fix) and
    reads the rows the recipe trains on. ``intent_stores`` / ``contexts``: whether to read the intent
    flips / hosted chats the stores hold; ``stream_flags``: the per-token flags given (``aggregate``,
    ``alpha``, ``window``), refused for pooled stores. Of ``options``, the stores path reads the recipe, the fit
    settings, ``tau``, ``target_fpr``, ``everyday`` and a per-token monitor's ``aggregate``,
    ``alpha`` and ``window``; the rest belong to the prompts ``tpc-hooks collect`` read."""
    preset, recipe, everyday = options.preset, options.preset.name, options.everyday
    cfg = collect_config(acts)
    site = site or cfg["sites"][0]
    site_fix = f"re-run tpc-hooks collect --out {acts}"
    per_token = _check_site(acts, cfg, site, stream_flags)
    train_split, first, has_val = _check_splits(acts, cfg, site, site_fix)
    parts = _parts(acts, preset, has_val=has_val, intent_stores=intent_stores, contexts=contexts and per_token)
    reader = TokenStores(acts, site_fix) if per_token else PooledStores(acts, site_fix)
    sites = cfg["sites"] if site == "auto" else [site]
    data = {
        s: reader.data(
            s,
            train_split,
            parts.rewrites,
            parts.written if has_val else None,
            parts.hosted,
            bool(parts.intent),
            parts.homonyms,
        )
        for s in sites
    }
    if everyday is not None:  # before training: the names must be sources of the validation split
        val = data[sites[0]].val
        if val is None or val.sources is None:
            raise TPCHooksError(
                f"--everyday names sources in the validation split's sources.json, and {acts} has "
                f"{'no validation split' if val is None else 'none'}; {site_fix}"
            )
        everyday_rows(val.sources[val.groups == PLAIN], everyday)

    streaming: dict[str, Any] = (
        {
            "skip": reader.skip,
            "prepend_bos": reader.prepend_bos,
            "aggregate": options.aggregate_for(bool(parts.hosted)),
            "alpha": options.alpha,
            "window": options.window,
            "top_k": options.top_k,
        }
        if per_token
        else {}
    )
    settings = MonitorConfig(
        first,
        pooling=cfg["pooling"],
        chat_template=cfg["chat_template"],
        max_tokens=cfg["max_tokens"],
        model_name=cfg["model"],
        **streaming,
    )
    plan = TrainPlan(
        settings,
        options.fit_config(parts.families),
        recipe=recipe,
        families=tuple(parts.families),
        tau=options.tau,
        target_fpr=options.target_fpr,
        intent=parts.intent + (("homonym",) if parts.homonyms else ()),
        prune=preset.prune_orders and not keep_all_orders,
        shifts=parts.shifts,
        everyday=None if everyday is None else tuple(sorted(set(everyday))),
    )
    split = cfg.get("split")
    # a user's file, split as train_monitor splits it: the same last step (the refit on every prompt)
    # for the recipe train_monitor refits (the default's prompts as given, pooled, no cascade)
    plain = recipe == "default" and not parts.families and not parts.intent and options.tau is None and not per_token
    if isinstance(split, dict) and "positions" in split and plain and plan.fit.mode == "progressive":
        return StoresRun(data, replace(plan, refit=True), site, per_token, parts.hosted, acts, sites, split)
    return StoresRun(data, plan, site, per_token, parts.hosted, acts, sites)


def finish(run: StoresRun, monitor: Any, target_fpr: float | None) -> None:
    """``train``'s last step on a user's file split as ``train_monitor`` splits it: the head refit on
    every prompt (the training and validation splits put back in the file's order) and its threshold
    set on every benign prompt's out-of-fold score, as :func:`tpc_hooks.train_monitor` does
    (:func:`~tpc_hooks.training._refit.settle`); ``monitor.report["split"]`` records the split as
    ``train_monitor`` records its own. Nothing for other stores."""
    if run.split is None:
        return
    at = run.split["positions"]
    n = len(at["train"]) + len(at["val"])
    reader = PooledStores(run.acts, f"re-run tpc-hooks collect --out {run.acts}")
    X: dict[str, Any] = {}
    y = np.zeros(n, dtype=int)
    for s in run.sites:
        rows = None
        for part in ("train", "val"):
            Xp, yp = reader.part(part, s, f"{part} split")
            if len(yp) != len(at[part]):
                raise TPCHooksError(
                    f"{run.acts / part} holds {len(yp)} rows but collect.json places {len(at[part])}; "
                    f"re-run tpc-hooks collect --out {run.acts}"
                )
            rows = Xp.new_zeros((n, Xp.shape[1])) if rows is None else rows
            rows[at[part]] = Xp
            y[at[part]] = yp
        X[s] = rows
    sources = None
    if all((run.acts / part / "sources.json").is_file() for part in ("train", "val")):
        sources = np.empty(n, dtype=object)
        for part in ("train", "val"):
            sources[at[part]] = json.loads((run.acts / part / "sources.json").read_text(encoding="utf-8"))
    settle(monitor, X, y, sources=sources, everyday=run.plan.everyday, target_fpr=target_fpr, seed=run.plan.fit.seed)
    monitor.report["split"] = {
        "val_fraction": run.split["val_fraction"],
        "split": run.split.get("split", "stratified"),
        "seed": run.split["seed"],
        "n_calibration": 0,
        "test_fraction": run.split.get("test_fraction", 0.0),
    }


def _check_site(acts: Path, cfg: dict[str, Any], site: str, stream: tuple[str, ...]) -> bool:
    """``--site`` was collected (or is ``"auto"``), and the per-token flags given (``stream``) go with
    the stores' pooling; whether the stores hold per-token rows."""
    if site != "auto" and site not in cfg["sites"]:
        raise TPCHooksError(
            f"--site {site!r} was not collected in {acts}; collected sites: {', '.join(cfg['sites'])}; "
            f"pass one of those, or collect it: tpc-hooks collect --sites {site} --out {acts}"
        )
    per_token = cfg["pooling"] == "token"
    if stream and not per_token:
        raise TPCHooksError(
            f"--{'/--'.join(k.replace('_', '-') for k in stream)} set how a per-token monitor aggregates its token "
            f"scores, but {acts} "
            f"holds pooled rows (pooling {cfg['pooling']!r}); drop the option, or collect per-token rows: "
            f"tpc-hooks collect --pooling token"
        )
    if per_token and site == "auto":
        raise TPCHooksError(
            "--site auto chooses among sites by pooled linear probes; a per-token monitor reads one site: "
            f"pass --site (collected: {', '.join(cfg['sites'])})"
        )
    return per_token


def _check_splits(acts: Path, cfg: dict[str, Any], site: str, site_fix: str) -> tuple[str, str, bool]:
    """The training split (``train``, else ``all``) and the validation split (if any) hold the first
    site read; returns the training split's name, that site and whether there is a validation split."""
    train_split = "train" if (acts / "train").exists() else "all"
    first = cfg["sites"][0] if site == "auto" else site
    check_split(acts, train_split, first, "training split", site_fix)
    has_val = (acts / "val").exists()
    if has_val:
        check_split(acts, "val", first, "validation split", site_fix)
    if site == "auto" and not has_val:
        raise TPCHooksError(f"--site auto chooses on the validation split, and {acts} has none; pass --site")
    return train_split, first, has_val


@dataclass(frozen=True)
class _Parts:
    """Which of the optional stores the recipe reads: the validation families written (``written``),
    those trained on (``families``) or only validated on (``shifts``), whether the training
    rewrites are read, the intent kinds and the homonym rows, and the hosted-chat splits."""

    written: list[str]
    families: list[str]
    shifts: tuple[str, ...]
    rewrites: bool
    intent: tuple[str, ...]
    homonyms: bool
    hosted: list[str]


def _parts(acts: Path, recipe: Recipe, *, has_val: bool, intent_stores: bool, contexts: bool) -> _Parts:
    """The optional stores ``collect`` wrote that ``recipe`` reads, in ``train_monitor``'s order
    (``contexts``: read the hosted chats of per-token stores)."""
    # The phrasing rewrites `collect` wrote (unless --no-augment there), in train_monitor's order: the families
    # the recipe trains on, and those it only validates on (the default's floor test); none in distribution
    validated = set(recipe.augment) | set(recipe.shifts)
    written = (
        []
        if not has_val
        else [f for f in PHRASING_FAMILIES if f in validated and (acts / f"val-{f}" / "labels.json").is_file()]
    )
    families = [f for f in written if f in recipe.augment]
    shifts = tuple(f for f in written if f in recipe.shifts)
    rewrites = bool(families) and (acts / "aug" / "labels.json").is_file()
    # ... and the intent flips (unless --no-intent there): trained on, and the validation group "intent"
    intent = (
        ()
        if not has_val or not recipe.intent or not intent_stores
        else INTENT_KINDS
        if all((acts / p / "labels.json").is_file() for p in ("flips", "val-intent"))
        else ()
    )
    homonyms = bool(intent) and (acts / "homonyms" / "labels.json").is_file()  # ... with the homonym rows
    hosted = [] if not contexts else [k for k, d in CONTEXT_SPLITS.items() if (acts / d / "labels.json").is_file()]
    return _Parts(written, families, shifts, rewrites, intent, homonyms, hosted)
