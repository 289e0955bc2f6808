"""The monitors a vLLM worker runs and what they hold: each armed monitor (:class:`Armed`: its
scores, flags, summaries and review notes), what the worker knows of each request
(:class:`Request`), and everything tpc-hooks keeps in a worker process, in one object
(:class:`WorkerState`). Imported in vLLM's workers only."""

import hashlib
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from ....monitoring import Monitor, RequestScores
from .. import _review
from .prefix import BlockStates, Chain

KEEP = 4096  # finished requests whose summary waits for the server to take it (the oldest go first)
UNSCORED = (
    "its prompt starts with cached blocks whose monitor state this engine does not hold (computed before "
    "the monitor was armed, or restored from an offload tier); it was not scored on part of its prompt: "
    "send it again with SamplingParams(skip_reading_prefix_cache=True)"
)
UNSCORED_SERVED = "the request read cached prompt blocks the monitor never saw"  # a server's answer says this


class Armed:
    """A monitor a worker runs, under its name ("" for a lone monitor), the auxiliary output it
    reads, and what it has decided."""

    def __init__(
        self,
        name: str,
        monitor: Monitor,
        layer: int,
        order: int | None,
        cascade: float | None,
        action: str,
        keep: str,
        blocks: BlockStates,
        sha: str | None = None,
        review: dict[str, Any] | None = None,
    ):
        self.name, self.layer, self.sha = name, layer, sha  # sha: of its files, as the server knows it
        self.owns: set[str] | None = None  # once replaced or removed: the requests it still serves to their end
        self.monitor, self.action, self.keep = monitor, action, keep
        self.scores = RequestScores(
            monitor, order, cascade, frozen=True
        )  # loaded here, from a file: nobody else holds it
        self.threshold = float(monitor.threshold)
        self.blocks = blocks  # the monitor's state at block ends, by content
        self.stopped: dict[str, int] = {}  # request -> the step it was stopped at
        self.first: dict[str, int] = {}  # request -> its first flagged step
        self.unscored: set[str] = set()  # requests that read cached blocks without a kept state
        self.passes, self.seconds, self.rows = 0, 0.0, 0  # what the monitor has cost (tpc_hooks_stats)
        self.reviews, self.review_seconds = 0, 0.0  # ... and the requests it handed to a review log
        self.own: dict[str, float] = {}  # request -> its own threshold
        self.summaries: OrderedDict[str, dict[str, Any]] = OrderedDict()  # keep="summary": finished requests
        self.notes: _review.Notes | None = None  # a server's review log: the inputs of the steps it explains
        self.review(review or {})

    def key(self, block: bytes, answer_from: int) -> bytes:
        """The key of this monitor's state at a block's end: the block's chain hash; a response
        monitor's also names where the request's answer starts (its state pools the answer only, so
        the same tokens with another boundary hold another state)."""
        if not self.monitor.answers:
            return block
        return hashlib.blake2b(block + int(answer_from).to_bytes(8, "little"), digest_size=16).digest()

    def review(self, settings: dict[str, Any]) -> None:
        """Keeps (or not: ``{}``) the inputs of the steps a server's review log explains, with its
        settings (``sample``, ``text``)."""
        on = bool(settings)
        self.notes, self.scores.keep_inputs = (_review.Notes(**settings) if on else None), on

    def summarize(self, rid: str, req: "Request | None" = None) -> None:
        """A finished request's steps become its summary (``keep="summary"``), with its review when
        the server keeps a review log and the request is flagged or sampled."""
        rec = self.scores.take([rid]).get(rid)
        first, stopped, thr = self.first.pop(rid, None), self.stopped.pop(rid, None), self.own.pop(rid, self.threshold)
        if rid in self.unscored:
            self.unscored.discard(rid)
            self.summaries[rid] = {"error": UNSCORED_SERVED}
        elif rec is not None:
            probs = rec["probs"]
            bad = probs.isnan()
            self.summaries[rid] = {
                "steps": len(probs),
                "peak_score": float(probs[~bad].max()) if (~bad).any() else None,
                "flagged": first is not None,
                "first_flagged": first,
                "stopped_at": stopped,
                "threshold": thr,
                "nonfinite_step": int(bad.nonzero()[0]) if bad.any() else None,
            }
            t0 = time.perf_counter()
            review = self.notes and self.notes.take(
                rid, self.monitor, self.sha, rec, req.tokens if req else None, req.prompt_len if req else 0
            )
            if review:
                self.summaries[rid]["review"] = review
                self.reviews, self.review_seconds = self.reviews + 1, self.review_seconds + time.perf_counter() - t0
        if self.notes is not None:
            self.notes.forget(rid)
        while len(self.summaries) > KEEP:
            self.summaries.popitem(last=False)


