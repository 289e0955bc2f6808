"""The site grammar: TransformerLens hook names of a block, parsed into :class:`Site`.

Five sites per block, in the order a block computes them: the residual stream entering it
(``hook_resid_pre``), what attention adds to it (``hook_attn_out``), the residual stream
between attention and MLP (``hook_resid_mid`` = pre + attn_out), what the MLP adds
(``hook_mlp_out``) and the residual stream leaving the block (``hook_resid_post`` = mid +
mlp_out).
"""

import re
from dataclasses import dataclass

from .._errors import TPCHooksError

KINDS = ("pre", "attn_out", "mid", "mlp_out", "post")  # within a block, in the order it computes them
RESIDUAL = ("pre", "mid", "post")
_SITE = re.compile(r"^blocks\.(\d+)\.hook_(resid_pre|resid_mid|resid_post|attn_out|mlp_out)$")


def hook_name(kind: str) -> str:
    """``"mid"`` -> ``"hook_resid_mid"``, ``"attn_out"`` -> ``"hook_attn_out"``."""
    return f"hook_resid_{kind}" if kind in RESIDUAL else f"hook_{kind}"


@dataclass(frozen=True)
class Site:
    """A site of block ``layer``: ``blocks.{layer}.hook_resid_{pre,mid,post}``,
    ``blocks.{layer}.hook_attn_out`` or ``blocks.{layer}.hook_mlp_out``."""

    layer: int
    kind: str  # one of KINDS

    @property
    def name(self) -> str:
        return f"blocks.{self.layer}.{hook_name(self.kind)}"

    @property
    def depth(self) -> tuple[int, int]:
        """Where the forward pass computes it: sorting by ``depth`` gives execution order.

        Example:
            >>> sorted([parse_site("blocks.1.hook_resid_pre"), parse_site("blocks.0.hook_mlp_out"),
            ...         parse_site("blocks.0.hook_resid_mid")], key=lambda s: s.depth)[0].name
            'blocks.0.hook_resid_mid'
        """
        return self.layer, KINDS.index(self.kind)


def parse_site(name: str) -> Site:
    """Parses a TransformerLens hook name of a block's residual stream or its two branches.

    Example:
        >>> parse_site("blocks.6.hook_resid_post")
        Site(layer=6, kind='post')
        >>> parse_site("blocks.2.hook_attn_out")
        Site(layer=2, kind='attn_out')
    """
    m = _SITE.match(name) if isinstance(name, str) else None
    if not m:
        raise TPCHooksError(
            f"unknown site {name!r}; sites are TransformerLens hook names of a block, e.g. "
            "'blocks.6.hook_resid_post' (also hook_resid_pre, hook_resid_mid, hook_attn_out, hook_mlp_out)"
        )
    kind = m.group(2)
    return Site(int(m.group(1)), kind.removeprefix("resid_"))
