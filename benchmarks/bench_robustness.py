"""Out-of-distribution robustness: every method and order, in distribution and on held-out sources.

For each held-out configuration (one harmful and one benign source kept out of train/val/test by
``default_prompt_set(heldout=...)``) and each seed, trains on the same splits:

* the baselines: linear probe, bilinear, parameter-matched MLP per order, early-exit MLP;
* ``tpc_paper``: the paper's exact recipe (``fit(recipe="paper")``: 50 epochs per degree, the
  last epoch kept, the plain polynomial);
* ``tpc``: the default (trust region + gate + per-order shrinkage, early stopping);
* ablations of the default, one mechanism at a time: clipping only; no gate; no shrinkage;
  a wider trust region (margin 0.1); weight decay growing with the order (x3 per degree);
  the default plus ``escalate_only`` (higher orders may not clear what the linear probe flags);
  rank chosen by validation loss among 16 and 64; and the default trained with a validation
  set that contains a source the training set lacks (the harmful training source with the
  fewest rows moves from train to validation entirely);
* the calibrated cascade of ``tpc_paper`` and ``tpc`` at tau = 0.1 (threshold 0.9).

Prints F1 / recall / FRR (%) per order, mean +- std over seeds, on the test split (in
distribution) and the held-out split, plus the goal check (every order's held-out F1 >= the
linear probe's, within one std) and what the default costs in test F1 and in FLOPs.
Activations (SmolLM2-135M-Instruct, layer 20, mean pooling, chat template) are collected once per
configuration into ``--cache``. Run: ``python benchmarks/bench_robustness.py [--seeds 5]``.
"""

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from _results import add_results_argument, recording, results_path

import tpc_hooks as tpc
from tpc_hooks import offline
from tpc_hooks.baselines import compare
from tpc_hooks.data import default_prompt_set
from tpc_hooks.metrics import classification_metrics

CONFIGS = (("harmbench", "refusal_benign"), ("donotanswer", "overrefusal"), ("advbench", "sharegpt"))
SITE = "blocks.20.hook_resid_post"
VARIANTS = {  # name -> fit() keywords on top of the default
    "tpc clip only": {"gate": False, "shrink": False},
    "tpc no gate": {"gate": False},
    "tpc no shrink": {"shrink": False},
    "tpc margin 0.1": {"experimental": {"margin": 0.1}},
    "tpc decay x3/degree": {"experimental": {"decay_growth": 3.0}},
    "tpc + escalate-only": {"escalate_only": True},
}


def ms(v: list[float]) -> str:
    return f"{100 * np.mean(v):.1f} ± {100 * np.std(v):.1f}" if v else ""


def load(held: tuple[str, str], cache: Path, model_box: list) -> tuple[dict, dict, dict]:
    """Activations, labels and sources of every split; collects (resumably) what the cache lacks."""
    sets = default_prompt_set(seed=0, heldout=held)
    X = {}
    for split, ps in sets.items():
        path = cache / "+".join(held) / split
        try:
            store = tpc.ActivationStore.open(path / SITE)
        except tpc.TPCHooksError:
            store = None
        if store is None or len(store) != len(ps):
            if not model_box:
                model_box.append(offline.load_model(toolkit="nnsight"))
            store = tpc.collect(
                model_box[0], ps.texts, [SITE], "mean", chat_template=True, batch_size=8, store=path, progress=True
            )[SITE]
        X[split] = store.to_numpy()
    y = {k: np.asarray(v.labels) for k, v in sets.items()}
    return X, y, {k: np.asarray(v.sources) for k, v in sets.items()}


def mahalanobis_check(X: dict) -> str:
    """Would a Mahalanobis-distance gate see the held-out source? Rows beyond the validation
    split's 99th percentile, and the AUROC of the distance for held-out vs test rows."""
    from sklearn.covariance import LedoitWolf
    from sklearn.metrics import roc_auc_score

    mu, sd = X["train"].mean(0), X["train"].std(0) + 1e-6
    lw = LedoitWolf().fit((X["train"] - mu) / sd)
    d = {k: lw.mahalanobis((X[k] - mu) / sd) for k in ("val", "test", "heldout")}
    thr = np.quantile(d["val"], 0.99)
    auc = roc_auc_score(np.r_[np.zeros(len(d["test"])), np.ones(len(d["heldout"]))], np.r_[d["test"], d["heldout"]])
    return (
        f"beyond the validation 99th percentile: test {np.mean(d['test'] > thr):.1%}, held out "
        f"{np.mean(d['heldout'] > thr):.1%}; AUROC held-out vs test {auc:.3f}"
    )


