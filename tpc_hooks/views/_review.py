"""The review log's entries as pages: each monitor's steps coloured by score, the flagging step
marked, its exact attribution in tables and the log read back (``adapters/vllm/_review.py`` writes it)."""

import json
import math
import warnings
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import TPCHooksError
from ._explain import _EXTRA_STYLE, _heatmap, split_legend, token_spans
from ._html import _STYLE, HTML, _esc, _order_names, _table, _token, _unit_tables, score_color


def _attribution_tables(a: dict[str, Any]) -> str:
    """An entry's attribution as the views' tables: by order, top units and pairs, and the same
    in SAE features when the log has them."""
    parts = [
        _table("logit by order", ["order"], [[o] for o in _order_names(len(a["by_order"]))], a["by_order"]),
        *_unit_tables(
            a["top_neurons"],
            a.get("top_pairs", {}),
            "feature" if a.get("basis") != "residual" else "neuron",
            a.get("labels"),
        ),
    ]
    f = a.get("features")
    if f:
        parts += _unit_tables(f["top_features"], f.get("top_pairs", {}), "SAE feature", f.get("labels"))
    return "".join(parts)


_RECOMPUTED = (
    "split over the tokens and the model parts, recomputed by tpc-hooks review from the logged text "
    "with the transformers adapter (not read from the server's pass)"
)


def _recomputed(x: dict[str, Any]) -> str:
    """A monitor's logit at the explained step split over the tokens it read and the model parts that
    wrote them, as ``tpc-hooks review --monitor`` recomputes it (plain data: ``x`` is the ``explanation``
    it puts in an entry's monitor), with what was checked against the log; or why there is none."""
    title = f'<div class="head"><strong>{_esc(_RECOMPUTED)}</strong></div>'
    if "why" in x:
        return f'<div class="recomputed">{title}<div class="head">not recomputed: {_esc(x["why"])}</div></div>'
    answer = len(x["tokens"]) - x["prompt_tokens"]
    how = (
        f"The logged text was re-tokenised and run through {x['model']} (AutoModelForCausalLM), and the "
        f"monitor saved in {x['monitor_dir']} split its logit at step {x['step']} over the "
        f"{x['prompt_tokens']} prompt tokens" + (f" and the answer's first {answer}" if answer else "") + "."
    )
    checks = [
        {
            None: "The log holds no hash of the token ids to check the re-tokenised text against.",
            True: "The re-tokenised text has the SHA-256 the log holds of the token ids: the tokens the server scored.",
            False: "The re-tokenised text (prompt and answer up to the last scored step) does not have the SHA-256 "
            "the log holds of the token ids: somewhere its tokens differ from those the server scored (a token "
            "decoded alone, such as part of a multi-byte character, does not always encode back to itself), "
            "and the split is of the re-tokenised text.",
        }[x["tokens_match"]],
        {
            None: "",
            True: "The monitor's files are those that scored this request (SHA-256).",
            False: "The monitor's files differ from those that scored this request (their SHA-256): the split "
            "is that of the monitor given to tpc-hooks review.",
        }[x["monitor_match"]],
    ]
    if x.get("logged_score") is not None:
        checks.append(
            f"The server scored step {x['step']} {x['logged_score']:.4f}; the recomputation scores it {x['score']:.4f}."
        )
    head = [
        f"score {x['score']:.4f} ({'flagged' if x['flagged'] else 'not flagged'} at threshold {x['threshold']:g})",
        f"logit {x['logit']:+.4f} = baseline {x['baseline']:+.4f} + tokens",
        f"exit order {x['exit_order']}",
        f"{x['site']}, pooling {x['pooling']}",
    ]
    tops, parts = x["top_tokens"], x["top_components"]
    tables = [
        _table("top tokens", ["position", "token"], [[i, repr(t)] for i, t, _ in tops], [v for _, _, v in tops]),
        _table("top parts", ["part"], [[n] for n, _ in parts], [v for _, v in parts]),
    ]
    if x.get("layers"):
        tables.append(_heatmap(x["layers"], np.asarray(x["by_layer"], dtype=float)))
    return (
        f'<div class="recomputed">{title}<div class="head">{_esc(" ".join(c for c in [how, *checks] if c))}</div>'
        f'<div class="head">{_esc(" · ".join(head))}</div>{split_legend()}'
        f'<div class="text">{token_spans(x["tokens"], x["by_token"], x["pooled"])}</div>{"".join(tables)}</div>'
    )


