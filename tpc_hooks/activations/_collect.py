"""Collecting pooled activations from a model's hook points."""

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .._errors import TPCHooksError
from ..data import check_prompts
from ..pooling import POOLINGS, pool
from ..sae import check_sae, sae_dims, sae_encode, sae_identity
from ._adapter import Adapter, get_adapter
from ._batching import pad, pad_id, resolve_bos
from ._sites import Site
from ._store import ActivationStore

log = logging.getLogger(__name__)

TOKEN = "token"  # collect's per-token "pooling": every token's row, one [T_i, d] tensor per prompt


def pooled_batches(
    adapter: Adapter,
    token_ids: list[list[int]],
    sites: list[Site],
    pooling: str,
    batch_size: int,
    padding_side: str = "right",
    bar: Any = None,
    sae: Any = None,
    starts: list[int] | None = None,
) -> dict[str, Tensor]:
    """Pooled activations ``[n, d_model]`` per site for tokenised prompts, in their order
    (``[n, d_sae]`` SAE latents, encoded per token before pooling, when ``sae`` is given).
    ``starts``: per sequence, the tokens before it that are read but not pooled (a response
    monitor's prompt).

    Batches group prompts of similar length (less padding); the result does not depend on it.
    The pooled rows stay on the model's device until every batch is done, then reach the host
    in one copy per site (no read back per batch).
    """
    order = np.argsort([len(t) for t in token_ids], kind="stable")
    width = adapter.d_model if sae is None else sae_dims(sae)[1]
    parts: dict[str, list[Tensor]] = {s.name: [] for s in sites}
    pid = pad_id(adapter.tokenizer)
    for a in range(0, len(order), batch_size):
        idx = order[a : a + batch_size]
        ids, mask = pad([token_ids[i] for i in idx], pid, padding_side)
        with adapter.exclusive():  # one pass at a time per model (threads may share it)
            acts = adapter.forward_sites(ids, mask, sites)
        pooled = mask if starts is None else from_start(mask, [starts[i] for i in idx])
        for s in sites:
            if acts[s.name].shape[-1] != adapter.d_model:
                raise TPCHooksError(
                    f"{s.name} produced width {acts[s.name].shape[-1]}, expected d_model={adapter.d_model}"
                )
            z = acts[s.name] if sae is None else sae_encode(sae, acts[s.name])
            parts[s.name].append(pool(z, pooled, pooling))
        if bar is not None:
            bar.update(len(idx))
    out = {}
    where = torch.as_tensor(order)
    for s in sites:
        rows = torch.cat(parts[s.name]).cpu() if parts[s.name] else torch.empty(0, width)
        out[s.name] = torch.empty(len(token_ids), width)
        out[s.name][where] = rows  # back in the prompts' order
    return out


def from_start(mask: Tensor, starts: list[int]) -> Tensor:
    """``mask [B, n]`` without each row's first ``starts[b]`` attended tokens (either padding side).

    Example:
        >>> from_start(torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]), [1, 3]).tolist()
        [[0, 0, 1, 1], [0, 0, 0, 1]]
    """
    rank = mask.long().cumsum(1)  # 1-based index of each attended token
    return mask * (rank > torch.as_tensor(starts, device=mask.device)[:, None]).to(mask.dtype)


def token_batches(
    adapter: Adapter,
    token_ids: list[list[int]],
    sites: list[Site],
    batch_size: int,
    bar: Any = None,
    sae: Any = None,
    to_host: bool = True,
    padding_side: str = "right",
) -> dict[str, list[Tensor]]:
    """Per-token activations ``[T_i, d_model]`` (float32; SAE latents with ``sae``) of each
    tokenised prompt at ``sites``, in the prompts' order: what a per-token monitor reads.
    Batched by length, one forward pass per batch; ``to_host=False`` leaves them on the
    model's device."""
    order = np.argsort([len(t) for t in token_ids], kind="stable")
    out: dict[str, list[Any]] = {s.name: [None] * len(token_ids) for s in sites}
    pid = pad_id(adapter.tokenizer)
    for a in range(0, len(order), batch_size):
        idx = order[a : a + batch_size]
        ids, mask = pad([token_ids[i] for i in idx], pid, padding_side)
        with adapter.exclusive():  # one pass at a time per model (threads may share it)
            acts = adapter.forward_sites(ids, mask, sites)
        width = ids.shape[1]
        for s in sites:
            if acts[s.name].shape[-1] != adapter.d_model:
                raise TPCHooksError(
                    f"{s.name} produced width {acts[s.name].shape[-1]}, expected d_model={adapter.d_model}"
                )
            a_s = acts[s.name] if sae is None else sae_encode(sae, acts[s.name])
            a_s = a_s.float().cpu() if to_host else a_s.float()
            for j, i in enumerate(idx):
                n = len(token_ids[i])
                out[s.name][i] = a_s[j, width - n :] if padding_side == "left" else a_s[j, :n]
        if bar is not None:
            bar.update(len(idx))
    return out


