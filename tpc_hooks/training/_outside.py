"""A monitor on prompt sets another hand built, beside a linear probe trained on the same rows.

:func:`evaluate` reads the model once over the monitor's training prompts and the packaged
outside-built sets (:func:`tpc_hooks.data.outside_sets`), trains the probe the floor is defined by
(scikit-learn's logistic regression on standardised activations of the prompts as given, ``C``
by validation AUROC, on the monitor's own training rows, at the best candidate site by its own
validation AUROC) and reports, per set, the share each method flags: the monitor at its deployed
threshold, and the probe and each order of the monitor at one rate (``fpr``) of the same everyday
benign validation prompts. :func:`evaluate_activations` does the same on activations already read
(the benchmarks' cached ones).
"""

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score, roc_curve
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from tqdm.auto import tqdm

from .._errors import TPCHooksError
from ..activations import collect, cost_line, prompts_digest
from ..data import PromptSet, check_prompts, norm, outside_sets, rng, split_positions
from ..head import PROBE_CS
from ..metrics import check_labels, flagged, threshold_at_fpr
from ..monitoring import Monitor, check_sources, everyday_present, everyday_rows
from ._evaluation import DEPLOYED, PROBE, Evaluation
from ._refit import out_of_fold
from ._train_request import check_validation

N_SHAREGPT = 1000


