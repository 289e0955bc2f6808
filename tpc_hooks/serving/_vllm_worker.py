"""What runs inside vLLM's worker processes: the worker (:class:`TPCHooksWorker`, vLLM's own
worker class for the platform, extended) that reads each request's residual stream from the
passes the engine runs anyway and scores it with the monitor, and the logits processor that
ends a flagged request in the step it is flagged (:class:`TPCHooksStop`).

The engine runs as vLLM decides, compiled (and with CUDA graphs on a GPU): when the model is
loaded, before the warm-up traces it, the worker asks it to return the residual stream after
the exposed layers as extra outputs of its forward (``_engine.expose``). After each forward
pass (``execute_model``) and before the sampler runs, the worker reads those outputs and the
batch's layout (``_engine.last_pass``), scores every request's new rows, and tells the logits
processor which rows to end.

Prefix caching stays on and monitored requests use it: the monitor keeps its running state at
every KV block's end under the hash of the block's content (``_prefix``), for every request it
sees (monitored, opted out or not), so a request whose prompt starts with cached blocks resumes
from the state those blocks ended with and is scored on its whole prompt. One it cannot resume
(its cached prefix was computed before the monitor was armed, or came from an offload tier) is
never scored on part of its prompt: it is reported as unscored and the caller recomputes it.

Imported by vLLM in its workers (and by the engine when it checks the logits processor's
per-request arguments), never by ``import tpc_hooks``.
"""

import hashlib
import math
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor

from ..adapters._vllm_args import own_setting as _own, request_settings as _settings, unexposed
from ..head import _format
from ..head._errors import TPCHooksError
from ..head._kernel import flagged
from ..head._together import Together
from ..monitoring._monitor import Monitor
from ..monitoring._requests import RequestScores
from . import _engine, _review
from ._prefix import BlockStates, Chain

KEEP = 4096  # finished requests whose summary waits for the server to take it (the oldest go first)
STORES = 4  # monitors whose block states a worker keeps (the least recently armed go first)
UNSCORED = ("its prompt starts with cached blocks whose monitor state this engine does not hold (computed before "
            "the monitor was armed, or restored from an offload tier); it was not scored on part of its prompt: "
            "send it again with SamplingParams(skip_reading_prefix_cache=True)")
UNSCORED_SERVED = "the request read cached prompt blocks the monitor never saw"  # a server's answer says this


class _Armed:
    """A monitor a worker runs, under its name ("" for a lone monitor), the auxiliary output it
    reads, and what it has decided."""

    def __init__(self, name: str, monitor: Monitor, layer: int, order: int | None, cascade: float | None, action: str,
                 keep: str, blocks: BlockStates, sha: str | None = None):
        self.name, self.layer, self.sha = name, layer, sha  # sha: of its files, as the server knows it
        self.owns: set[str] | None = None  # once replaced or removed: the requests it still serves to their end
        self.monitor, self.action, self.keep = monitor, action, keep
        self.scores = RequestScores(monitor, order, cascade, frozen=True)  # loaded here, from a file: nobody else holds it
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
        self.review(bool(_review.SETTINGS))

    def review(self, on: bool) -> None:
        self.notes, self.scores.keep_inputs = (_review.Notes() if on else None), on

    def summarize(self, rid: str, req: "_Request | None" = None) -> None:
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
            self.summaries[rid] = {"steps": len(probs), "peak_score": float(probs[~bad].max()) if (~bad).any() else None,
                                   "flagged": first is not None, "first_flagged": first, "stopped_at": stopped,
                                   "threshold": thr, "nonfinite_step": int(bad.nonzero()[0]) if bad.any() else None}
            t0 = time.perf_counter()
            review = self.notes and self.notes.take(rid, self.monitor, self.sha, rec, req and req.tokens,
                                                   req.prompt_len if req else 0)
            if review:
                self.summaries[rid]["review"] = review
                self.reviews, self.review_seconds = self.reviews + 1, self.review_seconds + time.perf_counter() - t0
        if self.notes is not None:
            self.notes.forget(rid)
        while len(self.summaries) > KEEP:
            self.summaries.popitem(last=False)


