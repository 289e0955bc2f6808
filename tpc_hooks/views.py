"""Views of tpc-hooks results for people who would rather look than read.

* :func:`plot_sweep`: a cascade's F1 against its compute (matplotlib);
* :func:`colored_tokens`: per-token values (e.g. :meth:`tpc_hooks.Monitor.token_scores`)
  coloured with circuitsvis.

:meth:`tpc_hooks.Attribution.plot` draws an attribution (by order and the top pairs).
"""

from collections.abc import Sequence
from typing import Any

from ._errors import TPCHooksError

__all__ = ["plot_sweep", "colored_tokens"]


def plot_sweep(rows: Sequence[dict[str, Any]], ax: Any = None, label: str = "TPC cascade"):
    """F1 against relative FLOPs for the rows of :meth:`Cascade.sweep` (needs matplotlib)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    xs = [r["relative_flops"] for r in rows]
    ax.plot(xs, [r["f1"] for r in rows], marker="o", label=label)
    for r in rows:
        ax.annotate(f"τ={r['tau']:g}", (r["relative_flops"], r["f1"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("mean FLOPs / linear probe FLOPs")
    ax.set_ylabel("F1")
    ax.grid(alpha=0.3)
    ax.legend()
    return ax


def colored_tokens(tokens: list[str], values: Any):
    """circuitsvis's token colouring of per-token values (e.g. :meth:`Monitor.token_scores`).

    Needs ``circuitsvis`` (``pip install circuitsvis``); returns its renderable object.
    """
    try:
        from circuitsvis.tokens import colored_tokens as _colored
    except ImportError:
        raise TPCHooksError("colored_tokens needs circuitsvis: pip install circuitsvis") from None
    return _colored(tokens=list(tokens), values=[float(v) for v in values])
