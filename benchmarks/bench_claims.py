"""The paper's claims on the offline default (SmolLM2-135M-Instruct, packaged prompt set), several seeds.

1. Safety dial: F1 (and accuracy, precision, recall, FRR) at every order for TPC vs linear,
   bilinear, parameter-matched MLP and early-exit MLP, on the test split and the held-out source.
2. Cascade: F1 vs mean FLOPs across tau, TPC vs early-exit MLP; target: within 0.5 F1 points of
   the full TPC at <= 1.5x the linear probe's mean FLOPs.
3. Progressive vs joint training: F1 of every truncation.
4. Layer sweep: linear probe and TPC at several layers, all collected in one forward pass.
5. Calibration (ECE per order, before/after per-order calibration) and accuracy per category.

Activations are collected once into resumable stores (``--cache``). The same splits for every
method; seeds vary the training. Nothing is tuned on the test split. Prints mean +- std tables.
Run: ``python benchmarks/bench_claims.py [--seeds 5] [--layers 10 15 20 25] [--epochs 50]``.
"""

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from _results import add_results_argument, recording, results_path

import tpc_hooks as tpc
from tpc_hooks import offline
from tpc_hooks.baselines import compare, early_exit_cascade
from tpc_hooks.data import default_prompt_set
from tpc_hooks.metrics import classification_metrics

TAUS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)


def ms(v: list[float]) -> str:
    return f"{100 * np.mean(v):.1f} ± {100 * np.std(v):.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--layers", type=int, nargs="+", default=[10, 15, 20, 25])
    ap.add_argument("--layer", type=int, default=20, help="the layer of claims 1, 2, 3 and 5")
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--cache", default=str(offline.cache_dir() / "bench-claims"))
    ap.add_argument("--json", default=None)
    add_results_argument(ap, "bench_claims")
    args = ap.parse_args(argv)
    with recording(results_path(args), argv):
        return run(args)


