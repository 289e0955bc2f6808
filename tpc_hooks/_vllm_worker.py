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

from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ._errors import TPCHooksError
from ._kernel import flagged
from ._monitor import Monitor
from ._requests import RequestScores

EXTRA = "tpc_hooks"  # the key of a request's own settings in SamplingParams.extra_args


class _Armed:
    """The monitor a worker runs and what it has decided (one per worker process)."""

    def __init__(self, monitor: Monitor, layer: int, order: int | None, cascade: float | None, action: str):
        self.monitor, self.layer, self.action = monitor, layer, action
        self.scores = RequestScores(monitor, order, cascade)
        self.threshold = float(monitor.threshold)
        self.stop_rows: list[int] = []  # input-batch rows whose next token ends them (this pass)
        self.stopped: dict[str, int] = {}  # request -> the step it was stopped at
        self.first: dict[str, int] = {}  # request -> its first flagged step


_ARMED: _Armed | None = None
# input-batch row -> (the request's EOS id, its own settings); kept by the logits processor
_ROWS: dict[int, tuple[int | None, dict[str, Any]]] = {}


def _settings(params: SamplingParams) -> dict[str, Any]:
    got = (params.extra_args or {}).get(EXTRA) or {}
    if not isinstance(got, dict):
        raise ValueError(f"extra_args[{EXTRA!r}] must be an object, e.g. {{\"monitor\": false}} or {{\"threshold\": 0.9}}")
    unknown = sorted(set(got) - {"monitor", "threshold"})
    if unknown:
        raise ValueError(f"extra_args[{EXTRA!r}]: unknown key(s) {unknown}; known: monitor (bool), threshold (0..1)")
    if "monitor" in got and not isinstance(got["monitor"], bool):
        raise ValueError(f"extra_args[{EXTRA!r}]['monitor'] must be true or false; got {got['monitor']!r}")
    thr = got.get("threshold")
    if thr is not None and (isinstance(thr, bool) or not isinstance(thr, (int, float)) or not 0 < thr < 1):
        raise ValueError(f"extra_args[{EXTRA!r}]['threshold'] must be a probability in (0, 1); got {thr!r}")
    return got


class TPCHooksStop(LogitsProcessor):
    """Ends the requests the monitor stops in this step: their only possible token is their EOS.

    Also keeps, per input-batch row, the request's EOS id and its own monitor settings
    (``extra_args={"tpc_hooks": {"monitor": false}}`` opts out, ``{"threshold": p}`` sets its
    threshold), which the worker's hook reads.
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
    def tpc_hooks_capture(self, layers: list[int]) -> int:
        """Starts recording ``blocks.L.hook_resid_post`` for each ``L`` of ``layers``, per request;
        returns the model's hidden size."""
        self.tpc_hooks_release()
        model = self.model_runner.get_model()
        decoder = model.model.layers
        self._tpc_rows: dict[int, dict[str, list[torch.Tensor]]] = {layer: {} for layer in layers}

        def make(layer: int) -> Any:
            def hook(module: Any, args: Any, out: Any) -> None:
                stream = _stream(out)
                for rid, a, b in self._tpc_pieces():
                    self._tpc_rows[layer].setdefault(rid, []).append(stream[a:b].detach().float().cpu())
            return hook

        self._tpc_handles = [decoder[layer].register_forward_hook(make(layer)) for layer in layers]
        return int(model.config.hidden_size)

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
    def tpc_hooks_arm(self, path: str, layer: int, order: int | None, cascade: float | None, action: str) -> dict:
        """Loads the monitor saved at ``path`` and scores every request from now on at
        ``blocks.{layer}.hook_resid_post``; ``action="stop"`` ends a request at its first
        flagged step. Returns what the worker runs (site, threshold, d_model)."""
        global _ARMED
        self.tpc_hooks_disarm()
        model = self.model_runner.get_model()
        monitor = Monitor.load(path)
        d_model = int(model.config.hidden_size)
        if monitor.head.d_model != d_model:
            raise TPCHooksError(f"monitor expects d_model={monitor.head.d_model} but this model produces {d_model}")
        if getattr(self, "rank", 0) == 0:
            _ARMED = _Armed(monitor, layer, order, cascade, action)
            self._tpc_arm_handle = model.model.layers[layer].register_forward_hook(self._tpc_monitor_hook)
        return {"site": monitor.site, "threshold": float(monitor.threshold), "d_model": d_model}

    def tpc_hooks_runs(self, requests: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """The recorded steps of ``requests`` (default: all), as lists, with the step each was
        stopped at; forgets them."""
        armed = _ARMED
        if armed is None:
            return {}
        out = {}
        for rid, rec in armed.scores.take(requests).items():
            out[rid] = {k: v.tolist() for k, v in rec.items()}
            out[rid]["stopped_at"] = armed.stopped.pop(rid, None)
            armed.first.pop(rid, None)
        return out

    def tpc_hooks_disarm(self) -> bool:
        """Removes the monitor's hook and state (safe to call again)."""
        global _ARMED
        h = getattr(self, "_tpc_arm_handle", None)
        if h is not None:
            h.remove()
        self._tpc_arm_handle = None
        _ARMED = None
        return True

    # ------------------------------------------------------------------ inside a forward pass
    def _tpc_pieces(self) -> list[tuple[str, int, int]]:
        """``(request id, first row, end row)`` of every request in this pass's flat batch."""
        runner = self.model_runner
        req_ids = list(runner.input_batch.req_ids)
        starts = runner.query_start_loc.np[: len(req_ids) + 1].tolist()
        return [(rid, starts[i], starts[i + 1]) for i, rid in enumerate(req_ids)]

    @torch.no_grad()
    def _tpc_monitor_hook(self, module: Any, args: Any, out: Any) -> None:
        armed = _ARMED
        if armed is None:
            return
        stream = _stream(out)
        batch = self.model_runner.input_batch
        computed, prompt = batch.num_computed_tokens_cpu, batch.num_prompt_tokens
        pieces, rows = [], {}
        for i, (rid, a, b) in enumerate(self._tpc_pieces()):
            if b <= a or not _ROWS.get(i, (None, {}))[1].get("monitor", True):
                continue
            if computed[i] == 0:  # a new request, or one preempted and computed again from its first token
                armed.scores.restart(rid)
            pieces.append((rid, stream[a:b], bool(computed[i] + (b - a) >= prompt[i])))
            rows[rid] = i
        done, res = armed.scores.update(pieces)
        if not done:
            return
        own = [_ROWS.get(rows[rid], (None, {}))[1].get("threshold") for rid in done]
        hits = [bool(flagged(res.decision_logits[j:j + 1], armed.threshold if t is None else t))
                for j, t in enumerate(own)]
        for rid, hit in zip(done, hits):
            if hit and rid not in armed.first:
                armed.first[rid] = armed.scores.steps(rid) - 1
                if armed.action == "stop":
                    armed.stopped[rid] = armed.first[rid]
                    armed.stop_rows.append(rows[rid])


def _stream(out: Any) -> torch.Tensor:
    """The residual stream after a vLLM decoder layer: ``hidden + residual``."""
    hidden, residual = out if isinstance(out, tuple) else (out, None)
    return hidden if residual is None else hidden + residual
