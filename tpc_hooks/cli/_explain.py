"""What the command line takes from a monitor's explanation (:meth:`tpc_hooks.Monitor.explain`): plain
data (numbers, strings, lists) that ``tpc-hooks attribute --by`` prints and writes as JSON, and that
``tpc-hooks review --monitor`` hands to the review pages (the views never see an Explanation).

``review`` recomputes the split of a logged request: it re-tokenises the text the server logged
(``serve --review-log-text``), runs the plain transformers adapter on it, and explains the step the
log explains (the first flagged step, or a sampled request's highest), with the monitor named on
its command line. What it checks against the log is recorded beside the split: the token ids'
SHA-256, the monitor files' SHA-256 and the score the server gave that step.
"""

import hashlib
import json
from collections import Counter
from typing import Any

from .._errors import TPCHooksError
from ..monitoring import Monitor, monitor_specs
from ..saving import dir_files
from ._checks import check_monitor_dir

BY = ("token", "component")


def explanation_dict(ex: Any, b: int, *, k: int, by: tuple[str, ...] | list[str] = BY) -> dict[str, Any]:
    """Row ``b`` of the Explanation ``ex`` as JSON-able data: the score and flag, ``logit == baseline +
    sum(by_token) == baseline + sum(by_component)``, and for each view in ``by`` (``"token"``,
    ``"component"``) the whole split and its ``k`` largest parts in size (a part adding exactly 0,
    such as a token the pooling did not read, is never listed as a top one).

    Example:
        >>> d = explanation_dict(ex, 0, k=3)  # doctest: +SKIP
        >>> d["top_tokens"]  # [[position, token, value], ...]  # doctest: +SKIP
        [[0, '<|im_start|>', 8.96], [37, '\\n', 1.74], [6, ' helpful', 1.22]]
    """
    out: dict[str, Any] = {
        "score": float(ex.probs[b]),
        "flagged": bool(ex.flagged[b]),
        "threshold": float(ex.threshold),
        "logit": float(ex.logit[b]),
        "baseline": float(ex.baseline[b]),
        "exit_order": int(ex.exit_order[b]),
        "site": ex.site,
        "pooling": ex.pooling,
        "truncated": bool(ex.truncated[b]),
    }
    if "token" in by:
        out.update(
            tokens=list(ex.tokens[b]),
            token_ids=[int(t) for t in ex.token_ids[b]],
            pooled=[bool(p) for p in ex.pooled[b].tolist()],
            by_token=[float(v) for v in ex.by_token[b].tolist()],
            top_tokens=[[i, t, v] for i, t, v in ex.top_tokens(b, k, mode="absolute") if v != 0.0],
        )
    if "component" in by:
        out.update(
            components=list(ex.components),
            by_component=[float(v) for v in ex.by_component[b].tolist()],
            top_components=[[n, v] for n, v in ex.top_components(b, k, mode="absolute") if v != 0.0],
        )
    return out


# ---------------------------------------------------------------------- tpc-hooks review --monitor
def review_monitors(specs: list[str], names_in_log: set[str]) -> dict[str, tuple[Monitor, str, str]]:
    """``review --monitor`` values (``NAME=DIR``, or ``DIR`` alone for a server's lone monitor, whose
    log name is ``""``; a ``:stop`` / ``:flag`` suffix, as ``serve`` takes them, is ignored) -> name ->
    (the monitor, its directory, the SHA-256 of its files as the server names a monitor's version).

    Raises:
        TPCHooksError: a name given twice, a directory that holds no monitor, or a name no monitor of
            the log has (``names_in_log``; not checked when the log is empty).
    """
    out: dict[str, tuple[Monitor, str, str]] = {}
    for name, where, _ in monitor_specs(specs, "flag"):  # as serve reads them (names checked there)
        if names_in_log and name not in names_in_log:
            known = ", ".join(f"{n}=DIR" if n else "DIR (the server's lone monitor)" for n in sorted(names_in_log))
            raise TPCHooksError(
                f"--monitor {name}={where}: the log has no monitor named {name!r}; its monitors: {known}"
                + ("; a lone monitor is given as --monitor DIR, without a name" if "" in names_in_log else "")
            )
        check_monitor_dir(where)
        config, weights = dir_files(where)
        out[name] = (Monitor.from_pretrained(where), where, hashlib.sha256(config + weights).hexdigest())
    return out