def per_order(head, X: np.ndarray, y: np.ndarray) -> list[dict]:
    with torch.no_grad():
        s = head.terms(torch.as_tensor(X)).double().cumsum(-1)
    return [classification_metrics(y, s[:, n].numpy()) for n in range(head.degree)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument(
        "--configs", type=int, nargs="+", default=list(range(len(CONFIGS))), help="indices into " + str(CONFIGS)
    )
    ap.add_argument("--cache", default=str(offline.cache_dir() / "bench-robustness"))
    ap.add_argument("--json", default=None)
    add_results_argument(ap, "bench_robustness")
    args = ap.parse_args(argv)
    with recording(results_path(args), argv):
        return run(args)


def run(args: argparse.Namespace) -> int:
    res = defaultdict(list)  # (config, split, method, order, metric) -> values over seeds
    cost = defaultdict(list)  # (config, what) -> values
    model_box: list = []
    maha: dict[str, str] = {}
    t0 = time.time()
    for ci in args.configs:
        held = CONFIGS[ci]
        cfg = "+".join(held)
        X, y, src = load(held, Path(args.cache), model_box)
        maha[cfg] = mahalanobis_check(X)
        harmful = [s for s in dict.fromkeys(src["train"]) if y["train"][src["train"] == s].mean() == 1]
        moved = min(harmful, key=lambda s: int((src["train"] == s).sum()))
        keep = src["train"] != moved
        X_ood_val = np.concatenate([X["val"], X["train"][~keep]])
        y_ood_val = np.concatenate([y["val"], y["train"][~keep]])

        def record(method: str, metrics_by_split: dict[str, list[dict]], first_order: int = 1) -> None:
            for split, ms_ in metrics_by_split.items():
                for n, m in enumerate(ms_, first_order):
                    for k in ("f1", "recall", "frr"):
                        res[(cfg, split, method, n, k)].append(m[k])  # noqa: B023 (called within the iteration)

        for seed in range(args.seeds):
            cmp_ = compare(
                X["train"],
                y["train"],
                X["val"],
                y["val"],
                X["test"],
                y["test"],
                degree=5,
                rank=args.rank,
                methods=("linear", "bilinear", "mlp", "early_exit", "tpc_paper", "tpc"),
                seed=seed,
                verbose=False,
                epochs=args.epochs,
            )
            for split, rows in (("test", cmp_.rows), ("heldout", cmp_.evaluate(X["heldout"], y["heldout"]))):
                for r in rows:
                    for k in ("f1", "recall", "frr"):
                        res[(cfg, split, r["method"], r["order"], k)].append(r[k])
            heads = {"tpc_paper": cmp_.models["tpc_paper"].cpu(), "tpc": cmp_.models["tpc"].cpu()}
            for name, kw in VARIANTS.items():
                heads[name] = tpc.fit(
                    X["train"],
                    y["train"],
                    X["val"],
                    y["val"],
                    degree=5,
                    rank=args.rank,
                    epochs=args.epochs,
                    seed=seed,
                    verbose=False,
                    **kw,
                )
            small = tpc.fit(
                X["train"],
                y["train"],
                X["val"],
                y["val"],
                degree=5,
                rank=16,
                epochs=args.epochs,
                seed=seed,
                verbose=False,
            )
            vl = {
                h: float(
                    torch.nn.functional.binary_cross_entropy_with_logits(
                        h(torch.as_tensor(X["val"])), torch.as_tensor(y["val"], dtype=torch.float32)
                    )
                )
                for h in (small, heads["tpc"])
            }
            heads["tpc rank by val (16/64)"] = min(vl, key=vl.get)
            cost[(cfg, "rank16 chosen")].append(float(heads["tpc rank by val (16/64)"] is small))
            heads["tpc val with unseen source"] = tpc.fit(
                X["train"][keep],
                y["train"][keep],
                X_ood_val,
                y_ood_val,
                degree=5,
                rank=args.rank,
                epochs=args.epochs,
                seed=seed,
                verbose=False,
            )
            for name, h in heads.items():
                if name not in ("tpc_paper", "tpc"):
                    record(name, {sp: per_order(h, X[sp], y[sp]) for sp in ("test", "heldout")})
            d = heads["tpc"]
            with torch.no_grad():
                for sp in ("test", "heldout"):
                    cost[(cfg, f"gated {sp}")].append(float(d.outside(torch.as_tensor(X[sp])).float().mean()))
            cost[(cfg, "shrink scales")].append([d.history.selected[k].get("scale") for k in d.degrees])
            for name in ("tpc_paper", "tpc"):
                casc = tpc.Cascade(heads[name], tau=0.1).calibrate(X["val"], y["val"])
                for sp in ("test", "heldout"):
                    out = casc(torch.as_tensor(X[sp]))
                    m = classification_metrics(y[sp], out.probs.numpy(), from_logits=False)
                    for k in ("f1", "recall", "frr"):
                        res[(cfg, sp, f"{name} cascade tau=0.1", 0, k)].append(m[k])
                    cost[(cfg, f"{name} cascade flops {sp}")].append(out.mean_flops / heads[name].cost(1).flops)
            print(f"{cfg} seed {seed} done ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)

    print(
        f"\nmachine: {os.cpu_count()} CPUs, torch {torch.__version__}; SmolLM2-135M-Instruct layer 20, mean pooling; "
        f"{args.seeds} seeds; degree 5, rank {args.rank}, up to {args.epochs} epochs; F1 / recall / FRR in %, "
        "mean ± std over seeds\n"
    )
    methods = [
        "linear",
        "bilinear",
        "mlp",
        "early_exit",
        "tpc_paper",
        "tpc",
        *VARIANTS,
        "tpc rank by val (16/64)",
        "tpc val with unseen source",
    ]
    for ci in args.configs:
        cfg = "+".join(CONFIGS[ci])
        for split in ("test", "heldout"):
            title = (
                "in distribution (test split)"
                if split == "test"
                else f"held out: {CONFIGS[ci][0]} (harmful) + {CONFIGS[ci][1]} (benign)"
            )
            print(f"## {cfg}: {title}\n")
            for metric in ("f1", "recall", "frr"):
                print(
                    f"{metric.upper()}\n\n| method | "
                    + " | ".join(f"order {n}" for n in range(1, 6))
                    + " |\n|---|"
                    + "---|" * 5
                )
                for m in methods:
                    cells = [ms(res[(cfg, split, m, n, metric)]) for n in range(1, 6)]
                    if any(cells):
                        print(f"| {m} | " + " | ".join(cells) + " |")
                for m in ("tpc_paper cascade tau=0.1", "tpc cascade tau=0.1"):
                    print(
                        f"| {m} | {ms(res[(cfg, split, m, 0, metric)])} (mean FLOPs / linear "
                        f"{np.mean(cost[(cfg, m.split()[0] + ' cascade flops ' + split)]):.2f}) | | | | |"
                    )
                print()
        lin = res[(cfg, "heldout", "linear", 1, "f1")]
        print(f"### goal check, {cfg}: held-out F1 of every order >= linear probe's ({ms(lin)}) within one std")
        for m in ("tpc_paper", "tpc", *VARIANTS, "tpc rank by val (16/64)", "tpc val with unseen source"):
            ok = [
                np.mean(res[(cfg, "heldout", m, n, "f1")]) + np.std(res[(cfg, "heldout", m, n, "f1")]) >= np.mean(lin)
                for n in range(1, 6)
            ]
            gain = np.mean(res[(cfg, "test", m, 5, "f1")]) - np.mean(res[(cfg, "test", "linear", 1, "f1")])
            verdict = (
                "MET"
                if all(ok)
                else "not met (orders " + str([n for n, o in zip(range(1, 6), ok, strict=False) if not o]) + ")"
            )
            print(f"- {m}: {verdict}; test F1 gain of order 5 over linear {100 * gain:+.1f} points")
        print(
            f"- rows the default gates (left the trust region): test {ms(cost[(cfg, 'gated test')])}, "
            f"held out {ms(cost[(cfg, 'gated heldout')])}"
        )
        sc = np.array(cost[(cfg, "shrink scales")], dtype=float)
        print(f"- per-order shrinkage scales s_2..s_5 chosen (mean over seeds): {np.round(sc.mean(0), 2).tolist()}")
        print(
            f"- rank 16 chosen over 64 by validation loss in {int(sum(cost[(cfg, 'rank16 chosen')]))} of "
            f"{args.seeds} seeds"
        )
        print(f"- Mahalanobis gate (Ledoit-Wolf, standardised activations): {maha[cfg]}\n")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "results": {"|".join(map(str, k)): v for k, v in res.items()},
                    "cost": {"|".join(map(str, k)): v for k, v in cost.items()},
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