def evaluate(
    model: Any,
    monitor: Monitor,
    prompts: Sequence[str],
    labels: Any,
    *,
    sources: Sequence[str] | None = None,
    everyday: Sequence[str] | None = None,
    sets: Mapping[str, PromptSet] | None = None,
    test: PromptSet | None = None,
    fpr: float = 0.01,
    sites: Sequence[str] | None = None,
    n_sharegpt: int = N_SHAREGPT,
    limit: int | None = None,
    val_fraction: float | None = None,
    split: str | None = None,
    seed: int | None = None,
    calibration: Sequence[str] | None = None,
    validation: Any = None,  # (prompts, labels) or (prompts, labels, sources)
    batch_size: int = 8,
    verbose: bool = True,
) -> Evaluation:
    """A monitor on the packaged outside-built sets, beside a linear probe trained on its own rows.

    ``prompts``, ``labels`` (and ``sources``) are what the monitor was trained on
    (``train_monitor``'s arguments); they are split again as it split them (its report records
    ``val_fraction``, ``split`` and ``seed``). The probe trains on the training rows, chooses ``C``
    and its site on the validation rows; its threshold and each order's flag ``fpr`` of the
    everyday benign validation prompts and the calibration prompts, the rows the monitor's
    threshold was set on. A monitor refit on every prompt (``report["refit"]``): the probe too
    trains on every prompt, its site and ``C`` by out-of-fold AUROC (as the monitor's order 1; its
    ``probe_val_auroc`` is then that AUROC), and every threshold is set on the everyday benign
    prompts' out-of-fold scores (the monitor's folds) and the calibration prompts'.

    Args:
        model: the model the monitor reads.
        monitor: a per-prompt monitor (pooled); its report says how it was split and calibrated.
        sources, everyday: as for ``train_monitor`` (default ``everyday``: the monitor's own).
        sets: ``{name: PromptSet}`` to measure on (default: :func:`tpc_hooks.data.outside_sets`
            with ``n_sharegpt`` ShareGPT first turns none of the prompts holds). A set's prompts
            that are among ``prompts`` are left out (``Evaluation.sets[name]["n_seen"]``).
        test: a labelled split of the monitor's own distribution, measured as ``test harmful``
            and ``test benign``.
        fpr: the rate of the probe's and the orders' thresholds.
        sites: further candidate sites of the probe (the monitor's site is always one).
        limit: at most this many prompts of each set (a seeded draw), for a quick look.
        calibration: the monitor's calibration prompts (``train_monitor(calibration=...)``);
            needed when it had some (its report counts them). Left out of the sets measured.
        validation: the monitor's own validation prompts (``train_monitor(validation=...)``);
            needed when it was given some (its report records their digest): the probe then trains
            on every one of ``prompts`` and chooses on these.

    Returns:
        An :class:`Evaluation`: ``to_markdown()``, ``to_html()``, ``plot()``, ``floor_gaps()``.

    Example:
        >>> ev = tpc.evaluate(model, monitor, train.texts, train.labels,  # doctest: +SKIP
        ...                   sources=tpc.data.source_names(train), everyday=tpc.data.EVERYDAY_SOURCES)
        >>> print(ev.to_markdown())  # doctest: +SKIP
    """
    items = check_prompts(prompts)
    y = check_labels(labels, len(items), "labels").numpy().astype(int)
    names = check_sources(sources, len(items), "prompt")
    if monitor.streaming:
        raise TPCHooksError(
            "evaluate compares a per-prompt monitor with a probe on the same pooled rows; this monitor "
            "scores every token (pooling='token'): score its prompts with monitor.score instead"
        )
    if monitor.report.get("split", {}).get("validation") == "given" or validation is not None:
        items, y, names, tr, va = _given_split(monitor, items, y, names, validation)
    else:
        tr, va = _split(monitor, items, y, val_fraction, split, seed)
    extra = _calibration(monitor, calibration)
    if everyday is None:
        everyday = monitor.report.get("operating_point", {}).get("everyday") if names is not None else None
    pool = np.arange(len(y)) if "refit" in monitor.report else va  # refit: every prompt's out-of-fold score counts
    everyday = everyday_present(everyday, None if names is None else names[pool])
    # everyday without sources: names is None, and indexing it raises (kept as it was)
    usual = np.ones(len(pool), bool) if everyday is None else everyday_rows(names[pool], everyday)  # type: ignore[index]
    on = pool[(y[pool] == 0) & usual]
    if not len(on):
        raise TPCHooksError("no everyday benign validation prompt to set the rate on")
    measured = _measured_sets(
        items, sets, test, n_sharegpt, limit, monitor.report.get("split", {}).get("seed", 0), extra
    )
    sites = list(dict.fromkeys([monitor.site, *(sites or ())]))
    if verbose:  # what it costs, said before it runs
        sizes = {"training prompts (the probe's)": len(items), "calibration": len(extra)}
        sizes |= {k: len(ps) for k, (ps, _) in measured.items()}
        note = f"at most {limit} of each set" if limit else "each set whole; limit=N scores at most N of each"
        tqdm.write(cost_line("evaluate", sizes, note), file=sys.stderr)
    every = [*items, *extra, *(t for ps, _ in measured.values() for t in ps.texts)]
    acts = collect(
        model,
        every,
        sites,
        monitor.pooling,
        batch_size=batch_size,
        chat_template=monitor.chat_template,
        prepend_bos=monitor.prepend_bos,
        max_tokens=monitor.max_tokens,
        sae=monitor.sae,
        progress=verbose,
    )
    cut = np.cumsum([len(items), len(extra), *(len(ps) for ps, _ in measured.values())])
    rows = {s: np.split(acts[s].float().numpy(), cut[:-1]) for s in acts}
    train = {s: rows[s][0] for s in sites}
    found = {name: ({s: rows[s][i + 2] for s in rows}, ps.labels) for i, (name, (ps, _)) in enumerate(measured.items())}
    ev = evaluate_activations(
        monitor,
        train,
        y,
        tr,
        va,
        on,
        found,
        fpr=fpr,
        seed=int(seed or 0),
        calibration={s: rows[s][1] for s in sites} if extra else None,
    )
    return _with_seen(ev, {k: n for k, (_, n) in measured.items()})


