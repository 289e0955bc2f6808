"""The saved-head directory format: file names, config checks, safetensors I/O.

A saved head is a directory holding ``config.json`` and ``model.safetensors`` (float32).
Nothing here unpickles.
"""

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from .._errors import TPCHooksError

FORMAT_NAME = "tpc-hooks"
FORMAT_VERSION = 1
# a response monitor's files (monitor.reads == "answer") say 2: a version that reads 1 alone refuses them, where it
# would run them as a prompt monitor
READS_ANSWER_VERSION = 2
FORMAT_VERSIONS = (FORMAT_VERSION, READS_ANSWER_VERSION)
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

log = logging.getLogger(__name__)


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


PREVIOUS_WEIGHTS = ".model.safetensors.prev"  # the weights of the save being replaced, until the new config lands
CHECKSUM_KEY = "weights_sha256"


def files_of(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> tuple[bytes, bytes]:
    """The bytes of ``config.json`` and ``model.safetensors`` as :func:`write_dir` writes them (the
    config records the weights' SHA-256), without touching the disk; :func:`read_files` reads them."""
    flat = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in tensors.items()}
    data = save(flat, metadata={"format": FORMAT_NAME})
    cfg = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        **config,
        CHECKSUM_KEY: hashlib.sha256(data).hexdigest(),
    }
    return (json.dumps(cfg, indent=2, sort_keys=False) + "\n").encode(), data


