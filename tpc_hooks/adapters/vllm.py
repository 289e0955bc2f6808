"""The vLLM adapter: a ``vllm.LLM`` built with :func:`vllm_engine_args` is a model that
``tpc.collect``, ``monitor.score`` and ``monitor.calibrate`` accept.

The engine runs the passes; hooks in its worker processes (``_vllm_worker``) read the residual
stream of each request, which comes back to this process once per call. Site names are
TransformerLens hook names as in every adapter; this adapter reads ``blocks.L.hook_resid_post``
(the sum of a vLLM decoder layer's ``(hidden, residual)`` output). Prefix caching is turned off
by :func:`vllm_engine_args`: a cached prompt block is never recomputed, so a hook would never see
it and a pooled score would silently cover part of the prompt; every prompt token is computed.

Imported only when a ``vllm.LLM`` is passed in.
"""

from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError
from ._adapter import Adapter
from ._sites import Site
from ._vllm_args import WORKER

class VLLMAdapter(Adapter):
    toolkit = "vLLM"
    kinds = ("post",)

    def __init__(self, model: Any):
        super().__init__(model)
        config = model.llm_engine.vllm_config
        if WORKER not in str(config.parallel_config.worker_extension_cls or ""):
            raise TPCHooksError("this vllm.LLM was built without tpc-hooks' worker extension; build it with "
                                "LLM(model=..., **tpc_hooks.adapters.vllm_engine_args(), ...)")
        if config.cache_config.enable_prefix_caching:
            raise TPCHooksError("this vllm.LLM caches prompt prefixes, so a monitor would never see the cached tokens; "
                                "build it with LLM(..., **vllm_engine_args()) (enable_prefix_caching=False)")
        self._hf_config = config.model_config.hf_config

    @property
    def d_model(self) -> int:
        return int(self._hf_config.hidden_size)

    @property
    def n_layers(self) -> int:
        return int(self._hf_config.num_hidden_layers)

    @property
    def tokenizer(self) -> Any:
        return self.model.get_tokenizer()

    @property
    def model_name(self) -> str:
        return str(self.model.llm_engine.vllm_config.model_config.model)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # what comes back from the workers

    def forward_sites(self, input_ids: Tensor, attention_mask: Tensor, sites: list[Site]) -> dict[str, Tensor]:
        """Every row's prompt (its attended tokens) run through the engine as one request each
        (one generated token, greedy); the recorded rows placed back at the mask's positions."""
        from vllm import SamplingParams

        layers = sorted({s.layer for s in sites})
        prompts = [row[m.bool()].tolist() for row, m in zip(input_ids.cpu(), attention_mask.cpu())]
        llm = self.model
        llm.collective_rpc("tpc_hooks_capture", args=(layers,))
        try:
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=1, temperature=0),
                                use_tqdm=False)
            got = llm.collective_rpc("tpc_hooks_take")[0]  # every tensor-parallel rank holds the same stream
        finally:
            llm.collective_rpc("tpc_hooks_release")
        B, T = attention_mask.shape
        result = {}
        for s in sites:
            # the engine suffixes each request id ("0" runs as "0-<random>" in the workers)
            per = {rid.rsplit("-", 1)[0]: rows for rid, rows in got.get(s.layer, got.get(str(s.layer), {})).items()}
            out = torch.zeros(B, T, self.d_model)
            for b, (o, p) in enumerate(zip(outs, prompts)):
                rows = per.get(o.request_id)
                if rows is None:
                    raise TPCHooksError(f"the vLLM workers recorded nothing at {s.name} for request {o.request_id}")
                out[b, attention_mask[b].bool().cpu()] = torch.tensor(rows[:len(p)])
            result[s.name] = out
        return result

    def decode(self, *args: Any, **kwargs: Any) -> None:
        raise TPCHooksError("monitor.generate does not drive a vLLM engine yet; score prompts with monitor.score(llm, "
                            "prompts) or collect with tpc.collect(llm, prompts, sites)")

    def observe(self, *args: Any, **kwargs: Any) -> Any:
        raise TPCHooksError("watch() and the Hugging Face generate hooks do not apply to a vLLM engine")


def make_adapter(model: Any) -> VLLMAdapter:
    return VLLMAdapter(model)
