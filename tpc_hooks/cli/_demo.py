"""``tpc-hooks demo``: the whole pipeline on the offline default model and prompt set.

collect -> train (TPC and baselines) -> evaluate (test split and a held-out source) -> cascade
sweep -> save the monitor -> monitor a few live generations -> attribute one flagged prompt.
Writes ``report.md``, ``results.json``, plots, one HTML page per live generation (plus a PNG
screenshot of one, where a Chromium is installed), the attribution's page and the saved monitor
into a run directory.
"""

import importlib.util
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import baselines
from ..activations import collect, get_adapter
from ..baselines import early_exit_cascade
from ..data import (
    EVERYDAY_SOURCES,
    HOMONYM,
    KINDS,
    PromptSet,
    default_prompt_set,
    everyday_prompts,
    flipped_views,
    homonym_pairs,
    source_names,
)
from ..data import homonyms as intent_homonyms
from ..head import Cascade, attribute
from ..metrics import classification_metrics, threshold_at_fpr
from ..monitoring import Monitor
from ..offline import DEFAULT_MODEL, PACKAGED, QUICK_SAE_EPOCHS, load_model, load_sae
from ..recipes import Recipe
from ..training import evaluate, train_monitor
from ._demo_report import pages as write_pages
from ._demo_report import plots, render_report

log = logging.getLogger(__name__)

TAUS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
N_TRAFFIC = 1000  # everyday traffic the deployed monitor is also calibrated on (train_monitor(calibration=...))


