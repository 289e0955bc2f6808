"""``train_monitor``: a model and labelled prompts in, a calibrated :class:`~tpc_hooks.Monitor` out.

It reads as the steps it takes: check every argument before the model runs
(:func:`~tpc_hooks.training._train_request.check_request`, into a
:class:`~tpc_hooks.training._train_request.Request`), then, each a function below, build the
prompts one collection pass reads (:func:`_texts`: the prompts, their rewrites, intent flips and
homonyms), collect their rows at every candidate site (:func:`_collect`) and the hosted chats
(:func:`_collect_chats`), assemble each site's :class:`~tpc_hooks.training._train.TrainData` and
the :class:`~tpc_hooks.training._train.TrainPlan`, then hand both to
:func:`~tpc_hooks.training._train.train`, which trains, calibrates and reports: the recipe
``tpc-hooks train`` runs on the rows ``tpc-hooks collect`` wrote.
"""

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..activations import collect, cost_line, prompts_digest, token_batches
from ..data import HOMONYM, STATED, PromptSet, homonym_examples, host_splits, intent_flips, rewrites, stated_flips
from ..head import FitConfig
from ..monitoring import Monitor, MonitorConfig, conversation_ids
from ..pooling import TOP_K, pool_prefixes
from ..recipes import Recipe
from ._options import OPTIONS, TrainOptions
from ._refit import last_step, refits
from ._rows_cache import RowsCache
from ._train import (
    CALIBRATION,
    INTENT,
    PLAIN,
    Chats,
    Examples,
    TrainData,
    TrainPlan,
    train,
    val_sources,
)
from ._train_request import Request, check_request


