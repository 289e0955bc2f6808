"""Training's cost as the rows grow: wall time and peak memory of each step of ``tpc-hooks train --acts``
and of ``train_monitor``'s training half, on synthetic rows at several counts and widths.

The rows are ``tpc_hooks.synthetic.make_problem``'s (a planted interaction, so the orders above 1
have something to find), written as ``tpc-hooks collect --dataset FILE`` writes a user's file: the
``train`` and ``val`` splits at ``tpc.data.split_positions``' 80/20 and the record of the split, and
the five ``val-<family>`` splits the default recipe validates on (each validation row again, drawn
under a planted shift of its own factor, with the validation rows' labels). The same rows reach
``train_monitor`` through a ``rows_cache`` that holds every text it asks for (the prompts and the
validation rewrites of ``tpc.data.rewrites``, in the order it makes them), so the model never runs;
the model is a one-layer random-initialised Llama of the width (it gives the rows' width and the
tokenizer, nothing else). Both paths train the same monitor, and each run prints how far apart
their thresholds are.

Each (path, rows, width) runs in a process of its own: its peak memory is the resident set's high-water
mark (``/proc/self/status`` ``VmHWM``, reset at each step's edges through ``/proc/self/clear_refs``)
above the resident set just before the call, in multiples of the bytes of the rows it reads (float32,
every split). Steps, each timed inclusive of the steps under it:

| step | what runs |
|---|---|
| read | the stores into memory (``train``), or the rows out of the cache (``train_monitor``) |
| order 1 | scikit-learn's logistic regression, once per ``C`` of the sweep, on the standardised rows |
| order k | ``U_k, lambda_k`` trained with everything below frozen, every grid point, early stopping |
| choice of orders | each order's recall at its own threshold on validation, against the order kept below |
| out-of-fold | the kept head refit on 4/5 of every prompt, five times, scoring the fifth left out |
| refit | the kept head refit on every prompt |
| threshold | the threshold from the benign prompts' out-of-fold scores |

Run (from the repository root; 2 CPU cores here, one used per run):

    python benchmarks/internals/bench_training_rows.py                       # 2k 8k 32k 64k x 576 2048
    python benchmarks/internals/bench_training_rows.py --rows 2000 --widths 576 --epochs 5   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch

import tpc_hooks as tpc
from tpc_hooks.data import rewrites, split_positions
from tpc_hooks.recipes import default as default_recipe
from tpc_hooks.synthetic import make_problem

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results
from _results import add_results_argument, recording, results_path  # noqa: E402

SITE = "blocks.0.hook_resid_post"
PAPER = (69_400, 5_376)  # WildGuardMix's prompts, Gemma-3-27B's width (the paper's scale)
SHIFTS = default_recipe().shifts  # the phrasing families the default validates on (collect writes each)
LATENT = 6 + len(SHIFTS)  # the label's six factors, and one factor for each family's shift
STEPS = [
    "read",
    "order 1",
    *[f"order {k}" for k in range(2, 6)],
    "choice of orders",
    "out-of-fold",
    "refit",
    "threshold",
]
REFITS = ("out-of-fold", "refit")  # also timed per epoch their orders ran (the epochs chosen depend on the data)
EPOCHS_OF = ": its orders / epoch"
ITERATION = "order 1 / solver iteration"  # order 1's seconds over its solver's iterations (summed over the C sweep)


# ---- the rows ----------------------------------------------------------------------------------------------


def texts(n: int) -> list[str]:
    """``n`` distinct requests the phrasing rewriters can work on."""
    return [f"How do I carry out step {i} of the procedure described in document {i % 97}?" for i in range(n)]


def rows(n: int, width: int, seed: int = 0) -> dict[str, Any]:
    """The prompts' rows and labels, the split (positions as ``collect`` records them) and each
    validation family's rows in ``tpc.data.rewrites``' order (``texts`` -> row for every text)."""
    prompts = texts(n)
    X, y = make_problem(n=n, d_model=width, seed=seed, world=0, latent=LATENT)
    tr, va = split_positions(prompts, y.tolist(), val_fraction=0.2, seed=seed)
    views = rewrites([prompts[i] for i in va], [int(y[i]) for i in va], list(SHIFTS), every_family=True, seed=seed)
    by_text = {t: X[i] for i, t in enumerate(prompts)}
    families: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for f, family in enumerate(SHIFTS):
        at = [i for i, c in enumerate(views.categories) if c == family]
        want = np.asarray([views.labels[i] for i in at])
        scale = [1.0] * len(SHIFTS)
        scale[f] = 3.0  # this family's phrasing: a shift along a factor of its own
        pool, pool_y = make_problem(
            n=4 * len(at) + 64, d_model=width, seed=seed + 10 + f, world=0, latent=LATENT, shift=scale
        )
        order = np.empty(len(at), dtype=int)
        for c in (0, 1):  # the first pool rows of each class, in the validation rows' order of labels
            have, need = np.flatnonzero(pool_y == c), int((want == c).sum())
            if len(have) < need:
                raise SystemExit(f"the {family} pool holds {len(have)} rows of class {c}, {need} needed")
            order[want == c] = have[:need]
        Xf = pool[order]
        families[family] = (Xf, want)
        by_text.update({views.texts[i]: Xf[j] for j, i in enumerate(at)})
    return {"X": X, "y": y, "tr": tr, "va": va, "prompts": prompts, "families": families, "by_text": by_text}


def write_store(data: dict[str, Any], out: Path) -> int:
    """The directory ``tpc-hooks collect --dataset FILE --no-intent`` writes for these rows; returns the
    bytes of every row written."""
    X, y, tr, va = data["X"], data["y"], data["tr"], data["va"]
    parts = {"train": (X[tr], y[tr]), "val": (X[va], y[va])}
    parts.update({f"val-{f}": v for f, v in data["families"].items()})
    total = 0
    for name, (Xp, yp) in parts.items():
        store = tpc.ActivationStore.create(out / name / SITE, X.shape[1], meta={"pooling": "mean"})
        store.append(Xp)
        (out / name / "labels.json").write_text(json.dumps([int(v) for v in yp]))
        total += Xp.nbytes
    record = {
        "val_fraction": 0.2,
        "test_fraction": 0.0,
        "split": "stratified",
        "seed": 0,
        "n": len(y),
        "positions": {"train": [int(i) for i in tr], "val": [int(i) for i in va]},
    }
    config = {
        "model": "synthetic",
        "toolkit": "transformers",
        "sites": [SITE],
        "pooling": "mean",
        "chat_template": False,
        "max_tokens": 512,
        "dataset": "synthetic",
        "splits": {k: len(v[1]) for k, v in parts.items()},
        "split": record,
    }
    (out / "collect.json").write_text(json.dumps(config))
    return total


class TextRows(MutableMapping):
    """A ``rows_cache`` that holds the row of every text it knows under every reading (keys are
    ``(reading, text)``); what it lacks the model reads and it keeps."""

    def __init__(self, by_text: dict[str, np.ndarray]):
        self.by_text = {t: torch.from_numpy(np.ascontiguousarray(r)) for t, r in by_text.items()}
        self.extra: dict[Any, Any] = {}

    def __getitem__(self, key: Any) -> Any:
        return self.extra[key] if key in self.extra else self.by_text[key[1]]

    def __contains__(self, key: Any) -> bool:
        return key in self.extra or key[1] in self.by_text

    def __setitem__(self, key: Any, value: Any) -> None:
        self.extra[key] = value

    def __delitem__(self, key: Any) -> None:
        del self.extra[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.extra)

    def __len__(self) -> int:
        return len(self.extra)


def random_model(width: int) -> tuple[Any, Any]:
    """A one-layer random-initialised Llama of ``width`` and the packaged tokenizer (nothing downloads)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tpc_hooks import offline

    tok = AutoTokenizer.from_pretrained(offline.default_model_dir())
    heads = 8 if width % 64 == 0 else 9
    cfg = LlamaConfig(
        hidden_size=width,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=256,
        vocab_size=len(tok),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval(), tok


# ---- the steps ---------------------------------------------------------------------------------------------


def _hwm_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class Steps:
    """Wall time and resident-set peak of every wrapped call, inclusive, keyed by its step and the steps
    open around it."""

    def __init__(self) -> None:
        self.open: list[dict[str, Any]] = []
        self.done: list[dict[str, Any]] = []
        self.base_kb = 0

    def start(self) -> None:
        _reset_hwm()
        self.base_kb = _hwm_kb()

    def _fold(self) -> None:  # the peak since the last reset reaches every open step, then a new window opens
        peak = _hwm_kb()
        for s in self.open:
            s["peak_kb"] = max(s["peak_kb"], peak)
        _reset_hwm()

    def wrap(self, name: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            self._fold()
            label = name(*args, **kwargs) if callable(name) else name
            step = {"step": label, "within": [s["step"] for s in self.open], "peak_kb": _hwm_kb(), "extra": {}}
            self.open.append(step)
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                step["seconds"] = time.perf_counter() - t0
                self._fold()
                self.open.pop()
                self.done.append(step)
            return out

        return run


def _patches(steps: Steps) -> ExitStack:
    """Wraps each step where the training code looks it up."""
    from tpc_hooks.cli import _verbs
    from tpc_hooks.training import _refit, _train, _train_monitor
    from tpc_hooks.training._engine import _fit

    stack = ExitStack()

    def patch(owner: Any, attr: str, name: Any) -> None:
        stack.enter_context(mock.patch.object(owner, attr, steps.wrap(name, getattr(owner, attr))))

    patch(_verbs, "plan_from_stores", "read")
    patch(_train_monitor, "_collect", "read")
    patch(_train, "fit", "fit")
    patch(_fit, "fit_probe", "order 1")
    patch(_refit, "fit_probe", "order 1")
    degree = _fit._Trainer.degree

    def trained(self: Any, k: int, prefix: Any) -> Any:
        before = len(self.records)
        out = degree(self, k, prefix)
        steps.open[-1]["extra"]["epochs"] = sum(r.get("epoch", -1) >= 0 for r in self.records[before:])
        return out

    stack.enter_context(
        mock.patch.object(_fit._Trainer, "degree", steps.wrap(lambda self, k, p: f"order {k}", trained))
    )
    from sklearn.linear_model import LogisticRegression

    solve = LogisticRegression.fit

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:  # order 1's solver iterations, over the C sweep
        out = solve(self, *args, **kwargs)
        extra = steps.open[-1]["extra"]
        extra["iterations"] = extra.get("iterations", 0) + int(np.max(self.n_iter_))
        return out

    stack.enter_context(mock.patch.object(LogisticRegression, "fit", counted))
    patch(_train, "_earned", "choice of orders")
    patch(_refit, "out_of_fold", "out-of-fold")
    patch(_refit, "refit", "refit")
    patch(_refit, "calibrate_logits", "threshold")
    return stack


# ---- one run -----------------------------------------------------------------------------------------------


def one(path: str, n: int, width: int, epochs: int, out: Path) -> None:
    """One run in this process: ``path`` is ``train`` (the CLI on a store) or ``train_monitor``."""
    torch.set_num_threads(1)
    # lazy imports and first allocations (autograd, the optimiser, scikit-learn) happen here, not in a step
    Xw, yw = make_problem(n=256, d_model=width, seed=5)
    tpc.fit(Xw[:200], yw[:200], Xw[200:], yw[200:], degree=2, rank=2, epochs=1, verbose=False)
    data = rows(n, width)
    rows_bytes = data["X"].nbytes + sum(v[0].nbytes for v in data["families"].values())
    with tempfile.TemporaryDirectory() as tmp:
        steps = Steps()
        if path == "train":
            from tpc_hooks.cli import main as cli

            write_store(data, Path(tmp, "acts"))
            del data
            args = ["train", "--acts", str(Path(tmp, "acts")), "--out", str(Path(tmp, "m")), "--no-progress"]
            args += ["--epochs", str(epochs)]
            with _patches(steps):
                steps.start()
                t0 = time.perf_counter()
                assert cli(args) == 0
                total = time.perf_counter() - t0
            mon = tpc.Monitor.from_pretrained(Path(tmp, "m"))
        else:
            model, tok = random_model(width)
            cache = TextRows(data["by_text"])
            prompts, labels = data["prompts"], data["y"].tolist()
            del data
            with _patches(steps):
                steps.start()
                t0 = time.perf_counter()
                mon = tpc.train_monitor(
                    model, prompts, labels, SITE, tokenizer=tok, epochs=epochs, verbose=False, rows_cache=cache
                )
                total = time.perf_counter() - t0
            if cache.extra:
                raise SystemExit(f"the model read {len(cache.extra)} texts the cache lacked")
    record = {
        "path": path,
        "rows": n,
        "width": width,
        "rows_bytes": rows_bytes,
        "seconds": total,
        "peak_kb_above": max(s["peak_kb"] for s in steps.done) - steps.base_kb,
        "base_kb": steps.base_kb,
        "threshold": float(mon.threshold),
        "kept": mon.head.degree,
        "steps": steps.done,
    }
    out.write_text(json.dumps(record))


# ---- the table ---------------------------------------------------------------------------------------------


def summarise(r: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each step's seconds, epochs and peak (MB above the start): the steps ``train`` runs on its own
    split (outside out-of-fold and refit), and out-of-fold and refit whole (their epochs: those their
    orders ran)."""
    out: dict[str, dict[str, float]] = {}
    nested = {top: [0, 0.0] for top in REFITS}  # the epochs the refits' orders 2+ ran and their seconds
    for s in r["steps"]:
        name, within = s["step"], s["within"]
        if name.startswith("order") and any(w in REFITS for w in within):
            if name != "order 1":
                got = nested["out-of-fold" if "out-of-fold" in within else "refit"]
                got[0] += s["extra"].get("epochs", 0)
                got[1] += s["seconds"]
            continue  # the refits' own orders count in the refits
        if name == "refit" and "out-of-fold" in within:
            continue
        if name == "fit":
            continue
        got = out.setdefault(name, {"seconds": 0.0, "epochs": 0, "iterations": 0, "peak_mb": 0.0})
        got["seconds"] += s["seconds"]
        got["epochs"] += s["extra"].get("epochs", 0)
        got["iterations"] += s["extra"].get("iterations", 0)
        got["peak_mb"] = max(got["peak_mb"], (s["peak_kb"] - r["base_kb"]) / 1024)
    for name, (epochs, seconds) in nested.items():
        if name in out:
            out[name]["epochs"], out[name]["epoch_seconds"] = epochs, seconds
    return out


def step_value(at: dict[Any, Any], p: str, n: int, w: int, step: str) -> float | None:
    """A step's seconds in one run (an order's per epoch run; ``total``: the whole call), None where absent."""
    r = at.get((p, n, w))
    if r is None:
        return None
    if step == "total":
        return r["seconds"]
    if step == ITERATION:
        s = summarise(r).get("order 1")
        return s["seconds"] / s["iterations"] if s and s["iterations"] else None
    if step.endswith(EPOCHS_OF):  # a refit's orders 2+, per epoch they ran
        s = summarise(r).get(step[: -len(EPOCHS_OF)])
        return s["epoch_seconds"] / s["epochs"] if s and s["epochs"] else None
    s = summarise(r).get(step)
    if s is None or s["seconds"] <= 0:
        return None
    return s["seconds"] / s["epochs"] if s["epochs"] and step not in REFITS else s["seconds"]


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y on log x."""
    lx, ly = np.log(xs), np.log(ys)
    return float(np.polyfit(lx, ly, 1)[0])


def report(results: list[dict[str, Any]], epochs: int) -> None:
    widths = sorted({r["width"] for r in results})
    counts = sorted({r["rows"] for r in results})
    paths = [p for p in ("train", "train_monitor") if any(r["path"] == p for r in results)]
    at = {(r["path"], r["rows"], r["width"]): r for r in results}
    print(
        f"# Training's cost as the rows grow\n\nSynthetic rows (`make_problem`, a planted interaction), the default "
        f"recipe (degree 5, rank 64, {epochs} epochs an order at most, early stopping), one CPU thread "
        f"({platform.processor() or platform.machine()}, torch {torch.__version__}). Rows: the prompts "
        f"(80% train, 20% validation) and the validation rows again under each of {len(SHIFTS)} phrasing "
        "shifts, as a store of a user's file holds them. Peak: the resident set's high-water mark above its "
        "level at the call, over the rows' own bytes (float32).\n"
    )
    print("## Summary\n")
    print("| path | rows | width | seconds | orders kept | peak / rows' bytes | thresholds apart |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for p in paths:
        for n in counts:
            for w in widths:
                r = at.get((p, n, w))
                if r is None:
                    continue
                other = at.get(("train_monitor" if p == "train" else "train", n, w))
                apart = "" if other is None else f"{abs(r['threshold'] - other['threshold']):.1e}"
                ratio = r["peak_kb_above"] * 1024 / r["rows_bytes"]
                print(f"| `{p}` | {n:,} | {w:,} | {r['seconds']:.1f} | {r['kept']} | {ratio:.2f}x | {apart} |")
    for p in paths:
        print(f"\n## `{p}`: each step, seconds (epochs run; order 1: solver iterations) and peak MB above the start\n")
        cols = [(n, w) for w in widths for n in counts if (p, n, w) in at]
        print("| step | " + " | ".join(f"{n // 1000}k x {w}" for n, w in cols) + " |")
        print("|---|" + "---:|" * len(cols))
        sums = {c: summarise(at[(p, *c)]) for c in cols}
        for step in STEPS:
            cells = []
            for c in cols:
                s = sums[c].get(step)
                if s is None:
                    cells.append("")
                    continue
                ep = f" ({s['epochs']})" if s["epochs"] else f" ({s['iterations']} it.)" if s["iterations"] else ""
                cells.append(f"{s['seconds']:.1f}{ep} / {s['peak_mb']:.0f}")
            if any(cells):
                print(f"| {step} | " + " | ".join(cells) + " |")
        print(f"\n## `{p}`: growth exponents (time and peak ~ rows^a, width^b) and the paper's scale\n")
        print(
            "a: the slope of log time on log rows at the widest width, over every count and without the "
            "smallest (whose rows fit the CPU's caches: it runs faster per row); b: between the two widths at "
            f"the most rows. Extrapolated to {PAPER[0]:,} rows x {PAPER[1]:,} (the paper's WildGuardMix on "
            "Gemma-3-27B) from the largest run by a without the smallest count and b: an extrapolation, not a "
            "measurement (the whole run's: in proportion to rows x width). Per epoch for the orders and the "
            "refits' orders, per solver iteration for order 1: how many a step runs depends on the data.\n"
        )
        print(
            "| step | a (rows) | a (without the smallest) | b (width) | seconds at the largest run "
            "| extrapolated seconds |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        big_w, big_n = widths[-1], counts[-1]
        rows_steps = [*STEPS[:2], ITERATION, *STEPS[2:8], STEPS[7] + EPOCHS_OF, STEPS[8], STEPS[8] + EPOCHS_OF]
        for step in [*rows_steps, *STEPS[9:], "total"]:
            by_n = [(n, step_value(at, p, n, big_w, step)) for n in counts]
            by_n = [(n, v) for n, v in by_n if v]
            a = slope([n for n, _ in by_n], [v for _, v in by_n]) if len(by_n) > 1 else float("nan")
            big = [(n, v) for n, v in by_n if n > counts[0]]
            a_big = slope([n for n, _ in big], [v for _, v in big]) if len(big) > 1 else float("nan")
            by_w = [(w, step_value(at, p, big_n, w, step)) for w in widths]
            by_w = [(w, v) for w, v in by_w if v]
            b = slope([w for w, _ in by_w], [v for _, v in by_w]) if len(by_w) > 1 else float("nan")
            last = step_value(at, p, big_n, big_w, step)
            if last is None:
                continue
            if step == "total":  # as rows x width, as each step's cost per epoch and per iteration grows
                est = last * (PAPER[0] / big_n) * (PAPER[1] / big_w)
            else:
                est = last * (PAPER[0] / big_n) ** (a_big if a_big == a_big else a) * (PAPER[1] / big_w) ** b
            unit = " / epoch" if step.startswith("order ") and step not in ("order 1", ITERATION) else ""
            print(f"| {step}{unit} | {a:.2f} | {a_big:.2f} | {b:.2f} | {last:.3f} | {est:,.1f} |")
        print("\n| peak / rows' bytes | " + " | ".join(f"{n // 1000}k x {w}" for n, w in cols) + " |")
        print("|---|" + "---:|" * len(cols))
        print(
            "| whole run | "
            + " | ".join(f"{at[(p, *c)]['peak_kb_above'] * 1024 / at[(p, *c)]['rows_bytes']:.2f}x" for c in cols)
            + " |"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[2000, 8000, 32000, 64000])
    ap.add_argument("--widths", type=int, nargs="+", default=[576, 2048])
    ap.add_argument("--paths", nargs="+", default=["train", "train_monitor"], choices=["train", "train_monitor"])
    ap.add_argument("--epochs", type=int, default=50, help="epochs an order at most (the default's 50)")
    ap.add_argument("--keep", default=None, help="a directory for each run's JSON (default: a temporary one)")
    ap.add_argument("--one", nargs=3, metavar=("PATH", "ROWS", "WIDTH"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    add_results_argument(ap, "bench_training_rows")
    args = ap.parse_args(argv)
    if args.one:
        one(args.one[0], int(args.one[1]), int(args.one[2]), args.epochs, Path(args.out))
        return 0
    keep = Path(args.keep or tempfile.mkdtemp(prefix="bench-training-rows-"))
    keep.mkdir(parents=True, exist_ok=True)
    results = []
    with recording(results_path(args), argv):
        for w in args.widths:
            for n in args.rows:
                for p in args.paths:
                    out = keep / f"{p}-{n}-{w}.json"
                    if not out.exists():  # a run kept from an interrupted sweep is not run again
                        cmd = [sys.executable, __file__, "--one", p, str(n), str(w), "--epochs", str(args.epochs)]
                        subprocess.run(
                            [*cmd, "--out", str(out)], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
                        )
                    results.append(json.loads(out.read_text()))
                    print(f"{p} {n} x {w}: {results[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
        report(results, args.epochs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
