"""The site grammar: TransformerLens hook names of the residual stream, parsed into :class:`Site`."""

import re
from dataclasses import dataclass

from ..head._errors import TPCHooksError

_SITE = re.compile(r"^blocks\.(\d+)\.hook_resid_(pre|mid|post)$")


@dataclass(frozen=True)
class Site:
    """A residual-stream site: ``blocks.{layer}.hook_resid_{kind}``."""

    layer: int
    kind: str  # "pre" | "mid" | "post"

    @property
    def name(self) -> str:
        return f"blocks.{self.layer}.hook_resid_{self.kind}"


def parse_site(name: str) -> Site:
    """Parses a TransformerLens hook name of the residual stream.

    Example:
        >>> parse_site("blocks.6.hook_resid_post")
        Site(layer=6, kind='post')
    """
    m = _SITE.match(name) if isinstance(name, str) else None
    if not m:
        raise TPCHooksError(
            f"unknown site {name!r}; sites are TransformerLens hook names of the residual stream, "
            "e.g. 'blocks.6.hook_resid_post' (also hook_resid_pre, hook_resid_mid)"
        )
    return Site(int(m.group(1)), m.group(2))
