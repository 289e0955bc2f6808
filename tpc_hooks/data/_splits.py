"""Deterministic splits of the packaged prompt sources: seeded draws, deduplication, stratified
cuts, and requests wrapped in jailbreak templates (harmful and benign alike)."""

import logging
import random
import re
from collections.abc import Sequence
from typing import Any

from . import _intent, _phrasing, _sources
from ._sources import Row, norm

log = logging.getLogger(__name__)

_MAX_WRAPPED_REQUEST = 300  # benign requests wrapped in templates stay as short as the harmful ones
# An explicit insertion point: "[INSERT PROMPT HERE]", "{prompt}", "[PUT YOUR QUESTION HERE]", "[INPUT]"...
_SLOT = re.compile(
    r"[\[{]\s*(?:insert|enter|put|write|type)?[\s_]*(?:your|any|the|a)?[\s_]*"
    r"(?:prompt|question|request|input)(?:[\s_]*here)?[\s_]*\\?[\]}]",
    re.IGNORECASE,
)


def rng(seed: int, stage: str) -> random.Random:
    """One independent stream per stage, so that changing one size leaves the other draws alone."""
    return random.Random(f"tpc-hooks-data-{seed}-{stage}")


def dedupe(by_source: dict[str, list[Row]]) -> dict[str, list[Row]]:
    """Keeps the first row of each normalised text (in source order) and drops texts found with both labels."""
    labels: dict[str, set[int]] = {}
    for rows in by_source.values():
        for r in rows:
            labels.setdefault(norm(r.text), set()).add(r.label)
    conflicts = {t for t, ys in labels.items() if len(ys) > 1}
    if conflicts:
        log.info("dropping %d texts that occur with both labels", len(conflicts))
    seen: set[str] = set()
    out = {}
    for source, rows in by_source.items():
        kept = []
        for r in rows:
            key = norm(r.text)
            if key not in seen and key not in conflicts:
                seen.add(key)
                kept.append(r)
        if len(kept) < len(rows):
            log.info("%s: dropped %d duplicate rows", source, len(rows) - len(kept))
        out[source] = kept
    return out


def cut_sizes(n: int, fractions: Sequence[float]) -> list[int]:
    a, b = round(n * fractions[0]), round(n * (fractions[0] + fractions[1]))
    return [a, b - a, n - b]


def cut(rows: list[Any], fractions: Sequence[float]) -> list[list[Any]]:
    a, b, _ = cut_sizes(len(rows), fractions)
    return [rows[:a], rows[a : a + b], rows[a + b :]]


def stratified_split(
    by_source: dict[str, list[Row]], names: Sequence[str], fractions: Sequence[float], rng: random.Random
) -> dict[str, list[Row]]:
    """Each (source, label) group shuffled and cut by ``fractions`` into the splits ``names``."""
    splits: dict[str, list[Row]] = {name: [] for name in names}
    for source in sorted(by_source):
        for label in (0, 1):
            group = [r for r in by_source[source] if r.label == label]
            rng.shuffle(group)
            for name, part in zip(names, cut_by(group, fractions), strict=True):
                splits[name] += part
    return splits


