"""The runtime half of tpc-hooks' contract with vLLM (``surface``): what the plugin relies on
in a live engine, checked on a real runner.

:func:`check_engine` takes a ``vllm.LLM`` built with :func:`engine_args` and has its workers put a
recorder on their passes (``recorder``, through the remote call ``tpc_hooks_contract`` that
:func:`engine_args` adds to the worker): after each forward pass the recorder reads the runner's attributes the
plugin reads, and the logits processor forces each request's row to a token of the request's own.
A few short requests then run; the workers judge what they saw (the rows of each pass in order,
``apply`` after ``execute_model`` on the same thread, the scheduler's counts) and their own
attributes, and the driver's side (admission, outputs, request ids, a worker's error) is checked
here. Every runtime row of the table gets a finding.

The recorder reaches the worker as vLLM's ``worker_extension_cls``, its remote call by name: vLLM
sends a callable to its workers only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (pickle over the
engine's socket), and the shipped worker carries none of it.
"""

from collections.abc import Callable
from typing import Any

from tpc_hooks import TPCHooksError
from tpc_hooks.adapters.vllm import vllm_engine_args
from tpc_hooks.adapters.vllm._wire import CONFIG, RPC_SITES, WORKER, keyed, worker_error

from .checks import CHANGED, MISSING, OK, Finding
from .recorder import CHECKS, RPC, Problem, isinstance_of, plain, same
from .surface import ROWS

__all__ = ["CHECKS", "EXTENSION", "check_engine", "engine_args"]
EXTENSION = "vllm_contract.recorder.ContractChecks"  # vLLM's worker_extension_cls: the recorder's remote call


def engine_args(sites: list[str] | None = None) -> dict[str, Any]:
    """``vllm_engine_args(sites)`` with the recorder's remote call added to the worker (vLLM's
    ``worker_extension_cls``): the engine :func:`check_engine` checks."""
    return {**vllm_engine_args(sites), "worker_extension_cls": EXTENSION}


def check_engine(llm: Any) -> list[Finding]:
    """Every runtime row of the contract on this ``vllm.LLM`` (built with :func:`engine_args`), by
    name: three short requests (one sampled at temperature 0.8) and one again (its prompt's blocks
    cached) run with the recorder on, which is taken off after.

    Example (in vLLM's environment)::

        for finding in check_engine(llm):
            print(finding)   # "OK       vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model_state"
    """
    from vllm import SamplingParams

    config = llm.llm_engine.vllm_config
    if config.parallel_config.worker_extension_cls != EXTENSION:
        raise TPCHooksError(f"check_engine needs an engine built with engine_args() (worker_extension_cls={EXTENSION})")
    hf = config.model_config.hf_text_config
    block = int(config.cache_config.block_size)
    expect = {
        "sites": (config.additional_config or {}).get(CONFIG, {}).get("sites"),
        "layers": hf.num_hidden_layers,
        "d_model": hf.hidden_size,
        "prefix_caching": bool(config.cache_config.enable_prefix_caching),
    }
    vocab, first = int(hf.vocab_size), int(hf.vocab_size) // 2  # each prompt's own token: no special token
    prompts = [[first + j] + [4 + (first + 3 * j + k) % (vocab - 4) for k in range(block + 8)] for j in range(3)]
    n = 4
    keys = [f"contract:{j}" for j in range(len(prompts) + 1)]
    greedy = [SamplingParams(max_tokens=n, temperature=0.0, extra_args=keyed(None, k)) for k in keys]
    problems: dict[str, Problem] = {}

    def judge(key: str, test: Callable[[], str | None]) -> None:
        try:
            diff, status = test(), CHANGED
        except AttributeError as err:
            diff, status = str(err), MISSING
        except Exception as err:  # noqa: BLE001 - whatever a changed engine raises is the finding
            diff, status = f"{type(err).__name__}: {err}", CHANGED
        problems[key] = (OK, "") if diff is None else (status, diff)

    call = lambda what, *args: llm.collective_rpc(RPC, args=(what, *args))  # noqa: E731
    call("install", True)
    try:
        judge("admission", lambda: _refused(llm, prompts[0], SamplingParams))
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            [*greedy[:2], SamplingParams(max_tokens=n, temperature=0.8, seed=0, extra_args=keyed(None, keys[2]))],
            use_tqdm=False,
        )
        llm.generate([{"prompt_token_ids": prompts[0]}], greedy[3], use_tqdm=False)  # its prompt's blocks cached
        made = [list(o.outputs[0].token_ids) for o in outs]
        judge("llm.generate", lambda: None if [len(m) for m in made] == [n] * 3 else f"{len(made)} outputs: {made}")
        judge("forced_token", lambda: same(made, [[p[0]] * n for p in prompts]))
        judge("llm.outputs", lambda: same([list(o.prompt_token_ids) for o in outs], prompts))
        got = call("check", expect)[0]
        judge("request_keys", lambda: _keys(got, keys, [*prompts, prompts[0]]))
        judge("llm.config", lambda: isinstance_of(config, "vllm.config", "VllmConfig"))
        judge("llm.worker_cls", lambda: same(config.parallel_config.worker_cls, WORKER))
        judge("rpc.by_name", lambda: same(sorted(llm.collective_rpc(RPC_SITES)[0]), sorted(_sites(expect))))
        judge("rpc.error", lambda: _error_read(call))
        judge("rpc.ranks", lambda: _in_rank_order(call("rank")))
        judge("rpc.plain", lambda: same(call("plain")[0], plain(None)))
    finally:
        call("uninstall")
    found = {**got["findings"], **problems}
    return [Finding(r.name, *found[r.live]) for r in ROWS if r.live in CHECKS]