def train_monitor(
    model: Any,
    prompts: Sequence[str],
    labels: Any,
    site: str | Sequence[str],
    pooling: str = "mean",
    *,
    # what it trains on, and where its threshold sits
    responses: Sequence[str] | None = None,
    recipe: Recipe | str | None = None,  # a name: deprecated
    target_fpr: float | None = 0.01,
    calibration: Sequence[str] | None = None,
    sources: Sequence[str] | None = None,
    everyday: Sequence[str] | None = None,
    validation: Any = None,  # (prompts, labels) or (prompts, labels, sources)
    val_fraction: float = 0.2,
    split: str = "stratified",
    # the fit
    config: FitConfig | None = None,
    degree: int | None = None,
    rank: int | Sequence[int] | None = None,
    seed: int | None = None,
    tau: float | None = None,
    sae: Any = None,
    # a per-token monitor (pooling="token")
    aggregate: str | None = None,
    alpha: float = 0.1,
    window: int = 16,
    top_k: int = TOP_K,
    contexts: Any = None,
    context_tokens: int | Sequence[int] = (512, 1024),
    # reading the model
    chat_template: bool | None = None,
    prepend_bos: bool | None = None,
    max_tokens: int | None = 512,
    batch_size: int = 8,
    tokenizer: Any = None,
    rows_cache: Any = None,
    verbose: bool = True,
    **fit_kwargs: Any,
) -> Monitor:
    """Collects activations at ``site`` and trains a TPC monitor on them, in one call.

    The default recipe (:func:`tpc_hooks.recipes.default`) promises one thing first: at its deployed
    threshold the monitor catches at least what a plain linear probe trained on the same prompts
    catches at the same rate on everyday traffic. It trains on the prompts as given; order 1 is that
    probe (scikit-learn's logistic regression, ``C`` by validation AUROC). Each validation prompt is
    also rewritten by every phrasing family (``tpc_hooks.data.PHRASING_FAMILIES``), which the fit
    neither trains nor selects on; an order above 1 is kept only when it flags significantly more
    harmful validation prompts than the order below it and, on every family, no fewer than order 1
    (``report["orders"]`` says which and why). Most often that keeps order 1 alone: the floor, not
    the goal (docs/benchmarks/constructions.md has the measurements). The opt-in presets
    (:mod:`tpc_hooks.recipes`: ``phrasing()``, ``intent()``, ``in_distribution()``, ``paper()``)
    trade recall for other goals, each with its price measured.

    Without ``validation=`` the site, ``C`` and the orders are chosen on a held-out ``val_fraction``
    of the prompts, then the kept orders are refit on every prompt with those choices (order 1
    alone, the probe: its site and ``C`` chosen again by the AUROC of every prompt's out-of-fold
    scores), and the threshold flags at most ``target_fpr`` of the benign prompts' out-of-fold scores
    (5 folds, each scored by the same head refit on the other four; of the ``everyday`` sources when
    named) and of the ``calibration`` prompts: every labelled prompt trains the deployed head
    (``report["refit"]``). With the presets that train on rewrites or intent flips, a cascade
    (``tau``) or ``pooling="token"``, the head trains on the split and the operating point is set on
    the benign validation prompts as given (not their rewrites or intent flips), of the
    ``everyday`` sources when named (:meth:`Monitor.calibrate_activations`); a cascade exits around
    that threshold. With a few hundred benign validation prompts, 1% is a handful of them
    (``report["operating_point"]["fpr_interval_95"]`` says where the rate on new traffic may lie):
    give a larger sample of your own benign traffic as ``calibration`` (or recalibrate with
    :meth:`Monitor.calibrate` before deploying).

    Args:
        model: a TransformerLens, nnsight or plain ``transformers`` model.
        prompts, labels: texts and their labels (1 = harmful).
        site: where to read, or several sites: all are collected in one pass and the one whose
            linear probe has the best worst-group recall at 1% false-positive rate on validation
            is kept (``monitor.report["site_selection"]`` has the table); when order 1 alone is
            kept and refit on every prompt, the site is chosen again with its ``C`` by out-of-fold
            AUROC (``report["refit"]["site"]``).
        pooling: how to pool tokens (``"mean"``, ``"last"``, ``"max"``), or ``"token"`` for a
            streaming monitor: the head is trained on every token's activation, each token
            labelled with its prompt's label, and scores are aggregated over time. The tokens
            every prompt starts with (BOS, the chat template's system prompt and header; see
            ``Monitor.skip``) are neither trained on nor scored.
        responses: an answer per prompt, for a response monitor (``reads="answer"``): each
            (prompt, response) is a conversation, ``labels`` label the conversations
            (:func:`tpc_hooks.data.conversation_labels`: harmful when the request is and the answer
            does not refuse; :class:`~tpc_hooks.Answers` gives the model's own answers and their
            labels). Its rows are the answer's steps: step ``t`` pools the answer's first ``t``
            tokens (``pooling``; the prompt is read, not pooled), every step labelled with its
            conversation, as generation scores them. A conversation counts as flagged when any
            step reaches the threshold, on validation and for ``target_fpr``; pass the groups as
            ``sources`` with ``everyday=["benign"]`` to set the threshold on benign conversations
            alone and report the refused ones apart. The head trains on the split (no refit on
            every conversation), at one site; the recipe's rewrites and intent flips, which rewrite
            prompts, and ``contexts``, ``calibration``, ``validation`` and ``rows_cache`` are
            refused. A conversation past ``max_tokens`` keeps the answer's first tokens that fit
            (a warning, and ``report["responses"]["truncated"]``).
        recipe: a preset of :mod:`tpc_hooks.recipes` (default: ``tpc.recipes.default()``): what is
            trained on beside the prompts (phrasing rewrites, intent flips, homonyms), what
            validation groups select, and whether orders that do not earn their terms are pruned
            (each order at its own threshold flagging ``target_fpr`` of the benign validation
            prompts; the head is truncated to the last order kept: :meth:`TPC.truncated`).
        target_fpr: the share of the benign validation prompts (as given) the threshold may flag;
            None keeps 0.5.
        calibration: everyday benign traffic, unlabelled (taken as benign), none of it among
            ``prompts``: collected after the validation prompts, it joins the rows the threshold is
            set on (and each order's, when orders are pruned), as source ``"calibration"``; neither
            the fit nor the site choice reads it. A 1% threshold set on 150 prompts sits on one or
            two of them; on 1000 more it sits on ten. ``tpc.data.everyday_prompts(1000,
            exclude=prompts)`` draws ShareGPT first turns. ``tpc.evaluate`` needs the same list to
            calibrate its probe the same way.
        sources: where each prompt comes from (a dataset, a product surface), one name per
            prompt: the threshold is still set on every benign validation prompt together, and
            ``report["operating_point"]`` adds the rate it flags on each source's
            (``by_source``, ``spread``, ``worst_source``; the hosted chats are ``"contexts"``):
            :meth:`Monitor.calibrate_activations`. A threshold at 1% of a mixture can flag several
            times that of one source (docs/benchmarks/constructions.md).
        everyday: the sources (names in ``sources``) of everyday benign traffic: the threshold,
            and each order's when orders are pruned, is set on their benign validation prompts
            only; the other sources (e.g. benign requests inside jailbreak templates) are
            reported beside it. Default: every benign prompt. For the packaged set:
            ``sources=tpc.data.source_names(train), everyday=tpc.data.EVERYDAY_SOURCES``.
        validation: your own validation prompts, ``(prompts, labels)`` (or ``(prompts, labels,
            sources)`` when ``sources`` is given), none of them among ``prompts``: the site, ``C``,
            the orders kept and the threshold are chosen on them, and the fit trains on every one of
            ``prompts`` (``val_fraction`` and ``split`` are then not used); when order 1 alone is
            kept, its site and ``C`` are chosen again by validation AUROC, as a probe's are
            (``report["rechosen"]``). For the packaged set: its ``val`` split.
        val_fraction: without ``validation``, the share of ``prompts`` held out as the validation
            split (model selection and report; with the default recipe the kept orders are then
            refit on every prompt and the threshold set out-of-fold).
        split: ``"stratified"`` (default: scikit-learn's stratified split) or ``"grouped"``:
            prompts that share an 8-word run (one jailbreak template around two requests,
            near-duplicates) stay on one side, so validation, and the selection and threshold set
            on it, sees no text the fit trained on (without shared text it is the stratified
            split). What it changes on sets built by another hand, and why it is not the default:
            docs/benchmarks/constructions.md ("The grouped split as the default").
        config, degree, rank, seed, verbose, **fit_kwargs: passed to :func:`tpc_hooks.fit` (a
            :class:`~tpc_hooks.FitConfig` and/or its fields; ``degree``, ``rank`` and ``seed``
            override ``config`` only when given; ``seed`` also draws the validation split and
            the rewrites). ``augment=``, ``intent=`` and ``prune_orders=`` still build the recipe
            (deprecated: they are the presets' own arguments now).
        tau: if given, the monitor's policy is a cascade at ``tau``, calibrated on validation.
        sae: an SAELens SAE for ``site``: train on its latents (pooled per prompt), so
            attribution reads in feature ids.
        aggregate, alpha, window, top_k: a streaming monitor's aggregation (see :class:`Monitor`;
            ``"sctopk"``: the mean of the ``top_k`` best segments of ``window`` tokens, and the head is
            then trained on that aggregate, each prompt and hosted chat a sequence:
            ``FitConfig.objective``; ``objective="token"`` trains it token by token).
            Its report and operating point count a prompt as flagged when the aggregate
            reaches the threshold at any token. Default: ``"max"`` with ``contexts`` (the
            best at long contexts once the head has seen requests inside conversations),
            ``"rolling"`` without (trained on short prompts only, a running max flags more
            long benign chats the longer they are; docs/benchmarks/long-contexts.md).
        contexts: benign chat conversations (``[{"role", "content"}]`` turns, user first) to
            train a per-token monitor on requests *inside* conversations as well, or a number
            of ShareGPT contexts to draw (:func:`tpc_hooks.data.sharegpt_contexts`, the prompts
            excluded). Each context hosts one training or validation prompt (as given, not a
            rewrite; the classes balanced, in a seeded order) in place of its first, middle or
            last user turn, its budget the ``context_tokens`` in turn
            (:func:`tpc_hooks.data.host_requests`); its tokens before the request are benign
            rows, the request's turn carries the prompt's label, and after a harmful request the
            rest is dropped (:func:`tpc_hooks.data.token_labels`). 1000 contexts (as measured:
            docs/benchmarks/long-contexts.md) keep the short-prompt recall at 2k tokens; 300 did
            not. A ``val_fraction`` share of the contexts (at least 2) is held out: it joins model
            selection (group ``"contexts"``), the report (``report["contexts"]``) and, for its
            benign sequences, the operating point, so the threshold holds on long benign chats.
            Needs a chat template.
        context_tokens: each context's token budget, or several used in turn (512, 1024).
        chat_template: wrap prompts as chat user turns; default: when the tokenizer has a template.
        prepend_bos: prepend BOS to raw prompts; default: when the tokenizer has a BOS token.
        max_tokens, batch_size: the tokens read per prompt and the prompts per forward pass.
        tokenizer: the tokenizer of a ``transformers`` model (default: loaded from its
            ``name_or_path``); toolkit models use their own.
        rows_cache: a dict (any mutable mapping) the call fills with each text's pooled row at
            each site it reads, and reads back: a later call given the same dict runs the model
            only on the texts no earlier call read the same way, e.g. to compare recipes or
            settings on the same prompts. A row is reused only for the same reading: the same
            model object (its ``id()``, name and ``d_model``), site, pooling, ``chat_template``,
            BOS, ``max_tokens`` and SAE; keys are ``(reading, text)`` pairs. Use one dict per
            model (an ``id()`` is only unique while its object lives). The rows read back equal a
            fresh collection's up to rounding: a prompt's pooled row does not depend on its batch
            or padding beyond floating-point rounding (a batch of other prompts pads it
            differently), so a monitor trained from a filled cache can differ from one trained
            without by that rounding; with ``batch_size=1`` they are identical. Pooled monitors
            only (not ``pooling="token"``).

    Returns:
        A :class:`Monitor`; ``monitor.report`` holds validation metrics per order (on the
        validation prompts as given), the worst validation group's, and the site choice.

    Example:
        >>> monitor = tpc.train_monitor(model, prompts, labels,  # doctest: +SKIP
        ...                             site=[f"blocks.{l}.hook_resid_post" for l in (10, 15, 20)],
        ...                             recipe=tpc.recipes.intent())
    """
    given = locals()  # the options, by the names of TrainOptions' fields (a test holds the two lists equal)
    options = TrainOptions(**{k: given[k] for k in OPTIONS}, fit=fit_kwargs)
    request = check_request(model, prompts, labels, site, pooling, options)
    texts = _texts(request)
    plan = _plan(request, texts)
    passes = texts.passes(len(request.items))
    if verbose:  # what the collection costs, said before it runs
        tqdm.write(cost_line("train_monitor", passes), file=sys.stderr)
    cut: list[int] = []  # a response monitor's conversations cut to max_tokens
    if request.responses is not None:
        rows = _answer_steps(request, texts, cut)
    else:
        rows = _collect(request, texts, None if rows_cache is None else RowsCache(rows_cache, request, model))
    chats = _collect_chats(request)
    data = {s: _train_data(rows[s], texts, request, chats) for s in request.sites}
    monitor = train(data, plan, sae=sae, verbose=verbose, **options.fit_args)
    del data  # the split's rows (copies): freed before the last step reads every prompt's
    if request.responses is not None:
        monitor = _answer_monitor(monitor, request, cut)
    last_step(monitor, request, texts.at, rows, plan)
    # how the prompts were split: what tpc.evaluate needs to train its probe on the same rows
    monitor.report["split"] = (
        {
            "validation": "given",
            "n_val": len(request.va),
            "val_sha256": prompts_digest(request.items[len(request.tr) :]),
            "seed": request.cfg.seed,
            "n_calibration": len(request.calibration),
        }
        if request.validation_given
        else {
            "val_fraction": options.val_fraction,
            "split": split,
            "seed": request.cfg.seed,
            "n_calibration": len(request.calibration),
        }
    )
    monitor.report["forward_passes"] = passes
    if request.calibration:  # what tpc.evaluate checks the calibration prompts it is given against
        monitor.report["split"]["calibration_sha256"] = prompts_digest(request.calibration)
    return monitor


