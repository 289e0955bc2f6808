"""How a monitor is measured on activations: metrics per truncation order, the worst validation
group's, and the cascade's sweep of thresholds, on pooled rows or per-token sequences.

The training recipe's report and ``tpc-hooks evaluate`` both measure with these, so a metric in
a monitor's report and one printed by the CLI mean the same thing.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..head import FixedOrder
from ..metrics import classification_metrics, threshold_at_fpr, worst_group

DECISIONS = {"max": "max over tokens of the aggregate", "last": "the aggregate after the last token"}
SWEEP_TAUS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)


def sequence_logits(monitor: Any, seqs: Sequence[Any], rule: Any, decision: str = "max") -> np.ndarray:
    """A per-token monitor's decision logit for each sequence ``[T_i, d_model]``: ``rule`` on every
    token, aggregated as the monitor aggregates (its ``skip`` leading tokens unscored), then the
    maximum over the sequence (``"max"``: what a monitor streaming it would have flagged on) or
    the value after its last token (``"last"``). A sequence with no scored token gets float32's
    lowest logit (probability 0), which metrics can rank."""
    with torch.no_grad():
        return _decide([monitor._aggregated(rule, torch.as_tensor(z))[1] for z in seqs], decision)


def _decide(aggregates: Sequence[Any], decision: str) -> np.ndarray:
    """One logit per sequence from its aggregate after every token: the maximum or the last, with
    float32's lowest logit for a sequence that has no scored token."""
    s = torch.stack([a.max() if decision == "max" else a[-1] for a in aggregates]).double().numpy()
    return np.maximum(s, np.finfo(np.float32).min)


def order_logits(monitor: Any, X: Any, order: int, decision: str = "max") -> Any:
    """The decision logits of the truncation at ``order``: of each pooled row ``X [n, d_model]``
    (a tensor), or of each sequence (a per-token monitor; see :func:`sequence_logits`)."""
    if monitor.streaming:
        return sequence_logits(monitor, X, FixedOrder(monitor.head, order), decision)
    with torch.no_grad():
        return monitor.head(X, order=order)


def per_order(monitor: Any, X: Any, y: Any, decision: str = "max") -> list[dict[str, Any]]:
    """:func:`~tpc_hooks.metrics.classification_metrics` of every truncation order, 1..degree."""
    return [classification_metrics(y, order_logits(monitor, X, n, decision)) for n in range(1, monitor.head.degree + 1)]


def worst_per_order(monitor: Any, X: Any, y: Any, groups: Any, decision: str = "max") -> list[dict[str, Any]]:
    """:func:`~tpc_hooks.metrics.worst_group` of every truncation order (the threshold at 1%
    false-positive rate from the benign rows of every group together)."""
    out = []
    for n in range(1, monitor.head.degree + 1):
        s = order_logits(monitor, X, n, decision)
        out.append(worst_group(y, s if isinstance(s, np.ndarray) else s.double().numpy(), groups))
    return out


def cascade_sweep(
    monitor: Any, X: Any, y: Any, decision: str = "max", taus: Sequence[float] = SWEEP_TAUS
) -> list[dict[str, Any]]:
    """The monitor's cascade at each ``tau``: F1, accuracy, recall, false-rejection rate, mean
    FLOPs (a per-token monitor: per scored token) relative to the linear probe's, and how many
    rows (tokens) exit at each order. Empty without a cascade."""
    cascade = monitor.cascade
    if cascade is None:
        return []
    if not monitor.streaming:
        return cascade.sweep(X, y, taus)
    base, degree, rows = monitor.head.cost(1).flops, monitor.head.degree, []
    for tau in taus:
        rule = cascade.with_thresholds(tau)
        flops, exits, aggregates = [], [], []
        with torch.no_grad():
            for z in X:
                res, agg = monitor._aggregated(rule, torch.as_tensor(z))
                on = torch.arange(len(agg)) >= monitor.skip  # the scored tokens
                flops.append(res.flops[on].double())
                exits.append(res.exit_order[on])
                aggregates.append(agg)
        m = classification_metrics(y, _decide(aggregates, decision))
        f = torch.cat(flops)
        mean = f.mean().item() if len(f) else 0.0
        hist = np.bincount(torch.cat(exits).numpy(), minlength=degree + 1)[1:].tolist()
        rows.append(
            {
                "tau": tau,
                "f1": m["f1"],
                "accuracy": m["accuracy"],
                "recall": m["recall"],
                "frr": m["frr"],
                "mean_flops": mean,
                "relative_flops": mean / base,
                "exit_histogram": hist,
            }
        )
    return rows


