"""The one place that says how a TPC's truncations are evaluated.

Every consumer — the head's ``forward``/``truncations``/``terms``, the cascade, training,
attribution, the baselines' comparison — calls these functions on a head's tensors, so a
change to the rule below is one edit here.

    z_std     = (z - mean) / scale                                   standardise
    p_k       = z_std @ U_k                        [n, R_k]          project
    c_k       = clamp(p_k, lo_k, hi_k)             (trust region)    clip
    T_k       = c_k ** k @ lambda_k                                  term
    raw_n     = w0 + <w1, z_std> + sum_{k=2..n} T_k                  running sum
    logit_n   = raw_n, except                                        decide
                * gate: a row that left the trust region at some degree <= n gets order 1's logit;
                * escalate_only: a row order 1 flags (logit_1 > 0) keeps max(logit_n, logit_1).

Both overrides use ``torch.where``, never a cancelling sum, so an overruled row equals order 1
bit for bit. :class:`Walk` evaluates the orders one at a time (the cascade that drops settled
rows between orders); :func:`stream_logits` evaluates them all in one pass over the packed
factors (a generation step: a fixed number of kernel launches); both decide by :func:`decide`.
Attribution writes the same rule as a per-row rescaled ``lambda`` (:func:`lambda_scales`).
The cascade's exit loop (paper Alg. 1), shared by the TPC cascade and the early-exit MLP
baseline, is :func:`exit_loop`.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._errors import TPCHooksError
from ..metrics import flagged
from ._checks import prepare_activations

BOUNDS_SLACK = 1e-6  # relative widening of the trust region against rounding (see widen_bounds)


# ---------------------------------------------------------------------- standardise, project, clip
def param(p: Tensor, like: Tensor) -> Tensor:
    """``p`` in ``like``'s dtype and on its device (no copy when it already is)."""
    return p if p.dtype == like.dtype and p.device == like.device else p.to(like.device, like.dtype)


def standardize(head: Any, z: Any) -> tuple[Tensor, torch.Size]:
    """Checks activations ``[..., d_model]`` for ``head`` and standardises them.

    Returns the standardised rows ``[n, d_model]`` on the head's device (half precision in
    float32, float64 kept) and the batch shape to restore.
    """
    z2, batch = prepare_activations(z, head.d_model, head.bias, promote=True)
    return head.scaler(z2), batch