@dataclass(frozen=True)
class _Texts:
    """The prompts one collection pass reads, in order: the prompts (training and validation), the
    training rewrites, the validation rewrites (every family), the training flips, the validation
    flips (every kind) and homonyms, the training homonym rows, the calibration prompts; with every text's label, the
    positions of each part (``at``) and the validation rows' groups."""

    texts: list[str]
    labels: np.ndarray
    at: dict[str, list[Any]]  # text positions (numpy or Python integers)
    groups: np.ndarray
    flips: PromptSet

    def passes(self, n_prompts: int) -> dict[str, int]:
        """The forward passes each part of the collection takes, one per text: the prompts, the
        phrasing rewrites, the intent flips and homonym rows, the calibration prompts."""
        rewrites = len(self.at["rewrites"]) + len(self.at["views"])
        calibration = len(self.at["calibration"])
        return {
            "prompts": n_prompts,
            "phrasing rewrites": rewrites,
            "intent flips and homonyms": len(self.texts) - n_prompts - rewrites - calibration,
            "calibration": calibration,
        }

    @property
    def at_val(self) -> list[Any]:
        """The validation rows: the prompts as given, their rewrites, the group :data:`INTENT`, then
        the calibration prompts (group :data:`CALIBRATION`)."""
        return self.at["val"] + self.at["views"] + self.at["intent"] + self.at["calibration"]


