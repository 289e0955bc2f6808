"""What the command line's verbs print: their results as text, most of it Markdown-style tables.

The verbs that compute what is printed are in ``_verbs``."""

import math
from pathlib import Path
from typing import Any

from ..activations import cost_line
from ..monitoring import Monitor
from ..training import CONTEXT_SPLITS


def table(header: list[str], rows: list[list[str]]) -> str:
    """``rows`` under ``header`` as a Markdown table, each column as wide as its widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def passes_line(sizes: dict[str, int]) -> str:
    """What ``collect`` is about to cost, said before it runs: the forward passes (one per prompt) of
    each part, each split's count beside it."""
    parts: dict[str, list[str]] = {}
    for k in sizes:
        part = (
            "intent flips and homonyms"
            if k in ("flips", "val-intent", "homonyms")
            else "phrasing rewrites"
            if k == "aug" or k.startswith("val-")
            else "prompts"
        )
        parts.setdefault(part, []).append(k)
    line = cost_line(
        "collect",
        {f"{p} ({', '.join(f'{k} {sizes[k]:,}' for k in ks)})": sum(sizes[k] for k in ks) for p, ks in parts.items()},
    )
    extra = [
        f
        for f, p in (("--no-augment", "phrasing rewrites"), ("--no-intent", "intent flips and homonyms"))
        if p in parts
    ]
    return line + (f"; {' and '.join(extra)} skip the extra parts" if extra else "")


def print_demo(res: dict[str, Any], out: Path, seconds: float) -> None:
    """``demo``'s summary: F1 by order per split and method, the TPC cascade at a few ``tau``, where
    the report and the monitor are."""
    n = res["degree"]
    for split in [k for k in ("test", "heldout") if res["f1"][k]]:
        rows = [[m] + [f"{r['f1']:.3f}" for r in res["f1"][split] if r["method"] == m] for m in res["methods"]]
        rows = [r + [""] * (n + 1 - len(r)) for r in rows]
        print(f"\nF1 by order, {split}" + (" (source never seen in training)" if split == "heldout" else ""))
        print(table(["method"] + [str(o) for o in range(1, n + 1)], rows))
    print(
        "\nTPC cascade (test): "
        + ", ".join(
            f"tau={r['tau']:g}: F1 {r['f1']:.3f} at {r['relative_flops']:.1f}x linear"
            for r in res["cascade"]["tpc"]
            if r["tau"] in (0.0, 0.1, 0.3, 0.5)
        )
    )
    print(f"\ndone in {seconds:.0f} s ({res['seconds']}); report: {out / 'report.md'}; monitor: {out / 'monitor'}")


def print_choices(mon: Monitor, *, site: str, per_token: bool, target_fpr: float | None) -> None:
    """What ``train`` chose: the site (with ``--site auto``) and the threshold, with the share of
    benign validation rows it flags (per source, when the stores name sources)."""
    if site == "auto":
        print(
            table(
                ["site", "its linear probe: worst-group recall at 1% FPR", "worst-group AUROC"],
                [[r["site"], f"{r['recall_at_fpr']:.3f}", f"{r['auroc']:.3f}"] for r in mon.report["site_selection"]],
            )
        )
        print(f"--site auto: {mon.site}")
    op = mon.report.get("operating_point")
    if op is not None:
        unit = "sequences at any token" if per_token else "rows"
        lo, hi = op["fpr_interval_95"]
        print(
            f"threshold {mon.threshold:.6g}: flags {op['flagged']} of {op['n_benign']} benign "
            + ("prompts' out-of-fold scores " if "refit" in mon.report else f"validation {unit} ")
            + f"(target FPR {target_fpr:g}; on new benign traffic like them, {100 * lo:.2g}-{100 * hi:.2g}% "
            "with 95% probability)"
        )
        if "by_source" in op:
            print(
                table(
                    ["benign source", unit, "flagged", "rate", "95% interval"],
                    [
                        [
                            k,
                            str(v["n"]),
                            str(v["flagged"]),
                            f"{100 * v['rate']:.1f}%",
                            f"{100 * v['rate_interval_95'][0]:.2g}-{100 * v['rate_interval_95'][1]:.2g}%",
                        ]
                        for k, v in op["by_source"].items()
                    ],
                )
            )
    elif target_fpr is not None:
        print(
            "no validation split: the threshold stays 0.5; collect a file or hub dataset again with tpc-hooks "
            "collect (it splits off --val-fraction 0.2) to set it by --target-fpr"
        )


