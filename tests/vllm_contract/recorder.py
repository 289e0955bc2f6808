"""The worker's half of the runtime checks of tpc-hooks' contract with vLLM (the driver's:
``live``): a recorder on a monitored engine's worker, run through the remote call
``tpc_hooks_contract`` (:func:`run`) that :class:`ContractChecks` adds to tpc-hooks' worker as vLLM's
``worker_extension_cls`` (``live.engine_args``): the shipped worker carries none of it.

:func:`install` puts the recorder around the worker's ``execute_model`` and the logits processor's
``apply``: after each forward pass it reads the runner's attributes the plugin reads
(``execute_model_state`` and its fields, the batch's request ids, row starts and token ids), and it
has the logits processor force each request's row to a token of the request's own.
:func:`check_runtime` judges what the recorder saw (the rows of each pass in order, ``apply`` after
``execute_model`` on the same thread, the scheduler's counts) and the worker's own attributes, and
returns each check's finding as plain values. Costs nothing until installed: nothing wraps the
worker before.
"""

import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from tpc_hooks import TPCHooksError
from tpc_hooks.adapters.vllm import _engine
from tpc_hooks.adapters.vllm._wire import CONFIG, KEY, OFF
from tpc_hooks.adapters.vllm._worker.armed import WorkerState

from .checks import CHANGED, MISSING, OK, SKIPPED

# each runtime check of the table (a row's ``live`` key), and where it runs: in the worker (on what the
# recorder saw and the worker's attributes) or in the driver's process (_live); v1./v2.: on that
# model runner only
WORKER_CHECKS = (
    "rows apply_after_execute state state.aux worker.vllm_config worker.model_runner config.sizes "
    "config.sites sched.num_computed sched.finished params.eos rpc.thread model.eagle3 runner.aux_flag "
    "runner.num_blocks runner.class registry v1.state.scheduler_output v1.batch.num_reqs v1.batch.req_ids "
    "v1.batch.starts v1.batch.tokens v2.state.input_batch v2.batch.req_ids v2.batch.starts v2.batch.tokens"
).split()
DRIVER_CHECKS = (
    "admission forced_token rpc.by_name llm.config llm.worker_cls llm.generate llm.outputs request_keys rpc.error "
    "rpc.ranks rpc.plain"
).split()
CHECKS = {**dict.fromkeys(WORKER_CHECKS, "worker"), **dict.fromkeys(DRIVER_CHECKS, "driver")}
RPC = "tpc_hooks_contract"  # the worker's remote call that runs these checks (ContractChecks')
_STATE: dict[str, Any] = {}  # this worker process's recorder
Problem = tuple[str, str]  # (status, what differs)


def _runner_version(runner: Any) -> str:
    return _engine.runner_version(runner) or "neither"


