"""An SAELens SAE read from its folder with the labels tpc-hooks saves beside it (the review
log's ``--review-log-sae`` and :func:`tpc_hooks.offline.load_sae`). Imports SAELens when called."""

import json
from pathlib import Path
from typing import Any

from .._errors import TPCHooksError


def read_sae(path: str | Path) -> Any:
    """An SAELens SAE saved in ``path`` (``SAE.load_from_disk``), with the ``feature_labels``,
    ``feature_examples`` and ``reconstruction`` its folder holds (``labels.json``, ``report.json``:
    what :func:`tpc_hooks.offline.load_sae` writes) as plain attributes."""
    try:
        from sae_lens import SAE
    except ImportError as err:
        raise TPCHooksError(f"reading an SAE needs SAELens ({err}): pip install sae-lens") from None
    path = Path(path)
    if not (path / "cfg.json").exists():
        raise TPCHooksError(f"{path} holds no SAE (an SAELens folder with cfg.json and the weights)")
    sae = SAE.load_from_disk(path)
    examples = json.loads((path / "labels.json").read_text()) if (path / "labels.json").exists() else {}
    sae.feature_examples = examples
    sae.feature_labels = {int(i): v["label"] for i, v in examples.items()}
    sae.reconstruction = json.loads((path / "report.json").read_text()) if (path / "report.json").exists() else None
    return sae
