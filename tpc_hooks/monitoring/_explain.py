"""Why a monitor scored what it scored: its logit split exactly over the tokens it read and the parts
of the model that wrote them (:meth:`~tpc_hooks.Monitor.explain`, :class:`Explanation`).

The monitor's logit is ``bias + sum_k <z_std, q_k>`` (Euler's theorem: each order's term is its
gradient over ``k`` dotted with the standardised input; :func:`~tpc_hooks.head.euler_gradients`), with
``q_k`` evaluated at the pooled vector and held fixed. ``z_std = (z - mean) / scale`` is linear in
``z``, so any way of writing the pooled vector as a sum of parts splits the logit exactly: a part
``x`` carries ``<x / scale, sum_k q_k>``, and ``bias - <mean / scale, sum_k q_k>`` (the
:attr:`~Explanation.baseline`) is carried by none. The pooled vector is a sum over positions (mean
pooling: each position's ``h_t / T``; max: each coordinate to the position holding its maximum; last:
the last position), and each position's vector a sum over model parts (the embedding, each block's
attention, or each head, and MLP: :meth:`~tpc_hooks.adapters.Adapter.forward_parts`). Both splits come
from one table ``[T, C]`` of position-by-part contributions, whose margins they are. A per-token monitor
(``pooling="token"``) aggregates its tokens' logits with weights that sum to one (mean, max, EMA,
rolling), so token ``t`` carries its weight times its own split.
"""

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .._errors import TPCHooksError
from ..activations import Adapter, from_start, pad, pad_id
from ..data import check_prompts
from ..head import Attribution, Cascade, attribute, euler_gradients
from ..pooling import aggregate as aggregate_logits
from ..pooling import pool, scored
from ..sae import sae_encode, through_encoder
from ..views import HTML, colored_tokens, explanation_html
from ._answers import conversation_ids

__all__ = ["Explanation", "explain"]


