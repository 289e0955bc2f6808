"""A monitor's saved form: the ``config.json`` it writes beside its head's tensors, and what a saved
config is read back into (checked: a file that describes something else, or is malformed, is an error that
names it). :class:`~tpc_hooks.Monitor` reads and writes through these; the format is ``tpc_hooks.saving``'s.
"""

from pathlib import Path
from typing import Any

from .._errors import TPCHooksError
from ..head import TPC, Cascade, from_saved, to_saved
from ..saving import READS_ANSWER_VERSION
from ._monitor_config import MonitorConfig


def saved_config(monitor: Any) -> dict[str, Any]:
    """The ``config.json`` of ``monitor``: its head's, with the monitor's settings, model, cascade, report
    and SAE identity under ``"monitor"``."""
    cfg, _ = to_saved(monitor.head)
    settings = monitor.config.to_dict()
    name = settings.pop("model_name")
    cfg["monitor"] = {
        **settings,
        "model": {"name": name, "d_model": monitor.head.d_model},
        "cascade": None if monitor.cascade is None else monitor.cascade.to_dict(),
        "report": monitor.report,
        "sae": monitor.sae_identity,
    }
    if monitor.answers:  # a version that reads only prompt monitors refuses the file instead of misreading it
        cfg["format_version"] = READS_ANSWER_VERSION
    return cfg


def read_saved(cfg: dict[str, Any], tensors: dict[str, Any], where: Path) -> tuple[TPC, dict[str, Any]]:
    """A saved monitor's head and the rest of what makes it (``config``, ``cascade``, ``report``,
    ``sae_identity``: the monitor's keyword arguments), from its config and tensors; ``where``: the config
    file errors name."""
    head = from_saved(cfg, tensors, where)
    mon = cfg.get("monitor")
    if not isinstance(mon, dict):
        raise TPCHooksError(
            f"{where} describes a bare head, not a monitor; load it with TPC.from_pretrained and wrap it: "
            "Monitor(head, site=...)"
        )
    model = mon.get("model") or {}
    if not isinstance(model, dict):
        raise TPCHooksError(f'{where}: monitor.model must be an object {{"name", "d_model"}}; got {model!r}')
    if model.get("d_model", head.d_model) != head.d_model:
        raise TPCHooksError(
            f"{where}: monitor.model.d_model={model.get('d_model')} disagrees with d_model={head.d_model}"
        )
    try:
        config = MonitorConfig.from_dict({**mon, "model_name": model.get("name")})
    except TPCHooksError as err:
        raise TPCHooksError(f"{where}: monitor: {err}") from None
    cascade = None
    if mon.get("cascade") is not None:
        if not isinstance(mon["cascade"], dict):
            raise TPCHooksError(
                f"{where}: monitor.cascade must be an object (lower, upper, temperatures, biases) "
                f"or null; got {type(mon['cascade']).__name__}"
            )
        try:
            cascade = Cascade.from_dict(head, mon["cascade"])
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise TPCHooksError(f"{where}: monitor.cascade is malformed ({err})") from None
    if mon.get("sae") is not None and not isinstance(mon["sae"], dict):
        raise TPCHooksError(
            f"{where}: monitor.sae must be an object (the SAE's identity) or null; got {type(mon['sae']).__name__}"
        )
    report = mon.get("report") or {}
    if not isinstance(report, dict):
        raise TPCHooksError(f"{where}: monitor.report must be an object; got {type(report).__name__}")
    return head, {"config": config, "cascade": cascade, "report": dict(report), "sae_identity": mon.get("sae")}
