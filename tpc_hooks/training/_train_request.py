"""What :func:`~tpc_hooks.train_monitor` decides before the model runs: its options
(:class:`~tpc_hooks.training._options.TrainOptions`, checked when built) and the arguments that need
the model or the prompts, checked (each error says what was expected) and resolved into a
:class:`Request` (the candidate sites, the tokenisation, the seeded train / validation split of the
prompts, the hosted chats and the calibration prompts)."""

from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import TPCHooksError
from ..activations import Adapter, get_adapter, resolve_bos
from ..data import (
    KINDS,
    check_conversation,
    check_prompts,
    check_split,
    context_budget,
    norm,
    sharegpt_contexts,
    split_positions,
)
from ..head import FitConfig
from ..metrics import check_labels
from ..monitoring import check_sources, everyday_rows
from ..pooling import check_pooling
from ._options import TrainOptions
from ._train import CALIBRATION


@dataclass(frozen=True)
class Request:
    """``train_monitor``'s arguments once checked and resolved: its :class:`TrainOptions` and what they
    resolve to once the model and the prompts are known (the candidate sites, the tokenisation, the
    hosted chats, the seeded train / validation split of the prompts, the calibration prompts)."""

    options: TrainOptions
    items: list[str]
    y: np.ndarray
    sites: list[str]
    adapter: Adapter
    pooling: str
    chat_template: bool
    bos: bool
    contexts: list[list[dict[str, str]]] | None
    context_tokens: tuple[int, ...]
    tr: np.ndarray
    va: np.ndarray
    sources: np.ndarray | None = None
    everyday: tuple[str, ...] | None = None
    calibration: tuple[str, ...] = ()
    validation_given: bool = False  # the validation prompts came as validation=, after the training prompts
    responses: tuple[str, ...] | None = None  # a response monitor: the answer to each prompt

    @property
    def streaming(self) -> bool:
        """Whether the rows are sequences: a per-token monitor's tokens, a response monitor's answer steps."""
        return self.pooling == "token" or self.responses is not None

    @property
    def aggregate(self) -> str:
        return self.options.aggregate_for(self.contexts is not None)

    @property
    def recipe(self) -> str:
        return self.options.preset.name

    @property
    def families(self) -> tuple[str, ...]:
        return self.options.preset.augment

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.options.preset.intent

    @property
    def shifts(self) -> tuple[str, ...]:
        return () if self.responses is not None else self.options.preset.shifts  # rewrites of prompts

    @property
    def prune(self) -> bool:
        return self.options.preset.prune_orders

    @property
    def cfg(self) -> FitConfig:
        return self.options.cfg

    @property
    def flip_kinds(self) -> tuple[str, ...]:
        return tuple(k for k in self.kinds if k in KINDS)


