"""What runs inside vLLM's worker processes: forward hooks on the decoder layers that read each
request's residual stream from the passes the engine runs anyway, the monitor that scores it
(:class:`TPCHooksWorker`, mixed in with ``worker_extension_cls``), and the logits processor that
ends a flagged request in the step it is flagged (:class:`TPCHooksStop`).

vLLM packs the requests of a step into one flat batch of tokens; the model runner's
``query_start_loc`` and ``input_batch.req_ids`` say which rows belong to which request, and the
input batch's computed-token counts say whether a request has finished its prompt (a chunked
prefill brings it in parts). A vLLM decoder layer returns ``(hidden, residual)``; the residual
stream after the layer (the tensor ``blocks.L.hook_resid_post`` names) is their sum. The logits
the sampler reads have one row per request of the input batch, in the same order.

Imported by vLLM in its workers (and by the engine when it checks the logits processor's
per-request arguments), never by ``import tpc_hooks``.
"""

import math
import os
import time
from collections import OrderedDict
from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ..head._errors import TPCHooksError
from ..head._kernel import flagged
from ..monitoring._monitor import Monitor
from ..monitoring._requests import RequestScores

OPT_OUT = "tpc_hooks_monitor"  # SamplingParams.extra_args key: false/0 opts the request out
THRESHOLD = "tpc_hooks_threshold"  # ... its own threshold, a probability in (0, 1)
KEEP = 4096  # finished requests whose summary waits for the server to take it (the oldest go first)

class _Armed:
    """The monitor a worker runs and what it has decided (one per worker process)."""

    def __init__(self, monitor: Monitor, order: int | None, cascade: float | None, action: str,
                 keep: str):
        self.monitor, self.action, self.keep = monitor, action, keep
        self.scores = RequestScores(monitor, order, cascade)
        self.threshold = float(monitor.threshold)
        self.stop_rows: list[int] = []  # input-batch rows whose next token ends them (this pass)
        self.stopped: dict[str, int] = {}  # request -> the step it was stopped at
        self.first: dict[str, int] = {}  # request -> its first flagged step
        self.partial: set[str] = set()  # requests whose first pass started after cached blocks
        self.passes, self.seconds, self.rows = 0, 0.0, 0  # what the hook has cost (tpc_hooks_stats)
        self.own: dict[str, float] = {}  # request -> its own threshold
        self.summaries: OrderedDict[str, dict[str, Any]] = OrderedDict()  # keep="summary": finished requests

    def summarize(self, rid: str) -> None:
        """A finished request's steps become its summary (``keep="summary"``)."""
        rec = self.scores.take([rid]).get(rid)
        first, stopped, thr = self.first.pop(rid, None), self.stopped.pop(rid, None), self.own.pop(rid, self.threshold)
        if rec is None:
            return
        probs = rec["probs"]
        bad = probs.isnan()
        self.summaries[rid] = {"steps": len(probs), "peak_score": float(probs[~bad].max()) if (~bad).any() else None,
                               "flagged": first is not None, "first_flagged": first, "stopped_at": stopped,
                               "threshold": thr, "nonfinite_step": int(bad.nonzero()[0]) if bad.any() else None}
        while len(self.summaries) > KEEP:
            self.summaries.popitem(last=False)


_ARMED: _Armed | None = None
# input-batch row -> (the request's EOS id, its own settings); kept by the logits processor
_ROWS: dict[int, tuple[int | None, dict[str, Any]]] = {}


def _settings(params: SamplingParams) -> dict[str, Any]:
    """A request's own monitor settings from its ``extra_args`` (the OpenAI server's
    ``vllm_xargs``): ``{"tpc_hooks_monitor": false}`` opts out, ``{"tpc_hooks_threshold": p}``
    sets its threshold. Raises ValueError (an HTTP 400 from the server) for a bad value."""
    extra = params.extra_args or {}
    out: dict[str, Any] = {}
    if OPT_OUT in extra:
        v = extra[OPT_OUT]
        if v not in (True, False, 0, 1) or isinstance(v, float):
            raise ValueError(f"{OPT_OUT} must be true/false (or 1/0); got {v!r}")
        out["monitor"] = bool(v)
    if THRESHOLD in extra:
        t = extra[THRESHOLD]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < 1:
            raise ValueError(f"{THRESHOLD} must be a probability in (0, 1); got {t!r}")
        out["threshold"] = float(t)
    return out

