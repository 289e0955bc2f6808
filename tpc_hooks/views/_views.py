"""HTML views and plots of tpc-hooks results (the face: :mod:`tpc_hooks.views`)."""

import math
import operator
from collections.abc import Sequence
from typing import Any, SupportsFloat

from .._errors import TPCHooksError
from ._html import (
    _CONTROLS,
    _STYLE,
    HTML,
    _esc,
    _flags,
    _floats,
    _legend,
    _order_names,
    _score_text,
    _table,
    _threshold,
    _token,
    _unit_tables,
    score_color,
)

__all__ = [
    "HTML",
    "generation_html",
    "token_scores_html",
    "attribution_html",
    "score_color",
    "plot_sweep",
    "colored_tokens",
]


def _rows(rows: int | Sequence[int] | None, n: int) -> list[int]:
    out: list[Any] = list(range(n)) if rows is None else [rows] if hasattr(rows, "__index__") else list(rows)
    for i, b in enumerate(out):
        if isinstance(b, bool) or not hasattr(b, "__index__") or not 0 <= operator.index(b) < n:
            raise TPCHooksError(f"rows must index the run's {n} sequences (0..{n - 1}); got {b!r}")
        out[i] = operator.index(b)
    return out


def generation_html(
    run: Any, *, tokenizer: Any, threshold: SupportsFloat, rows: int | Sequence[int] | None = None
) -> HTML:
    """A monitored generation as text coloured token by token by the monitor's score.

    The prompt is shown greyed, coloured as a whole by its step-0 score (the pre-generation
    gate; a response monitor's, which never scores the prompt alone, says so); generated token
    ``i`` (0-based) is coloured by ``run.scores[b][i + 1]``, the score of the prompt and the first
    ``i + 1`` generated tokens (a response monitor: of those tokens alone). The heading says at
    which answer token the score first crossed the threshold. Flagged steps (``score >= threshold``,
    or NaN) are underlined (the prompt: outlined), the first is marked with a flag, each scored
    token carries its cascade exit order as a superscript and its score, step and order in a
    tooltip, and a row stopped by the action ends with a "stopped" mark. A token without a score
    (Hugging Face ``generate`` never scores the last token it appends) is dotted. Every token is
    escaped.

    Args:
        run: a :class:`~tpc_hooks.GenerationRun` (``sequences``, ``prompt_lengths``, ``scores``,
            ``exit_orders``, ``stopped_at``).
        tokenizer: decodes one token id at a time (``tokenizer.decode([id])``), e.g. the
            model's Hugging Face tokenizer.
        threshold: the flag threshold, usually ``monitor.threshold``.
        rows: which sequences (an index or a list); None: all.

    Returns:
        An :class:`HTML` view (Jupyter displays it; ``.save(path)`` writes a page).

    Raises:
        TPCHooksError: a bad threshold or row, or a row with more scores than steps.

    Example:
        >>> import torch, tpc_hooks as tpc
        >>> class Tok:
        ...     def decode(self, ids): return {0: "<s>", 1: " Hi", 2: " there"}[ids[0]]
        >>> run = tpc.GenerationRun(sequences=[[0, 1, 2]], prompt_lengths=[2], scores=[torch.tensor([0.1, 0.8])],
        ...                         logits=[torch.zeros(2)], exit_orders=[torch.tensor([1, 3])], flops=[torch.zeros(2)],
        ...                         flagged=[True], first_flagged=[1], stopped_at=[1])
        >>> view = generation_html(run, tokenizer=Tok(), threshold=0.5)
        >>> "&lt;s&gt;" in str(view), 'class="tok gen first flag"' in str(view)
        (True, True)
    """
    t = _threshold(threshold)
    n = len(run.sequences)
    stopped_at = getattr(run, "stopped_at", None) or [None] * n
    body = []
    for b in _rows(rows, n):
        seq = [int(i) for i in run.sequences[b]]
        pl = int(run.prompt_lengths[b])
        scores = _floats(run.scores[b])
        orders = [int(o) for o in _floats(run.exit_orders[b])] if run.exit_orders is not None else []
        n_gen = len(seq) - pl
        if len(scores) > n_gen + 1 or len(orders) not in (0, len(scores)):
            raise TPCHooksError(
                f"row {b} has {len(scores)} scores and {len(orders)} exit orders for {n_gen} generated "
                f"tokens; expected at most {n_gen + 1} of each (step 0 is the prompt), one order per "
                "score. Was the run built by Monitor.generate?"
            )
        words = [str(tokenizer.decode([i])) for i in seq]
        flags = _flags(getattr(run, "decision_logits", None), b, scores, t)
        first = next((i for i, f in enumerate(flags) if f), None)
        order_at = orders + [None] * (len(scores) - len(orders))  # no orders given: None for each step
        head = [f"row {b}", f"{pl} prompt tokens, {n_gen} generated"]
        answer_only = _answer_only(run, b)  # a response monitor's run: step 0 (the prompt alone) is never scored
        if scores and answer_only:
            head.append("prompt not scored (a response monitor reads the answer)")
        elif scores:
            head.append(
                f"prompt score {_score_text(scores[0])}"
                + (f" (exit order {order_at[0]})" if order_at[0] is not None else "")
            )
        head.append(
            "not flagged"
            if first is None
            else "first flagged on the prompt"
            if first == 0
            else f"first flagged at answer token {first}"
        )
        if stopped_at[b] is not None:
            head.append(f"stopped at step {stopped_at[b]}")
        prompt_cls = ["prompt"]
        attrs = []
        if scores:
            s0 = scores[0]
            prompt_cls += (
                (["flag"] if flags[0] else []) + (["nan"] if math.isnan(s0) else []) + (["first"] if first == 0 else [])
            )
            tip = (
                ["prompt alone (step 0): not scored"]
                if answer_only
                else [f"prompt alone (step 0): score {_score_text(s0)}"]
            )
            if order_at[0] is not None:  # in the tooltip and the heading: a superscript would trail the prompt
                tip.append(f"exit order {order_at[0]}")
            attrs += [
                f'style="background-color:{score_color(s0, t)}"',
                f'data-score="{s0:.6g}"',
                'data-step="0"',
                f'title="{_esc(" · ".join(tip + (["flagged"] if flags[0] else [])))}"',
            ]
        attrs.insert(0, 'class="' + " ".join(prompt_cls) + '"')
        spans = ["<span " + " ".join(attrs) + ">"]
        spans += [_token(w, []) for w in words[:pl]]
        spans.append("</span>")
        for i, w in enumerate(words[pl:]):
            step = i + 1
            if step < len(scores):
                spans.append(
                    _token(
                        w,
                        ["gen"] + (["first"] if first == step else []),
                        score=scores[step],
                        threshold=t,
                        step=step,
                        order=order_at[step],
                        flag=flags[step],
                    )
                )
            else:
                spans.append(_token(w, ["gen", "unscored"], step=step, what="step {}: not scored"))
        if stopped_at[b] is not None:
            spans.append(
                f'<span class="stop" title="the action stopped this row at step {int(stopped_at[b])}">stopped</span>'
            )
        body.append(
            f'<div class="row" data-row="{b}"><div class="head">{_esc(" · ".join(head))}</div>'
            f'<div class="text">{"".join(spans)}</div></div>'
        )
    content = f'<div class="tpc-view">{_STYLE}{_legend(t, prompt=True)}{"".join(body)}</div>'
    return HTML(content, "tpc-hooks: monitored generation")


