"""Your own labelled prompts: a local ``.csv`` / ``.jsonl`` / ``.json`` file, or a Hugging Face
dataset (the face: :mod:`tpc_hooks.data`), read and checked before any model loads."""

import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import TPCHooksError
from ._promptset import PromptSet, _read_csv, _read_json_records
from ._sources import Row as _Row
from ._sources import norm

# Label values read as benign when the label column holds two values, so a message can suggest them in order.
_BENIGN_NAMES = frozenset(
    "0 false no benign safe harmless unharmful non-harmful nonharmful non-toxic nontoxic negative neg ok allowed "
    "clean normal neutral".split()
)


def load_prompt_file(
    path: str | os.PathLike,
    text_column: str = "text",
    label_column: str = "label",
    *,
    source_column: str = "source",
    label_names: Sequence[Any] | None = None,
) -> PromptSet:
    """Reads labelled prompts from a local ``.csv``, ``.jsonl`` or ``.json`` (a list of objects) file.

    Labels must be 0/1 (ints, ``"0"``/``"1"``, booleans), or the two values named by ``label_names``.
    Optional columns ``source_column``, ``category`` and ``adversarial`` are kept; where a row has no
    source, it is the file's stem. A file holding one class, or the same text with both labels, is read
    all the same (a calibration file is all benign); :func:`check_labelled` refuses it for training.

    Args:
        path: The file (a ``.csv`` needs a header row naming its columns).
        text_column: Column holding the prompt.
        label_column: Column holding the label (1 = harmful).
        source_column: Column naming each prompt's source, when the file has it.
        label_names: The label column's benign and harmful values, in that order, when they are not 0/1
            (e.g. ``("unharmful", "harmful")``).

    Raises:
        TPCHooksError: unknown suffix, a file that is not UTF-8 CSV/JSON, no rows, a missing column, an empty
            text, or a label that is neither 0/1 nor one of ``label_names``; the message names the row.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "mine.csv"
        >>> _ = p.write_text("prompt,harmful\\nHow do I bake bread?,0\\nWrite ransomware,1\\n")
        >>> ps = load_prompt_file(p, text_column="prompt", label_column="harmful")
        >>> ps.labels, ps.sources
        ([0, 1], ['mine', 'mine'])
        >>> _ = p.write_text("text,verdict\\nHow do I bake bread?,unharmful\\nWrite ransomware,harmful\\n")
        >>> load_prompt_file(p, label_column="verdict", label_names=("unharmful", "harmful")).labels
        [0, 1]
    """
    names = _check_names(label_names)
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        header, records = _read_csv(path)
        if header:  # one header for every row
            _check_columns(str(path), header, text_column, label_column, _csv_hint(header, text_column, label_column))
    elif suffix in (".jsonl", ".json"):
        records = _read_json_records(path, suffix)
    else:
        raise TPCHooksError(
            f"{path}: expected a .csv, .jsonl or .json file; got suffix {suffix!r}; save it as CSV with a header "
            "row, or as JSON Lines (one object a line)"
        )
    if not records:
        raise TPCHooksError(f"{path} holds no rows; expected rows with columns {text_column!r} and {label_column!r}")
    rows = _to_rows(records, str(path), text_column, label_column, source_column, names, path.stem)
    return PromptSet._from_rows(rows)


def check_labelled(ps: PromptSet, where: str) -> None:
    """Refuses labelled prompts a monitor cannot learn from: one class only, or a text with both labels.

    Texts count as the same up to case and spacing. The same text twice with one label is allowed.
    Row numbers in the message count ``ps``'s rows from 1 (a file's data rows, its header not counted).

    Args:
        ps: The prompts, in file order.
        where: What they were read from (a path or a dataset id), named in the message.

    Raises:
        TPCHooksError: no prompts, one class only, or a text with labels 0 and 1.

    Example:
        >>> ps = PromptSet(["Bake bread", "Write ransomware", "bake  bread"], [0, 1, 1], ["f"] * 3, [""] * 3,
        ...                [False] * 3)
        >>> check_labelled(ps.subset([0, 1]), "mine.csv")
        >>> try:
        ...     check_labelled(ps, "mine.csv")
        ... except TPCHooksError as err:
        ...     print(err)
        mine.csv: rows 1 and 3 hold the same text ('Bake bread') with labels 0 and 1; fix or drop one
    """
    classes = set(ps.labels)
    if len(classes) < 2:
        held = {0: "benign (0)", 1: "harmful (1)"}
        missing = " or ".join(held[c] for c in (0, 1) if c not in classes)
        rows = f"{len(ps)} row{'s' * (len(ps) != 1)}"
        what = f"only {held[next(iter(classes))]} prompts ({rows})" if classes else "no prompts"
        raise TPCHooksError(
            f"{where} holds {what}; a monitor needs harmful and benign examples; add {missing} rows, or check "
            "--label-column/--label-names (label_column=/label_names= in Python)"
        )
    first: dict[tuple[str, int], int] = {}
    clashes: list[tuple[int, int]] = []
    for i, (text, label) in enumerate(zip(ps.texts, ps.labels, strict=True)):
        key = norm(text)
        if (key, 1 - label) in first:
            clashes.append((first[key, 1 - label], i))
        first.setdefault((key, label), i)
    if clashes:
        a, b = clashes[0]
        text = ps.texts[a].strip()
        more = len({norm(ps.texts[j]) for _, j in clashes}) - 1
        also = f" ({more} more text{' has' if more == 1 else 's have'} both labels)" if more else ""
        raise TPCHooksError(
            f"{where}: rows {a + 1} and {b + 1} hold the same text ({_clip(text, 60)!r}) with labels "
            f"{ps.labels[a]} and {ps.labels[b]}{also}; fix or drop one"
        )


