"""What :func:`tpc_hooks.evaluate` measured, as one object (:class:`Evaluation`): its tables as
Markdown or HTML, its curves. The measurement is in :mod:`tpc_hooks.training._outside`."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PROBE = "probe"  # the method names of an Evaluation's tables
DEPLOYED = "monitor, deployed"


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` measured. Shares are fractions in [0, 1].

    Attributes:
        site: the monitor's site; ``probe_site``, ``probe_C``, ``probe_val_auroc``: the probe's
            (the best candidate site and ``C`` by its validation AUROC).
        fpr: the rate: the probe's and each order's threshold flags this share of the everyday
            benign validation prompts (``n_everyday`` of them).
        threshold: the monitor's deployed threshold (a probability); ``deployed_rate``: the share
            of the everyday benign validation prompts it flags.
        sets: per set, its ``label`` (1 harmful: the share flagged is recall; 0 benign: the share
            is over-refusal), ``n`` prompts scored and ``n_seen`` left out because they are
            training, validation or calibration prompts of the monitor.
        shares: per method (``"probe"``, ``"monitor, deployed"``, ``"order 1"``, ...), per set,
            the share flagged.
        curves: per method but the deployed one, per set, ``(rate, share)``: the share of the set
            flagged against the share of the everyday benign validation prompts flagged, as the
            threshold sweeps (scikit-learn's ``roc_curve``).
        kept: the monitor's orders (its head's degree).

    Example:
        >>> ev = tpc.evaluate(model, monitor, train.texts, train.labels)  # doctest: +SKIP
        >>> ev.shares["monitor, deployed"]["past"] - ev.shares["probe"]["past"]  # doctest: +SKIP
        >>> ev.floor_gaps()  # doctest: +SKIP
    """

    site: str
    probe_site: str
    probe_C: float
    probe_val_auroc: float
    fpr: float
    threshold: float
    deployed_rate: float
    n_everyday: int
    kept: int
    sets: dict[str, dict[str, int]]
    shares: dict[str, dict[str, float]]
    curves: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(repr=False)

    @property
    def methods(self) -> list[str]:
        return list(self.shares)

    def floor_gaps(self) -> dict[str, float]:
        """Per harmful set, the deployed monitor's share minus the probe's, in points (the floor:
        not far below 0)."""
        return {
            k: 100 * (self.shares[DEPLOYED][k] - self.shares[PROBE][k]) for k, v in self.sets.items() if v["label"] == 1
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything but the curves, JSON-ready."""
        return {
            "site": self.site,
            "probe": {"site": self.probe_site, "C": self.probe_C, "val_auroc": self.probe_val_auroc},
            "fpr": self.fpr,
            "threshold": self.threshold,
            "deployed_rate": self.deployed_rate,
            "n_everyday": self.n_everyday,
            "kept": self.kept,
            "sets": self.sets,
            "shares": self.shares,
            "floor_gaps": self.floor_gaps(),
        }

    def rows(self) -> list[list[str]]:
        """The summary table as text cells: a header, then one row per method (share flagged, %)."""
        head = [
            "method",
            "threshold",
            *(f"{k} ({'recall' if v['label'] else 'flagged'})" for k, v in self.sets.items()),
        ]
        out = [head]
        for m, by_set in self.shares.items():
            where = f"its own ({self.threshold:.4f})" if m == DEPLOYED else f"{self.fpr:.0%} everyday"
            out.append([m, where, *(f"{100 * by_set[k]:.1f}" for k in self.sets)])
        return out

    def to_markdown(self) -> str:
        """The summary table, the floor's gaps and what was measured on, as Markdown."""
        rows = self.rows()
        lines = ["| " + " | ".join(rows[0]) + " |", "|---|---|" + "---:|" * (len(rows[0]) - 2)]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join([*lines, "", self._caption()])

    def to_html(self) -> str:
        """The same table as a standalone HTML fragment."""
        import html

        rows = self.rows()
        cells = lambda r, tag: "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in r)  # noqa: E731
        body = "".join(f"<tr>{cells(r, 'td')}</tr>" for r in rows[1:])
        return (
            f"<table><thead><tr>{cells(rows[0], 'th')}</tr></thead><tbody>{body}</tbody></table>"
            f"<p>{html.escape(self._caption())}</p>"
        )

    def _caption(self) -> str:
        gaps = ", ".join(f"{k} {v:+.1f}" for k, v in self.floor_gaps().items())
        seen = {k: v["n_seen"] for k, v in self.sets.items() if v["n_seen"]}
        return (
            f"Share flagged, %: the monitor ({self.site}, orders 1-{self.kept}) at its deployed threshold, which "
            f"flags {100 * self.deployed_rate:.1f}% of the {self.n_everyday} everyday benign validation prompts; "
            f"the probe ({self.probe_site}, C={self.probe_C:g}, validation AUROC {self.probe_val_auroc:.3f}) and "
            f"each order at {self.fpr:.0%} of the same prompts. The deployed monitor minus the probe, points: "
            f"{gaps}." + (f" Left out as training or validation prompts: {seen}." if seen else "")
        )

    def plot(self, sets: Sequence[str] | None = None, *, ncols: int = 4) -> Any:
        """Per set, the share flagged against the everyday benign rate (log scale), one line per
        order and the probe; the deployed monitor is a point, the rate a dashed line. Needs
        matplotlib; returns the figure.

        Example:
            >>> ev.plot().savefig("outside.png")  # doctest: +SKIP
        """
        import matplotlib.pyplot as plt

        names = list(self.sets) if sets is None else list(sets)
        nrows = -(-len(names) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.8 * nrows), squeeze=False)
        floor = 0.5 / max(self.n_everyday, 1)
        for ax, name in zip(axes.ravel(), names, strict=False):  # the grid may hold more axes than sets
            for m, curve in self.curves.items():
                rate, share = curve[name]
                ax.step(
                    np.maximum(rate, floor),
                    share,
                    where="post",
                    label=m,
                    lw=1.2,
                    color="black" if m == PROBE else None,
                    ls="--" if m == PROBE else "-",
                )
            ax.plot(
                [max(self.deployed_rate, floor)], [self.shares[DEPLOYED][name]], "o", color="crimson", label=DEPLOYED
            )
            ax.axvline(self.fpr, color="grey", ls=":", lw=1)
            ax.set(
                xscale="log",
                xlim=(floor, 1),
                ylim=(0, 1.02),
                title=name,
                xlabel="everyday benign flagged",
                ylabel="recall" if self.sets[name]["label"] else "flagged",
            )
        for ax in axes.ravel()[len(names) :]:
            ax.axis("off")
        axes.ravel()[0].legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        return fig
