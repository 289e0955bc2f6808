"""HTML views and plots of tpc-hooks results (the face: :mod:`tpc_hooks.views`)."""

import html
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, SupportsFloat

from ._errors import TPCHooksError
from ._kernel import flagged

__all__ = ["HTML", "generation_html", "token_scores_html", "attribution_html", "score_color", "plot_sweep",
           "colored_tokens"]

_LOW, _MID, _HIGH = (146, 197, 222), (247, 247, 247), (214, 96, 77)  # RdBu: #92c5de, #f7f7f7, #d6604d
NAN_COLOR = "#b39ddb"  # a NaN score (non-finite activations): off the scale, and flagged

# C0 controls (but tab and newline) and DEL as their Unicode control pictures: an HTML parser
# drops or rewrites some of them (NUL, CR), and none of them is visible as it is.
_CONTROLS = {c: chr(0x2400 + c) for c in range(0x20) if c not in (9, 10)} | {0x7F: "\u2421"}

_STYLE = """<style>
.tpc-view{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;font-size:13px;color:#111;background:#fff;
  padding:4px 2px;max-width:72em}
.tpc-view .text{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre-wrap;
  overflow-wrap:anywhere;line-height:2;border:1px solid #ddd;border-radius:4px;padding:4px 8px;margin:2px 0 12px}
.tpc-view .tok{border-radius:2px;padding:1px 0}
.tpc-view .tok:empty{padding:1px 3px}
.tpc-view [data-order]::after{content:attr(data-order);font-size:.62em;vertical-align:super;color:#555;
  margin-left:1px}
.tpc-view .flag{border-bottom:2px solid #111}
.tpc-view .prompt.flag{border-bottom:none;outline:2px solid #111;outline-offset:1px}
.tpc-view .nan{background-image:repeating-linear-gradient(45deg,transparent 0 3px,rgba(0,0,0,.2) 3px 5px)}
.tpc-view .first::before{content:"\\2691";color:#b2182b;font-weight:bold;margin-right:1px}
.tpc-view .tok.nl::before{content:"\\21B5";color:#999}
.tpc-view .tok.first.nl::before{content:"\\2691\\21B5"}
.tpc-view .prompt{border-radius:3px;padding:2px 3px}
.tpc-view .prompt .tok{color:#3d3d3d}
.tpc-view .unscored{color:#6b6b6b;border-bottom:1px dotted #888}
.tpc-view .stop{font-family:system-ui,sans-serif;font-size:.8em;background:#111;color:#fff;border-radius:3px;
  padding:0 4px;margin-left:4px}
.tpc-view .head{font-size:12px;color:#333;margin:6px 0 0}
.tpc-view .legend{font-size:12px;color:#333;line-height:2;border-bottom:1px solid #eee;padding-bottom:4px;
  margin-bottom:6px}
.tpc-view .scale{display:inline-block;width:160px;height:10px;border:1px solid #bbb;vertical-align:middle;
  background:linear-gradient(to right,#92c5de,#f7f7f7,#d6604d);margin:0 4px}
.tpc-view .key{font-family:ui-monospace,Menlo,Consolas,monospace;padding:0 3px;border-radius:2px}
.tpc-view .label{font-family:ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;overflow-wrap:anywhere;
  color:#444}
.tpc-view table{border-collapse:collapse;margin:4px 16px 10px 0;display:inline-table;vertical-align:top;
  font-size:12px}
.tpc-view caption{text-align:left;font-weight:600;padding-bottom:2px;white-space:nowrap}
.tpc-view th,.tpc-view td{border:1px solid #ddd;padding:2px 8px;text-align:left}
.tpc-view td.val{font-family:ui-monospace,Menlo,Consolas,monospace;text-align:right}
</style>"""


