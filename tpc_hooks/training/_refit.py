"""A trained head's choices on new rows: :func:`refit` trains the same head again, nothing chosen
again (order 1's ``C``; each higher degree's grid point, epochs and shrinkage scale), and
:func:`out_of_fold` scores every row with a head refit on the other folds: what a threshold set
after a refit on every row is set on.
"""

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from .._errors import TPCHooksError
from ..head import TPC, History
from ..monitoring import everyday_present
from ..monitoring import logits as calibrate_logits
from ._engine import Trainer, default_device, fit_probe, init_degree, new_head, split_data
from ._train import CALIBRATION, TrainPlan
from ._train_request import Request

FOLDS = 5  # out-of-fold scores: scikit-learn's default number of folds


def refit(head: TPC, X: Any, y: Any, *, C: float | None = None, device: Any = None, verbose: bool = False) -> TPC:
    """``head`` trained again on rows ``X`` (pooled ``[n, d_model]``) and labels ``y``, with every
    choice its fit made kept: the scaler is fitted on ``X``, order 1 is scikit-learn's logistic
    regression at the ``C`` it chose, and each degree ``k >= 2`` is trained at its chosen grid point
    (``lr``, ``weight_decay``, ``dropout``) for its best epoch's count of epochs, then bounded by the
    trust region of ``X`` and scaled by its chosen shrinkage. Nothing is selected on ``X``. ``C``:
    order 1's, in place of the one chosen.

    The head must come from the progressive fit of plain rows (no ``consistency`` penalty, no
    ``contrast`` pairs): those read rows a new set of prompts does not carry.

    Example:
        >>> from tpc_hooks.synthetic import make_problem
        >>> import tpc_hooks as tpc
        >>> X, y = make_problem(n=400, d_model=8, seed=0)
        >>> head = tpc.fit(X[:300], y[:300], X[300:], y[300:], degree=2, rank=2, epochs=3, verbose=False)
        >>> again = refit(head, X, y)
        >>> again.degree, again.history.selected[1]["C"] == head.history.selected[1]["C"]
        (2, True)
    """
    history = head.history
    if not isinstance(history, History) or history.config is None or history.mode != "progressive":
        raise TPCHooksError("refit needs a head trained by tpc.fit in progressive mode (its history holds the choices)")
    cfg = history.config
    if cfg.consistency or cfg.experimental["contrast"]:
        raise TPCHooksError("refit trains on plain rows: a head fitted with consistency or contrast cannot be refit")
    sel = history.selected
    dev = default_device(device)
    tr, y_tr, va, y_va = split_data(X, y, X, y, cfg.val_fraction, cfg.seed, head.d_model, dev)
    new, fresh, cfg = new_head(tr, replace(cfg, degree=head.degree, rank=list(head.ranks)).resolved())
    new.to(dev)
    new.requires_grad_(False)
    tr.hold_standardized(new.scaler, dev)
    va.hold_standardized(new.scaler, dev)
    C = sel[1]["C"] if C is None else C
    chosen = {1: {**sel[1], "C": C, "refit": True}}
    fit_probe(new, tr, y_tr, va, y_va, [C], cfg.max_iter, cfg.linear_solver, dev, fresh.records)
    train = Trainer(new, tr, y_tr, va, y_va, cfg, dev, verbose, fresh.records)
    base = cfg.train_config()
    for k in range(2, new.degree + 1):
        s = sel[k]
        init_degree(new, k, cfg.seed)
        if s["best_epoch"] >= 0:  # -1: the term stayed at lambda_k = 0
            grown = cfg.experimental["decay_growth"] ** (k - 2)  # degree() grows the weight decay again
            train.configs = [
                replace(
                    base,
                    lr=s["lr"],
                    weight_decay=s["weight_decay"] / grown,
                    dropout=s["dropout"],
                    epochs=s["best_epoch"] + 1,
                    patience=None,
                    keep_best=False,
                )
            ]
            train.degree(k, train.prefix(k))
        if cfg.trust_region:
            train.bound([k])
        if "scale" in s:
            with torch.no_grad():
                new.lambdas[str(k)].mul_(s["scale"])
        chosen[k] = {**s, "refit": True}
    if cfg.trust_region and new.degree > 1:
        new.gate = bool(cfg.gate)
    new.escalate_only = bool(cfg.escalate_only)
    fresh.selected, fresh.config = chosen, replace(cfg, gate=new.gate)
    new.history = fresh
    new.requires_grad_(True)
    return new.cpu().eval()


