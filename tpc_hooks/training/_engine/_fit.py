"""``fit``: a TPC trained degree by degree (paper §3.2.1), or jointly (its ablation)."""

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..._errors import TPCHooksError
from ...head import TPC, FitConfig, History, TrainConfig, order_projections, order_term, truncation_logits
from ._inputs import pair_rows, sequence_splits, unlabelled_rows, val_group_rows
from ._loop import Draws, default_device, loss_and_f1, train_loop
from ._probe import fit_probe
from ._rows import Rows, split_data
from ._segments import SequenceBatches, Sequences
from ._shrink import fit_order_scale

log = logging.getLogger(__name__)


def fit(
    X_train: Any,
    y_train: Any,
    X_val: Any = None,
    y_val: Any = None,
    config: FitConfig | None = None,
    *,
    init: TPC | None = None,
    val_groups: Any = None,
    X_unlabelled: Any = None,
    pairs: Any = None,
    sequences: Any = None,
    val_sequences: Any = None,
    device: str | torch.device | None = None,
    verbose: bool = True,
    **settings: Any,
) -> TPC:
    """Trains a TPC on activations ``X`` [n, d_model] and binary labels ``y`` (1 = harmful).

    ``mode="progressive"`` (the paper's method): degree 1 is scikit-learn's
    ``LogisticRegression`` (``C`` from ``Cs`` by validation AUROC, or F1 with the paper's recipe:
    ``probe_metric``; ties by validation loss) on
    the standardised features; then each degree k = 2..N is trained alone with everything
    before it frozen, so every truncation is a classifier and truncations < k never change.
    ``mode="joint"`` trains all terms together on the full polynomial's loss (the paper's
    ablation; its truncations are usually poor classifiers).

    Args:
        X_train, y_train: training activations (array, tensor or
            :class:`~tpc_hooks.ActivationStore` for data larger than RAM) and labels.
        X_val, y_val: validation data for model selection; if omitted, a stratified
            ``val_fraction`` of the training rows is held out.
        config: a :class:`~tpc_hooks.FitConfig` (default: its defaults).
        init: a trained head to extend: its degrees (and scaler, trust region, gate and
            ``escalate_only``) are kept bit-identical and only the degrees above ``init.degree``
            are trained; ``rank`` then gives the rank of the added degrees (an int, or one entry
            per added degree).
        val_groups: one group label per validation row (a phrasing family, a source, ...): degrees
            k >= 2 are then selected over the groups, not the pooled rows (``group_rule``): by
            default early stopping and the grid point by the mean of the groups' loss and F1, and
            the shrinkage scale by that mean among the scales under which no group's loss rises
            significantly over the truncation below (a paired test per group); ``"worst"``: by the
            worst group's. The linear probe's C is still chosen on the pooled rows.
        X_unlabelled: the rows the ``consistency`` penalty reads (in memory).
        pairs: ``[m, 2]`` row indices into ``X_train`` (in memory, with ``X_val`` given): a
            harmful row and a benign counterpart on its topic (its intent flip); the ``contrast``
            loss ranks each harmful row above its counterpart.
        sequences, val_sequences: with ``objective="sctopk"``, the rows of each training / validation
            sequence (a list of counts: the first ``sequences[0]`` rows are the first sequence's
            tokens, in order, and so on). A sequence's label is 1 when any of its rows' is. The
            validation loss and F1 are then the sequences' (``val_groups``: each sequence's first
            row's group).
        device: where to train (default: CUDA if available). The head is returned there.
        verbose: progress bars.
        **settings: any :class:`~tpc_hooks.FitConfig` field, overriding ``config``: ``degree``,
            ``rank``, ``mode``, ``recipe`` (``"paper"``: the paper's exact recipe), ``epochs``,
            ``lr``, ``trust_region``, ``gate``, ``shrink``, ``escalate_only``, ``sweep``, ``seed``, ...

    Returns:
        The trained :class:`TPC`, with ``head.history`` (a :class:`History`; its ``config`` is
        the resolved :class:`FitConfig`).

    Raises:
        TPCHooksError: on bad input (shape, NaN/inf, labels not binary or one class, an unknown
            or contradictory setting, ...).

    Example:
        >>> import tpc_hooks as tpc
        >>> from tpc_hooks.synthetic import make_problem
        >>> X, y = make_problem(n=600, d_model=16, seed=0)
        >>> head = tpc.fit(X, y, degree=3, rank=4, epochs=5, verbose=False)
        >>> head.degree, len(head.history.for_degree(2)), head.history.config.trust_region
        (3, 5, True)
    """
    cfg = FitConfig.from_options(config, settings)
    dev = default_device(device)
    tr, y_tr, va, y_va = split_data(
        X_train, y_train, X_val, y_val, cfg.val_fraction, cfg.seed, None if init is None else init.d_model, dev
    )
    tr.chunk_rows = va.chunk_rows = cfg.chunk_rows
    groups = val_group_rows(val_groups, va.n, X_val is not None)
    seqs = sequence_splits(cfg, sequences, val_sequences, tr, y_tr, va, y_va, X_val is not None, pairs, dev)
    if seqs is not None and groups is not None:
        groups = val_group_rows(np.asarray(val_groups).reshape(-1)[seqs[1].first_rows()], seqs[1].n, True)
    unl = unlabelled_rows(X_unlabelled, tr.d, cfg, dev)
    pair_idx = pair_rows(pairs, X_val is not None, tr, y_tr, cfg, dev)
    head, history, cfg = _extend(init, cfg) if init is not None else _new_head(tr, cfg.resolved())
    head.to(dev)
    head.requires_grad_(False)
    tr.hold_standardized(head.scaler, dev)
    va.hold_standardized(head.scaler, dev)
    if unl is not None:
        unl.hold_standardized(head.scaler, dev)
    train = _Trainer(head, tr, y_tr, va, y_va, cfg, dev, verbose, history.records, groups, unl, pair_idx, seqs)

    if cfg.mode == "joint":
        history.selected[head.degree] = train.joint()
    else:
        if init is None:
            assert cfg.Cs is not None  # resolved() fills Cs
            history.selected[1] = fit_probe(
                head,
                tr,
                y_tr,
                va,
                y_va,
                cfg.Cs,
                cfg.max_iter,
                cfg.linear_solver,
                dev,
                history.records,
                cfg.probe_metric,
            )
            if seqs is not None:
                history.selected[1].update(train.sequence_probe())
            log.info("degree 1: C=%s, val F1 %.4f", history.selected[1]["C"], history.selected[1]["val_f1"])
        for k in range(2 if init is None else init.degree + 1, head.degree + 1):
            prefix = train.prefix(k)  # the frozen truncation below, computed once
            chosen = train.degree(k, prefix)  # every grid point trained; the best kept
            if cfg.trust_region:
                train.bound([k])  # the trust region from the training rows
            if cfg.shrink:
                chosen.update(train.shrink(k, prefix))
            history.selected[k] = chosen
            log.info("degree %d: val F1 %.4f (epoch %d)", k, chosen["val_f1"], chosen["best_epoch"])
    if cfg.trust_region and head.degree > 1:
        train.bound([k for k in head.degrees if head.bounds(k) is None])  # joint mode: bounds at the end
        head.gate = bool(cfg.gate)
    head.escalate_only = bool(cfg.escalate_only)
    history.config = replace(cfg, gate=head.gate)
    head.requires_grad_(True)
    head.history = history
    return head.eval()


