"""What ``tpc-hooks serve`` keeps in its process, in one object the app owns (:class:`ServerState`):
which monitors it runs (by name, what each is and does), read from ``--monitor`` and checked when
loaded, and changing them under load: the admin route (``PUT`` / ``DELETE``
``/tpc_hooks/monitors/NAME``) swaps one in the workers between two engine steps."""

import asyncio
import hmac
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...._errors import TPCHooksError
from ....monitoring import ACTIONS
from .. import _review
from .._wire import RPC_SWAP, ServedMonitor, worker_error
from .drift import FlagRate
from .metrics import LONE, labels, log

ADMIN = "/tpc_hooks/monitors/"  # PUT/DELETE ADMIN + name: replace, add or remove a monitor (--admin-api-key)


@dataclass
class ServerState:
    """Everything ``tpc-hooks serve`` keeps in its process, in one object the app owns (vLLM keeps the
    server's arguments as ``app.state.args``; this is their ``tpc_hooks``): the monitors it runs, by
    name ("" alone: what :func:`served` says of it, and its action) and each as the workers run it
    (``served``); what the admin route may swap in (its key, the sites
    the engine exposes, the model's width, the action of a monitor given none); the drift gauges'
    window, band and flag rates (by metrics label); the review log; the batching of summary calls
    (``asks``, set by the server); and one admin swap at a time (``swap``)."""

    monitors: dict[str, dict[str, Any]] = field(default_factory=dict)
    served: dict[str, ServedMonitor] = field(default_factory=dict)
    admin_key: str | None = None
    sites: list[str] = field(default_factory=list)
    d_model: int | None = None
    action: str = "stop"
    drift_window: int = 1000
    drift_band: float = 2.0
    rates: dict[str, FlagRate] = field(default_factory=dict)
    review: _review.ServerReview = field(default_factory=_review.ServerReview)
    asks: Any = None
    swap: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __repr__(self) -> str:  # vLLM logs the server's arguments, this among them
        return f"ServerState(monitors={sorted(self.monitors)})"

    def labels(self, name: str, target: float | None) -> None:
        """A monitor's metric series, at zero, and its flag rates."""
        labels(name, target, self.rates, self.drift_window, self.drift_band)


def of_app(scope: dict) -> ServerState:
    """The server's state, from the app serving ``scope``."""
    state: ServerState = scope["app"].state.args.tpc_hooks
    return state


def served(
    name: str, path: str | Path, action: str, known: dict[str, Any] | None = None
) -> tuple[ServedMonitor, dict[str, Any]]:
    """The monitor saved in ``path`` as the workers will run it (``ServedMonitor.read``: loaded
    and hashed once; a missing, corrupt or tampered directory raises), and what ``/v1/models``
    says of it: site, threshold, pooling, cascade or not, and the SHA-256 of its saved files. Keeps
    the monitor in ``known`` by that hash (a server's review log explains the steps of whichever
    version scored them with it)."""
    spec, mon = ServedMonitor.read(name, path, action)
    target = (mon.report or {}).get("operating_point", {}).get("fpr")
    if known is not None:
        known[spec.sha256] = mon
    return spec, {
        "site": mon.site,
        "threshold": float(mon.threshold),
        "pooling": mon.pooling,
        "cascade": mon.cascade is not None,
        "degree": mon.head.degree,
        "d_model": mon.head.d_model,
        "target_fpr": None if target is None else float(target),
        "sha256": spec.sha256,
    }


async def admin(scope: dict, receive: Any, send: Any) -> None:
    """``PUT /tpc_hooks/monitors/NAME`` with ``{"path": DIR, "action": "stop"|"flag"}`` loads the
    monitor saved in ``DIR`` (on the server's disk) and puts it in place of ``NAME`` (or adds it)
    between two engine steps; ``DELETE`` removes ``NAME``. Requests in flight finish on the monitor
    they started with; the prefix cache is emptied (its blocks hold no state of the new monitor),
    so running requests recompute once. Needs ``Authorization: Bearer KEY`` (``--admin-api-key``).
    A bad directory is refused with the reason (HTTP 400) and the old monitor keeps serving."""
    state = of_app(scope)
    body = bytearray()
    while True:
        message = await receive()
        body.extend(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            break

    async def answer(status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": data})

    headers = dict((k.lower(), v) for k, v in scope.get("headers", []))
    given = headers.get(b"authorization", b"").removeprefix(b"Bearer ")
    assert state.admin_key is not None  # the middleware routes here only with --admin-api-key
    if not hmac.compare_digest(given, state.admin_key.encode()):
        return await answer(401, {"error": "the admin routes need Authorization: Bearer <--admin-api-key>"})
    name, method = scope["path"][len(ADMIN) :], scope["method"]
    if method not in ("PUT", "DELETE"):
        return await answer(405, {"error": f"{ADMIN}NAME takes PUT (load a monitor) or DELETE (remove it)"})
    monitors = state.monitors
    try:
        if list(monitors) == [""]:  # a lone unnamed monitor is addressed as "default", and stays alone
            if name != LONE:
                raise TPCHooksError(
                    f"this server runs one unnamed monitor: replace it at {ADMIN}{LONE}; to run several, "
                    "start it with --monitor NAME=DIR for each"
                )
            name = ""
        elif not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise TPCHooksError(f"{name!r} is not a monitor name (letters, digits, '_' and '-')")
        spec = None
        if method == "PUT":
            req = json.loads(bytes(body) or b"{}")
            if not isinstance(req, dict) or not isinstance(req.get("path"), str):
                raise TPCHooksError(
                    'the body must be {"path": "<monitor directory on the server>", "action": "stop" | "flag"}'
                )
            action = req.get("action", monitors.get(name, {}).get("action", state.action))
            if action not in ACTIONS:
                raise TPCHooksError(f"action must be one of {list(ACTIONS)}; got {action!r}")
            spec, ident = served(name, req["path"], action, state.review.monitors)
            if ident["site"] not in state.sites:
                raise TPCHooksError(
                    f"this engine exposes {state.sites}, not {ident['site']!r}; start the "
                    "server with --sites to be able to swap in monitors at other sites"
                )
            if ident["d_model"] != state.d_model:
                raise TPCHooksError(
                    f"the monitor expects d_model={ident['d_model']} but the model produces "
                    f"{state.d_model}; was it trained on another model?"
                )
        elif name not in monitors:
            raise TPCHooksError(f"no monitor named {name!r} runs here (it runs {sorted(monitors)})")
        engine = scope["app"].state.engine_client
        async with state.swap:
            await engine.pause_generation(mode="keep", clear_cache=False)  # no step runs until the swap is whole
            try:
                await engine.collective_rpc(RPC_SWAP, args=(name, None if spec is None else spec.plain()))
                await engine.reset_prefix_cache(reset_running_requests=True)
            except Exception as err:  # vLLM re-raises a worker's error as a bare Exception
                raise TPCHooksError(worker_error(err)) from None
            finally:
                await engine.resume_generation()
    except (TPCHooksError, ValueError) as err:
        return await answer(400, {"error": str(err)})
    if spec is None:
        monitors.pop(name)  # requests may name the monitors this holds (the server's entry stamps them)
        state.served.pop(name)
        return await answer(200, {"removed": name})  # (never the lone monitor: the workers refuse to remove the last)
    monitors[name], state.served[name] = {**ident, "action": action}, spec
    state.labels(name, ident["target_fpr"])
    log.warning("monitor %s now %s (sha256 %s)", name, req["path"], ident["sha256"][:12])
    return await answer(200, {"monitor": name or LONE, **monitors[name]})