def _answer_only(run: Any, b: int) -> bool:
    """Whether row ``b`` of ``run`` was scored by a response monitor: its step 0 decides ``-inf``
    (nothing of the answer read yet)."""
    logits = getattr(run, "decision_logits", None)
    if logits is None or b >= len(logits) or not len(logits[b]):
        return False
    return bool(math.isinf(float(logits[b][0])) and float(logits[b][0]) < 0)


def token_scores_html(tokens: Sequence[str], result: Any, *, threshold: SupportsFloat, unscored: int = 0) -> HTML:
    """A prompt coloured token by token by the monitor's score of each prefix.

    Token ``t`` is coloured by ``result.probs[t]``, the score of the first ``t + 1`` tokens (what
    :meth:`tpc_hooks.Monitor.token_scores` returns); flagged prefixes (``score >= threshold``, or
    NaN) are underlined, the first is marked, and each token carries its cascade exit order
    (``result.exit_order[t]``) as a superscript and in its tooltip. Every token is escaped.

    Args:
        tokens: the token strings.
        result: a :class:`~tpc_hooks.CascadeResult` (``probs``, ``exit_order``), or just a
            sequence of probabilities (no exit orders shown).
        threshold: the flag threshold, usually ``monitor.threshold``.
        unscored: leading tokens the monitor does not score (a streaming monitor's ``skip``:
            the chat template's fixed prefix); shown uncoloured, never flagged.

    Returns:
        An :class:`HTML` view.

    Raises:
        TPCHooksError: a bad threshold, or not one score per token.

    Example:
        >>> view = token_scores_html(["<b>", " bomb"], [0.2, 0.7], threshold=0.5)
        >>> "&lt;b&gt;" in str(view), "<b>" in str(view)
        (True, False)
    """
    t = _threshold(threshold)
    tokens = [str(w) for w in tokens]
    probs = _floats(result.probs if hasattr(result, "probs") else result)
    orders = [int(o) for o in _floats(result.exit_order)] if getattr(result, "exit_order", None) is not None else []
    if len(probs) != len(tokens) or len(orders) not in (0, len(tokens)):
        raise TPCHooksError(
            f"token_scores_html needs one score (and exit order) per token; got {len(tokens)} tokens, "
            f"{len(probs)} scores and {len(orders)} exit orders. Pass what Monitor.token_scores returned"
        )
    dec = getattr(result, "decision_logits", None)
    flags = _flags(None if dec is None else [dec], 0, probs, t)
    first = next((i for i, f in enumerate(flags) if i >= unscored and f), None)
    head = [f"{len(tokens)} tokens"] + ([f"first {unscored} not scored (fixed prefix)"] if unscored else [])
    if probs:
        head.append(f"whole prompt: score {_score_text(probs[-1])}")
    head.append("no prefix flagged" if first is None else f"first flagged at token {first}")
    spans = [
        _token(
            w,
            ["first"] if i == first else [],
            score=probs[i] if i >= unscored else None,
            threshold=t,
            step=i,
            order=orders[i] if orders and i >= unscored else None,
            what="prefix of tokens 0..{}",
            flag=flags[i],
        )
        for i, w in enumerate(tokens)
    ]
    content = (
        f'<div class="tpc-view">{_STYLE}{_legend(t)}<div class="row"><div class="head">{_esc(" · ".join(head))}'
        f'</div><div class="text">{"".join(spans)}</div></div></div>'
    )
    return HTML(content, "tpc-hooks: token scores")


