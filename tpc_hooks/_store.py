"""An on-disk activation store: ``.npy`` shards plus a ``manifest.json``.

Shards are written to a temporary name and renamed into place, then the manifest is
rewritten the same way, so a process killed at any point leaves a store whose manifest
lists only complete shards. Reading memory-maps the shards (never unpickles), so
training can stream data larger than RAM.
"""

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import TPCHooksError

MANIFEST_FILE = "manifest.json"
STORE_FORMAT = "tpc-hooks-store"
STORE_VERSION = 1


class ActivationStore:
    """Rows of float32 activations ``[n, d_model]`` kept on disk in shards.

    Example:
        >>> import tempfile, numpy as np
        >>> from tpc_hooks import ActivationStore
        >>> st = ActivationStore.create(tempfile.mkdtemp() + "/acts", d_model=4)
        >>> st.append(np.ones((3, 4))); st.append(np.zeros((2, 4)))
        >>> len(st), float(st.read(2, 4).sum())
        (5, 4.0)
    """

    def __init__(self, path: Path, manifest: dict[str, Any]):
        self.path = path
        self._manifest = manifest
        self._offsets = np.cumsum([0] + [s["rows"] for s in manifest["shards"]])

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(cls, path: str | os.PathLike, d_model: int, *, meta: dict[str, Any] | None = None,
               exist_ok: bool = False) -> "ActivationStore":
        """Creates an empty store (or opens an existing one with the same ``d_model`` if ``exist_ok``)."""
        root = Path(path)
        if (root / MANIFEST_FILE).exists():
            if not exist_ok:
                raise TPCHooksError(f"{root} already holds an activation store; open it with ActivationStore.open or pass exist_ok=True")
            store = cls.open(root)
            if store.d_model != d_model:
                raise TPCHooksError(f"{root} holds activations with d_model={store.d_model}, not {d_model}")
            return store
        root.mkdir(parents=True, exist_ok=True)
        manifest = {"format": STORE_FORMAT, "format_version": STORE_VERSION, "d_model": int(d_model),
                    "dtype": "float32", "shards": [], "meta": dict(meta or {})}
        store = cls(root, manifest)
        store._write_manifest()
        return store

    @classmethod
    def open(cls, path: str | os.PathLike) -> "ActivationStore":
        """Opens an existing store and checks that every listed shard is present."""
        root = Path(path)
        mpath = root / MANIFEST_FILE
        if not mpath.is_file():
            raise TPCHooksError(f"{mpath} is missing; {root} is not an activation store")
        try:
            manifest = json.loads(mpath.read_text())
        except json.JSONDecodeError as err:
            raise TPCHooksError(f"{mpath} is not valid JSON ({err}); the store is corrupt") from None
        if manifest.get("format") != STORE_FORMAT or manifest.get("format_version") != STORE_VERSION:
            raise TPCHooksError(f"{mpath} is not a version-{STORE_VERSION} {STORE_FORMAT} manifest")
        for shard in manifest["shards"]:
            if not (root / shard["file"]).is_file():
                raise TPCHooksError(f"{root / shard['file']} is listed in {mpath} but missing")
        return cls(root, manifest)

    def _write_manifest(self) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".manifest.", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(self._manifest, fh, indent=1)
        os.replace(tmp, self.path / MANIFEST_FILE)

    def append(self, rows: Any, *, meta: dict[str, Any] | None = None) -> None:
        """Appends rows as one new shard (atomically); ``meta`` updates the manifest's metadata
        in the same atomic write, so progress markers never run ahead of the data."""
        arr = np.ascontiguousarray(np.asarray(rows, dtype=np.float32))
        if arr.ndim != 2 or arr.shape[1] != self.d_model:
            raise TPCHooksError(f"rows must have shape [n, {self.d_model}]; got {arr.shape}")
        if not np.isfinite(arr).all():
            raise TPCHooksError("rows contain NaN/inf; refusing to store them")
        name = f"shard-{len(self._manifest['shards']):06d}.npy"
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
        os.replace(tmp, self.path / name)
        self._manifest["shards"].append({"file": name, "rows": int(arr.shape[0])})
        if meta:
            self._manifest["meta"].update(meta)
        self._offsets = np.append(self._offsets, self._offsets[-1] + arr.shape[0])
        self._write_manifest()

    # ------------------------------------------------------------------ reading
    @property
    def d_model(self) -> int:
        return int(self._manifest["d_model"])

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self._manifest["meta"])

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self), self.d_model)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __repr__(self) -> str:
        return f"ActivationStore({str(self.path)!r}, rows={len(self)}, d_model={self.d_model}, shards={len(self._manifest['shards'])})"

    def _shard(self, i: int) -> np.ndarray:
        return np.load(self.path / self._manifest["shards"][i]["file"], mmap_mode="r", allow_pickle=False)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a float32 array (copied out of the memory map)."""
        if not 0 <= start <= stop <= len(self):
            raise TPCHooksError(f"rows [{start}, {stop}) are outside this store's {len(self)} rows")
        parts = []
        first = int(np.searchsorted(self._offsets, start, side="right")) - 1
        for i in range(max(first, 0), len(self._manifest["shards"])):
            lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
            if lo >= stop:
                break
            a, b = max(start, lo) - lo, min(stop, hi) - lo
            if b > a:
                parts.append(np.array(self._shard(i)[a:b], dtype=np.float32))
        if not parts:
            return np.zeros((0, self.d_model), np.float32)
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def iter_chunks(self, chunk_rows: int = 65536) -> Iterator[tuple[int, np.ndarray]]:
        """Yields ``(start, rows)`` blocks of at most ``chunk_rows`` rows, in order."""
        for start in range(0, len(self), chunk_rows):
            yield start, self.read(start, min(start + chunk_rows, len(self)))

    def to_numpy(self) -> np.ndarray:
        """All rows in memory (only for stores that fit)."""
        return self.read(0, len(self))