class Recorder:
    """What a worker's passes showed: per request its prompt, admission count, EOS and the tokens
    each pass fed (by position); the order of ``execute_model`` and ``apply`` calls; and the first
    problem each check met."""

    def __init__(self, worker: Any, force: bool):
        self.worker, self.force = worker, force
        self.step, self.busy, self.thread = 0, False, 0
        self.prompts: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.eos: dict[str, Any] = {}
        self.keys: dict[str, Any] = {}  # request -> the key of ours its extra_args carried
        self.starts: dict[str, int] = {}  # request -> its computed count before this step
        self.fed: dict[str, list[tuple[int, list[int]]]] = {}  # request -> (position, tokens) per pass
        self.last: dict[str, int] = {}  # request -> the last step that scheduled it
        self.finished: dict[str, int] = {}  # request -> the step that reported it finished
        self.events: list[tuple] = []  # ("exec", step, rows, thread) | ("apply", step, rows, thread)
        self.problems: dict[str, Problem] = {}
        self.seen: set[str] = set()

    def judge(self, key: str, test: Callable[[], str | None]) -> Any:
        """Runs one read; its first problem is the check's finding."""
        self.seen.add(key)
        try:
            diff = test()
        except AttributeError as err:
            diff, status = str(err), MISSING
        except Exception as err:  # noqa: BLE001 - a changed runner fails the read in its own way
            diff, status = f"{type(err).__name__}: {err}", CHANGED
        else:
            status = CHANGED
        if diff is not None and key not in self.problems:
            self.problems[key] = (status, diff)

    def before(self, so: Any) -> None:
        self.step += 1
        self.busy, self.thread = True, threading.get_ident()
        for nr in so.scheduled_new_reqs:
            rid = nr.req_id
            self.prompts[rid] = list(nr.prompt_token_ids or [])
            self.computed[rid] = self.starts[rid] = int(nr.num_computed_tokens)
            self.eos[rid] = getattr(nr.sampling_params, "eos_token_id", None)
            self.keys[rid] = (nr.sampling_params.extra_args or {}).get(KEY)
            self.last[rid] = self.step
        cached = so.scheduled_cached_reqs
        for rid, c in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            self.starts[rid], self.last[rid] = int(c), self.step
        for rid in so.finished_req_ids:
            self.finished[rid] = self.step

    def after(self, so: Any) -> None:
        self.busy = False
        if not so.total_num_scheduled_tokens:
            return
        runner = self.worker.model_runner
        scheduled = {nr.req_id for nr in so.scheduled_new_reqs} | set(so.scheduled_cached_reqs.req_ids)
        state = runner.execute_model_state
        self.judge("state", lambda: None if state is not None else "None after execute_model")
        if state is None:
            return
        self.judge("state.aux", lambda: self._aux(state.aux_hidden_states, so.total_num_scheduled_tokens))
        read: dict[str, Any] = {}
        if _runner_version(runner) == "v2":
            batch = state.input_batch
            self.judge("v2.state.input_batch", lambda: None if batch is not None else "None")
            self.judge("v2.batch.req_ids", lambda: _ids(read, list(batch.req_ids), scheduled))
            self.judge("v2.batch.starts", lambda: _starts(read, batch.query_start_loc_np, so))
            self.judge("v2.batch.tokens", lambda: _tokens(read, batch.input_ids))
        else:
            self.judge("v1.state.scheduler_output", lambda: None if state.scheduler_output is so else "another step's")
            self.judge("v1.batch.num_reqs", lambda: _count(read, runner.input_batch.num_reqs, scheduled))
            ids = lambda: list(runner.input_batch.req_ids[: len(scheduled)])  # noqa: E731
            self.judge("v1.batch.req_ids", lambda: _ids(read, ids(), scheduled))
            self.judge("v1.batch.starts", lambda: _starts(read, runner.query_start_loc.np, so))
            self.judge("v1.batch.tokens", lambda: _tokens(read, runner.input_ids.gpu))
        try:
            step = _engine.last_pass(runner, so)  # what the worker's own reader sees
        except TPCHooksError:
            step = None
        self.judge("state", lambda: _same_pass(step, read))
        if step is None or "tokens" not in read:
            return
        for i, rid in enumerate(step.req_ids):
            a, b = int(step.starts[i]), int(step.starts[i + 1])
            self.fed.setdefault(rid, []).append((self.starts.get(rid, 0), step.tokens[a:b].tolist()))
            if self.force and self.prompts.get(rid):
                WorkerState.of_process().stops.append((i, self.prompts[rid][0]))
        self.events.append(("exec", self.step, len(step.req_ids), threading.get_ident()))

    def _aux(self, aux: Any, tokens: int) -> str | None:
        ids, d_model = self.worker._tpc_ids, self.worker._tpc_d_model()
        if not isinstance(aux, list) or len(aux) != len(ids):
            return f"{type(aux).__name__} of {len(aux) if isinstance(aux, list) else '?'}, expected {len(ids)} tensors"
        shapes = [tuple(t.shape) for t in aux]
        bad = [s for s in shapes if len(s) != 2 or s[1] != d_model or s[0] < tokens]
        return f"shapes {shapes}, expected [>= {tokens}, {d_model}] each" if bad else None

    def applied(self, logits: Any) -> None:
        self.events.append(("apply", self.step, int(logits.shape[0]), threading.get_ident()))