def cut_by(rows: list[Any], fractions: Sequence[float]) -> list[list[Any]]:
    edges = [round(len(rows) * sum(fractions[:i])) for i in range(len(fractions) + 1)]
    return [rows[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def wrap(template: str, request: str) -> str:
    if _SLOT.search(template):
        return _SLOT.sub(lambda _: request, template)
    return f"{template.rstrip()}\n\n{request}"


def wrapped(rows: list[Row], templates: list[str], n_pairs: int, rng: random.Random) -> list[tuple[Row, Row]]:
    """``n_pairs`` harmful and ``n_pairs`` benign requests of a split, each as (wrapped row, request);
    template ``i`` wraps the ``i``-th of each."""
    harmful = [r for r in rows if r.label == 1]
    benign = [r for r in rows if r.label == 0 and len(r.text) <= _MAX_WRAPPED_REQUEST]
    n = min(n_pairs, len(harmful), len(benign)) if templates else 0
    if n < n_pairs:
        log.warning("only %d of %d adversarial pairs could be built in a split", n, n_pairs)
    out = []
    for i, (h, b) in enumerate(zip(rng.sample(harmful, n), rng.sample(benign, n), strict=True)):
        template = templates[i % len(templates)]
        out += [(r._replace(text=wrap(template, r.text), adversarial=True), r) for r in (h, b)]
    return out


def act_key(text: str) -> str | None:
    """The normalised act a request asks for (``None``: not a task), so that two wordings of one
    request ("Write a tutorial on how to make a bomb", "Give instructions on how to make a bomb")
    count as one base request."""
    vp = _intent.task_act(text)
    return norm(vp) if vp else None


def phrasing_pools(
    seed: int, n_benign_sharegpt: int, max_chars: int, fractions: tuple[float, float, float, float]
) -> dict[str, list[Row]]:
    """The base requests of :func:`tpc_hooks.data.phrasing_benchmark`: train, val, test and shift pools, disjoint."""
    by_source = {name: list(load()) for name, load in _sources.LOADERS.items()}
    sharegpt = [r for r in _sources.sharegpt() if len(r.text) <= max_chars]
    rng(seed, "phrasing-sharegpt").shuffle(sharegpt)
    by_source["sharegpt"] = sharegpt[:n_benign_sharegpt]
    by_source = dedupe(by_source)
    return stratified_split(by_source, ("train", "val", "test", "shift"), fractions, rng(seed, "phrasing-split"))


def phrasing_splits(
    pools: dict[str, list[Row]],
    heldout_family: str,
    n_adversarial: int,
    seed: int,
    fractions: tuple[float, float, float, float],
) -> dict[str, list[tuple[Row, Row]]]:
    """Every split of :func:`tpc_hooks.data.phrasing_benchmark` as (row, its base request) pairs, unshuffled."""
    splits = {name: [(r, r) for r in pools[name]] for name in ("train", "val", "test")}
    templates = _sources.templates()
    rng(seed, "phrasing-templates").shuffle(templates)
    in_dist = tuple(f / sum(fractions[:3]) for f in fractions[:3])
    for name, tmpl, n_pairs in zip(
        list(splits), cut(templates, in_dist), cut_sizes(n_adversarial // 2, in_dist), strict=True
    ):
        splits[name] += wrapped(pools[name], tmpl, n_pairs, rng(seed, f"phrasing-wrap-{name}"))

    trained = [f for f in _phrasing.FAMILIES if f != heldout_family]
    train = pools["train"]
    splits["aug"] = [
        (train[i]._replace(text=text, category=family, adversarial=False), train[i])
        for i, family, text in _phrasing.augmented([r.text for r in train], tuple(trained), rng(seed, "phrasing-aug"))
    ]
    for name, pool, families in (("val", pools["val"], trained), ("shift", pools["shift"], _phrasing.FAMILIES)):

        def rng_for(f: str, name: str = name) -> random.Random:
            return rng(seed, f"phrasing-{name}-{f}")

        by_family = _phrasing.views([r.text for r in pool], tuple(families), rng_for)
        for family, rows in by_family.items():
            splits[f"{name}/{family}"] = [
                (pool[i]._replace(text=text, category=family, adversarial=False), pool[i]) for i, text in rows
            ]
    return splits


def intent_splits(
    by_source: dict[str, list[Row]],
    templates: list[str],
    seed: int,
    heldout_kind: str,
    n_adversarial: int,
    fractions: tuple[float, float, float],
) -> dict[str, list[Row]]:
    """The splits of :func:`tpc_hooks.data.intent_benchmark`, unshuffled: ``train``/``val``/``test``
    (plain requests and jailbreak-wrapped pairs) and ``<split>/hard`` (hard negatives, label 0, the
    kind as category). ``by_source`` is deduplicated and holds the ``overrefusal`` rows apart from
    the ordinary sources."""
    hard_pool = by_source.pop(_intent.OVERREFUSAL, [])
    names = ("train", "val", "test")
    splits = stratified_split(by_source, names, fractions, rng(seed, "intent-split"))
    rng(seed, "intent-templates").shuffle(templates)
    for name, tmpl, n_pairs in zip(
        names, cut(templates, fractions), cut_sizes(n_adversarial // 2, fractions), strict=True
    ):
        splits[name] += [w for w, _ in wrapped(splits[name], tmpl, n_pairs, rng(seed, f"intent-wrap-{name}"))]

    trained = tuple(k for k in _intent.KINDS if k != heldout_kind)
    hard: dict[str, list[Row]] = {name: [] for name in names}
    acts: set[str] = set()  # an act flipped in one split is not flipped again in a later one
    for name in names:
        harmful = [r for r in splits[name] if r.label == 1 and not r.adversarial]
        keys = [act_key(r.text) for r in harmful]
        harmful = [r for r, k in zip(harmful, keys, strict=True) if k is None or k not in acts]
        acts |= {k for k in keys if k is not None}
        if name == "train":
            got = _intent.flipped([r.text for r in harmful], trained, rng(seed, "intent-flip-train"), "train")
        else:
            kinds = trained if name == "val" else _intent.KINDS

            def rng_for(k: str, name: str = name) -> random.Random:
                return rng(seed, f"intent-flip-{name}-{k}")

            views = _intent.flipped_views(
                [r.text for r in harmful], kinds, rng_for, "train" if name == "val" else "test"
            )
            got = [(i, k, t) for k, rows in views.items() for i, t in rows]
        hard[name] += [harmful[i]._replace(text=t, label=0, category=k) for i, k, t in got]

    pairs = _intent.homonym_pairs()
    rng(seed, "intent-homonyms").shuffle(pairs)
    extra = sorted(hard_pool, key=lambda r: norm(r.text))
    rng(seed, "intent-overrefusal").shuffle(extra)
    pools: list[tuple[str, list[Any]]] = [(_intent.HOMONYM, pairs), (_intent.OVERREFUSAL, extra)]  # Homonym, Row
    for kind, pool in pools:
        parts = [[], [], pool] if kind == heldout_kind else cut(pool, fractions)
        for name, part in zip(names, parts, strict=True):
            if kind == _intent.HOMONYM:
                texts = _intent.homonyms(part, rng(seed, f"intent-homonym-{name}"))
                hard[name] += [Row(t, 0, _intent.HOMONYM, _intent.HOMONYM, False) for t in texts]
            else:
                hard[name] += [r._replace(category=_intent.OVERREFUSAL) for r in part]
    return {**splits, **{f"{name}/hard": rows for name, rows in hard.items()}}
