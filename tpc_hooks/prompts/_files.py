"""Your own labelled prompts: a local ``.csv`` / ``.jsonl`` / ``.json`` file, or a Hugging Face
dataset (the face: :mod:`tpc_hooks.data`)."""

import csv
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import TPCHooksError
from ._promptset import PromptSet, _read_json_records
from ._sources import Row as _Row


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
                raise TPCHooksError(
                    f"{path} row {i} has no column {col!r} (columns: {sorted(rec)}); pass {arg}= naming the right one"
                )
        text = rec[text_column]
        if not isinstance(text, str) or not text.strip():
            raise TPCHooksError(f"{path} row {i}: column {text_column!r} must hold a non-empty string; got {text!r}")
        label = _as_label(rec[label_column])
        if label is None:
            raise TPCHooksError(
                f"{path} row {i}: column {label_column!r} must be 0 or 1 (1 = harmful); got {rec[label_column]!r}"
            )
        adv = rec.get("adversarial", False)
        rows.append(
            _Row(
                text,
                label,
                str(rec.get("source") or path.stem),
                str(rec.get("category") or ""),
                adv is True or str(adv).strip().lower() in ("1", "true"),
            )
        )
    return PromptSet._from_rows(rows)


def load_hf_dataset(
    name: str,
    split: str | None = None,
    *,
    config: str | None = None,
    text_column: str = "text",
    label_column: str = "label",
) -> PromptSet:
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
        raise TPCHooksError(
            f"{name} has no column(s) {missing} (columns: {ds.column_names}); pass text_column= and label_column="
        )
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