def print_saved(mon: Monitor, path: Any, *, per_token: bool, data: dict[str, Any], hosted: list[str]) -> None:
    """What ``train`` saved: for each order the monitor keeps, the validation F1 and the setting
    chosen on validation; the orders training dropped and why; the rows a per-token monitor trained
    on, and where the monitor is."""
    history = mon.head.history
    joint = history.mode == "joint"  # one record, for every order trained together
    rows = [
        [f"1-{k} (together)" if joint else str(k), f"{v['val_f1']:.3f}", _chosen(v, history)]
        for k, v in sorted(history.selected.items())
        if k <= mon.head.degree
    ]
    print(table(["order", "val F1 when chosen" + (" (token rows)" if per_token else ""), "chosen on validation"], rows))
    worst = history.config is not None and history.config.group_rule == "worst"
    groups = "the worst validation group's" if worst else "the validation groups' mean"
    print(
        "(val F1 when chosen: of orders 1 to this, flagging at probability 0.5 on validation, as measured when the "
        f"order's setting was chosen: before any scaling and, above order 1, {groups} when there are groups)"
    )
    orders = mon.report.get("orders")
    if orders is not None and orders["kept"] < orders["trained"]:
        print(f"trained orders 1-{orders['trained']}, {orders['note']}")
    refit = mon.report.get("refit")
    if refit is not None:  # what the saved head is: the split's choices, then the refit on every prompt
        print(
            f"then refit on all {refit['n']} prompts (training and validation): site {refit['site']}, "
            f"C={refit['C']:g}, chosen by {refit['chosen_by']}"
        )
    if per_token:
        ctx = (
            " ("
            + ", ".join(f"{len(data[mon.site].contexts[k].seqs)} {CONTEXT_SPLITS[k]}" for k in hosted)
            + " chats included)"
            if hosted
            else ""
        )
        print(
            f"per-token monitor (aggregate {mon.aggregate}, skip {mon.skip} leading tokens) trained on "
            f"{mon.report['n_train_tokens']} token rows{ctx}; saved to {path}"
        )
    else:
        print(f"monitor saved to {path}")


def _chosen(sel: dict[str, Any], history: Any) -> str:
    """One order's setting chosen on validation, in words: order 1's ``C`` (logistic regression's
    inverse regularisation strength); a higher order's training epochs (``best_epoch`` counts from
    0; -1: the untrained term, ``lambda_k = 0``, won), its grid point when a sweep chose it, and its
    shrinkage scale when not 1."""
    if "C" in sel:
        return f"C={sel['C']:g} (logistic regression)"
    epochs = sel["best_epoch"] + 1
    if epochs == 0:
        return "0 epochs: the term stays 0 and adds nothing"
    words = [f"{epochs} epoch" + ("s" if epochs > 1 else "")]
    if history.config is not None and history.config.sweep:
        words.append(f"lr={sel['lr']:g}, weight decay={sel['weight_decay']:g}, dropout={sel.get('dropout', 0.0):g}")
    scale = sel.get("scale", 1.0)
    if scale == 0:
        words.append("then scaled to 0: adds nothing")
    elif scale != 1:
        words.append(f"then scaled by {scale:g}")
    return ", ".join(words)