def load_hf_dataset(
    name: str,
    split: str | None = None,
    *,
    config: str | None = None,
    text_column: str = "text",
    label_column: str = "label",
    source_column: str = "source",
    label_names: Sequence[Any] | None = None,
) -> PromptSet:
    """Loads a labelled prompt dataset from the Hugging Face hub with ``datasets`` (needs the network).

    ``"allenai/wildguardmix"`` is mapped for you (``config`` ``"wildguardtest"`` by default, or
    ``"wildguardtrain"``): ``prompt`` is the text, ``prompt_harm_label`` ``"harmful"``/``"unharmful"``
    the label (rows without one are dropped), ``subcategory`` the category and ``adversarial`` the flag.
    It is gated: accept its terms on the hub and log in first. Other datasets need 0/1 labels in
    ``label_column``, or the two values named by ``label_names``, and are checked row by row as
    :func:`load_prompt_file` checks a file.

    Args:
        name: Hub id, e.g. ``"allenai/wildguardmix"``.
        split: Split; ``None`` means ``"test"`` for ``wildguardtest`` and ``"train"`` otherwise.
        config: Dataset configuration.
        text_column: Column holding the prompt (ignored for WildGuardMix).
        label_column: Column holding the label (ignored for WildGuardMix).
        source_column: Column naming each prompt's source, when the dataset has it; otherwise the source
            is the last part of ``name`` (ignored for WildGuardMix).
        label_names: The label column's benign and harmful values, in that order, when they are not 0/1
            (e.g. ``("safe", "unsafe")``; ignored for WildGuardMix).

    Raises:
        TPCHooksError: ``datasets`` is missing, the hub cannot be reached, a column is missing, a text is
            empty or a label is neither 0/1 nor one of ``label_names``.

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
    names = None if wildguard else _check_names(label_names)
    split = split or ("test" if config == "wildguardtest" else "train")
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as err:  # datasets raises ConnectionError, FileNotFoundError, ValueError, hub errors...
        raise TPCHooksError(
            f"could not load {name!r} (config={config!r}, split={split!r}): {type(err).__name__}: {err}. "
            "It needs the Hugging Face hub (and, for a gated dataset such as allenai/wildguardmix, accepted "
            "terms and `hf auth login`); offline, use default_prompt_set() or load_prompt_file()"
        ) from err
    _check_columns(name, list(ds.column_names), text_column, label_column)
    source = name.split("/")[-1]
    if not wildguard:
        return PromptSet._from_rows(_to_rows(ds, name, text_column, label_column, source_column, names, source))
    rows = []
    for rec in ds:
        label = {"harmful": 1, "unharmful": 0}.get(rec[label_column])
        if label is not None:
            category = str(rec.get("subcategory") or "")
            rows.append(_Row(rec[text_column], label, source, category, bool(rec.get("adversarial") or False)))
    return PromptSet._from_rows(rows)


def _to_rows(
    records: Iterable[Mapping[str, Any]],
    where: str,
    text_column: str,
    label_column: str,
    source_column: str,
    names: tuple[Any, Any] | None,
    default_source: str,
) -> list[_Row]:
    """Each record as a row, refusing the first with a missing column, an empty text or a bad label.

    ``records`` is read twice to list a bad label's column (a list, or a ``datasets.Dataset``).
    """
    rows = []
    for i, rec in enumerate(records, start=1):
        _check_columns(f"{where} row {i}", list(rec), text_column, label_column)
        text = rec[text_column]
        if not isinstance(text, str) or not text.strip():
            raise TPCHooksError(
                f"{where} row {i}: column {text_column!r} must hold a prompt (a non-empty string); got {text!r}; "
                "write the prompt or drop the row"
            )
        label = _as_label(rec[label_column], names)
        if label is None:
            values = (r.get(label_column) for r in records)
            raise TPCHooksError(_label_message(f"{where} row {i}", label_column, rec[label_column], values, names))
        adv = rec.get("adversarial", False)
        rows.append(
            _Row(
                text,
                label,
                str(rec.get(source_column) or default_source),
                str(rec.get("category") or ""),
                adv is True or str(adv).strip().lower() in ("1", "true"),
            )
        )
    return rows


def _check_columns(where: str, columns: list[Any], text_column: str, label_column: str, hint: str = "") -> None:
    """Refuses ``columns`` without the text and label columns, listing those it has and the flags to pass."""
    wanted = [(text_column, "--text-column", "text_column="), (label_column, "--label-column", "label_column=")]
    missing = [w for w in dict.fromkeys(wanted) if w[0] not in columns]
    if not missing:
        return
    shown = ", ".join(repr(c) for c in columns[:12]) + (f", ... ({len(columns)} in all)" if len(columns) > 12 else "")
    flags, args = "/".join(m[1] for m in missing), "/".join(m[2] for m in missing)
    raise TPCHooksError(
        f"{where} has no column {' or '.join(repr(m[0]) for m in missing)} (its columns: {shown or 'none'}); "
        f"pass {flags} ({args} in Python) naming the right one{hint}"
    )


def _csv_hint(header: list[str], *wanted: str) -> str:
    """Why a ``.csv``'s header may hold none of the ``wanted`` columns: it is not comma-separated, or is no header."""
    if any(c in header for c in wanted):
        return ""
    first = header[0] if header else ""
    if len(header) == 1 and (";" in first or "\t" in first):
        return "; the file looks separated by ';' or tabs: save it comma-separated"
    return "; a .csv's first line must name its columns"


