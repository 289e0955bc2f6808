"""The vLLM adapter: a ``vllm.LLM`` built with :func:`vllm_engine_args` is a model that
``tpc.collect``, ``monitor.score``, ``monitor.calibrate`` and ``monitor.generate`` accept.

The engine runs the passes and does the batching, compiled as vLLM decides; its workers
(``tpc_hooks.adapters.vllm._worker.worker``) read each request's residual stream from extra outputs of
the compiled forward at the sites fixed when the engine was built. To collect, the rows come
back to this process once per call (those requests skip reading the prefix cache: collection
returns every prompt token's row); to generate, the monitor itself runs in the worker (sent as a
saved directory, loaded there), scores every request each step, and ends a stopped request
through a logits processor in the step it is flagged; the steps come back once, at the end.
Monitored requests read the prefix cache: the worker resumes a request from the monitor state
kept for its cached blocks. Site names are TransformerLens hook names as in every adapter:
``blocks.L.hook_resid_post`` and ``hook_resid_pre``.

Imported only when a ``vllm.LLM`` is passed in.
"""

import importlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from ..._errors import TPCHooksError
from ...activations import Adapter, Site
from ...monitoring import ACTIONS, STOPPING
from ._server import server as server
from ._wire import (
    ANSWER_START,
    OPT_OUT,
    RPC_ARM_SET,
    RPC_CAPTURE,
    RPC_DISARM,
    RPC_RELEASE,
    RPC_RUNS,
    RPC_SITES,
    RPC_TAKE,
    STOP,
    WORKER,
    ServedMonitor,
    holder,
    ident,
    keyed,
    unexposed,
    unpack,
    worker_error,
)
from ._wire import vllm_engine_args as vllm_engine_args

__all__ = ["VLLMAdapter", "make_adapter"]


