"""A worker extension for the vLLM tests only: tpc-hooks' own, plus a way to plant NaN in the
activations of the requests that contain a chosen token (its embedding rows become NaN, which
attention carries to every later row of that request and of no other)."""

from typing import Any

import torch

from tpc_hooks.serving._vllm_worker import TPCHooksWorker


class PoisonWorker(TPCHooksWorker):
    def test_poison(self, token_id: int | str) -> bool:
        """From now on the embedding rows of ``token_id`` are NaN (a string: from the server's
        development endpoint, ``POST /collective_rpc``, which passes strings)."""
        token_id = int(token_id)
        embed = self.model_runner.get_model().model.embed_tokens

        def hook(module: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
            out = out.clone()
            out[args[0] == token_id] = float("nan")
            return out

        embed.register_forward_hook(hook)
        return True