def cost_line(who: str, parts: dict[str, int], note: str = "") -> str:
    """What a collection is about to cost, said before it runs: one forward pass per text, by part
    (parts of none left out), e.g. ``"train_monitor: 1,383 forward passes: 383 prompts, 1,000
    calibration"``.

    Example:
        >>> cost_line("evaluate", {"prompts": 1200, "rewrites": 0, "calibration": 40})
        'evaluate: 1,240 forward passes: 1,200 prompts, 40 calibration'
    """
    each = ", ".join(f"{v:,} {k}" for k, v in parts.items() if v)
    return f"{who}: {sum(parts.values()):,} forward passes: {each}" + (f" ({note})" if note else "")


def prompts_digest(prompts: Sequence[str]) -> str:
    """The SHA-256 of a list of prompts in order (of its JSON): what a store or a report records
    to tell whether the same prompts come back.

    Example:
        >>> prompts_digest(["a", "b"]) == prompts_digest(["a", "b"]) != prompts_digest(["b", "a"])
        True
    """
    return hashlib.sha256(json.dumps(list(prompts)).encode()).hexdigest()


def _fingerprint(
    adapter: Adapter,
    site: str,
    pooling: str,
    chat_template: bool | None,
    prepend_bos: bool | None,
    max_tokens: int | None,
    prompts: list[str] | None,
    tokens: list[list[int]],
    sae: Any,
) -> dict[str, Any]:
    """What a store's collection is: a rerun resumes it only when all of this agrees."""
    fp = {
        "model": adapter.model_name,
        "d_model": adapter.d_model,
        "site": site,
        "pooling": pooling,
        "chat_template": chat_template,
        "prepend_bos": prepend_bos,
        "max_tokens": max_tokens,
        "n_prompts": len(tokens),
    }
    if prompts is not None:
        fp["prompts_sha256"] = prompts_digest(prompts)
    else:  # pre-tokenised input: the ids are the collection
        fp["tokens_sha256"] = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()
    fp["sae"] = None if sae is None else sae_identity(sae)["weights_sha256"]
    if pooling == TOKEN:  # how many leading rows of every sequence are the shared prefix (None: unknown)
        fp["fixed_prefix"] = (
            None  # pre-tokenised input (which has no chat_template setting)
            if prompts is None or chat_template is None
            else adapter.fixed_prefix(chat_template=chat_template, prepend_bos=prepend_bos)
        )
    return fp