class VLLMAdapter(Adapter):
    toolkit = "vLLM"
    kinds = ("post", "pre")
    engine = True

    def __init__(self, model: Any):
        super().__init__(model)
        config = model.llm_engine.vllm_config
        if not is_ours(config.parallel_config.worker_cls):
            raise TPCHooksError(
                "this vllm.LLM was built without tpc-hooks' worker; build it with "
                "LLM(model=..., **tpc_hooks.adapters.vllm_engine_args(), ...)"
            )
        self.stops = STOP in [
            p if isinstance(p, str) else f"{p.__module__}:{p.__qualname__}"
            for p in config.model_config.logits_processors or []
        ]
        self._hf_config = config.model_config.hf_text_config
        self._sites: dict[str, int] | None = None
        self.holder = holder(config)  # collective_rpc's answer from the worker that holds the monitors

    @property
    def d_model(self) -> int:
        return int(self._hf_config.hidden_size)

    @property
    def n_layers(self) -> int:
        return int(self._hf_config.num_hidden_layers)

    @property
    def exposed(self) -> dict[str, int]:
        """The sites the engine's compiled forward returns (fixed when it was built)."""
        if self._sites is None:
            try:
                self._sites = self.model.collective_rpc(RPC_SITES)[self.holder]
            except Exception as err:  # vLLM re-raises a worker's error as a bare Exception
                raise TPCHooksError(worker_error(err)) from None  # e.g. tpc-hooks turned off (TPC_HOOKS_DISABLE)
        return self._sites

    def site(self, name: str) -> Site:
        site = super().site(name)
        if site.name not in self.exposed:
            raise TPCHooksError(unexposed([site.name], self.exposed))
        return site

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

        prompts = [row[m.bool()].tolist() for row, m in zip(input_ids.cpu(), attention_mask.cpu(), strict=True)]
        keys = _keys(len(prompts))
        llm = self.model
        llm.collective_rpc(RPC_CAPTURE, args=([s.name for s in sites],))
        try:
            llm.generate(
                [{"prompt_token_ids": p} for p in prompts],
                [
                    SamplingParams(
                        max_tokens=1, temperature=0, skip_reading_prefix_cache=True, extra_args=keyed(None, k)
                    )
                    for k in keys
                ],
                use_tqdm=False,
            )
            got = llm.collective_rpc(RPC_TAKE)[self.holder]  # the rank the stream of every stage reaches
        finally:
            llm.collective_rpc(RPC_RELEASE)
        B, T = attention_mask.shape
        result = {}
        for s in sites:
            per = got.get(s.name, {})
            out = torch.zeros(B, T, self.d_model)
            for b, (key, p) in enumerate(zip(keys, prompts, strict=True)):
                rows = per.get(ident(key))
                if rows is None:
                    raise TPCHooksError(f"the vLLM workers recorded nothing at {s.name} for prompt {b}")
                out[b, attention_mask[b].bool().cpu()] = unpack(rows)[: len(p)]
            result[s.name] = out
        return result

    def answer(self, ids: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy answers through the engine, each request opted out of any armed monitor (an
        answer written to be studied is not a request to act on)."""
        from vllm import SamplingParams

        outs = self.model.generate(
            [{"prompt_token_ids": p} for p in ids],
            SamplingParams(max_tokens=max_new_tokens, temperature=0, extra_args={OPT_OUT: False}),
            use_tqdm=False,
        )
        return [list(o.outputs[0].token_ids) for o in outs]

    def decode(self, *args: Any, **kwargs: Any) -> None:
        raise TPCHooksError("a vLLM engine drives its own decode loop (monitor.generate runs through it)")

    def generate(
        self,
        monitor: Any,
        ids: list[list[int]],
        max_new_tokens: int,
        action: Any,
        *,
        order: int | None,
        cascade: float | None,
        do_sample: bool,
        temperature: float,
        seed: int,
        stop_at_eos: bool,
    ) -> dict:
        """:meth:`Monitor.generate` through the engine (see the module docstring), also for a
        :class:`~tpc_hooks.MonitorSet` (``action``: as its ``generate`` takes it); returns each
        row's generated ``tokens`` and, per monitor name (a lone monitor: ``""``), each row's
        :class:`~tpc_hooks.GenerationRun` fields.

        Each request asks for ``max_new_tokens + 1`` tokens: the pass that samples the last one
        scores the token before it, and the extra token is dropped (the Hugging Face loop's last
        pass, fed only to be scored). A request that ends on its EOS before that never feeds
        the EOS back, so its last step is scored by one more pass over the whole sequence,
        for those requests only. A stopped request's forced EOS is dropped too. Requests read the
        prefix cache; one whose cached prefix has no kept monitor state (cached while no monitor
        ran) is generated again without reading the cache, so every step is scored.
        """
        from vllm import SamplingParams

        llm = self.model
        members = monitor._members(action)  # a lone monitor: one, named ""
        names = [name for name, _, _ in members]
        if not stop_at_eos and any(act in STOPPING for _, _, act in members):
            raise TPCHooksError(
                "on vLLM a stopped request ends with its EOS token, so action='stop' needs stop_at_eos=True"
            )
        with self.monitoring(monitor, action, order=order, cascade=cascade):

            def params(n: int, b: int, key: str, cached: bool = True, answer_start: int | None = None) -> Any:
                extra = keyed(None, key)  # each request's steps come back under this key
                if answer_start is not None:  # a sequence sent whole: its answer starts there
                    extra[ANSWER_START] = answer_start
                return SamplingParams(
                    max_tokens=n,
                    temperature=temperature if do_sample else 0.0,
                    seed=seed + b if do_sample else None,
                    ignore_eos=not stop_at_eos,
                    skip_reading_prefix_cache=not cached,
                    extra_args=extra,
                )

            def take(keys: list[str]) -> dict[str, list[dict | None]]:
                """Each member's steps of the requests keyed ``keys``, in their order."""
                out = {}
                for n in names:
                    got = llm.collective_rpc(RPC_RUNS, args=([ident(k) for k in keys], n))[self.holder]
                    out[n] = [got.get(ident(k)) for k in keys]
                return out

            keys = _keys(len(ids))
            outs = llm.generate(
                [{"prompt_token_ids": p} for p in ids],
                [params(max_new_tokens + 1, b, k) for b, k in enumerate(keys)],
                use_tqdm=False,
            )
            runs = take(keys)
            redo = [b for b in range(len(ids)) if any("error" in (runs[n][b] or {}) for n in names)]
            if redo:  # their cached prefix had no kept state: computed again, every token through the monitor
                keys2 = _keys(len(redo))
                again_outs = llm.generate(
                    [{"prompt_token_ids": ids[b]} for b in redo],
                    [params(max_new_tokens + 1, b, k, cached=False) for b, k in zip(redo, keys2, strict=True)],
                    use_tqdm=False,
                )
                more = take(keys2)
                for j, (b, o) in enumerate(zip(redo, again_outs, strict=True)):
                    outs[b] = o
                    for n in names:
                        runs[n][b] = more[n][j] or {"error": "nothing recorded"}
            tokens: list[list[int]] = []
            rows: dict[str, list[dict]] = {n: [] for n in names}
            again: list[int] = []  # rows whose last token (an EOS) was never fed back
            for b, o in enumerate(outs):
                got: list[dict] = []
                for n in names:
                    run = runs[n][b]
                    if run is None or "error" in run:
                        why = "nothing" if run is None else run["error"]
                        raise TPCHooksError(f"the vLLM workers did not score prompt {b}: {why}")
                    got.append(run)
                made = list(o.outputs[0].token_ids)
                steps = len(got[0]["probs"])
                stops = [r["stopped_at"] for r in got if r["stopped_at"] is not None]
                if stops:
                    made = made[: min(stops)]  # the forced EOS goes
                elif len(made) > max_new_tokens:
                    made = made[:max_new_tokens]  # the extra token goes
                elif steps == len(made):
                    again.append(b)
                tokens.append(made)
                for n, run in zip(names, got, strict=True):
                    rows[n].append(run)
            if again:  # the last step of rows that ended on EOS: one pass over each whole sequence
                keys3 = _keys(len(again))
                llm.generate(
                    [{"prompt_token_ids": ids[b] + tokens[b]} for b in again],
                    [params(1, 0, k, answer_start=len(ids[b])) for b, k in zip(again, keys3, strict=True)],
                    use_tqdm=False,
                )
                more = take(keys3)
                for j, b in enumerate(again):
                    for n in names:
                        last = more[n][j]
                        if last is None or "error" in last:
                            raise TPCHooksError(f"the vLLM workers did not score the last step of prompt {b}")
                        for k in ("logits", "probs", "decision_logits", "exit_order", "flops"):
                            rows[n][b][k] = rows[n][b][k] + last[k][:1]
        return {"tokens": tokens, "runs": rows}

    @contextmanager
    def monitoring(
        self,
        monitor: Any,
        action: Any = "flag",
        *,
        order: int | None = None,
        cascade: float | None = None,
        keep: str = "steps",
    ) -> Iterator[dict]:
        """Inside the block the engine's workers score every request with ``monitor`` (each
        step, at its site) and, with ``action="stop"``, end a request at its first flagged
        step; the block yields what the workers run (site, threshold, d_model). The steps are
        kept per request until ``llm.collective_rpc("tpc_hooks_runs")[adapter.holder]`` takes them (the
        answer of the worker that holds the monitors: 0 on one pipeline stage; a request goes
        by its engine id there, or by the key ``extra_args={"tpc_hooks_key": KEY}`` gives it, as
        ``"KEY/0"``). Requests
        read the prefix cache: the workers keep the monitor's state at every block's end and
        resume a request from the state of its cached prefix. A request whose cached prefix has
        no kept state (cached while this monitor was not running) is not scored, and its entry
        says so (``"error"``): send it again with ``skip_reading_prefix_cache=True``.

        A :class:`~tpc_hooks.MonitorSet` runs every member on each pass, each with its own
        policy and action (``action``: None for the set's, one for all, or a dict by name); the
        block yields what each runs by name (with its ``action``), and
        ``llm.collective_rpc("tpc_hooks_runs", args=(None, name))[adapter.holder]`` takes a member's steps.

        Example (the engine as :func:`vllm_engine_args` builds it)::

            adapter = get_adapter(llm)
            with adapter.monitoring(monitor):
                outs = llm.generate(prompts, SamplingParams(max_tokens=64))
                steps = llm.collective_rpc("tpc_hooks_runs")[adapter.holder]
        """
        members = monitor._members(action)  # a lone monitor: one, named ""
        lone = members[0][0] == ""
        if not lone and (order is not None or cascade is not None):
            raise TPCHooksError("a MonitorSet scores each member with its own policy: set order/cascade on the member")
        if lone and action not in ACTIONS:
            raise TPCHooksError(f"action must be 'flag' or 'stop'; got {action!r}")
        for name, mon, act in members:
            self._check_member(name, mon, act)
        llm = self.model
        specs = [ServedMonitor.of(name, mon, act, order, cascade).plain() for name, mon, act in members]
        try:
            info = llm.collective_rpc(RPC_ARM_SET, args=(specs, keep))[self.holder]
        except Exception as err:  # vLLM re-raises a worker's error as a bare Exception
            raise TPCHooksError(f"the vLLM workers could not run this monitor: {worker_error(err)}") from None
        for name, _, act in members:
            info[name]["action"] = act
        try:
            yield info[""] if lone else info
        finally:
            llm.collective_rpc(RPC_DISARM)

    def _check_member(self, name: str, monitor: Any, action: str) -> None:
        who = f"monitor {name!r}" if name else "monitor"
        if action in STOPPING and not self.stops:
            raise TPCHooksError(
                "action='stop' needs tpc-hooks' logits processor in this vllm.LLM; build it with "
                "LLM(model=..., **tpc_hooks.adapters.vllm_engine_args(), ...)"
            )
        if monitor.sae is not None:
            raise TPCHooksError(
                f"{who} reads SAE latents, which do not run in vLLM's workers yet (they would need the "
                "SAE); score its prompts with monitor.score(llm, prompts)"
            )
        if monitor.head.d_model != self.d_model:
            raise TPCHooksError(
                f"{who} expects d_model={monitor.head.d_model} at {monitor.site!r} but the model "
                f"produces {self.d_model}; was it trained on another model ({monitor.model_name or 'unknown'})?"
            )
        self.site(monitor.site)

    def observe(self, *args: Any, **kwargs: Any) -> Any:
        raise TPCHooksError("watch() and the Hugging Face generate hooks do not apply to a vLLM engine")


def is_ours(worker: Any) -> bool:
    """Whether the engine's worker is tpc-hooks' (or a class built on it)."""
    if not worker:
        return False
    if worker == WORKER:
        return True
    try:
        module, _, name = str(worker).rpartition(".")
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return any(f"{c.__module__}.{c.__qualname__}" == WORKER for c in getattr(cls, "__mro__", ()))


def _keys(n: int) -> list[str]:
    """Keys of tpc-hooks' own for ``n`` requests (``extra_args``), unique to this call: the workers
    hand back each request's steps or rows under its key."""
    call = uuid.uuid4().hex[:16]
    return [f"{call}:{b}" for b in range(n)]


def make_adapter(model: Any) -> VLLMAdapter:
    return VLLMAdapter(model)