@dataclass
class _Request:
    """What the worker knows of a request from the scheduler: its tokens so far, its chain of
    block hashes, its own monitor settings and EOS, and how far the scored steps reach."""

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


_ARMED: dict[str, _Armed] = {}  # the monitors this worker runs, by name (a lone monitor: "")
_RETIRING: list[_Armed] = []  # monitors replaced or removed, still serving the requests they started with
_STOPS: list[tuple[int, int | None]] = []  # (sampler row, EOS id) a monitor ended in this step


class TPCHooksStop(V1LogitsProcessor, V2LogitsProcessor):
    """Ends the requests the monitor stops in this step: their only possible token is their EOS.

    Written to both model runners' logits-processor interfaces (V1: ``apply(logits)``; V2:
    ``apply(logits, ctx)``): without speculative decoding both give one logits row per request,
    in the order of the pass the worker has just scored. It also checks each request's own
    monitor settings when the engine admits it (:meth:`validate_params`).
    """

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        _settings(sampling_params, names=True)

    def __init__(self, vllm_config: Any, *args: Any) -> None:
        pass

    def is_argmax_invariant(self) -> bool:
        return False  # it changes the greedy token of a stopped request

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass  # the worker reads each request's settings from the scheduler

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        if not _STOPS:
            return logits
        for i, eos in _STOPS:
            if eos is not None and i < logits.shape[0]:
                logits[i] = float("-inf")
                logits[i, eos] = 0.0
        _STOPS.clear()
        return logits