def run(args: argparse.Namespace) -> int:
    sets = default_prompt_set(seed=0)
    sites = [f"blocks.{L}.hook_resid_post" for L in sorted(set(args.layers) | {args.layer})]
    model = offline.load_model(toolkit="nnsight")
    X: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    for split, ps in sets.items():  # every layer from one forward pass per batch
        stores = tpc.collect(
            model,
            ps.texts,
            sites,
            "mean",
            chat_template=True,
            batch_size=8,
            store=Path(args.cache) / split,
            progress=True,
        )
        for s in sites:
            X[s][split] = stores[s].to_numpy()
    y = {k: np.asarray(v.labels) for k, v in sets.items()}
    main_site = f"blocks.{args.layer}.hook_resid_post"
    D = X[main_site]
    print(
        f"\nmachine: {os.cpu_count()} CPUs, torch {torch.__version__}; SmolLM2-135M-Instruct, mean pooling, chat "
        f"template; rows " + ", ".join(f"{k} {len(v)}" for k, v in sets.items()) + f"; {args.seeds} seeds; "
        f"degree 5, rank {args.rank}, up to {args.epochs} epochs\n"
    )

    dial = defaultdict(list)  # (split, method, order, metric) -> values over seeds
    casc = defaultdict(list)  # (which, tau, field) -> values
    cal = defaultdict(list)  # (order, before/after) -> ECE
    cats = defaultdict(list)  # (category) -> accuracy of the full TPC on the test split
    sweep = defaultdict(list)  # (layer, method, split) -> F1
    for seed in range(args.seeds):
        res = compare(
            D["train"],
            y["train"],
            D["val"],
            y["val"],
            D["test"],
            y["test"],
            degree=5,
            rank=args.rank,
            methods=("linear", "bilinear", "mlp", "early_exit", "tpc", "tpc_joint"),
            seed=seed,
            verbose=False,
            epochs=args.epochs,
        )
        for split, rows in (("test", res.rows), ("heldout", res.evaluate(D["heldout"], y["heldout"]))):
            for r in rows:
                for m in ("f1", "accuracy", "precision", "recall", "frr"):
                    dial[(split, r["method"], r["order"], m)].append(r[m])
        head = res.models["tpc"].cpu()
        cascade = tpc.Cascade(head).calibrate(D["val"], y["val"])
        for rep in cascade.calibration_report:
            cal[(rep["order"], "before")].append(rep["ece_before"])
            cal[(rep["order"], "after")].append(rep["ece_after"])
        for r in cascade.sweep(D["test"], y["test"], taus=TAUS):
            casc[("tpc", r["tau"], "f1")].append(r["f1"])
            casc[("tpc", r["tau"], "flops")].append(r["relative_flops"])
        ee = res.models["early_exit"].cpu()
        with torch.no_grad():
            for tau in TAUS:
                out = early_exit_cascade(ee, torch.as_tensor(D["test"]), tau=tau)
                casc[("early_exit", tau, "f1")].append(classification_metrics(y["test"], out.logits)["f1"])
                casc[("early_exit", tau, "flops")].append(out.mean_flops / head.cost(1).flops)
            pred = (head(torch.as_tensor(D["test"])) > 0).numpy()
        for c in sorted(set(sets["test"].sources)):
            idx = [i for i, s in enumerate(sets["test"].sources) if s == c]
            cats[c].append(float((pred[idx] == y["test"][idx]).mean()))
        for s in sites:
            h = tpc.fit(
                X[s]["train"],
                y["train"],
                X[s]["val"],
                y["val"],
                degree=5,
                rank=args.rank,
                epochs=args.epochs,
                seed=seed,
                verbose=False,
            )
            with torch.no_grad():
                for split in ("test", "heldout"):
                    for n, name in ((1, "linear"), (5, "tpc")):
                        f1 = classification_metrics(y[split], h(torch.as_tensor(X[s][split]), order=n))["f1"]
                        sweep[(s, name, split)].append(f1)
        print(f"seed {seed} done", file=sys.stderr)

    methods = ("linear", "bilinear", "mlp", "early_exit", "tpc", "tpc_joint")
    for split in ("test", "heldout"):
        print(f"## 1/3. F1 (%) by order, {split}" + (" (source never seen in training)" if split == "heldout" else ""))
        print("| method | " + " | ".join(f"order {n}" for n in range(1, 6)) + " |\n|---|" + "---|" * 5)
        for m in methods:
            cells = [ms(dial[(split, m, n, "f1")]) if dial[(split, m, n, "f1")] else "" for n in range(1, 6)]
            print(f"| {m} | " + " | ".join(cells) + " |")
        print(f"\n{split}, highest order of each method: accuracy / precision / recall / FRR (%)")
        print("| method | accuracy | precision | recall | FRR |\n|---|---|---|---|---|")
        for m in methods:
            top = max(n for n in range(1, 6) if dial[(split, m, n, "f1")])
            print(
                f"| {m} (order {top}) | "
                + " | ".join(ms(dial[(split, m, top, k)]) for k in ("accuracy", "precision", "recall", "frr"))
                + " |"
            )
        print()
    print("## 2. Cascade on the test split: F1 (%) and mean FLOPs / linear probe")
    print("| tau | TPC F1 | TPC FLOPs | early-exit MLP F1 | early-exit FLOPs |\n|---|---|---|---|---|")
    for tau in TAUS:
        print(
            f"| {tau:g} | {ms(casc[('tpc', tau, 'f1')])} | {np.mean(casc[('tpc', tau, 'flops')]):.2f} | "
            f"{ms(casc[('early_exit', tau, 'f1')])} | {np.mean(casc[('early_exit', tau, 'flops')]):.2f} |"
        )
    full = np.mean(dial[("test", "tpc", 5, "f1")])
    ok = [
        tau
        for tau in TAUS
        if np.mean(casc[("tpc", tau, "flops")]) <= 1.5 and np.mean(casc[("tpc", tau, "f1")]) >= full - 0.005
    ]
    print(
        f"\ntarget (within 0.5 F1 points of the full TPC, {100 * full:.1f}, at <= 1.5x linear FLOPs): "
        + (f"met at tau in {ok}" if ok else "not met at any tau")
    )
    print("\n## 4. Layer sweep: F1 (%), linear probe (order 1) and TPC (order 5)")
    print("| layer | linear test | TPC test | linear held-out | TPC held-out |\n|---|---|---|---|---|")
    for s in sites:
        print(
            f"| {s} | "
            + " | ".join(ms(sweep[(s, m, sp)]) for sp in ("test", "heldout") for m in ("linear", "tpc"))
            + " |"
        )
    print("\n## 5. Calibration: validation ECE (%) per order, before / after per-order temperature and bias")
    print("| order | before | after |\n|---|---|---|")
    for n in range(1, 6):
        print(f"| {n} | {ms(cal[(n, 'before')])} | {ms(cal[(n, 'after')])} |")
    print("\nAccuracy (%) of the full TPC per test source")
    print("| source | accuracy |\n|---|---|")
    for c, v in cats.items():
        print(f"| {c} | {ms(v)} |")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "dial": {"|".join(map(str, k)): v for k, v in dial.items()},
                    "cascade": {"|".join(map(str, k)): v for k, v in casc.items()},
                    "sweep": {"|".join(map(str, k)): v for k, v in sweep.items()},
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