@dataclass(frozen=True)
class HTML:
    """A rendered view: an HTML fragment (``content``, with its own scoped ``<style>``).

    Jupyter displays it (``_repr_html_``); ``str(view)`` is the fragment; :meth:`save` writes a
    standalone page.

    Example:
        >>> view = token_scores_html(["Hello", " world"], [0.1, 0.9], threshold=0.5)
        >>> view._repr_html_() == str(view) == view.content
        True
        >>> view.page().startswith("<!DOCTYPE html>")
        True
    """

    content: str
    title: str = "tpc-hooks"

    def __str__(self) -> str:
        return self.content

    def __repr__(self) -> str:
        return f"HTML({self.title!r}, {len(self.content)} characters; .save(path) writes a page)"

    def _repr_html_(self) -> str:
        return self.content

    def page(self) -> str:
        """The fragment as a standalone HTML document (UTF-8; scripts and outside resources
        forbidden by its Content-Security-Policy)."""
        return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
                "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
                f"<title>{html.escape(self.title, quote=True)}</title>\n</head>\n<body>\n{self.content}\n</body>\n</html>\n")

    def save(self, path: str | Path) -> Path:
        """Writes :meth:`page` to ``path`` (UTF-8; parent folders created) and returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.page(), encoding="utf-8", errors="replace")
        return path


def _threshold(threshold: Any) -> float:
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        t = float("nan")
    if isinstance(threshold, bool) or not 0.0 <= t <= 1.0:
        raise TPCHooksError(f"threshold must be a probability in [0, 1] (e.g. monitor.threshold); got {threshold!r}")
    return t


def _floats(values: Any) -> list[float]:
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [float(v) for v in values]


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], f: float) -> str:
    r, g, bl = (round(x + (y - x) * f) for x, y in zip(a, b))
    return f"#{r:02x}{g:02x}{bl:02x}"


def _color_at(pos: float) -> str:
    """The scale at ``pos`` in [0, 1] (0.5: the neutral middle)."""
    pos = min(max(pos, 0.0), 1.0)
    return _mix(_LOW, _MID, pos * 2) if pos <= 0.5 else _mix(_MID, _HIGH, pos * 2 - 1)


def score_color(score: SupportsFloat, threshold: SupportsFloat = 0.5) -> str:
    """The background colour (``#rrggbb``) the views give a probability ``score``.

    The scale runs from light blue (0) through near-white (``threshold``) to red (1), linear on
    each side of the threshold, so a flagged score (``>= threshold``) is always on the red side.
    A NaN score (non-finite activations) gets :data:`NAN_COLOR`.

    Example:
        >>> score_color(0.0, 0.2), score_color(0.2, 0.2), score_color(1.0, 0.2)
        ('#92c5de', '#f7f7f7', '#d6604d')
        >>> score_color(float("nan"))
        '#b39ddb'
    """
    t = _threshold(threshold)
    s = float(score)
    if math.isnan(s):
        return NAN_COLOR
    s = min(max(s, 0.0), 1.0)
    if s < t:
        return _color_at(0.5 * s / t)
    return _color_at(0.5 if t >= 1.0 else 0.5 + 0.5 * (s - t) / (1.0 - t))


def _signed_color(value: float, scale: float) -> str:
    """Blue (negative) to red (positive), white at 0, full colour at ``|value| = scale``."""
    if math.isnan(value):
        return NAN_COLOR
    return _color_at(0.5 + 0.5 * value / scale) if scale > 0 else _color_at(0.5)


def _flags(decisions: Any, b: int, scores: list[float], threshold: float) -> list[bool]:
    """Each step's flag: the monitoring runs' rule on ``decisions[b]`` (decision logits) when
    given, else on the probabilities ``scores``."""
    if decisions:
        import torch


        return [bool(f) for f in flagged(torch.as_tensor(decisions[b]).detach().float().cpu(), threshold)]
    return [_is_flagged(s, threshold) for s in scores]


def _is_flagged(score: float, threshold: float) -> bool:
    """The monitoring runs' flag rule: ``score >= threshold``, and NaN counts as flagged."""
    return math.isnan(score) or score >= threshold


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _score_text(s: float) -> str:
    return "NaN (non-finite activations; counts as flagged)" if math.isnan(s) else f"{s:.4f}"


def _token(text: str, classes: list[str], *, score: float | None = None, threshold: float = 0.5,
           step: int | None = None, order: int | None = None, what: str = "step {}", flag: bool | None = None) -> str:
    """One token's ``<span class="tok">``: its text escaped (controls as control pictures), its
    colour and flag from ``score`` (None: unscored; ``flag``: the run's own flag, when known),
    its details in the tooltip."""
    cls = ["tok", *classes]
    if "\n" in text or "\r" in text:
        cls.append("nl")
    attrs, tip = [], []
    if step is not None:
        attrs.append(f'data-step="{step}"')
        tip.append(what.format(step))
    if score is not None:
        if _is_flagged(score, threshold) if flag is None else flag:
            cls.append("flag")
        if math.isnan(score):
            cls.append("nan")
        attrs += [f'style="background-color:{score_color(score, threshold)}"', f'data-score="{score:.6g}"']
        tip.insert(0, f"score {_score_text(score)}")
    if order is not None:
        attrs.append(f'data-order="{order}"')
        tip.append(f"exit order {order}")
    if "flag" in cls:
        tip.append("flagged")
    attrs.insert(0, f'class="{" ".join(cls)}"')
    if tip:
        attrs.append(f'title="{_esc(" · ".join(tip))}"')
    return f"<span {' '.join(attrs)}>{_esc(text.translate(_CONTROLS))}</span>"


def _legend(threshold: float, *, prompt: bool = False) -> str:
    t = f"{threshold:g}"
    parts = [(f'score 0<span class="scale" title="0 &#8594; threshold {t} &#8594; 1"></span>1; '
              f"the neutral middle is the <strong>threshold {t}</strong>"),
             (f'<span class="key flag" style="background-color:{score_color(1.0, threshold)}">flagged</span> '
              "score &#8805; threshold"),
             (f'<span class="key flag nan" style="background-color:{NAN_COLOR}">NaN</span> non-finite activations '
              "(flagged)"),
             '<span class="key first"></span>first flagged',
             '<span class="key" data-order="k">token</span> exit order k of the cascade',
             "hover a token for its score"]
    if prompt:
        parts.insert(3, '<span class="key" style="color:#3d3d3d;border:1px solid #ccc">prompt</span> the prompt, '
                        "coloured by its score alone (step 0)")
        parts.insert(4, '<span class="key unscored">token</span> not scored')
        parts.insert(5, '<span class="stop">stopped</span> the action stopped the row')
    return '<div class="legend">' + " &#183; ".join(parts) + "</div>"


def _rows(rows: int | Sequence[int] | None, n: int) -> list[int]:
    out = list(range(n)) if rows is None else [rows] if hasattr(rows, "__index__") else list(rows)
    for i, b in enumerate(out):
        if isinstance(b, bool) or not hasattr(b, "__index__") or not 0 <= operator.index(b) < n:
            raise TPCHooksError(f"rows must index the run's {n} sequences (0..{n - 1}); got {b!r}")
        out[i] = operator.index(b)
    return out


def generation_html(run: Any, *, tokenizer: Any, threshold: SupportsFloat,
                    rows: int | Sequence[int] | None = None) -> HTML:
    """A monitored generation as text coloured token by token by the monitor's score.

    The prompt is shown greyed, coloured as a whole by its step-0 score (the pre-generation
    gate); generated token ``i`` (0-based) is coloured by ``run.scores[b][i + 1]``, the score of
    the prompt and the first ``i + 1`` generated tokens. Flagged steps (``score >= threshold``,
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
            raise TPCHooksError(f"row {b} has {len(scores)} scores and {len(orders)} exit orders for {n_gen} generated "
                                f"tokens; expected at most {n_gen + 1} of each (step 0 is the prompt), one order per "
                                "score. Was the run built by Monitor.generate?")
        words = [str(tokenizer.decode([i])) for i in seq]
        flags = _flags(getattr(run, "decision_logits", None), b, scores, t)
        first = next((i for i, f in enumerate(flags) if f), None)
        order_at = orders + [None] * (len(scores) - len(orders))  # no orders given: None for each step
        head = [f"row {b}", f"{pl} prompt tokens, {n_gen} generated"]
        if scores:
            head.append(f"prompt score {_score_text(scores[0])}"
                        + (f" (exit order {order_at[0]})" if order_at[0] is not None else ""))
        head.append("not flagged" if first is None else f"first flagged at step {first}")
        if stopped_at[b] is not None:
            head.append(f"stopped at step {stopped_at[b]}")
        prompt_cls = ["prompt"]
        attrs = []
        if scores:
            s0 = scores[0]
            prompt_cls += (["flag"] if flags[0] else []) + (["nan"] if math.isnan(s0) else []) + \
                (["first"] if first == 0 else [])
            tip = [f"prompt alone (step 0): score {_score_text(s0)}"]
            if order_at[0] is not None:  # in the tooltip and the heading: a superscript would trail the prompt
                tip.append(f"exit order {order_at[0]}")
            attrs += [f'style="background-color:{score_color(s0, t)}"', f'data-score="{s0:.6g}"', 'data-step="0"',
                      f'title="{_esc(" · ".join(tip + (["flagged"] if flags[0] else [])))}"']
        attrs.insert(0, 'class="' + " ".join(prompt_cls) + '"')
        spans = ["<span " + " ".join(attrs) + ">"]
        spans += [_token(w, []) for w in words[:pl]]
        spans.append("</span>")
        for i, w in enumerate(words[pl:]):
            step = i + 1
            if step < len(scores):
                spans.append(_token(w, ["gen"] + (["first"] if first == step else []), score=scores[step],
                                    threshold=t, step=step, order=order_at[step], flag=flags[step]))
            else:
                spans.append(_token(w, ["gen", "unscored"], step=step, what="step {}: not scored"))
        if stopped_at[b] is not None:
            spans.append(f'<span class="stop" title="the action stopped this row at step {int(stopped_at[b])}">'
                         "stopped</span>")
        body.append(f'<div class="row" data-row="{b}"><div class="head">{_esc(" · ".join(head))}</div>'
                    f'<div class="text">{"".join(spans)}</div></div>')
    content = f'<div class="tpc-view">{_STYLE}{_legend(t, prompt=True)}{"".join(body)}</div>'
    return HTML(content, "tpc-hooks: monitored generation")


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
        raise TPCHooksError(f"token_scores_html needs one score (and exit order) per token; got {len(tokens)} tokens, "
                            f"{len(probs)} scores and {len(orders)} exit orders. Pass what Monitor.token_scores returned")
    dec = getattr(result, "decision_logits", None)
    flags = _flags(None if dec is None else [dec], 0, probs, t)
    first = next((i for i, f in enumerate(flags) if i >= unscored and f), None)
    head = [f"{len(tokens)} tokens"] + ([f"first {unscored} not scored (fixed prefix)"] if unscored else [])
    if probs:
        head.append(f"whole prompt: score {_score_text(probs[-1])}")
    head.append("no prefix flagged" if first is None else f"first flagged at token {first}")
    spans = [_token(w, ["first"] if i == first else [], score=probs[i] if i >= unscored else None, threshold=t, step=i,
                    order=orders[i] if orders and i >= unscored else None, what="prefix of tokens 0..{}", flag=flags[i])
             for i, w in enumerate(tokens)]
    content = (f'<div class="tpc-view">{_STYLE}{_legend(t)}<div class="row"><div class="head">{_esc(" · ".join(head))}'
               f'</div><div class="text">{"".join(spans)}</div></div></div>')
    return HTML(content, "tpc-hooks: token scores")


def _table(caption: str, header: list[str], rows: list[list[Any]], values: list[float]) -> str:
    scale = max((abs(v) for v in values if not math.isnan(v)), default=0.0)
    th = "".join(f"<th>{_esc(h)}</th>" for h in [*header, "contribution"])
    trs = []
    for cells, v in zip(rows, values):
        tds = "".join(f"<td>{_esc(c)}</td>" for c in cells)
        trs.append(f'<tr>{tds}<td class="val" style="background-color:{_signed_color(v, scale)}">{v:+.4f}</td></tr>')
    return f"<table><caption>{_esc(caption)}</caption><tr>{th}</tr>{''.join(trs)}</table>"


def _named(labels: Any) -> Any:
    """A unit's cell: its id, with its label when the SAE names its features (labels keyed by id,
    or by its text as JSON keeps them)."""
    if not labels:
        return lambda u: u

    def name(u: Any) -> Any:
        label = labels.get(u, labels.get(str(u)))
        return u if label is None else f"{u}: {label}"
    return name


def _order_names(degree: int) -> list[str]:
    """The rows of a "logit by order" table: bias + linear, then each degree from 2."""
    return ["bias + linear"] + [f"degree {o}" for o in range(2, degree + 1)]


def _unit_tables(top: Sequence[Any], pairs: dict[Any, Sequence[Any]], unit: str, labels: Any = None) -> list[str]:
    """Tables of the top units ``[(id, value)]`` and of the top pairs of each order
    ``{order: [(i, j, value)]}``, each unit named by its label when ``labels`` has one."""
    name = _named(labels)
    parts = [_table(f"top {unit}s (all orders)", [unit], [[name(i)] for i, _ in top], [v for _, v in top])]
    for o, ps in sorted(pairs.items(), key=lambda kv: int(kv[0])):
        parts.append(_table(f"top pairs, degree {o} (2·M_ij)", ["i", "j"], [[name(i), name(j)] for i, j, _ in ps],
                            [v for _, _, v in ps]))
    return parts


def attribution_html(attribution: Any, *, inputs: int | Sequence[int] | None = None, k: int = 8,
                     labels: Sequence[str] | None = None) -> HTML:
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
        >>> attr = tpc.attribute(tpc.TPC(d_model=6, degree=3, rank=2), torch.randn(2, 6))
        >>> view = attribution_html(attr, labels=["<i>first</i>", "second"], k=3)
        >>> str(view).count("<table>"), "&lt;i&gt;first&lt;/i&gt;" in str(view)
        (6, True)
    """
    if not all(hasattr(attribution, a) for a in ("by_order", "logit", "top_neurons", "top_pairs")):
        raise TPCHooksError(f"attribution_html needs what tpc_hooks.attribute returns; got {type(attribution).__name__}")
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
        head = [f"input {r}"] + ([f"site {attribution.site}"] if attribution.site else []) + \
            [f"basis {attribution.basis}", f"logit {float(attribution.logit[r]):+.4f}",
             f"bias {float(attribution.bias[r]):+.4f}"]
        parts = [f'<div class="head">{_esc(" · ".join(head))}</div>']
        if labels is not None:
            parts.append(f'<div class="label">{_esc(str(labels[r]).translate(_CONTROLS))}</div>')
        parts.append(_table("logit by order", ["order"], [[m] for m in _order_names(degree)], by_order))
        top = attribution.top_neurons(min(k, units), input=r)
        pairs = {2: attribution.top_pairs(min(k, units * (units - 1) // 2), 2, input=r, mode="absolute")} \
            if degree >= 2 and units >= 2 else {}
        parts += _unit_tables(top, pairs, "feature" if attribution.basis != "residual" else "neuron",
                             getattr(attribution, "feature_labels", None))
        blocks.append(f'<div class="row" data-input="{r}">{"".join(parts)}</div>')
    legend = ('<div class="legend"><span class="key" style="background-color:#d6604d">+</span> raises the logit '
              '(towards flagged) &#183; <span class="key" style="background-color:#92c5de">&#8722;</span> lowers it '
              "&#183; full colour at each table's largest magnitude &#183; an attribution explains pooled "
              "activations: no per-token scores</div>")
    return HTML(f'<div class="tpc-view">{_STYLE}{legend}{"".join(blocks)}</div>', "tpc-hooks: attribution")


def plot_sweep(rows: Sequence[dict[str, Any]], ax: Any = None, label: str = "TPC cascade"):
    """F1 against relative FLOPs for the rows of :meth:`Cascade.sweep` (needs matplotlib)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    xs = [r["relative_flops"] for r in rows]
    ax.plot(xs, [r["f1"] for r in rows], marker="o", label=label)
    for r in rows:
        ax.annotate(f"τ={r['tau']:g}", (r["relative_flops"], r["f1"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
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