def evaluate_activations(
    monitor: Monitor,
    train: Mapping[str, np.ndarray],
    labels: np.ndarray,
    tr: np.ndarray,
    va: np.ndarray,
    everyday: np.ndarray,
    sets: Mapping[str, tuple[Any, Sequence[int]]],
    *,
    fpr: float = 0.01,
    seed: int = 0,
    calibration: Any = None,
) -> Evaluation:
    """:func:`evaluate` on activations already read: ``train[site]`` the pooled rows of the
    monitor's prompts at each candidate site of the probe (the monitor's site among them),
    ``labels`` theirs, ``tr`` / ``va`` the positions it trained and validated on, ``everyday`` the
    positions (in ``va``) of the everyday benign validation prompts; ``sets[name] = (rows, labels)``
    with ``rows`` a ``{site: array}`` or the monitor's site's array (then the probe's site must be
    the monitor's); ``calibration`` the rows of the monitor's calibration prompts (the same forms),
    which join the everyday ones.

    Example:
        >>> X = {monitor.site: train_rows}  # doctest: +SKIP
        >>> ev = tpc.evaluate_activations(  # doctest: +SKIP
        ...     monitor, X, labels, tr, va, everyday, {"past": (past_rows, [1] * 730)}
        ... )
    """
    y = np.asarray(labels).astype(int)
    if monitor.site not in train:
        raise TPCHooksError(f"train has no rows at the monitor's site {monitor.site!r}; it has {sorted(train)}")
    refit = None  # a monitor refit on every prompt: so is the probe, site and C by out-of-fold AUROC (scores kept)
    if "refit" in monitor.report:
        folds, seed_ = int(monitor.report["refit"]["folds"]), int(monitor.report.get("split", {}).get("seed", 0))
        every = {s: _everywhere(Z, y, folds, seed_) for s, Z in train.items()}
        site = max(every, key=lambda s: every[s][3])  # the first best: the candidates' order breaks ties
        score, C, refit, auc = every[site]
    else:
        fits = {s: _probe(Z[tr], y[tr], Z[va], y[va], seed) for s, Z in train.items()}
        site = max(fits, key=lambda s: fits[s][2])  # the first best: the candidates' order breaks ties
        score, C, auc = fits[site]
    at = lambda v, s: v[s] if isinstance(v, Mapping) else (v if s == monitor.site else None)  # noqa: E731
    if any(at(v, site) is None for v, _ in sets.values()):
        raise TPCHooksError(f"the probe chose {site!r}, but the sets' rows are only at the monitor's site")
    if calibration is not None and at(calibration, site) is None:
        raise TPCHooksError(f"the probe chose {site!r}, but the calibration rows are only at the monitor's site")

    def ref(s):
        return train[s][everyday] if calibration is None else np.concatenate([train[s][everyday], at(calibration, s)])  # noqa: E731

    base = {"everyday": ref(monitor.site), **{k: at(v, monitor.site) for k, (v, _) in sets.items()}}
    scores = {PROBE: {"everyday": score(ref(site)), **{k: score(at(v, site)) for k, (v, _) in sets.items()}}}
    with torch.no_grad():
        trunc = {
            k: monitor.head.truncations(torch.as_tensor(v, dtype=torch.float32)).double().numpy()
            for k, v in base.items()
        }
        hit = {
            k: flagged(
                monitor.policy()(torch.as_tensor(v, dtype=torch.float32)).decision_logits, monitor.threshold
            ).numpy()
            for k, v in base.items()
        }
    scores.update({f"order {n}": {k: v[:, n - 1] for k, v in trunc.items()} for n in range(1, monitor.head.degree + 1)})
    if refit is not None:  # trained on every prompt: each method's rate is set on out-of-fold scores
        cal = (None, None) if calibration is None else (at(calibration, monitor.site), at(calibration, site))
        hit["everyday"] = _refit_rates(monitor, scores, refit, train[monitor.site], y, everyday, cal, score)
    shares = {PROBE: {}, DEPLOYED: {k: float(v.mean()) for k, v in hit.items() if k != "everyday"}}
    curves: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for m, s in scores.items():
        t = threshold_at_fpr(s["everyday"], fpr)
        shares[m] = {k: float((v > t).mean()) for k, v in s.items() if k != "everyday"}
        curves[m] = {k: _curve(s["everyday"], v) for k, v in s.items() if k != "everyday"}
    return Evaluation(
        site=monitor.site,
        probe_site=site,
        probe_C=C,
        probe_val_auroc=auc,
        fpr=fpr,
        threshold=float(monitor.threshold),
        deployed_rate=float(hit["everyday"].mean()),
        n_everyday=int(len(base["everyday"])),
        kept=monitor.head.degree,
        sets={
            k: {"label": int(np.asarray(lab)[0]) if len(lab) else 0, "n": int(len(lab)), "n_seen": 0}
            for k, (_, lab) in sets.items()
        },
        shares=shares,
        curves=curves,
    )