def _new_head(tr: Rows, cfg: FitConfig) -> tuple[TPC, History, FitConfig]:
    """An untrained head whose scaler is fitted on the training rows."""
    with torch.random.fork_rng(devices=[]):  # the initial factors are redrawn per degree from `seed`
        head = TPC(tr.d, cfg.degree, list(cfg.rank) if isinstance(cfg.rank, tuple) else cfg.rank)
    mean, scale = tr.fit_scaler()
    with torch.no_grad():
        head.scaler.mean.copy_(mean)
        head.scaler.scale.copy_(scale)
    return head, History(mode=cfg.mode), cfg


def _extend(init: TPC, cfg: FitConfig) -> tuple[TPC, History, FitConfig]:
    """A copy of ``init`` with room for degrees up to ``cfg.degree``; ``init``'s truncations,
    trust region, gate and ``escalate_only`` carry over bit-identically."""
    if cfg.mode != "progressive":
        raise TPCHooksError("init= extends a head progressively; it cannot be combined with mode='joint'")
    if cfg.degree < init.degree:
        raise TPCHooksError(
            f"degree={cfg.degree} is below init's degree {init.degree}; truncate with head(z, order=n) instead"
        )
    extra = cfg.degree - init.degree
    ranks = list(init.ranks) + ([cfg.rank] * extra if isinstance(cfg.rank, int) else list(cfg.rank))
    with torch.random.fork_rng(devices=[]):
        head = TPC(init.d_model, cfg.degree, ranks)
    head.load_state_dict(init.state_dict(), strict=False)
    for k in init.degrees:
        b = init.bounds(k)
        setattr(head, f"bounds_{k}", None if b is None else b.detach().clone())
    if init.degree > 1 and (
        (cfg.trust_region is not None and bool(cfg.trust_region) != init.has_bounds)
        or (cfg.gate is not None and bool(cfg.gate) != init.gate)
    ):
        raise TPCHooksError(
            f"init= keeps init's trust_region={init.has_bounds} and gate={init.gate} (changing them "
            "would change its truncations); leave trust_region and gate unset"
        )
    if cfg.escalate_only and not init.escalate_only:
        raise TPCHooksError("init= keeps init's escalate_only=False (changing it would change its truncations)")
    trust_region = init.has_bounds if init.degree > 1 else cfg.trust_region
    cfg = replace(cfg, gate=init.gate, escalate_only=init.escalate_only, trust_region=trust_region).resolved()
    history = copy.deepcopy(init.history) if isinstance(init.history, History) else History(mode="progressive")
    return head, history, cfg


