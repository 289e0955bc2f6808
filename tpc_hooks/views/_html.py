"""The views' building blocks: the :class:`HTML` fragment, the colour scale bent at the threshold,
one token's span, the legend and the tables of contributions (the pages: ``_views`` and ``_review``)."""

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, SupportsFloat

from .._errors import TPCHooksError
from ..metrics import flagged

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
        >>> view = HTML('<div class="tpc-view">a view</div>', "a view")
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
        return (
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(self.title, quote=True)}</title>\n</head>\n<body>\n{self.content}\n</body>\n</html>\n"
        )

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
    r, g, bl = (round(x + (y - x) * f) for x, y in zip(a, b, strict=True))
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


def _token(
    text: str,
    classes: list[str],
    *,
    score: float | None = None,
    threshold: float = 0.5,
    step: int | None = None,
    order: int | None = None,
    what: str = "step {}",
    flag: bool | None = None,
) -> str:
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
    parts = [
        (
            f'score 0<span class="scale" title="0 &#8594; threshold {t} &#8594; 1"></span>1; '
            f"the neutral middle is the <strong>threshold {t}</strong>"
        ),
        (
            f'<span class="key flag" style="background-color:{score_color(1.0, threshold)}">flagged</span> '
            "score &#8805; threshold"
        ),
        (
            f'<span class="key flag nan" style="background-color:{NAN_COLOR}">NaN</span> non-finite activations '
            "(flagged)"
        ),
        '<span class="key first"></span>first flagged',
        '<span class="key" data-order="k">token</span> exit order k of the cascade',
        "hover a token for its score",
    ]
    if prompt:
        parts.insert(
            3,
            '<span class="key" style="color:#3d3d3d;border:1px solid #ccc">prompt</span> the prompt, '
            "coloured by its score alone (step 0)",
        )
        parts.insert(4, '<span class="key unscored">token</span> not scored')
        parts.insert(5, '<span class="stop">stopped</span> the action stopped the row')
    return '<div class="legend">' + " &#183; ".join(parts) + "</div>"


def _table(caption: str, header: list[str], rows: list[list[Any]], values: list[float]) -> str:
    scale = max((abs(v) for v in values if not math.isnan(v)), default=0.0)
    th = "".join(f"<th>{_esc(h)}</th>" for h in [*header, "contribution"])
    trs = []
    for cells, v in zip(rows, values, strict=True):
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
        parts.append(
            _table(
                f"top pairs, degree {o} (2·M_ij)",
                ["i", "j"],
                [[name(i), name(j)] for i, j, _ in ps],
                [v for _, _, v in ps],
            )
        )
    return parts
