"""vLLM model classes that return the residual stream, for families whose vLLM class does not.

tpc-hooks reads the residual stream inside vLLM's compiled forward as EAGLE-3 auxiliary hidden
states (``set_aux_hidden_state_layers``, ``_engine.expose``). vLLM's Gemma 3 text model and its
Granite 4 hybrid do not implement that interface; :class:`Gemma3ForCausalLM` and
:class:`GraniteMoeHybridForCausalLM` here are vLLM's own classes with it added: the same modules,
weights and forward, which also returns the residual stream entering each exposed layer id (id
L + 1 = the output of decoder layer L, as vLLM's Llama returns it). The
multimodal ``Gemma3ForConditionalGeneration`` builds its language model as a
``Gemma3ForCausalLM`` through the registry, so it gets this class too.

:func:`register` puts these classes in vLLM's model registry under vLLM's own architecture
names; the tpc-hooks worker calls it in its own process before the model loads, so only
monitored engines use them. Importing this module imports vLLM.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from typing import Any

import torch
from vllm.distributed import get_pp_group
from vllm.model_executor.models import gemma3 as _gemma3
from vllm.model_executor.models import granitemoehybrid as _granite4
from vllm.model_executor.models.interfaces import EagleModelMixin, SupportsEagle3
from vllm.sequence import IntermediateTensors

__all__ = ["Gemma3ForCausalLM", "GraniteMoeHybridForCausalLM", "register"]


class _Gemma3Model(_gemma3.Gemma3Model, EagleModelMixin):
    """vLLM's Gemma 3 decoder, returning ``(hidden_states, [residual stream at each exposed id])``
    when ids are exposed (the bare hidden states otherwise, as vLLM's). Across pipeline stages an
    earlier stage sends its exposed ids on with the hidden states, and the last returns them first
    (vLLM's Llama does the same)."""

    supports_aux_hidden_states_over_pp = True

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        if get_pp_group().is_first_rank:
            hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
            residual = None
        else:
            assert intermediate_tensors is not None
            hidden, residual = intermediate_tensors["hidden_states"], intermediate_tensors["residual"]
        upstream = self.collect_remote_aux_hidden_states(intermediate_tensors)  # the last stage: earlier stages' ids
        aux: list[torch.Tensor] = []
        if get_pp_group().is_first_rank:
            self._maybe_add_hidden_state(aux, self.start_layer, hidden, residual)
        for idx, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer):
            hidden, residual = layer(positions, hidden, residual, **kwargs)
            self._maybe_add_hidden_state(aux, idx + 1, hidden, residual)
        if not get_pp_group().is_last_rank:
            return IntermediateTensors(
                {"hidden_states": hidden, "residual": residual, **self.pack_local_aux_hidden_states(aux)}
            )
        hidden, _ = self.norm(hidden, residual)
        aux = upstream + aux
        return (hidden, aux) if aux else hidden


class _Granite4Model(_granite4.GraniteMoeHybridModel, EagleModelMixin):
    """vLLM's Granite 4 hybrid decoder (attention and Mamba layers), returning the residual stream
    at each exposed id. Its layers return the residual stream itself (``residual + branch *
    residual_multiplier``) as their first output, so that is what is kept, not a sum."""

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> Any:
        if get_pp_group().is_first_rank:
            hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
            hidden = hidden * self.embedding_multiplier
            residual = None
        else:
            assert intermediate_tensors is not None
            hidden, residual = intermediate_tensors["hidden_states"], intermediate_tensors["residual"]
        wanted = self.aux_hidden_state_layers
        aux = [hidden] if 0 in wanted and get_pp_group().is_first_rank else []
        for idx, layer in enumerate(self.layers):
            hidden, residual = layer(positions=positions, hidden_states=hidden, residual=residual)
            if idx + 1 in wanted:
                aux.append(hidden)
        if not get_pp_group().is_last_rank:
            return IntermediateTensors({"hidden_states": hidden, "residual": residual})
        hidden = self.norm(hidden)
        return (hidden, aux) if aux else hidden


@contextmanager
def _building_with(module: Any, name: str, model_cls: type) -> Iterator[None]:
    """vLLM's causal-LM constructor builds ``module.<name>``; this has it build ``model_cls``
    instead (the rest of the constructor is vLLM's)."""
    saved = getattr(module, name)
    setattr(module, name, model_cls)
    try:
        yield
    finally:
        setattr(module, name, saved)


class Gemma3ForCausalLM(_gemma3.Gemma3ForCausalLM, SupportsEagle3):
    """vLLM's Gemma 3 causal LM with ``set_aux_hidden_state_layers`` (SupportsEagle3)."""

    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        with _building_with(_gemma3, "Gemma3Model", _Gemma3Model):
            super().__init__(vllm_config=vllm_config, prefix=prefix)


class GraniteMoeHybridForCausalLM(_granite4.GraniteMoeHybridForCausalLM, SupportsEagle3):
    """vLLM's Granite 4 hybrid causal LM with ``set_aux_hidden_state_layers`` (SupportsEagle3)."""

    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        with _building_with(_granite4, "GraniteMoeHybridModel", _Granite4Model):
            super().__init__(vllm_config=vllm_config, prefix=prefix)


# vLLM architecture name -> the class here that replaces vLLM's in a monitored engine
CLASSES = {"Gemma3ForCausalLM": Gemma3ForCausalLM, "GraniteMoeHybridForCausalLM": GraniteMoeHybridForCausalLM}


def register() -> None:
    """Registers :data:`CLASSES` in this process's vLLM model registry (idempotent)."""
    from vllm import ModelRegistry

    for arch, cls in CLASSES.items():
        if ModelRegistry.models.get(arch) is None or getattr(ModelRegistry.models[arch], "model_cls", None) is not cls:
            ModelRegistry.register_model(arch, cls)
