"""The review log of ``tpc-hooks serve --review-log DIR``: one JSON line per flagged request (and
per request of a sample you set), with each monitor's per-step scores and exit orders and the
exact attribution of the step that flagged it; ``tpc-hooks review LOG`` renders it as HTML.

Three parts, none of which imports vLLM:

* in the worker, :class:`Notes` keeps, per monitor, the pooled activations (a per-token
  monitor: the token's row) of a request's first flagged step, or for a sampled request of its
  highest-scoring step so far, from the pass that computed them (no second pass);
  :meth:`Notes.take` hands them over with the request's steps when it finishes;
* in the server, :class:`ReviewLog` takes entries into a bounded queue; a thread of its own
  explains each (:func:`explain`: :func:`tpc_hooks.attribute` of the kept activations, by the
  very monitor that scored them, known by the SHA-256 of its files) and appends it (``logging``'s
  queue listener and size-rotated file handler). Neither the engine nor the responses wait for
  the attribution or the disk (explaining in the engine's own thread cost 6.5 ms per explained
  request on the CPU engine); an entry the full queue refuses is counted as dropped, never lost
  silently;
* offline, :func:`read_review_log`, :func:`logged_peaks` (peak scores for
  :meth:`tpc_hooks.Monitor.calibrate`) and :func:`render_review_log` (an index and one page per
  entry, in the views' colours).
"""

import hashlib
import json
import logging
import logging.handlers
import math
import queue
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..._errors import TPCHooksError
from ...head import attribute
from ...views import FILE


def sampled(request_id: str, rate: float) -> bool:
    """Whether ``request_id`` is in the sample of unflagged requests logged at ``rate``: decided by
    a hash of the id alone (not by its scores), so the sample is a fair one of all traffic.

    Example:
        >>> sampled("cmpl-1", 0.0), sampled("cmpl-1", 1.0)
        (False, True)
    """
    if rate <= 0:
        return False
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big") < rate * 2.0**64


def explain(monitor: Any, z: Any, exit_order: int, k: int = 10, sae: Any = None) -> dict[str, Any]:
    """The exact attribution of one step: ``tpc_hooks.attribute(monitor, z)`` as JSON-able data
    (the logit by order, the top ``k`` neurons or SAE features, the top ``k`` pairs of each order),
    with the step's exit order and the logit it decided on: the sum of the orders up to it. With
    ``sae`` (an SAE for the monitor's site), also ``features``: the same decision in the SAE's
    feature basis (top features and feature pairs, with their labels when the SAE has them).

    Example:
        >>> import torch, tpc_hooks as tpc
        >>> mon = tpc.Monitor(tpc.TPC(6, 2, 2), "blocks.0.hook_resid_post")
        >>> part = explain(mon, torch.randn(6), exit_order=2, k=3)
        >>> abs(sum(part["by_order"]) - part["step_logit"]) < 1e-5, len(part["top_neurons"])
        (True, 3)
    """
    z = z.detach().float().cpu()[None]
    out = attribute(monitor, z).to_dict(0, k)
    out["exit_order"] = int(exit_order)
    out["step_logit"] = float(sum(out["by_order"][: int(exit_order)]))
    out["top_neurons"] = [[i, v] for i, v in out["top_neurons"]]
    out["top_pairs"] = {o: [[i, j, v] for i, j, v in pairs] for o, pairs in out["top_pairs"].items()}
    if sae is not None:
        feats = attribute(monitor, z, sae=sae).to_dict(0, k)
        out["features"] = {
            "top_features": [[i, v] for i, v in feats["top_neurons"]],
            "top_pairs": {o: [[i, j, v] for i, j, v in ps] for o, ps in feats["top_pairs"].items()},
            "labels": feats.get("labels", {}),
        }
    return out