def _texts(r: Request) -> _Texts:
    """The rewrites, intent flips and homonym rows of the split prompts (seeded by the fit's seed),
    joined to the prompts into one list of texts to collect."""
    items, y, tr, va, seed = r.items, r.y, r.tr, r.va, r.cfg.seed
    none = PromptSet([], [], [], [], [])
    aug = rewrites([items[i] for i in tr], y[tr], r.families, seed=seed) if r.families else none
    viewed = r.families + r.shifts  # validation: the trained families, then those held out of training
    views = rewrites([items[i] for i in va], y[va], viewed, every_family=True, seed=seed) if viewed else none
    flips = intent_flips([items[i] for i in tr], y[tr], r.flip_kinds, seed=seed) if r.flip_kinds else none
    homs = homonym_examples() if HOMONYM in r.kinds else none  # the training verbs' homonyms, benign
    if STATED in r.kinds:  # the stated-act rows join them: the orders above 1 train on them, order 1 does not
        homs = homs + stated_flips([items[i] for i in tr], y[tr], seed=seed)
    val_homs = homonym_examples(verbs="val") if HOMONYM in r.kinds else none  # benign, in the group INTENT
    val_flips = (
        intent_flips([items[i] for i in va], y[va], r.flip_kinds, every_kind=True, seed=seed) if r.flip_kinds else none
    )
    texts = (
        list(items)
        + aug.texts
        + views.texts
        + flips.texts
        + val_flips.texts
        + val_homs.texts
        + homs.texts
        + list(r.calibration)
    )
    n, cuts = (
        len(items),
        np.cumsum(
            [
                len(items),
                len(aug),
                len(views),
                len(flips),
                len(val_flips) + len(val_homs),
                len(homs),
                len(r.calibration),
            ]
        ),
    )
    at = {
        "train": list(tr),
        "val": list(va),
        "rewrites": list(range(n, cuts[1])),
        "views": list(range(cuts[1], cuts[2])),
        "flips": list(range(cuts[2], cuts[3])),
        "homonyms": list(range(cuts[4], cuts[5])),
        # the group INTENT: every harmful validation prompt as given, then the flips and homonyms
        "intent": ([int(i) for i in va if y[i] == 1] if r.kinds else []) + list(range(cuts[3], cuts[4])),
        "calibration": list(range(cuts[5], cuts[6])),
    }  # benign traffic: validation rows that only set rates
    labels = np.concatenate(
        [y]
        + [np.asarray(p.labels, dtype=int) for p in (aug, views, flips, val_flips, val_homs, homs)]
        + [np.zeros(len(r.calibration), dtype=int)]
    )
    groups = np.asarray(
        [PLAIN] * len(va) + list(views.categories) + [INTENT] * len(at["intent"]) + [CALIBRATION] * len(r.calibration)
    )
    return _Texts(texts, labels, at, groups, flips)


