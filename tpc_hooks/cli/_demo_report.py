"""What ``tpc-hooks demo`` writes besides its results: ``report.md`` (its tables), the plots, one
page per live generation and the attribution's page, and a screenshot of one of them."""

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..views import HTML, attribution_html, generation_html, screenshot

log = logging.getLogger("tpc_hooks._demo")


def table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells])


def plots(out: Path, res: dict[str, Any]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed; skipping plots (pip install 'tpc-hooks[plot]')")
        return []
    files = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, split in zip(axes, ("test", "heldout"), strict=True):
        if not res["f1"][split]:
            ax.set_axis_off()
            continue
        for method in res["methods"]:
            rows = [r for r in res["f1"][split] if r["method"] == method]
            ax.plot([r["order"] for r in rows], [r["f1"] for r in rows], marker="o", label=method)
        ax.set_title(f"F1 by order ({split})")
        ax.set_xlabel("order (TPC truncation / MLP match / early exit)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("F1")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "f1_by_order.png", dpi=120)
    files.append("f1_by_order.png")

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, rows in (
        ("TPC cascade", res["cascade"]["tpc"]),
        ("early-exit MLP cascade", res["cascade"]["early_exit"]),
    ):
        ax.plot([r["relative_flops"] for r in rows], [r["f1"] for r in rows], marker="o", label=name)
    ax.set_xlabel("mean FLOPs / linear probe FLOPs")
    ax.set_ylabel("test F1")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "cascade.png", dpi=120)
    files.append("cascade.png")

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    taus = [r["tau"] for r in res["cascade"]["tpc"]]
    hist = np.array([r["exit_histogram"] for r in res["cascade"]["tpc"]], dtype=float)
    bottom = np.zeros(len(taus))
    for o in range(hist.shape[1]):
        ax.bar([str(t) for t in taus], hist[:, o], bottom=bottom, label=f"order {o + 1}")
        bottom += hist[:, o]
    ax.set_xlabel("tau")
    ax.set_ylabel("test prompts exiting at each order")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "exit_orders.png", dpi=120)
    files.append("exit_orders.png")

    fig, ax = plt.subplots(figsize=(5, 3.2))
    cal = res["calibration"]
    xs = np.arange(len(cal))
    ax.bar(xs - 0.2, [c["ece_before"] for c in cal], 0.4, label="before")
    ax.bar(xs + 0.2, [c["ece_after"] for c in cal], 0.4, label="after (T, b per order)")
    ax.set_xticks(xs, [str(c["order"]) for c in cal])
    ax.set_xlabel("order")
    ax.set_ylabel("validation ECE")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "calibration.png", dpi=120)
    files.append("calibration.png")
    plt.close("all")
    return files


def pages(
    out: Path, run: Any, tok: Any, threshold: float, attr: Any, attr_prompt: str, attr_sae: Any = None
) -> dict[str, Any]:
    """One HTML page per live generation, the attribution's page (in neurons, then in the SAE's
    labelled features when there is one), and a screenshot of the first flagged generation's page
    (the first page where none was flagged)."""
    live = []
    for b in range(len(run.sequences)):
        generation_html(run, tokenizer=tok, threshold=threshold, rows=b).save(out / f"live_{b}.html")
        live.append(f"live_{b}.html")
    page = str(attribution_html(attr, labels=[attr_prompt]))
    if attr_sae is not None:
        page += str(attribution_html(attr_sae, labels=[attr_prompt]))
    HTML(page, "tpc-hooks: attribution").save(out / "attribution.html")
    shot = next((b for b, f in enumerate(run.flagged) if f), 0)
    png = out / f"live_{shot}.png"
    return {
        "live": live,
        "attribution": "attribution.html",
        "screenshot": png.name if screenshot(out / live[shot], png) else None,
    }


