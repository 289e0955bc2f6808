"""The worker's remote calls (``llm.collective_rpc("tpc_hooks_...")``): record rows at sites,
arm, swap and disarm monitors, hand over their steps, summaries and stats, and turn on the review
log. Imported in vLLM's workers only."""

from collections import OrderedDict
from typing import Any

import torch

from ...._errors import TPCHooksError
from .._wire import OFF, ServedMonitor, pack, unexposed
from .armed import UNSCORED, Armed, Request, WorkerState, rss, summaries_of
from .prefix import BlockStates

STORES = 4  # monitors whose block states a worker keeps (the least recently armed go first)


class Control:
    """tpc-hooks' remote calls on the worker (the first rank of the last pipeline stage holds the monitors
    and the recorded rows, ``holder``; every rank answers).

    The worker it is mixed into (``_worker.worker``) sets the ``_tpc_*`` state when its model is
    loaded; ``model_runner`` is vLLM's."""

    _tpc_sites: dict[str, int]
    _tpc_requests: dict[str, Request]
    _tpc_capture: list[int]
    _tpc_finished_rows: dict[str, dict[int, list[torch.Tensor]]]
    _tpc_counts: dict[str, int]
    _tpc_off: bool
    _tpc_holds: bool
    _tpc: WorkerState
    model_runner: Any

    def _tpc_on(self) -> None:
        """Refuses a call that needs tpc-hooks when the operator turned it off (TPC_HOOKS_DISABLE)."""
        if self._tpc_off:
            raise TPCHooksError(OFF)

    # ------------------------------------------------------------------ recording (collect, score)
    def tpc_hooks_sites(self) -> dict[str, int]:
        """The sites this engine exposes (fixed when it was built) -> their auxiliary ids."""
        self._tpc_on()
        return dict(self._tpc_sites)

    def tpc_hooks_capture(self, sites: list[str]) -> int:
        """Starts recording the rows of every request at ``sites`` (prompt tokens, then one row per
        decode step); returns the model's hidden size."""
        self._tpc_on()
        missing = [s for s in sites if s not in self._tpc_sites]
        if missing:
            raise TPCHooksError(unexposed(missing, self._tpc_sites))
        for req in self._tpc_requests.values():
            req.rows.clear()
        self._tpc_capture = sorted({self._tpc_sites[s] for s in sites})
        return self._tpc_d_model()

    def tpc_hooks_take(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Every recorded request's rows per site, by the name the request goes by (its key and
        sample, else its engine id), each a tensor packed for the trip (``_wire.unpack``);
        clears them."""
        self._tpc_on()
        by_id = {i: s for s, i in self._tpc_sites.items()}
        out: dict[str, dict[str, Any]] = {}
        held = {**{req.ident: req.rows for req in self._tpc_requests.values()}, **self._tpc_finished_rows}
        for rid, rows in held.items():
            for aux_id, parts in rows.items():
                out.setdefault(by_id[aux_id], {})[rid] = pack(torch.cat(parts))
            rows.clear()
        self._tpc_finished_rows = {}
        return out

    def tpc_hooks_release(self) -> bool:
        """Stops recording (safe to call again)."""
        self._tpc_capture = []
        self._tpc_finished_rows = {}
        return True

    # ------------------------------------------------------------------ monitoring (generate, serve)
    def tpc_hooks_arm_set(self, specs: list[dict[str, Any]], keep: str = "steps") -> dict[str, dict]:
        """Scores every request from now on by each monitor of ``specs`` (``_wire.ServedMonitor``, as
        plain values), in place of whatever ran before: every pass is read once and scored by each,
        under its name; ``action="stop"`` ends a request at its first flagged step (a request ends
        when any stopping monitor flags it). ``keep="steps"``: every step of every request, until
        :meth:`tpc_hooks_runs` takes them; ``"summary"`` (a server): a finished request's steps
        become a summary, kept for the last ``KEEP`` requests until :meth:`tpc_hooks_summaries`
        takes it, and a request whose activations turn NaN/inf is stopped whatever the action.
        All are loaded and checked before any replaces what ran. Returns what each runs (site,
        threshold, d_model), by name."""
        self._tpc_on()
        armed = [self._tpc_armed(ServedMonitor.from_plain(spec), keep) for spec in specs]
        self.tpc_hooks_disarm()
        if self._tpc_holds:
            self._tpc.armed.update({a.name: a for a in armed})
        return {a.name: self._tpc_info(a) for a in armed}

    def tpc_hooks_runs(self, requests: list[str] | None = None, member: str = "") -> dict[str, dict[str, Any]]:
        """The recorded steps of ``requests`` (default: all) by the monitor ``member`` (a lone
        monitor: ""), as lists, with the step each was stopped at; forgets them. A request goes
        by tpc-hooks' key for it and its sample (``_wire.ident``), else by its engine id."""
        self._tpc_on()
        armed = self._tpc.armed.get(member)
        if armed is None:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for rid, rec in armed.scores.take(requests).items():
            out[rid] = {k: v.tolist() for k, v in rec.items()}
            out[rid]["stopped_at"] = armed.stopped.pop(rid, None)
            armed.first.pop(rid, None)
        for rid in list(armed.unscored if requests is None else armed.unscored & set(requests)):
            armed.unscored.discard(rid)
            out[rid] = {"error": UNSCORED}
        return out

    def tpc_hooks_summaries(self, idents: list[str], member: str = "") -> dict[str, dict[str, Any]]:
        """The summaries (``keep="summary"``) by the monitor ``member`` of the finished requests
        named ``idents`` (tpc-hooks' key and sample, ``_wire.ident``; the server asks once
        their last token has reached it): steps, peak score, flagged, first flagged step, stopped
        step, the threshold used, the first step that scored NaN; forgets them."""
        self._tpc_on()
        armed = self._tpc.armed.get(member)
        return {} if armed is None else summaries_of(armed, idents, self._tpc_by_ident())

    def _tpc_by_ident(self) -> dict[str, Request]:
        """The requests this worker holds, by the name each goes by."""
        return {req.ident: req for req in self._tpc_requests.values()}

    def tpc_hooks_set_summaries(self, idents: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
        """:meth:`tpc_hooks_summaries` of every monitor this worker runs, by name (one call per
        batch of finished responses, however many monitors), with those of monitors replaced or
        removed while the requests ran."""
        self._tpc_on()
        reqs = self._tpc_by_ident()  # once for every monitor
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for armed in [*self._tpc.armed.values(), *self._tpc.retiring]:
            out.setdefault(armed.name, {}).update(summaries_of(armed, idents, reqs))
        self._tpc.retire_done()
        return out

    def tpc_hooks_swap(self, name: str, spec: dict[str, Any] | None) -> dict[str, Any]:
        """Puts the monitor ``spec`` (a ``_wire.ServedMonitor``, as plain values) in place of the monitor
        ``name`` (new or existing), or removes ``name`` (``spec`` None), between two engine steps.
        The requests the worker holds now finish on the monitor they started with; requests that
        start later get the new one (or none). A monitor that does not load or check is refused
        and nothing changes. Returns what the new monitor runs ({} when removed)."""
        self._tpc_on()
        old = self._tpc.armed.get(name)
        if spec is None and old is None:
            raise TPCHooksError(f"no monitor named {name!r} runs here (it runs {sorted(self._tpc.armed)})")
        if spec is None and len(self._tpc.armed) == 1:
            raise TPCHooksError(f"{name!r} is the only monitor this engine runs; put another in its place instead")
        keep = next(iter(self._tpc.armed.values())).keep if self._tpc.armed else "summary"
        new = None if spec is None else self._tpc_armed(ServedMonitor.from_plain({**spec, "name": name}), keep)
        info = {} if new is None else self._tpc_info(new)
        if not self._tpc_holds:
            return info
        if old is not None:
            old.owns = {req.ident for req in self._tpc_requests.values()}  # in flight: they finish on it
            self._tpc.retiring.append(old)
        if new is not None:
            self._tpc.armed[name] = new
        else:
            del self._tpc.armed[name]
        self._tpc.retire_done()
        return info

    def tpc_hooks_disarm(self) -> bool:
        """Removes every monitor and its state (safe to call again)."""
        self._tpc.clear()
        return True

    def tpc_hooks_review(self, sample: float, text: bool = False) -> bool:
        """Turns on the review of flagged requests and of a ``sample`` of the others (by a hash of
        their id): their summaries carry each monitor's per-step scores and exit orders and its
        input (pooled activations) at the step that flagged them (or the highest one), for the
        server to explain, with their token ids when ``text``, else a hash of them."""
        self._tpc_on()
        self._tpc.review.update(sample=float(sample), text=bool(text))
        for armed in [*self._tpc.armed.values(), *self._tpc.retiring]:
            armed.review(self._tpc.review)
        return True

    def _tpc_armed(self, spec: ServedMonitor, keep: str) -> Armed:
        """The monitor of ``spec``, rebuilt from its bytes and checked against this engine (site
        exposed, width), ready to run."""
        if spec.site not in self._tpc_sites:
            raise TPCHooksError(unexposed([spec.site], self._tpc_sites))
        monitor = spec.load()
        d_model = self._tpc_d_model()
        if monitor.head.d_model != d_model:
            who = f"monitor {spec.name!r}" if spec.name else "monitor"
            raise TPCHooksError(f"{who} expects d_model={monitor.head.d_model} but this model produces {d_model}")
        store = self._tpc_store(spec)
        aux = self._tpc_sites[spec.site]
        return Armed(
            spec.name, monitor, aux, spec.order, spec.cascade, spec.action, keep, store, spec.sha256, self._tpc.review
        )

    def _tpc_info(self, armed: Armed) -> dict[str, Any]:
        """What an armed monitor runs: site, threshold, the model's width."""
        return {"site": armed.monitor.site, "threshold": float(armed.monitor.threshold), "d_model": self._tpc_d_model()}

    def tpc_hooks_stats(self, member: str = "") -> dict[str, float]:
        """What the monitor ``member`` has cost since it was armed: forward passes, seconds (wall
        clock in the worker's reading and scoring, the pass's shared bookkeeping split between
        the monitors; on a GPU, without waiting for the device), rows scored, and what it holds:
        requests with a running state, requests with recorded steps (and how many steps),
        summaries not yet taken, kept block states (and how many the store holds at most), the
        process's resident memory, requests handed to a review log and the seconds that took, and
        since the engine started: requests resumed from a kept block state and requests found
        without one (:meth:`tpc_hooks_counts`)."""
        self._tpc_on()
        armed = self._tpc.armed.get(member)
        if armed is None:
            return {}
        return {
            "passes": armed.passes,
            "seconds": armed.seconds,
            "rows": armed.rows,
            "requests_held": len(armed.scores.states),
            "records_held": len(armed.scores.records),
            "summaries_held": len(armed.summaries),
            "steps_held": sum(map(len, armed.scores.records.values())),
            "block_states": len(armed.blocks),
            "block_capacity": armed.blocks.capacity,
            "rss_bytes": rss(),
            "reviews": armed.reviews,
            "review_seconds": armed.review_seconds,
            **self._tpc_counts,
        }

    def _tpc_store(self, spec: ServedMonitor) -> BlockStates:
        """The block states of this monitor (its saved files, site and policy): kept across arming
        it again, so blocks cached while it last ran stay readable; a few monitors' at most."""
        key = f"{spec.sha256}:{spec.site}:{spec.order}:{spec.cascade}"
        stores = self.__dict__.setdefault("_tpc_stores", OrderedDict())
        if key not in stores:
            # every KV block can hold a state, twice over (a state is touched whenever its block is read)
            kv = getattr(self.model_runner, "kv_cache_config", None)
            stores[key] = BlockStates(2 * int(getattr(kv, "num_blocks", 0) or 4096))
        stores.move_to_end(key)
        while len(stores) > STORES:
            stores.popitem(last=False)
        return stores[key]

    def tpc_hooks_counts(self) -> dict[str, int]:
        """Since the engine started: monitored requests that resumed from the monitor state kept for
        their cached prefix (``resumed``; of them ``resumed_in_pass``: from blocks computed in the same
        pass, by a request scheduled beside them), and those whose cached prefix had none (``unscored``)."""
        self._tpc_on()
        return dict(self._tpc_counts)

    def _tpc_d_model(self) -> int:
        return int(self.model_runner.model_config.get_hidden_size())
