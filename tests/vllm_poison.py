"""A worker for the vLLM tests only: tpc-hooks' own, plus a way to plant NaN in the activations of
the requests that contain a chosen token (its embedding row becomes NaN, which attention carries
to every later row of that request and of no other). The row is written in the weights, which
the compiled forward reads at every pass."""

import torch

from tpc_hooks.adapters.vllm._worker.worker import TPCHooksWorker


class PoisonWorker(TPCHooksWorker):
    def test_poison(self, token_id: int | str) -> bool:
        """From now on the embedding row of ``token_id`` is NaN (a string: from the server's
        development endpoint, ``POST /collective_rpc``, which passes strings)."""
        embed = self.model_runner.get_model().model.embed_tokens
        with torch.no_grad():
            embed.weight[int(token_id)] = float("nan")
        return True
