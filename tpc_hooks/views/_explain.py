"""An explanation as a page: the tokens coloured by their share of the monitor's logit, the top tokens
and model parts, and a layer-by-(attention, MLP) heatmap (:meth:`tpc_hooks.Explanation.to_html`)."""

import math
from collections.abc import Sequence
from typing import Any

from ._html import _CONTROLS, _STYLE, HTML, _esc, _signed_color, _table

_EXTRA_STYLE = """<style>
.tpc-view table.heat td{min-width:4.5em}
.tpc-view table.heat th{font-weight:500}
.tpc-view .tok.unpooled{color:#8a8a8a}
.tpc-view .tok.hot{outline:1px solid #111}
</style>"""


def color_scale(values: Sequence[float]) -> float:
    """The size :func:`token_spans` gives full colour: the second largest ``|value|`` (the largest when
    the rest are 0), so one position far above the rest (a chat template's first token) saturates
    instead of washing out every other token.

    Example:
        >>> color_scale([9.4, -1.2, 0.3]), color_scale([2.0, 0.0])
        (1.2, 2.0)
    """
    sizes = sorted(abs(float(v)) for v in values if not math.isnan(float(v)))
    if len(sizes) > 1 and sizes[-2] > 0:
        return sizes[-2]
    return sizes[-1] if sizes else 0.0


def token_spans(tokens: Sequence[str], values: Sequence[float], pooled: Sequence[bool] | None = None) -> str:
    """Tokens as spans coloured by a signed value (red: towards a flag, blue: away, white: 0; full colour at
    :func:`color_scale`), each value in its tooltip; ``pooled`` False greys a token the pooling did not read.
    Every token is escaped.

    Example:
        >>> html = token_spans(["<s>", " kill"], [0.1, 2.0])
        >>> "&lt;s&gt;" in html, html.count('class="tok')
        (True, 2)
    """
    vals = [float(v) for v in values]
    scale = color_scale(vals)
    top = max(range(len(vals)), key=lambda i: vals[i], default=None)
    spans = []
    for i, (tok, v) in enumerate(zip(tokens, vals, strict=True)):
        cls = ["tok"]
        if pooled is not None and not pooled[i]:
            cls.append("unpooled")
        if i == top and v > 0:
            cls.append("hot")
        if "\n" in tok or "\r" in tok:
            cls.append("nl")
        tip = f"position {i} · contribution {v:+.4f}" + ("" if pooled is None or pooled[i] else " · not pooled")
        spans.append(
            f'<span class="{" ".join(cls)}" style="background-color:{_signed_color(v, scale)}" '
            f'data-value="{v:.6g}" title="{_esc(tip)}">{_esc(str(tok).translate(_CONTROLS))}</span>'
        )
    return "".join(spans)


def split_legend() -> str:
    """The legend of a split's view: the token colours, the grey of a token not pooled, what a part is."""
    return (
        '<div class="legend">each token coloured by its share of the logit: <span class="key" '
        f'style="background-color:{_signed_color(1.0, 1.0)}">towards a flag</span> '
        f'<span class="key" style="background-color:{_signed_color(-1.0, 1.0)}">away</span> '
        '&#183; <span class="key tok unpooled">grey text</span> not pooled (read, but carries nothing) '
        "&#183; hover a token for its value &#183; parts: what each block's attention and MLP wrote into the "
        "residual stream up to the site</div>"
    )


def _heatmap(layers: list[int], grid: Any) -> str:
    vals = [float(v) for row in grid.tolist() for v in row]
    scale = max((abs(v) for v in vals), default=0.0)
    rows = []
    for layer, (a, m) in zip(layers, grid.tolist(), strict=True):
        cells = "".join(
            f'<td class="val" style="background-color:{_signed_color(v, scale)}">{v:+.3f}</td>' for v in (a, m)
        )
        rows.append(f"<tr><th>{layer}</th>{cells}</tr>")
    return (
        '<table class="heat"><caption>by layer</caption><tr><th>layer</th><th>attention</th><th>MLP</th></tr>'
        f"{''.join(rows)}</table>"
    )


def explanation_html(ex: Any, rows: Sequence[int], *, k: int = 8, heatmap: bool = True) -> HTML:
    """Rows of an :class:`~tpc_hooks.Explanation` as static HTML (no script): per row a heading (score,
    flag, baseline, exit order), its tokens coloured by contribution, the top tokens and parts, and a
    layer-by-(attention, MLP) heatmap of the parts."""
    blocks = []
    for b in rows:
        logit, base = float(ex.logit[b]), float(ex.baseline[b])
        prob = float(ex.probs[b])
        flagged = bool(ex.flagged[b])
        head = [
            f"row {b}",
            f"score {prob:.4f} ({'flagged' if flagged else 'not flagged'} at threshold {ex.threshold:g})",
            f"logit {logit:+.4f} = baseline {base:+.4f} + tokens",
            f"exit order {int(ex.exit_order[b])}",
            f"{ex.site}, pooling {ex.pooling}",
        ]
        if ex.truncated[b]:
            head.append("cut at max_tokens")
        tops = ex.top_tokens(b, k, mode="absolute")
        parts = ex.top_components(b, k, mode="absolute")
        tables = [
            _table("top tokens", ["position", "token"], [[i, repr(t)] for i, t, _ in tops], [v for _, _, v in tops]),
            _table("top parts", ["part"], [[n] for n, _ in parts], [v for _, v in parts]),
        ]
        layers, grid = ex.by_layer(b)
        if heatmap and layers:
            tables.append(_heatmap(layers, grid))
        blocks.append(
            f'<div class="row"><div class="head"><strong>{_esc(" · ".join(head))}</strong></div>'
            f'<div class="text">{token_spans(ex.tokens[b], ex.by_token[b].tolist(), ex.pooled[b].tolist())}</div>'
            f"{''.join(tables)}</div>"
        )
    return HTML(
        f'<div class="tpc-view">{_STYLE}{_EXTRA_STYLE}{split_legend()}{"".join(blocks)}</div>',
        "tpc-hooks explanation",
    )