def print_split(result: dict[str, Any], mon: Monitor) -> None:
    """``evaluate --acts``' tables of one split: the metrics of each truncation the monitor keeps,
    then the cascade sweep (a monitor with a cascade)."""
    unit = "sequences" if mon.streaming else "rows"
    print(
        f"(F1, precision, recall and FRR flag at probability 0.5, not at the monitor's threshold "
        f"{mon.threshold:.6g}; FRR: the share of benign {unit} flagged; ECE: expected calibration error)"
    )
    print(
        table(
            ["orders", "F1", "precision", "recall", "FRR", "AUROC", "ECE"],
            [
                [_orders(n + 1)] + [f"{m[k]:.3f}" for k in ("f1", "precision", "recall", "frr", "auroc", "ece")]
                for n, m in enumerate(result["per_order"])
            ],
        )
    )
    if mon.cascade:
        print(
            table(
                [
                    "cascade tau",
                    "F1",
                    "mean FLOPs per token / linear probe's" if mon.streaming else "mean FLOPs / linear probe's",
                    f"{'tokens' if mon.streaming else 'rows'} exiting at each order",
                ],
                [
                    [
                        f"{r['tau']:g}",
                        f"{r['f1']:.3f}",
                        f"{r['relative_flops']:.2f}",
                        ", ".join(f"{o}: {n}" for o, n in enumerate(r["exit_histogram"], start=1)),
                    ]
                    for r in result["cascade"]
                ],
            )
        )


def _orders(n: int) -> str:
    """The truncation at order ``n``, as the orders it sums: ``1`` (the linear probe), ``1-n``."""
    return "1" if n == 1 else f"1-{n}"


def print_generation(run: Any, prompts: list[str], tok: Any, monitor: Monitor | None = None) -> None:
    """``monitor``'s run, prompt by prompt: the score at every step (with the order it exited at,
    when ``monitor`` has a cascade over more than one order), each generated token decoded, and
    whether and where the sequence was stopped or flagged. Without ``monitor`` the run does not
    say whether a cascade scored it, and no exit order is printed."""
    exits = monitor is not None and monitor.cascade is not None and monitor.head.degree > 1
    if monitor is not None:
        d = monitor.head.degree
        orders = "order 1 (the linear probe)" if d == 1 else f"orders 1-{d}"
        how = f"the cascade over {orders}, each step exiting at the order shown" if exits else f"{orders} at every step"
        print(f"scores: {how}; a step is flagged at score >= {run.threshold:.6g}")

    def exit_order(b: int, t: int) -> str:
        return f", exit order {int(run.exit_orders[b][t])}" if exits else ""

    answers = monitor is not None and monitor.answers
    if answers:
        print("a response monitor: it reads the answer, step t its first t tokens; the prompt alone is not scored")
    for b, prompt in enumerate(prompts):
        print(f"\nprompt {b}: {prompt!r}")
        if answers:
            print("  step 0 (prompt only): not scored")
        else:
            print(f"  step 0 (prompt only): score {float(run.scores[b][0]):.3f}{exit_order(b, 0)}")
        for t, token in enumerate(run.generated(b), start=1):
            if t < len(run.scores[b]):
                print(
                    f"  step {t:>3} {tok.decode([token])!r:>14}: score {float(run.scores[b][t]):.3f}{exit_order(b, t)}"
                )
        state = (
            f"stopped at step {run.stopped_at[b]}"
            if run.stopped_at[b] is not None
            else (f"flagged first at step {run.first_flagged[b]}" if run.flagged[b] else "not flagged")
        )
        print(f"  {state}; generated: {run.texts(tok)[b]!r}")


