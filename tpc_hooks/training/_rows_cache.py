"""``train_monitor``'s ``rows_cache``: each text's pooled row per site, kept under how it was read, so
that a later call given the same dict runs the model only on the texts no earlier call read the same way."""

from collections.abc import Callable, MutableMapping
from typing import Any, NamedTuple

import torch

from ..sae import sae_identity
from ._train_request import Request


class Reading(NamedTuple):
    """How a pooled row was read: the half of a ``rows_cache`` key that is not the text."""

    model: int  # id() of the model object
    model_name: str
    d_model: int
    site: str
    pooling: str
    chat_template: bool
    prepend_bos: bool
    max_tokens: int | None
    sae: str | None  # the SAE's weights' SHA-256


class RowsCache:
    """``train_monitor``'s ``rows_cache``: each text's pooled row per site, keyed by
    ``(reading, text)``; :meth:`collect` runs the model only on the texts it lacks."""

    def __init__(self, rows: MutableMapping[Any, Any], r: Request, model: Any):
        self.rows = rows
        sae, max_tokens = r.options.sae, r.options.max_tokens
        sae_id = None if sae is None else sae_identity(sae)["weights_sha256"]
        adapter = r.adapter
        self.reading = {
            s: Reading(
                id(model),
                adapter.model_name,
                adapter.d_model,
                s,
                r.pooling,
                r.chat_template,
                r.bos,
                max_tokens,
                sae_id,
            )
            for s in r.sites
        }

    def collect(
        self, texts: list[str], sites: list[str], read: Callable[[list[str]], dict[str, torch.Tensor]]
    ) -> dict[str, torch.Tensor]:
        """``read(texts)`` (``{site: [n, d]}``) for the texts not in the cache at every site, each
        text read once; then every text's rows from the cache, in order."""
        key = self.reading
        missing = list(dict.fromkeys(t for t in texts for s in sites if (key[s], t) not in self.rows))
        if missing:
            got = read(missing)
            self.rows.update({(key[s], t): got[s][i] for s in sites for i, t in enumerate(missing)})
        return {s: torch.stack([self.rows[key[s], t] for t in texts]) for s in sites}
