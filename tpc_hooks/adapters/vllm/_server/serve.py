"""``tpc-hooks serve``: vLLM's OpenAI-compatible server with a monitor, or several, on every request.

The engine is built with tpc-hooks' worker and logits processor
(:func:`~tpc_hooks.adapters.vllm_engine_args`, exposing the monitors' sites), compiled and run as
vLLM decides; once it is up, the monitors are loaded in its workers (``keep="summary"``), which
score every request at every step and end a request in the step a stopping monitor flags it.
An ASGI middleware (:class:`MonitorMiddleware`) asks the workers for a request's summaries when
its response finishes and writes them into the response (the ``tpc_hooks`` field of each
choice: one monitor's decision, or each named monitor's by name; a stopped choice's
``finish_reason`` is ``"content_flagged"``, or ``"content_flagged:NAME"`` naming the monitor
that stopped it), counts them in ``/metrics`` (labelled by monitor), and names the monitors in
``/v1/models``.

``--monitor DIR`` runs one monitor (its action: ``--action``); ``--monitor NAME=DIR[:ACTION]``,
repeated, runs several at once, each read once per pass.

Per request, through vLLM's ``vllm_xargs``: ``{"tpc_hooks_monitor": false}`` opts out,
``{"tpc_hooks_threshold": 0.9}`` sets its own threshold; ``tpc_hooks_monitor.NAME`` and
``tpc_hooks_threshold.NAME`` do the same for one named monitor. Monitored requests read the prefix cache
(the workers resume each from the monitor state kept for its cached blocks); with a KV connector
(an offload tier, whose blocks no monitor saw) they skip reading it.

Which monitors run and the admin route that swaps them: ``_server.monitors``; what ``/metrics``
counts: ``_server.metrics``. Imported by ``tpc-hooks serve`` only (it imports vLLM).
"""

import argparse
import asyncio
import contextvars
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ...._errors import TPCHooksError
from ....monitoring import ACTIONS, monitor_specs
from ..._sae_lens import read_sae
from .. import _review, is_ours
from .._engine import aux_ids
from .._wire import (
    CONFIG,
    OPT_OUT,
    RPC_ARM_SET,
    RPC_REVIEW,
    RPC_SET_SUMMARIES,
    STOP,
    WORKER,
    completion_prompt,
    disabled,
    holder,
    ident,
    keyed,
    worker_error,
)
from .metrics import LONE, REVIEWED, count
from .monitors import ADMIN, ServerState, admin, of_app, served

FIELD = "tpc_hooks"  # each choice's monitor summary
FLAGGED = "content_flagged"  # the finish_reason of a stopped choice
_ROUTES = ("/v1/completions", "/v1/chat/completions")


