"""An on-disk activation store: ``.npy`` shards plus a ``manifest.json``.

Shards are written to a temporary name and renamed into place, then the manifest is
rewritten the same way, so a process killed at any point leaves a store whose manifest
lists only complete shards. Reading memory-maps the shards (never unpickles), so
training can stream data larger than RAM.

A store of sequences (per-token rows, ``create(..., sequences=True)``) also keeps each
shard's sequence lengths in ``shard-NNNNNN.lengths.npy``, written before the manifest that
lists the shard, so the rows split back into sequences exactly.
"""

import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import TPCHooksError

log = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
STORE_FORMAT = "tpc-hooks-store"
STORE_VERSION = 1


class ActivationStore:
    """Rows of float32 activations ``[n, d_model]`` kept on disk in shards.

    A store created with ``sequences=True`` holds sequences of rows (one per token of each
    prompt, as ``tpc.collect(..., pooling="token", store=...)`` writes): every append gives the
    sequences' lengths, and :meth:`sequences` reads them back one array ``[T_i, d_model]`` each.

    Example:
        >>> import tempfile, numpy as np
        >>> from tpc_hooks import ActivationStore
        >>> st = ActivationStore.create(tempfile.mkdtemp() + "/acts", d_model=4)
        >>> st.append(np.ones((3, 4))); st.append(np.zeros((2, 4)))
        >>> len(st), float(st.read(2, 4).sum())
        (5, 4.0)
        >>> seq = ActivationStore.create(tempfile.mkdtemp() + "/tokens", d_model=4, sequences=True)
        >>> seq.append(np.ones((5, 4)), lengths=[2, 3])
        >>> seq.n_sequences, [s.shape for s in seq.sequences()]
        (2, [(2, 4), (3, 4)])
    """

    def __init__(self, path: Path, manifest: dict[str, Any]):
        self.path = path
        self._manifest = manifest
        self._offsets = np.cumsum([0] + [s["rows"] for s in manifest["shards"]])
        self._lengths: np.ndarray | None = None  # every sequence's row count, read when first needed

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        d_model: int,
        *,
        meta: dict[str, Any] | None = None,
        exist_ok: bool = False,
        sequences: bool = False,
    ) -> "ActivationStore":
        """Creates an empty store (or opens an existing one with the same ``d_model`` and kind if
        ``exist_ok``); ``sequences=True``: a store of sequences (every append gives ``lengths``)."""
        root = Path(path)
        if (root / MANIFEST_FILE).exists():
            if not exist_ok:
                raise TPCHooksError(
                    f"{root} already holds an activation store; open it with ActivationStore.open or pass exist_ok=True"
                )
            store = cls.open(root)
            if store.d_model != d_model:
                raise TPCHooksError(f"{root} holds activations with d_model={store.d_model}, not {d_model}")
            if store.holds_sequences != bool(sequences):
                kinds = ("pooled rows (one per prompt)", "per-token sequences")
                raise TPCHooksError(
                    f"{root} holds {kinds[store.holds_sequences]}, not {kinds[bool(sequences)]}; "
                    "use another store directory"
                )
            store._clean_orphans()
            return store
        root.mkdir(parents=True, exist_ok=True)
        manifest = {
            "format": STORE_FORMAT,
            "format_version": STORE_VERSION,
            "d_model": int(d_model),
            "dtype": "float32",
            "shards": [],
            "meta": dict(meta or {}),
        }
        if sequences:
            manifest["sequences"] = True
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
            for key in ("file", "lengths") if manifest.get("sequences") else ("file",):
                if key not in shard:
                    raise TPCHooksError(f"{mpath}: a shard entry lacks {key!r}; the store is corrupt")
                if not (root / shard[key]).is_file():
                    raise TPCHooksError(f"{root / shard[key]} is listed in {mpath} but missing")
        return cls(root, manifest)

    def _clean_orphans(self) -> None:
        """Removes what an interrupted append left behind (a store has one writer): temporary files
        and shards the manifest does not list (written, but killed before the manifest was)."""
        listed = {f for shard in self._manifest["shards"] for f in (shard["file"], shard.get("lengths")) if f}
        for p in self.path.iterdir():
            temporary = p.name.startswith(".") and p.name.endswith(".tmp")
            unlisted = p.name.startswith("shard-") and p.name.endswith(".npy") and p.name not in listed
            if p.is_file() and (temporary or unlisted):
                log.info("removing %s, left by an interrupted collection", p)
                p.unlink()

    def _write_manifest(self) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".manifest.", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(self._manifest, fh, indent=1)
        os.replace(tmp, self.path / MANIFEST_FILE)

    def append(self, rows: Any, *, meta: dict[str, Any] | None = None, lengths: Any = None) -> None:
        """Appends rows as one new shard (atomically); ``meta`` updates the manifest's metadata
        in the same atomic write, so progress markers never run ahead of the data.

        A store of sequences needs ``lengths``: the row count of each sequence in ``rows``, in
        order (each at least 1, summing to ``len(rows)``); it is saved with the shard, in the
        same atomic step (a crash leaves the shard and its lengths both listed, or neither).
        """
        arr = np.ascontiguousarray(np.asarray(rows, dtype=np.float32))
        if arr.ndim != 2 or arr.shape[1] != self.d_model:
            raise TPCHooksError(f"rows must have shape [n, {self.d_model}]; got {arr.shape}")
        if not np.isfinite(arr).all():
            raise TPCHooksError("rows contain NaN/inf; refusing to store them")
        lens = self._check_lengths(lengths, arr.shape[0])
        name = f"shard-{len(self._manifest['shards']):06d}.npy"
        entry: dict[str, Any] = {"file": name, "rows": int(arr.shape[0])}
        if lens is not None:  # written first: the shard is listed only once both are in place
            entry["lengths"] = name.replace(".npy", ".lengths.npy")
            entry["sequences"] = int(len(lens))
            self._save(entry["lengths"], lens)
        self._save(name, arr)
        self._manifest["shards"].append(entry)
        if meta:
            self._manifest["meta"].update(meta)
        self._offsets = np.append(self._offsets, self._offsets[-1] + arr.shape[0])
        if lens is not None and self._lengths is not None:
            self._lengths = np.concatenate([self._lengths, lens])
        self._write_manifest()

    def _save(self, name: str, arr: np.ndarray) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
        os.replace(tmp, self.path / name)

    def _check_lengths(self, lengths: Any, n_rows: int) -> np.ndarray | None:
        if not self.holds_sequences:
            if lengths is not None:
                raise TPCHooksError(
                    f"{self.path} holds plain rows, not sequences; append rows without lengths= "
                    "(create the store with sequences=True to keep sequence lengths)"
                )
            return None
        if lengths is None:
            raise TPCHooksError(
                f"{self.path} holds sequences: append(rows, lengths=[...]) needs each sequence's row count"
            )
        lens = np.asarray(lengths)
        if lens.ndim != 1 or (lens.size and not np.issubdtype(lens.dtype, np.integer)):
            raise TPCHooksError(f"lengths must be a 1-D list of integers; got shape {lens.shape}, dtype {lens.dtype}")
        lens = lens.astype(np.int64)
        if (lens < 1).any() or int(lens.sum()) != n_rows:
            raise TPCHooksError(
                f"lengths must be positive and sum to the {n_rows} rows appended; "
                f"got {len(lens)} lengths summing to {int(lens.sum())}"
            )
        return lens

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

    @property
    def holds_sequences(self) -> bool:
        """Whether this store keeps sequence lengths (per-token rows; see :meth:`sequences`)."""
        return bool(self._manifest.get("sequences", False))

    @property
    def n_sequences(self) -> int:
        """How many sequences a store of sequences holds."""
        self._need_sequences("n_sequences")
        return sum(int(s["sequences"]) for s in self._manifest["shards"])

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __repr__(self) -> str:
        seqs = f", sequences={self.n_sequences}" if self.holds_sequences else ""
        return (
            f"ActivationStore({str(self.path)!r}, rows={len(self)}{seqs}, d_model={self.d_model}, "
            f"shards={len(self._manifest['shards'])})"
        )

    def _need_sequences(self, what: str) -> None:
        if not self.holds_sequences:
            raise TPCHooksError(
                f"{self.path} holds plain rows (one per prompt), not sequences: it has no {what}; "
                "read it with read() or to_numpy()"
            )

    def _shard(self, i: int) -> np.ndarray:
        entry = self._manifest["shards"][i]
        f = self.path / entry["file"]
        try:
            a = np.load(f, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:  # truncated, corrupt or missing
            raise TPCHooksError(
                f"{f} could not be read ({err}): the shard is truncated or corrupt; delete the store "
                f"{self.path} and collect it again"
            ) from None
        if a.ndim != 2 or a.shape[1] != self.d_model or a.shape[0] != entry.get("rows", a.shape[0]):
            raise TPCHooksError(
                f"{f} holds an array of shape {a.shape} but the store's manifest expects "
                f"[{entry.get('rows')}, {self.d_model}]; delete the store {self.path} and collect it again"
            )
        return a

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

    def lengths(self) -> np.ndarray:
        """Every sequence's row count ``[n_sequences]`` (int64), in order (a store of sequences)."""
        self._need_sequences("lengths")
        if self._lengths is None:
            parts = [np.load(self.path / s["lengths"], allow_pickle=False) for s in self._manifest["shards"]]
            for s, p in zip(self._manifest["shards"], parts, strict=True):
                if p.ndim != 1 or len(p) != s["sequences"] or int(p.sum()) != s["rows"]:
                    raise TPCHooksError(
                        f"{self.path / s['lengths']} does not describe the {s['rows']} rows of "
                        f"{s['file']} as {s['sequences']} sequences; the store is corrupt"
                    )
            self._lengths = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return self._lengths.copy()

    def sequences(self, start: int = 0, stop: int | None = None) -> list[np.ndarray]:
        """Sequences ``[start, stop)`` (default: all) of a store of sequences, one float32 array
        ``[T_i, d_model]`` each, in order (copied out of the memory map)."""
        self._need_sequences("sequences")
        lens = self.lengths()
        stop = len(lens) if stop is None else stop
        if not 0 <= start <= stop <= len(lens):
            raise TPCHooksError(f"sequences [{start}, {stop}) are outside this store's {len(lens)} sequences")
        ends = np.concatenate([[0], np.cumsum(lens)])
        rows = self.read(int(ends[start]), int(ends[stop]))
        return np.split(rows, (ends[start + 1 : stop] - ends[start]).astype(np.int64)) if stop > start else []
