"""What the verbs load: a model by name or the packaged one, and a saved or the pretrained monitor."""

import argparse
from typing import Any

from .._errors import TPCHooksError
from ..monitoring import Monitor
from ..offline import load_model, load_monitor
from ._checks import check_monitor_dir


def load_named(name: str | None, toolkit: str) -> Any:
    """The packaged model, or the one ``name`` names, for a toolkit; a model that cannot be read is one
    clear line (a missing path is left to the verbs' path errors)."""
    try:
        return load_model(name, toolkit)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
        raise
    except OSError as err:  # transformers: not a folder it can read, not on the hub, or no network
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise TPCHooksError(
            f"the model {name} could not be loaded ({first}); expected a local model folder or a hub "
            "model id reachable from here; check the name and the network"
        ) from None


def saved_or_pretrained(args: argparse.Namespace) -> Monitor:
    """``--monitor DIR``, or without it the pretrained monitor of the packaged ``--model``."""
    if args.monitor is None:
        return load_monitor(args.model)
    check_monitor_dir(args.monitor)
    return Monitor.from_pretrained(args.monitor)
