"""Exact attribution of a TPC's logit to orders, neurons and neuron pairs.

All in the head's standardised units ``z = (x - mean) / scale``, with ``p_r = <u_r, z>``:

* by order: ``logit = bias + <w1, z> + sum_k T_k`` with ``T_k = sum_r lambda_r p_r^k``;
* by neuron: ``T_k`` is homogeneous of degree k, so by Euler's theorem
  ``a_i = z_i dT_k/dz_i / k = z_i sum_r lambda_r p_r^(k-1) U_ir`` sums exactly to ``T_k``;
* by pair: likewise ``M_ij = z_i z_j d2T_k/dz_i dz_j / (k(k-1)) = z_i z_j sum_r lambda_r p_r^(k-2) U_ir U_jr``
  sums exactly to ``T_k``. A pair ``i < j`` contributes ``M_ij + M_ji = 2 M_ij`` (paper Eq. 9 for
  k = 2), a neuron with itself ``M_ii``.

``M = A diag(w) A^T`` with ``A = diag(z) U`` has rank at most ``sum_k R_k``, so the top pairs
are found block by block without ever holding the ``d_model x d_model`` matrix.
"""

import json
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .._errors import TPCHooksError
from ..pooling import pool
from ..sae import check_sae, decoder
from ..sae import sae_encode as encode
from ..views import attribution_html
from . import _kernel
from ._checks import check_features
from ._kernel import euler_gradients, row_orders
from ._polynomial import TPC

PAIR_MODES = ("positive", "negative", "absolute")


def _head_of(obj: Any) -> tuple[TPC, str | None]:
    if isinstance(obj, TPC):
        return obj, None
    head = getattr(obj, "head", None)
    if isinstance(head, TPC):
        return head, getattr(obj, "site", None)
    raise TPCHooksError(f"attribute() needs a TPC head or a Monitor; got {type(obj).__name__}")


