"""What the command line's verbs print: their results as text, most of it Markdown-style tables.

The verbs that compute what is printed are in :mod:`tpc_hooks.cli`."""

import math
from pathlib import Path
from typing import Any

from .monitoring._monitor import Monitor
from .training._collected import CONTEXT_SPLITS


def table(header: list[str], rows: list[list[str]]) -> str:
    """``rows`` under ``header`` as a Markdown table, each column as wide as its widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


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
                ["site", "worst-group recall at 1% FPR", "worst-group AUROC"],
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
        print("no validation split: the threshold stays 0.5 (collect with a val split to set it by --target-fpr)")


def print_saved(mon: Monitor, path: Any, *, per_token: bool, data: dict[str, Any], hosted: list[str]) -> None:
    """What ``train`` saved: each degree's validation F1 and chosen setting, the rows a per-token
    monitor trained on, and where the monitor is."""
    sel = mon.head.history.selected
    print(
        table(
            ["degree", "val F1 (tokens)" if per_token else "val F1", "chosen"],
            [[str(k), f"{v['val_f1']:.3f}", str(v.get("C", v.get("best_epoch")))] for k, v in sorted(sel.items())],
        )
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


def print_split(result: dict[str, Any], mon: Monitor) -> None:
    """``evaluate --acts``' tables of one split: the metrics per order, then the cascade sweep (a
    monitor with a cascade)."""
    print(
        table(
            ["order", "F1", "precision", "recall", "FRR", "AUROC", "ECE"],
            [
                [str(n + 1)] + [f"{m[k]:.3f}" for k in ("f1", "precision", "recall", "frr", "auroc", "ece")]
                for n, m in enumerate(result["per_order"])
            ],
        )
    )
    if mon.cascade:
        print(
            table(
                [
                    "tau",
                    "F1",
                    "mean FLOPs per token / linear" if mon.streaming else "mean FLOPs / linear",
                    "exits per order",
                ],
                [
                    [f"{r['tau']:g}", f"{r['f1']:.3f}", f"{r['relative_flops']:.2f}", str(r["exit_histogram"])]
                    for r in result["cascade"]
                ],
            )
        )


def print_generation(run: Any, prompts: list[str], tok: Any) -> None:
    """``monitor``'s run, prompt by prompt: the score and exit order at every step, each generated
    token decoded, and whether and where the sequence was stopped or flagged."""
    for b, prompt in enumerate(prompts):
        print(f"\nprompt {b}: {prompt!r}")
        print(f"  step 0 (prompt only): score {float(run.scores[b][0]):.3f}, exit order {int(run.exit_orders[b][0])}")
        for t, token in enumerate(run.generated(b), start=1):
            if t < len(run.scores[b]):
                print(
                    f"  step {t:>3} {tok.decode([token])!r:>14}: score {float(run.scores[b][t]):.3f}, "
                    f"exit order {int(run.exit_orders[b][t])}"
                )
        state = (
            f"stopped at step {run.stopped_at[b]}"
            if run.stopped_at[b] is not None
            else (f"flagged first at step {run.first_flagged[b]}" if run.flagged[b] else "not flagged")
        )
        print(f"  {state}; generated: {run.texts(tok)[b]!r}")


def print_attributions(prompts: list[str], dicts: list[dict[str, Any]]) -> None:
    """``attribute``'s decisions, prompt by prompt: the logit and its probability, the split by order,
    the top neurons and the top pairs of each degree."""
    for b, (prompt, d) in enumerate(zip(prompts, dicts, strict=True)):
        print(
            f"\nprompt {b}: {prompt!r}\n  logit {d['logit']:.3f} (p = {1 / (1 + math.exp(-d['logit'])):.3f}); "
            f"by order: " + ", ".join(f"{o + 1}: {v:+.3f}" for o, v in enumerate(d["by_order"]))
        )
        print("  top neurons: " + ", ".join(f"{i} ({v:+.3f})" for i, v in d["top_neurons"]))
        for order, pairs in d["top_pairs"].items():
            print(f"  top pairs, degree {order}: " + ", ".join(f"{i}x{j} ({v:+.3f})" for i, j, v in pairs))