def _init_degree(head: TPC, k: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed * 1009 + k)
    with torch.no_grad():
        u = torch.randn(head.d_model, head.rank_of(k), generator=gen) / head.d_model**0.5
        head.factors[str(k)].copy_(u)
        head.lambdas[str(k)].zero_()


class _Trainer:
    """The steps of progressive (and joint) training on one head and one split."""

    def __init__(
        self,
        head: TPC,
        tr: Rows,
        y_tr: Tensor,
        va: Rows,
        y_va: Tensor,
        cfg: FitConfig,
        device: torch.device,
        verbose: bool,
        records: list[dict[str, Any]],
        groups: list[Tensor] | None = None,
        unlabelled: Rows | None = None,
        pairs: Tensor | None = None,
        sequences: tuple[Sequences, Sequences] | None = None,
    ):
        self.unlabelled, self.pairs = unlabelled, pairs
        self.seq_tr: Sequences | None = None if sequences is None else sequences[0]
        self.seq_va: Sequences | None = None if sequences is None else sequences[1]
        self.head, self.tr, self.va, self.cfg, self.device, self.verbose, self.records = (
            head,
            tr,
            va,
            cfg,
            device,
            verbose,
            records,
        )
        self.groups = None if groups is None else [g.to(device) for g in groups]
        self.y_tr, self.y_va = y_tr.to(device), y_va.to(device)
        if self.seq_va is not None:  # validation judges the sequences' logits
            self.y_va = self.seq_va.y
        self.configs = cfg.train_config().grid(cfg.sweep)
        self.data: Rows | SequenceBatches = tr if self.seq_tr is None else SequenceBatches(tr, self.seq_tr)

    @torch.no_grad()
    def prefix(self, k: int) -> tuple[Tensor, Tensor]:
        """The frozen truncation ``P_{:k-1}``'s logits on the training and validation rows."""

        def fn(x):
            return truncation_logits(self.head, x, k - 1)

        return self.tr.map(self.head.scaler, self.device, fn), self.va.map(self.head.scaler, self.device, fn)

    def _scored(self, s: Tensor) -> tuple[float, float]:
        """Validation (loss, F1) of the rows' logits ``s`` (with sequences: of the sequences' logits): pooled,
        or over the groups by ``group_rule`` (one read back to the host per call)."""
        return loss_and_f1(self._judged(s), self.y_va, self.groups, self.cfg.group_rule)

    def _judged(self, s: Tensor) -> Tensor:
        """What validation judges of the rows' logits ``s [..., n]``: themselves, or the sequences' logits."""
        return s if self.seq_va is None else self.seq_va.reduce(s)

    def sequence_probe(self) -> dict[str, Any]:
        """Degree 1 (bias and weights), from the per-token probe, trained on the sequences' loss; the probe
        itself stays when no epoch lowers the validation sequences' loss (weight decay 0: the probe's C
        already regularises)."""
        head, seq = self.head, self.seq_tr
        assert seq is not None  # called with sequences only
        params = [head.bias, head.linear]
        for p in params:
            p.requires_grad_(True)

        def batch_loss(xb: Tensor, ids: Tensor) -> Tensor:
            return seq.loss(truncation_logits(head, xb, 1), ids, seq.lengths[ids.to(seq.lengths.device)])

        def evaluate() -> tuple[float, float]:
            return self._scored(self.va.map(head.scaler, self.device, lambda x: truncation_logits(head, x, 1)))

        tc = replace(self.configs[0], weight_decay=0.0, dropout=0.0)
        res = train_loop(
            params,
            batch_loss,
            evaluate,
            self.data,
            head.scaler,
            tc,
            self.device,
            torch.Generator().manual_seed(self.cfg.seed * 7919 + 1),
            desc="degree 1 on sequences",
            verbose=self.verbose,
            records=self.records,
            tags={"degree": 1, "trial": 0, "lr_init": tc.lr, "weight_decay": 0.0, "dropout": 0.0},
        )
        for p in params:
            p.requires_grad_(False)
        return {"val_loss": res["val_loss"], "val_f1": res["val_f1"], "best_epoch": res["epoch"]}

    def _val_term(self, k: int) -> Tensor:
        return self.va.map(self.head.scaler, self.device, lambda x: order_term(self.head, x, k)[0])

    def degree(self, k: int, prefix: tuple[Tensor, Tensor]) -> dict[str, Any]:
        """Trains ``U_k, lambda_k`` alone, once per grid point (weight decay grown by
        ``decay_growth``), and keeps the best by validation F1 (ties: loss)."""
        head, cfg, device = self.head, self.cfg, self.device
        prefix_tr, prefix_va = prefix
        U, lam = head.factors[str(k)], head.lambdas[str(k)]
        U.requires_grad_(True)
        lam.requires_grad_(True)
        configs = [
            replace(c, weight_decay=c.weight_decay * cfg.experimental["decay_growth"] ** (k - 2)) for c in self.configs
        ]
        best: dict[str, Any] | None = None
        best_params = None
        for trial, tc in enumerate(configs):
            _init_degree(head, k, cfg.seed)
            gen, drop, pick_u, pick_p = self._trial_draws(k, trial)
            batch_loss = self._degree_loss(k, tc, prefix_tr, drop, pick_u, pick_p)

            def evaluate() -> tuple[float, float]:
                return self._scored(prefix_va + self._val_term(k))

            tags = {
                "degree": k,
                "trial": trial,
                "lr_init": tc.lr,
                "weight_decay": tc.weight_decay,
                "dropout": tc.dropout,
            }
            desc = f"degree {k}" + (f" trial {trial + 1}/{len(configs)}" if len(configs) > 1 else "")
            res = train_loop(
                [U, lam],
                batch_loss,
                evaluate,
                self.data,
                head.scaler,
                tc,
                device,
                gen,
                desc=desc,
                verbose=self.verbose,
                records=self.records,
                tags=tags,
            )
            if best is None or (-res["val_f1"], res["val_loss"]) < (-best["val_f1"], best["val_loss"]):
                best = {
                    **res,
                    "trial": trial,
                    "best_epoch": res["epoch"],
                    "lr": tc.lr,
                    "weight_decay": tc.weight_decay,
                    "dropout": tc.dropout,
                }
                best_params = (U.detach().clone(), lam.detach().clone())
        assert best is not None and best_params is not None  # the grid has at least one config
        with torch.no_grad():
            U.copy_(best_params[0])
            lam.copy_(best_params[1])
        U.requires_grad_(False)
        lam.requires_grad_(False)
        best.pop("epoch", None)
        return best

    def _trial_draws(self, k: int, trial: int) -> tuple[torch.Generator, Draws, Draws | None, Draws | None]:
        """One trial's seeded randomness for degree ``k``: the generator of the batch order, the
        prefix-dropout draws, and the draws of unlabelled rows and of harmful / counterpart pairs
        (None where there are none)."""
        cfg, device = self.cfg, self.device
        gen = torch.Generator().manual_seed(cfg.seed * 7919 + k * 31 + trial)
        gen_u = torch.Generator().manual_seed(cfg.seed * 7919 + k * 31 + trial + 1)  # labelled batches unchanged
        # an epoch's draws at once, after its shuffle (streamed rows shuffle per chunk: drawn per batch there)
        drop = Draws(lambda g, n: torch.rand(n, generator=g), gen, self.tr.n if self.tr.std is not None else 0, device)
        unl = self.unlabelled.std if self.unlabelled is not None else None
        pick_u: Draws | None = None
        if unl is not None:

            def draw_u(g: torch.Generator, n: int) -> Tensor:
                return torch.randint(unl.shape[0], (n,), generator=g)

            pick_u = Draws(draw_u, gen_u, self.tr.n, unl.device)
        pairs = self.pairs
        pick_p: Draws | None = None
        if pairs is not None:

            def draw_p(g: torch.Generator, n: int) -> Tensor:
                return torch.randint(pairs.shape[0], (n,), generator=g)

            pick_p = Draws(
                draw_p, torch.Generator().manual_seed(cfg.seed * 7919 + k * 31 + trial + 2), self.tr.n, device
            )
        return gen, drop, pick_u, pick_p

    def _degree_loss(
        self,
        k: int,
        tc: TrainConfig,
        prefix_tr: Tensor,
        drop: Draws,
        pick_u: Draws | None,
        pick_p: Draws | None,
    ) -> Callable[[Tensor, Tensor], Tensor]:
        """The loss of degree ``k``'s term on a training batch at grid point ``tc``: the BCE of the
        frozen prefix (each row's dropped at ``tc.dropout``) plus the term, the consistency penalty on
        unlabelled rows (``pick_u``), the contrast of harmful / counterpart pairs (``pick_p``) and the
        L1 penalty on ``U_k``."""
        head, cfg, device = self.head, self.cfg, self.device
        U = head.factors[str(k)]
        unl = self.unlabelled.std if self.unlabelled is not None else None
        pairs, seq = self.pairs, self.seq_tr

        def batch_loss(xb: Tensor, idx: Tensor) -> Tensor:
            ids, lengths = None, None
            if seq is not None:  # idx are sequences: their rows, laid end to end
                ids = idx
                idx, lengths = seq.rows_of(ids)
            idx = idx.to(device)
            prefix = prefix_tr[idx]
            if tc.dropout > 0:
                keep = (drop.take(idx.shape[0]) >= tc.dropout).to(prefix.dtype)
                prefix = prefix * keep / (1 - tc.dropout)
            z = prefix + order_term(head, xb, k, clip=False)[0]
            if seq is not None:
                assert ids is not None and lengths is not None
                loss = seq.loss(z, ids, lengths)
            else:
                loss = F.binary_cross_entropy_with_logits(z, self.y_tr[idx])
            if pick_u is not None:
                assert unl is not None  # pick_u draws the unlabelled rows
                loss = (
                    loss
                    + cfg.consistency
                    * order_term(head, unl[pick_u.take(xb.shape[0])], k, clip=False)[0].square().mean()
                )
            if pick_p is not None:
                assert pairs is not None and self.tr.std is not None  # pairs need the training rows in memory
                p = pairs[pick_p.take(xb.shape[0])].reshape(-1)  # harmful, counterpart, harmful, ...
                s = (prefix_tr[p] + order_term(head, self.tr.std[p], k, clip=False)[0]).view(-1, 2)
                loss = loss + cfg.experimental["contrast"] * F.softplus(s[:, 1] - s[:, 0]).mean()
            return loss + tc.l1 * U.abs().sum() if tc.l1 else loss

        return batch_loss

    @torch.no_grad()
    def bound(self, degrees: Sequence[int]) -> None:
        """The trust region of ``degrees`` from the training rows, read chunk by chunk."""
        for k in degrees:
            lo = hi = None
            for _, x in self.tr.chunks(self.head.scaler, self.device):
                p = order_projections(self.head, x, k)[0]
                lo = p.min(0).values if lo is None else torch.minimum(lo, p.min(0).values)
                hi = p.max(0).values if hi is None else torch.maximum(hi, p.max(0).values)
            assert lo is not None and hi is not None  # the training rows are not empty
            self.head.put_bounds(k, lo, hi, self.cfg.experimental["margin"])

    @torch.no_grad()
    def shrink(self, k: int, prefix: tuple[Tensor, Tensor]) -> dict[str, float]:
        """Scales ``lambda_k`` by the grid scale with the lowest validation loss."""
        scale, loss = fit_order_scale(
            prefix[1], self._val_term(k), self.y_va, self.groups, self.cfg.group_rule, reduce=self._judged
        )
        self.head.lambdas[str(k)].mul_(scale)
        return {"scale": scale, "val_loss_scaled": loss}

    def joint(self) -> dict[str, Any]:
        """All terms trained together on the full polynomial's loss (the paper's ablation)."""
        head, cfg, device = self.head, self.cfg, self.device
        params = [head.bias, head.linear] + [
            p for k in head.degrees for p in (head.factors[str(k)], head.lambdas[str(k)])
        ]
        for p in params:
            p.requires_grad_(True)
        best, best_params = None, None
        for trial, tc in enumerate(self.configs):
            with torch.no_grad():
                head.bias.zero_()
                head.linear.zero_()
            for k in head.degrees:
                _init_degree(head, k, cfg.seed)
            gen = torch.Generator().manual_seed(cfg.seed * 7919 + trial)

            def batch_loss(xb: Tensor, idx: Tensor) -> Tensor:
                return F.binary_cross_entropy_with_logits(
                    truncation_logits(head, xb, head.degree), self.y_tr[idx.to(device)]
                )

            def evaluate() -> tuple[float, float]:
                s = self.va.map(head.scaler, device, lambda x: truncation_logits(head, x, head.degree))
                return loss_and_f1(s, self.y_va)

            tags = {
                "degree": head.degree,
                "trial": trial,
                "lr_init": tc.lr,
                "weight_decay": tc.weight_decay,
                "dropout": 0.0,
            }
            res = train_loop(
                params,
                batch_loss,
                evaluate,
                self.tr,
                head.scaler,
                tc,
                device,
                gen,
                desc="joint",
                verbose=self.verbose,
                records=self.records,
                tags=tags,
            )
            if best is None or (-res["val_f1"], res["val_loss"]) < (-best["val_f1"], best["val_loss"]):
                best = {**res, "trial": trial, "best_epoch": res["epoch"], "lr": tc.lr, "weight_decay": tc.weight_decay}
                best_params = [p.detach().clone() for p in params]
        assert best is not None and best_params is not None  # the grid has at least one config
        with torch.no_grad():
            for p, s in zip(params, best_params, strict=True):
                p.copy_(s)
        best.pop("epoch", None)
        return best
