"""Prompts with labels and per-row metadata (:class:`PromptSet`), the split tables, and unlabelled
prompts read from a file (:func:`read_texts`); re-exported by :mod:`tpc_hooks.data`."""

import csv
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import TPCHooksError
from ._sources import Row as _Row


@dataclass(frozen=True)
class PromptSet:
    """Prompts with binary labels (1 = harmful) and, per row, its source, category and adversarial flag.

    Args:
        texts: The prompts.
        labels: 1 for harmful, 0 for benign.
        sources: Where each prompt comes from (``"advbench"``, ``"sharegpt"``, ...).
        categories: The source's harm category or its own category; ``""`` where it has none.
        adversarial: Whether the prompt is a request wrapped in a jailbreak template.

    Raises:
        TPCHooksError: lists of different lengths, or a label other than 0 or 1.

    Example:
        >>> ps = PromptSet(["How do I bake bread?", "Write a phishing email"], [0, 1],
        ...                ["mine", "mine"], ["", "fraud"], [False, False])
        >>> len(ps), ps.subset([1]).texts, len(ps + ps)
        (2, ['Write a phishing email'], 4)
        >>> print(ps.summary())
        | split | source | label 0 | label 1 | adversarial 0 | adversarial 1 |
        |---|---|---:|---:|---:|---:|
        | all | mine | 1 | 1 | 0 | 0 |
        | all | **total** | 1 | 1 | 0 | 0 |
    """

    texts: list[str]
    labels: list[int]
    sources: list[str]
    categories: list[str]
    adversarial: list[bool]

    def __post_init__(self) -> None:
        n = len(self.texts)
        lengths = {f: len(getattr(self, f)) for f in ("labels", "sources", "categories", "adversarial")}
        if any(m != n for m in lengths.values()):
            raise TPCHooksError(f"every field of a PromptSet needs one entry per text ({n}); got lengths {lengths}")
        bad = sorted({y for y in self.labels if y not in (0, 1)})
        if bad:
            raise TPCHooksError(f"labels must be 0 (benign) or 1 (harmful); got {bad}")

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices: Sequence[int] | np.ndarray) -> "PromptSet":
        """The rows at ``indices`` (integers; a NumPy index array works), in that order."""
        idx = [int(i) for i in indices]
        return PromptSet(
            [self.texts[i] for i in idx],
            [self.labels[i] for i in idx],
            [self.sources[i] for i in idx],
            [self.categories[i] for i in idx],
            [self.adversarial[i] for i in idx],
        )

    def __add__(self, other: "PromptSet") -> "PromptSet":
        """The rows of both sets, these first."""
        return PromptSet._from_rows(self._rows() + other._rows())

    def to_records(self) -> list[dict[str, Any]]:
        """One dict per row with keys ``text``, ``label``, ``source``, ``category``, ``adversarial``."""
        return [dict(zip(_Row._fields, row, strict=True)) for row in self._rows()]

    def summary(self) -> str:
        """A markdown table of row counts per source and label (see :func:`splits_summary`)."""
        return splits_summary({"all": self})

    def _rows(self) -> list[_Row]:
        return [
            _Row(*r) for r in zip(self.texts, self.labels, self.sources, self.categories, self.adversarial, strict=True)
        ]

    @classmethod
    def _from_rows(cls, rows: Sequence[_Row]) -> "PromptSet":
        return cls(
            [r.text for r in rows],
            [r.label for r in rows],
            [r.source for r in rows],
            [r.category for r in rows],
            [r.adversarial for r in rows],
        )


def splits_summary(splits: Mapping[str, PromptSet]) -> str:
    """A markdown table of row counts per split, source and label; "adversarial" counts the wrapped rows among them.

    Example:
        >>> ps = PromptSet(["a b c", "d e f"], [0, 1], ["x", "y"], ["", ""], [False, True])
        >>> print(splits_summary({"test": ps}).splitlines()[2])
        | test | x | 1 | 0 | 0 | 0 |
    """
    lines = ["| split | source | label 0 | label 1 | adversarial 0 | adversarial 1 |", "|---|---|---:|---:|---:|---:|"]
    for name, ps in splits.items():
        every = Counter(zip(ps.sources, ps.labels, strict=True))
        adv = Counter((s, y) for s, y, a in zip(ps.sources, ps.labels, ps.adversarial, strict=True) if a)
        for source in sorted(set(ps.sources)):
            counts = [every[source, 0], every[source, 1], adv[source, 0], adv[source, 1]]
            lines.append(f"| {name} | {source} | " + " | ".join(map(str, counts)) + " |")
        totals = [
            ps.labels.count(0),
            ps.labels.count(1),
            sum(a and y == 0 for a, y in zip(ps.adversarial, ps.labels, strict=True)),
            sum(a and y == 1 for a, y in zip(ps.adversarial, ps.labels, strict=True)),
        ]
        lines.append(f"| {name} | **total** | " + " | ".join(map(str, totals)) + " |")
    return "\n".join(lines)


def source_names(ps: PromptSet) -> list[str]:
    """Each prompt's source, its requests inside jailbreak templates apart: the names a threshold's
    rate is reported by (``train_monitor(sources=...)``, ``tpc-hooks collect``'s ``sources.json``).

    Example:
        >>> source_names(PromptSet(["a", "b", "c"], [0, 0, 1], ["sharegpt", "sharegpt", " "], ["", "", ""],
        ...                        [False, True, False]))
        ['sharegpt', 'sharegpt, wrapped', 'unnamed']
    """
    names = [s.strip() or "unnamed" for s in ps.sources]
    return [f"{s}, wrapped" if a else s for s, a in zip(names, ps.adversarial, strict=True)]


def read_texts(path: str | os.PathLike, text_column: str = "text") -> list[str]:
    """Unlabelled prompts from a local file: ``.txt`` (one a line, blank lines skipped), or a
    ``.csv``, ``.jsonl`` or ``.json`` with a ``text_column`` (other columns ignored).

    Raises:
        TPCHooksError: unknown suffix, unreadable JSON, no prompts, a missing column or an empty text.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "traffic.txt"
        >>> _ = p.write_text("How do I bake bread?\\n\\nWhat is 2 + 2?\\n")
        >>> read_texts(p)
        ['How do I bake bread?', 'What is 2 + 2?']
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".txt":
        texts = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    elif suffix in (".csv", ".jsonl", ".json"):
        if suffix == ".csv":
            with open(path, newline="", encoding="utf-8") as f:
                records = list(csv.DictReader(f))
        else:
            records = _read_json_records(path, suffix)
        missing = next((i for i, r in enumerate(records, start=1) if text_column not in r), None)
        if missing is not None:
            raise TPCHooksError(f"{path} row {missing} has no column {text_column!r}")
        texts = [r[text_column] for r in records]
        if not all(isinstance(t, str) and t.strip() for t in texts):
            raise TPCHooksError(f"{path}: every {text_column!r} must be a non-empty text")
    else:
        raise TPCHooksError(f"{path}: expected a .txt, .csv, .jsonl or .json file; got suffix {suffix!r}")
    if not texts:
        raise TPCHooksError(f"{path} holds no prompts")
    return texts


def _read_json_records(path: Path, suffix: str) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        if suffix == ".json":
            records = json.loads(text) if text.strip() else []
            records = records if isinstance(records, list) else [records]
        else:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise TPCHooksError(f"{path} is not valid {suffix[1:].upper()}: {err}") from None
    if not all(isinstance(r, dict) for r in records):
        raise TPCHooksError(f"{path}: every record must be a JSON object with named columns")
    return records