def _collect(r: Request, t: _Texts, cached: RowsCache | None = None) -> dict[str, Callable[[list[Any]], Any]]:
    """One collection pass over every text at every candidate site, then one over the calibration
    prompts (batched apart, so that they change no other row by a rounding error): per site, a
    function from text positions to their rows (pooled ``[n, d]``, or one ``[T_i, d]`` per text for
    a per-token monitor). With ``cached`` (a ``rows_cache``), each pass reads only the texts the
    cache lacks and takes the others' rows from it."""
    adapter, o = r.adapter, r.options
    max_tokens, batch_size, sae, verbose = o.max_tokens, o.batch_size, o.sae, o.verbose
    n = len(t.texts) - len(r.calibration)
    parts = [p for p in (t.texts[:n], t.texts[n:]) if p]
    if r.streaming:
        seqs: list[Any] = []
        for part in parts:
            ids, _ = adapter.tokenize(part, chat_template=r.chat_template, max_tokens=max_tokens, prepend_bos=r.bos)
            with tqdm(total=len(ids), desc="collect tokens", unit="prompt", disable=not verbose) as bar:
                seqs += token_batches(adapter, ids, [adapter.site(r.sites[0])], batch_size, bar, sae=sae)[r.sites[0]]

        def pick(at: list[Any]) -> list[Any]:
            return [seqs[i] for i in at]

        return {s: pick for s in r.sites}

    def read_part(part: list[str]) -> dict[str, torch.Tensor]:
        return collect(
            adapter,
            part,
            r.sites,
            r.pooling,
            batch_size=batch_size,
            chat_template=r.chat_template,
            prepend_bos=r.bos,
            max_tokens=max_tokens,
            sae=sae,
            progress=verbose,
        )

    if cached is not None:  # each request for rows stacks them from the cache: no copy of every text's beside it
        for part in parts:
            cached.fill(part, r.sites, read_part)
        return {s: cached.picker(t.texts, s) for s in r.sites}
    read = [read_part(part) for part in parts]
    acts = {s: read[0][s] if len(read) == 1 else torch.cat([a[s] for a in read]) for s in r.sites}  # one part: as is

    def rows_of(a: torch.Tensor) -> Callable[[list[Any]], Any]:
        def rows(at: list[Any]) -> Any:
            first = int(at[0]) if len(at) else 0
            if len(at) and list(map(int, at)) == list(range(first, first + len(at))):
                return a[first : first + len(at)]  # a run of texts (the training prompts, say): a view, no copy
            return a[at]

        return rows

    return {s: rows_of(acts[s]) for s in r.sites}