def out_of_fold(
    head: TPC, X: Any, y: Any, *, seed: int = 0, folds: int = FOLDS, C: float | None = None, device: Any = None
) -> np.ndarray:
    """Every row's logit (``head``'s full order) under a head :func:`refit` (at ``C`` when given) on
    the other folds (scikit-learn's stratified ``folds``-fold split, shuffled by ``seed``): scores of
    rows the scoring head never trained on, for every row."""
    from sklearn.model_selection import StratifiedKFold

    labels = np.asarray(y).astype(int).ravel()
    out = np.empty(len(labels), dtype=np.float64)
    split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    Xt = torch.as_tensor(np.asarray(X)) if not isinstance(X, torch.Tensor) else X
    for fit_rows, held in split.split(np.zeros(len(labels)), labels):
        part = refit(head, Xt[torch.as_tensor(fit_rows)], labels[fit_rows], C=C, device=device)
        with torch.no_grad():  # the monitor's decision without a cascade: the full order (FixedOrder)
            out[held] = part(Xt[torch.as_tensor(held)].float()).double().numpy()
    return out


def settle(
    monitor: Any,
    X: Mapping[str, Any],
    y: np.ndarray,
    *,
    calibration: Mapping[str, Any] | None = None,
    sources: np.ndarray | None = None,
    everyday: Any = None,
    target_fpr: float | None,
    seed: int,
) -> None:
    """``train_monitor``'s last step without ``validation=``: the monitor's head (chosen on its own
    split) :func:`refit` on every prompt (``X[site]``, ``y``), and its threshold set at ``target_fpr``
    of the benign prompts' :func:`out_of_fold` scores (of the ``everyday`` sources when named) and of
    the ``calibration`` rows' scores under the refit head (neither trained on them).

    A head of order 1 alone is the linear probe: its site (among ``X``'s, the candidates in order)
    and ``C`` (among its fit's candidates) are chosen again, by the AUROC of every prompt's
    out-of-fold scores (ties: the first site, then the lower log loss), as a probe trained on every
    prompt is chosen by cross-validation; one split of a few hundred prompts chooses them less
    surely. A head with higher orders keeps the split's site and ``C`` (its orders were chosen on
    top of them). ``monitor.report["refit"]`` says what was trained on, how the site and ``C`` were
    chosen and what the threshold was set on."""
    head, labels = monitor.head, np.asarray(y).astype(int)
    folds = min(FOLDS, int(np.bincount(labels, minlength=2).min()))  # a few prompts: as many folds as the rarer class
    split_site = monitor.site
    site, C, scores, by = _chosen(head, X, split_site, labels, folds, seed)
    if site != monitor.site:
        monitor.config = replace(monitor.config, site=site)
    monitor.head = refit(head, X[site], labels, C=C)
    how = f"out-of-fold scores ({folds} folds)"
    monitor.report["refit"] = {
        "n": int(len(labels)),
        "folds": folds,
        "site": site,
        "C": C,
        "chosen_by": by,
        "site_split": split_site,
        "C_split": float(head.history.selected[1]["C"]),
        "threshold": how,
    }
    if target_fpr is None:
        return
    benign = np.flatnonzero(labels == 0)
    decisions = scores[benign]
    names = None if sources is None else np.asarray(sources, dtype=object)[benign]
    if calibration is not None:
        with torch.no_grad():
            cal = monitor.head(torch.as_tensor(calibration[site]).float()).double().numpy()
        decisions = np.concatenate([decisions, cal])
        names = None if names is None else np.concatenate([names, np.full(len(cal), CALIBRATION, dtype=object)])
        how += " and the calibration prompts under the refit head"
        monitor.report["refit"]["threshold"] = how
    calibrate_logits(monitor, decisions, target_fpr, how, names, everyday_present(everyday, names))


def _chosen(
    head: TPC, X: Mapping[str, Any], site: str, y: np.ndarray, folds: int, seed: int
) -> tuple[str, float, np.ndarray, str]:
    """The site and order 1's ``C`` for the refit, every row's out-of-fold score there, and how they
    were chosen: by out-of-fold AUROC among ``X``'s sites and the fit's candidate ``C`` for a head of
    order 1 alone (ties: the first site, then the lower log loss), else the split's."""
    from sklearn.metrics import log_loss, roc_auc_score

    split_c = float(head.history.selected[1]["C"])
    cands = tuple(head.history.config.Cs or ()) if head.degree == 1 else ()
    if len(cands) * len(X) < 2:
        oof = out_of_fold(head, X[site], y, seed=seed, folds=folds)
        return site, split_c, oof, "the split (orders above 1 were chosen on top of its site and C)"
    best = None
    for rank, (s, rows) in enumerate(X.items()):
        for c in cands:
            oof = out_of_fold(head, rows, y, seed=seed, folds=folds, C=c)
            key = (-roc_auc_score(y, oof), rank, log_loss(y, 1 / (1 + np.exp(-np.clip(oof, -30, 30)))))
            if best is None or key < best[0]:
                best = (key, s, float(c), oof)
    assert best is not None
    _, s, c, oof = best
    return s, c, oof, f"out-of-fold AUROC ({folds} folds) on every prompt, over {len(X)} site(s) and {len(cands)} C"