def stream_rows(head: Any, z: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`standardize` for the per-step path of generation, without a host synchronisation.

    ``z`` is ``[n, d_model]`` (its width already checked). Returns the standardised rows on the
    head's device and a bool ``[n]`` saying which rows were finite; a non-finite row is zeroed
    before it is scored, and its scores are to be reported as NaN (:func:`nan_rows`). No
    ``isfinite(...).all()`` is read on the host: the check stays a mask on the device.
    """
    if not z.is_floating_point() or z.dtype in (torch.float16, torch.bfloat16):
        z = z.float()
    z = z.to(device=head.bias.device, dtype=torch.promote_types(z.dtype, head.bias.dtype))
    ok = z.abs().amax(-1) < math.inf  # isfinite(z).all(-1) in two operations: amax carries a NaN through
    return head.scaler.forward(torch.where(ok[:, None], z, 0.0)), ok


def _packed(head: Any, order: int, like: Tensor) -> tuple:
    """Degrees ``1..order`` of ``head`` as the few tensors :func:`stream_logits` reads, in
    ``like``'s dtype and on its device, one block of ``R`` columns per order (``R`` the largest
    rank; order 1's block holds the linear weights then zeros, a degree's block its factors then
    zeros): ``W [d, order * R]``, the clip bounds ``lo, hi`` (+-inf where there are none, on
    order 1 and on the padding), each column's exponent, its ``lambda`` (1 for the linear
    weights, 0 on the padding), and ``[bias, 0, ...]`` per order. Built once per parameter
    version (an optimiser step, ``to``, ``set_bounds`` rebuild it) and per generation
    (:func:`forget_packs`), not per generation step."""
    cache = head.__dict__.setdefault("_stream_packs", {})
    if head.__dict__.get("_stream_frozen") and order in cache and cache[order][0][1:3] == (like.dtype, like.device):
        return cache[order][1]  # frozen (freeze_packs): the parameters are not checked again
    ks = range(2, order + 1)
    parts = [head.linear, head.bias]
    parts += [t for k in ks for t in (head.factors[str(k)], head.lambdas[str(k)], head.bounds(k))]
    key = (
        order,
        like.dtype,
        like.device,
        tuple(None if t is None else (id(t), t.data_ptr(), t._version) for t in parts),
    )
    hit = cache.get(order)
    if hit is not None and hit[0] == key:
        return hit[1]
    dt, dev = like.dtype, like.device
    r = max([1] + [head.rank_of(k) for k in ks])
    with torch.no_grad():
        w = torch.zeros(head.d_model, order * r, dtype=dt, device=dev)
        lo = torch.full((order * r,), -math.inf, dtype=dt, device=dev)
        hi, exps, lam = torch.full_like(lo, math.inf), torch.ones_like(lo), torch.zeros_like(lo)
        bias = torch.zeros(order, dtype=dt, device=dev)
        w[:, 0], lam[0], bias[0] = head.linear.detach().to(dev, dt), 1, head.bias.detach().to(dev, dt)
        for k in ks:
            rk, at = head.rank_of(k), (k - 1) * r
            w[:, at : at + rk] = head.factors[str(k)].detach().to(dev, dt)
            lam[at : at + rk] = head.lambdas[str(k)].detach().to(dev, dt)
            exps[at : at + r] = k
            b = head.bounds(k)
            if b is not None:
                lo[at : at + rk], hi[at : at + rk] = b.to(dev, dt)
        packs = (w, lo, hi, exps, lam, bias, r)
    cache[order] = (key, packs)
    return packs


def forget_packs(head: Any) -> None:
    """Drops ``head``'s packed weights, so the next step packs them from its parameters again.
    The pack follows its parameters' version counters within a generation (an optimiser step,
    ``to``, ``set_bounds``); an edit through ``.data`` bumps none, so every monitored generation
    starts from a fresh pack. Also ends :func:`freeze_packs`."""
    head.__dict__.pop("_stream_packs", None)
    head.__dict__.pop("_stream_frozen", None)


def freeze_packs(head: Any) -> None:
    """From now until :func:`forget_packs`, ``head``'s packed weights are used as packed, without
    reading its parameters' version counters at every step (about 45 attribute reads per step):
    for a head nothing else holds, such as the one a serving worker loads from a file, whose
    parameters cannot change while it scores."""
    head.__dict__["_stream_frozen"] = True


def stream_logits(head: Any, zs: Tensor, order: int) -> tuple[Tensor, Tensor]:
    """Every truncation ``1..order`` at once for standardised rows, in a fixed, small number of
    tensor operations whatever the degree (a generation step's launch count; :class:`Walk`
    evaluates order by order instead, for the cascade that drops rows between orders).

    Returns ``(logits, left)``, both ``[n, order]``: the logit of each truncation by the rule
    of :func:`decide` (the gate, ``escalate_only``), equal to :func:`truncations` up to rounding,
    and per degree whether a projection left the trust region (column 0, order 1, all False).
    """
    w, lo, hi, exps, lam, bias, r = _packed(head, order, zs)
    return packed_logits(head, zs @ w, lo, hi, exps, lam, bias, order, r)


def packed_logits(
    head: Any, p: Tensor, lo: Tensor, hi: Tensor, exps: Tensor, lam: Tensor, bias: Tensor, order: int, r: int
) -> tuple[Tensor, Tensor]:
    """:func:`stream_logits` from the projections ``p [..., n, order * r]`` onto the packed columns
    (:func:`_packed`'s other tensors, broadcast against ``p``): any leading dimensions, so several
    heads of one shape stacked on a first one (``head._together``) run the same operations. ``head``
    supplies the gate and ``escalate_only``."""
    shape = (*p.shape[:-1], order, r)
    raw = ((torch.clamp(p, lo, hi).pow(exps) * lam).view(shape).sum(-1) + bias).cumsum(-1)
    left = ((p < lo) | (p > hi)).view(shape).any(-1)
    gated = left.cumsum(-1) > 0 if gating(head) else left  # rows out of the region at some degree <= n
    return decide(head, raw, raw[..., :1], gated), left


def nan_rows(t: Tensor, ok: Tensor) -> Tensor:
    """``t`` with NaN on the rows that are not ``ok``."""
    return torch.where(ok, t, math.nan)


def linear(head: Any, zs: Tensor) -> Tensor:
    """Order 1: ``w0 + <w1, z_std>`` ``[n]``."""
    return zs @ param(head.linear, zs) + param(head.bias, zs)


def project(head: Any, zs: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Degree ``k``'s projections ``[n, R_k]``: raw, clipped to the trust region (the raw ones
    when none is set), and per row whether any projection left it."""
    p = zs @ param(head.factors[str(k)], zs)
    b = head.bounds(k)
    if b is None:
        return p, p, torch.zeros(zs.shape[0], dtype=torch.bool, device=zs.device)
    b = b.to(p.device, p.dtype)
    return p, torch.minimum(torch.maximum(p, b[0]), b[1]), ((p < b[0]) | (p > b[1])).any(1)


def term(head: Any, zs: Tensor, k: int, *, clip: bool = True) -> tuple[Tensor, Tensor | None]:
    """The degree-``k`` term ``[n]`` and, per row, whether a projection left the trust region.
    ``clip=False``: the plain term ``<U_k, z_std>^k @ lambda_k`` (what training fits), no mask."""
    if clip:
        _, p, left = project(head, zs, k)
    else:
        p, left = zs @ param(head.factors[str(k)], zs), None
    return p.pow(k) @ param(head.lambdas[str(k)], zs), left


def widen_bounds(lo: Tensor, hi: Tensor, margin: float, dtype: torch.dtype) -> Tensor:
    """Trust-region bounds ``[2, R]`` from the range ``[lo, hi]`` of each projection.

    Widened by ``margin`` times the range on each side, plus ``BOUNDS_SLACK`` of it, and rounded
    outward when cast to ``dtype``: the rows that set the bounds stay inside them whatever the
    dtype or the matmul's summation order when they are scored again.
    """
    w = (hi - lo) * (margin + BOUNDS_SLACK) + BOUNDS_SLACK * torch.maximum(lo.abs(), hi.abs())
    lo_c, hi_c = (lo - w).to(dtype), (hi + w).to(dtype)
    lo_c = torch.where(lo_c > lo - w, torch.nextafter(lo_c, torch.full_like(lo_c, -math.inf)), lo_c)
    hi_c = torch.where(hi_c < hi + w, torch.nextafter(hi_c, torch.full_like(hi_c, math.inf)), hi_c)
    return torch.stack([lo_c, hi_c])


# ---------------------------------------------------------------------- the running sum over orders
def gating(head: Any) -> bool:
    """Whether the gate is in force (it needs a trust region)."""
    return bool(head.gate and head.has_bounds)


def decide(head: Any, raw: Tensor, lin: Tensor, gated: Tensor) -> Tensor:
    """The logit a head reports at an order from the raw running sum, order 1's logit and the
    rows gated so far. THE rule for the gate and ``escalate_only``."""
    s = torch.where(gated, lin, raw) if gating(head) else raw
    if head.escalate_only:
        s = torch.where(lin > 0, torch.maximum(s, lin), s)
    return s


class Walk:
    """The evaluation of one head's orders for a set of rows, one order at a time.

    ``walk.logit`` is the current order's logit; :meth:`step` adds the next degree;
    :meth:`keep` drops rows (the cascade's exits) without recomputing anything.
    """

    def __init__(self, head: Any, zs: Tensor):
        self.head, self.zs = head, zs
        self.lin = linear(head, zs)
        self.raw = self.lin
        self.logit = self.lin
        self.gated = torch.zeros(zs.shape[0], dtype=torch.bool, device=zs.device)

    def step(self, k: int) -> tuple[Tensor, Tensor]:
        """Adds degree ``k``: returns its logit and the rows that left the trust region at ``k``."""
        t, left = term(self.head, self.zs, k)
        assert left is not None  # term clips by default, and then reports the rows that left
        self.raw = self.raw + t
        if gating(self.head):
            self.gated = self.gated | left
        self.logit = decide(self.head, self.raw, self.lin, self.gated)
        return self.logit, left

    def keep(self, rows: Tensor) -> None:
        """Keeps only ``rows`` (a bool mask or indices into the current rows)."""
        self.zs, self.lin, self.raw = self.zs[rows], self.lin[rows], self.raw[rows]
        self.logit, self.gated = self.logit[rows], self.gated[rows]


def truncations(head: Any, zs: Tensor, order: int) -> list[Tensor]:
    """Logits of the truncations ``1..order`` for standardised rows, from one running sum."""
    walk = Walk(head, zs)
    out = [walk.logit]
    for k in range(2, order + 1):
        out.append(walk.step(k)[0])
    return out


def logits(head: Any, zs: Tensor, order: int) -> Tensor:
    """Logits of the truncation ``P_{:order}`` for standardised rows."""
    return truncations(head, zs, order)[-1]


def outside(head: Any, zs: Tensor, order: int | None = None) -> Tensor:
    """Bool ``[n]``: some projection of degree ``2..order`` lies outside the trust region."""
    out = torch.zeros(zs.shape[0], dtype=torch.bool, device=zs.device)
    for k in range(2, (head.degree if order is None else order) + 1):
        if head.bounds(k) is not None:
            out |= project(head, zs, k)[2]
    return out


@torch.no_grad()
def lambda_scales(head: Any, zs: Tensor, order: int | None = None) -> dict[int, Tensor]:
    """Per degree k, per-row, per-factor multipliers ``m_k`` ``[n, R_k]`` with the truncation
    ``P_{:order}``'s degree-k contribution ``== (p^k * m_k) @ lambda_k`` for the raw projections
    ``p`` (None: the full polynomial): clipping written as a rescaled ``lambda``
    (``(clip(p)/p)^k``), 0 on rows where the gate or ``escalate_only`` hands the decision to
    order 1 (:func:`decide`), and 0 for every degree above ``order``. Attribution uses them to
    stay exact on such rows."""
    n = head.degree if order is None else order
    keep = None
    if gating(head) or head.escalate_only:
        overruled = logits(head, zs, n) == linear(head, zs)
        if not head.escalate_only:
            overruled &= outside(head, zs, n)
        keep = (~overruled).to(zs.dtype)[:, None]
    scales = {}
    for k in head.degrees:
        p, pc, _ = project(head, zs, k)
        if k > n:
            scales[k] = torch.zeros_like(p)
            continue
        m = torch.where(p == 0, torch.ones_like(p), pc / torch.where(p == 0, torch.ones_like(p), p)).pow(k)
        scales[k] = m if keep is None else m * keep
    return scales


# ---------------------------------------------------------------------- the Euler split of a truncation


def row_orders(head: Any, order: Any, n: int) -> Tensor:
    """The truncation of each of ``n`` rows: ``order`` (None: the full polynomial; an int; or one
    per row), checked against ``head``, as an int64 tensor ``[n]``."""
    if order is None:
        return torch.full((n,), head.degree, dtype=torch.long)
    if isinstance(order, int) and not isinstance(order, bool):
        return torch.full((n,), head.check_order(order), dtype=torch.long)
    o = torch.as_tensor(order).detach().cpu()
    if o.is_floating_point() or o.dtype == torch.bool or tuple(o.shape) != (n,):
        raise TPCHooksError(f"order must be None, an int or {n} integers (one per row); got {order!r}")
    if n and not bool(((o >= 1) & (o <= head.degree)).all()):
        raise TPCHooksError(f"order must lie in 1..{head.degree} for this degree-{head.degree} head; got {o.tolist()}")
    return o.long()


@torch.no_grad()
def euler_gradients(head: Any, zs: Tensor, orders: Tensor) -> tuple[Tensor, Tensor]:
    """Each order's part of the logit as a linear form of the standardised rows ``zs [n, d]``: returns
    ``(bias [n], q [n, degree, d])`` with ``logit = bias + sum_k <zs, q[:, k - 1]>`` for row ``i``'s
    truncation ``P_{:orders[i]}`` (:func:`row_orders`). ``q`` of order 1 is the linear weights; of
    degree ``k``, the term's gradient over ``k`` (Euler's theorem: ``T_k`` is homogeneous of degree
    ``k``), with clipping, the gate and ``escalate_only`` as a per-row rescaled ``lambda``
    (:func:`lambda_scales`). The same ``q`` splits the logit along any
    additive decomposition of ``zs``: a part ``x`` of the input carries ``<x / scale, sum_k q_k>``
    (what :meth:`~tpc_hooks.Monitor.explain` does with tokens and model components)."""
    dtype, dev = zs.dtype, zs.device
    n, d = zs.shape
    q = zs.new_zeros(n, head.degree, d)
    q[:, 0] = head.linear.detach().to(dev, dtype)
    bias = head.bias.detach().to(dev, dtype).expand(n).clone()
    orders = orders.to(dev)
    for v in orders.unique().tolist():
        rows = orders == v
        z_v = zs[rows]
        scales = lambda_scales(head, z_v, int(v))
        for k in head.degrees:
            if k > v:
                break
            U = head.factors[str(k)].detach().to(dev, dtype)
            lam = head.lambdas[str(k)].detach().to(dev, dtype) * scales[k]
            q[rows, k - 1] = ((z_v @ U).pow(k - 1) * lam) @ U.T
    return bias, q


# ---------------------------------------------------------------------- the cascade's exit loop
def logit_of(p: float) -> float:
    """``log(p / (1 - p))``, infinite at 0 and 1."""
    if p <= 0:
        return -math.inf
    if p >= 1:
        return math.inf
    return math.log(p / (1 - p))


def exit_loop(
    first: Tensor,
    first_decision: Tensor,
    advance: Callable[[int, Tensor], tuple[Tensor, Tensor, Tensor | None, Tensor | None]],
    orders: int,
    cumulative_flops: Sequence[int],
    lower: float,
    upper: float,
) -> tuple[Tensor, ...]:
    """Paper Alg. 1: exit each row at the first order whose decision probability is outside
    ``(lower, upper)`` (decided in logit space, so it never saturates).

    ``advance(k, keep)`` first keeps the rows of its current set selected by the bool mask
    ``keep`` (the rows still undecided), then returns, for them, order ``k``'s logit, its
    exit logit (calibrated, say), the decision logit to report (None: the exit logit) and a
    bool mask of rows that must exit now whatever their score (or None). Nothing is computed
    for a row after it exits.

    Returns ``(logits, decision_logits, exit_order, flops, forced)``: both at the exit order,
    ``flops = cumulative_flops[exit_order - 1]``, ``forced`` the rows a ``advance`` mask made exit.
    """
    lo, hi = logit_of(lower), logit_of(upper)
    n = first.shape[0]
    s = first
    dec = first_decision.clone()
    exit_order = torch.ones(n, dtype=torch.int64, device=first.device)
    flops = torch.full((n,), cumulative_flops[0], dtype=torch.int64, device=first.device)
    forced = torch.zeros(n, dtype=torch.bool, device=first.device)
    keep = (first_decision > lo) & (first_decision < hi)
    active = torch.nonzero(keep).flatten()
    for k in range(2, orders + 1):
        if active.numel() == 0:
            break
        s_k, c_k, d_k, stop = advance(k, keep)
        s[active], dec[active] = s_k, c_k if d_k is None else d_k
        exit_order[active], flops[active] = k, cumulative_flops[k - 1]
        keep = (c_k > lo) & (c_k < hi)
        if stop is not None:
            forced[active[stop]] = True
            keep &= ~stop
        active = active[keep]
    return s, dec, exit_order, flops, forced


def threshold_above(like: Tensor, z: float) -> float:
    """The lowest probability threshold that leaves a decision logit of ``z`` unflagged, by the
    monitors' rule (:func:`flagged`: in logit space, in ``like``'s dtype, so
    it does not saturate) and, where ``z``'s float32 probability is below 1, by ``prob >=
    threshold`` on that probability too; checked to lie in (0, 1)."""
    at = torch.tensor([z], dtype=like.dtype)
    target = torch.nextafter(at, torch.tensor([math.inf], dtype=like.dtype))
    t = float(torch.sigmoid(target.double()))
    while 0 < t < 1 and bool(flagged(at, t)):  # rounding at large logits: the next float64 up
        t = math.nextafter(t, 1.0)
    p_up = float(np.nextafter(torch.sigmoid(at.float()).numpy()[0], np.float32(1)))  # above z's float32 probability
    if p_up < 1:
        t = max(t, p_up)
    if t >= 1:
        raise TPCHooksError(
            f"the benign scores' tail is at logit {z:.4g}: no probability threshold below 1 keeps it "
            "unflagged (the benign rows look harmful to this monitor; check the prompts and labels)"
        )
    return max(t, math.ulp(0.0))
