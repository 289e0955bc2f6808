"""What a ``vllm.LLM`` needs to be monitored: its engine arguments, the keys tpc-hooks puts in a
request's ``extra_args``, the names of the worker's remote calls, a monitor as the workers receive
it (:class:`ServedMonitor`), how rows travel back from a worker, and how vLLM's request ids are read
(this module imports no vLLM)."""

import dataclasses
import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..._errors import TPCHooksError
from ...activations import parse_site
from ...monitoring import Monitor, monitor_from_files, saved_files
from ...saving import dir_files

WORKER = "tpc_hooks.adapters.vllm._worker.worker.TPCHooksWorker"
STOP = "tpc_hooks.adapters.vllm._worker.worker:TPCHooksStop"
CONFIG = "tpc_hooks"  # the key of tpc-hooks' settings in vLLM's `additional_config`
OPT_OUT = "tpc_hooks_monitor"  # SamplingParams.extra_args key: false/0 opts the request out
THRESHOLD = "tpc_hooks_threshold"  # ... its own threshold, a probability in (0, 1)
# ... where the answer starts in its prompt (a position): a response monitor pools from there; by default the
# answer starts after the prompt
ANSWER_START = "tpc_hooks_answer_start"
# an operator's switch, read once when a worker starts: "1" makes tpc-hooks' worker plain vLLM's (nothing exposed,
# read or scored; its remote calls refuse, saying why)
DISABLE = "TPC_HOOKS_DISABLE"
OFF = (
    "tpc-hooks is turned off in this engine (TPC_HOOKS_DISABLE=1 was set when its workers started): it runs as "
    "plain vLLM and monitors nothing; unset TPC_HOOKS_DISABLE and build the engine again to monitor"
)

# set where a request enters (monitor.generate, tpc.collect, the server): tpc-hooks' own key for it, how many
# samples vLLM fans it out to (its `n`), and a server's monitor names that `tpc_hooks_*.NAME` settings may address
KEY = "tpc_hooks_key"
FAN = "tpc_hooks_fan"
NAMES = "tpc_hooks_names"

# the worker's remote calls (`collective_rpc(NAME, ...)`), by the names its methods have (tpc_hooks.adapters.vllm.
# _worker.control.Control and _worker.worker's mixin); tests/test_vllm_contract.py checks every one resolves
RPC_SITES = "tpc_hooks_sites"
RPC_CAPTURE = "tpc_hooks_capture"
RPC_TAKE = "tpc_hooks_take"
RPC_RELEASE = "tpc_hooks_release"
RPC_ARM_SET = "tpc_hooks_arm_set"
RPC_RUNS = "tpc_hooks_runs"
RPC_SUMMARIES = "tpc_hooks_summaries"
RPC_SET_SUMMARIES = "tpc_hooks_set_summaries"
RPC_SWAP = "tpc_hooks_swap"
RPC_DISARM = "tpc_hooks_disarm"
RPC_REVIEW = "tpc_hooks_review"
RPC_STATS = "tpc_hooks_stats"
RPC_COUNTS = "tpc_hooks_counts"
RPCS = (
    RPC_SITES, RPC_CAPTURE, RPC_TAKE, RPC_RELEASE, RPC_ARM_SET, RPC_RUNS, RPC_SUMMARIES,
    RPC_SET_SUMMARIES, RPC_SWAP, RPC_DISARM, RPC_REVIEW, RPC_STATS, RPC_COUNTS,
)  # fmt: skip
# how vLLM words a worker's error for collective_rpc's caller: the engine core's words (and, from a worker
# process of its own, the executor's) around the text of what the worker raised (the contract's rows
# EngineCoreProc._invoke_utility_method and MultiprocExecutor.collective_rpc)
_CALL_FAILED = re.compile(r"^Call to \w+ method failed: ")
_WORKER_FAILED = re.compile(
    r"^Worker failed with error '(.*)', please check the stack trace above for the root cause$", re.DOTALL
)


# vLLM's request-id scheme, which only the two helpers below read (rows "ParentRequest" and
# "OpenAIServingCompletion"): sample k of a request's n runs as "<k>_<parent's engine id>"; prompt i of a
# completions request enters the engine as "<response id>-<i>"
_CHILD = re.compile(r"(\d+)_.")
_PROMPT = re.compile(r"cmpl-.*-(\d+)", re.DOTALL)


