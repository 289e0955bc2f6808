"""The truncated polynomial classifier (TPC) head and its cost accounting.

    z_std  = (z - mean) / scale
    P_{:n} = w0 + <w1, z_std> + sum_{k=2}^{n} sum_r lambda_k[r] * <U_k[:, r], z_std>^k

Symmetric CP weights (paper Eq. 5): one factor matrix ``U_k`` [d_model, R_k] and one
coefficient vector ``lambda_k`` [R_k] per degree k >= 2.

Out-of-distribution guards (docs/concepts/training.md, "Out-of-distribution guards"):

* trust region (set by :func:`~tpc_hooks.fit` by default): each projection ``<U_k[:, r], z_std>``
  is clipped to ``[lo_k[r], hi_k[r]]``, the range it took on the training rows, so a degree-k
  term never exceeds what it reached in training;
* ``gate`` (on by default with the trust region): a row that leaves the region at degree j is
  scored by the linear probe at every order >= j;
* ``escalate_only`` (off by default): the higher orders may raise a row's harm logit but never
  clear a row the linear probe flags, so every order's recall is at least the linear probe's.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from .._errors import TPCHooksError
from ..saving import CONFIG_FILE, HubMixin, check_tensors, head_card, read_dir, require, write_dir
from . import _kernel
from ._history import History


@dataclass(frozen=True)
class Cost:
    """Parameters and FLOPs (one multiply-add = one FLOP) of a truncation ``P_{:order}``.

    Paper Table 2, symmetric CP, with the bias counted as a parameter:
    ``params = D + 1 + sum_k (R_k D + R_k)``, ``flops = D + sum_k (R_k D + k R_k)``.
    Standardisation is not counted: it is the same for every order.
    """

    order: int
    params: int
    flops: int


class Scaler(nn.Module):
    """Per-feature standardisation stored with the head (``scaler.mean``, ``scaler.scale``)."""

    mean: Tensor
    scale: Tensor

    def __init__(self, d_model: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(d_model))
        self.register_buffer("scale", torch.ones(d_model))

    def forward(self, z: Tensor) -> Tensor:
        return (z - self.mean.to(z.dtype)).div_(self.scale.to(z.dtype))  # one copy of the rows, not two


def check_int(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TPCHooksError(f"{name} must be an integer >= {low}; got {value!r}")
    return value


class TPC(nn.Module, HubMixin):
    """A degree-N truncated polynomial classifier on ``d_model``-dimensional activations.

    Every truncation ``P_{:n}`` (n = 1..degree) is a classifier; ``n = 1`` is the linear
    probe. The standardisation is part of the module, so a saved head is self-contained.

    Args:
        d_model: width of the activations it reads.
        degree: highest degree N (>= 1).
        rank: CP rank of every degree >= 2, or a sequence ``[R_2, ..., R_N]``.

    Example:
        >>> import torch, tpc_hooks as tpc
        >>> head = tpc.TPC(d_model=16, degree=3, rank=4)
        >>> z = torch.randn(8, 16)
        >>> head(z).shape, head(z, order=1).shape, head.terms(z).shape
        (torch.Size([8]), torch.Size([8]), torch.Size([8, 3]))
        >>> head.cost(order=2).params
        85
    """

    _hub_commit_message = "Upload tpc-hooks head"

    def __init__(self, d_model: int, degree: int = 5, rank: int | Sequence[int] = 64):
        super().__init__()
        check_int(d_model, "d_model", 1)
        check_int(degree, "degree", 1)
        if isinstance(rank, int) and not isinstance(rank, bool):
            ranks = [rank] * (degree - 1)
        elif isinstance(rank, Sequence) and not isinstance(rank, str):
            ranks = list(rank)
            if len(ranks) != degree - 1:
                raise TPCHooksError(
                    f"rank lists one rank per degree 2..{degree}, so it needs {degree - 1} entries; got {len(ranks)}"
                )
        else:
            raise TPCHooksError(f"rank must be an integer or a list of integers; got {rank!r}")
        for r in ranks:
            check_int(r, "rank", 1)
        self.d_model = d_model
        self.degree = degree
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.history: Any = None
        self.scaler = Scaler(d_model)
        self.bias = nn.Parameter(torch.zeros(1))
        self.linear = nn.Parameter(torch.zeros(d_model))
        self.factors = nn.ParameterDict(
            {
                str(k): nn.Parameter(torch.randn(d_model, r) / d_model**0.5)
                for k, r in zip(self.degrees, self.ranks, strict=True)
            }
        )
        self.lambdas = nn.ParameterDict(
            {str(k): nn.Parameter(torch.zeros(r)) for k, r in zip(self.degrees, self.ranks, strict=True)}
        )
        for k in self.degrees:
            self.register_buffer(f"bounds_{k}", None)
        self.gate = False
        self.escalate_only = False

    @property
    def degrees(self) -> range:
        """The degrees with CP weights: ``2..degree``."""
        return range(2, self.degree + 1)

    def rank_of(self, k: int) -> int:
        """CP rank ``R_k`` of degree ``k`` (2 <= k <= degree)."""
        return self.ranks[k - 2]

    def extra_repr(self) -> str:
        tr = f", trust_region=True, gate={self.gate}" if self.has_bounds else ""
        esc = ", escalate_only=True" if self.escalate_only else ""
        return f"d_model={self.d_model}, degree={self.degree}, ranks={list(self.ranks)}{tr}{esc}"

    # ------------------------------------------------------------------ trust region
    @property
    def has_bounds(self) -> bool:
        """Whether projections are clipped to a trust region (see :meth:`set_bounds`)."""
        return self.degree > 1 and all(self.bounds(k) is not None for k in self.degrees)

    def bounds(self, k: int) -> Tensor | None:
        """``[2, R_k]``: the lower and upper clip bound of each projection of degree ``k`` (None: no clipping)."""
        return getattr(self, f"bounds_{k}")

    @torch.no_grad()
    def set_bounds(
        self,
        z: Float[Tensor, "n d_model"],
        margin: float = 0.0,
        *,
        gate: bool | None = None,
        degrees: Sequence[int] | None = None,
    ) -> "TPC":
        """Sets the trust region from activations ``z`` (raw, in model units; normally the training rows).

        Each projection ``<U_k[:, r], z_std>`` is clipped to its range on ``z``, widened by
        ``margin`` times the range on each side (plus 1e-6 of it, against
        rounding). Rows of ``z`` are therefore scored exactly as without clipping, while a degree-k
        term can never exceed the largest value it reached on them. ``gate=True`` also scores rows
        that leave the region with the linear probe (every order from the first degree they leave
        it at equals order 1). ``degrees`` limits which degrees get new bounds (default: all).
        Re-run it after changing ``factors`` (``fit`` does). Returns ``self``.

        Example:
            >>> import torch, tpc_hooks as tpc
            >>> head = tpc.TPC(d_model=8, degree=3, rank=2)
            >>> _ = torch.nn.init.normal_(head.lambdas["3"])
            >>> z = torch.randn(100, 8)
            >>> torch.equal(head.set_bounds(z)(z), head.clear_bounds()(z))
            True
        """
        if not 0 <= margin < float("inf"):
            raise TPCHooksError(f"margin must be a finite number >= 0; got {margin!r}")
        zs, _ = _kernel.standardize(self, z)
        if zs.shape[0] == 0:
            raise TPCHooksError("set_bounds needs at least one row")
        for k in self.degrees if degrees is None else degrees:
            p = zs @ _kernel.param(self.factors[str(k)], zs)
            self.put_bounds(k, p.min(0).values, p.max(0).values, margin)
        if gate is not None:
            self.gate = bool(gate)
        return self

    def put_bounds(self, k: int, lo: Tensor, hi: Tensor, margin: float = 0.0) -> "TPC":
        """Sets degree ``k``'s trust region from the range ``[lo, hi]`` (``[R_k]`` each) its
        projections took, e.g. streamed over a store chunk by chunk (``fit`` does); widened as in
        :meth:`set_bounds`. Returns ``self``."""
        setattr(self, f"bounds_{k}", _kernel.widen_bounds(lo, hi, margin, self.bias.dtype).to(self.bias.device))
        return self

    def clear_bounds(self) -> "TPC":
        """Removes the trust region (and the gate): the plain polynomial of the paper. Returns ``self``."""
        for k in self.degrees:
            setattr(self, f"bounds_{k}", None)
        self.gate = False
        return self

    def outside(self, z: Float[Tensor, "*batch d_model"], order: int | None = None) -> Tensor:
        """Bool per row: the input leaves the trust region at some degree in ``2..order``
        (all False without bounds). With ``gate`` on, these rows get the linear probe's logit."""
        n = self.check_order(order)
        zs, batch = _kernel.standardize(self, z)
        return _kernel.outside(self, zs, n).reshape(batch)

    # ------------------------------------------------------------------ scoring
    def check_order(self, order: int | None) -> int:
        """``order`` checked against this head (None: the full polynomial, ``degree``)."""
        if order is None:
            return self.degree
        if isinstance(order, bool) or not isinstance(order, int) or not 1 <= order <= self.degree:
            raise TPCHooksError(
                f"order must be an integer in 1..{self.degree} for this degree-{self.degree} head; got {order!r}"
            )
        return order

    def standardize(self, z: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        """Returns ``(z - scaler.mean) / scaler.scale`` (the head's own units)."""
        zs, batch = _kernel.standardize(self, z)
        return zs.reshape(*batch, self.d_model)

    def forward(self, z: Float[Tensor, "*batch d_model"], order: int | None = None) -> Float[Tensor, "*batch"]:
        """Logits of the truncation ``P_{:order}`` (the full polynomial when ``order`` is None).

        Args:
            z: activations ``[d_model]`` or ``[..., d_model]``; half precision is scored in float32.
            order: truncation order in ``1..degree``.

        Returns:
            Logits with the batch shape of ``z`` (a 0-d tensor for a single vector).

        Raises:
            TPCHooksError: wrong ``d_model``, NaN/inf in ``z``, or ``order`` out of range.
        """
        n = self.check_order(order)
        zs, batch = _kernel.standardize(self, z)
        return _kernel.logits(self, zs, n).reshape(batch)

    def truncations(self, z: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch degree"]:
        """Logits of every truncation in one pass: ``truncations(z)[..., n - 1] == head(z, order=n)`` exactly.

        Example:
            >>> import torch, tpc_hooks as tpc
            >>> head = tpc.TPC(d_model=8, degree=3, rank=2)
            >>> z = torch.randn(4, 8)
            >>> torch.equal(head.truncations(z)[:, 1], head(z, order=2))
            True
        """
        zs, batch = _kernel.standardize(self, z)
        return torch.stack(_kernel.truncations(self, zs, self.degree), -1).reshape(*batch, self.degree)

    def terms(self, z: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch degree"]:
        """Per-order contributions: column 0 is ``w0 + linear``, column ``k-1`` the degree-k term.

        The columns' cumulative sums are the truncations: ``terms(z)[..., :n].sum(-1) == head(z, order=n)``
        (up to rounding where the gate or ``escalate_only`` overrules the higher orders: there a
        column is the change of the truncation, not the raw term).
        """
        zs, batch = _kernel.standardize(self, z)
        if not (self.escalate_only or _kernel.gating(self)):
            cols = [_kernel.linear(self, zs)] + [_kernel.term(self, zs, k)[0] for k in self.degrees]
        else:  # gated / escalated rows: the differences of consecutive truncations
            tr = _kernel.truncations(self, zs, self.degree)
            cols = tr[:1] + [b - a for a, b in zip(tr, tr[1:], strict=False)]
        return torch.stack(cols, dim=-1).reshape(*batch, self.degree)

    def probs(self, z: Float[Tensor, "*batch d_model"], order: int | None = None) -> Float[Tensor, "*batch"]:
        """``sigmoid(head(z, order))``: the probability of the harmful class."""
        return torch.sigmoid(self.forward(z, order))

    def direction(self, order: int = 1, r: int | None = None) -> Tensor:
        """Residual-stream directions in model units, for patching or steering with a toolkit's hooks.

        ``<u, (z - mean) / scale> = <u / scale, z> + const``, so a direction in the head's
        standardised space is ``u / scale`` in the model's. Order 1 gives the linear probe's
        direction ``w1 / scale`` ``[d_model]``; a degree k >= 2 gives factor ``r`` of ``U_k``
        ``[d_model]``, or all factors ``[d_model, R_k]`` when ``r`` is None.
        """
        n = self.check_order(order)
        scale = self.scaler.scale.detach()
        if n == 1:
            return self.linear.detach() / scale
        U = self.factors[str(n)].detach() / scale[:, None]
        if r is None:
            return U
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < U.shape[1]:
            raise TPCHooksError(f"r must index one of the {U.shape[1]} factors of degree {n}; got {r!r}")
        return U[:, r]

    def truncated(self, order: int) -> "TPC":
        """A degree-``order`` copy of this head: its logits are ``head(z, order=order)`` for every
        ``z`` (the same tensors, trust region, gate and ``escalate_only``), and the higher degrees'
        weights are gone, so no policy can run them. ``history`` is kept.

        Example:
            >>> import torch, tpc_hooks as tpc
            >>> head = tpc.TPC(d_model=8, degree=3, rank=2)
            >>> _ = torch.nn.init.normal_(head.lambdas["2"])
            >>> z = torch.randn(4, 8)
            >>> small = head.truncated(2)
            >>> small.degree, torch.equal(small(z), head(z, order=2))
            (2, True)
        """
        n = self.check_order(order)
        out = TPC(self.d_model, n, list(self.ranks[: n - 1]))
        mine = self.state_dict()
        out.load_state_dict({k: mine[k].detach().clone() for k in out.state_dict()})  # bounds: None there, set below
        for k in out.degrees:
            b = self.bounds(k)
            setattr(out, f"bounds_{k}", None if b is None else b.detach().clone())
        out.gate, out.escalate_only, out.history = self.gate, self.escalate_only, self.history
        return out.to(self.bias.device).train(self.training)

    # ------------------------------------------------------------------ cost
    def cost(self, order: int | None = None) -> Cost:
        """Parameter count and FLOPs of the truncation ``P_{:order}`` (paper Table 2, symmetric CP)."""
        n = self.check_order(order)
        d = self.d_model
        params, flops = d + 1, d
        for k in range(2, n + 1):
            r = self.rank_of(k)
            params += r * d + r
            flops += r * d + k * r
        return Cost(order=n, params=params, flops=flops)

    def term_flops(self) -> list[int]:
        """FLOPs added by each order: ``[D, R_2 D + 2 R_2, ..., R_N D + N R_N]``."""
        return [self.d_model] + [self.rank_of(k) * self.d_model + k * self.rank_of(k) for k in self.degrees]

    # ------------------------------------------------------------------ saving and sharing
    def _save_dir(self, path: str | os.PathLike) -> Path:
        """Writes ``config.json`` + ``model.safetensors`` (float32, no pickle) to a directory;
        :meth:`save_pretrained` adds the model card.

        Example:
            >>> import tempfile, tpc_hooks as tpc
            >>> head = tpc.TPC(d_model=8, degree=2, rank=2)
            >>> d = head.save_pretrained(tempfile.mkdtemp() + "/head")
            >>> tpc.TPC.from_pretrained(d).ranks
            (2,)
        """
        return write_dir(path, *to_saved(self))

    @classmethod
    def _load_dir(cls, path: str | os.PathLike) -> "TPC":
        """Loads a head saved by :meth:`save_pretrained`. Strict: names, shapes, dtype and
        version must match.

        Raises:
            TPCHooksError: naming the file and the problem (missing/extra tensor, wrong shape,
                unknown ``format_version``, truncated file).
        """
        cfg, tensors = read_dir(path)
        return from_saved(cfg, tensors, Path(path) / CONFIG_FILE)

    def model_card(self, *, repo_id: str | None = None) -> str:
        """The model card :meth:`save_pretrained` writes (``README.md``): shape, the cost of
        every truncation, the training history; ``repo_id`` names the loading snippet's source."""
        return head_card(self, repo_id=repo_id)


# ---------------------------------------------------------------------- the saved format
def to_saved(head: TPC) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config, tensors)`` of a head in the saved format (DESIGN.md: "Saved head")."""
    cfg: dict[str, Any] = {"d_model": head.d_model, "degree": head.degree, "ranks": list(head.ranks)}
    if head.has_bounds:
        cfg["trust_region"] = {"gate": head.gate}
    if head.escalate_only:
        cfg["escalate_only"] = True
    if head.history is not None and hasattr(head.history, "to_dict"):
        cfg["history"] = head.history.to_dict()
    out = {"bias": head.bias, "linear": head.linear, "scaler.mean": head.scaler.mean, "scaler.scale": head.scaler.scale}
    for k in head.degrees:
        out[f"factors.{k}"] = head.factors[str(k)]
        out[f"lambdas.{k}"] = head.lambdas[str(k)]
        if head.has_bounds:
            bounds = head.bounds(k)
            assert bounds is not None  # has_bounds: every degree has its bounds
            out[f"bounds.{k}"] = bounds
    return cfg, out


def from_saved(cfg: dict[str, Any], tensors: dict[str, Tensor], where: Path | str) -> TPC:
    """The head a saved ``(config, tensors)`` describes; strict (see :meth:`TPC.from_pretrained`)."""
    d_model = require(cfg, "d_model", int, where)
    degree = require(cfg, "degree", int, where)
    ranks = require(cfg, "ranks", list, where)
    if len(ranks) != degree - 1 or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in ranks):
        raise TPCHooksError(
            f"{where}: config.json ranks={ranks!r} must list {degree - 1} positive integers (R_2..R_{degree})"
        )
    if d_model < 1 or degree < 1:
        raise TPCHooksError(f"{where}: config.json has d_model={d_model}, degree={degree}; both must be >= 1")
    expected: dict[str, tuple[int, ...]] = {
        "bias": (1,),
        "linear": (d_model,),
        "scaler.mean": (d_model,),
        "scaler.scale": (d_model,),
    }
    trust = cfg.get("trust_region")
    if trust is not None and (not isinstance(trust, dict) or not isinstance(trust.get("gate"), bool) or degree < 2):
        raise TPCHooksError(
            f'{where}: config.json trust_region must be {{"gate": true|false}} on a head of degree >= 2; got {trust!r}'
        )
    for k, r in zip(range(2, degree + 1), ranks, strict=False):
        expected[f"factors.{k}"] = (d_model, r)
        expected[f"lambdas.{k}"] = (r,)
        if trust is not None:
            expected[f"bounds.{k}"] = (2, r)
    check_tensors(tensors, expected, where)
    if trust is not None and not all(
        bool((tensors[f"bounds.{k}"][0] <= tensors[f"bounds.{k}"][1]).all()) for k in range(2, degree + 1)
    ):
        raise TPCHooksError(f"{where}: a trust-region lower bound exceeds its upper bound; the file is corrupt")
    if not bool((tensors["scaler.scale"] > 0).all()):
        raise TPCHooksError(f"{where}: scaler.scale must be positive everywhere; the file is corrupt")
    head = TPC(d_model, degree, ranks)
    with torch.no_grad():
        head.bias.copy_(tensors["bias"])
        head.linear.copy_(tensors["linear"])
        head.scaler.mean.copy_(tensors["scaler.mean"])
        head.scaler.scale.copy_(tensors["scaler.scale"])
        for k in head.degrees:
            head.factors[str(k)].copy_(tensors[f"factors.{k}"])
            head.lambdas[str(k)].copy_(tensors[f"lambdas.{k}"])
            if trust is not None:
                setattr(head, f"bounds_{k}", tensors[f"bounds.{k}"].clone())
    head.gate = bool(trust["gate"]) if trust is not None else False
    esc = cfg.get("escalate_only", False)
    if not isinstance(esc, bool):
        raise TPCHooksError(f"{where}: config.json escalate_only must be true or false; got {esc!r}")
    head.escalate_only = esc
    history = cfg.get("history")
    if history is not None and not isinstance(history, dict):
        raise TPCHooksError(
            f"{where}: config.json history must be an object (the training record); got {type(history).__name__}"
        )
    if history is not None:
        try:
            head.history = History.from_dict(history)
        except TPCHooksError as err:
            raise TPCHooksError(f"{where}: config.json {err}") from None
    return head