def _answer_steps(r: Request, t: _Texts, cut: list[int]) -> dict[str, Callable[[list[Any]], Any]]:
    """A response monitor's rows, as :func:`_collect` gives a per-token monitor's: per conversation
    (the prompts with ``responses``), the answer's steps ``[T_i, d]``, row ``t`` the answer's first
    ``t + 1`` tokens pooled (the prompt read, not pooled); one forward pass per batch of
    conversations. ``cut`` gets the conversations whose answer was cut to ``max_tokens``."""
    assert r.responses is not None and len(t.texts) == len(r.responses)  # no rewrite or calibration prompt
    adapter, o = r.adapter, r.options
    ids, starts = conversation_ids(
        adapter,
        t.texts,
        r.responses,
        chat_template=r.chat_template,
        max_tokens=o.max_tokens,
        prepend_bos=r.bos,
        what="train_monitor",
        cut=cut,
    )
    with tqdm(total=len(ids), desc="collect answers", unit="conversation", disable=not o.verbose) as bar:
        seqs = token_batches(adapter, ids, [adapter.site(r.sites[0])], o.batch_size, bar, sae=o.sae)[r.sites[0]]
    steps = [pool_prefixes(z[a:], r.pooling) for z, a in zip(seqs, starts, strict=True)]

    def pick(at: list[Any]) -> list[Any]:
        return [steps[i] for i in at]

    return {s: pick for s in r.sites}


