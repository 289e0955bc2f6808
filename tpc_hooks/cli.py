"""The ``tpc-hooks`` command line.

``tpc-hooks demo`` runs the whole pipeline on the offline default model (SmolLM2-135M-Instruct)
and prompt set. The other verbs do one step each, on saved activations and monitors:
``collect`` (prompts -> activation stores + labels), ``train`` (stores -> monitor), ``evaluate``
(monitor + stores -> metrics per order and the cascade sweep), ``monitor`` (live generation with
per-step scores) and ``attribute`` (a prompt's decision by order, neuron and pair).
"""
import argparse
import datetime as _dt
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

from ._errors import TPCHooksError




def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def _demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    out = Path(args.out or Path("runs") / _dt.datetime.now().strftime("demo-%Y%m%d-%H%M%S"))
    t0 = time.perf_counter()
    res = run_demo(out, toolkit=args.toolkit, model_name=args.model, layer=args.layer, quick=args.quick,
                   seed=args.seed, progress=not args.no_progress, dataset=args.dataset,
                   text_column=args.text_column, label_column=args.label_column)
    n = res["degree"]
    for split in [k for k in ("test", "heldout") if res["f1"][k]]:
        rows = [[m] + [f"{r['f1']:.3f}" for r in res["f1"][split] if r["method"] == m] for m in res["methods"]]
        rows = [r + [""] * (n + 1 - len(r)) for r in rows]
        print(f"\nF1 by order, {split}" + (" (source never seen in training)" if split == "heldout" else ""))
        print(_table(["method"] + [str(o) for o in range(1, n + 1)], rows))
    print("\nTPC cascade (test): " + ", ".join(f"tau={r['tau']:g}: F1 {r['f1']:.3f} at {r['relative_flops']:.1f}x linear"
                                             for r in res["cascade"]["tpc"] if r["tau"] in (0.0, 0.1, 0.3, 0.5)))
    print(f"\ndone in {time.perf_counter() - t0:.0f} s ({res['seconds']}); report: {out / 'report.md'}; "
          f"monitor: {out / 'monitor'}")
    return 0


def _datasets(args: argparse.Namespace) -> dict[str, Any]:
    from .data import default_prompt_set, load_hf_dataset, load_prompt_file

    if args.dataset == "default":
        return default_prompt_set(seed=args.seed)
    if Path(args.dataset).exists():
        return {"all": load_prompt_file(args.dataset, text_column=args.text_column, label_column=args.label_column)}
    return {"all": load_hf_dataset(args.dataset, split=args.split, text_column=args.text_column,
                                   label_column=args.label_column)}


def _collect(args: argparse.Namespace) -> int:
    from ._collect import collect
    from .offline import load_model

    out = Path(args.out)
    sets = _datasets(args)
    model = load_model(args.model, args.toolkit)
    for split, ps in sets.items():
        collect(model, ps.texts, args.sites, args.pooling, batch_size=args.batch_size, chat_template=not args.no_chat_template,
                max_tokens=args.max_tokens, store=out / split, progress=not args.no_progress)
        (out / split / "labels.json").write_text(json.dumps(list(map(int, ps.labels))))
    (out / "collect.json").write_text(json.dumps({
        "model": args.model, "toolkit": args.toolkit, "sites": args.sites, "pooling": args.pooling,
        "chat_template": not args.no_chat_template, "max_tokens": args.max_tokens, "dataset": args.dataset,
        "splits": {k: len(v) for k, v in sets.items()}}, indent=1))
    print(_table(["split", "prompts"], [[k, str(len(v))] for k, v in sets.items()]))
    print(f"activations in {out} (sites: {', '.join(args.sites)})")
    return 0


def _split(acts: Path, split: str, site: str) -> tuple[Any, Any]:
    from ._store import ActivationStore

    if not (acts / split / "labels.json").is_file():
        raise TPCHooksError(f"{acts / split} has no collected split {split!r}; run tpc-hooks collect first")
    return ActivationStore.open(acts / split / site).to_numpy(), json.loads((acts / split / "labels.json").read_text())