@dataclass
class Request:
    """What the worker knows of a request from the scheduler: the name it goes by in what the
    worker hands back (``ident``: tpc-hooks' key for it and its sample index, else its engine id),
    its tokens so far, its chain of block hashes, its own monitor settings and EOS, and how far
    the scored steps reach."""

    ident: str
    tokens: list[int] | None  # prompt then generated tokens as computed (None: embeddings, no reuse)
    prompt_len: int
    chain: Chain
    settings: dict[str, Any]
    eos: int | None
    reusable: bool  # its prefix states may be kept and read (token prompts without multimodal inputs)
    start: int = 0  # tokens computed before this step (the scheduler's count)
    scored_to: int = 0  # tokens covered by its last recorded step
    rows: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # capture: rows per exposed id
    sampled: bool = False  # in the review log's sample of requests (a server's --review-log-sample)
    answer_start: int | None = None  # where its answer starts (None: after the prompt), for response monitors

    @property
    def answer_from(self) -> int:
        """The position a response monitor pools from: its own ``answer_start`` (at most the
        prompt's length), else the prompt's end."""
        return self.prompt_len if self.answer_start is None else min(self.answer_start, self.prompt_len)


class WorkerState:
    """Everything tpc-hooks keeps in one vLLM worker process, in one object: the monitors it runs, by
    name (``armed``; a lone monitor: ""), those replaced or removed that still serve the requests they
    started with (``retiring``), the (sampler row, EOS id) pairs a monitor ended in this step for the
    logits processor (``stops``), and a server's review-log settings once it turned the log on
    (``review``: ``sample``, ``text``). The worker holds it from when it starts; the logits processor,
    which vLLM's model runner builds in the same process, finds it with :meth:`of_process`."""

    _process: "WorkerState | None" = None

    def __init__(self) -> None:
        self.armed: dict[str, Armed] = {}
        self.retiring: list[Armed] = []
        self.stops: list[tuple[int, int | None]] = []
        self.review: dict[str, Any] = {}

    @classmethod
    def of_process(cls) -> "WorkerState":
        """This process's state (made on first use: by the worker or the logits processor, whichever
        vLLM builds first)."""
        if cls._process is None:
            cls._process = cls()
        return cls._process

    def serving(self, rid: str) -> list[Armed]:
        """The monitors that score request ``rid``: for each name, the one it started with."""
        owned = {armed.name: armed for armed in self.retiring if armed.owns is not None and rid in armed.owns}
        return [owned.get(name, armed) for name, armed in self.armed.items()] + [
            armed for name, armed in owned.items() if name not in self.armed
        ]

    def held_by_retiring(self) -> dict[str, set[str]]:
        """Per name: the requests a replaced monitor of that name still serves (its successor skips them)."""
        out: dict[str, set[str]] = {}
        for armed in self.retiring:
            assert armed.owns is not None  # set when it is retired
            out.setdefault(armed.name, set()).update(armed.owns)
        return out

    def retire_done(self) -> None:
        """Drops the replaced monitors whose requests have all finished and been reported."""
        self.retiring[:] = [a for a in self.retiring if a.owns or a.summaries or a.scores.records]

    def clear(self) -> None:
        """No monitor, nothing retiring, no stop pending."""
        self.armed.clear()
        self.retiring.clear()
        self.stops.clear()


def summaries_of(armed: Armed, idents: list[str], reqs: dict[str, Request]) -> dict[str, dict[str, Any]]:
    """A monitor's summaries of the finished requests named ``idents`` (``reqs``: the worker's
    requests, by ident); forgets them."""
    for rid in [r for r in idents if r in armed.scores.records and (armed.owns is None or r not in armed.owns)]:
        armed.summarize(rid, reqs.get(rid))
    for rid in [r for r in idents if r in armed.unscored]:
        armed.summarize(rid)
    return {rid: armed.summaries.pop(rid) for rid in idents if rid in armed.summaries}


def rss() -> int:
    """This process's resident memory in bytes (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