def _when(e: dict[str, Any]) -> str:
    return datetime.fromtimestamp(float(e.get("time") or 0), timezone.utc).isoformat(timespec="seconds")


def review_html(e: dict[str, Any]) -> HTML:
    """One entry as a page: each monitor's steps coloured by score (the completion's tokens when
    the log holds text), the step that flagged marked, and the attribution of that step; where a
    monitor carries an ``explanation`` (``tpc-hooks review --monitor`` puts one in: plain data), its
    tokens coloured by their share of the logit with the top tokens and model parts, or why there is
    none."""
    blocks = []
    text = e.get("text") or {}
    for name, m in e["monitors"].items():
        t = float(m["threshold"])
        scores, exits, step = m["scores"], m["exit_orders"], m["step"]
        words = ["[prompt]", *text.get("completion", [])[: len(scores) - 1]] if text else []
        words += [f"[{i}]" for i in range(len(words), len(scores))]
        spans = [
            _token(
                w,
                ["first"] if i == step and m["flagged"] else [],
                score=float("nan") if s is None else s,
                threshold=t,
                step=i,
                order=exits[i],
            )
            for i, (w, s) in enumerate(zip(words, scores, strict=True))
        ]
        a = m["attribution"]
        why = "first flagged" if m["flagged"] else "highest score (sampled)"
        if "error" in a:
            a = {
                "error": a["error"],
                "site": None,
                "exit_order": exits[step],
                "step_logit": math.nan,
                "logit": math.nan,
            }
        head = [
            f"monitor {name or 'default'}",
            f"threshold {t:g}",
            f"peak {m['peak_score']}",
            f"flagged{_where(m['first_flagged'])}" if m["flagged"] else "not flagged",
            *([f"stopped at step {m['stopped_at']}"] if m["stopped_at"] is not None else []),
        ]
        att = [
            f"step {step} ({why})",
            {"token": "token input", "answer": "pooled answer input"}.get(m["of"], "pooled input"),
            f"site {a.get('site')}",
            f"exit order {a['exit_order']}",
            f"step logit {a['step_logit']:+.4f}",
            f"full logit {a['logit']:+.4f}",
        ]
        blocks.append(
            f'<div class="row"><div class="head"><strong>{_esc(" · ".join(head))}</strong></div>'
            f'<div class="text">{"".join(spans)}</div><div class="head">{_esc(" · ".join(att))}</div>'
            f"{_esc(a['error']) if 'error' in a else _attribution_tables(a)}"
            f"{_recomputed(m['explanation']) if 'explanation' in m else ''}</div>"
        )
    prompt = f'<div class="label">{_esc(text["prompt"])}</div>' if text.get("prompt") else ""
    title = f"request {e['request_id']}"
    meta = [title, f"response {e.get('response_id')}", f"choice {e.get('choice')}", _when(e)]
    if "tokens_sha256" in next(iter(e["monitors"].values()), {}):
        meta.append(f"tokens sha256 {next(iter(e['monitors'].values()))['tokens_sha256'][:16]}")
    return HTML(
        f'<div class="tpc-view">{_STYLE}{_EXTRA_STYLE}<div class="head">{_esc(" · ".join(meta))}</div>{prompt}'
        f"{''.join(blocks)}</div>",
        f"tpc-hooks review: {title}",
    )


def _where(step: int | None) -> str:
    """Where a monitor's score first crossed its threshold: step ``t`` has read ``t`` answer tokens."""
    return "" if step is None else " on the prompt" if step == 0 else f" at answer token {step}"


