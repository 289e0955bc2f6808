"""The command line's input checks: every path, model name and dataset a verb is given is checked
before any model loads, and a bad one ends as one sentence (what was expected, what arrived, the fix).

The verbs that run on these checks are in ``_verbs``."""

from pathlib import Path

from .._errors import TPCHooksError
from ..offline import DEFAULT_MODEL
from ..saving import is_repo_id

_DATA_SUFFIXES = (".csv", ".jsonl", ".json")


def is_hub_id(name: str) -> bool:
    """What a --model or --dataset that is not an existing path may plausibly be."""
    return is_repo_id(name)


def check_out_dir(path: str | Path, flag: str = "--out") -> None:
    """``path`` may be created as a directory: it is one already, or its nearest existing ancestor is."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise TPCHooksError(
            f"{flag} {path} is an existing file; expected a directory (new or existing) to write into; "
            "choose another path or remove the file"
        )
    existing = next((q for q in p.parents if q.exists()), None)
    if existing is not None and not existing.is_dir():
        raise TPCHooksError(
            f"{flag} {path} lies under {existing}, which is a file; expected a directory path; choose another path"
        )


def check_json_out(path: str | None, flag: str = "--json") -> None:
    """``path`` (when given) is a file that can be written: not a directory, in a directory that exists."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise TPCHooksError(
            f"{flag} {path} is a directory; expected a file path to write JSON to; "
            f"add a file name, e.g. {p / 'results.json'}"
        )
    if not p.parent.is_dir():
        raise TPCHooksError(
            f"{flag} {path}: its directory {p.parent} does not exist; expected a file in an existing "
            f"directory; create it first (mkdir -p {p.parent}) or choose another path"
        )


def check_dataset(name: str) -> None:
    """``--dataset``: ``"default"``, a readable UTF-8 file, or what may be a hub dataset id."""
    if name == "default":
        return
    p = Path(name)
    if p.is_dir():
        raise TPCHooksError(
            f"--dataset {name} is a directory; expected 'default', a local .csv/.jsonl/.json file or a "
            "hub dataset id; pass the file inside it"
        )
    if p.exists():  # a local file: load_prompt_file checks its suffix and contents, once it decodes
        try:
            with open(p, encoding="utf-8") as f:
                while f.read(1 << 20):
                    pass
        except UnicodeDecodeError as err:
            raise TPCHooksError(
                f"--dataset {name} is not UTF-8 text ({err.reason}); expected a UTF-8 .csv/.jsonl/.json "
                "file; re-save it as UTF-8"
            ) from None
        return
    if not is_hub_id(name) or name.lower().endswith(_DATA_SUFFIXES):
        raise TPCHooksError(
            f"--dataset {name}: no such file; expected 'default', an existing .csv/.jsonl/.json file or "
            "a hub dataset id such as allenai/wildguardmix; check the path"
        )


def check_model(name: str | None, flag: str = "--model") -> None:
    """``--model`` (or the option ``flag``): the packaged default, a Hugging Face model folder, or what
    may be a hub model id."""
    if name in (None, DEFAULT_MODEL):
        return
    p = Path(name)
    if p.exists():
        if not p.is_dir():
            raise TPCHooksError(
                f"{flag} {name} is a file; expected a Hugging Face model folder (with config.json) "
                "or a hub model id; pass the folder"
            )
        if not (p / "config.json").is_file():
            raise TPCHooksError(
                f"{flag} {name} has no config.json; expected a Hugging Face model folder (as written "
                "by save_pretrained) or a hub model id; pass the model's folder"
            )
        return
    if not is_hub_id(name):
        raise TPCHooksError(
            f"{flag} {name}: no such folder; expected a local model folder or a hub model id such as "
            f"HuggingFaceTB/SmolLM2-135M-Instruct; check the path, or leave {flag} out for the packaged "
            f"{DEFAULT_MODEL}"
        )


def _existing_dir(path: str, flag: str, expected: str, fix: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        state = "it is a file" if p.exists() else "it does not exist"
        raise TPCHooksError(f"{flag} {path} is not a directory ({state}); expected {expected}; {fix}")
    return p


def check_monitor_dir(path: str) -> None:
    """``--monitor``: a directory (what ``tpc-hooks train`` saves)."""
    _existing_dir(
        path,
        "--monitor",
        "the directory saved by tpc-hooks train (config.json + model.safetensors)",
        f"check the path, or run tpc-hooks train --out {path}",
    )


def check_acts(path: str) -> Path:
    """``--acts``: a directory (what ``tpc-hooks collect`` writes), as a path."""
    return _existing_dir(
        path,
        "--acts",
        "the directory written by tpc-hooks collect (collect.json and one folder per split)",
        f"check the path, or run tpc-hooks collect --out {path} first",
    )
