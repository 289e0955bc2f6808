"""Which monitors ``tpc-hooks serve`` runs (:data:`MONITORS`: by name, what each is and does),
read from ``--monitor`` and checked when loaded, and changing them under load: the admin route
(``PUT`` / ``DELETE`` ``/tpc_hooks/monitors/NAME``) swaps one in the workers between two engine
steps."""

import asyncio
import hashlib
import hmac
import json
import re
from pathlib import Path
from typing import Any

from .._errors import TPCHooksError
from ..adapters._vllm_args import RPC_SWAP, worker_error
from ..monitoring._monitor import Monitor
from ..saving import _format
from . import _review
from ._serve_metrics import LONE, labels, log

MONITORS: dict[str, dict[str, Any]] = {}  # name ("" alone) -> identity() and action, set before the server starts
ADMIN = "/tpc_hooks/monitors/"  # PUT/DELETE ADMIN + name: replace, add or remove a monitor (--admin-api-key)
ADMIN_KEY: dict[str, Any] = {"key": None, "sites": [], "d_model": None, "action": "stop"}  # set before serving
_SWAP = asyncio.Lock()  # one replacement at a time
_NAME = re.compile(r"^([A-Za-z0-9_-]+)=(.+)$")


def identity(path: str | Path) -> dict[str, Any]:
    """What ``/v1/models`` says of the monitor: site, threshold, pooling, cascade or not, and the
    SHA-256 of its saved files. Loads it (a missing, corrupt or tampered directory raises) and keeps
    it by that hash, for the review log to explain the steps of whichever version scored them."""
    mon = Monitor.from_pretrained(path)
    digest = hashlib.sha256()
    for name in (_format.CONFIG_FILE, _format.WEIGHTS_FILE):
        digest.update((Path(path) / name).read_bytes())
    target = (mon.report or {}).get("operating_point", {}).get("fpr")
    _review.SERVER["monitors"][digest.hexdigest()] = mon  # the review log explains its steps with it
    return {
        "site": mon.site,
        "threshold": float(mon.threshold),
        "pooling": mon.pooling,
        "cascade": mon.cascade is not None,
        "degree": mon.head.degree,
        "d_model": mon.head.d_model,
        "target_fpr": None if target is None else float(target),
        "sha256": digest.hexdigest(),
    }


def members(specs: list[str], action: str) -> list[tuple[str, str, str]]:
    """``--monitor`` values -> ``(name, directory, action)``: ``DIR`` alone (name ``""``, the
    action ``action``), or each ``NAME=DIR[:ACTION]``.

    Example:
        >>> members(["harm=/m/harm:stop", "pii=/m/pii"], "flag")
        [('harm', '/m/harm', 'stop'), ('pii', '/m/pii', 'flag')]
    """
    out = []
    for spec in specs:
        m = _NAME.match(spec)
        name, rest = (m.group(1), m.group(2)) if m else ("", spec)
        where, colon, act = rest.rpartition(":")
        if colon and act in ("flag", "stop"):
            rest = where
        else:
            act = action
        out.append((name, rest, act))
    names = [n for n, _, _ in out]
    if len(out) > 1 and "" in names:
        raise TPCHooksError(
            "several monitors need a name each: --monitor NAME=DIR[:stop|flag] (e.g. "
            "--monitor harm=./harm:stop --monitor pii=./pii:flag)"
        )
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TPCHooksError(f"--monitor names must differ; {dup} given twice")
    return out


async def admin(scope: dict, receive: Any, send: Any) -> None:
    """``PUT /tpc_hooks/monitors/NAME`` with ``{"path": DIR, "action": "stop"|"flag"}`` loads the
    monitor saved in ``DIR`` (on the server's disk) and puts it in place of ``NAME`` (or adds it)
    between two engine steps; ``DELETE`` removes ``NAME``. Requests in flight finish on the monitor
    they started with; the prefix cache is emptied (its blocks hold no state of the new monitor),
    so running requests recompute once. Needs ``Authorization: Bearer KEY`` (``--admin-api-key``).
    A bad directory is refused with the reason (HTTP 400) and the old monitor keeps serving."""
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
    if not hmac.compare_digest(given, ADMIN_KEY["key"].encode()):
        return await answer(401, {"error": "the admin routes need Authorization: Bearer <--admin-api-key>"})
    name, method = scope["path"][len(ADMIN) :], scope["method"]
    if method not in ("PUT", "DELETE"):
        return await answer(405, {"error": f"{ADMIN}NAME takes PUT (load a monitor) or DELETE (remove it)"})
    monitors = MONITORS
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
            action = req.get("action", monitors.get(name, {}).get("action", ADMIN_KEY["action"]))
            if action not in ("stop", "flag"):
                raise TPCHooksError(f"action must be 'stop' or 'flag'; got {action!r}")
            ident = identity(req["path"])
            if ident["site"] not in ADMIN_KEY["sites"]:
                raise TPCHooksError(
                    f"this engine exposes {ADMIN_KEY['sites']}, not {ident['site']!r}; start the "
                    "server with --sites to be able to swap in monitors at other sites"
                )
            if ident["d_model"] != ADMIN_KEY["d_model"]:
                raise TPCHooksError(
                    f"the monitor expects d_model={ident['d_model']} but the model produces "
                    f"{ADMIN_KEY['d_model']}; was it trained on another model?"
                )
            spec = {
                "name": name,
                "path": str(Path(req["path"]).resolve()),
                "site": ident["site"],
                "order": None,
                "cascade": None,
                "action": action,
                "sha256": ident["sha256"],
            }
        elif name not in monitors:
            raise TPCHooksError(f"no monitor named {name!r} runs here (it runs {sorted(monitors)})")
        engine = scope["app"].state.engine_client
        async with _SWAP:
            await engine.pause_generation(mode="keep", clear_cache=False)  # no step runs until the swap is whole
            try:
                await engine.collective_rpc(RPC_SWAP, args=(name, spec))
                await engine.reset_prefix_cache(reset_running_requests=True)
            except Exception as err:  # vLLM re-raises a worker's error as a bare Exception
                raise TPCHooksError(worker_error(err)) from None
            finally:
                await engine.resume_generation()
    except (TPCHooksError, ValueError) as err:
        return await answer(400, {"error": str(err)})
    if spec is None:
        monitors.pop(name)  # requests name the monitors MONITORS holds (the server's entry stamps them)
        return await answer(200, {"removed": name})  # (never the lone monitor: the workers refuse to remove the last)
    monitors[name] = {**ident, "action": spec["action"]}
    labels(name, ident["target_fpr"])
    log.warning("monitor %s now %s (sha256 %s)", name, req["path"], ident["sha256"][:12])
    return await answer(200, {"monitor": name or LONE, **monitors[name]})