def check_request(
    model: Any, prompts: Sequence[str], labels: Any, site: str | Sequence[str], pooling: str, options: TrainOptions
) -> Request:
    """The arguments that need the model or the prompts checked (each error says what was expected) and
    resolved with ``options`` (checked when built), before any model work."""
    o = options
    items = check_prompts(prompts)
    y = check_labels(labels, len(items), "labels").numpy().astype(int)
    sources = check_sources(o.sources, len(items), "prompt")
    n_train = len(items)
    if o.validation is not None:  # the training prompts, then the validation prompts: one list, split by position
        v_items, v_y, v_sources = check_validation(o.validation, items, y, sources)
        items, y = items + v_items, np.concatenate([y, v_y])
        sources = None if sources is None else np.concatenate([sources, v_sources])
    everyday = o.everyday
    if everyday is not None:
        on = everyday_rows(sources, everyday)
        if sources is not None and not (on & (y == 0)).any():
            raise TPCHooksError(
                f"everyday names {sorted(set(sources[on].tolist()))}, which have no benign prompt: the "
                "threshold is set on the benign prompts of the everyday sources"
            )
        everyday = tuple(sorted({str(v) for v in everyday}))
    calibration = _check_calibration(o.calibration, items, sources)
    sites = [site] if isinstance(site, str) else list(dict.fromkeys(site))
    if not sites or not all(isinstance(s, str) for s in sites):
        raise TPCHooksError(f"site must be a hook name or a non-empty list of them; got {site!r}")
    adapter = get_adapter(model, tokenizer=o.tokenizer)
    for s in sites:
        adapter.site(s)
    if o.sae is not None and len(sites) > 1:
        raise TPCHooksError("an SAE belongs to one site: pass a single site with sae=")
    if o.rows_cache is not None and not isinstance(o.rows_cache, MutableMapping):
        raise TPCHooksError(
            f"rows_cache must be a dict (one per model, filled and read back across calls); got "
            f"{type(o.rows_cache).__name__}"
        )
    if pooling == "token":  # an aggregation given is checked with the options
        if len(sites) > 1:
            raise TPCHooksError("a per-token monitor (pooling='token') reads one site; pass a single site")
        if o.rows_cache is not None:
            raise TPCHooksError(
                "rows_cache keeps pooled rows; a per-token monitor (pooling='token') reads every token: "
                "leave rows_cache out"
            )
    else:
        check_pooling(pooling)
        if o.contexts is not None:
            raise TPCHooksError(
                "contexts= trains a per-token monitor on requests inside conversations; pass pooling='token'"
            )
        if o.aggregate is not None:
            raise TPCHooksError(
                f"aggregate= sets how a per-token monitor aggregates its token scores over time; a pooled monitor "
                f"(pooling={pooling!r}) scores the pooled prefix: pass pooling='token' with it"
            )
    chat_template = o.chat_template
    if chat_template is None:
        chat_template = bool(getattr(adapter.tokenizer, "chat_template", None))
    contexts, context_tokens = o.contexts, tuple[int, ...]()
    if contexts is not None:
        contexts, context_tokens = _check_contexts(adapter.tokenizer, contexts, o.context_tokens, chat_template, items)
    responses = None if o.responses is None else _check_responses(o, items, sites, pooling)
    if o.validation is None:
        check_split(y, o.val_fraction, o.split)
        tr, va = split_positions(items, y, o.val_fraction, o.split, o.cfg.seed)
    else:
        tr, va = np.arange(n_train), np.arange(n_train, len(items))
    return Request(
        o,
        items,
        y,
        sites,
        adapter,
        pooling,
        chat_template,
        resolve_bos(adapter.tokenizer, o.prepend_bos, chat_template),
        contexts,
        tuple(context_tokens),
        tr,
        va,
        sources,
        everyday,
        calibration,
        o.validation is not None,
        responses,
    )


def _check_responses(o: TrainOptions, items: list[str], sites: list[str], pooling: str) -> tuple[str, ...]:
    """``responses`` for a response monitor: one non-empty string per prompt, a pooling of the answer,
    one site, and none of the options that read prompts alone."""
    r = o.responses
    if isinstance(r, str) or not isinstance(r, Sequence) or not all(isinstance(x, str) for x in r):
        raise TPCHooksError("responses must be a list of strings: the answer to each prompt")
    if len(r) != len(items):
        raise TPCHooksError(f"{len(r)} responses for {len(items)} prompts; pass one answer per prompt")
    empty = [i for i, x in enumerate(r) if not x.strip()]
    if empty:
        raise TPCHooksError(
            f"{len(empty)} responses are empty (first: {empty[0]}); a conversation needs an answer to score"
        )
    if pooling == "token":
        raise TPCHooksError(
            "a response monitor pools the answer so far; give pooling 'mean', 'last' or 'max', not 'token'"
        )
    if len(sites) > 1:
        raise TPCHooksError("a response monitor is trained at one site; pass a single site with responses=")
    preset = o.preset
    refused = [
        name
        for name, given in (
            ("contexts", o.contexts is not None),
            ("calibration", o.calibration is not None),
            ("validation", o.validation is not None),
            ("rows_cache", o.rows_cache is not None),
            ("a recipe's rewrites or intent flips", bool(preset.augment or preset.intent)),
        )
        if given
    ]
    if refused:
        raise TPCHooksError(
            f"responses= trains on conversations; {', '.join(refused)} read prompts alone: leave "
            f"{'it' if len(refused) == 1 else 'them'} out (hold out conversations with val_fraction)"
        )
    return tuple(r)