def rechoose_on_validation(
    monitor: Any,
    X: Mapping[str, Any],
    y: np.ndarray,
    X_val: Mapping[str, Any],
    y_val: np.ndarray,
    *,
    benign: Mapping[str, Any],
    sources: np.ndarray | None = None,
    everyday: Any = None,
    target_fpr: float | None,
) -> None:
    """``train_monitor`` with ``validation=``, order 1 alone kept (the probe): its site and ``C``
    chosen again by the AUROC of the validation prompts as given (``X_val[site]``, ``y_val``) over
    ``X``'s sites (in order: a tie goes to the first, then to the lower log loss) and the fit's
    candidate ``C``, as a probe trained on the training prompts and chosen on a validation split
    is; the head :func:`refit` there on ``X[site]``, ``y`` and the threshold set again on the
    ``benign[site]`` rows (the benign validation prompts of the everyday sources and the calibration
    prompts, with their ``sources``). ``report["rechosen"]`` records the choice."""
    from sklearn.metrics import log_loss, roc_auc_score

    head = monitor.head
    labels, val = np.asarray(y).astype(int), np.asarray(y_val).astype(int)
    best = None
    for rank, s in enumerate(X):
        for c in tuple(head.history.config.Cs or ()):
            part = refit(head, X[s], labels, C=c)
            with torch.no_grad():
                z = part(torch.as_tensor(X_val[s]).float()).double().numpy()
            key = (-roc_auc_score(val, z), rank, log_loss(val, 1 / (1 + np.exp(-np.clip(z, -30, 30)))))
            if best is None or key < best[0]:
                best = (key, s, float(c), part)
    assert best is not None
    _, site, C, part = best
    monitor.report["rechosen"] = {
        "n": int(len(labels)),
        "site": site,
        "C": C,
        "chosen_by": f"validation AUROC over {len(X)} site(s) and {len(head.history.config.Cs or ())} C",
        "site_split": monitor.site,
        "C_split": float(head.history.selected[1]["C"]),
        "threshold": "the benign validation prompts",
    }
    if site != monitor.site:
        monitor.config = replace(monitor.config, site=site)
    monitor.head = part
    if target_fpr is not None:
        monitor.calibrate_activations(
            torch.as_tensor(benign[site]).float(),
            target_fpr,
            sources=sources,
            everyday=everyday_present(everyday, sources),
        )


def _plain(r: Request) -> bool:
    """The default recipe's pooled, progressive fit of the prompts as given (no rewrites, flips,
    consistency or contrast rows): the fits :func:`refit` reproduces on other rows."""
    extra = r.families or r.kinds or r.cfg.consistency or r.cfg.experimental["contrast"]
    return r.recipe == "default" and not extra and r.cfg.mode == "progressive" and not r.streaming


def refits(r: Request) -> bool:
    """Whether the head chosen on ``train_monitor``'s own split is refit on every prompt
    (:func:`settle`): a plain fit (:func:`_plain`) without ``validation=`` or a cascade. A validation
    set handed in is never trained on; the presets train on rows (rewrites, intent flips, homonyms)
    only the training prompts have, and a cascade's exits are calibrated on the split."""
    return _plain(r) and not r.validation_given and r.options.tau is None


def last_step(
    monitor: Any,
    r: Request,
    at: Mapping[str, list[Any]],
    rows: Mapping[str, Callable[[list[Any]], Any]],
    plan: TrainPlan,
) -> None:
    """``train_monitor``'s step after :func:`~tpc_hooks.training._train.train`: without
    ``validation=``, :func:`settle` (``plan.refit``); with it, a plain fit of order 1 alone without
    a cascade or an SAE takes :func:`rechoose_on_validation`. ``at``: the text positions of each
    part (``train``, ``val``, ``calibration``); ``rows[site](positions)``: their rows."""
    tau, sae, target_fpr = r.options.tau, r.options.sae, r.options.target_fpr
    if plan.refit:
        every = list(range(len(r.items)))
        # order 1 alone (the probe) chooses its site again among the candidates; an SAE reads one site
        sites = r.sites if monitor.head.degree == 1 and sae is None else [monitor.site]
        settle(
            monitor,
            {s: rows[s](every) for s in sites},
            r.y,
            calibration={s: rows[s](at["calibration"]) for s in sites} if r.calibration else None,
            sources=r.sources,
            everyday=plan.everyday,
            target_fpr=target_fpr,
            seed=r.cfg.seed,
        )
    elif _plain(r) and r.validation_given and tau is None and sae is None and monitor.head.degree == 1:
        # the benign validation prompts as given and the calibration prompts: the split's threshold rows
        on = [i for i in at["val"] if r.y[i] == 0] + list(at["calibration"])
        names = None
        if r.sources is not None:
            given = [str(r.sources[i]) for i in at["val"] if r.y[i] == 0]
            names = np.asarray(given + [CALIBRATION] * len(at["calibration"]), dtype=object)
        rechoose_on_validation(
            monitor,
            {s: rows[s](at["train"]) for s in r.sites},
            r.y[r.tr],
            {s: rows[s](at["val"]) for s in r.sites},
            r.y[r.va],
            benign={s: rows[s](on) for s in r.sites},
            sources=names,
            everyday=plan.everyday,
            target_fpr=target_fpr,
        )