def _refused(llm: Any, prompt: list[int], params: Any) -> str | None:
    """vLLM runs the logits processor's ``validate_params`` when it admits a request, in this
    process, and refuses the request with its message (vLLM 0.32 raises its own validation error,
    a 400 from a server)."""
    bad = params(max_tokens=1, extra_args={"tpc_hooks_threshold": 2.0})
    try:
        llm.generate([{"prompt_token_ids": prompt}], bad, use_tqdm=False)
    except Exception as err:  # noqa: BLE001 - vLLM's own error class for a refused request
        return None if "tpc_hooks_threshold" in str(err) else f"refused, without naming the setting: {err!r}"
    return "admitted a request whose tpc_hooks_threshold is 2.0"


def _keys(got: dict[str, Any], keys: list[str], prompts: list[list[int]]) -> str | None:
    """The key of ours each request carried in its ``extra_args`` reached the worker with its
    request: one engine request per key, whose prompt is the one sent with it."""
    for key, p in zip(keys, prompts, strict=True):
        mine = [rid for rid, k in got["keys"].items() if k == key]
        if len(mine) != 1 or got["ids"][mine[0]] != p[:1]:
            return f"the key {key!r} reached the worker on {mine} (keys seen: {got['keys']})"
    return None


def _sites(expect: dict[str, Any]) -> list[str]:
    sites = expect["sites"]
    return [f"blocks.{k}.hook_resid_post" for k in range(expect["layers"])] if sites == "all" else list(sites)


def _in_rank_order(ranks: list[int]) -> str | None:
    """``collective_rpc`` answers one result per worker, rank 0's first."""
    return same(ranks, list(range(len(ranks))))


def _error_read(call: Callable[..., Any]) -> str | None:
    """A worker's error reaches the caller as an ``Exception``; ``worker_error`` reads its message."""
    message = "the contract's check of a worker's error"
    try:
        call("fail", message)
    except Exception as err:  # noqa: BLE001 - what vLLM raises is what is checked
        return same(worker_error(err), message)
    return "the worker's error was not raised"