def _refit_rates(
    monitor: Monitor,
    scores: dict[str, dict[str, np.ndarray]],
    probe_oof: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    on: np.ndarray,
    cal: tuple[Any, Any],
    probe: Any,
) -> np.ndarray:
    """For a monitor refit on every prompt (``report["refit"]``): each method's everyday reference in
    ``scores`` becomes, in place, the out-of-fold scores of the everyday benign prompts ``on`` (the
    probe's ``probe_oof``; each order's by :func:`~tpc_hooks.training._refit.out_of_fold` on the
    monitor's rows ``X``, the monitor's folds and seed) and the calibration rows' scores under the
    refit method (``cal``: at the monitor's site, at the probe's). Returns the deployed monitor's
    flags on its reference."""
    seed, folds = int(monitor.report.get("split", {}).get("seed", 0)), int(monitor.report["refit"]["folds"])
    at_monitor, at_probe = cal
    scores[PROBE]["everyday"] = np.concatenate([probe_oof[on], *([] if at_probe is None else [probe(at_probe)])])
    for n in range(1, monitor.head.degree + 1):
        ref = [out_of_fold(monitor.head.truncated(n), X, y, seed=seed, folds=folds)[on]]
        if at_monitor is not None:
            with torch.no_grad():
                ref.append(monitor.head(torch.as_tensor(at_monitor, dtype=torch.float32), order=n).double().numpy())
        scores[f"order {n}"]["everyday"] = np.concatenate(ref)
    full = scores[f"order {monitor.head.degree}"]["everyday"]
    return flagged(torch.as_tensor(full), monitor.threshold).numpy()


def _everywhere(X: np.ndarray, y: np.ndarray, folds: int, seed: int) -> tuple[Any, float, np.ndarray, float]:
    """The plain probe on every row, as the refit monitor's order 1: ``C`` (of ``PROBE_CS``, smallest
    first; ties go to the smaller) by the AUROC of its out-of-fold scores (scikit-learn's stratified
    ``folds``-fold split, shuffled by ``seed``). Returns its scoring function, ``C``, every row's
    out-of-fold score at that ``C`` and their AUROC."""
    split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    best = None
    for C in sorted(PROBE_CS):
        pipe = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=2000))
        oof = cross_val_predict(pipe, X, y, cv=split, method="decision_function")
        auc = float(roc_auc_score(y, oof))
        if best is None or auc > best[0]:
            best = (auc, float(C), oof, pipe)
    assert best is not None  # PROBE_CS is not empty
    auc, C, oof, pipe = best
    return pipe.fit(X, y).decision_function, C, oof, auc


def _probe(Xtr: np.ndarray, ytr: np.ndarray, Xva: np.ndarray, yva: np.ndarray, seed: int) -> tuple[Any, float, float]:
    """The plain probe: standardised rows, logistic regression, ``C`` (of ``PROBE_CS``, smallest
    first; ties go to the smaller) by validation AUROC. Returns its scoring function, ``C`` and
    the AUROC."""
    scaler = StandardScaler().fit(Xtr)
    best = None
    for C in sorted(PROBE_CS):
        lr = LogisticRegression(C=C, max_iter=2000, random_state=seed).fit(scaler.transform(Xtr), ytr)
        auc = float(roc_auc_score(yva, lr.decision_function(scaler.transform(Xva))))
        if best is None or auc > best[2]:
            best = (lr, C, auc)
    assert best is not None  # PROBE_CS is not empty
    lr, C, auc = best
    return (lambda X: lr.decision_function(scaler.transform(X))), float(C), auc