@dataclass
class Attribution:
    """Exact decompositions of a head's logits for a batch of inputs.

    Attributes:
        logit: ``[batch]`` the full polynomial's logits.
        bias: ``[batch]`` the bias ``w0`` (the same for every input).
        by_order: ``[batch, degree]``; column 0 is bias + linear, column k-1 the degree-k term;
            rows sum to ``logit``.
        by_neuron: ``[batch, d_model]``; ``bias + by_neuron.sum(-1) == logit``.
        neuron_by_order: ``[batch, degree, d_model]``; row k-1 sums to the degree-k term
            (row 0: the linear term).
        z: ``[batch, d_model]`` the standardised inputs.
        site: the hook name the head reads (when known), basis: ``"residual"`` or ``"sae"``.
        feature_ids: names of the basis directions (``None``: neuron indices).
        feature_labels: a readable label per SAE feature id, when the SAE carries them (its
            ``feature_labels``, as :func:`tpc_hooks.offline.load_sae` gives them); None otherwise.
        orders: ``[batch]`` the truncation each row's logit is (``attribute(..., order=)``; a
            monitor's cascade exit order in :meth:`~tpc_hooks.Monitor.explain`); None: the full
            polynomial. Every part of a degree above a row's order is 0.
    """

    head: TPC
    logit: Tensor
    bias: Tensor
    by_order: Tensor
    by_neuron: Tensor
    neuron_by_order: Tensor
    z: Tensor
    site: str | None = None
    basis: str = "residual"
    feature_ids: list[Any] | None = None
    feature_labels: dict[Any, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    orders: Tensor | None = None
    # SAE projection: zs = f @ dec + rows (per input), see attribute(..., sae=)
    _proj: dict[str, Tensor] | None = None

    def __len__(self) -> int:
        return self.logit.shape[0]

    @property
    def by_feature(self) -> Tensor:
        """Alias of :attr:`by_neuron` for SAE bases: ``[batch, units]``."""
        return self.by_neuron

    @property
    def n_units(self) -> int:
        """Number of basis directions: d_model (residual), d_sae (latents) or d_sae + 2 (projection)."""
        return self.by_neuron.shape[1]

    def _row(self, input: int) -> int:
        if isinstance(input, bool) or not isinstance(input, int) or not -len(self) <= input < len(self):
            raise TPCHooksError(f"input must index one of the {len(self)} attributed inputs; got {input!r}")
        return input % len(self)

    def _orders(self, order: int | None) -> list[int]:
        h = self.head
        if order is None:
            return list(h.degrees)
        if isinstance(order, bool) or not isinstance(order, int) or not 2 <= order <= h.degree:
            raise TPCHooksError(f"pair attribution needs order in 2..{h.degree} (or None for all); got {order!r}")
        return [order]

    def _factors(self, input: int, order: int | None) -> tuple[Tensor, Tensor]:
        """``A = C U`` and weights ``w`` with ``M = A diag(w) A^T`` for one input, where the rows
        ``c_v`` of ``C`` are the basis components of ``z`` (``diag(z)`` for neurons)."""
        zs = self.z[input]
        cols, weights = [], []
        scales = _kernel.lambda_scales(self.head, zs[None], None if self.orders is None else int(self.orders[input]))
        for k in self._orders(order):
            U = self.head.factors[str(k)].detach().to(zs.dtype)
            lam = self.head.lambdas[str(k)].detach().to(zs.dtype) * scales[k][0]
            p = zs @ U
            if self._proj is None:
                cols.append(zs[:, None] * U)
            else:
                pr = self._proj
                cols.append(torch.cat([pr["f"][input][:, None] * (pr["dec"] @ U), pr["rows"][input] @ U]))
            weights.append(lam * p.pow(k - 2))
        return torch.cat(cols, 1), torch.cat(weights)

    # ------------------------------------------------------------------ pairs
    def pair_matrix(self, input: int = 0, order: int | None = None, max_d: int = 4096) -> Tensor:
        """The full ``[d_model, d_model]`` matrix ``M`` (entries sum to the pair-order terms).

        Only for small ``d_model`` (``max_d``); use :meth:`top_pairs` otherwise.
        """
        if self.n_units > max_d:
            raise TPCHooksError(
                f"pair_matrix materialises {self.n_units}^2 values; use top_pairs() (or raise max_d={max_d})"
            )
        A, w = self._factors(self._row(input), order)
        return (A * w) @ A.T

    def top_pairs(
        self,
        k: int = 10,
        order: int | None = 2,
        *,
        input: int | None = 0,
        mode: str = "positive",
        block: int = 512,
        candidates: int | None = 512,
    ) -> list[tuple[Any, Any, float]]:
        """The ``k`` neuron pairs ``i < j`` contributing most to the logit.

        Args:
            k: how many pairs.
            order: the degree whose pairs are ranked (None: all degrees >= 2 together).
            input: which attributed input; ``None`` ranks pairs over all attributed inputs by
                their mean contribution (``positive``/``negative``) or mean absolute
                contribution (``absolute``), e.g. over the prompts of one harm category.
            mode: ``"positive"`` (largest contributions first), ``"negative"`` (most negative)
                or ``"absolute"`` (largest magnitude).
            block: rows computed at a time; memory is O(block x d_model).
            candidates: with ``input=None``, pairs are searched among the neurons with the
                largest mean absolute attribution (exact when ``candidates >= d_model`` or
                None); the cost is O(inputs x candidates^2 x rank).

        Returns:
            ``[(i, j, value), ...]`` with ``i < j`` and ``value = 2 M_ij`` (its mean over inputs
            with ``input=None``), best first.

        Example:
            >>> import torch, tpc_hooks as tpc
            >>> head = tpc.TPC(d_model=6, degree=2, rank=2)
            >>> _ = torch.nn.init.normal_(head.lambdas["2"])
            >>> pairs = tpc.attribute(head, torch.randn(1, 6)).top_pairs(k=3)
            >>> len(pairs), all(i < j for i, j, _ in pairs)
            (3, True)
        """
        if mode not in PAIR_MODES:
            raise TPCHooksError(f"mode must be one of {list(PAIR_MODES)}; got {mode!r}")
        d = self.n_units
        n_pairs = d * (d - 1) // 2
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n_pairs:
            raise TPCHooksError(
                f"k must be in 1..{n_pairs} (the number of pairs among {d} {self.basis} units); got {k!r}"
            )
        if input is None:
            keep = torch.arange(d)
            if candidates is not None and candidates < d:
                keep = self.by_neuron.abs().mean(0).topk(max(candidates, 2)).indices.sort().values
            blocks = [self._factors(b, order) for b in range(len(self))]

            def values(a: int, b: int) -> Tensor:
                rows = keep[a:b]
                parts = [2 * ((A[rows] * w) @ A[keep].T) for A, w in blocks]
                stack = torch.stack(parts)
                return (stack.abs() if mode == "absolute" else stack).mean(0)

            ids = keep
        else:
            A, w = self._factors(self._row(input), order)
            Aw = A * w
            ids = torch.arange(d)

            def values(a: int, b: int) -> Tensor:
                return 2 * (Aw[a:b] @ A.T)

        m = len(ids)
        if k > m * (m - 1) // 2:
            raise TPCHooksError(
                f"k={k} exceeds the {m * (m - 1) // 2} pairs among {m} candidate neurons; raise candidates"
            )
        best_v = torch.empty(0, dtype=self.z.dtype)
        best_i = torch.empty(0, dtype=torch.long)
        cols = torch.arange(m)
        rank = {"positive": lambda v: v, "negative": lambda v: -v, "absolute": lambda v: v.abs()}[mode]
        for a in range(0, m - 1, block):
            b = min(a + block, m)
            vals = values(a, b)  # [rows, m]
            upper = cols[None, :] > torch.arange(a, b)[:, None]  # keep i < j
            key = rank(vals).masked_fill(~upper, float("-inf"))
            top_key, flat = key.flatten().topk(min(k, key.numel()))
            flat = flat[torch.isfinite(top_key)]
            best_v = torch.cat([best_v, vals.flatten()[flat]])
            best_i = torch.cat([best_i, a * m + flat])  # flat index into [m, m]
            keep_top = rank(best_v).topk(min(k, len(best_v))).indices
            best_v, best_i = best_v[keep_top], best_i[keep_top]
        names = self.feature_ids
        out = []
        for v, idx in zip(best_v.tolist(), best_i.tolist(), strict=True):
            i, j = (int(ids[t]) for t in divmod(idx, m))
            out.append((names[i] if names else i, names[j] if names else j, v))
        return out

    def self_pairs(self, input: int = 0, order: int | None = None) -> Tensor:
        """The diagonal ``M_ii``: each neuron's interaction with itself, ``[d_model]``."""
        A, w = self._factors(self._row(input), order)
        return (A * A * w).sum(1)

    def direction(self, unit: Any) -> Tensor:
        """The residual-stream direction (model units) of a basis unit, for patching or steering:
        the unit vector ``e_i`` for residual neuron ``i``, the decoder row ``W_dec[j]`` for SAE
        feature ``j`` (``"b_dec"`` gives the decoder bias). Factor directions: :meth:`TPC.direction`."""
        if self.basis == "residual":
            if isinstance(unit, bool) or not isinstance(unit, int) or not 0 <= unit < self.head.d_model:
                raise TPCHooksError(f"unit must be a neuron index in 0..{self.head.d_model - 1}; got {unit!r}")
            e = torch.zeros(self.head.d_model, dtype=self.z.dtype)
            e[unit] = 1
            return e
        W_dec, b_dec = self.extra.get("W_dec"), self.extra.get("b_dec")
        if W_dec is None:
            raise TPCHooksError("this attribution carries no SAE decoder")
        if unit == "b_dec":
            assert b_dec is not None  # attribute() stores W_dec and b_dec together
            return b_dec
        if isinstance(unit, bool) or not isinstance(unit, int) or not 0 <= unit < W_dec.shape[0]:
            raise TPCHooksError(f"unit must be an SAE feature id in 0..{W_dec.shape[0] - 1} or 'b_dec'; got {unit!r}")
        return W_dec[unit]

    # ------------------------------------------------------------------ neurons
    def top_neurons(self, k: int = 10, *, input: int | None = 0, mode: str = "absolute") -> list[tuple[Any, float]]:
        """Neurons by attribution for one input (or, with ``input=None``, by the mean over inputs
        for ``positive``/``negative`` and the mean absolute value for ``absolute``)."""
        if mode not in PAIR_MODES:
            raise TPCHooksError(f"mode must be one of {list(PAIR_MODES)}; got {mode!r}")
        d = self.n_units
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d:
            raise TPCHooksError(f"k must be in 1..{d}; got {k!r}")
        if input is None:
            v = self.by_neuron.abs().mean(0) if mode == "absolute" else self.by_neuron.mean(0)
        else:
            v = self.by_neuron[self._row(input)]
        key = {"positive": v, "negative": -v, "absolute": v.abs()}[mode]
        idx = key.topk(k).indices.tolist()
        names = self.feature_ids
        return [(names[i] if names else i, float(v[i])) for i in idx]

    # ------------------------------------------------------------------ aggregates and export
    def mean(self) -> dict[str, Tensor]:
        """Mean and mean-absolute attributions over the attributed inputs."""
        return {
            "logit": self.logit.mean(0),
            "by_order": self.by_order.mean(0),
            "by_order_abs": self.by_order.abs().mean(0),
            "by_neuron": self.by_neuron.mean(0),
            "by_neuron_abs": self.by_neuron.abs().mean(0),
        }

    def to_dict(self, input: int = 0, k: int = 20) -> dict[str, Any]:
        """One input's attribution as plain JSON-able data (top neurons and pairs, per order; a pair
        that adds exactly 0 is not listed, so an order whose weights are zero lists none)."""
        r = self._row(input)
        n = self.n_units
        pairs = {str(o): ps for o, ps in self._pairs_by_order(r, k).items()}
        out: dict[str, Any] = {
            "site": self.site,
            "basis": self.basis,
            "logit": float(self.logit[r]),
            "bias": float(self.bias[r]),
            "by_order": [float(v) for v in self.by_order[r]],
            "top_neurons": self.top_neurons(min(k, n), input=r),
            "top_pairs": pairs,
        }
        if self.feature_labels:  # the labels of the features named above
            named = [i for i, _ in out["top_neurons"]] + [u for ps in pairs.values() for i, j, _ in ps for u in (i, j)]
            out["labels"] = {str(u): self.feature_labels[u] for u in dict.fromkeys(named) if u in self.feature_labels}
        return out

    def _pairs_by_order(self, r: int, k: int) -> dict[int, list[tuple[Any, Any, float]]]:
        """Row ``r``'s top ``k`` pairs of each degree, without those that add exactly 0 (every pair
        of an order whose ``lambda_k`` is zero, as training leaves an order that earned nothing)."""
        n = self.n_units
        top = min(k, n * (n - 1) // 2)
        return {o: [p for p in self.top_pairs(top, o, input=r) if p[2] != 0] for o in self.head.degrees}

    def to_json(self, input: int = 0, k: int = 20) -> str:
        return json.dumps(self.to_dict(input, k))

    def to_dataframe(self, input: int = 0, k: int = 20):
        """Long-format table of one input's top neurons and pairs per order (needs pandas)."""
        import pandas as pd

        r = self._row(input)
        rows = [
            {"kind": "order", "order": o + 1, "i": None, "j": None, "value": float(self.by_order[r, o])}
            for o in range(self.head.degree)
        ]
        n = self.n_units
        for i, v in self.top_neurons(min(k, n), input=r):
            rows.append({"kind": "neuron", "order": None, "i": i, "j": None, "value": v})
        for o, pairs in self._pairs_by_order(r, k).items():
            for i, j, v in pairs:
                rows.append({"kind": "pair", "order": o, "i": i, "j": j, "value": v})
        df = pd.DataFrame(rows)
        df.attrs.update(site=self.site, basis=self.basis, logit=float(self.logit[r]))
        return df

    def plot(self, input: int = 0, k: int = 12, order: int | None = 2):
        """A bar chart by order and a heatmap of the top neurons' pair interactions (paper Fig. 5).

        Needs matplotlib. Returns the figure.
        """
        import matplotlib.pyplot as plt

        r = self._row(input)
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.3]})
        vals = self.by_order[r].tolist()
        ax1.bar(
            [("bias+linear" if o == 0 else f"degree {o + 1}") for o in range(len(vals))],
            vals,
            color=["#4477aa" if v >= 0 else "#cc6677" for v in vals],
        )
        ax1.axhline(0, color="black", lw=0.6)
        ax1.set_title(f"logit {float(self.logit[r]):.3f} by order")
        ax1.tick_params(axis="x", rotation=30)
        if self.head.degree >= 2:
            pairs = self.top_pairs(min(k, self.n_units * (self.n_units - 1) // 2), order, input=r)
            ids = list(dict.fromkeys([p for i, j, _ in pairs for p in (i, j)]))[:k]
            idx = [self.feature_ids.index(n) if self.feature_ids else n for n in ids]
            A, w = self._factors(r, order)
            sub = ((A[idx] * w) @ A[idx].T) * 2
            sub.fill_diagonal_(0)
            lim = float(sub.abs().max()) or 1.0
            im = ax2.imshow(sub.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim)
            ax2.set_xticks(range(len(ids)), [str(n) for n in ids], rotation=90, fontsize=7)
            ax2.set_yticks(range(len(ids)), [str(n) for n in ids], fontsize=7)
            ax2.set_title(f"pair contributions 2·M_ij ({'all orders' if order is None else f'degree {order}'})")
            fig.colorbar(im, ax=ax2, fraction=0.046)
        fig.tight_layout()
        return fig

    def to_html(self, inputs: int | list[int] | None = None, k: int = 8, labels: list[str] | None = None):
        """The attribution as small coloured tables (by order, top neurons, top degree-2 pairs):
        :func:`tpc_hooks.views.attribution_html`. An attribution has no per-token scores.

        Returns an :class:`tpc_hooks.views.HTML` (Jupyter displays it; ``.save(path)`` writes a page).

        Example:
            >>> import torch, tpc_hooks as tpc
            >>> head = tpc.TPC(d_model=6, degree=3, rank=2)
            >>> _ = torch.nn.init.normal_(head.lambdas["2"])  # a new head's orders above 1 add 0: no pair to list
            >>> attr = tpc.attribute(head, torch.randn(3, 6))
            >>> str(attr.to_html(inputs=[0, 2], labels=["a", "b", "c"])).count("<table>")
            6
        """
        return attribution_html(self, inputs=inputs, k=k, labels=labels)

    def _repr_html_(self) -> str:
        """Jupyter's view: :meth:`to_html` of the first five inputs."""
        return str(self.to_html(inputs=list(range(min(len(self), 5)))))


def attribute(head_or_monitor: Any, z: Any, *, mask: Any = None, sae: Any = None, order: Any = None) -> Attribution:
    """Exact decompositions of a TPC's (or a Monitor's) logits for activations ``z``.

    Args:
        head_or_monitor: a :class:`~tpc_hooks.TPC` or a :class:`~tpc_hooks.Monitor`.
        z: pooled activations ``[batch, d_model]`` (or one ``[d_model]`` vector); with a
            Monitor, also per-token activations ``[batch, pos, d_model]`` (a TransformerLens
            ``ActivationCache`` entry or an nnsight-saved tensor), pooled the monitor's way
            using ``mask`` (default: every position).
        mask: ``[batch, pos]`` attention mask for per-token input.
        sae: an SAELens SAE for the head's (residual) site: the attribution is projected into
            its feature basis. With ``z = W_dec^T f + b_dec + err`` (``f`` the SAE's latents of
            the pooled input; for mean pooling of per-token input, the mean of per-token
            latents) every part splits into ``d_sae`` features plus a ``"b_dec"`` and an
            ``"error"`` term, and still sums exactly to the logit.
        order: the truncation to split, ``P_{:order}`` (an int, or one per row ``[batch]``, e.g. a
            cascade's ``exit_order``); None: the full polynomial. A degree above a row's order adds 0.

    Returns:
        An :class:`Attribution`.

    Example:
        >>> import torch, tpc_hooks as tpc
        >>> head = tpc.TPC(d_model=8, degree=3, rank=2)
        >>> attr = tpc.attribute(head, torch.randn(4, 8))
        >>> torch.allclose(attr.by_order.sum(-1), attr.logit), torch.allclose(
        ...     attr.bias + attr.by_neuron.sum(-1), attr.logit
        ... )
        (True, True)
        >>> z = torch.randn(4, 8)
        >>> torch.allclose(tpc.attribute(head, z, order=2).logit, head(z, order=2))
        True
    """
    head, site = _head_of(head_or_monitor)
    mon_sae = getattr(head_or_monitor, "sae", None)
    if sae is not None and mon_sae is not None:
        raise TPCHooksError("this monitor already reads SAE latents; its attribution is in feature ids without sae=")
    if hasattr(z, "keys") and site is not None and not isinstance(z, Tensor):  # an ActivationCache
        if site not in z:
            raise TPCHooksError(f"the cache has no {site!r}; run the model with names_filter including it")
        z = z[site]
    t = z if isinstance(z, Tensor) else torch.as_tensor(z)
    f_mean = None
    if t.dim() == 3:
        if site is None:
            raise TPCHooksError("per-token activations [batch, pos, d_model] need a Monitor (for its pooling)")
        if getattr(head_or_monitor, "pooling", None) == "token":
            raise TPCHooksError(
                "a per-token monitor aggregates its tokens' logits over time; attribute the tokens "
                "themselves: attribute(monitor, acts[b, :T]) gives one row per token"
            )
        m = torch.ones(t.shape[:2], dtype=torch.long) if mask is None else torch.as_tensor(mask)
        if tuple(m.shape) != tuple(t.shape[:2]):
            raise TPCHooksError(f"mask has shape {tuple(m.shape)}; expected {tuple(t.shape[:2])}")
        if mon_sae is not None:
            t = encode(mon_sae, t.detach())
        elif sae is not None and head_or_monitor.pooling == "mean":
            f_mean = pool(encode(sae, t.detach()), m, "mean")
        t = pool(t.detach(), m, head_or_monitor.pooling)
    if t.dim() == 1:
        t = t[None]
    X = check_features(t.detach().cpu(), "z", head.d_model)
    dtype = X.dtype
    rows = row_orders(head, order, X.shape[0])
    with torch.no_grad():
        mean, scale = head.scaler.mean.detach().cpu().to(dtype), head.scaler.scale.detach().cpu().to(dtype)
        zs = (X - mean) / scale
        bias, q = euler_gradients(head, zs, rows)
        qs = list(q.unbind(1))
        neuron_by_order = zs[:, None] * q
        by_order = neuron_by_order.sum(-1)
        by_order[:, 0] += bias
        by_neuron = neuron_by_order.sum(1)
        logit = bias + by_neuron.sum(-1)
    if sae is not None:
        out = _project(head, site, sae, X, zs, qs, bias, by_order, logit, f_mean)
        out.feature_labels = getattr(sae, "feature_labels", None)
        out.orders = None if order is None else rows
        return out
    extra: dict[str, Any] = {}
    if mon_sae is not None:
        extra["W_dec"], extra["b_dec"] = (t.to(dtype) for t in decoder(mon_sae))
    return Attribution(
        head=head,
        logit=logit,
        bias=bias,
        by_order=by_order,
        by_neuron=by_neuron,
        neuron_by_order=neuron_by_order,
        z=zs,
        site=site,
        basis="sae" if mon_sae is not None else "residual",
        extra=extra,
        feature_labels=getattr(mon_sae, "feature_labels", None),
        orders=None if order is None else rows,
    )


@torch.no_grad()
def _project(
    head: TPC,
    site: str | None,
    sae: Any,
    X: Tensor,
    zs: Tensor,
    qs: list[Tensor],
    bias: Tensor,
    by_order: Tensor,
    logit: Tensor,
    f: Tensor | None,
) -> Attribution:
    """Attribution of a residual-space head in an SAE's feature basis (see :func:`attribute`);
    ``qs`` are :func:`attribute`'s per-order gradients ``q_k`` in standardised units."""
    check_sae(sae, head.d_model, site)
    dtype = X.dtype
    W_dec, b_dec = (t.to(dtype) for t in decoder(sae))
    if f is None:
        f = encode(sae, X)
    f = f.to(dtype)
    err = X - (f @ W_dec + b_dec)
    mean, scale = head.scaler.mean.to(dtype), head.scaler.scale.to(dtype)
    dec = W_dec / scale  # [d_sae, d_model] in standardised units
    rows = torch.stack([((b_dec - mean) / scale).expand_as(X), err / scale], 1)  # [batch, 2, d_model]
    unit_by_order = torch.stack([torch.cat([f * (q @ dec.T), torch.einsum("bvd,bd->bv", rows, q)], 1) for q in qs], 1)
    by_unit = unit_by_order.sum(1)
    ids: list[Any] = list(range(dec.shape[0])) + ["b_dec", "error"]
    return Attribution(
        head=head,
        logit=logit,
        bias=bias,
        by_order=by_order,
        by_neuron=by_unit,
        neuron_by_order=unit_by_order,
        z=zs,
        site=site,
        basis="sae-projection",
        feature_ids=ids,
        extra={"W_dec": W_dec, "b_dec": b_dec},
        _proj={"f": f, "dec": dec, "rows": rows},
    )