def print_attributions(prompts: list[str], dicts: list[dict[str, Any]]) -> None:
    """``attribute``'s decisions, prompt by prompt: the head's logit and its probability, the split
    by the head's orders (order 1 holds the bias), the neurons contributing most in size, and the
    pairs of each degree contributing most (a degree whose pairs all add exactly 0 lists none)."""
    for b, (prompt, d) in enumerate(zip(prompts, dicts, strict=True)):
        print(
            f"\nprompt {b}: {prompt!r}\n  logit {d['logit']:.3f} (p = {1 / (1 + math.exp(-d['logit'])):.3f}); "
            f"by order (order 1 with the bias): "
            + ", ".join(f"{o + 1}: {v + 0.0:+.3f}" for o, v in enumerate(d["by_order"]))  # + 0.0: no -0.000
        )
        print("  top neurons (by size): " + ", ".join(f"{i} ({v:+.3f})" for i, v in d["top_neurons"]))
        for order, pairs in d["top_pairs"].items():
            listed = ", ".join(f"{i}x{j} ({v:+.3f})" for i, j, v in pairs) or "none (each adds exactly 0)"
            print(f"  top pairs, degree {order}: {listed}")


def print_explanations(prompts: list[str], dicts: list[dict[str, Any]], mon: Monitor) -> None:
    """``attribute --by``'s splits, prompt by prompt: the score and flag, the logit as the baseline plus
    what the tokens (or parts) carry, then the top tokens and the top model parts in size, each with its
    signed contribution (from :func:`tpc_hooks.cli._explain.explanation_dict`)."""
    notes = []
    if mon.streaming:
        notes.append(
            f"a per-token monitor: the logit is its {mon.aggregate} aggregate after the last token; each token "
            "carries its weight in that aggregate times its own split"
        )
    if mon.answers:
        notes.append(
            "a response monitor: it pools the answer's tokens alone; the prompt's tokens carry nothing directly "
            "(what attention moved from them is in the answer's tokens and in the parts)"
        )
    elif mon.pooling == "last":
        notes.append("pooling 'last': the last token alone is read and carries the whole split")
    for line in notes:
        print(line)
    for b, (prompt, d) in enumerate(zip(prompts, dicts, strict=True)):
        state = "flagged" if d["flagged"] else "not flagged"
        cut = f"; cut at max_tokens={mon.max_tokens}, as the monitor reads it" if d["truncated"] else ""
        print(
            f"\nprompt {b}: {prompt!r}\n  score {d['score']:.3f}, {state} at threshold {d['threshold']:.6g}; "
            f"logit {d['logit']:+.3f} = baseline {d['baseline']:+.3f} + split {d['logit'] - d['baseline']:+.3f}; "
            f"exit order {d['exit_order']}{cut}"
        )
        if "top_tokens" in d:
            print(f"  top tokens by size (of {len(d['tokens'])}):")
            print(
                table(
                    ["position", "token", "contribution"],
                    [[str(i), _cell(repr(t)), f"{v:+.3f}"] for i, t, v in d["top_tokens"]] or [["-", "none", ""]],
                )
            )
        if "top_components" in d:
            print(f"  top model parts by size (of {len(d['components'])}):")
            print(
                table(
                    ["model part", "contribution"],
                    [[n, f"{v:+.3f}"] for n, v in d["top_components"]] or [["none", ""]],
                )
            )


def _cell(text: str) -> str:
    """A table cell's text, its ``|`` escaped (tokens such as ``<|im_start|>`` hold them)."""
    return text.replace("|", "\\|")


_NOT_RECOMPUTED = {
    "no text": "the log holds no text (serve --review-log-text logs it)",
    "no monitor": "no --monitor names the monitor",
    "no answer": "a response monitor at a step with no answer token",
    "sampled": "sampled, not flagged",
    "failed": "failed",
}


def review_summary(counts: Any, error: str | None, model: str) -> str:
    """``review --monitor``'s account of the splits it recomputed (counts by outcome, from
    ``_explain.explain_entries``) and of those it did not, with why."""
    line = (
        f"recomputed {counts['recomputed']} split(s) of flagged requests (one per monitor named) from the "
        f"logged text, with the transformers adapter on {model}"
    )
    skipped = [f"{counts[k]} {why}" for k, why in _NOT_RECOMPUTED.items() if counts[k]]
    if skipped:
        line += "; not recomputed (each page says why): " + ", ".join(skipped)
    if error is not None:
        line += f"; the first failure: {error}"
    return line
