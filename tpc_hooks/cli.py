"""The ``tpc-hooks`` command line.

Only ``demo`` exists so far, and it runs on a bundled synthetic problem: the real-model
demo (SmolLM2-135M-Instruct on packaged prompt sets) and the other verbs come with the
adapters and CLI work.
"""

import argparse
import datetime as _dt
import json
import logging
import sys
import time
from pathlib import Path

import torch

from .cascade import Cascade
from .metrics import classification_metrics
from .synthetic import make_problem
from .training import fit


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def _demo(args: argparse.Namespace) -> int:
    n, d, epochs = (3000, 32, 10) if args.quick else (20000, 128, 30)
    out = Path(args.out or Path("runs") / _dt.datetime.now().strftime("demo-%Y%m%d-%H%M%S"))
    print("tpc-hooks demo: SYNTHETIC activations with planted interactions (placeholder until the\n"
          "real-model demo exists; these numbers say nothing about language models).")
    print(f"data: {n} train / {n // 4} val / {n // 2} test rows, d_model={d}; degree 5, rank 16, {epochs} epochs per degree\n")
    Xtr, ytr = make_problem(n, d, seed=args.seed, world=0)
    Xva, yva = make_problem(n // 4, d, seed=args.seed + 1, world=0)
    Xte, yte = make_problem(n // 2, d, seed=args.seed + 2, world=0)
    t0 = time.perf_counter()
    head = fit(Xtr, ytr, Xva, yva, degree=5, rank=16, epochs=epochs, seed=args.seed, verbose=not args.no_progress)
    t_fit = time.perf_counter() - t0
    z = torch.as_tensor(Xte)
    rows = []
    with torch.no_grad():
        for order in range(1, head.degree + 1):
            m = classification_metrics(yte, head(z, order=order))
            c = head.cost(order)
            rows.append([str(order), f"{m['f1']:.4f}", f"{m['recall']:.4f}", f"{m['frr']:.4f}", f"{m['auroc']:.4f}",
                         str(c.params), str(c.flops)])
    print("Safety dial (test split): every truncation of one polynomial")
    print(_table(["order", "F1", "recall", "FRR", "AUROC", "params", "FLOPs"], rows))
    cascade = Cascade(head).calibrate(Xva, yva)
    sweep = cascade.sweep(Xte, yte, taus=(0.0, 0.05, 0.1, 0.2, 0.3, 0.5))
    print("\nCascade (calibrated per order; FLOPs relative to the linear probe)")
    print(_table(["tau", "F1", "mean FLOPs / linear", "exits per order 1..5"],
                 [[f"{r['tau']:g}", f"{r['f1']:.4f}", f"{r['relative_flops']:.2f}", str(r["exit_histogram"])] for r in sweep]))
    saved = head.save(out / "head")
    (out / "results.json").write_text(json.dumps({"orders": rows, "cascade": sweep, "fit_seconds": t_fit}, indent=1))
    print(f"\ntraining took {t_fit:.1f} s; head saved to {saved}; results in {out / 'results.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tpc-hooks`` console script."""
    parser = argparse.ArgumentParser(prog="tpc-hooks", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    demo = sub.add_parser("demo", help="train and evaluate a TPC end to end (synthetic placeholder for now)")
    demo.add_argument("--quick", action="store_true", help="a small run for CI (seconds)")
    demo.add_argument("--out", help="run directory (default: runs/demo-<timestamp>)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--no-progress", action="store_true", help="hide progress bars")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return {"demo": _demo}[args.verb](args)


if __name__ == "__main__":
    sys.exit(main())
