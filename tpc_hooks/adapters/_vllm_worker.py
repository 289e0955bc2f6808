"""Runs inside a vLLM worker process (``worker_extension_cls``): forward hooks on the decoder
layers that read each request's residual stream from the passes the engine runs anyway.

vLLM packs the requests of a step into one flat batch of tokens; the model runner's
``query_start_loc`` and ``input_batch.req_ids`` say which rows belong to which request. A
vLLM decoder layer returns ``(hidden, residual)``; the residual stream after the layer (the
tensor ``blocks.L.hook_resid_post`` names) is their sum. Imported only by vLLM, in its workers.
"""

from typing import Any

import torch


class TPCHooksWorker:
    """Mixed into vLLM's worker class by ``LLM(..., worker_extension_cls=...)``; its methods are
    called from the driver with ``llm.collective_rpc(name, args=...)``. Tensors go back as lists
    (what the RPC carries)."""

    def tpc_hooks_capture(self, layers: list[int]) -> int:
        """Starts recording ``blocks.L.hook_resid_post`` for each ``L`` of ``layers``, per request;
        returns the model's hidden size."""
        self.tpc_hooks_release()
        model = self.model_runner.get_model()
        decoder = model.model.layers
        self._tpc_rows: dict[int, dict[str, list[torch.Tensor]]] = {layer: {} for layer in layers}

        def make(layer: int) -> Any:
            def hook(module: Any, args: Any, out: Any) -> None:
                hidden, residual = out if isinstance(out, tuple) else (out, None)
                stream = hidden if residual is None else hidden + residual
                runner = self.model_runner
                req_ids = list(runner.input_batch.req_ids)
                starts = runner.query_start_loc.np[: len(req_ids) + 1].tolist()
                for i, rid in enumerate(req_ids):
                    rows = stream[starts[i]:starts[i + 1]].detach().float().cpu()
                    self._tpc_rows[layer].setdefault(rid, []).append(rows)
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
        """Removes the hooks (safe to call again)."""
        for h in getattr(self, "_tpc_handles", []):
            h.remove()
        self._tpc_handles = []
        return True