def child_index(engine_id: str, fan: int) -> int:
    """Which of its request's ``fan`` samples (its ``n``) the engine's request ``engine_id`` is:
    0 for a request vLLM did not fan out (``fan`` 1), else the index vLLM's id carries. The one
    place that reads an engine id; raises if vLLM names samples otherwise.

    Example:
        >>> child_index("2_chatcmpl-a-1-5e3f0a9c", 3), child_index("7_x-5e3f0a9c", 1)
        (2, 0)
    """
    if fan <= 1:
        return 0
    found = _CHILD.match(engine_id)
    k = int(found.group(1)) if found else -1
    if not 0 <= k < fan:
        raise TPCHooksError(
            f"vLLM ran sample {engine_id!r} of a request fanned out to {fan}, named otherwise than "
            "'<k>_<parent id>' (tpc-hooks' contract with vLLM, row vllm.v1.engine.parallel_sampling:ParentRequest)"
        )
    return k


def completion_prompt(request_id: str) -> int:
    """Which prompt of a completions request the id vLLM's OpenAI layer gives it names (it enters
    the engine once per prompt, as ``<response id>-<i>``); raises if vLLM names prompts otherwise.

    Example:
        >>> completion_prompt("cmpl-my-own-id-3")
        3
    """
    found = _PROMPT.fullmatch(request_id)
    if found is None:
        raise TPCHooksError(
            f"vLLM's completions endpoint ran a prompt as {request_id!r}, not 'cmpl-<id>-<i>' (tpc-hooks' contract "
            "with vLLM, row vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion)"
        )
    return int(found.group(1))


def disabled() -> bool:
    """Whether the operator turned tpc-hooks off in this process (``TPC_HOOKS_DISABLE=1``, or
    true/yes/on).

    Example:
        >>> import os
        >>> os.environ["TPC_HOOKS_DISABLE"] = "1"; disabled()
        True
        >>> del os.environ["TPC_HOOKS_DISABLE"]; disabled()
        False
    """
    return os.environ.get(DISABLE, "").strip().lower() in ("1", "true", "yes", "on")


def holder(vllm_config: Any) -> int:
    """Where in ``collective_rpc``'s results (one per worker, in rank order) the worker that holds the
    monitors answers: the first tensor-parallel rank of the last pipeline stage, the rank whose sampled
    tokens the engine reports (0 on a single stage).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> holder(NS(parallel_config=NS(tensor_parallel_size=2, pipeline_parallel_size=2)))
        2
        >>> holder(NS(parallel_config=NS(tensor_parallel_size=4, pipeline_parallel_size=1)))
        0
    """
    p = vllm_config.parallel_config
    per_stage = int(p.tensor_parallel_size) * int(getattr(p, "prefill_context_parallel_size", 1))
    return (int(p.pipeline_parallel_size) - 1) * per_stage


def unexposed(sites: Sequence[str], exposed: dict[str, int]) -> str:
    """The error for sites a built engine does not return (``exposed``: its sites -> aux ids).

    Example:
        >>> unexposed(["blocks.3.hook_resid_pre"], {"blocks.20.hook_resid_post": 21})  # doctest: +NORMALIZE_WHITESPACE
        "this vLLM engine exposes ['blocks.20.hook_resid_post'] (a compiled engine returns the sites fixed when
        it was built), not 'blocks.3.hook_resid_pre'; build it with
        LLM(..., **tpc_hooks.adapters.vllm_engine_args(sites=[...]))"
    """
    names = sorted(exposed, key=lambda s: exposed[s])
    post = [n for n in names if n.endswith("hook_resid_post")]
    listed = f"every layer's hook_resid_post ({names[0]} .. {names[-1]})" if len(post) == len(names) > 4 else str(names)
    asked = repr(sites[0]) if len(sites) == 1 else str(list(sites))
    return (
        f"this vLLM engine exposes {listed} (a compiled engine returns the sites fixed when it was built), not "
        f"{asked}; build it with LLM(..., **tpc_hooks.adapters.vllm_engine_args(sites=[...]))"
    )


def worker_error(err: BaseException) -> str:
    """What a vLLM worker's error said, read from the exception ``collective_rpc`` raised in its
    caller (vLLM wraps the worker's text in words of its own; other text comes back as it is).

    Example:
        >>> worker_error(Exception("Call to collective_rpc method failed: monitor expects d_model=64"))
        'monitor expects d_model=64'
        >>> worker_error(RuntimeError("Worker failed with error 'no monitor named x', please check the stack "
        ...                           "trace above for the root cause"))
        'no monitor named x'
    """
    text = _CALL_FAILED.sub("", str(err), count=1)
    found = _WORKER_FAILED.match(text)
    return found.group(1) if found else text


