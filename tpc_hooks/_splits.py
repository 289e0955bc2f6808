"""Deterministic splits of the packaged prompt sources: seeded draws, deduplication, stratified
cuts, and requests wrapped in jailbreak templates (harmful and benign alike)."""

import logging
import random
import re
from collections.abc import Sequence
from typing import Any

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


def cut_sizes(n: int, fractions: tuple[float, float, float]) -> list[int]:
    a, b = round(n * fractions[0]), round(n * (fractions[0] + fractions[1]))
    return [a, b - a, n - b]


def cut(rows: list[Any], fractions: tuple[float, float, float]) -> list[list[Any]]:
    a, b, _ = cut_sizes(len(rows), fractions)
    return [rows[:a], rows[a:a + b], rows[a + b:]]


def stratified_split(by_source: dict[str, list[Row]], names: Sequence[str], fractions: Sequence[float],
                      rng: random.Random) -> dict[str, list[Row]]:
    """Each (source, label) group shuffled and cut by ``fractions`` into the splits ``names``."""
    splits: dict[str, list[Row]] = {name: [] for name in names}
    for source in sorted(by_source):
        for label in (0, 1):
            group = [r for r in by_source[source] if r.label == label]
            rng.shuffle(group)
            for name, part in zip(names, cut_by(group, fractions)):
                splits[name] += part
    return splits


def cut_by(rows: list[Any], fractions: Sequence[float]) -> list[list[Any]]:
    edges = [round(len(rows) * sum(fractions[:i])) for i in range(len(fractions) + 1)]
    return [rows[a:b] for a, b in zip(edges, edges[1:])]


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
    for i, (h, b) in enumerate(zip(rng.sample(harmful, n), rng.sample(benign, n))):
        template = templates[i % len(templates)]
        out += [(r._replace(text=wrap(template, r.text), adversarial=True), r) for r in (h, b)]
    return out
