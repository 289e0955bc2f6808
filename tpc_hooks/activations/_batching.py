"""Batching helpers: BOS choice, padding with an attention mask, and position ids from a mask."""

from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError


def resolve_bos(tok: Any, prepend_bos: bool | None, chat_template: bool = False) -> bool:
    """Whether a BOS token is prepended: never with a chat template; by default when the
    tokenizer defines one."""
    if chat_template:
        return False
    if prepend_bos is None:
        return getattr(tok, "bos_token_id", None) is not None
    if prepend_bos and getattr(tok, "bos_token_id", None) is None:
        raise TPCHooksError("prepend_bos=True but this tokenizer has no BOS token")
    return bool(prepend_bos)


def pad_id(tok: Any) -> int:
    """The token id a tokenizer pads with: its ``pad_token_id``, else its ``eos_token_id``, else 0.

    Example:
        >>> from types import SimpleNamespace
        >>> from tpc_hooks.adapters import pad_id
        >>> pad_id(SimpleNamespace(pad_token_id=None, eos_token_id=2))
        2
        >>> pad_id(SimpleNamespace())
        0
    """
    for attr in ("pad_token_id", "eos_token_id"):
        v = getattr(tok, attr, None)
        if v is not None:
            return int(v)
    return 0


def pad(ids: list[list[int]], pad_token: int, side: str) -> tuple[Tensor, Tensor]:
    """Pads token lists to one ``[batch, pos]`` tensor and its attention mask."""
    if side not in ("left", "right"):
        raise TPCHooksError(f"padding_side must be 'left' or 'right'; got {side!r}")
    width = max(len(i) for i in ids)
    out = torch.full((len(ids), width), pad_token, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for b, row in enumerate(ids):
        sl = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        out[b, sl] = torch.tensor(row, dtype=torch.long)
        mask[b, sl] = 1
    return out, mask


def positions(mask: Tensor) -> Tensor:
    """Position ids counted over attended tokens only (left padding starts at 0)."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)
