"""What the L1 penalty on the factors costs in F1, on the offline default data and model.

Collects mean-pooled activations of SmolLM2-135M-Instruct (chat template) at one layer for the
default prompt set (cached in a resumable store), trains a degree-5 TPC per ``l1`` value and
prints F1 per order on the test split and the held-out source, with how concentrated the
factors are (share of each factor's |U| mass in its top 5% of units, averaged).

Run: ``python benchmarks/bench_l1.py [--l1 0 1e-4 1e-3 1e-2] [--layer 20] [--seeds 1]``.
"""

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch
from _results import add_results_argument, recording, results_path

import tpc_hooks as tpc
from tpc_hooks import offline
from tpc_hooks.data import default_prompt_set
from tpc_hooks.metrics import classification_metrics


def activations(model, sets: dict, site: str, cache: Path) -> dict[str, np.ndarray]:
    out = {}
    for name, ps in sets.items():
        store = tpc.collect(
            model, ps.texts, site, "mean", chat_template=True, batch_size=8, store=cache / name, progress=True
        )[site]
        out[name] = store.to_numpy()
    return out


def concentration(head: tpc.TPC) -> float:
    shares = []
    for k in head.degrees:
        a = head.factors[str(k)].detach().abs()
        top = a.topk(max(1, a.shape[0] // 20), dim=0).values.sum(0)
        shares.append((top / a.sum(0).clamp_min(1e-12)).mean().item())
    return float(np.mean(shares))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--l1", type=float, nargs="+", default=[0.0, 1e-4, 1e-3, 1e-2])
    ap.add_argument("--layer", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--cache", default=str(offline.cache_dir() / "bench-l1"))
    add_results_argument(ap, "bench_l1")
    args = ap.parse_args(argv)
    with recording(results_path(args), argv):
        return run(args)


def run(args: argparse.Namespace) -> int:
    site = f"blocks.{args.layer}.hook_resid_post"
    sets = default_prompt_set(seed=0)
    model = offline.load_model(toolkit="nnsight")
    X = activations(model, sets, site, Path(args.cache) / site)
    y = {k: np.asarray(v.labels) for k, v in sets.items()}
    print(
        f"\nmachine: {os.cpu_count()} CPUs, torch {torch.__version__}; SmolLM2-135M-Instruct, {site}, mean pooling, "
        f"chat template; rows: " + ", ".join(f"{k} {len(v)}" for k, v in sets.items()) + "\n"
    )
    print("| l1 | seed | test F1 by order 1..5 | held-out F1 by order 1..5 | factor mass in top 5% units |")
    print("|---:|---:|---|---|---:|")
    for l1 in args.l1:
        for seed in range(args.seeds):
            head = tpc.fit(
                X["train"],
                y["train"],
                X["val"],
                y["val"],
                degree=5,
                rank=64,
                epochs=args.epochs,
                experimental={"l1": l1},
                seed=seed,
                verbose=False,
            )
            with torch.no_grad():
                f1 = {
                    s: [classification_metrics(y[s], head(torch.as_tensor(X[s]), order=n))["f1"] for n in range(1, 6)]
                    for s in ("test", "heldout")
                }

            def fmt(v):
                return " / ".join(f"{x:.3f}" for x in v)

            print(f"| {l1:g} | {seed} | {fmt(f1['test'])} | {fmt(f1['heldout'])} | {concentration(head):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