def render_report(res: dict[str, Any]) -> str:
    """The run's report as Markdown (what ``report.md`` holds)."""
    n = res["degree"]
    parts = [
        f"# tpc-hooks demo: {res['model']} via {res['toolkit']}, `{res['site']}`",
        "Data (offline, packaged): "
        + ", ".join(f"{k} {v}" for k, v in res["sizes"].items())
        + f". TPC degree {n}, rank {res['rank']}, up to {res['epochs']} epochs per degree"
        + (" (quick run)" if res["quick"] else "")
        + ".",
    ]
    if res.get("deployment"):
        parts += _deployment_section(res["deployment"], res.get("intent"))
    if res.get("outside"):
        parts += [
            "## On sets another hand built: the deployed monitor beside a probe on its own rows",
            "`tpc.evaluate` (`tpc-hooks evaluate --monitor monitor`): recall on harmful sets and the share "
            "flagged of benign ones that no template of this package wrote, the probe trained on the monitor's "
            "own training rows (curves: [outside.png](outside.png)).",
            res["outside"]["markdown"],
        ]
    if res.get("deployment"):
        parts.append("The tables below train the paper's methods on the same split and score them at logit 0.")
    parts += _f1_sections(res)
    if res.get("guards"):
        parts.append(_guards_line(res["guards"]))
    parts += _cascade_sections(res)
    parts.append("## Live monitored generations (action='stop'; score per step)")
    for g in res["live"]:
        parts.append(
            f"- label {g['label']}, stopped at step {g['stopped_at']}: {g['prompt'][:80]!r}\n"
            f"  scores {g['scores']}\n  exit orders {g['exit_orders']}\n  generated: {g['generated'][:120]!r}"
        )
    parts += _attribution_section(res["attribution"])
    if res.get("pages"):
        parts.append(_pages_section(res["pages"]))
    parts += ["## Time per stage (s)", table(list(res["seconds"]), [list(res["seconds"].values())])]
    if res.get("plots"):
        parts.append("## Plots\n" + "\n".join(f"![{p}]({p})" for p in res["plots"]))
    return "\n\n".join(parts) + "\n"


def _deployment_section(dep: dict[str, Any], intent: Any) -> list[str]:
    """The report's section on the deployed monitor (``train_monitor``'s default): per order, recall
    and the benign and hard-negative flag rates; the orders kept; the rate flagged per source."""
    cols = [k for k in dep["rows"][0] if k != "order"]
    parts = [
        "## What a deployment sees: `train_monitor`'s default, per order",
        "Trained on the training split by `tpc.train_monitor` as shipped (the prompts as given; an order "
        "above 1 kept only where it adds at the operating point and catches no fewer than order 1, the "
        "linear probe, on the phrasing rewrites of the validation prompts, which the fit never saw"
        + ("" if intent is None else f"; here with `intent={tuple(intent)}`")
        + "). Each order at its own threshold flagging 1% of the validation "
        "split's everyday benign prompts; `deployed`: the saved monitor's own threshold and policy. Percent "
        "flagged: "
        "`recall` of the test split's harmful prompts, its `ordinary benign` prompts, its `overrefusal` "
        "(safe-but-edgy) questions, and hard negatives no training saw: intent flips of the test split's "
        "harmful requests in held-back wordings, and homonyms of the other verbs ("
        + ", ".join(f"{k} {v}" for k, v in sorted(dep["n_hard"].items()))
        + ").",
        table(["order"] + cols, [[r["order"]] + [f"{100 * r[c]:.1f}" for c in cols] for r in dep["rows"]]),
    ]
    if dep.get("orders"):
        parts.append(f"Orders kept: {dep['orders']['kept']} of {dep['orders']['trained']}: {dep['orders']['note']}.")
    if dep.get("by_source"):
        extra = (
            " and the calibration prompts (ShareGPT first turns outside the set)"
            if "calibration" in dep["by_source"]
            else ""
        )
        parts.append(
            "The deployed threshold, set on the everyday sources' benign "
            + (
                "prompts' out-of-fold scores (the head refit on every prompt)"
                if dep.get("refit")
                else "validation prompts"
            )
            + f"{extra}, flags of "
            'each source\'s (`report["operating_point"]["by_source"]`): '
            + ", ".join(
                f"{k} {100 * v['rate']:.1f}% ({v['flagged']} of {v['n']})" for k, v in sorted(dep["by_source"].items())
            )
            + "."
        )
    return parts


