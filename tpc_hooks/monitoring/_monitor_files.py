"""How a monitor is kept: its ``config.json`` (the head's, plus the settings, cascade, report and
SAE identity) and weights, read back strictly (never unpickled), and its model card; sharing on the
Hub comes from :class:`~tpc_hooks.saving._hub.HubMixin`."""

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import TPCHooksError
from ..head import TPC, Cascade, from_saved, to_saved
from ..saving import CONFIG_FILE, HubMixin, files_of, monitor_card, read_dir, write_dir
from ._monitor_config import MonitorConfig


class MonitorFiles(HubMixin):
    """:class:`~tpc_hooks.Monitor`'s saved form: ``save_pretrained`` / ``from_pretrained`` /
    ``push_to_hub`` (from :class:`~tpc_hooks.saving._hub.HubMixin`) write and read it.

    The class it is mixed into sets ``head``, ``config``, ``cascade``, ``report`` and
    ``sae_identity``, and is built as ``cls(head, config=, cascade=, report=, sae=, sae_identity=)``."""

    head: TPC
    config: MonitorConfig
    cascade: Cascade | None
    report: dict[str, Any]
    sae_identity: dict[str, Any] | None

    if TYPE_CHECKING:

        def __init__(
            self,
            head: TPC,
            *,
            config: MonitorConfig,
            cascade: Cascade | None,
            report: dict[str, Any],
            sae: Any,
            sae_identity: dict[str, Any] | None,
        ) -> None: ...

    _hub_commit_message = "Upload tpc-hooks monitor"

    def _config(self) -> dict[str, Any]:
        cfg, _ = to_saved(self.head)
        settings = self.config.to_dict()
        name = settings.pop("model_name")
        cfg["monitor"] = {
            **settings,
            "model": {"name": name, "d_model": self.head.d_model},
            "cascade": None if self.cascade is None else self.cascade.to_dict(),
            "report": self.report,
            "sae": self.sae_identity,
        }
        return cfg

    def _save_dir(self, path: str | os.PathLike) -> Path:
        """Writes head and policy to a directory (``config.json`` + ``model.safetensors``);
        :meth:`save_pretrained` adds the model card."""
        return write_dir(path, self._config(), to_saved(self.head)[1])

    def model_card(self, *, repo_id: str | None = None) -> str:
        """The model card :meth:`save_pretrained` writes (``README.md``): model, site, pooling,
        threshold, cascade, the head, and the training data and metrics ``report`` records.
        ``save_pretrained``, ``from_pretrained`` (``sae=`` for a monitor on SAE latents) and
        ``push_to_hub`` come from :class:`~tpc_hooks.saving._hub.HubMixin`."""
        return monitor_card(self, repo_id=repo_id)

    @classmethod
    def _load_dir(cls, path: str | os.PathLike, *, sae: Any = None) -> Any:
        """Loads a monitor saved by :meth:`save_pretrained` (strict; never unpickles).

        A monitor trained on SAE latents needs its SAE again (``sae=``); a different one is refused.
        """
        return cls._from_saved(*read_dir(path), Path(path) / CONFIG_FILE, sae=sae)

    @classmethod
    def _from_saved(cls, cfg: dict[str, Any], tensors: dict[str, Any], where: Path, *, sae: Any = None) -> Any:
        """A monitor from its saved config and tensors (``where``: the config file errors name)."""
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
        try:
            return cls(head, config=config, cascade=cascade, report=dict(report), sae=sae, sae_identity=mon.get("sae"))
        except (TypeError, ValueError) as err:  # TPCHooksError is a ValueError
            raise TPCHooksError(f"{where}: {err}") from None


def saved_files(monitor: MonitorFiles) -> tuple[bytes, bytes]:
    """The bytes of the monitor's ``config.json`` and ``model.safetensors``, as ``save_pretrained``
    writes them, without touching the disk."""
    return files_of(monitor._config(), to_saved(monitor.head)[1])