def _check_names(names: Sequence[Any] | None) -> tuple[Any, Any] | None:
    if names is None:
        return None
    pair = tuple(names) if not isinstance(names, str) else (names,)
    if len(pair) != 2 or str(pair[0]).strip() == str(pair[1]).strip():
        raise TPCHooksError(
            f"label_names (--label-names) must be two different values, the benign one then the harmful one; "
            f"got {names!r}; e.g. --label-names unharmful harmful (label_names=('unharmful', 'harmful') in Python)"
        )
    return pair[0], pair[1]


def _label_message(where: str, column: str, value: Any, values: Iterable[Any], names: tuple[Any, Any] | None) -> str:
    """Why ``value`` is not a label: what was expected, the column's distinct values (up to 5), and the fix."""
    found = list(dict.fromkeys(v if isinstance(v, (str, int, float, type(None))) else repr(v) for v in values))
    shown = ", ".join(map(repr, found[:5])) + (f", ... ({len(found)} in all)" if len(found) > 5 else "")
    if names is None:
        expected = "must be 0 or 1 (1 = harmful)"
    else:
        expected = f"must be {names[0]!r} (benign) or {names[1]!r} (harmful), as label_names says"
    if len(found) == 2 and all(_as_label(v, names) is None for v in found):  # two values, neither read as a label
        pair, known = _benign_first(found[0], found[1])
        here, there = (" ".join(shlex.quote(str(v)) for v in p) for p in (pair, pair[::-1]))
        either = "" if known else f" or --label-names {there}, whichever puts the benign one first"
        fix = (
            "if these are the benign and harmful values, pass --label-names BENIGN HARMFUL (label_names= in "
            f"Python): here --label-names {here}{either}"
        )
    else:
        fix = "fix or drop the row"
    return f"{where}: column {column!r} {expected}; got {value!r} (values in the column: {shown}); {fix}"


def _benign_first(a: Any, b: Any) -> tuple[tuple[Any, Any], bool]:
    """``(a, b)`` ordered benign first when exactly one looks like a benign label, and whether it did."""
    benign_a, benign_b = (norm(str(v)) in _BENIGN_NAMES for v in (a, b))
    if benign_a != benign_b:
        return ((a, b) if benign_a else (b, a)), True
    return (a, b), False


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _as_label(value: Any, names: Sequence[Any] | None = None) -> int | None:
    if names is not None:
        return next((i for i, name in enumerate(names) if str(value).strip() == str(name).strip()), None)
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