def _train(args: argparse.Namespace) -> int:
    from ._cascade import Cascade
    from ._monitor import Monitor
    from ._fit import fit

    acts = Path(args.acts)
    cfg = json.loads((acts / "collect.json").read_text())
    site = args.site or cfg["sites"][0]
    train_split = "train" if (acts / "train").exists() else "all"
    X, y = _split(acts, train_split, site)
    Xv, yv = _split(acts, "val", site) if (acts / "val").exists() else (None, None)
    if args.recipe == "paper" and (args.no_gate or args.escalate_only):
        raise TPCHooksError("--recipe paper is the plain polynomial; it takes neither --no-gate nor --escalate-only")
    robust = {} if args.recipe == "paper" else {"gate": not args.no_gate, "escalate_only": args.escalate_only}
    head = fit(X, y, Xv, yv, degree=args.degree, rank=args.rank, epochs=args.epochs, seed=args.seed, recipe=args.recipe,
               verbose=not args.no_progress, **robust).cpu()
    cascade = Cascade(head, tau=args.tau).calibrate(Xv, yv) if Xv is not None else Cascade(head, tau=args.tau)
    mon = Monitor(head, site, pooling=cfg["pooling"], chat_template=cfg["chat_template"], max_tokens=cfg["max_tokens"],
                  model_name=cfg["model"], cascade=cascade)
    path = mon.save(args.out)
    sel = head.history.selected
    print(_table(["degree", "val F1", "chosen"], [[str(k), f"{v['val_f1']:.3f}", str(v.get("C", v.get("best_epoch")))]
                                                 for k, v in sorted(sel.items())]))
    print(f"monitor saved to {path}")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    import torch

    from .metrics import classification_metrics
    from ._monitor import Monitor

    mon = Monitor.load(args.monitor)
    acts = Path(args.acts)
    results = {}
    for split in args.splits:
        X, y = _split(acts, split, mon.site)
        with torch.no_grad():
            per_order = [classification_metrics(y, s) for s in mon.head.truncations(torch.as_tensor(X)).unbind(-1)]
        results[split] = {"per_order": per_order, "cascade": mon.cascade.sweep(X, y) if mon.cascade else []}
        print(f"\n{split}: metrics by order")
        print(_table(["order", "F1", "precision", "recall", "FRR", "AUROC", "ECE"],
                     [[str(n + 1)] + [f"{m[k]:.3f}" for k in ("f1", "precision", "recall", "frr", "auroc", "ece")]
                      for n, m in enumerate(per_order)]))
        if mon.cascade:
            print(_table(["tau", "F1", "mean FLOPs / linear", "exits per order"],
                         [[f"{r['tau']:g}", f"{r['f1']:.3f}", f"{r['relative_flops']:.2f}", str(r["exit_histogram"])]
                          for r in results[split]["cascade"]]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def _monitor(args: argparse.Namespace) -> int:
    from ._monitor import Monitor
    from .offline import load_model

    mon = Monitor.load(args.monitor)
    model = load_model(args.model, args.toolkit)
    run = mon.generate(model, args.prompt, max_new_tokens=args.max_new_tokens, action=args.action)
    tok = model.tokenizer
    for b, prompt in enumerate(args.prompt):
        print(f"\nprompt {b}: {prompt!r}")
        print(f"  step 0 (prompt only): score {float(run.scores[b][0]):.3f}, exit order {int(run.exit_orders[b][0])}")
        for t, token in enumerate(run.generated(b), start=1):
            if t < len(run.scores[b]):
                print(f"  step {t:>3} {tok.decode([token])!r:>14}: score {float(run.scores[b][t]):.3f}, "
                      f"exit order {int(run.exit_orders[b][t])}")
        state = f"stopped at step {run.stopped_at[b]}" if run.stopped_at[b] is not None else (
            f"flagged first at step {run.first_flagged[b]}" if run.flagged[b] else "not flagged")
        print(f"  {state}; generated: {run.texts(tok)[b]!r}")
    return 0


def _attribute(args: argparse.Namespace) -> int:
    from ._attribution import attribute
    from ._collect import collect
    from ._monitor import Monitor
    from .offline import load_model

    mon = Monitor.load(args.monitor)
    model = load_model(args.model, args.toolkit)
    z = collect(model, args.prompt, mon.site, mon.pooling, chat_template=mon.chat_template, prepend_bos=mon.prepend_bos,
                max_tokens=mon.max_tokens, progress=False)[mon.site]
    attr = attribute(mon, z)
    dicts = [attr.to_dict(b, k=args.k) for b in range(len(args.prompt))]
    for b, (prompt, d) in enumerate(zip(args.prompt, dicts)):
        print(f"\nprompt {b}: {prompt!r}\n  logit {d['logit']:.3f} (p = {1 / (1 + math.exp(-d['logit'])):.3f}); "
              f"by order: " + ", ".join(f"{o + 1}: {v:+.3f}" for o, v in enumerate(d["by_order"])))
        print("  top neurons: " + ", ".join(f"{i} ({v:+.3f})" for i, v in d["top_neurons"]))
        for order, pairs in d["top_pairs"].items():
            print(f"  top pairs, degree {order}: " + ", ".join(f"{i}x{j} ({v:+.3f})" for i, j, v in pairs))
    if args.json:
        Path(args.json).write_text(json.dumps(dicts, indent=1))
    return 0


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="hub id or local folder (default: the packaged SmolLM2-135M-Instruct)")
    p.add_argument("--toolkit", choices=("transformer_lens", "nnsight"), default="transformer_lens")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tpc-hooks`` console script."""
    parser = argparse.ArgumentParser(prog="tpc-hooks", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    demo = sub.add_parser("demo", help="collect, train, evaluate, monitor and attribute on the offline default model")
    demo.add_argument("--quick", action="store_true", help="a small run for CI (about 2 minutes)")
    demo.add_argument("--toolkit", choices=("transformer_lens", "nnsight"), default="transformer_lens")
    demo.add_argument("--model", default=None, help="hub id or local folder (default: the packaged SmolLM2-135M-Instruct)")
    demo.add_argument("--layer", type=int, default=20, help="residual-stream layer the monitor reads")
    demo.add_argument("--dataset", default="default",
                      help="'default' (packaged, with a held-out source), a local CSV/JSONL, or a hub dataset id")
    demo.add_argument("--text-column", default="text")
    demo.add_argument("--label-column", default="label")
    demo.add_argument("--out", help="run directory (default: runs/demo-<timestamp>)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p = sub.add_parser("collect", help="pooled activations of a prompt set into stores, with labels")
    _model_args(p)
    p.add_argument("--out", required=True, help="directory for the stores (resumable)")
    p.add_argument("--dataset", default="default", help="'default' (packaged), a local CSV/JSONL, or a hub dataset id")
    p.add_argument("--split", default=None, help="hub dataset split")
    p.add_argument("--text-column", default="text")
    p.add_argument("--label-column", default="label")
    p.add_argument("--sites", nargs="+", default=["blocks.20.hook_resid_post"])
    p.add_argument("--pooling", choices=("mean", "last", "max"), default="mean")
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p = sub.add_parser("train", help="train a monitor on collected activations")
    p.add_argument("--acts", required=True)
    p.add_argument("--out", required=True, help="directory for the saved monitor")
    p.add_argument("--site", default=None, help="default: the first collected site")
    p.add_argument("--degree", type=int, default=5)
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--tau", type=float, default=0.2, help="the monitor's cascade threshold")
    p.add_argument("--recipe", choices=["default", "paper"], default="default",
                   help="'paper': the paper's exact recipe (plain polynomial, 50 epochs per degree, last epoch kept)")
    p.add_argument("--no-gate", action="store_true", help="keep the trust region but let inputs that leave it use every order")
    p.add_argument("--escalate-only", action="store_true",
                   help="higher orders may not clear a prompt the linear probe flags (recall >= the linear probe's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p = sub.add_parser("evaluate", help="metrics per order and the cascade sweep of a monitor on collected splits")
    p.add_argument("--monitor", required=True)
    p.add_argument("--acts", required=True)
    p.add_argument("--splits", nargs="+", default=["test"])
    p.add_argument("--json", default=None)
    p = sub.add_parser("monitor", help="generate with live per-step scores")
    _model_args(p)
    p.add_argument("--monitor", required=True)
    p.add_argument("--prompt", nargs="+", required=True)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--action", choices=("flag", "stop"), default="flag")
    p = sub.add_parser("attribute", help="a prompt's decision by order, neuron and neuron pair")
    _model_args(p)
    p.add_argument("--monitor", required=True)
    p.add_argument("--prompt", nargs="+", required=True)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    verbs = {"demo": _demo, "collect": _collect, "train": _train, "evaluate": _evaluate, "monitor": _monitor,
             "attribute": _attribute}
    try:
        return verbs[args.verb](args)
    except TPCHooksError as err:
        print(f"tpc-hooks {args.verb}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
