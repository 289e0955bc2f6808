"""What a ``vllm.LLM`` needs to be monitored: its engine arguments (this module imports no vLLM)."""

import json
import os
import re
from collections.abc import Sequence
from typing import Any

from .._errors import TPCHooksError
from ._sites import parse_site

WORKER = "tpc_hooks.serving._vllm_worker.TPCHooksWorker"
STOP = "tpc_hooks.serving._vllm_worker:TPCHooksStop"
CONFIG = "tpc_hooks"  # the key of tpc-hooks' settings in vLLM's `additional_config`
OPT_OUT = "tpc_hooks_monitor"  # SamplingParams.extra_args key: false/0 opts the request out
THRESHOLD = "tpc_hooks_threshold"  # ... its own threshold, a probability in (0, 1)
# a server's monitor names (JSON), set before its engine starts: requests are checked against them
NAMES_ENV = "TPC_HOOKS_MONITOR_NAMES"
# how vLLM words a worker's error for collective_rpc's caller: the engine core's words (and, from a worker
# process of its own, the executor's) around the text of what the worker raised (the contract's rows
# EngineCoreProc._invoke_utility_method and MultiprocExecutor.collective_rpc)
_CALL_FAILED = re.compile(r"^Call to \w+ method failed: ")
_WORKER_FAILED = re.compile(
    r"^Worker failed with error '(.*)', please check the stack trace above for the root cause$", re.DOTALL
)


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


def request_settings(params: Any, names: bool = False) -> dict[str, Any]:
    """A request's own monitor settings from its ``extra_args`` (the OpenAI server's
    ``vllm_xargs``): ``{"tpc_hooks_monitor": false}`` opts out, ``{"tpc_hooks_threshold": p}``
    sets its threshold; with several monitors, ``tpc_hooks_monitor.NAME`` and
    ``tpc_hooks_threshold.NAME`` do the same for the monitor ``NAME`` alone (``"by"``). Raises
    ValueError (an HTTP 400 from the server) for a bad value, and with ``names``, for a name the
    server does not run (checked where the engine admits a request: the server's process, whose
    list follows monitors added or removed; a worker reads the settings of admitted requests)."""
    extra = (params.extra_args if params is not None else None) or {}
    out: dict[str, Any] = {}
    known = json.loads(os.environ.get(NAMES_ENV, "null")) if names else None  # a server's monitors (None: not checked)
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
