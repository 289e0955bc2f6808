"""Model cards: the ``README.md`` that ``save_pretrained`` writes beside a head or monitor.

They state only what the object records; the functions read attributes and import neither
class (the classes call them from their ``model_card`` methods).
"""

import json
import math
import re
from typing import Any

from ._hub import is_repo_id

TAGS = ["tpc-hooks", "activation-probe", "safety-monitor", "interpretability"]


def _line(value: Any) -> str:
    """``value`` as one line of text (newlines and runs of whitespace become one space)."""
    return " ".join(str(value).split())


def _text(value: Any) -> str:
    """``value`` as inert Markdown text: one line, Markdown punctuation and HTML escaped."""
    s = _line(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|#])", r"\\\1", s)


def _code(value: Any) -> str:
    """``value`` as an inline code span that is safe inside a table cell."""
    s = _line(value).replace("|", "\\|")
    ticks = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (ticks + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _block(code: str, lang: str = "python") -> str:
    """A fenced code block whose fence no line of ``code`` can close."""
    ticks = max((len(m) for m in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, ticks + 1)
    return f"{fence}{lang}\n{code}\n{fence}"


def _num(value: Any) -> str:
    """A metric with 3 decimals, "n/a" for NaN, "not recorded" when missing or not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "not recorded"
    return "n/a" if math.isnan(value) else f"{value:.3f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _front_matter(name: Any = None) -> str:
    lines = ["---", "library_name: tpc-hooks", "tags:"] + [f"- {t}" for t in TAGS]
    if isinstance(name, str) and is_repo_id(name, need_org=True):
        lines.append(f"base_model: {name}")
    return "\n".join(lines + ["---"])


def _head_section(head: Any) -> str:
    if head.has_bounds:
        trust = f"yes (gate {'on' if head.gate else 'off'})"
    else:
        trust = "no"
    props = [
        ["d_model", str(head.d_model)],
        ["degree", str(head.degree)],
        ["ranks (R_2..R_N)", ", ".join(map(str, head.ranks)) or "none (linear probe)"],
        ["trust region", trust],
        ["escalate_only", "yes" if head.escalate_only else "no"],
    ]
    costs = [head.cost(n) for n in range(1, head.degree + 1)]
    cost_rows = [[str(c.order), str(c.params), str(c.flops)] for c in costs]
    return "\n\n".join(
        [
            "## The head",
            _table(["property", "value"], props),
            "Parameters and FLOPs of each truncation (order n uses degrees 1..n):",
            _table(["order", "params", "FLOPs"], cost_rows),
        ]
    )


def _monitor_section(mon: Any) -> str:
    bos = (
        "auto (when the tokenizer has a BOS token)" if mon.prepend_bos is None else ("yes" if mon.prepend_bos else "no")
    )
    if mon.cascade is None:
        cascade = "none (scores with the full polynomial)"
    else:
        cascade = f"exit benign at p <= {mon.cascade.lower:g}, harmful at p >= {mon.cascade.upper:g}"
    rows = [
        ["model", _code(mon.model_name) if mon.model_name else "not recorded"],
        ["site", _code(mon.site)],
        ["pooling", _code(mon.pooling)],
        *(
            [["reads", "the answer alone (a response monitor: the prompt is never scored alone)"]]
            if mon.answers
            else []
        ),
        ["chat_template", "yes" if mon.chat_template else "no"],
        ["prepend_bos", bos],
        ["max_tokens", "no truncation" if mon.max_tokens is None else str(mon.max_tokens)],
        ["threshold", f"{mon.threshold:g}"],
        ["cascade", cascade],
    ]
    if mon.sae_identity:
        ident = mon.sae_identity
        name = "/".join(str(v) for v in (ident.get("release"), ident.get("sae_id")) if v) or ident.get("class", "SAE")
        sha = str(ident.get("weights_sha256") or "not recorded")[:12]
        rows.append(["SAE", f"{_code(name)} (d_sae={_text(ident.get('d_sae'))}, weights sha256 {_code(sha)}...)"])
    return "\n\n".join(["## The monitor", _table(["setting", "value"], rows)])


def _recipe(head: Any) -> str | None:
    config = getattr(getattr(head, "history", None), "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    d = config.to_dict()
    keys = ("mode", "recipe", "epochs", "lr", "weight_decay", "trust_region", "gate", "shrink", "seed")
    parts = [f"{k}={d[k]!r}" for k in keys if k in d]
    return "Training recipe (`tpc.fit`): " + _code(", ".join(parts)) + "."


def _report_section(mon: Any) -> str:
    report = mon.report if isinstance(mon.report, dict) else {}
    val = report.get("validation")
    if not isinstance(val, dict):
        val = {}
    per_order = val.get("per_order")
    parts = ["## Training data and metrics"]
    data = report.get("data")
    parts.append(f"Data: {_text(data)}" if isinstance(data, str) and data.strip() else "Data: not recorded.")
    n_train, n_val = report.get("n_train"), val.get("n")
    parts.append(
        f"Training prompts: {n_train if isinstance(n_train, int) else 'not recorded'}; "
        f"validation prompts: {n_val if isinstance(n_val, int) else 'not recorded'}."
    )
    refit = report.get("refit")
    if isinstance(refit, dict):
        parts.append(
            f"Chosen on that split, then refit on all {refit.get('n', 'its')} prompts; threshold from "
            f"{_text(str(refit.get('threshold', 'not recorded')))}. The validation metrics are the split's head's."
        )
    if isinstance(per_order, list) and per_order:
        rows = []
        for i, m in enumerate(per_order, start=1):
            m = m if isinstance(m, dict) else {}
            rows.append([str(i)] + [_num(m.get(k)) for k in ("f1", "recall", "frr", "auroc")])
        parts.append(f"Validation metrics per truncation order (flagged at p >= {mon.threshold:g}):")
        parts.append(_table(["order", "F1", "recall", "FRR", "AUROC"], rows))
    else:
        parts.append("Validation metrics: not recorded.")
    recipe = _recipe(mon.head)
    if recipe:
        parts.append(recipe)
    return "\n\n".join(parts)


def _history_section(head: Any) -> str:
    parts = ["## Training"]
    history = getattr(head, "history", None)
    selected = getattr(history, "selected", None)
    if isinstance(selected, dict) and selected:
        rows = []
        for n in range(1, head.degree + 1):
            rec = selected.get(n, selected.get(str(n)))
            rows.append([str(n), _num(rec.get("val_f1")) if isinstance(rec, dict) else "not recorded"])
        parts.append("Validation F1 of each degree when it was selected during training:")
        parts.append(_table(["order", "validation F1"], rows))
    else:
        parts.append("Training data and metrics: not recorded.")
    recipe = _recipe(head)
    if recipe:
        parts.append(recipe)
    return "\n\n".join(parts)


def _usage(code: list[str], repo_id: str | None) -> str:
    target = json.dumps(repo_id if repo_id else "path/to/this/directory")
    return "\n\n".join(["## How to load", _block("\n".join(line.replace("{target}", target) for line in code))])


_PROPERTY = (
    " Every truncation to orders 1..n is itself a classifier; order 1 is the linear probe, higher orders add"
    " symmetric CP-factored interaction terms."
)


def _kind(head: Any) -> str:
    return "linear probe" if head.degree == 1 else f"degree-{head.degree} truncated polynomial classifier (TPC)"


def head_card(head: Any, *, repo_id: str | None = None) -> str:
    """The model card (Markdown with YAML front matter) of a bare head: its shape, the cost of
    every truncation and its training history; anything missing reads "not recorded".

    Args:
        head: a :class:`~tpc_hooks.TPC`.
        repo_id: the hub id the loading snippet names (default: a placeholder path).

    Example:
        >>> import tpc_hooks as tpc
        >>> head_card(tpc.TPC(d_model=8, degree=2, rank=2)).splitlines()[:2]
        ['---', 'library_name: tpc-hooks']
    """
    intro = f"A {_kind(head)} on a language model's activations (a bare `TPC` head, not bound to a model or site)."
    usage = _usage(
        [
            "import tpc_hooks as tpc",
            "",
            "head = tpc.TPC.from_pretrained({target})",
            "logits = head(z)  # z: [batch, d_model] activations; head(z, order=1) is the linear probe",
        ],
        repo_id,
    )
    return (
        "\n\n".join(
            [_front_matter(), "# tpc-hooks head", intro + _PROPERTY, _head_section(head), _history_section(head), usage]
        )
        + "\n"
    )


def monitor_card(mon: Any, *, repo_id: str | None = None) -> str:
    """The model card of a monitor: its settings (model, site, pooling, tokenisation, threshold,
    cascade, SAE), its head and what ``monitor.report`` records of its training data and metrics.

    Args:
        mon: a :class:`~tpc_hooks.Monitor`.
        repo_id: the hub id the loading snippet names (default: a placeholder path).
    """
    title = "# tpc-hooks safety monitor" + (f" for {_text(mon.model_name)}" if mon.model_name else "")
    intro = (
        f"A {_kind(mon.head)} on a language model's activations at {_code(mon.site)}, packaged as a "
        "tpc-hooks `Monitor` that scores prompts and watches generation."
    )
    sae = ", sae=sae  # the SAE it was trained with" if mon.sae_identity else ""
    model = _line(mon.model_name) if mon.model_name else "the model it was trained on"
    usage = _usage(
        [
            "import tpc_hooks as tpc",
            "",
            "monitor = tpc.Monitor.from_pretrained({target}" + sae + ")",
            f"# model: a TransformerLens or nnsight model of {model}",
            "result = monitor.score(model, prompts)  # result.probs: probability of the harmful class",
            'run = monitor.generate(model, prompts, max_new_tokens=32, action="stop")',
        ],
        repo_id,
    )
    return (
        "\n\n".join(
            [
                _front_matter(mon.model_name),
                title,
                intro + _PROPERTY,
                _monitor_section(mon),
                _head_section(mon.head),
                _report_section(mon),
                usage,
            ]
        )
        + "\n"
    )


def training_section(record: dict[str, Any]) -> str:
    """The model card's account of a packaged monitor's training run, rendered from the record the
    run wrote beside it (``training.json``: the command, the call, its seed and data, the
    :func:`tpc_hooks.evaluate` table and its scores of a few prompts), so that every figure on the
    card is one the run measured.

    Example:
        >>> rec = {"command": "make pretrained", "call": "tpc.train_monitor(...)", "seed": 0,
        ...        "data": "the packaged set", "evaluate": "| method | a |", "scores": [["Hi", 0.01, False]]}
        >>> print(training_section(rec).splitlines()[0])
        ## How this monitor was trained
    """
    rows = [[_text(p), f"{s:.4f}", "yes" if f else "no"] for p, s, f in record["scores"]]
    return "\n\n".join(
        [
            "## How this monitor was trained",
            f"Regenerated by `{_line(record['command'])}` (seed {int(record['seed'])}) on {_text(record['data'])}:",
            _block(str(record["call"])),
            "## Its evaluation",
            "`tpc.evaluate` of this monitor beside a linear probe trained on its rows, on sets another "
            "hand built (the run's output):",
            str(record["evaluate"]).strip(),
            f"## Its scores of {len(rows)} prompts",
            "What the run recorded (probability of the harmful class, flagged at the monitor's "
            "threshold) for the README's two prompts, then harmful and benign prompts of the test split "
            "(a seeded draw, half each); the package's tests score them again:",
            _table(["prompt", "score", "flagged"], rows),
        ]
    )