class _Mixin:
    """tpc-hooks' part of the worker; its methods are called from the driver with
    ``llm.collective_rpc(name, args=...)`` (tensors go back as lists, what the RPC carries). Only
    the rank that reports the sampled tokens (rank 0) scores: the residual stream is the same on
    every tensor-parallel rank."""

    # ------------------------------------------------------------------ engine build and each step
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        from . import _vllm_models

        _vllm_models.register()  # the families whose vLLM class returns no residual stream get one that does
        super().load_model(*args, **kwargs)
        _engine.check_version()
        config = self.vllm_config
        if config.speculative_config is not None:
            raise TPCHooksError("tpc-hooks' vLLM worker does not run beside speculative decoding (a draft step has "
                                "several rows per request, and EAGLE-3 drafting sets its own auxiliary layers)")
        hf = config.model_config.hf_text_config
        sites = (config.additional_config or {}).get(_engine.CONFIG, {}).get("sites", "all")
        self._tpc_sites = _engine.aux_ids(sites, int(hf.num_hidden_layers))
        self._tpc_ids = sorted(set(self._tpc_sites.values()))
        _engine.expose(self.model_runner, self._tpc_ids)
        self._tpc_block = int(config.cache_config.block_size)
        self._tpc_requests: dict[str, _Request] = {}
        self._tpc_capture: list[int] = []
        self._tpc_finished_rows: dict[str, dict[int, list[torch.Tensor]]] = {}  # capture: requests that ended
        # since the engine started: requests resumed from a kept block state, and found without one
        self._tpc_counts = {"resumed": 0, "unscored": 0}
        self._tpc_together = Together()  # the members of one shape, at any site: one stacked evaluation per pass

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        self._tpc_note(scheduler_output)
        out = super().execute_model(scheduler_output, *args, **kwargs)
        if scheduler_output.total_num_scheduled_tokens and (_ARMED or self._tpc_capture):
            step = _engine.last_pass(self.model_runner, scheduler_output)
            if step is not None:
                self._tpc_read(step)
        return out

    def _tpc_note(self, so: Any) -> None:
        """The scheduler's news: new requests (their prompt, settings, EOS), each scheduled
        request's computed-token count before this step, finished requests."""
        reqs = self._tpc_requests
        for nr in so.scheduled_new_reqs:
            ids = nr.prompt_token_ids
            lora = getattr(nr.lora_request, "lora_int_id", None)
            params = nr.sampling_params
            reqs[nr.req_id] = _Request(
                tokens=list(ids) if ids is not None else None, prompt_len=len(ids) if ids is not None else 0,
                chain=Chain(self._tpc_block, lora), settings=_settings(params),
                eos=getattr(params, "eos_token_id", None), reusable=ids is not None and not nr.mm_features,
                start=int(nr.num_computed_tokens), sampled=_review.sampled(nr.req_id, _review.SETTINGS.get("sample", 0)))
        cached = so.scheduled_cached_reqs
        for rid, c in zip(cached.req_ids, cached.num_computed_tokens):
            if rid in reqs:
                reqs[rid].start = int(c)
        for rid in so.finished_req_ids:
            req = reqs.pop(rid, None)
            if req is not None and req.rows:
                self._tpc_finished_rows[rid] = req.rows
            for armed in _serving(rid):
                on = req is not None and _own(req.settings, armed.name, "monitor", True)
                if armed.keep == "summary" and on:
                    armed.summarize(rid, req)
                elif req is not None and not on:
                    armed.scores.forget(rid)
                if armed.owns is not None:
                    armed.owns.discard(rid)
        _retire_done()

    # ------------------------------------------------------------------ reading a pass
    @torch.inference_mode()
    def _tpc_read(self, step: _engine.Pass) -> None:
        members = [*_ARMED.values(), *_RETIRING]
        t0 = time.perf_counter()
        at = {i: k for k, i in enumerate(self._tpc_ids)}
        pieces, cuts, rows_of = [], [], {}
        for i, rid in enumerate(step.req_ids):
            a, b = int(step.starts[i]), int(step.starts[i + 1])
            req = self._tpc_requests.get(rid)
            if req is None or b <= a:
                continue
            toks = step.tokens[a:b].tolist()
            if req.start != req.chain.computed:
                self._tpc_resume(rid, req, _serving(rid))
            if req.tokens is not None and req.start + len(toks) > len(req.tokens):
                req.tokens[req.start:] = toks
            if req.reusable:
                ends = req.chain.extend(toks)
            else:
                ends, req.chain.computed = [], req.chain.computed + len(toks)
            for aux_id in self._tpc_capture:
                req.rows.setdefault(aux_id, []).append(step.aux[at[aux_id]][a:b].detach().float().cpu())
            if not members or all(rid in m.unscored for m in members):
                continue
            end = req.start + (b - a)  # a step ends here if it reaches past the prompt and the steps recorded so far
            complete = end >= req.prompt_len and end > req.scored_to
            if complete:
                req.scored_to = end
            pieces.append((rid, a, b, complete))
            cuts.append([off for off, _ in ends])
            rows_of[rid] = (i, req, dict(ends))
        shared = (time.perf_counter() - t0) / max(len(members), 1)  # the pass's bookkeeping, shared by the members
        taken, work = _taken(), []
        for armed in members:  # each member pools its pieces; then the policies score, those of one shape together
            t1 = time.perf_counter()
            gone = taken.get(armed.name, ())
            if armed.owns is None and not armed.unscored and not gone:  # the usual pass: every piece is its own
                mine_pieces, mine_cuts = pieces, cuts
            else:  # replaced or removed: only the requests it started with; else all but its successor's
                keep = [k for k, p in enumerate(pieces) if p[0] not in armed.unscored
                        and (p[0] in armed.owns if armed.owns is not None else p[0] not in gone)]
                mine_pieces, mine_cuts = [pieces[k] for k in keep], [cuts[k] for k in keep]
            z = None
            if mine_pieces:  # its pieces (request, first row, end row, complete): pooled, its state kept at block ends
                aux, ps = step.aux[at[armed.layer]], mine_pieces
                whole = all(p[2] == q[1] for p, q in zip(ps, ps[1:]))  # one run of rows (the usual pass): a view
                rows = aux[ps[0][1]:ps[-1][2]] if whole else torch.cat([aux[a:b] for _, a, b, _ in ps])
                sizes = [b - a for _, a, b, _ in ps]
                armed.rows += sum(sizes)
                z = armed.scores.begin([p[0] for p in ps], rows, sizes, [p[3] for p in ps], mine_cuts,
                                       lambda rid, off, state, a=armed: a.blocks.put(rows_of[rid][2][off], state))
            work.append((armed, bool(mine_pieces), z, time.perf_counter() - t1))
        t2 = time.perf_counter()
        scored = [k for k, w in enumerate(work) if w[2] is not None]
        got = dict(zip(scored, self._tpc_together.step([(work[k][0].scores.rule, work[k][2]) for k in scored])))
        each = (time.perf_counter() - t2) / max(len(scored), 1)
        for k, (armed, mine, _, spent) in enumerate(work):
            t1 = time.perf_counter()
            if mine:
                self._tpc_decide(armed, *armed.scores.end(got.get(k)), rows_of)
            armed.passes += 1
            armed.seconds += shared + spent + (each if k in got else 0.0) + time.perf_counter() - t1

    def _tpc_resume(self, rid: str, req: _Request, members: list[_Armed]) -> None:
        """A request whose computed count is not where its chain stands: it starts (or starts over
        after a preemption) at 0, or resumes after ``start`` cached tokens, from the state kept
        for them; without one it is not scored (it would be scored on part of its prompt)."""
        c = req.start
        req.rows.clear()
        if c == 0:
            req.chain = Chain(self._tpc_block, req.chain.lora)
            for armed in members:
                armed.scores.restart(rid)
                armed.unscored.discard(rid)
            return
        known = req.tokens is not None and req.reusable and c <= len(req.tokens) and c % self._tpc_block == 0
        if known:
            key = req.chain.start(req.tokens[:c])
        else:
            key, req.chain.computed = None, c
        for armed in members:  # each member from its own state for the prefix, or not at all
            state = armed.blocks.get(key) if key is not None else None
            if state is None:
                armed.unscored.add(rid)
                armed.scores.forget(rid)
                self._tpc_counts["unscored"] += 1
                continue
            armed.scores.restore(rid, state)
            armed.unscored.discard(rid)
            self._tpc_counts["resumed"] += 1

    def _tpc_decide(self, armed: _Armed, done: list[str], res: Any, rows_of: dict) -> None:
        """Records each scored step and flags, or stops, the requests that cross their threshold."""
        if not done:
            return
        own = [_own(rows_of[rid][1].settings, armed.name, "threshold", None) for rid in done]
        if any(t is not None for t in own):
            hits = [bool(flagged(res.decision_logits[j:j + 1], armed.threshold if t is None else t))
                    for j, t in enumerate(own)]
            armed.own.update((rid, t) for rid, t in zip(done, own) if t is not None)
        else:
            hits = flagged(res.decision_logits, armed.threshold).tolist()
        probs = None
        for j, (rid, hit) in enumerate(zip(done, hits)):
            i, req, _ = rows_of[rid]
            if not _own(req.settings, armed.name, "monitor", True):
                armed.scores.records.pop(rid, None)  # opted out: its state is kept for the blocks, not its steps
                continue
            if armed.notes is not None and req.sampled and not hit and rid not in armed.first:
                probs = res.probs.tolist() if probs is None else probs
                armed.notes.seen(rid, armed.scores.steps(rid) - 1, probs[j], armed.scores.inputs[j])
            if hit and rid not in armed.first:
                armed.first[rid] = step = armed.scores.steps(rid) - 1
                if armed.notes is not None:
                    armed.notes.flagged(rid, step, armed.scores.inputs[j])
                # a server ends a request whose activations turn NaN/inf whatever the action (its response is an
                # error); monitor.generate records NaN steps as the Hugging Face loop does
                nonfinite = armed.keep == "summary" and bool(math.isnan(armed.scores.records[rid][-1][2]))
                if armed.action == "stop" or nonfinite:
                    armed.stopped[rid] = step
                    _STOPS.append((i, req.eos))

    # ------------------------------------------------------------------ recording (collect, score)
    def tpc_hooks_sites(self) -> dict[str, int]:
        """The sites this engine exposes (fixed when it was built) -> their auxiliary ids."""
        return dict(self._tpc_sites)

    def tpc_hooks_capture(self, sites: list[str]) -> int:
        """Starts recording the rows of every request at ``sites`` (prompt tokens, then one row per
        decode step); returns the model's hidden size."""
        missing = [s for s in sites if s not in self._tpc_sites]
        if missing:
            raise TPCHooksError(unexposed(missing, self._tpc_sites))
        for req in self._tpc_requests.values():
            req.rows.clear()
        self._tpc_capture = sorted({self._tpc_sites[s] for s in sites})
        return self._tpc_d_model()

    def tpc_hooks_take(self) -> dict[str, dict[str, list[list[float]]]]:
        """Every recorded request's rows per site, and clears them."""
        by_id = {i: s for s, i in self._tpc_sites.items()}
        out: dict[str, dict[str, Any]] = {}
        held = {**{rid: req.rows for rid, req in self._tpc_requests.items()}, **self._tpc_finished_rows}
        for rid, rows in held.items():
            for aux_id, parts in rows.items():
                out.setdefault(by_id[aux_id], {})[rid] = torch.cat(parts).tolist()
            rows.clear()
        self._tpc_finished_rows = {}
        return out

    def tpc_hooks_release(self) -> bool:
        """Stops recording (safe to call again)."""
        self._tpc_capture = []
        self._tpc_finished_rows = {}
        return True

    # ------------------------------------------------------------------ monitoring (generate, serve)
    def tpc_hooks_arm(self, path: str, site: str, order: int | None, cascade: float | None, action: str,
                      keep: str = "steps") -> dict:
        """Loads the monitor saved at ``path`` and scores every request from now on at ``site``
        (in place of whatever ran before); ``action="stop"`` ends a request at its first flagged
        step. ``keep="steps"``: every step of every request, until :meth:`tpc_hooks_runs` takes
        them; ``"summary"`` (a server): a finished request's steps become a summary, kept for the
        last ``KEEP`` requests until :meth:`tpc_hooks_summaries` takes it, and a request whose
        activations turn NaN/inf is stopped whatever the action. Returns what the worker runs
        (site, threshold, d_model)."""
        spec = {"name": "", "path": path, "site": site, "order": order, "cascade": cascade, "action": action}
        return self.tpc_hooks_arm_set([spec], keep)[""]

    def tpc_hooks_arm_set(self, specs: list[dict[str, Any]], keep: str = "steps") -> dict[str, dict]:
        """:meth:`tpc_hooks_arm` for several monitors at once, each ``{"name", "path", "site",
        "order", "cascade", "action"}``: every pass is read once and scored by each, under its
        name (a request ends when any stopping monitor flags it). All are loaded and checked
        before any replaces what ran. Returns what each runs, by name."""
        global _ARMED
        d_model = self._tpc_d_model()
        loaded = [(spec, self._tpc_load(spec)) for spec in specs]
        self.tpc_hooks_disarm()
        if getattr(self, "rank", 0) == 0:
            _ARMED = {spec["name"]: _Armed(spec["name"], monitor, self._tpc_sites[spec["site"]], spec["order"],
                                           spec["cascade"], spec["action"], keep,
                                           self._tpc_store(spec["path"], spec["site"], spec["order"], spec["cascade"]),
                                           spec.get("sha256"))
                      for spec, monitor in loaded}
        return {spec["name"]: {"site": monitor.site, "threshold": float(monitor.threshold), "d_model": d_model}
                for spec, monitor in loaded}

    def tpc_hooks_runs(self, requests: list[str] | None = None, member: str = "") -> dict[str, dict[str, Any]]:
        """The recorded steps of ``requests`` (default: all) by the monitor ``member`` (a lone
        monitor: ""), as lists, with the step each was stopped at; forgets them."""
        armed = _ARMED.get(member)
        if armed is None:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for rid, rec in armed.scores.take(requests).items():
            out[rid] = {k: v.tolist() for k, v in rec.items()}
            out[rid]["stopped_at"] = armed.stopped.pop(rid, None)
            armed.first.pop(rid, None)
        for rid in list(armed.unscored if requests is None else armed.unscored & set(requests)):
            armed.unscored.discard(rid)
            out[rid] = {"error": UNSCORED}
        return out

    def tpc_hooks_summaries(self, prefixes: list[str], member: str = "") -> dict[str, dict[str, Any]]:
        """The summaries (``keep="summary"``) by the monitor ``member`` of the finished requests
        whose engine id contains one of ``prefixes`` (the server asks once their last token has
        reached it): steps, peak score, flagged, first flagged step, stopped step, the threshold
        used, the first step that scored NaN; forgets them."""
        armed = _ARMED.get(member)
        return {} if armed is None else _summaries_of(armed, prefixes, self._tpc_requests)  # finished: the server saw their last token

    def tpc_hooks_set_summaries(self, prefixes: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
        """:meth:`tpc_hooks_summaries` of every monitor this worker runs, by name (one call per
        batch of finished responses, however many monitors), with those of monitors replaced or
        removed while the requests ran."""
        out: dict[str, dict[str, dict[str, Any]]] = {name: self.tpc_hooks_summaries(prefixes, name) for name in _ARMED}
        for armed in _RETIRING:
            out.setdefault(armed.name, {}).update(_summaries_of(armed, prefixes, self._tpc_requests))
        _retire_done()
        return out

    def tpc_hooks_swap(self, name: str, spec: dict[str, Any] | None) -> dict[str, Any]:
        """Puts the monitor ``spec`` (as :meth:`tpc_hooks_arm_set` takes one) in place of the monitor
        ``name`` (new or existing), or removes ``name`` (``spec`` None), between two engine steps.
        The requests the worker holds now finish on the monitor they started with; requests that
        start later get the new one (or none). A monitor that does not load or check is refused
        and nothing changes. Returns what the new monitor runs ({} when removed)."""
        old = _ARMED.get(name)
        if spec is None and old is None:
            raise TPCHooksError(f"no monitor named {name!r} runs here (it runs {sorted(_ARMED)})")
        if spec is None and len(_ARMED) == 1:
            raise TPCHooksError(f"{name!r} is the only monitor this engine runs; put another in its place instead")
        keep = next(iter(_ARMED.values())).keep if _ARMED else "summary"
        new, info = None, {}
        if spec is not None:
            spec = {**spec, "name": name}
            monitor = self._tpc_load(spec)
            new = _Armed(name, monitor, self._tpc_sites[spec["site"]], spec["order"], spec["cascade"], spec["action"],
                         keep, self._tpc_store(spec["path"], spec["site"], spec["order"], spec["cascade"]), spec.get("sha256"))
            info = {"site": monitor.site, "threshold": float(monitor.threshold), "d_model": self._tpc_d_model()}
        if getattr(self, "rank", 0) != 0:
            return info
        if old is not None:
            old.owns = set(self._tpc_requests)  # in flight: they finish on it
            _RETIRING.append(old)
        if new is not None:
            _ARMED[name] = new
        else:
            del _ARMED[name]
        _retire_done()
        return info

    def tpc_hooks_disarm(self) -> bool:
        """Removes every monitor and its state (safe to call again)."""
        global _ARMED
        _ARMED = {}
        _RETIRING.clear()
        _STOPS.clear()
        return True

    def tpc_hooks_review(self, sample: float, text: bool = False) -> bool:
        """Turns on the review of flagged requests and of a ``sample`` of the others (by a hash of
        their id): their summaries carry each monitor's per-step scores and exit orders and its
        input (pooled activations) at the step that flagged them (or the highest one), for the
        server to explain, with their token ids when ``text``, else a hash of them."""
        _review.SETTINGS.update(sample=float(sample), text=bool(text))
        for armed in [*_ARMED.values(), *_RETIRING]:
            armed.review(True)
        return True

    def _tpc_load(self, spec: dict[str, Any]) -> Monitor:
        """The monitor of ``spec``, loaded and checked against this engine (site exposed, width)."""
        if spec["site"] not in self._tpc_sites:
            raise TPCHooksError(unexposed([spec["site"]], self._tpc_sites))
        monitor = Monitor.from_pretrained(spec["path"])
        d_model = self._tpc_d_model()
        if monitor.head.d_model != d_model:
            who = f"monitor {spec['name']!r}" if spec["name"] else "monitor"
            raise TPCHooksError(f"{who} expects d_model={monitor.head.d_model} but this model produces {d_model}")
        return monitor

    def tpc_hooks_stats(self, member: str = "") -> dict[str, float]:
        """What the monitor ``member`` has cost since it was armed: forward passes, seconds (wall
        clock in the worker's reading and scoring, the pass's shared bookkeeping split between
        the monitors; on a GPU, without waiting for the device), rows scored, and what it holds:
        requests with a running state, requests with recorded steps (and how many steps),
        summaries not yet taken, kept block states (and how many the store holds at most), the
        process's resident memory, requests handed to a review log and the seconds that took, and since the engine started: requests resumed from a kept
        block state and requests found without one (:meth:`tpc_hooks_counts`)."""
        armed = _ARMED.get(member)
        if armed is None:
            return {}
        return {"passes": armed.passes, "seconds": armed.seconds, "rows": armed.rows,
                "requests_held": len(armed.scores.states), "records_held": len(armed.scores.records),
                "summaries_held": len(armed.summaries), "steps_held": sum(map(len, armed.scores.records.values())),
                "block_states": len(armed.blocks), "block_capacity": armed.blocks.capacity, "rss_bytes": _rss(),
                "reviews": armed.reviews, "review_seconds": armed.review_seconds,
                **self._tpc_counts}

    def _tpc_store(self, path: str, site: str, order: int | None, cascade: float | None) -> BlockStates:
        """The block states of this monitor (its saved files, site and policy): kept across arming
        it again, so blocks cached while it last ran stay readable; a few monitors' at most."""
        digest = hashlib.sha256(repr((site, order, cascade)).encode())
        for name in (_format.CONFIG_FILE, _format.WEIGHTS_FILE):
            digest.update(Path(path, name).read_bytes())
        stores = self.__dict__.setdefault("_tpc_stores", OrderedDict())
        key = digest.hexdigest()
        if key not in stores:
            # every KV block can hold a state, twice over (a state is touched whenever its block is read)
            kv = getattr(self.model_runner, "kv_cache_config", None)
            stores[key] = BlockStates(2 * int(getattr(kv, "num_blocks", 0) or 4096))
        stores.move_to_end(key)
        while len(stores) > STORES:
            stores.popitem(last=False)
        return stores[key]

    def tpc_hooks_counts(self) -> dict[str, int]:
        """Since the engine started: monitored requests that resumed from the monitor state kept for
        their cached prefix, and those whose cached prefix had none (not scored)."""
        return dict(self._tpc_counts)

    def _tpc_d_model(self) -> int:
        return int(self.model_runner.model_config.get_hidden_size())


def _serving(rid: str) -> list[_Armed]:
    """The monitors that score request ``rid``: for each name, the one it started with."""
    owned = {armed.name: armed for armed in _RETIRING if rid in armed.owns}
    return [owned.get(name, armed) for name, armed in _ARMED.items()] + \
        [armed for name, armed in owned.items() if name not in _ARMED]


def _taken() -> dict[str, set[str]]:
    """Per name: the requests a replaced monitor of that name still serves (its successor skips them)."""
    out: dict[str, set[str]] = {}
    for armed in _RETIRING:
        out.setdefault(armed.name, set()).update(armed.owns)
    return out


def _summaries_of(armed: _Armed, prefixes: list[str], reqs: dict[str, _Request]) -> dict[str, dict[str, Any]]:
    """A monitor's summaries of the finished requests matching ``prefixes``; forgets them."""
    match = lambda rid: any(p in rid for p in prefixes)  # noqa: E731 (engine ids may carry a sample's "k_" first)
    for rid in [r for r in armed.scores.records if match(r) and (armed.owns is None or r not in armed.owns)]:
        armed.summarize(rid, reqs.get(rid))
    for rid in [r for r in armed.unscored if match(r)]:
        armed.summarize(rid)
    return {rid: armed.summaries.pop(rid) for rid in [r for r in armed.summaries if match(r)]}


def _retire_done() -> None:
    """Drops the replaced monitors whose requests have all finished and been reported."""
    _RETIRING[:] = [a for a in _RETIRING if a.owns or a.summaries or a.scores.records]


def _rss() -> int:
    """This process's resident memory in bytes (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# vLLM's own worker for this platform, with tpc-hooks' part: what `worker_cls` names
TPCHooksWorker = type("TPCHooksWorker", (_Mixin, _engine.base_worker()), {"__module__": __name__})
