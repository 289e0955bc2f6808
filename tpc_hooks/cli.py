"""The ``tpc-hooks`` command line.

``tpc-hooks demo`` runs the whole pipeline on the offline default model (SmolLM2-135M-Instruct)
and prompt set; the other verbs (collect, train, evaluate, monitor, attribute) are still to come.
"""
import argparse
import datetime as _dt
import logging
import sys
import time
from pathlib import Path




def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    out = Path(args.out or Path("runs") / _dt.datetime.now().strftime("demo-%Y%m%d-%H%M%S"))
    t0 = time.perf_counter()
    res = run_demo(out, toolkit=args.toolkit, model_name=args.model, layer=args.layer, quick=args.quick,
                   seed=args.seed, progress=not args.no_progress)
    n = res["degree"]
    for split in ("test", "heldout"):
        rows = [[m] + [f"{r['f1']:.3f}" for r in res["f1"][split] if r["method"] == m] for m in res["methods"]]
        rows = [r + [""] * (n + 1 - len(r)) for r in rows]
        print(f"\nF1 by order, {split}" + (" (source never seen in training)" if split == "heldout" else ""))
        print(_table(["method"] + [str(o) for o in range(1, n + 1)], rows))
    print("\nTPC cascade (test): " + ", ".join(f"tau={r['tau']:g}: F1 {r['f1']:.3f} at {r['relative_flops']:.1f}x linear"
                                             for r in res["cascade"]["tpc"] if r["tau"] in (0.0, 0.1, 0.3, 0.5)))
    print(f"\ndone in {time.perf_counter() - t0:.0f} s ({res['seconds']}); report: {out / 'report.md'}; "
          f"monitor: {out / 'monitor'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tpc-hooks`` console script."""
    parser = argparse.ArgumentParser(prog="tpc-hooks", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    demo = sub.add_parser("demo", help="collect, train, evaluate, monitor and attribute on the offline default model")
    demo.add_argument("--quick", action="store_true", help="a small run for CI (about 2 minutes)")
    demo.add_argument("--toolkit", choices=("transformer_lens", "nnsight"), default="transformer_lens")
    demo.add_argument("--model", default=None, help="hub id or local folder (default: the packaged SmolLM2-135M-Instruct)")
    demo.add_argument("--layer", type=int, default=20, help="residual-stream layer the monitor reads")
    demo.add_argument("--out", help="run directory (default: runs/demo-<timestamp>)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--no-progress", action="store_true", help="hide progress bars")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return {"demo": _demo}[args.verb](args)


if __name__ == "__main__":
    sys.exit(main())