class MonitorMiddleware:
    """Writes each finished choice's monitor summaries into the response (streamed or not)."""

    @staticmethod
    def _view(state: ServerState, per: dict[str, Any]) -> Any:
        """A lone monitor's value as is; named monitors' by name."""
        return per.get("") if list(state.monitors) == [""] else per

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = of_app(scope)
        if scope["path"] == "/v1/models" and scope["method"] == "GET":
            return await self._buffered(scope, receive, send, lambda payload: self._models(state, payload))
        if scope["path"].startswith(ADMIN) and state.admin_key:
            return await admin(scope, receive, send)
        if scope["path"] not in _ROUTES or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        entry = Entry(state, completions=scope["path"] == "/v1/completions")
        token = _ENTRY.set(entry)  # the engine requests this HTTP request makes are keyed in it (the rebound generate)
        body = bytearray()

        async def reading() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        engine = scope["app"].state.engine_client

        async def annotate(payload: dict) -> dict:
            """Adds the summary of every finished choice (those with a finish_reason)."""
            ended = [c for c in payload.get("choices") or [] if c.get("finish_reason") is not None]
            if not ended:
                return payload
            got = await entry.summaries([int(c.get("index", 0)) for c in ended], engine)
            for c, per in zip(ended, got, strict=True):
                _review.record(state.review, payload.get("id", ""), int(c.get("index", 0)), time.time(), per)
                c[FIELD] = self._view(state, {name: _field(per.get(name)) for name in state.monitors})
                stops = [
                    (s["stopped_at"], k, name)
                    for k, (name, s) in enumerate(per.items())
                    if s and s.get("stopped_at") is not None
                ]
                if stops:
                    by = min(stops)[2]
                    c["finish_reason"] = f"{FLAGGED}:{by}" if by else FLAGGED
                for name in state.monitors:
                    s = per.get(name)
                    count(s, name or LONE, state.rates)
                    if s and s.get("nonfinite_step") is not None:
                        payload.setdefault("error", _nonfinite_error(s))
            return payload

        streaming: dict[str, Any] = {"on": False, "start": None}
        pending = bytearray()
        chunks = bytearray()

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = dict((k.lower(), v) for k, v in message.get("headers", []))
                streaming["on"] = headers.get(b"content-type", b"").startswith(b"text/event-stream")
                if streaming["on"]:
                    return await send(message)
                streaming["start"] = message
                return None
            if message["type"] != "http.response.body":
                return await send(message)
            if streaming["on"]:  # server-sent events: rewrite the ones that finish a choice
                pending.extend(message.get("body", b""))
                out = bytearray()
                while b"\n\n" in pending:
                    event, _, rest = bytes(pending).partition(b"\n\n")
                    pending[:] = rest
                    out.extend(await _event(event, annotate) + b"\n\n")
                if not message.get("more_body", False) and pending:
                    out.extend(bytes(pending))
                    pending.clear()
                return await send({**message, "body": bytes(out)})
            chunks.extend(message.get("body", b""))
            if message.get("more_body", False):
                return None
            start = streaming["start"]
            data = bytes(chunks)
            if start["status"] == 200:
                try:
                    payload = await annotate(json.loads(data))
                    if "error" in payload:  # NaN/inf activations: the whole response is an error
                        start = {**start, "status": 500}
                        payload = {"error": payload["error"]}
                    data = json.dumps(payload).encode()
                except json.JSONDecodeError:
                    pass
            kept = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": kept + [(b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data, "more_body": False})

        try:
            await self.app(scope, reading, sending)
        finally:
            _ENTRY.reset(token)

    def _models(self, state: ServerState, payload: dict) -> dict:
        payload[FIELD] = self._view(state, state.monitors)
        for model in payload.get("data") or []:
            model[FIELD] = self._view(state, state.monitors)
        return payload

    async def _buffered(self, scope: dict, receive: Any, send: Any, edit: Any) -> None:
        held: dict[str, Any] = {}
        chunks = bytearray()

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                held["start"] = message
                return None
            if message["type"] != "http.response.body":
                return await send(message)
            chunks.extend(message.get("body", b""))
            if message.get("more_body", False):
                return None
            data = bytes(chunks)
            try:
                data = json.dumps(edit(json.loads(data))).encode()
            except (json.JSONDecodeError, AttributeError):
                pass
            headers = [(k, v) for k, v in held["start"].get("headers", []) if k.lower() != b"content-length"]
            await send({**held["start"], "headers": headers + [(b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data, "more_body": False})

        await self.app(scope, receive, sending)


async def _event(event: bytes, annotate: Any) -> bytes:
    if not event.startswith(b"data: ") or event == b"data: [DONE]":
        return event
    try:
        payload = json.loads(event[6:])
    except json.JSONDecodeError:
        return event
    if not isinstance(payload, dict) or not any(
        c.get("finish_reason") is not None for c in payload.get("choices") or []
    ):
        return event
    payload = await annotate(payload)
    error = payload.pop("error", None)
    out = b"data: " + json.dumps(payload).encode()
    if error is not None:
        out += b"\n\ndata: " + json.dumps({"error": error}).encode()
    return out


class Entry:
    """One HTTP request to a generating route, shared by the middleware and the engine's rebound
    ``generate`` (through the request's context): the key of ours each of its engine requests
    carries (``extra_args``), by prompt, with the samples it asks for (its ``n``), and the
    summaries of its choices once the workers handed them over."""

    def __init__(self, state: ServerState, completions: bool):
        self.state, self.completions = state, completions  # a completions request: one engine request per prompt
        self.prompts: dict[int, tuple[str, int]] = {}  # prompt -> (key, n)
        self.unread: list[str] = []  # engine ids of prompts whose index vLLM's id did not give

    def key(self, request_id: str, n: int) -> str:
        """The key of the engine request ``request_id`` (the OpenAI layer's id for it) this
        HTTP request makes, asking for ``n`` samples."""
        key = uuid.uuid4().hex
        try:
            prompt = completion_prompt(request_id) if self.completions else 0
        except TPCHooksError:
            self.unread.append(request_id)  # its choices say so
            return key
        self.prompts[prompt] = (key, n)
        return key

    def ident(self, choice: int) -> str | None:
        """How the workers name the engine request behind choice ``choice`` (prompt ``i``'s
        sample ``k`` is choice ``i * n + k``), or None if it is not known."""
        if not self.prompts:
            return None
        n = next(iter(self.prompts.values()))[1]
        prompt, k = divmod(choice, max(n, 1))
        return ident(self.prompts[prompt][0], k) if prompt in self.prompts else None

    async def summaries(self, choices: list[int], engine: Any) -> list[dict[str, dict]]:
        """The workers' summaries of these finished choices, each by monitor name."""
        idents = [self.ident(c) for c in choices]
        got = await self.state.asks.ask(engine, [i for i in idents if i is not None])
        why = f"vLLM ran a prompt as {self.unread[0]!r}, whose index tpc-hooks could not read" if self.unread else None
        return [
            got.get(i, {}) if i is not None else dict.fromkeys(self.state.monitors, {"error": why or "not keyed"})
            for i in idents
        ]


_ENTRY: contextvars.ContextVar[Entry | None] = contextvars.ContextVar("tpc_hooks_entry", default=None)


class _Asks:
    """One RPC to the workers at a time, for every response that finished while the previous
    one was out: under load the engine answers one summary call per step or so, not one per
    response (each call waits for the engine's loop between two steps)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[list[str], asyncio.Future]] = []
        self.busy = False

    async def ask(self, engine: Any, idents: list[str]) -> dict[str, dict[str, dict]]:
        """The summaries of the finished requests ``idents``: by ident, then monitor name."""
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append((idents, fut))
        if not self.busy:
            self.busy = True
            try:
                while self.waiting:
                    batch, self.waiting = self.waiting, []
                    try:
                        wanted = [i for ids, _ in batch for i in ids]
                        answers = await engine.collective_rpc(RPC_SET_SUMMARIES, args=(wanted,))
                        got = answers[holder(engine.vllm_config)]  # the worker that holds the monitors
                    except Exception as err:  # every waiting response learns it
                        for _, f in batch:
                            f.set_exception(err)
                        continue
                    for ids, f in batch:  # ident -> monitor name -> summary
                        f.set_result({i: {name: s[i] for name, s in got.items() if i in s} for i in ids})
            finally:
                self.busy = False
        return await fut


def _field(s: dict | None) -> dict[str, Any]:
    """One choice's ``tpc_hooks`` field."""
    if s is None:
        return {"monitored": False}
    if "error" in s:
        return {"monitored": False, "error": s["error"]}
    return {
        "monitored": True,
        "flagged": s["flagged"],
        "stopped": s["stopped_at"] is not None,
        "flagged_at_token": s["first_flagged"],
        "peak_score": s["peak_score"],
        "threshold": s["threshold"],
        "steps": s["steps"],
    }


def _nonfinite_error(s: dict) -> dict[str, Any]:
    return {
        "message": f"the monitor's site held NaN/inf activations for this request from step {s['nonfinite_step']} "
        "(after that many generated tokens); it was stopped there and has no score. The server goes on "
        "serving other requests",
        "type": "MonitorNonFiniteActivations",
        "code": 500,
    }


def _entering(engine: Any, state: ServerState, skip_cache: bool) -> None:
    """Rebinds the engine's ``generate``, where every request of the OpenAI layer enters: each gets
    a key of ours in its ``extra_args`` (and the monitors' names, which its settings may address),
    kept in its HTTP request's :class:`Entry`. With ``skip_cache`` (a KV connector: blocks restored
    from an offload tier have no monitor state) monitored requests skip reading the prefix cache."""
    inner = engine.generate

    def generate(prompt: Any, sampling_params: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
        if hasattr(sampling_params, "extra_args"):  # a generating request (SamplingParams)
            entry = _ENTRY.get()
            n = int(getattr(sampling_params, "n", 1) or 1)
            key = entry.key(request_id, n) if entry is not None else uuid.uuid4().hex
            extra = keyed(sampling_params.extra_args, key, n, names=list(state.monitors))
            sampling_params.extra_args = extra
            if skip_cache and extra.get(OPT_OUT, True) not in (False, 0):
                sampling_params.skip_reading_prefix_cache = True
        return inner(prompt, sampling_params, request_id, *args, **kwargs)

    engine.generate = generate


def server_arguments() -> tuple[Any, Any]:
    """vLLM's server options: its parser's builder and their check (``make_arg_parser``,
    ``validate_parsed_serve_args``), in ``vllm.entrypoints.common.cli_args`` since vLLM 0.33 and in
    ``vllm.entrypoints.launchers.cli_args`` in 0.32."""
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    return make_arg_parser, validate_parsed_serve_args


def parse(argv: list[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    """tpc-hooks' own options, then vLLM's server arguments (everything else is passed to it)."""
    p = argparse.ArgumentParser(
        prog="tpc-hooks serve",
        description="vLLM's OpenAI-compatible server with a monitor "
        "on every request; every option not listed here is vLLM's",
    )
    p.add_argument("model", help="the model to serve (a hub id or local folder), as for `vllm serve`")
    p.add_argument(
        "--monitor",
        required=True,
        action="append",
        metavar="[NAME=]DIR[:stop|flag]",
        help="a monitor directory (Monitor.save / tpc-hooks train); repeat it as NAME=DIR[:stop|flag] to "
        "run several monitors at once, each with its own action",
    )
    p.add_argument(
        "--action",
        choices=ACTIONS,
        default="stop",
        help="the action of monitors given without one. stop: end a request in the step it is flagged "
        "(default); flag: record only",
    )
    p.add_argument(
        "--drift-window",
        type=int,
        default=1000,
        metavar="N",
        help="the rolling flag rate (gauge tpc_hooks_flag_rate{window=recent}) covers the last N scored "
        "requests (default 1000)",
    )
    p.add_argument(
        "--drift-band",
        type=float,
        default=2.0,
        metavar="F",
        help="log a warning when the rolling flag rate leaves [target / F, target * F], the target being "
        "the rate the monitor was calibrated to (default 2)",
    )
    p.add_argument(
        "--admin-api-key",
        default=None,
        metavar="KEY",
        help=f"turns on {ADMIN}NAME: PUT loads a monitor directory on the server's disk in place of NAME "
        "(or adds it), DELETE removes it, without a restart; requests carry Authorization: Bearer KEY",
    )
    p.add_argument(
        "--sites",
        nargs="+",
        default=[],
        metavar="SITE",
        help="more sites for the engine to expose, for monitors swapped in later (it compiles with the "
        "sites it will ever read)",
    )
    _review.arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    ours, rest = p.parse_known_args(argv)
    if not 0 <= ours.review_log_sample <= 1 or ours.review_log_max_mb <= 0:
        raise TPCHooksError("--review-log-sample must be in [0, 1] and --review-log-max-mb positive")
    state = ServerState(
        admin_key=ours.admin_api_key, action=ours.action, drift_window=ours.drift_window, drift_band=ours.drift_band
    )
    state.asks = _Asks()
    state.review.saes = {_review.sae_site(s, d): s for d, s in ((d, read_sae(d)) for d in ours.review_log_sae)}
    for name, where, act in monitor_specs(ours.monitor, ours.action):
        state.served[name], ident = served(name, where, act, state.review.monitors)
        state.monitors[name] = {**ident, "action": act}
    ours.sites = state.sites = sorted({m["site"] for m in state.monitors.values()} | set(ours.sites))
    state.d_model = next(iter(state.monitors.values()))["d_model"]
    for name, monitor in state.monitors.items():
        state.labels(name, monitor["target_fpr"])
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    make_arg_parser, validate_parsed_serve_args = server_arguments()
    vp = make_arg_parser(FlexibleArgumentParser(prog="tpc-hooks serve"))
    args = vp.parse_args(["--model", ours.model, "--host", ours.host, "--port", str(ours.port), *rest])
    if args.worker_cls not in (None, "auto") and not is_ours(args.worker_cls):
        raise TPCHooksError(f"--worker-cls must be tpc-hooks' own ({WORKER}) or a class built on it")
    args.worker_cls = WORKER if args.worker_cls in (None, "auto") else args.worker_cls
    extra = dict(args.additional_config or {})
    extra[CONFIG] = {"sites": ours.sites}  # the sites the compiled forward returns
    args.additional_config = extra
    args.logits_processors = [STOP, *(args.logits_processors or [])]
    args.middleware = [*(args.middleware or []), f"{__name__}.MonitorMiddleware"]
    validate_parsed_serve_args(args)
    args.tpc_hooks = state  # the app keeps the server's arguments (app.state.args): it owns the state with them
    return ours, args


def check_model(
    monitors: dict[str, dict[str, Any]], model: str, trust_remote_code: bool = False, sites: Sequence[str] = ()
) -> None:
    """Each monitor's site and d_model, and the other ``sites`` to expose, against the model's
    config (read, not loaded)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    cfg = getattr(cfg, "text_config", None) or cfg
    aux_ids(
        list(sites) or [m["site"] for m in monitors.values()], cfg.num_hidden_layers
    )  # sites vLLM's forward can return
    for name, monitor in monitors.items():
        aux_ids([monitor["site"]], cfg.num_hidden_layers)  # a site vLLM's forward can return for this model
        if monitor["d_model"] != cfg.hidden_size:
            who = f"monitor {name!r}" if name else "monitor"
            raise TPCHooksError(
                f"{who} expects d_model={monitor['d_model']} but {model} produces {cfg.hidden_size}; "
                "was it trained on another model?"
            )


async def run(ours: argparse.Namespace, args: argparse.Namespace) -> None:
    """Starts the engine, loads the monitor in its workers, serves until stopped."""
    from vllm.entrypoints.launchers.api_server.entry import build_and_serve, build_async_engine_client
    from vllm.entrypoints.launchers.launcher import setup_server

    state: ServerState = args.tpc_hooks
    review = state.review
    listen_address, sock = setup_server(args, reuse_port=False)
    try:
        async with build_async_engine_client(args) as engine:
            specs = [spec.plain() for spec in state.served.values()]
            try:
                await engine.collective_rpc(RPC_ARM_SET, args=(specs, "summary"))
            except Exception as err:  # vLLM re-raises a worker's error as a bare Exception
                raise TPCHooksError(f"the vLLM workers could not run this monitor: {worker_error(err)}") from None
            _entering(engine, state, skip_cache=bool(getattr(args, "kv_transfer_config", None)))
            if ours.review_log:
                await engine.collective_rpc(RPC_REVIEW, args=(ours.review_log_sample, ours.review_log_text))
                review.decode = engine.get_tokenizer().decode if ours.review_log_text else None
                review.log = _review.ReviewLog(
                    ours.review_log,
                    max_bytes=int(ours.review_log_max_mb * 2**20),
                    on_count=lambda outcome: REVIEWED.labels(outcome).inc(),
                    prepare=lambda e: _review.explain_entry(e, review.monitors, saes=review.saes),
                )
            shutdown = await build_and_serve(engine, listen_address, sock, args)
        await shutdown
    finally:
        sock.close()
        if review.log is not None:
            review.log.close()  # writes what is queued


def main(argv: list[str]) -> int:
    import uvloop

    if disabled():
        raise TPCHooksError(
            "tpc-hooks serve runs a monitor on every request, and TPC_HOOKS_DISABLE=1 turns tpc-hooks off: it "
            "refuses to serve unmonitored. Unset TPC_HOOKS_DISABLE, or serve without monitors with `vllm serve`"
        )
    # a bad directory, or a monitor for another model, fails here, before the engine starts
    ours, args = parse(argv)
    check_model(args.tpc_hooks.monitors, args.model, getattr(args, "trust_remote_code", False), ours.sites)
    uvloop.run(run(ours, args))
    return 0