def _subsample(ps: PromptSet, n: int, seed: int) -> PromptSet:
    """A deterministic class-balanced subsample of at most ``n`` rows."""
    if len(ps) <= n:
        return ps
    rng = np.random.default_rng(seed)
    labels = np.asarray(ps.labels)
    take = []
    for c in (0, 1):
        idx = np.flatnonzero(labels == c)
        take.extend(rng.choice(idx, size=min(len(idx), n // 2), replace=False).tolist())
    return ps.subset(sorted(take))


def _in_features(
    monitor: Monitor, z: Any, site: str, model_name: str | None, progress: bool, quick: bool = False
) -> tuple[Any, Any]:
    """The attribution of ``z`` in the features of the packaged prompts' SAE at ``site``, and its
    summary for the results (the SAE's reconstruction report, the top features and pairs, their
    labels); ``(None, None)`` without SAELens or for a model not packaged. A quick run reads an SAE
    trained for :data:`~tpc_hooks.offline.QUICK_SAE_EPOCHS` epochs instead of ``load_sae``'s default (its own
    cached SAE)."""
    if (model_name or DEFAULT_MODEL) not in PACKAGED or importlib.util.find_spec("sae_lens") is None:
        return None, None
    short = {"epochs": QUICK_SAE_EPOCHS} if quick else {}  # else load_sae's own default
    feature_sae = load_sae(site, model_name, progress=progress, **short)
    attr = attribute(monitor, z, sae=feature_sae)
    got = attr.to_dict(0, k=8)
    return attr, {
        "reconstruction": feature_sae.reconstruction,
        "top_features": got["top_neurons"],
        "top_pairs": got["top_pairs"],
        "labels": got.get("labels", {}),
    }


def _model_and_site(model_name: str | None, toolkit: str, layer: int | None) -> tuple[Any, Any, bool, str]:
    """The model, its adapter, whether prompts are wrapped as chat turns (when its tokenizer has a
    template: a base model has none, and reads them as they are) and the site: ``layer``, else
    two thirds of the way up."""
    model = load_model(model_name, toolkit)
    adapter = get_adapter(model)
    layer = round(2 * adapter.n_layers / 3) if layer is None else layer
    return model, adapter, bool(getattr(adapter.tokenizer, "chat_template", None)), f"blocks.{layer}.hook_resid_post"


def run_demo(
    out: str | Path,
    *,
    toolkit: str = "transformer_lens",
    model_name: str | None = None,
    layer: int | None = None,
    quick: bool = False,
    seed: int = 0,
    progress: bool = True,
    dataset: str = "default",
    sets: dict[str, PromptSet] | None = None,
    intent: Sequence[str] | None = None,
    sae: bool = True,
) -> dict[str, Any]:
    """Runs the demo into ``out`` and returns the results (also written to ``results.json``).

    Args:
        out: the run directory.
        toolkit: ``"transformer_lens"`` (a TransformerBridge), ``"nnsight"`` or ``"transformers"`` (the plain model).
        model_name: a packaged model (``"gemma-3-270m"``, see :data:`tpc_hooks.offline.PACKAGED`), a hub id
            or local folder; None for the offline default (SmolLM2-135M-Instruct).
        layer: the residual-stream layer the monitor reads (``blocks.{layer}.hook_resid_post``); None:
            two thirds of the way up (20 of SmolLM2's 30 layers, 12 of Gemma-3-270M's 18).
        Prompts are wrapped as chat user turns when the model's tokenizer has a chat template (an
        instruction-tuned model), and read as they are otherwise (a base model).
        quick: a small run for CI (subsampled data, rank 16, fewer epochs, two baselines).
        seed: seeds the data split and all training.
        dataset: the name of the prompts: ``"default"`` (the packaged set, with a held-out
            source), or the file or hub dataset ``sets`` were read from.
        sets: ``train`` / ``val`` / ``test`` prompt sets of ``dataset`` when it is not the default
            (the command line reads and splits them before the model loads:
            ``tpc_hooks.cli._data.prompt_sets``).
        intent: ``train_monitor``'s ``intent`` for the deployed monitor (None: its default), e.g.
            every kind, ``"homonym"`` and the opt-in ``"stated"``.
        sae: also explain the attributed prompt in the features of a small SAE at the site, trained
            on the packaged prompts and labelled (:func:`tpc_hooks.offline.load_sae`; a packaged
            model with SAELens installed; a few minutes the first time, then cached).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t0 = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t0
        times[name] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()

    sets = default_prompt_set(seed=seed) if sets is None else dict(sets)
    if quick:
        sets = {
            k: _subsample(v, {"train": 360, "val": 120, "test": 160, "heldout": 120}[k], seed) for k, v in sets.items()
        }
    model, adapter, chat, site = _model_and_site(model_name, toolkit, layer)
    lap("load data and model")

    X, y = _activations(model, sets, site, chat, out, progress)
    lap("collect activations")

    degree, rank, epochs = (5, 16, 15) if quick else (5, 64, 50)
    methods = ("linear", "mlp", "early_exit", "tpc_paper", "tpc") if not quick else ("mlp", "early_exit", "tpc")
    cmp, heldout_rows = _compare(X, y, methods, degree=degree, rank=rank, epochs=epochs, seed=seed, progress=progress)
    head = cmp.models["tpc"].cpu()
    guards = _guards(head, X)
    lap("train TPC and baselines")

    cascade = Cascade(head, tau=0.2).calibrate(X["val"], y["val"])
    tpc_sweep = cascade.sweep(X["test"], y["test"], taus=TAUS)
    ee_sweep = _early_exit_sweep(cmp.models["early_exit"].cpu(), X["test"], y["test"], head.cost(1).flops)
    monitor = Monitor(
        head,
        site,
        chat_template=chat,
        model_name=model_name or DEFAULT_MODEL,
        cascade=cascade,
        report={"test": [r for r in cmp.rows if r["method"] == "tpc"]},
    )
    lap("cascade")

    deployed, deployment, outside = _deployed(
        model, sets, X, y, site, chat, seed=seed, quick=quick, progress=progress, intent=intent, out=out
    )
    lap("train_monitor (default), hard negatives and the outside-built sets")

    tok = adapter.tokenizer  # a plain transformers model carries none: the adapter loads it
    run, live = _live(deployed, model, sets["test"], tok, quick)
    lap("monitored generation")

    attr, attribution, attr_sae = _attribution(
        monitor,
        cascade,
        X["test"],
        sets["test"],
        out,
        site=site,
        model_name=model_name,
        progress=progress,
        sae=sae,
        quick=quick,
    )
    lap("attribution")

    pages = write_pages(out, run, tok, deployed.threshold, attr, attribution["prompt"], attr_sae)
    lap("pages")

    res = {
        "model": model_name or DEFAULT_MODEL,
        "toolkit": toolkit,
        "site": site,
        "quick": quick,
        "seed": seed,
        "dataset": dataset,
        "sizes": {k: len(v) for k, v in sets.items()},
        "degree": degree,
        "rank": rank,
        "epochs": epochs,
        "methods": list(methods),
        "f1": {"test": cmp.rows, "heldout": heldout_rows},
        "cascade": {"tpc": tpc_sweep, "early_exit": ee_sweep},
        "calibration": cascade.calibration_report,
        "live": live,
        "attribution": attribution,
        "guards": guards,
        "pages": pages,
        "deployment": deployment,
        "intent": None if intent is None else list(intent),
        "outside": outside,
        "seconds": times,
    }
    res["plots"] = plots(out, res)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "report.md").write_text(render_report(res))
    return res


def _activations(
    model: Any, sets: dict[str, PromptSet], site: str, chat: bool, out: Path, progress: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each split's rows at ``site`` (mean-pooled, kept in ``out/activations/<split>``) and its labels."""
    X, y = {}, {}
    for name, ps in sets.items():
        X[name] = collect(
            model,
            ps.texts,
            site,
            "mean",
            chat_template=chat,
            batch_size=8,
            store=out / "activations" / name,
            progress=progress,
        )[site].to_numpy()
        y[name] = np.asarray(ps.labels)
    return X, y


def _compare(
    X: dict[str, Any],
    y: dict[str, Any],
    methods: Sequence[str],
    *,
    degree: int,
    rank: int,
    epochs: int,
    seed: int,
    progress: bool,
) -> tuple[Any, list[dict[str, Any]]]:
    """The ``methods`` (the TPC and the baselines) trained on the training split, selected on the
    validation split and scored per order on the test split (:func:`tpc_hooks.baselines.compare`),
    and their rows on the held-out source (none for a set without one)."""
    cmp = baselines.compare(
        X["train"],
        y["train"],
        X["val"],
        y["val"],
        X["test"],
        y["test"],
        degree=degree,
        rank=rank,
        methods=methods,
        seed=seed,
        verbose=progress,
        epochs=epochs,
    )
    return cmp, (cmp.evaluate(X["heldout"], y["heldout"]) if "heldout" in X else [])


@torch.no_grad()
def _guards(head: Any, X: dict[str, Any]) -> dict[str, Any]:
    """The TPC's out-of-distribution guards: its fit settings, and the share of each split's rows
    outside its trust region."""
    return {
        "settings": head.history.settings,
        "outside": {k: float(head.outside(torch.as_tensor(v)).float().mean()) for k, v in X.items()},
    }


@torch.no_grad()
def _early_exit_sweep(ee: Any, X: Any, y: Any, lin_flops: float | int) -> list[dict[str, Any]]:
    """The early-exit MLP's cascade at each of :data:`TAUS` on the rows ``X``: F1, mean FLOPs over
    the linear probe's (``lin_flops``) and the exits per order."""
    sweep = []
    for tau in TAUS:
        r = early_exit_cascade(ee, torch.as_tensor(X), tau=tau)
        m = classification_metrics(y, r.logits)
        sweep.append(
            {
                "tau": tau,
                "f1": m["f1"],
                "relative_flops": r.mean_flops / lin_flops,
                "exit_histogram": r.exit_histogram(),
            }
        )
    return sweep


def _live(deployed: Monitor, model: Any, test: PromptSet, tok: Any, quick: bool) -> tuple[Any, list[dict[str, Any]]]:
    """The deployed monitor on live generations (``action="stop"``) of the test split's first two
    plain harmful and two plain benign prompts: the run, and per prompt its label, the score and exit
    order at each step, where it stopped and the text generated."""
    picks = [i for i in range(len(test)) if test.labels[i] == 1 and not test.adversarial[i]][:2]
    picks += [i for i in range(len(test)) if test.labels[i] == 0 and not test.adversarial[i]][:2]
    run = deployed.generate(model, [test.texts[i] for i in picks], max_new_tokens=8 if quick else 24, action="stop")
    live = [
        {
            "prompt": test.texts[i],
            "label": test.labels[i],
            "scores": [round(float(v), 3) for v in run.scores[b]],
            "exit_orders": run.exit_orders[b].tolist(),
            "stopped_at": run.stopped_at[b],
            "generated": tok.decode(run.generated(b), skip_special_tokens=True),
        }
        for b, i in enumerate(picks)
    ]
    return run, live


def _attribution(
    monitor: Monitor,
    cascade: Cascade,
    X_test: Any,
    test: PromptSet,
    out: Path,
    *,
    site: str,
    model_name: str | None,
    progress: bool,
    sae: bool,
    quick: bool = False,
) -> tuple[Any, dict[str, Any], Any]:
    """The attribution of the harmful test prompt the cascade flags most confidently: the attribution,
    its summary for the results (with its SAE features' when ``sae``: :func:`_in_features`) and the
    SAE attribution (or None); its plot saved as ``out/attribution.png`` where matplotlib is installed."""
    probs = cascade(torch.as_tensor(X_test)).probs
    flagged = [i for i in torch.argsort(probs, descending=True).tolist() if test.labels[i] == 1][:1]
    attr = attribute(monitor, X_test[flagged])
    attribution = {"prompt": test.texts[flagged[0]], **attr.to_dict(0, k=8)}
    attr_sae, attribution["sae"] = (
        _in_features(monitor, X_test[flagged], site, model_name, progress, quick) if sae else (None, None)
    )
    try:
        attr.plot(0, k=10).savefig(out / "attribution.png", dpi=120)
    except ImportError:
        pass
    return attr, attribution, attr_sae


def _deployed(
    model: Any,
    sets: dict[str, PromptSet],
    X: dict[str, Any],
    y: dict[str, Any],
    site: str,
    chat: bool,
    *,
    seed: int,
    quick: bool,
    progress: bool,
    intent: Any,
    out: Path,
) -> tuple[Monitor, dict[str, Any], dict]:
    """What a deployment sees: ``train_monitor``'s default on the training split, saved to
    ``out/monitor``, at its own threshold on the test split, the held-out source and hard negatives
    (benign requests on harmful topics; their rows added to ``X`` and ``y``), and beside a probe
    trained on its own rows on the packaged sets another hand built (``out/outside.md``,
    ``out/outside.png``; 40 prompts of each set in a quick run). On the packaged set the threshold
    is also set on everyday traffic (:func:`traffic`: 1000 ShareGPT first turns, 200 in a quick run)."""
    calibration = traffic(sets, 200 if quick else N_TRAFFIC, seed)
    short: dict[str, Any] = {"rank": 16, "epochs": 15} if quick else {}
    deployed = train_monitor(
        model,
        sets["train"].texts,
        sets["train"].labels,
        site,
        tau=0.2,
        seed=seed,
        verbose=progress,
        recipe=Recipe("default", intent=tuple(intent or ())),
        **_sources(sets["train"]),
        calibration=calibration,
        **short,
    )
    hard = hard_negatives(sets["test"], seed, per_kind=20 if quick else None)
    X["hard"] = collect(model, hard.texts, site, "mean", chat_template=chat, batch_size=8, progress=progress)[
        site
    ].numpy()
    y["hard"] = np.zeros(len(hard), dtype=int)
    deployment = deployment_table(deployed, X, y, sets, hard)
    deployed.save_pretrained(out / "monitor")
    ev = outside_evaluation(
        model,
        deployed,
        sets["train"],
        test=sets["test"],
        limit=40 if quick else None,
        out=out / "outside.md",
        plot=out / "outside.png",
        progress=progress,
        calibration=calibration,
    )
    return deployed, deployment, {**ev.to_dict(), "markdown": ev.to_markdown()}


def hard_negatives(test: PromptSet, seed: int, per_kind: int | None = None) -> PromptSet:
    """Benign requests that look like harmful ones, none trained on: every intent-flip kind of the
    test split's plain harmful requests in the wordings training never uses, and every homonym of the
    verbs training never uses (``train_monitor`` trains on the other verbs' homonyms);
    ``categories`` holds the kind. ``per_kind`` caps each kind (a quick run)."""
    harmful = [t for t, y, a in zip(test.texts, test.labels, test.adversarial, strict=True) if y == 1 and not a]
    rows = []
    for kind, got in flipped_views(harmful, KINDS, lambda k: random.Random(f"demo-{seed}-{k}"), "test").items():
        rows += [(t, kind) for _, t in got[:per_kind]]
    rows += [(t, HOMONYM) for t in intent_homonyms(homonym_pairs("test"), random.Random(f"demo-{seed}"))]
    return PromptSet(
        [t for t, _ in rows], [0] * len(rows), ["hard"] * len(rows), [k for _, k in rows], [False] * len(rows)
    )


def traffic(sets: dict[str, PromptSet], n: int, seed: int) -> list[str] | None:
    """The everyday traffic the demo's monitor is also calibrated on: ``n`` ShareGPT first turns
    none of the set's splits holds (:func:`tpc_hooks.data.everyday_prompts`), for a set with the
    packaged everyday sources; None for another set (``tpc-hooks evaluate`` draws them again)."""
    if _sources(sets["train"])["everyday"] is None:
        return None
    return everyday_prompts(n, exclude=[t for ps in sets.values() for t in ps.texts], seed=seed)


def _sources(train: PromptSet) -> dict[str, Any]:
    """``train_monitor``'s ``sources`` and ``everyday`` for a set: its sources, and the packaged set's
    everyday ones among them (none for a set without them: every benign prompt sets the threshold)."""
    names = source_names(train)
    return {"sources": names, "everyday": [s for s in EVERYDAY_SOURCES if s in names] or None}


def outside_evaluation(
    model: Any,
    monitor: Monitor,
    train: PromptSet,
    *,
    test: PromptSet | None = None,
    limit: int | None = None,
    out: Path | None = None,
    plot: Path | None = None,
    progress: bool = True,
    calibration: Sequence[str] | None = None,
) -> Any:
    """:func:`tpc_hooks.evaluate` of a monitor trained on ``train`` (its sources and everyday ones as
    the demo trains with), on the packaged outside-built sets: the table written to ``out`` (.md or
    .html), the curves to ``plot`` (needs matplotlib; skipped with a warning without it)."""
    ev = evaluate(
        model,
        monitor,
        train.texts,
        train.labels,
        test=test,
        limit=limit,
        verbose=progress,
        calibration=calibration,
        **_sources(train),
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(ev.to_html() if out.suffix.lower() in (".html", ".htm") else ev.to_markdown() + "\n")
    if plot is not None:
        try:
            fig = ev.plot()
        except ImportError:
            log.warning("matplotlib is not installed; skipping the plot (pip install 'tpc-hooks[plot]')")
        else:
            plot.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(plot, dpi=120)
            import matplotlib.pyplot as plt

            plt.close(fig)
    return ev


def deployment_table(
    monitor: Monitor, X: dict[str, Any], y: dict[str, Any], sets: dict[str, PromptSet], hard: PromptSet
) -> dict[str, Any]:
    """Per order of the deployed monitor: recall and the flag rates of benign prompts, each order at
    its own threshold flagging 1% of the validation split's everyday benign prompts (which training
    never saw; every benign prompt for a set without everyday sources), and the monitor's own
    operating point (its threshold, its policy)."""
    test = sets["test"]
    src = np.asarray(test.sources)
    ordinary = (y["test"] == 0) & (src != "overrefusal")
    kinds = np.asarray(hard.categories)
    parts = {
        "recall": ("test", y["test"] == 1),
        "ordinary benign": ("test", ordinary),
        "overrefusal": ("test", src == "overrefusal"),
        "intent flips": ("hard", np.isin(kinds, KINDS)),
        "homonyms": ("hard", kinds == "homonym"),
    }
    if "heldout" in X:
        parts["heldout recall"] = ("heldout", y["heldout"] == 1)
        parts["heldout benign"] = ("heldout", y["heldout"] == 0)
    used = sorted({split for split, _ in parts.values()})

    def rates(score: Any, t: float) -> dict[str, float]:
        s = {split: score(X[split]) for split in used}  # each split scored once
        return {k: float((s[split][m] > t).mean()) if m.any() else float("nan") for k, (split, m) in parts.items()}

    ref = (y["val"] == 0) & np.isin(source_names(sets["val"]), EVERYDAY_SOURCES)
    ref = ref if ref.any() else y["val"] == 0
    rows = []
    for n in range(1, monitor.head.degree + 1):

        def score(Z, n=n):
            return monitor.head(torch.as_tensor(Z), order=n).detach().double().numpy()

        t = threshold_at_fpr(score(X["val"])[ref], 0.01)
        rows.append({"order": str(n), **rates(score, t)})

    def deployed(Z):
        return monitor.policy()(torch.as_tensor(Z)).logits.detach().double().numpy()

    p = monitor.threshold
    rows.append({"order": "deployed", **rates(deployed, float(np.nextafter(np.log(p / (1 - p)), -np.inf)))})
    return {
        "rows": rows,
        "orders": monitor.report.get("orders", {}),
        "n_hard": dict(Counter(hard.categories)),
        "by_source": monitor.report.get("operating_point", {}).get("by_source", {}),
        "refit": "refit" in monitor.report,
    }
