"""``train_monitor``'s ``rows_cache``: each text's pooled row per site, kept under how it was read, so
that a later call given the same dict runs the model only on the texts no earlier call read the same way."""

from collections.abc import Callable, MutableMapping, Sequence
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
    ``(reading, text)``; :meth:`fill` runs the model only on the texts it lacks, :meth:`picker`
    reads rows back."""

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

    def fill(self, texts: list[str], sites: list[str], read: Callable[[list[str]], dict[str, torch.Tensor]]) -> None:
        """``read(texts)`` (``{site: [n, d]}``) for the texts not in the cache at every site, each text read once."""
        key = self.reading
        missing = list(dict.fromkeys(t for t in texts for s in sites if (key[s], t) not in self.rows))
        if missing:
            got = read(missing)
            self.rows.update({(key[s], t): got[s][i] for s in sites for i, t in enumerate(missing)})

    def picker(self, texts: list[str], site: str) -> Callable[[Sequence[Any]], torch.Tensor]:
        """A function from positions in ``texts`` to their rows at ``site`` ``[len(at), d]``, stacked from
        the cache's entries for each call (only the rows asked for are copied, never every text's at once)."""
        key, rows = self.reading[site], self.rows

        def pick(at: Sequence[Any]) -> torch.Tensor:
            if not len(at):
                return rows[key, texts[0]].new_empty((0, *rows[key, texts[0]].shape))
            return torch.stack([rows[key, texts[int(i)]] for i in at])

        return pick