def _answer_monitor(monitor: Monitor, r: Request, cut: list[int]) -> Monitor:
    """The monitor trained on a response monitor's steps (as a per-token monitor taking the maximum)
    as the response monitor it is: the same head, cascade and threshold, pooling the answer."""
    config = replace(
        MonitorConfig(monitor.site, pooling=r.pooling),
        chat_template=monitor.chat_template,
        prepend_bos=monitor.prepend_bos,
        max_tokens=monitor.max_tokens,
        model_name=monitor.model_name,
        threshold=monitor.threshold,
        reads="answer",
    )
    out = Monitor(monitor.head, config=config, cascade=monitor.cascade, report=monitor.report, sae=monitor.sae)
    out.report["responses"] = {
        "n": len(r.items),
        "truncated": len(cut),
        "rows": "each answer step: the answer's first t tokens pooled, labelled with its conversation",
        "decision": "flagged when any answer step reaches the threshold",
        "refit": False,
    }
    return out


def _collect_chats(r: Request) -> dict[str, Chats]:
    """Requests inside benign conversations (``contexts``): the split's prompts hosted in the chats,
    collected per token; more rows for training and validation. Empty without ``contexts``."""
    if r.contexts is None:
        return {}
    items, y, adapter, site = r.items, r.y, r.adapter, r.sites[0]
    batch_size, sae, verbose = r.options.batch_size, r.options.sae, r.options.verbose
    splits: dict[str, tuple[Sequence[str], Any]] = {
        "val": ([items[i] for i in r.va], y[r.va]),
        "train": ([items[i] for i in r.tr], y[r.tr]),
    }
    chats = {}
    for split, h in host_splits(
        adapter.tokenizer,
        r.contexts,
        splits,
        val_fraction=r.options.val_fraction,
        lengths=r.context_tokens,
        seed=r.cfg.seed,
    ).items():
        with tqdm(total=len(h.sequences), desc=f"collect {split} contexts", unit="chat", disable=not verbose) as bar:
            seqs = token_batches(adapter, [q.ids for q in h.sequences], [adapter.site(site)], batch_size, bar, sae=sae)[
                site
            ]
        chats[split] = Chats(seqs, [(q.start, q.stop) for q in h.sequences], h.labels, h.tail)
    return chats


def _train_data(rows: Callable[[list[Any]], Any], t: _Texts, r: Request, chats: dict[str, Chats]) -> TrainData:
    """One site's :class:`~tpc_hooks.training._train.TrainData`: its rows cut into the parts the recipe reads."""
    at, labels = t.at, t.labels
    return TrainData(
        train=Examples(rows(at["train"]), r.y[r.tr]),
        rewrites=Examples(rows(at["rewrites"]), labels[at["rewrites"]]) if r.families else None,
        val=Examples(
            rows(t.at_val),
            labels[t.at_val],
            t.groups,
            val_sources(None if r.sources is None else r.sources[r.va], t.groups),
        ),
        contexts=chats,
        flips=Examples(rows(at["flips"]), labels[at["flips"]]) if len(t.flips) else None,
        flip_of=np.asarray([int(i) for i in t.flips.sources], dtype=int) if len(t.flips) else None,
        homonyms=Examples(rows(at["homonyms"]), labels[at["homonyms"]]) if at["homonyms"] else None,
    )


def _plan(r: Request, t: _Texts) -> TrainPlan:
    """The monitor's settings (the first site's; :func:`train` swaps in the chosen one) and the recipe's
    plan: fit settings, families and kinds, cascade, operating point, pruning."""
    adapter = r.adapter
    answers = r.responses is not None  # a response monitor trains as a per-token monitor of its steps
    skip = adapter.fixed_prefix(chat_template=r.chat_template, prepend_bos=r.bos) if r.streaming and not answers else 0
    settings = MonitorConfig(
        r.sites[0],
        pooling="token" if answers else r.pooling,
        chat_template=r.chat_template,
        prepend_bos=r.bos,
        max_tokens=r.options.max_tokens,
        model_name=adapter.model_name,
        aggregate=r.aggregate,
        alpha=r.options.alpha,
        window=r.options.window,
        skip=skip,
        top_k=r.options.top_k,
    )
    return TrainPlan(
        settings,
        r.cfg,
        recipe=r.recipe,
        families=r.families,
        tau=r.options.tau,
        target_fpr=r.options.target_fpr,
        intent=r.kinds,
        prune=r.prune,
        context_lengths=r.context_tokens,
        shifts=r.shifts,
        everyday=(*r.everyday, CALIBRATION) if r.everyday is not None and r.calibration else r.everyday,
        refit=refits(r),
    )