class TPCHooksStop(LogitsProcessor):
    """Ends the requests the monitor stops in this step: their only possible token is their EOS.

    Also keeps, per input-batch row, the request's EOS id and its own monitor settings
    (``extra_args={"tpc_hooks_monitor": False}`` opts out, ``{"tpc_hooks_threshold": p}`` sets
    its threshold), which the worker's hook reads.
    """

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        _settings(sampling_params)

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool):
        _ROWS.clear()

    def is_argmax_invariant(self) -> bool:
        return False  # it changes the greedy token of a stopped request

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for i in batch_update.removed:
            _ROWS.pop(i, None)
        for i, params, _, _ in batch_update.added:
            _ROWS[i] = (params.eos_token_id, _settings(params))
        for a, b, how in batch_update.moved:
            ra, rb = _ROWS.pop(a, None), _ROWS.pop(b, None)
            if ra is not None:
                _ROWS[b] = ra
            if how == MoveDirectionality.SWAP and rb is not None:
                _ROWS[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        armed = _ARMED
        if armed is None or not armed.stop_rows:
            return logits
        for i in armed.stop_rows:
            eos = _ROWS.get(i, (None, {}))[0]
            if eos is not None and i < logits.shape[0]:
                logits[i] = float("-inf")
                logits[i, eos] = 0.0
        armed.stop_rows = []
        return logits


class TPCHooksWorker:
    """Mixed into vLLM's worker class by ``LLM(..., worker_extension_cls=...)``; its methods are
    called from the driver with ``llm.collective_rpc(name, args=...)``. Tensors go back as lists
    (what the RPC carries). Only the rank that reports the sampled tokens (rank 0) scores: the
    residual stream is the same on every tensor-parallel rank."""

    # ------------------------------------------------------------------ recording (collect, score)
    def tpc_hooks_capture(self, layers: list[int], path: list[str]) -> int:
        """Starts recording ``blocks.L.hook_resid_post`` for each ``L`` of ``layers``, per request
        (``path``: the attribute path of the decoder layers, from the transformers adapter's
        table); returns the model's hidden size."""
        self.tpc_hooks_release()
        decoder = self._tpc_layers(path)
        self._tpc_rows: dict[int, dict[str, list[torch.Tensor]]] = {layer: {} for layer in layers}

        def make(layer: int) -> Any:
            def hook(module: Any, args: Any, out: Any) -> None:
                stream = _stream(out)
                for rid, a, b in self._tpc_pieces():
                    self._tpc_rows[layer].setdefault(rid, []).append(stream[a:b].detach().float().cpu())
            return hook

        self._tpc_handles = [decoder[layer].register_forward_hook(make(layer)) for layer in layers]
        return self._tpc_d_model()

    def tpc_hooks_take(self) -> dict[int, dict[str, list[list[float]]]]:
        """Every recorded request's rows per layer (prompt tokens, then one row per decode step),
        and clears them."""
        rows = getattr(self, "_tpc_rows", {})
        self._tpc_rows = {layer: {} for layer in rows}
        return {layer: {rid: torch.cat(parts).tolist() for rid, parts in per.items()} for layer, per in rows.items()}

    def tpc_hooks_release(self) -> bool:
        """Removes the recording hooks (safe to call again)."""
        for h in getattr(self, "_tpc_handles", []):
            h.remove()
        self._tpc_handles = []
        return True

    # ------------------------------------------------------------------ monitoring (generate, serve)
    def tpc_hooks_arm(self, path: str, layer: int, order: int | None, cascade: float | None, action: str,
                      keep: str = "steps", layers_path: tuple[str, ...] = ("model", "layers")) -> dict:
        """Loads the monitor saved at ``path`` and scores every request from now on at
        ``blocks.{layer}.hook_resid_post`` (``layers_path``: the attribute path of the decoder
        layers); ``action="stop"`` ends a request at its first
        flagged step.
        ``keep="steps"``: every step of every request, until :meth:`tpc_hooks_runs` takes them;
        ``"summary"`` (a server): a finished request's steps become a summary, kept for the last
        ``KEEP`` requests until :meth:`tpc_hooks_summaries` takes it, and a request whose
        activations turn NaN/inf is stopped whatever the action. Returns what the worker
        runs (site, threshold, d_model)."""
        global _ARMED
        self.tpc_hooks_disarm()
        monitor = Monitor.load(path)
        d_model = self._tpc_d_model()
        if monitor.head.d_model != d_model:
            raise TPCHooksError(f"monitor expects d_model={monitor.head.d_model} but this model produces {d_model}")
        if getattr(self, "rank", 0) == 0:
            _ARMED = _Armed(monitor, order, cascade, action, keep)
            self._tpc_arm_handle = self._tpc_layers(layers_path)[layer].register_forward_hook(self._tpc_monitor_hook)
        return {"site": monitor.site, "threshold": float(monitor.threshold), "d_model": d_model}

    def tpc_hooks_runs(self, requests: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """The recorded steps of ``requests`` (default: all), as lists, with the step each was
        stopped at; forgets them."""
        armed = _ARMED
        if armed is None:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for rid, rec in armed.scores.take(requests).items():
            out[rid] = {k: v.tolist() for k, v in rec.items()}
            out[rid]["stopped_at"] = armed.stopped.pop(rid, None)
            armed.first.pop(rid, None)
        for rid in list(armed.partial if requests is None else armed.partial & set(requests)):
            armed.partial.discard(rid)
            out[rid] = {"error": "the request read cached prompt blocks the monitor never saw; send monitored "
                                 "requests with SamplingParams(skip_reading_prefix_cache=True)"}
        return out

    def tpc_hooks_summaries(self, prefixes: list[str]) -> dict[str, dict[str, Any]]:
        """The summaries (``keep="summary"``) of the finished requests whose engine id contains
        one of ``prefixes`` (the server asks once their last token has reached it): steps, peak score, flagged, first flagged step, stopped step,
        the threshold used, the first step that scored NaN; forgets them."""
        armed = _ARMED
        if armed is None:
            return {}
        match = lambda rid: any(p in rid for p in prefixes)  # noqa: E731 (engine ids may carry a sample's "k_" first)
        for rid in [r for r in armed.scores.records if match(r)]:  # finished: the server saw their last token
            armed.summarize(rid)
        hits = [rid for rid in armed.summaries if match(rid)]
        for rid in list(armed.partial):
            if match(rid):
                armed.partial.discard(rid)
                armed.summaries[rid] = {"error": "the request read cached prompt blocks the monitor never saw"}
                hits.append(rid)
        return {rid: armed.summaries.pop(rid) for rid in hits}

    def tpc_hooks_disarm(self) -> bool:
        """Removes the monitor's hook and state (safe to call again)."""
        global _ARMED
        h = getattr(self, "_tpc_arm_handle", None)
        if h is not None:
            h.remove()
        self._tpc_arm_handle = None
        _ARMED = None
        return True

    def _tpc_layers(self, path: list[str] | tuple[str, ...]) -> Any:
        mod = self.model_runner.get_model()
        for part in path:
            if not hasattr(mod, part):
                raise TPCHooksError(f"this vLLM model has no {'.'.join(path)} (its decoder layers)")
            mod = getattr(mod, part)
        return mod

    def _tpc_d_model(self) -> int:
        return int(self.model_runner.model_config.get_hidden_size())

    # ------------------------------------------------------------------ inside a forward pass
    def _tpc_pieces(self) -> list[tuple[str, int, int]]:
        """``(request id, first row, end row)`` of every request in this pass's flat batch."""
        runner = self.model_runner
        req_ids = list(runner.input_batch.req_ids)
        starts = runner.query_start_loc.np[: len(req_ids) + 1].tolist()
        return [(rid, starts[i], starts[i + 1]) for i, rid in enumerate(req_ids)]

    def tpc_hooks_stats(self) -> dict[str, float]:
        """What the monitor's hook has cost since it was armed: forward passes, seconds (wall
        clock inside the hook, which includes the scoring; on a GPU, without waiting for the
        device), rows scored, and what it holds: requests with a running state, requests with
        recorded steps (and how many steps), summaries not yet taken, the process's resident
        memory."""
        armed = _ARMED
        if armed is None:
            return {}
        return {"passes": armed.passes, "seconds": armed.seconds, "rows": armed.rows,
                "requests_held": len(armed.scores.states), "records_held": len(armed.scores.records),
                "summaries_held": len(armed.summaries), "steps_held": sum(map(len, armed.scores.records.values())),
                "rss_bytes": _rss()}

    def _tpc_monitor_hook(self, module: Any, args: Any, out: Any) -> None:
        armed = _ARMED
        if armed is None:
            return
        start = time.perf_counter()
        with torch.no_grad():
            self._tpc_score(armed, out)
        armed.passes += 1
        armed.seconds += time.perf_counter() - start

    def _tpc_score(self, armed: _Armed, out: Any) -> None:
        stream = _stream(out)
        batch = self.model_runner.input_batch
        computed, prompt = batch.num_computed_tokens_cpu, batch.num_prompt_tokens
        pieces, rows = [], {}
        for i, (rid, a, b) in enumerate(self._tpc_pieces()):
            if b <= a or not _ROWS.get(i, (None, {}))[1].get("monitor", True):
                continue
            if computed[i] == 0:  # a new request, or one preempted and computed again from its first token
                armed.scores.restart(rid)
            elif rid in armed.partial or rid not in armed.scores.states:
                armed.partial.add(rid)  # it read cached blocks the monitor never saw: no score, not a partial one
                continue
            pieces.append((rid, stream[a:b], bool(computed[i] + (b - a) >= prompt[i])))
            rows[rid] = i
        armed.rows += sum(int(p[1].shape[0]) for p in pieces)
        done, res = armed.scores.update(pieces)
        if armed.keep == "summary":  # requests the runner no longer holds have finished (or were aborted)
            live = self.model_runner.requests
            for rid in [r for r in armed.scores.records if r not in live]:
                armed.summarize(rid)
        if not done:
            return
        own = [_ROWS.get(rows[rid], (None, {}))[1].get("threshold") for rid in done]
        if any(t is not None for t in own):
            hits = [bool(flagged(res.decision_logits[j:j + 1], armed.threshold if t is None else t))
                    for j, t in enumerate(own)]
            armed.own.update((rid, t) for rid, t in zip(done, own) if t is not None)
        else:
            hits = flagged(res.decision_logits, armed.threshold).tolist()
        for rid, hit in zip(done, hits):
            if hit and rid not in armed.first:
                armed.first[rid] = step = armed.scores.steps(rid) - 1
                # a server ends a request whose activations turn NaN/inf whatever the action (its response is an
                # error); monitor.generate records NaN steps as the Hugging Face loop does
                nonfinite = armed.keep == "summary" and bool(math.isnan(armed.scores.records[rid][-1][2]))
                if armed.action == "stop" or nonfinite:
                    armed.stopped[rid] = step
                    armed.stop_rows.append(rows[rid])


def _rss() -> int:
    """This process's resident memory in bytes (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _stream(out: Any) -> torch.Tensor:
    """The residual stream after a vLLM decoder layer: ``hidden + residual``."""
    hidden, residual = out if isinstance(out, tuple) else (out, None)
    return hidden if residual is None else hidden + residual