def write_dir(path: str | os.PathLike, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    """Writes ``config.json`` and ``model.safetensors`` into ``path`` (created if needed).

    A crash at any point leaves a directory that loads as the previous save or as this one,
    never a mix: the config records the weights' SHA-256 and is written last; the weights it
    replaces stay beside it (``.model.safetensors.prev``, a hard link) until it lands, and
    :func:`read_dir` falls back to them when the weights no longer match the config. Every file
    is written to a temporary name and renamed into place; other files in ``path`` are left alone.
    """
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise TPCHooksError(
            f"{out} is a file, not a directory; a saved head or monitor is a directory holding "
            f"{CONFIG_FILE} and {WEIGHTS_FILE}: choose another path, or remove the file"
        )
    out.mkdir(parents=True, exist_ok=True)
    text, data = files_of(config, tensors)
    weights, prev = out / WEIGHTS_FILE, out / PREVIOUS_WEIGHTS
    if weights.is_file() and (out / CONFIG_FILE).is_file():
        prev.unlink(missing_ok=True)
        try:
            os.link(weights, prev)
        except OSError:  # a file system without hard links
            _atomic_write(prev, lambda tmp: Path(tmp).write_bytes(weights.read_bytes()))
    _atomic_write(weights, lambda tmp: Path(tmp).write_bytes(data))
    _atomic_write(out / CONFIG_FILE, lambda tmp: Path(tmp).write_bytes(text))
    prev.unlink(missing_ok=True)
    return out


MAX_DEPTH = 32  # a saved config nests a few levels (history records, the report): far deeper is corruption


def _depth(value: Any, limit: int = MAX_DEPTH + 1) -> int:
    """How deep ``value`` nests (lists and dicts), counted up to ``limit``."""
    level, frontier = 0, [value]
    while frontier and level < limit:
        frontier = [
            v for x in frontier for v in (x.values() if isinstance(x, dict) else x if isinstance(x, list) else ())
        ]
        level += 1
    return level if not frontier else limit


def dir_files(path: str | os.PathLike) -> tuple[bytes, bytes]:
    """The bytes of a saved directory's ``config.json`` and ``model.safetensors``, as
    :func:`read_files` takes them: the previous save's weights when a save into it was interrupted
    (they match the config, the new ones do not)."""
    src = Path(path)
    cfg_path, w_path = src / CONFIG_FILE, src / WEIGHTS_FILE
    if not src.is_dir():
        what = "is not a directory" if src.exists() else "does not exist"
        raise TPCHooksError(
            f"{src} {what}; a saved tpc-hooks head or monitor is a directory with {CONFIG_FILE} and {WEIGHTS_FILE}"
        )
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise TPCHooksError(f"{p} is missing; a saved tpc-hooks head has both {CONFIG_FILE} and {WEIGHTS_FILE}")
    text, data = cfg_path.read_bytes(), w_path.read_bytes()
    prev = src / PREVIOUS_WEIGHTS
    if prev.is_file() and not prev.is_symlink():
        try:
            want = json.loads(text).get(CHECKSUM_KEY)
        except (ValueError, RecursionError, AttributeError):
            return text, data  # read_files says what is wrong with the config
        if isinstance(want, str) and hashlib.sha256(data).hexdigest() != want:
            if hashlib.sha256(older := prev.read_bytes()).hexdigest() == want:
                log.warning(
                    "%s: a save into this directory was interrupted before its config was written; loading the "
                    "previous save (its weights are kept in %s)",
                    src,
                    PREVIOUS_WEIGHTS,
                )
                data = older
    return text, data


def read_dir(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Reads a saved directory; checks the format name and version, not the contents."""
    return read_files(*dir_files(path), Path(path))


def read_files(text: bytes, data: bytes, where: str | os.PathLike) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Reads a saved head or monitor from the bytes of its ``config.json`` and ``model.safetensors``
    (``where``: the directory they are named by in errors); checks the format name and version and
    that the weights are the ones the config records, not the contents."""
    cfg_path, w_path = Path(where) / CONFIG_FILE, Path(where) / WEIGHTS_FILE
    try:
        cfg = json.loads(text.decode())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TPCHooksError(f"{cfg_path} is not valid JSON ({err}); the file is corrupt") from None
    except RecursionError:
        raise TPCHooksError(
            f"{cfg_path} nests its JSON deeper than Python can read; a saved config is a few levels "
            "deep: the file is corrupt or was not written by tpc-hooks"
        ) from None
    if _depth(cfg) > MAX_DEPTH:
        raise TPCHooksError(
            f"{cfg_path} nests its JSON {_depth(cfg)} levels deep (at most {MAX_DEPTH} in a saved "
            "config): the file is corrupt or was not written by tpc-hooks"
        )
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT_NAME:
        raise TPCHooksError(f'{cfg_path} does not describe a tpc-hooks head (expected "format": "{FORMAT_NAME}")')
    version = cfg.get("format_version")
    if version not in FORMAT_VERSIONS or isinstance(version, bool):
        raise TPCHooksError(
            f"{cfg_path} has format_version={version!r}; this version of tpc-hooks reads "
            f"format_version {' or '.join(map(str, FORMAT_VERSIONS))}. "
            "Upgrade tpc-hooks, or re-save the head with the version that wrote it"
        )
    want = cfg.get(CHECKSUM_KEY)
    if want is not None and not isinstance(want, str):
        raise TPCHooksError(f"{cfg_path}: {CHECKSUM_KEY} must be a hex string; got {type(want).__name__}")
    if want is not None and hashlib.sha256(data).hexdigest() != want:
        _parse(data, w_path)  # a file that does not even parse says so first
        raise TPCHooksError(
            f"{w_path} does not match the SHA-256 recorded in {cfg_path}: the weights are corrupt, "
            "or come from another save; save the head or monitor again"
        )
    return cfg, _parse(data, w_path)


def _parse(data: bytes, w_path: Path) -> dict[str, torch.Tensor]:
    try:
        return load(data)
    except (SafetensorError, OSError, ValueError) as err:
        raise TPCHooksError(
            f"{w_path} could not be read as safetensors ({err}); the file is truncated or corrupt"
        ) from None


def require(cfg: dict[str, Any], key: str, kind: type | tuple[type, ...], where: Path | str) -> Any:
    """Returns ``cfg[key]`` or raises naming the file when it is missing or of the wrong type."""
    if key not in cfg:
        raise TPCHooksError(f"{where}: config.json lacks the required key {key!r}")
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TPCHooksError(f"{where}: config.json key {key!r} has the wrong type ({type(value).__name__})")
    return value


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], where: Path | str) -> None:
    """Strict check: same names, same shapes, float32, finite."""
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing:
        raise TPCHooksError(f"{where}: {WEIGHTS_FILE} lacks tensor(s) {missing} that config.json requires")
    if extra:
        raise TPCHooksError(
            f"{where}: {WEIGHTS_FILE} has unexpected tensor(s) {extra}; config.json does not describe them"
        )
    for name, shape in expected.items():
        t = tensors[name]
        if tuple(t.shape) != tuple(shape):
            raise TPCHooksError(
                f"{where}: tensor {name!r} in {WEIGHTS_FILE} has shape {tuple(t.shape)} but config.json implies "
                f"{tuple(shape)}"
            )
        if t.dtype != torch.float32:
            raise TPCHooksError(f"{where}: tensor {name!r} is {t.dtype}; the format stores float32")
        if not bool(torch.isfinite(t).all()):
            raise TPCHooksError(f"{where}: tensor {name!r} contains NaN/inf; the file is corrupt")