def _count(read: dict, n: Any, scheduled: set[str]) -> str | None:
    read["n"] = n
    return None if isinstance(n, int) and n == len(scheduled) else f"{n!r}, scheduled {len(scheduled)}"


def _ids(read: dict, ids: list, scheduled: set[str]) -> str | None:
    read["ids"] = ids
    ok = all(isinstance(i, str) for i in ids) and set(ids) == scheduled and len(ids) == len(scheduled)
    return None if ok else f"{ids}, scheduled {sorted(scheduled)}"


def _starts(read: dict, starts: Any, so: Any) -> str | None:
    n = len(read.get("ids", ()))
    s = np.asarray(starts[: n + 1])
    read["starts"] = s
    ok = len(s) == n + 1 and s[0] == 0 and bool((np.diff(s) >= 0).all()) and s[-1] == so.total_num_scheduled_tokens
    return None if ok else f"{s.tolist()}, for {so.total_num_scheduled_tokens} tokens of {n} requests"


def _tokens(read: dict, ids: Any) -> str | None:
    end = int(read["starts"][-1])
    read["tokens"] = toks = ids[:end].cpu().numpy()
    return None if toks.shape == (end,) else f"shape {toks.shape}, expected ({end},)"


def _same_pass(step: Any, read: dict) -> str | None:
    if step is None:
        return "the worker's reader (_engine.last_pass) saw no pass"
    if "tokens" not in read:  # the runner's own reads failed: their checks say how
        return None
    same_rows = step.req_ids == read["ids"] and np.array_equal(step.starts, read["starts"])
    if not (same_rows and np.array_equal(step.tokens, read["tokens"])):
        return "the worker's reader (_engine.last_pass) disagrees with the runner's attributes"
    return None


def install(worker: Any, stop: Any, force: bool = True) -> int:
    """Puts a recorder around this worker's ``execute_model`` and the logits processor's ``apply``
    (``stop``: its class; ``force``: every request's row is forced to its first prompt token).
    Returns the process id."""
    uninstall(worker)
    rec = Recorder(worker, force)
    inner, apply = worker.execute_model, stop.apply

    def execute_model(so: Any, *args: Any, **kwargs: Any) -> Any:
        rec.before(so)
        try:
            out = inner(so, *args, **kwargs)
        finally:
            rec.busy = False
        rec.after(so)
        return out

    def recording_apply(self: Any, logits: Any, ctx: Any = None) -> Any:
        rec.applied(logits)
        return apply(self, logits, ctx)

    def undo() -> None:
        worker.__dict__.pop("execute_model", None)
        stop.apply = apply

    worker.execute_model = execute_model
    stop.apply = recording_apply
    _STATE.update(rec=rec, undo=undo)
    return os.getpid()


def uninstall(worker: Any) -> bool:
    """Takes the recorder off (safe to call again)."""
    undo = _STATE.pop("undo", None)
    if undo is not None:
        undo()
    _STATE.pop("rec", None)
    WorkerState.of_process().stops.clear()
    return True


def fail(worker: Any, message: str) -> None:
    raise TPCHooksError(message)


def rank_of(worker: Any) -> int:
    return int(worker.rank)


def plain(worker: Any) -> dict[str, Any]:
    return {"rows": [[0.5, 1.5]], "n": 3, "names": ["a"], "bytes": b"\x00\x01\xff"}