def _f1_sections(res: dict[str, Any]) -> list[str]:
    """The report's F1-by-order tables, one per split scored (test, and the held-out source): a row
    per method, a column per order."""
    n = res["degree"]
    parts = []
    for split in [k for k in ("test", "heldout") if res["f1"][k]]:
        rows = []
        for method in res["methods"]:
            by = {r["order"]: r for r in res["f1"][split] if r["method"] == method}
            rows.append([method] + [by[o]["f1"] if o in by else "" for o in range(1, n + 1)])
        parts.append(f"## F1 by order, {split}" + (" (a source never seen in training)" if split == "heldout" else ""))
        parts.append(table(["method"] + [str(o) for o in range(1, n + 1)], rows))
    return parts


def _guards_line(g: dict[str, Any]) -> str:
    """The report's line on the TPC's out-of-distribution guards: its settings and the share of each
    split outside its trust region."""
    return (
        "Out-of-distribution guards of the TPC (fit's defaults; `tpc_paper` is the paper's exact recipe): "
        + ", ".join(
            f"{k}={v}" for k, v in g["settings"].items() if k in ("trust_region", "gate", "shrink", "escalate_only")
        )
        + ". Prompts outside the trust region (scored by the linear probe from the degree they leave "
        "it at): " + ", ".join(f"{k} {v:.1%}" for k, v in g["outside"].items()) + "."
    )


def _cascade_sections(res: dict[str, Any]) -> list[str]:
    """The report's cascade sweeps on the test split (the TPC's, the early-exit MLP's) and the
    per-order calibration on validation."""
    rows = [[r["tau"], r["f1"], r["relative_flops"], str(r["exit_histogram"])] for r in res["cascade"]["tpc"]]
    parts = [
        "## TPC cascade on the test split (calibrated per order)",
        table(["tau", "F1", "mean FLOPs / linear", "exits per order"], rows),
    ]
    rows = [[r["tau"], r["f1"], r["relative_flops"]] for r in res["cascade"]["early_exit"]]
    parts += ["## Early-exit MLP cascade on the test split", table(["tau", "F1", "mean FLOPs / linear"], rows)]
    rows = [[c["order"], c["temperature"], c["bias"], c["ece_before"], c["ece_after"]] for c in res["calibration"]]
    parts += ["## Calibration (validation)", table(["order", "T", "b", "ECE before", "ECE after"], rows)]
    return parts


def _attribution_section(a: dict[str, Any]) -> list[str]:
    """The report's attribution section: the flagged prompt's logit by order, its top neuron pairs,
    and the same decision in SAE features where the run has them."""
    parts = [
        f"## Attribution of the most confidently flagged harmful test prompt\n{a['prompt'][:160]!r}: logit "
        f"{a['logit']:.3f} = bias {a['bias']:.3f} + orders {[round(v, 3) for v in a['by_order']]}",
        table(["i", "j", "pair contribution (degree 2)"], [list(p) for p in a["top_pairs"]["2"]]),
    ]
    if a.get("sae"):
        f, rec = a["sae"], a["sae"]["reconstruction"]
        name = lambda u: f"{u}: {f['labels'][str(u)]}" if str(u) in f["labels"] else str(u)  # noqa: E731
        parts += [
            f"The same decision in the features of an SAE trained on the packaged prompts at the site "
            f"(variance explained {rec['variance_explained']:.3f}, L0 {rec['l0']:.0f}, "
            f"{rec['dead_features']} of {rec['d_sae']} features never active); each feature named by its "
            "top-activating tokens:",
            table(["feature", "contribution (all orders)"], [[name(u), round(v, 4)] for u, v in f["top_features"]]),
            table(
                ["i", "j", "feature pair (degree 2)"],
                [[name(i), name(j), round(v, 4)] for i, j, v in f["top_pairs"].get("2", [])],
            ),
        ]
    return parts


def _pages_section(p: dict[str, Any]) -> str:
    """The report's links to the pages: each live generation's, the attribution's, and the screenshot
    (or why there is none)."""
    shot = (
        f"![screenshot of {p['screenshot'][:-4]}.html]({p['screenshot']})"
        if p["screenshot"]
        else "(no screenshot: no Chromium was found, or it failed; see the log)"
    )
    return (
        "## Pages (open in a browser)\nEach live generation coloured token by token by the monitor's "
        "score: "
        + ", ".join(f"[{f}]({f})" for f in p["live"])
        + f"; the attribution: [{p['attribution']}]({p['attribution']}).\n\n"
        + shot
    )