def explain_entry(
    e: dict[str, Any], monitors: dict[str, Any], k: int = 10, saes: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Replaces each monitor's kept ``input`` in the entry ``e`` by its ``attribution``
    (:func:`explain`), by the monitor of ``monitors`` (SHA-256 of its files -> Monitor) that scored
    it, in SAE features too where ``saes`` (site -> SAE) has one for its site; an input that cannot
    be explained (non-finite, an unknown monitor) gets ``{"error": ...}``."""
    for m in e.get("monitors", {}).values():
        z, mon = m.pop("input", None), monitors.get(m.get("monitor"))
        exit_order = m["exit_orders"][m["step"]]
        if z is None or any(v is None for v in z):
            m["attribution"] = {"error": "non-finite activations at this step"}
        elif mon is None:
            m["attribution"] = {"error": f"no monitor with sha256 {m.get('monitor')} is loaded"}
        else:
            try:
                sae = (saes or {}).get(mon.site) if mon.sae is None else None
                m["attribution"] = explain(mon, torch.tensor(z), exit_order, k, sae)
            except Exception as err:  # the log goes on
                m["attribution"] = {"error": f"{type(err).__name__}: {err}"}
    return e


def _finite(values: Iterable[float]) -> list[float | None]:
    return [None if math.isnan(v) or math.isinf(v) else float(v) for v in values]


class Notes:
    """What a worker keeps for the review log of one monitor: per request, ``(step, input)`` of its
    first flagged step, or for a sampled request not yet flagged, of its highest step so far
    (``sample``: the share of requests sampled; ``text``: entries carry token ids)."""

    def __init__(self, sample: float = 0.0, text: bool = False) -> None:
        self.sample, self.text = float(sample), bool(text)
        self.at: dict[str, tuple[int, Any]] = {}
        self.peak: dict[str, float] = {}

    def flagged(self, rid: str, step: int, z: Any) -> None:
        self.at[rid] = (step, z.detach().clone())
        self.peak.pop(rid, None)

    def seen(self, rid: str, step: int, prob: float, z: Any) -> None:
        """A sampled request's step: kept when it is its highest so far."""
        if not prob <= self.peak.get(rid, -1.0):  # NaN is kept: non-finite activations are worth a look
            self.at[rid], self.peak[rid] = (step, z.detach().clone()), prob

    def forget(self, rid: str) -> None:
        self.at.pop(rid, None)
        self.peak.pop(rid, None)

    def take(
        self,
        rid: str,
        monitor: Any,
        sha: str | None,
        rec: dict[str, Any],
        tokens: Sequence[int] | None,
        prompt_len: int,
    ) -> dict[str, Any] | None:
        """The review of a finished request from its recorded steps ``rec`` (None: nothing kept,
        it is neither flagged nor sampled): the kept input, to be explained by the monitor whose
        files hash to ``sha`` (:func:`explain_entry`)."""
        kept = self.at.pop(rid, None)
        self.peak.pop(rid, None)
        if kept is None:
            return None
        step, z = kept
        out = {
            "request_id": rid,
            "sampled": sampled(rid, self.sample),
            "step": step,
            # what the input is: a token's row, the pooled prefix, or a response monitor's pooled answer
            "of": "token" if monitor.pooling == "token" else "answer" if monitor.answers else "pool",
            "monitor": sha,
            "scores": _finite(rec["probs"].tolist()),
            "exit_orders": rec["exit_order"].tolist(),
            "input": _finite(z.float().cpu().tolist()),
        }
        if tokens is not None:
            ids = [
                int(t) for t in tokens[: prompt_len + len(out["exit_orders"]) - 1]
            ]  # the scored prefix: step t ends token t
            out["tokens_sha256"] = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
            if self.text:
                out["ids"], out["prompt_len"] = ids, prompt_len
        return out


# ---------------------------------------------------------------------- the server's writer
class _Counting(logging.handlers.RotatingFileHandler):
    def __init__(self, log: "ReviewLog", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            entry = record.msg if self.log.prepare is None else self.log.prepare(record.msg)
            record.msg, record.args = json.dumps(entry, allow_nan=False), None
            if self.shouldRollover(record):
                self.doRollover()
            assert self.stream is not None  # opened by the handler (not delayed)
            self.stream.write(record.msg + "\n")
            self.stream.flush()
        except Exception:  # a full disk, say: the entry is lost, and counted
            self.log._count("failed")
        else:
            self.log._count("written")


class _Listener(logging.handlers.QueueListener):
    def enqueue_sentinel(self) -> None:
        # after what is queued, waiting for room (the queue is bounded); typeshed knows neither name
        self.queue.put(self._sentinel)  # type: ignore[attr-defined]


class ReviewLog:
    """Appends review entries as JSON lines to ``directory/review.jsonl``, rotated at ``max_bytes``
    (``backups`` older files kept), from a queue of at most ``queue_size`` entries emptied by a
    thread of its own. :meth:`put` never waits: an entry the full queue refuses is counted in
    ``counts["dropped"]``; every entry put is either written, dropped or (a failing disk) failed.
    ``prepare(entry)``, run on that thread before writing, finishes an entry (a server's:
    :func:`explain_entry`).

    Example:
        >>> import tempfile
        >>> log = ReviewLog(tempfile.mkdtemp(), queue_size=10)
        >>> log.put({"request_id": "a"}), log.close()["written"]
        (True, 1)
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int = 64 << 20,
        backups: int = 5,
        queue_size: int = 10_000,
        on_count: Any = None,
        prepare: Any = None,
    ) -> None:
        self.path = Path(directory) / FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.counts = {"written": 0, "dropped": 0, "failed": 0}
        self._lock = threading.Lock()
        self._on_count = on_count
        self.prepare = prepare
        self._queue: queue.Queue = queue.Queue(queue_size)
        self._handler = _Counting(self, self.path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        self._listener = _Listener(self._queue, self._handler)
        self._listener.start()

    def _count(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1
        if self._on_count is not None:
            self._on_count(outcome)

    def put(self, entry: dict[str, Any]) -> bool:
        """Queues ``entry`` for writing; False (and counted as dropped) when the queue is full."""
        record = logging.makeLogRecord({"msg": entry})
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._count("dropped")
            return False
        return True

    def close(self) -> dict[str, int]:
        """Writes what is queued, closes the file; returns the counts."""
        self._listener.stop()
        self._handler.close()
        return dict(self.counts)


def entry(
    response_id: str, choice: int, when: float, per: dict[str, dict[str, Any]], decode: Any = None
) -> dict[str, Any] | None:
    """A choice's log entry from its summaries by monitor (each with the ``review`` its worker
    attached, taken out of the summary); None when no monitor kept one. ``decode(ids)`` turns
    token ids into text (given when the server logs text)."""
    monitors, tokens, request_id = {}, None, None
    for name, s in per.items():
        review = s.pop("review", None) if s else None
        if review is None:
            continue
        request_id = review.pop("request_id", request_id)
        ids, prompt_len = review.pop("ids", None), review.pop("prompt_len", None)
        if ids is not None and decode is not None and tokens is None:
            tokens = {"prompt": decode(ids[:prompt_len]), "completion": [decode([t]) for t in ids[prompt_len:]]}
        monitors[name] = {
            "flagged": s["flagged"],
            "first_flagged": s["first_flagged"],
            "stopped_at": s["stopped_at"],
            "peak_score": s["peak_score"],
            "threshold": s["threshold"],
            **review,
        }
    if not monitors:
        return None
    out = {
        "request_id": request_id,
        "response_id": response_id,
        "choice": choice,
        "time": when,
        "flagged": any(m["flagged"] for m in monitors.values()),
        "monitors": monitors,
    }
    if tokens is not None:
        out["text"] = tokens
    return out


@dataclass
class ServerReview:
    """A server's review log: its writer (None: no log), the tokenizer's ``decode`` when it logs text,
    every monitor the server loaded by the SHA-256 of its files (to explain the steps of whichever
    version scored them), and the SAEs whose features the log names, by site."""

    log: "ReviewLog | None" = None
    decode: Any = None
    monitors: dict[str, Any] = field(default_factory=dict)
    saes: dict[str, Any] = field(default_factory=dict)


def arguments(p: Any) -> None:
    """``tpc-hooks serve``'s review-log options."""
    p.add_argument(
        "--review-log",
        default=None,
        metavar="DIR",
        help=f"append each flagged request (and --review-log-sample of the others) to DIR/{FILE}: each "
        "monitor's per-step scores and exit orders and the exact attribution of the step that flagged "
        "it; `tpc-hooks review DIR` renders it",
    )
    p.add_argument(
        "--review-log-sample",
        type=float,
        default=0.0,
        metavar="P",
        help="the share of requests logged whether flagged or not (chosen by a hash of the request id; "
        "their peak scores calibrate a monitor on real traffic), default 0",
    )
    p.add_argument(
        "--review-log-text",
        action="store_true",
        help="log the prompt and completion text (default: a hash of their token ids)",
    )
    p.add_argument(
        "--review-log-sae",
        action="append",
        default=[],
        metavar="DIR",
        help="an SAELens SAE folder (e.g. one tpc_hooks.offline.load_sae cached): the review log also "
        "explains the monitors at its site in its features, with their labels when it has them",
    )
    p.add_argument(
        "--review-log-max-mb",
        type=float,
        default=64.0,
        metavar="MB",
        help=f"rotate {FILE} at this size, keeping 5 older files (default 64)",
    )


def sae_site(sae: Any, where: Any) -> str:
    """The site an SAE for ``--review-log-sae`` reads (its recorded ``hook_name``)."""
    site = getattr(getattr(sae.cfg, "metadata", None), "hook_name", None)
    if not site:
        raise TPCHooksError(
            f"the SAE in {where} records no hook_name (its cfg.json's metadata), so the monitors it "
            "explains are unknown"
        )
    return site


def record(review: ServerReview, response_id: str, choice: int, when: float, per: dict[str, dict[str, Any]]) -> None:
    """A server's choice: its summaries lose their reviews, which go to the log (if it keeps one)."""
    got = entry(response_id, choice, when, per, review.decode)
    if got is not None and review.log is not None:
        review.log.put(got)


# ---------------------------------------------------------------------- reading and rendering