def collect(
    model: Any,
    prompts: Sequence[str] | None = None,
    sites: Sequence[str] | str = ("blocks.0.hook_resid_post",),
    pooling: str = "mean",
    *,
    tokens: Sequence[Any] | None = None,
    batch_size: int = 8,
    chat_template: bool = False,
    prepend_bos: bool | None = None,
    max_tokens: int | None = 512,
    padding_side: str = "right",
    store: str | os.PathLike | None = None,
    shard_prompts: int = 256,
    remote: bool = False,
    sae: Any = None,
    tokenizer: Any = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Residual-stream activations of ``prompts`` at ``sites``, pooled per prompt or per token,
    one forward pass per batch.

    The forward pass stops after the deepest requested layer. Pooling uses the attention
    mask, so a prompt's vector (or rows) does not depend on its batch or the padding side.

    Args:
        model: a TransformerLens ``HookedTransformer``/``TransformerBridge``, an nnsight
            ``LanguageModel``, or a Hugging Face ``transformers`` causal LM.
        prompts: the texts (prompt order is kept in the result).
        sites: TransformerLens hook names, e.g. ``"blocks.6.hook_resid_post"``.
        pooling: ``"mean"``, ``"last"`` or ``"max"`` over the prompt's tokens, or ``"token"``:
            no pooling, every token's row (what a streaming monitor, ``pooling="token"``, reads).
        tokens: token id lists (or 1-D tensors) instead of ``prompts`` (e.g. a conversation you
            rendered yourself), read as given: ``chat_template``, ``prepend_bos`` and
            ``max_tokens`` do not apply.
        batch_size: prompts per forward pass.
        chat_template: wrap each prompt as the user turn of the tokenizer's chat template.
        prepend_bos: prepend the BOS token (default: when the tokenizer has one; never with a
            chat template). Applied the same way in every adapter.
        max_tokens: longer prompts are truncated (a warning counts them); None for no limit.
        padding_side: ``"right"`` or ``"left"``; the result is the same either way.
        store: a directory to stream rows to (one :class:`ActivationStore` per site, sharded,
            atomic). Rerun after an interruption, it resumes where it stopped: no row is
            lost or duplicated. Peak memory is one shard, not the data set. With
            ``pooling="token"`` the store holds sequences (``store.sequences()`` reads them
            back, one ``[T_i, d_model]`` array per prompt) and its ``meta`` records
            ``"pooling": "token"`` and ``"fixed_prefix"``: the leading tokens every prompt
            shares (BOS, the chat template's system prompt and header;
            :meth:`~tpc_hooks.adapters.Adapter.fixed_prefix`; None for ``tokens``), which a
            streaming monitor neither trains on nor scores.
        shard_prompts: prompts per shard when streaming.
        remote: nnsight models only: run the traces on NDIF (``trace(remote=True)``).
        sae: an SAELens SAE for the (single) site: activations are encoded into SAE latents
            per token, then pooled; rows are ``[n_prompts, d_sae]`` (``[T_i, d_sae]`` per token).
        tokenizer: the tokenizer of a ``transformers`` model (default: loaded from its
            ``name_or_path``); a toolkit model uses its own (see :func:`~tpc_hooks.adapters.get_adapter`).
        progress: show a progress bar.

    Returns:
        ``{site: float32 tensor [n_prompts, d_model]}``; with ``pooling="token"``,
        ``{site: [float32 tensor [T_i, d_model] for each prompt]}`` (every token of the prompt as
        tokenised, the fixed prefix included); or ``{site: ActivationStore}`` with ``store``.

    Raises:
        TPCHooksError: no prompts (or both ``prompts`` and ``tokens``), an unknown site or
            pooling, a bad ``batch_size``, ``sae`` with several sites, or a ``store`` that holds
            a different collection.

    Example:
        >>> acts = tpc.collect(model, ["How do I bake bread?"], sites=["blocks.6.hook_resid_post"])  # doctest: +SKIP
        >>> acts["blocks.6.hook_resid_post"].shape  # doctest: +SKIP
        torch.Size([1, 576])
        >>> rows = tpc.collect(model, ["How do I bake bread?", "Hi"], "blocks.6.hook_resid_post",  # doctest: +SKIP
        ...                    pooling="token", chat_template=True)["blocks.6.hook_resid_post"]
        >>> [r.shape for r in rows]  # doctest: +SKIP
        [torch.Size([31, 576]), torch.Size([26, 576])]
        >>> st = tpc.collect(model, prompts, "blocks.6.hook_resid_post", pooling="token",  # doctest: +SKIP
        ...                  store="acts/")["blocks.6.hook_resid_post"]
        >>> st.meta["fixed_prefix"], [a.shape for a in st.sequences(0, 2)]  # doctest: +SKIP
    """
    if (prompts is None) == (tokens is None):
        raise TPCHooksError("pass prompts (texts) or tokens (token id lists), exactly one")
    items = check_prompts(prompts) if prompts is not None else None
    adapter = get_adapter(model, remote=remote, tokenizer=tokenizer)
    site_list = [sites] if isinstance(sites, str) else list(sites)
    if not site_list:
        raise TPCHooksError("sites is empty; name at least one hook point, e.g. 'blocks.0.hook_resid_post'")
    parsed = [adapter.site(s) for s in dict.fromkeys(site_list)]
    per_token = pooling == TOKEN
    if not per_token and pooling not in POOLINGS:
        raise TPCHooksError(f"pooling must be one of {[*POOLINGS, TOKEN]}; got {pooling!r}")
    if sae is not None:
        if len(parsed) != 1:
            raise TPCHooksError("sae= encodes one site's activations; collect one site at a time")
        check_sae(sae, adapter.d_model, parsed[0].name)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise TPCHooksError(f"batch_size must be a positive integer; got {batch_size!r}")
    if padding_side not in ("left", "right"):
        raise TPCHooksError(f"padding_side must be 'left' or 'right'; got {padding_side!r}")
    if items is not None:
        bos = resolve_bos(adapter.tokenizer, prepend_bos, chat_template)
        token_ids, n_trunc = adapter.tokenize(
            items, chat_template=chat_template, max_tokens=max_tokens, prepend_bos=bos
        )
        if n_trunc:
            log.warning(
                "%d of %d prompts were longer than max_tokens=%s and were truncated", n_trunc, len(items), max_tokens
            )
        settings: tuple[Any, Any, Any] = (chat_template, bos, max_tokens)
    else:
        token_ids = check_tokens(tokens)
        settings = (None, None, None)

    def batches(ids: list[list[int]], todo: list[Site], bar: Any) -> dict[str, Any]:
        if per_token:
            return token_batches(adapter, ids, todo, batch_size, bar, sae, padding_side=padding_side)
        return pooled_batches(adapter, ids, todo, pooling, batch_size, padding_side, bar, sae)

    if store is None:
        with tqdm(total=len(token_ids), desc="collect", unit="prompt", disable=not progress) as bar:
            return batches(token_ids, parsed, bar)

    root = Path(store)
    stores: dict[str, ActivationStore] = {}
    for s in parsed:
        fp = _fingerprint(adapter, s.name, pooling, *settings, items, token_ids, sae)
        width = adapter.d_model if sae is None else sae_dims(sae)[1]
        st = ActivationStore.create(root / s.name, width, meta={**fp, "done": 0}, exist_ok=True, sequences=per_token)
        old = {k: v for k, v in st.meta.items() if k != "done"}
        if old != fp:
            diff = sorted(k for k in {*fp, *old} if old.get(k) != fp.get(k))
            raise TPCHooksError(
                f"{root / s.name} holds a different collection (differs in {diff}); use another store directory"
            )
        held = st.n_sequences if per_token else len(st)
        if held != st.meta["done"]:
            raise TPCHooksError(
                f"{root / s.name}: manifest says {st.meta['done']} prompts done but holds {held} "
                f"{'sequences' if per_token else 'rows'}"
            )
        stores[s.name] = st
    start = min(st.meta["done"] for st in stores.values())
    if start:
        log.info("resuming collection at prompt %d of %d", start, len(token_ids))
    n = len(token_ids)
    with tqdm(total=n, initial=start, desc="collect", unit="prompt", disable=not progress) as bar:
        # Each site resumes where its own store stopped (sites may have stopped at different prompts, and a
        # resumed run may use another shard_prompts): the sites furthest behind go first, and a shard ends
        # where another site's store stopped, so the sites then go on together.
        while (a := min(st.meta["done"] for st in stores.values())) < n:
            ahead = [st.meta["done"] for st in stores.values() if st.meta["done"] > a]
            b = min([a + shard_prompts, n] + ahead)
            todo = [s for s in parsed if stores[s.name].meta["done"] == a]
            rows = batches(token_ids[a:b], todo, bar)
            for s in todo:
                if per_token:
                    seqs = rows[s.name]
                    stores[s.name].append(torch.cat(seqs).numpy(), lengths=[len(x) for x in seqs], meta={"done": b})
                else:
                    stores[s.name].append(rows[s.name].numpy(), meta={"done": b})
    return stores


def check_tokens(tokens: Any) -> list[list[int]]:
    """Token id lists, checked: a non-empty list of non-empty lists of non-negative integers."""
    try:
        ids = [[int(t) for t in row] for row in tokens]
    except (TypeError, ValueError):
        raise TPCHooksError("tokens must be a list of token id lists (integers)") from None
    if not ids or any(len(row) == 0 for row in ids):
        raise TPCHooksError("tokens must be a non-empty list of non-empty token id lists")
    if any(t < 0 for row in ids for t in row):
        raise TPCHooksError("tokens must hold non-negative token ids")
    return ids