def check_validation(
    validation: Any, items: list[str], y: np.ndarray, sources: np.ndarray | None
) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """``train_monitor``'s ``validation``: ``(prompts, labels)``, or ``(prompts, labels, sources)`` when
    the training prompts carry ``sources``; both classes on each side, and no validation prompt among
    the training prompts (a prompt the fit trained on scores low, and the choices made on it would
    favour what memorises)."""
    if not isinstance(validation, (tuple, list)) or len(validation) not in (2, 3):
        raise TPCHooksError(
            "validation must be (prompts, labels), or (prompts, labels, sources) when the training prompts "
            f"carry sources; got {type(validation).__name__}"
            + (f" of length {len(validation)}" if isinstance(validation, (tuple, list)) else "")
        )
    texts = check_prompts(validation[0], "validation prompts")
    vy = check_labels(validation[1], len(texts), "validation labels").numpy().astype(int)
    if np.bincount(y, minlength=2).min() < 2:
        raise TPCHooksError("the training prompts need at least 2 examples of each class")
    if (len(validation) == 3) != (sources is not None):
        raise TPCHooksError(
            "sources= names each training prompt's source: give validation=(prompts, labels, sources) too"
            if sources is not None
            else "validation carries sources but the training prompts do not: pass sources= for them too"
        )
    v_sources = check_sources(validation[2], len(texts), "validation prompt") if len(validation) == 3 else None
    _refuse_seen(
        texts,
        items,
        "validation holds {n} of the training prompts (first: {first}); what is chosen on validation must be "
        "chosen on prompts the fit never saw: leave them out of one side",
    )
    return texts, vy, v_sources


def _refuse_seen(texts: list[str], items: list[str], message: str) -> None:
    """Refuses ``texts`` that are among ``items`` (casefolded, whitespace collapsed): ``message`` with
    ``{n}`` (how many) and ``{first}`` (the first of them) filled in."""
    seen = {norm(t) for t in items}
    both = [t for t in texts if norm(t) in seen]
    if both:
        raise TPCHooksError(message.format(n=len(both), first=repr(both[0][:60])))


def _check_calibration(calibration: Any, items: list[str], sources: np.ndarray | None) -> tuple[str, ...]:
    """``calibration``: None (none) or a non-empty list of prompts, none of them among ``items``
    (a prompt the fit trained on would be scored low), and no prompt source named ``"calibration"``."""
    if calibration is None:
        return ()
    texts = check_prompts(calibration)
    _refuse_seen(
        texts,
        items,
        "calibration holds {n} of the prompts (first: {first}); the threshold is set on traffic the fit never "
        "saw: leave them out",
    )
    if sources is not None and CALIBRATION in set(sources.tolist()):
        raise TPCHooksError(f"the source name {CALIBRATION!r} is the calibration prompts'; rename that source")
    return tuple(texts)


def _check_contexts(
    tokenizer: Any, contexts: Any, lengths: Any, chat_template: bool, prompts: Sequence[str]
) -> tuple[list[list[dict[str, str]]], tuple[int, ...]]:
    """``train_monitor``'s ``contexts`` (conversations, or a number of ShareGPT contexts) and
    ``context_tokens``, checked."""
    lengths = (lengths,) if isinstance(lengths, int) and not isinstance(lengths, bool) else tuple(lengths)
    if not lengths or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in lengths):
        raise TPCHooksError(f"context_tokens must be a positive integer or a list of them; got {lengths!r}")
    if not chat_template:
        raise TPCHooksError(
            "contexts= places prompts in chat conversations; it needs chat_template=True "
            "(a tokenizer with a chat template)"
        )
    if isinstance(contexts, int) and not isinstance(contexts, bool):
        if contexts < 4:
            raise TPCHooksError(f"contexts must be at least 4 (2 held out for validation); got {contexts}")
        return sharegpt_contexts(tokenizer, contexts, tokens=context_budget(lengths), exclude=prompts), lengths
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, Sequence):
        raise TPCHooksError(
            "contexts must be a list of conversations ([{'role', 'content'}] turns) or a number of "
            f"ShareGPT contexts; got {type(contexts).__name__}"
        )
    convs = [check_conversation(c) for c in contexts]
    if len(convs) < 4 or any(not c for c in convs):
        raise TPCHooksError(
            f"contexts needs at least 4 non-empty conversations (2 are held out); got {len(convs)}"
            + (" (one is empty)" if any(not c for c in convs) else "")
        )
    return convs, lengths
