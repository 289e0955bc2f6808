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
        records = _read_csv(path)[1] if suffix == ".csv" else _read_json_records(path, suffix)
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


_EXTRA = "\0 fields beyond the header"


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """A ``.csv``'s header and its rows as dicts keyed by it (a UTF-8 byte-order mark, as Excel writes, is dropped).

    A row with more non-empty fields than the header is refused: most often a text holding an
    unquoted comma, which would otherwise shift its label into the next column.
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f, restkey=_EXTRA)
            header = list(reader.fieldnames or ())  # read lazily: an empty file has none
            records = list(reader)
    except UnicodeDecodeError as err:
        raise TPCHooksError(
            f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); expected a CSV file (UTF-8 text with "
            "a header row); re-save it as CSV UTF-8, or as JSON Lines"
        ) from None
    except csv.Error as err:
        raise TPCHooksError(
            f"{path} is not readable as CSV ({err}); expected comma-separated rows under a header row; "
            "re-save it as CSV"
        ) from None
    first = header[0].strip() if header else ""
    if first in ("[", "{") or first.startswith(("[{", '{"', '["')):
        raise TPCHooksError(
            f"{path} looks like JSON, not CSV (its first line starts {first[:20]!r}); expected a header row naming "
            "the columns; name it .json (one list of objects) or .jsonl (one object a line)"
        )
    for i, rec in enumerate(records, start=1):
        extra = rec.pop(_EXTRA, [])
        if any(v.strip() for v in extra):
            raise TPCHooksError(
                f"{path} row {i} has {len(header) + len(extra)} fields but the header names {len(header)} "
                f"({', '.join(map(repr, header))}); put a text that holds a comma in double quotes "
                '("like, this")'
            )
    return header, records


def _read_json_records(path: Path, suffix: str) -> list[dict[str, Any]]:
    """A ``.json`` file's list of objects, or a ``.jsonl`` file's objects, one a line (blank lines skipped)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise TPCHooksError(
            f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); expected a {suffix[1:].upper()} "
            "file (UTF-8 text); re-save it as UTF-8"
        ) from None
    if suffix == ".json":
        try:
            records = json.loads(text) if text.strip() else []
        except json.JSONDecodeError as err:
            hint = "; if it holds one JSON object per line, name it .jsonl" if err.msg == "Extra data" else ""
            raise TPCHooksError(f"{path} is not valid JSON ({err}); expected a list of objects{hint}") from None
        records = records if isinstance(records, list) else [records]
        bad = next((i for i, r in enumerate(records, start=1) if not isinstance(r, dict)), None)
        if bad is not None:
            raise TPCHooksError(
                f"{path} item {bad} is {_json_kind(records[bad - 1])}, not a JSON object; expected a list of "
                'objects with named columns, e.g. [{"text": "...", "label": 0}]'
            )
        return records
    records = []
    # split("\n"), not splitlines(): JSON strings may hold U+2028 and other characters splitlines breaks at.
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            whole = n == 1 and (line.strip() == "{" or line.lstrip().startswith("["))  # one JSON document
            raise TPCHooksError(
                f"{path} line {n} is not valid JSON ({err.msg}: column {err.colno}); expected one JSON object "
                "per line; " + ("it looks like one JSON document: name it .json" if whole else "fix or drop the line")
            ) from None
        if not isinstance(rec, dict):
            fix = "name it .json" if n == 1 and isinstance(rec, list) else "fix or drop the line"
            raise TPCHooksError(
                f"{path} line {n} holds {_json_kind(rec)}, not a JSON object; expected one object with named "
                f'columns per line, e.g. {{"text": "...", "label": 0}}; {fix}'
            )
        records.append(rec)
    return records


def _json_kind(value: Any) -> str:
    """``value``'s JSON kind and the start of its text, for a message."""
    kind = {type(None): "null", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")
    shown = json.dumps(value, ensure_ascii=False)
    return kind if value is None else f"{kind} ({shown[:40]}{'...' if len(shown) > 40 else ''})"
