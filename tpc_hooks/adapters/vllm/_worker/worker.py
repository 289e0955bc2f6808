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

The monitors the worker runs and their requests: ``_worker.armed``; the driver's remote calls that
arm, swap and read them: ``_worker.control``. Imported by vLLM in its workers (and by the engine
when it checks the logits processor's per-request arguments), never by ``import tpc_hooks``.
"""

import math
import time
from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor

from ...._errors import TPCHooksError
from ....head import Together
from ....metrics import flagged
from ....monitoring import STOPPING
from .. import _engine, _review
from .._wire import FAN, KEY, child_index, disabled, ident
from .._wire import own_setting as _own
from .._wire import request_settings as _settings
from .armed import Armed, Request, WorkerState
from .control import Control
from .prefix import Chain, prefix_hash


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
        self.state = WorkerState.of_process()  # the worker's, in this process

    def is_argmax_invariant(self) -> bool:
        return False  # it changes the greedy token of a stopped request

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass  # the worker reads each request's settings from the scheduler

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        stops = self.state.stops
        if not stops:
            return logits
        for i, eos in stops:
            if eos is not None and i < logits.shape[0]:
                logits[i] = float("-inf")
                logits[i, eos] = 0.0
        stops.clear()
        return logits


class _Mixin:
    """tpc-hooks' part of the worker's passes: the exposed sites when the model is built, then after
    each forward pass the new rows of every request, scored by each armed monitor (the driver's
    remote calls: ``_worker.control.Control``). Only the rank that reports the sampled tokens (the
    first tensor-parallel rank of the last pipeline stage: rank 0 of a single stage) reads and scores:
    the residual stream is the same on every tensor-parallel rank, and an earlier stage's sites reach
    the last stage with its hidden states (``_engine.across_stages``).

    Mixed in before vLLM's worker class, which has ``vllm_config`` and ``model_runner``."""

    vllm_config: Any
    model_runner: Any
    _tpc_off: bool
    _tpc: WorkerState

    # ------------------------------------------------------------------ engine build and each step
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        from . import models as _vllm_models

        self._tpc_off = disabled()  # the operator's switch, read once: off, the worker is vLLM's own
        self._tpc = WorkerState.of_process()  # everything tpc-hooks keeps in this process
        if self._tpc_off:
            return super().load_model(*args, **kwargs)  # type: ignore[misc]  # vLLM's worker
        _vllm_models.register()  # the families whose vLLM class returns no residual stream get one that does
        super().load_model(*args, **kwargs)  # type: ignore[misc]  # vLLM's worker, the next base at runtime
        _engine.check_version()
        _engine.check_runner(self.model_runner)
        config = self.vllm_config
        if config.speculative_config is not None:
            raise TPCHooksError(
                "tpc-hooks' vLLM worker does not run beside speculative decoding (a draft step has "
                "several rows per request, and EAGLE-3 drafting sets its own auxiliary layers)"
            )
        hf = config.model_config.hf_text_config
        sites = (config.additional_config or {}).get(_engine.CONFIG, {}).get("sites", "all")
        self._tpc_sites = _engine.aux_ids(sites, int(hf.num_hidden_layers))
        self._tpc_ids = sorted(set(self._tpc_sites.values()))
        # the last stage's first rank holds the monitors: the stream and the sampler meet there
        self._tpc_holds = _engine.expose(self.model_runner, self._tpc_ids).holds
        self._tpc_block = int(config.cache_config.block_size)
        self._tpc_requests: dict[str, Request] = {}
        self._tpc_capture: list[int] = []
        self._tpc_finished_rows: dict[str, dict[int, list[torch.Tensor]]] = {}  # capture: requests that ended
        # since the engine started: requests resumed from a kept block state, and found without one
        self._tpc_counts = {"resumed": 0, "resumed_in_pass": 0, "unscored": 0}
        self._tpc_together = Together()  # the members of one shape, at any site: one stacked evaluation per pass

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if self._tpc_off:
            return super().execute_model(scheduler_output, *args, **kwargs)  # type: ignore[misc]  # vLLM's worker
        self._tpc_note(scheduler_output)
        out = super().execute_model(scheduler_output, *args, **kwargs)  # type: ignore[misc]  # vLLM's worker
        if self._tpc_holds and scheduler_output.total_num_scheduled_tokens and (self._tpc.armed or self._tpc_capture):
            self._tpc_read(_engine.last_pass(self.model_runner, scheduler_output))
        return out

    def _tpc_note(self, so: Any) -> None:
        """The scheduler's news: new requests (the name each goes by, their prompt, settings, EOS),
        each scheduled request's computed-token count before this step, finished requests."""
        reqs = self._tpc_requests
        for nr in so.scheduled_new_reqs:
            ids = nr.prompt_token_ids
            lora = getattr(nr.lora_request, "lora_int_id", None)
            params = nr.sampling_params
            extra = params.extra_args or {}
            name = nr.req_id  # a request tpc-hooks did not key (vLLM called directly) goes by its engine id
            if KEY in extra:  # keyed where it entered; a sample of n: which one, from its engine id
                name = ident(str(extra[KEY]), child_index(nr.req_id, int(extra.get(FAN, 1))))
            reqs[nr.req_id] = Request(
                ident=name,
                tokens=list(ids) if ids is not None else None,
                prompt_len=len(ids) if ids is not None else 0,
                chain=Chain(self._tpc_block, lora),
                settings=_settings(params),
                eos=getattr(params, "eos_token_id", None),
                reusable=ids is not None and not nr.mm_features,
                start=int(nr.num_computed_tokens),
                sampled=_review.sampled(name, self._tpc.review.get("sample", 0)),
                answer_start=_settings(params).get("answer_start"),
            )
        cached = so.scheduled_cached_reqs
        for rid, c in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            if rid in reqs:
                reqs[rid].start = int(c)
        for engine_id in so.finished_req_ids:
            req = reqs.pop(engine_id, None)
            rid = req.ident if req is not None else engine_id
            if req is not None and req.rows:
                self._tpc_finished_rows[rid] = req.rows
            for armed in self._tpc.serving(rid):
                on = req is not None and _own(req.settings, armed.name, "monitor", True)
                if armed.keep == "summary" and on:
                    armed.summarize(rid, req)
                elif req is not None and not on:
                    armed.scores.forget(rid)
                if armed.owns is not None:
                    armed.owns.discard(rid)
        self._tpc.retire_done()

    # ------------------------------------------------------------------ reading a pass
    @torch.inference_mode()
    def _tpc_read(self, step: _engine.Pass) -> None:
        """Scores the pass's new rows. A request that resumes from blocks this same pass computes (vLLM
        caches a block when it allocates it, so a request scheduled beside the one computing its prefix
        reads it at once) waits for the next round: the pass is scored in rounds, each taking the
        requests whose resumed state is kept by then, until one round finds no more; the rest resume
        without a state (unscored). The usual pass is one round."""
        members = [*self._tpc.armed.values(), *self._tpc.retiring]
        order, wait, first = list(range(len(step.req_ids))), True, True
        while order:
            later = self._tpc_round(step, order, members, wait, time.perf_counter())
            if wait and not first:  # resumed from a state this pass kept
                self._tpc_counts["resumed_in_pass"] += len(order) - len(later)
            # progress: the rest may find their state now; none: the last round, where they resume without one
            wait, first, order = len(later) < len(order), False, later
        for armed in members:
            armed.passes += 1

    def _tpc_round(
        self, step: _engine.Pass, order: list[int], members: list[Armed], wait: bool, t0: float
    ) -> list[int]:
        """One round of a pass: the ``order``-th requests' rows, pooled and scored by every member; returns
        the requests left for a later round (``wait``: those whose resumed state is not kept yet)."""
        at = {i: k for k, i in enumerate(self._tpc_ids)}
        pieces, cuts, rows_of, later = [], [], {}, []
        for i in order:
            engine_id = step.req_ids[i]
            a, b = int(step.starts[i]), int(step.starts[i + 1])
            req = self._tpc_requests.get(engine_id)
            if req is None:
                raise TPCHooksError(
                    f"the pass ran request {engine_id!r}, which the scheduler's output never admitted to this "
                    "worker (tpc-hooks' contract with vLLM: SchedulerOutput.scheduled_new_reqs); it is refused "
                    "rather than left unscored"
                )
            if b <= a:
                continue
            rid = req.ident
            if req.start != req.chain.computed and not self._tpc_resume(rid, req, self._tpc.serving(rid), wait):
                later.append(i)
                continue
            toks = step.tokens[a:b].tolist()
            if req.tokens is not None and req.start + len(toks) > len(req.tokens):
                req.tokens[req.start :] = toks
            if req.reusable:
                ends = req.chain.extend(toks)
            else:
                ends, req.chain.computed = [], req.chain.computed + len(toks)
            for aux_id in self._tpc_capture:  # copied: an earlier stage's site arrives in a buffer each pass reuses
                rows = step.aux[at[aux_id]][a:b].detach()
                req.rows.setdefault(aux_id, []).append(rows.to("cpu", torch.float32, copy=True))
            if not members or all(rid in m.unscored for m in members):
                continue
            end = req.start + (b - a)  # a step ends here if it reaches past the prompt and the steps recorded so far
            complete = end >= req.prompt_len and end > req.scored_to
            if complete:
                req.scored_to = end
            pieces.append((rid, a, b, complete))
            cuts.append([off for off, _ in ends])
            rows_of[rid] = (i, req, dict(ends))
        shared = (time.perf_counter() - t0) / max(len(members), 1)  # the round's bookkeeping, shared by the members
        taken, work = self._tpc.held_by_retiring(), []
        for armed in members:  # each member pools its pieces; then the policies score, those of one shape together
            t1 = time.perf_counter()
            gone = taken.get(armed.name, ())
            if armed.owns is None and not armed.unscored and not gone:  # the usual pass: every piece is its own
                mine_pieces, mine_cuts = pieces, cuts
            else:  # replaced or removed: only the requests it started with; else all but its successor's
                keep = [
                    k
                    for k, p in enumerate(pieces)
                    if p[0] not in armed.unscored
                    and (p[0] in armed.owns if armed.owns is not None else p[0] not in gone)
                ]
                mine_pieces, mine_cuts = [pieces[k] for k in keep], [cuts[k] for k in keep]
            skips: dict[str, int] = {}
            if armed.monitor.answers:  # a response monitor pools none of the prompt's rows
                mine_pieces, mine_cuts, skips = answer_pieces(mine_pieces, mine_cuts, rows_of)
            z = None
            if mine_pieces:  # its pieces (request, first row, end row, complete): pooled, its state kept at block ends
                aux, ps = step.aux[at[armed.layer]], mine_pieces
                whole = all(
                    p[2] == q[1] for p, q in zip(ps, ps[1:], strict=False)
                )  # one run of rows (the usual pass): a view
                rows = aux[ps[0][1] : ps[-1][2]] if whole else torch.cat([aux[a:b] for _, a, b, _ in ps])
                sizes = [b - a for _, a, b, _ in ps]
                armed.rows += sum(sizes)
                z = armed.scores.begin(
                    [p[0] for p in ps],
                    rows,
                    sizes,
                    [p[3] for p in ps],
                    mine_cuts,
                    # `a=armed`: each member's own blocks (mypy infers no lambda with a default); `sk`: the
                    # prompt rows a response monitor left out of the piece, before its offsets
                    lambda rid, off, state, a=armed, sk=skips: a.blocks.put(  # type: ignore[misc]
                        a.key(rows_of[rid][2][off + sk.get(rid, 0)], rows_of[rid][1].answer_from), state
                    ),
                )
            work.append((armed, bool(mine_pieces), z, time.perf_counter() - t1))
        t2 = time.perf_counter()
        scored = [k for k, w in enumerate(work) if w[2] is not None]
        rules = [(armed.scores.rule, z) for armed, _, z, _ in work if z is not None]
        got = dict(zip(scored, self._tpc_together.step(rules), strict=True))
        each = (time.perf_counter() - t2) / max(len(scored), 1)
        for k, (armed, mine, _, spent) in enumerate(work):
            t1 = time.perf_counter()
            if mine:
                self._tpc_decide(armed, *armed.scores.end(got.get(k)), rows_of)
            armed.seconds += shared + spent + (each if k in got else 0.0) + time.perf_counter() - t1
        return later

    def _tpc_resume(self, rid: str, req: Request, members: list[Armed], wait: bool = False) -> bool:
        """A request whose computed count is not where its chain stands: it starts (or starts over
        after a preemption) at 0, or resumes after ``start`` cached tokens, from the state kept
        for them; without one it is not scored (it would be scored on part of its prompt). ``wait``:
        a request some member holds no state for yet is left as it is (False returned), for a later
        round of the pass to find the state its earlier rounds keep."""
        c = req.start
        if c == 0:
            req.rows.clear()
            req.chain = Chain(self._tpc_block, req.chain.lora)
            for armed in members:
                armed.scores.restart(rid)
                armed.unscored.discard(rid)
            return True
        known = req.tokens is not None and req.reusable and c <= len(req.tokens) and c % self._tpc_block == 0
        key = prefix_hash(req.tokens[:c], self._tpc_block, req.chain.lora) if known else None  # type: ignore[index]
        fresh = [armed.monitor.answers and c <= req.answer_from for armed in members]  # no answer row: none to resume
        if wait and key is not None:  # a member without the state: perhaps a later round's
            if not all(
                f or armed.key(key, req.answer_from) in armed.blocks for armed, f in zip(members, fresh, strict=True)
            ):
                return False
        req.rows.clear()
        if key is not None:
            req.chain.start(req.tokens[:c], key)  # type: ignore[index]
        else:
            req.chain.computed = c
        for armed, f in zip(members, fresh, strict=True):  # each from its own state for the prefix, or none
            if f:
                armed.scores.restart(rid)
                armed.unscored.discard(rid)
                continue
            state = armed.blocks.get(armed.key(key, req.answer_from)) if key is not None else None
            if state is None:
                armed.unscored.add(rid)
                armed.scores.forget(rid)
                self._tpc_counts["unscored"] += 1
                continue
            armed.scores.restore(rid, state)
            armed.unscored.discard(rid)
            self._tpc_counts["resumed"] += 1
        return True

    def _tpc_decide(self, armed: Armed, done: list[str], res: Any, rows_of: dict) -> None:
        """Records each scored step and flags, or stops, the requests that cross their threshold."""
        if not done:
            return
        own = [_own(rows_of[rid][1].settings, armed.name, "threshold", None) for rid in done]
        if any(t is not None for t in own):
            hits = [
                bool(flagged(res.decision_logits[j : j + 1], armed.threshold if t is None else t))
                for j, t in enumerate(own)
            ]
            armed.own.update((rid, t) for rid, t in zip(done, own, strict=True) if t is not None)
        else:
            hits = flagged(res.decision_logits, armed.threshold).tolist()
        probs = None
        for j, (rid, hit) in enumerate(zip(done, hits, strict=True)):
            i, req, _ = rows_of[rid]
            if not _own(req.settings, armed.name, "monitor", True):
                armed.scores.records.pop(rid, None)  # opted out: its state is kept for the blocks, not its steps
                continue
            if armed.notes is not None and req.sampled and not hit and rid not in armed.first:
                probs = res.probs.tolist() if probs is None else probs
                assert armed.scores.inputs is not None  # kept while the review log is on
                armed.notes.seen(rid, armed.scores.steps(rid) - 1, probs[j], armed.scores.inputs[j])
            if hit and rid not in armed.first:
                armed.first[rid] = step = armed.scores.steps(rid) - 1
                if armed.notes is not None:
                    assert armed.scores.inputs is not None  # kept while the review log is on
                    armed.notes.flagged(rid, step, armed.scores.inputs[j])
                # a server ends a request whose activations turn NaN/inf whatever the action (its response is an
                # error); monitor.generate records NaN steps as the Hugging Face loop does
                nonfinite = armed.keep == "summary" and bool(math.isnan(armed.scores.records[rid][-1][2]))
                if armed.action in STOPPING or nonfinite:
                    armed.stopped[rid] = step
                    self._tpc.stops.append((i, req.eos))


def answer_pieces(
    pieces: list[tuple[str, int, int, bool]], cuts: list[list[int]], rows_of: dict
) -> tuple[list[tuple[str, int, int, bool]], list[list[int]], dict[str, int]]:
    """A response monitor's part of a pass: each piece without its prompt rows (where the request's
    answer starts against the position of the piece's first row), a piece left with no row kept
    only when it completes a step (the prompt's end: step 0, unscored); the block ends shifted to
    the rows kept, those inside the prompt dropped; and per request the rows left out."""
    out, out_cuts, skips = [], [], {}
    for (rid, a, b, complete), cut in zip(pieces, cuts, strict=True):
        req = rows_of[rid][1]
        skip = min(max(0, req.answer_from - req.start), b - a)
        if a + skip == b and not complete:
            continue
        out.append((rid, a + skip, b, complete))
        out_cuts.append([off - skip for off in cut if off > skip])
        skips[rid] = skip
    return out, out_cuts, skips


# vLLM's own worker for this platform, with tpc-hooks' part: what `worker_cls` names
TPCHooksWorker = type("TPCHooksWorker", (_Mixin, Control, _engine.base_worker()), {"__module__": __name__})