def vllm_engine_args(
    sites: str | Sequence[str] | None = None, *, additional_config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments a monitored engine needs, to pass beside your own.

    tpc-hooks' worker (vLLM's own worker for the platform, extended: ``worker_cls``) and the
    logits processor that ends a stopped request in the step it is flagged (add your own logits
    processors to its list). Nothing else changes: the engine compiles as vLLM decides (CUDA
    graphs on a GPU, Dynamo and Inductor on the CPU build), runs the model runner vLLM picks, and
    keeps prefix caching as you set it, which monitored requests use too.

    The residual stream comes out of the compiled forward as extra outputs at the ``sites`` fixed
    here, before the engine compiles (``blocks.L.hook_resid_post`` or ``hook_resid_pre``); a
    monitor or ``tpc.collect`` may read those sites only. Default: every layer's
    ``hook_resid_post`` (each exposed site adds one ``[tokens, d_model]`` output per pass: name
    the sites you read, on a large model).

    Args:
        sites: the hook names the engine exposes (a monitor's ``site``), or None for every layer.
        additional_config: your own ``additional_config`` for vLLM, merged with tpc-hooks' key.

    Example:
        >>> from tpc_hooks.adapters import vllm_engine_args
        >>> args = vllm_engine_args(["blocks.20.hook_resid_post"])
        >>> sorted(args)
        ['additional_config', 'logits_processors', 'worker_cls']
        >>> args["additional_config"]
        {'tpc_hooks': {'sites': ['blocks.20.hook_resid_post']}}
    """
    if sites is not None:
        sites = [sites] if isinstance(sites, str) else list(sites)
        if not sites:
            raise TPCHooksError("sites must name at least one hook (or be None: every layer's hook_resid_post)")
        for name in sites:
            if parse_site(name).kind not in ("post", "pre"):
                raise TPCHooksError(f"a vLLM engine exposes blocks.L.hook_resid_post and hook_resid_pre; got {name!r}")
    extra = dict(additional_config or {})
    if CONFIG in extra:
        raise TPCHooksError(f"additional_config[{CONFIG!r}] is tpc-hooks' own: pass sites= instead")
    extra[CONFIG] = {"sites": sites if sites is not None else "all"}
    return {"worker_cls": WORKER, "logits_processors": [STOP], "additional_config": extra}


def ident(key: str, child: int = 0) -> str:
    """How a worker names the request tpc-hooks keyed ``key`` (:data:`KEY`), sample ``child`` of
    its ``n``, in what it hands back (steps, summaries, rows). A request without a key of ours
    goes by its engine id.

    Example:
        >>> ident("5f0c:2"), ident("5f0c:2", 1)
        ('5f0c:2/0', '5f0c:2/1')
    """
    return f"{key}/{child}"


def keyed(extra: dict[str, Any] | None, key: str, fan: int = 1, names: list[str] | None = None) -> dict[str, Any]:
    """A request's ``extra_args`` with tpc-hooks' key for it (``fan``: how many samples it asks
    for; ``names``: the monitors a server runs, which its settings may name); a copy.

    Example:
        >>> keyed({"tpc_hooks_threshold": 0.9}, "5f0c:0")
        {'tpc_hooks_threshold': 0.9, 'tpc_hooks_key': '5f0c:0', 'tpc_hooks_fan': 1}
    """
    out = {k: v for k, v in (extra or {}).items() if k not in (KEY, FAN, NAMES)}
    out.update({KEY: key, FAN: int(fan)})
    if names is not None:
        out[NAMES] = list(names)
    return out


def pack(rows: Any) -> dict[str, Any]:
    """A float tensor as a worker's remote call hands it back: its bytes, dtype and shape (vLLM's
    engine core encodes a remote call's result with msgpack, which carries bytes as they are).
    :func:`unpack` makes it a tensor again.

    Example:
        >>> import torch
        >>> t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        >>> torch.equal(unpack(pack(t)), t)
        True
    """
    t = rows.detach().to("cpu", torch.float32).contiguous()
    return {"shape": list(t.shape), "data": t.numpy().tobytes()}


def unpack(packed: dict[str, Any]) -> Tensor:
    """The tensor :func:`pack` packed (float32)."""
    flat = torch.frombuffer(bytearray(packed["data"]), dtype=torch.float32)
    return flat.reshape(packed["shape"])


def request_settings(params: Any, names: bool = False) -> dict[str, Any]:
    """A request's own monitor settings from its ``extra_args`` (the OpenAI server's
    ``vllm_xargs``): ``{"tpc_hooks_monitor": false}`` opts out, ``{"tpc_hooks_threshold": p}``
    sets its threshold, ``{"tpc_hooks_answer_start": n}`` says the answer starts at token ``n`` of
    the prompt (a response monitor pools from there: a conversation sent whole); with several
    monitors, ``tpc_hooks_monitor.NAME`` and ``tpc_hooks_threshold.NAME`` do the same for the
    monitor ``NAME`` alone (``"by"``). Raises ValueError (an HTTP 400 from the server) for a bad
    value, and for a name the server does not run, with ``names``: a server puts the names it runs
    in each request where it enters (:data:`NAMES`, following monitors added or removed), checked
    when the engine admits it."""
    extra = (params.extra_args if params is not None else None) or {}
    out: dict[str, Any] = {}
    if ANSWER_START in extra:
        start = extra[ANSWER_START]
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"{ANSWER_START} must be a token position, an integer >= 0; got {start!r}")
        out["answer_start"] = start
    known = extra.get(NAMES) if names else None  # a server's monitors (None: not checked)
    for key, v in extra.items():
        base, dot, name = str(key).partition(".")
        if base not in (OPT_OUT, THRESHOLD) or (dot and not name):
            continue
        if dot and known is not None and name not in known:
            runs = f"the monitors {', '.join(n for n in known)}" if any(known) else "one unnamed monitor"
            raise ValueError(f"{key} names no monitor of this server (it runs {runs})")
        value: bool | float
        if base == OPT_OUT:
            if v not in (True, False, 0, 1) or isinstance(v, float):
                raise ValueError(f"{key} must be true/false (or 1/0); got {v!r}")
            value, what = bool(v), "monitor"
        else:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
                raise ValueError(f"{key} must be a probability in (0, 1); got {v!r}")
            value, what = float(v), "threshold"
        (out.setdefault("by", {}).setdefault(name, {}) if dot else out)[what] = value
    return out


def own_setting(settings: dict[str, Any], name: str, what: str, default: Any) -> Any:
    """A request's setting ``what`` for the monitor ``name``: its own by name, else its own for
    every monitor, else ``default``."""
    return settings.get("by", {}).get(name, {}).get(what, settings.get(what, default))


@dataclass(frozen=True)
class ServedMonitor:
    """One monitor as vLLM's workers run it, from where it is named to the workers: its name
    (``""`` alone), site, action and policy, and its saved files' bytes with their SHA-256.

    Built once where the monitor enters, which loads and checks it: :meth:`read` a saved directory
    (``tpc-hooks serve --monitor``, the admin route), :meth:`of` a monitor in memory
    (``monitor.generate`` on a ``vllm.LLM``). It crosses ``collective_rpc`` as plain values
    (:meth:`plain`, :meth:`from_plain`) and each worker rebuilds the monitor from the bytes
    (:meth:`load`), reading no file. The SHA-256 is of ``config.json`` then ``model.safetensors``,
    as saved: what ``/v1/models`` and the review log name a monitor's version by.

    Example:
        >>> import tpc_hooks as tpc
        >>> mon = tpc.Monitor(tpc.TPC(d_model=8, degree=2, rank=2), "blocks.1.hook_resid_post")
        >>> spec = ServedMonitor.of("harm", mon, "stop")
        >>> ServedMonitor.from_plain(spec.plain()) == spec, spec.load().site
        (True, 'blocks.1.hook_resid_post')
    """

    name: str
    site: str
    action: str
    config: bytes = dataclasses.field(repr=False)
    weights: bytes = dataclasses.field(repr=False)
    sha256: str
    where: str = "<memory>"  # the directory it was read from, for errors
    order: int | None = None
    cascade: float | None = None

    @classmethod
    def read(cls, name: str, path: str | os.PathLike, action: str) -> tuple["ServedMonitor", Monitor]:
        """The monitor saved in ``path`` (a missing, corrupt or tampered directory raises), and the
        monitor itself."""
        where = str(Path(path).resolve())
        config, weights = dir_files(where)
        monitor = monitor_from_files(config, weights, where)
        return cls(name, monitor.site, action, config, weights, _sha256(config, weights), where), monitor

    @classmethod
    def of(
        cls, name: str, monitor: Monitor, action: str, order: int | None = None, cascade: float | None = None
    ) -> "ServedMonitor":
        """A monitor in memory, as ``save_pretrained`` would save it."""
        config, weights = saved_files(monitor)
        return cls(name, monitor.site, action, config, weights, _sha256(config, weights), order=order, cascade=cascade)

    def load(self) -> Monitor:
        """The monitor, rebuilt from its bytes (checked as ``from_pretrained`` checks a directory)."""
        return monitor_from_files(self.config, self.weights, self.where)

    def plain(self) -> dict[str, Any]:
        """What ``collective_rpc`` carries."""
        return dataclasses.asdict(self)

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> "ServedMonitor":
        return cls(**plain)


def _sha256(config: bytes, weights: bytes) -> str:
    return hashlib.sha256(config + weights).hexdigest()