def attribution_html(
    attribution: Any, *, inputs: int | Sequence[int] | None = None, k: int = 8, labels: Sequence[str] | None = None
) -> HTML:
    """An attribution as small tables in the views' colours: the logit by order, the top
    neurons (or SAE features) and the top degree-2 pairs.

    An :class:`~tpc_hooks.Attribution` explains the head's logit for pooled activation
    vectors; it carries no per-token information, so this view has no token colouring: each
    value cell is red where it pushes the logit up (towards flagged) and blue where it pushes
    it down, full colour at the largest magnitude in its table.

    Args:
        attribution: what :func:`tpc_hooks.attribute` returned.
        inputs: which attributed inputs (an index or a list); None: all.
        k: how many neurons and pairs per table (fewer when there are fewer).
        labels: one text per attributed input, e.g. the prompts (shown escaped).

    Returns:
        An :class:`HTML` view.

    Raises:
        TPCHooksError: not an attribution, a bad input index or ``k``, or labels of another length.

    Example:
        >>> import torch, tpc_hooks as tpc
        >>> head = tpc.TPC(d_model=6, degree=3, rank=2)
        >>> _ = torch.nn.init.normal_(head.lambdas["2"])  # a new head's orders above 1 add 0: no pair to list
        >>> view = attribution_html(tpc.attribute(head, torch.randn(2, 6)), labels=["<i>first</i>", "second"], k=3)
        >>> str(view).count("<table>"), "&lt;i&gt;first&lt;/i&gt;" in str(view)
        (6, True)
    """
    if not all(hasattr(attribution, a) for a in ("by_order", "logit", "top_neurons", "top_pairs")):
        raise TPCHooksError(
            f"attribution_html needs what tpc_hooks.attribute returns; got {type(attribution).__name__}"
        )
    n = len(attribution)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise TPCHooksError(f"k must be a positive integer; got {k!r}")
    if labels is not None and len(labels) != n:
        raise TPCHooksError(f"labels must give one text per attributed input ({n}); got {len(labels)}")
    try:
        picked = _rows(inputs, n)
    except TPCHooksError:
        raise TPCHooksError(f"inputs must index the {n} attributed inputs (0..{n - 1}); got {inputs!r}") from None
    units = attribution.n_units
    degree = attribution.by_order.shape[1]
    blocks = []
    for r in picked:
        by_order = _floats(attribution.by_order[r])
        head = (
            [f"input {r}"]
            + ([f"site {attribution.site}"] if attribution.site else [])
            + [
                f"basis {attribution.basis}",
                f"logit {float(attribution.logit[r]):+.4f}",
                f"bias {float(attribution.bias[r]):+.4f}",
            ]
        )
        parts = [f'<div class="head">{_esc(" · ".join(head))}</div>']
        if labels is not None:
            parts.append(f'<div class="label">{_esc(str(labels[r]).translate(_CONTROLS))}</div>')
        parts.append(_table("logit by order", ["order"], [[m] for m in _order_names(degree)], by_order))
        top = attribution.top_neurons(min(k, units), input=r)
        top2 = (
            attribution.top_pairs(min(k, units * (units - 1) // 2), 2, input=r, mode="absolute")
            if degree >= 2 and units >= 2
            else []
        )
        nonzero = [p for p in top2 if p[2] != 0]  # none that adds exactly 0 (an order training left at zero)
        pairs: dict[Any, Sequence[Any]] = {2: nonzero} if nonzero else {}
        parts += _unit_tables(
            top,
            pairs,
            "feature" if attribution.basis != "residual" else "neuron",
            getattr(attribution, "feature_labels", None),
        )
        blocks.append(f'<div class="row" data-input="{r}">{"".join(parts)}</div>')
    legend = (
        '<div class="legend"><span class="key" style="background-color:#d6604d">+</span> raises the logit '
        '(towards flagged) &#183; <span class="key" style="background-color:#92c5de">&#8722;</span> lowers it '
        "&#183; full colour at each table's largest magnitude &#183; an attribution explains pooled "
        "activations: no per-token scores</div>"
    )
    return HTML(f'<div class="tpc-view">{_STYLE}{legend}{"".join(blocks)}</div>', "tpc-hooks: attribution")


def plot_sweep(rows: Sequence[dict[str, Any]], ax: Any = None, label: str = "TPC cascade"):
    """F1 against relative FLOPs for the rows of :meth:`Cascade.sweep` (needs matplotlib)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    xs = [r["relative_flops"] for r in rows]
    ax.plot(xs, [r["f1"] for r in rows], marker="o", label=label)
    for r in rows:
        ax.annotate(
            f"τ={r['tau']:g}", (r["relative_flops"], r["f1"]), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    ax.set_xlabel("mean FLOPs / linear probe FLOPs")
    ax.set_ylabel("F1")
    ax.grid(alpha=0.3)
    ax.legend()
    return ax


def colored_tokens(tokens: list[str], values: Any):
    """circuitsvis's token colouring of per-token values (e.g. :meth:`Monitor.token_scores`).

    Needs ``circuitsvis`` (``pip install circuitsvis``); returns its renderable object.
    """
    try:
        from circuitsvis.tokens import colored_tokens as _colored
    except ImportError:
        raise TPCHooksError("colored_tokens needs circuitsvis: pip install circuitsvis") from None
    return _colored(tokens=list(tokens), values=[float(v) for v in values])
