"""The verbs that look into decisions: ``attribute`` (a prompt's score by order, neuron and pair, or with
``--by`` by token and model part) and ``review`` (a server's review log as pages, each flag's split
recomputed with ``--monitor``)."""

import argparse
import json
from pathlib import Path
from typing import Any

from .._errors import TPCHooksError
from ..activations import collect, get_adapter
from ..head import attribute
from ..monitoring import Monitor, conversation_ids
from ..offline import DEFAULT_MODEL
from ..views import read_review_log, review_pages
from . import _models  # a module reference: what the verbs load is read at call time
from ._checks import check_json_out, check_model
from ._explain import BY, explain_entries, explanation_dict, review_monitors
from ._output import print_attributions, print_explanations, review_summary


def attribute_verb(args: argparse.Namespace) -> int:
    check_model(args.model)
    check_json_out(args.json)
    if args.heads and "component" not in (args.by or ()):
        raise TPCHooksError(
            "--heads splits each attention layer by head among the model parts; it goes with --by component "
            "(e.g. --by token component --heads)"
        )
    if args.by is not None and args.k < 1:
        raise TPCHooksError(f"--k must be at least 1 (the top tokens and parts to list); got {args.k}")
    mon = _models.saved_or_pretrained(args)
    if mon.streaming and args.by is None:
        raise TPCHooksError(
            f"{args.monitor} is a per-token monitor: its decision aggregates many tokens' logits, and "
            "tpc-hooks attribute splits one pooled decision by order and neuron; split it by token and model "
            "part with --by token component, or attribute its tokens in Python: "
            "tpc.attribute(monitor, rows) with rows = tpc.collect(model, [prompt], monitor.site, "
            "pooling='token')[monitor.site][0] (one attribution per token)"
        )
    responses = args.response
    if mon.answers and responses is None:
        raise TPCHooksError(
            f"{args.monitor} is a response monitor (reads the answer): pass --response, the answer to attribute "
            "for each --prompt (in the same order)"
        )
    if responses is not None and len(responses) != len(args.prompt):
        raise TPCHooksError(
            f"--response gives {len(responses)} answers for {len(args.prompt)} prompts; pass one per --prompt"
        )
    model = _models.load_named(args.model, args.toolkit)
    if args.by is not None:
        return _attribute_by(args, mon, model, responses)
    if responses is None:
        z = collect(
            model,
            args.prompt,
            mon.site,
            mon.pooling,
            chat_template=mon.chat_template,
            prepend_bos=mon.prepend_bos,
            max_tokens=mon.max_tokens,
            progress=False,
        )[mon.site]
        attr = attribute(mon, z)
        dicts = [attr.to_dict(b, k=args.k) for b in range(len(args.prompt))]
    else:  # each conversation's tokens, pooled the monitor's way: the answer's alone for a response monitor
        ids, starts = conversation_ids(
            get_adapter(model),
            args.prompt,
            responses,
            chat_template=mon.chat_template,
            max_tokens=mon.max_tokens,
            prepend_bos=mon.prepend_bos,
            what="attribute",
        )
        rows = collect(model, tokens=ids, sites=mon.site, pooling="token", progress=False)[mon.site]
        pooled = [r[s:] if mon.answers else r for r, s in zip(rows, starts, strict=True)]
        dicts = [attribute(mon, r[None]).to_dict(0, k=args.k) for r in pooled]
    print_attributions(args.prompt, dicts)
    if args.json:
        Path(args.json).write_text(json.dumps(dicts, indent=1))
    return 0


def _attribute_by(args: argparse.Namespace, mon: Monitor, model: Any, responses: list[str] | None) -> int:
    """``attribute --by``: :meth:`Monitor.explain` of the prompts (conversations, with ``--response``),
    printed and (``--json``) written as :func:`explanation_dict` gives each row."""
    by = tuple(b for b in BY if b in args.by)
    ex = mon.explain(model, args.prompt, responses=responses, heads=args.heads)
    dicts = [
        {
            "prompt": prompt,
            **({} if responses is None else {"response": responses[b]}),
            **explanation_dict(ex, b, k=args.k, by=by),
        }
        for b, prompt in enumerate(args.prompt)
    ]
    print_explanations(args.prompt, dicts, mon)
    if args.json:
        Path(args.json).write_text(json.dumps(dicts, indent=1))
    return 0


def review_verb(args: argparse.Namespace) -> int:
    """``review``: the log's pages; with ``--monitor``, each flagged request's split over tokens and model
    parts recomputed from its logged text with the transformers adapter (``_explain.explain_entries``)."""
    log = Path(args.log)
    out = Path(args.out) if args.out else (log if log.is_dir() else log.parent) / "html"
    if not args.monitor and args.explain_with is not None:
        raise TPCHooksError(
            "--explain-with names the model a split is recomputed on, for the monitors named with --monitor "
            "NAME=DIR (DIR alone for a server's lone monitor); add them, or drop --explain-with"
        )
    if args.monitor and args.k < 1:
        raise TPCHooksError(f"--k must be at least 1 (the top tokens and parts to list); got {args.k}")
    check_model(args.explain_with, "--explain-with")
    logged = read_review_log(log)
    entries = [e for e in logged if e.get("flagged") or not args.flagged_only]
    summary = None
    if args.monitor:
        monitors = review_monitors(args.monitor, {n for e in logged for n in e.get("monitors", {})})
        model = _models.load_named(args.explain_with, "transformers")
        name = args.explain_with or DEFAULT_MODEL
        counts, error = explain_entries(
            entries,
            model,
            get_adapter(model).tokenizer,
            monitors,
            k=args.k,
            model_name=name,
            progress=not args.no_progress,
        )
        summary = review_summary(counts, error, name)
    index = review_pages(entries, out)
    print(f"wrote {index} ({len(list(out.glob('entry-*.html')))} pages)")
    if summary is not None:
        print(summary)
    return 0