@dataclass
class Explanation:
    """A monitor's logits split exactly over the tokens it read and the model parts that wrote them
    (:meth:`tpc_hooks.Monitor.explain`).

    For row ``b``: ``baseline[b] + by_token[b].sum() == baseline[b] + by_component[b].sum() ==
    logit[b]`` (float64 parts of the float64 evaluation of the monitor's score; ``logit`` itself is the
    monitor's float32 score, as :meth:`~tpc_hooks.Monitor.score` returns it, equal to rounding).

    Attributes:
        logit: ``[batch]`` the monitor's logit (its policy's: a cascade's exit order, or ``order=``).
        baseline: ``[batch]`` what no token and no part carries: the head's bias and the standardisation's
            offset, ``bias - <mean / scale, sum_k q_k>`` (a per-token monitor: their weighted sum).
        exit_order: ``[batch]`` the truncation each logit is (a per-token monitor: of its heaviest token).
        tokens, token_ids: per row, the tokens as read (strings, ids): the prompt as the monitor tokenises it
            (chat template, BOS), and a conversation's answer after it.
        pooled: per row, a bool ``[T_b]``: the positions the pooling read (a response monitor: the answer's;
            ``"last"``: the last; a per-token monitor: the scored tokens).
        by_token: per row, ``[T_b]`` float64: each position's share of the logit.
        components: the parts' names, in the order the model computes them: ``"embed"`` (what entered the
            first block), ``"blocks.{l}.attn"`` (``heads=True``: ``"blocks.{l}.attn.{h}"`` and, where the
            projection has one, ``"blocks.{l}.attn.bias"``) and ``"blocks.{l}.mlp"``, up to the site.
        by_component: ``[batch, C]`` float64: each part's share.
        token_by_component: per row, ``[T_b, C]`` float64: whose margins are ``by_token`` and ``by_component``.
        attribution: the same logits by order, neuron and neuron pair (:func:`tpc_hooks.attribute` of the pooled
            rows at their exit order); None for a per-token monitor, whose logit mixes many rows.
        truncated: per row, whether its text was cut at the monitor's ``max_tokens``.
        site, pooling, threshold, probs: the monitor's site, pooling and threshold, and each row's
            probability (``flagged``: ``probs >= threshold``, by the monitor's rule).

    Example:
        >>> ex = monitor.explain(model, ["How do I kill a Python process that hangs?"])  # doctest: +SKIP
        >>> ex.top_tokens(0, k=3)  # doctest: +SKIP
        [(12, ' kill', 1.92), (0, '<|im_start|>', 0.85), (14, ' Python', -0.31)]
        >>> ex.top_components(0, k=2)  # doctest: +SKIP
        [('blocks.3.mlp', 1.4), ('embed', 0.9)]
    """

    logit: Tensor
    baseline: Tensor
    exit_order: Tensor
    tokens: list[list[str]]
    token_ids: list[list[int]]
    pooled: list[Tensor]
    by_token: list[Tensor]
    components: list[str]
    by_component: Tensor
    token_by_component: list[Tensor]
    attribution: Attribution | None
    truncated: list[bool]
    site: str
    pooling: str
    threshold: float
    probs: Tensor
    decision_logits: Tensor
    prompts: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (
            f"Explanation({len(self)} rows at {self.site!r}, pooling={self.pooling!r}, {len(self.components)} parts; "
            ".top_tokens(b), .top_components(b), .to_html(b), .plot(b), .to_dataframe())"
        )

    @property
    def flagged(self) -> Tensor:
        """Bool per row, by the monitor's rule at :attr:`threshold`."""
        from ..metrics import flagged

        return flagged(self.decision_logits, self.threshold)

    def _row(self, b: Any) -> int:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not -len(self) <= b < len(self):
            raise TPCHooksError(f"row must index one of the {len(self)} explained rows; got {b!r}")
        return int(b) % len(self)

    def top_tokens(self, b: int = 0, k: int = 5, *, mode: str = "positive") -> list[tuple[int, str, float]]:
        """Row ``b``'s ``k`` positions that carry most of its logit: ``[(position, token, value), ...]``
        (``mode``: ``"positive"``, the most pushing towards a flag first; ``"negative"``; ``"absolute"``)."""
        b = self._row(b)
        v = self.by_token[b]
        return [(i, self.tokens[b][i], float(v[i])) for i in _top(v, k, mode)]

    def top_components(self, b: int = 0, k: int = 5, *, mode: str = "positive") -> list[tuple[str, float]]:
        """Row ``b``'s ``k`` model parts that carry most of its logit: ``[(name, value), ...]``."""
        b = self._row(b)
        v = self.by_component[b]
        return [(self.components[i], float(v[i])) for i in _top(v, k, mode)]

    def by_layer(self, b: int = 0) -> tuple[list[int], Tensor]:
        """Row ``b``'s parts as a layer-by-(attention, MLP) table: ``(layers, values [n_layers, 2])`` (heads
        and the attention bias summed into their layer's attention; the embedding left out: it is
        ``by_component[b][0]`` when the site is in the residual stream). What :meth:`plot` draws."""
        b = self._row(b)
        layers = sorted({int(n.split(".")[1]) for n in self.components if n.startswith("blocks.")})
        out = torch.zeros(len(layers), 2, dtype=torch.float64)
        at = {layer: i for i, layer in enumerate(layers)}
        for name, v in zip(self.components, self.by_component[b].tolist(), strict=True):
            if name.startswith("blocks."):
                parts = name.split(".")
                out[at[int(parts[1])], 0 if parts[2] == "attn" else 1] += v
        return layers, out

    def share(self, b: int = 0) -> dict[str, float]:
        """How concentrated row ``b``'s split is: the share of the logit above the baseline carried by the
        top 1 and top 3 tokens, and by the top part (each over the sum of absolute contributions)."""
        b = self._row(b)
        t, c = self.by_token[b].abs(), self.by_component[b].abs()
        tt, ct = float(t.sum()) or 1.0, float(c.sum()) or 1.0
        ts = t.sort(descending=True).values
        return {
            "top1_token": float(ts[:1].sum()) / tt,
            "top3_tokens": float(ts[:3].sum()) / tt,
            "top_component": float(c.max()) / ct if len(c) else 0.0,
        }

    # ------------------------------------------------------------------ views
    def to_html(self, b: int | Sequence[int] | None = None, *, k: int = 8, heatmap: bool = True) -> HTML:
        """Row ``b`` (a list, or None: every row) as a page: its tokens coloured by their share of the
        logit (red towards a flag, blue away), the top tokens and parts, and a layer-by-(attention, MLP)
        heatmap: :func:`tpc_hooks.views.explanation_html`. Static HTML (no script); Jupyter shows it.
        For circuitsvis' interactive token view: ``tpc_hooks.views.colored_tokens(ex.tokens[b],
        ex.by_token[b])``."""
        rows = list(range(len(self))) if b is None else [self._row(i) for i in ([b] if isinstance(b, int) else b)]
        return explanation_html(self, rows, k=k, heatmap=heatmap)

    def _repr_html_(self) -> str:
        return str(self.to_html(list(range(min(len(self), 5)))))

    def colored_tokens(self, b: int = 0) -> Any:
        """Row ``b``'s tokens in circuitsvis' interactive token colouring, by their share of the logit
        (needs ``circuitsvis``; its view loads its script, where :meth:`to_html` is static and offline)."""
        return colored_tokens(self.tokens[self._row(b)], self.by_token[self._row(b)].tolist())

    def to_dataframe(self, b: int | None = None):
        """A long table (pandas): one row per (explained row, position, part) with its contribution, and
        the token, whether it was pooled, the part's layer and kind; ``b``: one row's only. Group it as
        you need: ``df.groupby("token").value.sum()``, ``df.pivot_table(index="layer", columns="kind")``."""
        import pandas as pd

        rows = range(len(self)) if b is None else [self._row(b)]
        kinds = [_kind(n) for n in self.components]
        layer = [(-1 if n == "embed" else int(n.split(".")[1])) for n in self.components]
        frames = []
        for r in rows:
            tbc = self.token_by_component[r].numpy()
            T, C = tbc.shape
            frames.append(
                pd.DataFrame(
                    {
                        "row": r,
                        "position": np.repeat(np.arange(T), C),
                        "token": np.repeat(np.array(self.tokens[r], dtype=object), C),
                        "pooled": np.repeat(self.pooled[r].numpy(), C),
                        "component": np.tile(np.array(self.components, dtype=object), T),
                        "layer": np.tile(np.array(layer), T),
                        "kind": np.tile(np.array(kinds, dtype=object), T),
                        "value": tbc.reshape(-1),
                    }
                )
            )
        df = pd.concat(frames, ignore_index=True)
        df.attrs.update(
            site=self.site, pooling=self.pooling, logit=self.logit.tolist(), baseline=self.baseline.tolist()
        )
        return df

    def plot(self, b: int = 0, *, k: int = 12):
        """Row ``b`` in two panels (matplotlib): its top tokens' contributions as bars, and a heatmap of
        layer by attention / MLP. Returns the figure."""
        import matplotlib.pyplot as plt

        b = self._row(b)
        layers, grid = self.by_layer(b)
        fig, (ax1, ax2) = plt.subplots(
            1, 2, figsize=(11, max(3.5, 0.22 * len(layers) + 1)), gridspec_kw={"width_ratios": [1.3, 1]}
        )
        top = sorted(self.top_tokens(b, k, mode="absolute"), key=lambda t: t[0])
        labels = [f"{i}: {tok!r}" for i, tok, _ in top]
        vals = [v for _, _, v in top]
        ax1.barh(range(len(vals)), vals, color=["#d6604d" if v >= 0 else "#4393c3" for v in vals])
        ax1.set_yticks(range(len(vals)), labels, fontsize=8)
        ax1.invert_yaxis()
        ax1.axvline(0, color="black", lw=0.6)
        ax1.set_title(
            f"logit {float(self.logit[b]):+.3f} = baseline {float(self.baseline[b]):+.3f} + tokens", fontsize=10
        )
        if len(layers):
            lim = float(grid.abs().max()) or 1.0
            im = ax2.imshow(grid.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
            ax2.set_xticks([0, 1], ["attention", "MLP"])
            ax2.set_yticks(range(len(layers)), [str(x) for x in layers], fontsize=7)
            ax2.set_ylabel("layer")
            ax2.set_title("contribution by layer", fontsize=10)
            fig.colorbar(im, ax=ax2, fraction=0.046)
        else:
            ax2.axis("off")
        fig.tight_layout()
        return fig


def _kind(name: str) -> str:
    if name == "embed":
        return "embed"
    parts = name.split(".")
    return "attn_bias" if parts[-1] == "bias" else "head" if len(parts) == 4 else parts[2]


def _top(v: Tensor, k: int, mode: str) -> list[int]:
    if mode not in ("positive", "negative", "absolute"):
        raise TPCHooksError(f"mode must be 'positive', 'negative' or 'absolute'; got {mode!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise TPCHooksError(f"k must be a positive integer; got {k!r}")
    key = {"positive": v, "negative": -v, "absolute": v.abs()}[mode]
    return key.topk(min(k, len(v))).indices.tolist()


# ---------------------------------------------------------------------- the split
def _refuse(monitor: Any, adapter: Adapter) -> None:
    if adapter.engine:
        raise TPCHooksError(
            f"explain reads every block of the model in this process, which a {adapter.toolkit} engine's workers do "
            "not expose; explain with the same checkpoint loaded locally, e.g. "
            f"AutoModelForCausalLM.from_pretrained({adapter.model_name!r}) (the transformers adapter): the same "
            "weights give the same scores"
        )


def _read(monitor: Any, adapter: Adapter, prompts: Any, responses: Any, tokens: Any, answer_starts: Any) -> tuple:
    """The ids explain reads (as :meth:`Monitor.score` reads them), where answers start, and which rows
    were cut at ``max_tokens`` (a warning says how many)."""
    from ._answers import read_ids

    if prompts is not None and responses is None:
        items = check_prompts(prompts)
        full, _ = adapter.tokenize(
            items, chat_template=monitor.chat_template, max_tokens=None, prepend_bos=monitor.prepend_bos
        )
        cap = monitor.max_tokens
        cut = [cap is not None and len(i) > cap for i in full]
        if any(cut):
            warnings.warn(
                f"explain: {sum(cut)} of {len(cut)} prompts were longer than max_tokens={cap} and were cut there, "
                "as the monitor reads them (Explanation.truncated marks them)",
                stacklevel=3,
            )
        return [i if cap is None else i[:cap] for i in full], None, cut
    if prompts is not None:
        rows: list[int] = []
        ids, starts = conversation_ids(adapter, prompts, responses, **monitor._reading(), what="explain", cut=rows)
        return ids, (starts if monitor.answers else None), [i in rows for i in range(len(ids))]
    ids, given = read_ids(monitor, adapter, None, None, tokens, answer_starts)
    return ids, given, [False] * len(ids)


def _weights_prefix(head: Any, acts: Tensor, pooled: Tensor, pooling: str, res: Any) -> tuple[Tensor, Tensor, Tensor]:
    """For prefix-pooled rows: per position the weights ``w [B, T, D]`` (model units) with
    ``logit = baseline + sum_t <h_t, w_t>``, the baseline ``[B]`` and the float64 reference logit ``[B]``."""
    a = acts.double()
    m = pooled.to(a.device).bool()
    z = _pool64(a, m, pooling)
    mean, scale = head.scaler.mean.detach().to(a), head.scaler.scale.detach().to(a)
    zs = (z - mean) / scale
    bias, q = euler_gradients(head, zs, res.exit_order.detach().cpu())
    q = q.sum(1)  # [B, D]: every order's gradient over its degree
    ref = bias + (zs * q).sum(-1)
    baseline = bias - ((mean / scale) * q).sum(-1)
    g = q / scale  # the weights of the pooled vector in model units
    B, T, D = a.shape
    if pooling == "mean":
        w = m[..., None].to(a) / m.sum(1).to(a)[:, None, None] * g[:, None, :]
    elif pooling == "last":
        pos = torch.arange(T, device=a.device).expand(B, T)
        last = torch.where(m, pos, -1).amax(1)
        w = torch.zeros_like(a)
        w[torch.arange(B), last] = g
    else:  # max: each coordinate to the (first) position holding it
        at = a.masked_fill(~m[..., None], -math.inf).argmax(1)  # [B, D]
        w = torch.zeros_like(a)
        w.scatter_(1, at[:, None, :], g[:, None, :])
    return w, baseline, ref


SAE_BIAS = "sae.encoder_bias"  # an SAE monitor's part that no model part writes: the encoder's bias of active latents


def _pool64(a: Tensor, m: Tensor, pooling: str) -> Tensor:
    """:func:`~tpc_hooks.pooling.pool` in float64 (which pools in float32)."""
    if pooling == "mean":
        return (a * m[..., None]).sum(1) / m.sum(1, keepdim=True)
    if pooling == "max":
        return a.masked_fill(~m[..., None], -math.inf).amax(1)
    pos = torch.arange(m.shape[1], device=m.device).expand_as(m)
    return a[torch.arange(a.shape[0], device=a.device), torch.where(m, pos, -1).amax(1)]


def _aggregate_weights(logits: Tensor, on: Tensor, how: str, alpha: float, window: int, top_k: int) -> Tensor:
    """A per-token monitor's weight on each scored token's logit ``[T]`` at its last token (they sum to 1:
    the aggregate is ``sum_t a_t s_t``); ``on``: the scored positions."""
    a = torch.zeros(len(logits), dtype=torch.float64)
    at = on.nonzero().flatten()
    K = len(at)
    if K == 0:
        return a
    if how == "mean":
        a[at] = 1.0 / K
    elif how == "max":
        a[at[int(logits[at].argmax())]] = 1.0
    elif how == "rolling":
        n = min(K, window)
        a[at[K - n :]] = 1.0 / n
    elif how == "sctopk":  # the chosen segments, held fixed: each adds 1 / (chosen * window) to its tokens
        s = logits[at]
        if K < window:  # no whole segment yet: the mean so far
            a[at] = 1.0 / K
        else:
            c = torch.nn.functional.pad(s.cumsum(0), (1, 0))
            means = (c[window:] - c[:-window]) / window  # the segment starting at each position
            chosen = means.topk(min(top_k, len(means))).indices
            for j in chosen.tolist():
                a[at[j : j + window]] += 1.0 / (len(chosen) * window)
    else:  # ema: e_1 = s_1, e_t = alpha s_t + (1 - alpha) e_{t-1}
        i = torch.arange(1, K + 1, dtype=torch.float64)
        wts = alpha * (1 - alpha) ** (K - i)
        wts[0] = (1 - alpha) ** (K - 1)
        a[at] = wts
    return a


def _weights_tokens(monitor: Any, acts: Tensor, mask: Tensor, rule: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Any]:
    """A per-token monitor's weights ``w [B, T, D]``, baseline and float64 reference logit ``[B]``, the exit
    order of each row's heaviest token, and the rows' results (the aggregate at the last token)."""
    head = monitor.head
    a = acts.double()
    B, T, D = a.shape
    mean, scale = head.scaler.mean.detach().to(a), head.scaler.scale.detach().to(a)
    w = torch.zeros_like(a)
    baseline = torch.zeros(B, dtype=torch.float64, device=a.device)
    ref = torch.zeros(B, dtype=torch.float64, device=a.device)
    heavy = torch.ones(B, dtype=torch.long)
    logits: list[Tensor] = []
    for b in range(B):
        pos = mask[b].bool().nonzero().flatten()
        h = acts[b, pos]
        res = rule(h)
        on = scored(torch.ones(1, len(pos)), monitor.skip)[0]
        wt = _aggregate_weights(
            res.logits.detach().double().cpu(), on, monitor.aggregate, monitor.alpha, monitor.window, monitor.top_k
        )
        zs = (a[b, pos] - mean) / scale
        bias, q = euler_gradients(head, zs, res.exit_order.detach().cpu())
        q = q.sum(1)
        wt = wt.to(a)
        w[b, pos] = (wt[:, None] * q) / scale
        baseline[b] = (wt * (bias - ((mean / scale) * q).sum(-1))).sum()
        ref[b] = (wt * (bias + (zs * q).sum(-1))).sum()
        if not bool(on.any()):
            baseline[b] = ref[b] = -math.inf
        heavy[b] = int(res.exit_order[int(wt.argmax())])
        agg = aggregate_logits(
            res.logits[None].float(),
            torch.ones(1, len(pos)),
            monitor.aggregate,
            monitor.alpha,
            monitor.window,
            monitor.skip,
            monitor.top_k,
        )[0, -1]
        logits.append(agg)
    lg = torch.stack(logits).float().cpu()
    return w, baseline, ref, heavy, lg


class _Rows:
    """What :func:`explain` gathers per row, batch by batch, in the prompts' order: the rule's logits,
    probabilities and decision logits, the baseline, the float64 reference logit, the exit order, and per
    row its position-by-part table, the positions pooled and (a prefix monitor) its pooled row."""

    def __init__(self, n: int):
        self.logit, self.probs, self.decision = torch.empty(n), torch.empty(n), torch.empty(n)
        self.baseline = torch.empty(n, dtype=torch.float64)
        self.reference = torch.empty(n, dtype=torch.float64)
        self.exit_order = torch.ones(n, dtype=torch.long)
        self.table: list[Any] = [None] * n
        self.pooled: list[Any] = [None] * n
        self.rows: list[Any] = [None] * n


def _split_batch(
    monitor: Any, rule: Any, parts: Any, mask: Tensor, starts: list[int] | None, lengths: list[int]
) -> dict[str, Any]:
    """One batch's split: each row's position-by-part table, the positions pooled, the pooled rows (a
    prefix monitor), the rule's logits, probabilities and decision logits, the baseline, the float64
    reference logit and the exit order."""
    head = monitor.head
    acts = parts.site.float()
    feats = acts if monitor.sae is None else sae_encode(monitor.sae, acts)
    if feats.shape[-1] != head.d_model:
        raise TPCHooksError(f"{monitor.site} produced width {feats.shape[-1]}, expected d_model={head.d_model}")
    out: dict[str, Any] = {}
    if monitor.streaming:
        w, out["baseline"], out["reference"], out["exit_order"], lg = _weights_tokens(monitor, feats, mask, rule)
        out.update(logit=lg, probs=torch.sigmoid(lg), decision=lg, rows=None)
        pooled = torch.stack([scored(m[None], monitor.skip)[0] for m in mask.bool()]) & mask.bool()
    else:
        pooled = mask if starts is None else from_start(mask, starts)
        z = pool(feats, pooled, monitor.pooling)
        res = rule(z)
        w, out["baseline"], out["reference"] = _weights_prefix(head, feats, pooled, monitor.pooling, res)
        out.update(logit=res.logits, probs=res.probs, decision=res.decision_logits, exit_order=res.exit_order, rows=z)
        pooled = pooled.bool()
        if monitor.pooling == "last":  # the last pooled position alone
            pos = torch.arange(mask.shape[1]).expand_as(pooled)
            pooled = pos == torch.where(pooled, pos, -1).amax(1)[:, None]
    if monitor.sae is None:
        contrib = parts.contributions(w).cpu()  # [B, T, C]
    else:  # through the SAE's encoder, its gate held fixed: the model's parts, then the encoder's bias
        w_model, enc_bias = through_encoder(monitor.sae, acts, feats, w)
        contrib = torch.cat([parts.contributions(w_model), enc_bias[..., None]], -1).cpu()
    out["table"] = [contrib[j, :T] for j, T in enumerate(lengths)]
    out["pooled"] = [pooled[j, :T].cpu() for j, T in enumerate(lengths)]
    return out


@torch.no_grad()
def explain(
    monitor: Any,
    model: Any,
    prompts: Sequence[str] | None = None,
    *,
    responses: Sequence[str] | None = None,
    tokens: Sequence[Sequence[int]] | None = None,
    answer_starts: Sequence[int] | None = None,
    heads: bool = False,
    order: int | None = None,
    cascade: float | Cascade | None = None,
    batch_size: int = 8,
    tokenizer: Any = None,
    progress: bool = False,
) -> Explanation:
    """See :meth:`tpc_hooks.Monitor.explain`."""
    adapter = get_monitor_adapter(monitor, model, tokenizer)
    if not isinstance(heads, bool):
        raise TPCHooksError(f"heads must be True or False; got {heads!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise TPCHooksError(f"batch_size must be a positive integer; got {batch_size!r}")
    ids, starts, cut = _read(monitor, adapter, prompts, responses, tokens, answer_starts)
    site, rule = adapter.site(monitor.site), monitor.policy(order, cascade)
    got = _Rows(len(ids))
    names: list[str] = []
    order_by_len = np.argsort([len(t) for t in ids], kind="stable")  # batches of like lengths, as score() makes
    with tqdm(total=len(ids), desc="explain", unit="prompt", disable=not progress) as bar:
        for a0 in range(0, len(ids), batch_size):
            idx = order_by_len[a0 : a0 + batch_size]
            x, mask = pad([ids[i] for i in idx], pad_id(adapter.tokenizer), "right")
            with adapter.exclusive():
                parts = adapter.forward_parts(x, mask, site, heads=heads)
            names = parts.names + ([] if monitor.sae is None else [SAE_BIAS])
            one = _split_batch(
                monitor,
                rule,
                parts,
                mask,
                None if starts is None else [starts[i] for i in idx],
                [len(ids[i]) for i in idx],
            )
            for j, i in enumerate(idx):
                got.table[i], got.pooled[i] = one["table"][j], one["pooled"][j]
                got.rows[i] = None if one["rows"] is None else one["rows"][j]
            for key in ("logit", "probs", "decision", "baseline", "reference", "exit_order"):
                getattr(got, key)[idx] = one[key].detach().cpu().to(getattr(got, key).dtype)
            bar.update(len(idx))
    attr = None
    if not monitor.streaming:
        rows = torch.stack(got.rows).cpu()
        res = rule(rows)  # every row at once, in the prompts' order, as score() scores them (bit for bit)
        got.logit, got.probs, got.decision = (
            t.detach().float().cpu() for t in (res.logits, res.probs, res.decision_logits)
        )
        attr = attribute(monitor, rows, order=got.exit_order)
    tok = adapter.tokenizer
    return Explanation(
        logit=got.logit,
        baseline=got.baseline,
        exit_order=got.exit_order,
        tokens=[[str(tok.decode([t])) for t in row] for row in ids],
        token_ids=[list(row) for row in ids],
        pooled=got.pooled,
        by_token=[t.sum(1) for t in got.table],
        components=names,
        by_component=torch.stack([t.sum(0) for t in got.table]),
        token_by_component=got.table,
        attribution=attr,
        truncated=cut,
        site=monitor.site,
        pooling=monitor.pooling,
        threshold=float(monitor.threshold),
        probs=got.probs,
        decision_logits=got.decision,
        prompts=None if prompts is None else list(prompts),
        extra={"reference_logit": got.reference, "heads": heads, "model": adapter.model_name},
    )


def get_monitor_adapter(monitor: Any, model: Any, tokenizer: Any) -> Adapter:
    """The monitor's checked adapter of ``model`` (:meth:`Monitor._adapter`), the vLLM engine refused first
    with explain's own words."""
    from ..activations import get_adapter

    adapter = get_adapter(model, tokenizer=tokenizer)
    _refuse(monitor, adapter)
    return monitor._adapter(adapter)