EARN_Z = 2.0  # a higher order is kept when it flags significantly more harmful validation rows (a paired sign test)


def earned_order(
    monitor: Any,
    X: Any,
    y: Any,
    fpr: float,
    decision: str = "max",
    counted: Any = None,
    z: float = EARN_Z,
    benign: Any = None,
    groups: Any = None,
) -> tuple[int, list[dict[str, Any]]]:
    """The highest truncation order that earns its terms at the operating point and holds the floor
    of order 1 (the linear probe) on every group, and the table.

    Each order ``n`` gets its own threshold, flagging ``fpr`` of the ``benign`` rows of ``(X, y)``
    (default: every benign row; :func:`tpc_hooks.metrics.threshold_at_fpr`), and flags some of the
    harmful rows (those ``counted``, default all). Order ``n`` earns its terms over the order kept
    so far when, of the harmful rows exactly one of the two flags, ``n`` flags ``b`` and the kept
    order ``c`` with ``b - c >= max(1, z * sqrt(b + c))`` (a paired sign test, ``z = 2``: about 2%
    one-sided). With ``groups`` (one label per row: the prompts, a phrasing family held out of
    training, ...), it must also flag at least as many of each group's harmful rows as order 1
    does at order 1's threshold: the floor. The order kept is the last that did both.

    Returns:
        ``(order, table)``: one row per order with ``order``, ``flagged_harmful``, ``n_harmful``,
        ``recall`` (at its threshold), ``flagged_benign``, ``n_benign``, ``gained`` / ``lost``:
        the harmful rows it flags that the order kept before it does not, and the reverse; with
        ``groups``, ``by_group`` (each group's harmful rows flagged) and ``below_floor`` (the
        groups where it flags fewer than order 1).

    Example:
        >>> import numpy as np, tpc_hooks as tpc
        >>> head = tpc.TPC(d_model=2, degree=2, rank=1)
        >>> mon = tpc.Monitor(head, "blocks.0.hook_resid_post")
        >>> X, y = np.eye(2, dtype=np.float32).repeat(3, 0), np.array([0, 0, 0, 1, 1, 1])
        >>> earned_order(mon, X, y, 0.0, groups=["prompts"] * 6)[0]  # an untrained order 2 adds nothing
        1
    """
    y = np.asarray(y)
    harmful = (y == 1) & (np.ones(len(y), bool) if counted is None else np.asarray(counted, bool))
    ref = (y == 0) if benign is None else np.asarray(benign, bool)
    g = None if groups is None else np.asarray(groups)
    n_h, n_b = int(harmful.sum()), int(ref.sum())
    table, hits, every = [], [], []
    kept = 1
    orders = None
    if not monitor.streaming:  # every order's logits in one pass over the rows (each equal to head(X, order=n))
        with torch.no_grad():
            orders = monitor.head.truncations(torch.as_tensor(X))
    for n in range(1, monitor.head.degree + 1):
        s = order_logits(monitor, X, n, decision) if orders is None else orders[:, n - 1]
        s = np.asarray(s if isinstance(s, np.ndarray) else s.double().cpu().numpy(), dtype=np.float64)
        t = threshold_at_fpr(s[ref], fpr)
        every.append(s > t)
        hits.append(every[-1][harmful])
        gained = int((hits[-1] & ~hits[kept - 1]).sum())
        lost = int((hits[kept - 1] & ~hits[-1]).sum())
        row: dict[str, Any] = {
            "order": n,
            "flagged_harmful": int(hits[-1].sum()),
            "n_harmful": n_h,
            "recall": float(hits[-1].mean()) if n_h else float("nan"),
            "flagged_benign": int(every[-1][ref].sum()),
            "n_benign": n_b,
            "gained": gained,
            "lost": lost,
        }
        if g is not None:
            at = {name: (g == name) & (y == 1) for name in dict.fromkeys(g[y == 1].tolist())}
            row["by_group"] = {name: [int(every[-1][m].sum()), int(m.sum())] for name, m in at.items()}
            row["below_floor"] = [name for name, m in at.items() if every[-1][m].sum() < every[0][m].sum()]
        table.append(row)
        if n > 1 and gained - lost >= max(1.0, z * np.sqrt(gained + lost)) and not row.get("below_floor"):
            kept = n
    return kept, table