def _curve(benign: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The share of ``other`` flagged against the share of ``benign`` flagged, as the threshold sweeps."""
    rate, share, _ = roc_curve(np.r_[np.zeros(len(benign)), np.ones(len(other))], np.r_[benign, other])
    return rate, share


def _split(
    monitor: Monitor, items: list[str], y: np.ndarray, val_fraction: Any, split: Any, seed: Any
) -> tuple[np.ndarray, np.ndarray]:
    """The monitor's own train / validation positions: its report's split settings unless given."""
    recorded = monitor.report.get("split", {})
    val_fraction = recorded.get("val_fraction", 0.2) if val_fraction is None else val_fraction
    how = recorded.get("split", "stratified") if split is None else split
    seed = recorded.get("seed", 0) if seed is None else seed
    tr, va = split_positions(items, y, val_fraction, how, seed)
    n = monitor.report.get("n_train")
    if n is not None and n != len(tr):
        raise TPCHooksError(
            f"the monitor trained on {n} prompts, but these prompts split into {len(tr)} training "
            "prompts: pass the prompts and labels the monitor was trained on (and val_fraction, split "
            "and seed when its report does not record them)"
        )
    return tr, va


def _given_split(
    monitor: Monitor, items: list[str], y: np.ndarray, names: np.ndarray | None, validation: Any
) -> tuple[list[str], np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """The monitor's own validation prompts (``train_monitor(validation=...)``) after its training prompts:
    the joined prompts, labels and sources, and the training and validation positions."""
    recorded = monitor.report.get("split", {})
    if validation is None or recorded.get("validation") != "given":
        raise TPCHooksError(
            "this monitor chose on validation prompts given to train_monitor(validation=...): pass the same "
            "validation= here"
            if validation is None
            else "this monitor held out its own validation split; leave validation out (pass the prompts it "
            "was trained on)"
        )
    v_items, v_y, v_names = check_validation(validation, items, y, names)
    if prompts_digest(v_items) != recorded.get("val_sha256"):
        raise TPCHooksError(
            "these validation prompts are not the ones the monitor chose on (their digest differs from its "
            "report's): pass the validation= it was trained with, in order"
        )
    n = monitor.report.get("n_train")
    if n is not None and n != len(items):
        raise TPCHooksError(f"the monitor trained on {n} prompts; got {len(items)}: pass the prompts it was trained on")
    joined = None if names is None else np.concatenate([names, v_names])
    return (
        items + v_items,
        np.concatenate([y, v_y]),
        joined,
        np.arange(len(items)),
        np.arange(len(items), len(items) + len(v_items)),
    )


def _measured_sets(
    items: list[str],
    sets: Any,
    test: PromptSet | None,
    n_sharegpt: int,
    limit: int | None,
    seed: int,
    calibration: Sequence[str] = (),
) -> dict[str, tuple[PromptSet, int]]:
    """The sets to measure on, each without the prompts ``items`` and ``calibration`` hold, drawn
    down to ``limit``: ``{name: (set, how many were left out as seen)}``."""
    items = [*items, *calibration]
    if sets is None:
        sets = outside_sets(n_sharegpt=n_sharegpt, exclude=[*items, *(test.texts if test else ())], seed=seed)
    out: dict[str, PromptSet] = {}
    if test is not None:
        y = np.asarray(test.labels)
        out = {
            "test harmful": test.subset(np.flatnonzero(y == 1).tolist()),
            "test benign": test.subset(np.flatnonzero(y == 0).tolist()),
        }
    out.update(sets)
    seen = {norm(t) for t in items}
    measured = {}
    for name, ps in out.items():
        if len(set(ps.labels)) > 1:
            raise TPCHooksError(f"set {name!r} mixes labels; give each set one label (harmful or benign)")
        keep = [i for i, t in enumerate(ps.texts) if norm(t) not in seen]
        if limit is not None and len(keep) > limit:
            keep = sorted(rng(seed, f"evaluate-{name}").sample(keep, limit))
        if not keep:
            raise TPCHooksError(
                f"set {name!r} has no prompt left to measure (empty, or every prompt is a training "
                "or validation prompt)"
            )
        measured[name] = (ps.subset(keep), sum(norm(t) in seen for t in ps.texts))
    return measured


def _calibration(monitor: Monitor, calibration: Any) -> list[str]:
    """The monitor's calibration prompts, checked against the count its report records."""
    split = monitor.report.get("split", {})
    n = split.get("n_calibration", 0)
    texts = [] if calibration is None else check_prompts(calibration)
    if len(texts) != n:
        raise TPCHooksError(
            f"the monitor's threshold was set with {n} calibration prompts; got {len(texts)}: pass "
            "the calibration= list it was trained with"
            if n
            else "this monitor was trained without calibration prompts; leave calibration out"
        )
    if texts and split.get("calibration_sha256", prompts_digest(texts)) != prompts_digest(texts):
        raise TPCHooksError(
            f"these {n} calibration prompts are not the ones the monitor's threshold was set on (their "
            "digest differs from its report's): pass the calibration= list it was trained with, in order"
        )
    return texts


def _with_seen(ev: Evaluation, seen: dict[str, int]) -> Evaluation:
    for k, v in ev.sets.items():
        v["n_seen"] = seen.get(k, 0)
    return ev