def check_runtime(worker: Any, expect: dict[str, Any]) -> dict[str, Any]:
    """The worker's runtime checks: ``findings`` by key, ``(status, detail)``, and the engine ids it
    saw with each one's first prompt token (``ids``) and the key of ours it carried (``keys``), sent
    back as plain values."""
    rec: Recorder | None = _STATE.get("rec")
    if rec is None:
        return {"findings": dict.fromkeys(WORKER_CHECKS, (CHANGED, "no recorder: install it first")), "ids": {}}
    runner = worker.model_runner
    me = threading.get_ident()
    between = me == rec.thread and not rec.busy
    rec.judge("rpc.thread", lambda: None if between else f"on thread {me}; execute_model on {rec.thread} ({rec.busy=})")
    rec.judge("worker.vllm_config", lambda: isinstance_of(worker.vllm_config, "vllm.config", "VllmConfig"))
    rec.judge("worker.model_runner", lambda: _runner_ok(runner))
    rec.judge("runner.class", lambda: _runner_class(worker, runner))
    rec.judge("config.sizes", lambda: _sizes(worker.vllm_config.model_config.hf_text_config, expect))
    rec.judge("config.sites", lambda: same(worker.vllm_config.additional_config[CONFIG]["sites"], expect["sites"]))
    rec.judge("runner.num_blocks", lambda: None if int(runner.kv_cache_config.num_blocks) > 0 else "not positive")
    rec.judge("runner.aux_flag", lambda: None if runner.use_aux_hidden_state_outputs is True else "not set")
    rec.judge("model.eagle3", lambda: _eagle3(runner.get_model(), worker._tpc_ids))
    rec.judge("registry", _registry)
    rec.judge("apply_after_execute", lambda: _order(rec.events))
    rec.judge("rows", lambda: _rows(rec))
    rec.judge("sched.num_computed", lambda: _computed(rec, int(worker.vllm_config.cache_config.block_size)))
    rec.judge("sched.finished", lambda: _finished(rec))
    rec.judge("params.eos", lambda: None if rec.eos and all(e is not None for e in rec.eos.values()) else f"{rec.eos}")
    version = _runner_version(runner)
    out: dict[str, Problem] = {}
    for key in WORKER_CHECKS:
        if key[:3] in ("v1.", "v2.") and key[:2] != version:
            out[key] = (SKIPPED, f"Model Runner V{key[1]} only; this engine runs {version.upper()}")
        elif key == "sched.num_computed" and not expect["prefix_caching"]:
            out[key] = (SKIPPED, "prefix caching is off in this engine")
        elif key not in rec.seen:
            out[key] = (CHANGED, "never read: no pass reached it")
        else:
            out[key] = rec.problems.get(key, (OK, ""))
    return {"findings": out, "ids": {rid: p[:1] for rid, p in rec.prompts.items()}, "keys": dict(rec.keys)}


def run(what: str, worker: Any, stop: Any, *args: Any) -> Any:
    """What the worker's remote call ``tpc_hooks_contract(what, *args)`` runs (``stop``: the class
    of its logits processor, which ``install`` records)."""
    if what == "install":
        return install(worker, stop, *args)
    calls: dict[str, Callable[..., Any]] = dict(
        check=check_runtime, uninstall=uninstall, fail=fail, rank=rank_of, plain=plain
    )
    return calls[what](worker, *args)


def isinstance_of(obj: Any, module: str, name: str) -> str | None:
    import importlib

    cls = getattr(importlib.import_module(module), name)
    return None if isinstance(obj, cls) else f"{type(obj).__name__}, not {name}"


def _runner_ok(runner: Any) -> str | None:
    try:
        _engine.check_runner(runner)
    except TPCHooksError as err:
        return str(err)
    return None


def _runner_class(worker: Any, runner: Any) -> str | None:
    want = "v2" if worker.vllm_config.use_v2_model_runner else "v1"
    got = _runner_version(runner)
    return None if got == want else f"{type(runner).__name__} is Model Runner {got}; vLLM's config says {want}"


def _sizes(hf: Any, expect: dict[str, Any]) -> str | None:
    got = (hf.num_hidden_layers, hf.hidden_size)
    return same(got, (expect["layers"], expect["d_model"]))