def review_pages(entries: list[dict[str, Any]], out: str | Path) -> Path:
    """Writes ``out/index.html`` (one row per entry: time, request, each monitor's peak score
    and flagged step) and one page per entry (:func:`review_html`); returns the index's path.
    :func:`render_review_log` reads a log and calls it; ``tpc-hooks review --monitor`` first puts
    its recomputed splits in the entries.

    Example:
        >>> entries = read_review_log("logs/")  # doctest: +SKIP
        >>> review_pages(entries, "logs/html")  # doctest: +SKIP
        PosixPath('logs/html/index.html')
    """
    out = Path(out)
    for old in out.glob("entry-*.html") if out.is_dir() else ():  # pages of an earlier rendering
        old.unlink()
    rows = []
    for n, e in enumerate(entries):
        page = f"entry-{n:06d}.html"
        review_html(e).save(out / page)
        cells = "".join(
            f'<td style="background-color:{score_color(m["peak_score"] or 0.0, m["threshold"])}">'
            f"{_esc(name or 'default')}: {m['peak_score']:.3f}"
            f"{_where(m['first_flagged']) if m['flagged'] else ''}</td>"
            for name, m in e["monitors"].items()
            if m["peak_score"] is not None
        )
        rows.append(
            f'<tr><td>{_when(e)}</td><td><a href="{page}">{_esc(e["request_id"])}</a></td>'
            f"<td>{'flagged' if e.get('flagged') else 'sampled'}</td>{cells}</tr>"
        )
    table = (
        f"<table><caption>{len(entries)} logged requests</caption><tr><th>time</th><th>request</th><th>why</th>"
        f"<th>monitors (peak score)</th></tr>{''.join(rows)}</table>"
    )
    return HTML(f'<div class="tpc-view">{_STYLE}{table}</div>', "tpc-hooks review log").save(out / "index.html")


FILE = "review.jsonl"  # the log's current file; rotated ones are FILE.1 (newest) .. FILE.N


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise TPCHooksError(f"no review log at {path} (a --review-log directory or one of its {FILE} files)")
    rotated = sorted(path.glob(f"{FILE}.*"), key=lambda p: -int(p.suffix[1:]) if p.suffix[1:].isdigit() else 0)
    files = [p for p in rotated if p.suffix[1:].isdigit()] + ([path / FILE] if (path / FILE).exists() else [])
    if not files:
        raise TPCHooksError(f"{path} holds no {FILE}: was the server started with --review-log {path}?")
    return files


def read_review_log(path: str | Path) -> list[dict[str, Any]]:
    """The entries of a review log, oldest first (its rotated files, then the current one).

    A last line cut short (a server stopped while writing it) is skipped with a warning; any
    other line that is not an entry is an error naming its file and line.
    """
    out: list[dict[str, Any]] = []
    for f in _files(Path(path)):
        lines = f.read_text(encoding="utf-8").split("\n")
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                got = json.loads(line)
                if not isinstance(got, dict) or not isinstance(got.get("monitors"), dict):
                    raise ValueError("not a review entry")
            except ValueError as err:
                if n == len(lines) and not line.endswith("}"):
                    warnings.warn(f"{f}:{n}: a last line cut short (skipped)", UserWarning, stacklevel=2)
                    continue
                raise TPCHooksError(f"{f}:{n} is not a review-log entry ({err})") from None
            out.append(got)
    return out


def logged_peaks(
    entries: Sequence[dict[str, Any]],
    monitor: str = "",
    *,
    benign: Iterable[str] | None = None,
    sampled_only: bool = True,
) -> list[float]:
    """The peak scores of the monitor ``monitor`` ("" for a lone one) in review-log entries, for
    :meth:`tpc_hooks.Monitor.calibrate` (``peaks=``): by default only the sampled entries (a fair
    sample of traffic; flagged ones are all logged, so counting them would bias the rate), and
    with ``benign``, only the requests (``request_id`` or ``response_id``) you marked benign.

    Raises:
        TPCHooksError: no entry of that monitor left.
    """
    keep = None if benign is None else set(benign)
    out = []
    for e in entries:
        m = e.get("monitors", {}).get(monitor)
        if m is None or (sampled_only and not m.get("sampled")) or m.get("peak_score") is None:
            continue
        if keep is not None and e.get("request_id") not in keep and e.get("response_id") not in keep:
            continue
        out.append(float(m["peak_score"]))
    if not out:
        names = sorted({n for e in entries for n in e.get("monitors", {})})
        raise TPCHooksError(
            f"no {'sampled ' if sampled_only else ''}entry of monitor {monitor!r} in the log "
            f"(its monitors: {names}); was it started with --review-log-sample above 0?"
        )
    return out


def render_review_log(path: str | Path, out: str | Path, *, flagged_only: bool = False) -> Path:
    """Writes ``out/index.html`` (one row per entry: time, request, each monitor's peak score
    and flagged step) and one page per entry (``flagged_only``: per flagged entry); returns the
    index's path."""
    return review_pages([e for e in read_review_log(path) if e.get("flagged") or not flagged_only], out)