def explain_entries(
    entries: list[dict[str, Any]],
    model: Any,
    tokenizer: Any,
    monitors: dict[str, tuple[Monitor, str, str]],
    *,
    k: int,
    model_name: str,
    progress: bool = False,
) -> tuple[Counter, str | None]:
    """Puts, in each monitor of each entry, an ``explanation``: the split of the step the log explains,
    recomputed from the logged text (:func:`explanation_dict` and what was checked against the log),
    or ``{"why": ...}`` saying why there is none. Returns how many of each outcome (``"recomputed"``,
    ``"sampled"``, ``"no text"``, ``"no monitor"``, ``"no answer"``, ``"failed"``) and the first
    failure's message (None: none failed)."""
    from tqdm.auto import tqdm

    counts: Counter = Counter()
    first_error = None
    for e in tqdm(entries, desc="explain", unit="request", disable=not progress):
        for name, m in e.get("monitors", {}).items():
            kind, m["explanation"] = _explain_monitor(e, name, m, model, tokenizer, monitors, k, model_name)
            counts[kind] += 1
            if kind == "failed" and first_error is None:
                first_error = m["explanation"]["why"]
    return counts, first_error


def _ids(tokenizer: Any, text: str) -> list[int]:
    """``text`` re-tokenised as the server's tokenizer wrote it: special tokens read from their text, none
    added (a chat template or BOS the server applied is in the logged text already)."""
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def _explain_monitor(
    e: dict[str, Any],
    name: str,
    m: dict[str, Any],
    model: Any,
    tokenizer: Any,
    monitors: dict[str, tuple[Monitor, str, str]],
    k: int,
    model_name: str,
) -> tuple[str, dict[str, Any]]:
    """One monitor of one entry: ``(outcome, explanation or {"why": ...})``."""
    text = e.get("text")
    if not e.get("flagged"):
        return "sampled", {"why": "a sampled request no monitor flagged; tpc-hooks review recomputes flagged ones only"}
    if name not in monitors:
        flag = f"--monitor {name}=DIR" if name else "--monitor DIR"
        return "no monitor", {
            "why": f"no {flag} was given for the monitor {name or '(the lone one)'!r}; name its directory to "
            "recompute its split"
        }
    if not text or not isinstance(text.get("prompt"), str):
        return "no text", {
            "why": "the log holds no text of this request (a server logs it with serve --review-log-text); "
            "the split is recomputed from the text"
        }
    mon, where, sha = monitors[name]
    step = int(m["step"])
    prompt = _ids(tokenizer, text["prompt"])
    pieces = [_ids(tokenizer, p) for p in text.get("completion", [])]
    ids = prompt + [t for p in pieces[:step] for t in p]
    if mon.answers and len(ids) == len(prompt):
        return "no answer", {"why": f"step {step} reads no answer token, and this response monitor reads the answer"}
    scored = prompt + [t for p in pieces for t in p]
    logged = m.get("tokens_sha256")
    try:
        ex = mon.explain(
            model,
            tokens=[ids],
            answer_starts=[len(prompt)] if mon.answers else None,
            # a pooled step exits at one order: the logged one (a per-token monitor's tokens each have theirs)
            order=None if mon.streaming else int(m["exit_orders"][step]),
            tokenizer=tokenizer,
        )
    except Exception as err:  # the other pages go on; the page and the summary say what failed
        return "failed", {"why": f"the split could not be recomputed: {type(err).__name__}: {err}"}
    out = explanation_dict(ex, 0, k=k)
    layers, grid = ex.by_layer(0)
    out.update(
        step=step,
        prompt_tokens=len(prompt),
        model=model_name,
        monitor_dir=where,
        logged_score=m["scores"][step] if step < len(m.get("scores", [])) else None,
        tokens_match=None if logged is None else hashlib.sha256(json.dumps(scored).encode()).hexdigest() == logged,
        monitor_match=None if not m.get("monitor") else m["monitor"] == sha,
        layers=layers,
        by_layer=grid.tolist(),
    )
    return "recomputed", out