def same(got: Any, want: Any) -> str | None:
    return None if got == want else f"{got!r}, expected {want!r}"


def _eagle3(model: Any, ids: list[int]) -> str | None:
    if not hasattr(model, "set_aux_hidden_state_layers"):
        model = model.get_language_model()
    inner = getattr(model, "model", model)
    return same(tuple(inner.aux_hidden_state_layers), tuple(ids))


def _registry() -> str | None:
    from vllm import ModelRegistry

    from tpc_hooks.adapters.vllm._worker.models import CLASSES

    wrong = [a for a, cls in CLASSES.items() if ModelRegistry.models[a].model_cls is not cls]
    return f"the worker's registry builds vLLM's own {wrong}" if wrong else None


def _order(events: list[tuple]) -> str | None:
    """Each ``apply`` directly follows its step's ``execute_model``, on the same thread."""
    if not any(e[0] == "apply" for e in events):
        return "apply never ran"
    for k, (what, step, _, thread) in enumerate(events):
        before = events[k - 1] if k else None
        if what == "apply" and (before is None or before[0] != "exec" or before[1] != step or before[3] != thread):
            return f"apply of step {step} (thread {thread}) after {before}"
        if what == "exec" and k + 1 < len(events) and events[k + 1][0] != "apply":
            return f"step {step}'s execute_model had no apply before {events[k + 1]}"
    return None


def _rows(rec: Recorder) -> str | None:
    """One logits row per request of the pass, in the pass's order: each request was fed its own
    forced token, never another's."""
    for k, (what, step, rows, _) in enumerate(rec.events):
        if what == "apply" and rows != rec.events[k - 1][2]:
            return f"step {step}: {rows} logits rows for {rec.events[k - 1][2]} requests"
    forced = {rid: p[0] for rid, p in rec.prompts.items() if p}
    for rid, parts in rec.fed.items():
        n = len(rec.prompts.get(rid, ()))
        for pos, toks in parts:
            for off, t in enumerate(toks):
                if pos + off >= n and t != forced.get(rid) and t in forced.values():
                    return f"{rid} was fed {t}, another request's token (its own: {forced[rid]})"
    return None


def _computed(rec: Recorder, block: int) -> str | None:
    """A prompt seen before starts at its cached full blocks; a new one at 0."""
    seen: list[list[int]] = []
    repeats = 0
    for rid, prompt in rec.prompts.items():
        want = (len(prompt) - 1) // block * block if prompt in seen else 0
        repeats += prompt in seen
        if rec.computed[rid] != want:
            return f"{rid} started at {rec.computed[rid]} computed tokens, expected {want}"
        seen.append(prompt)
    return None if repeats else "no prompt came twice"


def _finished(rec: Recorder) -> str | None:
    """Each finished request was scheduled, and is reported on a later step than its last one."""
    if not rec.finished:
        return "no request reported finished"
    for rid, step in rec.finished.items():
        if rid not in rec.last or step <= rec.last[rid]:
            return f"{rid} reported finished at step {step}, last scheduled at {rec.last.get(rid)}"
    return None


class ContractChecks:
    """vLLM's ``worker_extension_cls`` for an engine under the contract's live checks: vLLM adds this
    class to the worker's bases in the worker's process (where it imports it by name), so the remote
    call below reaches the recorder there."""

    def tpc_hooks_contract(self, what: str, *args: Any) -> Any:
        """``"install"`` a recorder on this worker's passes and the logits processor, ``"check"``
        what it saw, ``"uninstall"`` it; and probes of how vLLM runs a remote call (``"fail"``,
        ``"rank"``, ``"plain"``)."""
        from tpc_hooks.adapters.vllm._worker.worker import TPCHooksStop

        if getattr(self, "_tpc_off", False):
            raise TPCHooksError(OFF)
        return run(what, self, TPCHooksStop, *args)
