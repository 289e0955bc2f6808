"""Counting host synchronisations in a block of code, for the monitoring benchmark.

Two counters, both context managers with a ``count`` (and a per-kind ``counts``) after the block:

* :class:`CudaSyncs` (CUDA): ``torch.cuda.set_sync_debug_mode("warn")`` makes every operation
  that synchronises the host with the GPU (``.item()``, a device-to-host copy, ``nonzero``, a
  boolean-mask index, ...) emit a warning; the block's warnings are recorded and those counted.
* :class:`HostReads` (any device; the CPU proxy): temporarily wraps the tensor methods that
  read a value back on the host -- ``Tensor.item``, ``.tolist``, ``.__bool__``, ``.__int__``,
  ``.__float__``, ``.__index__``, ``.cpu``, ``.numpy``, ``.nonzero``, ``torch.nonzero``, and
  ``Tensor.__getitem__`` / ``__setitem__`` with a bool or uint8 mask -- and counts the calls.
  With ``device_only=True`` (for a CUDA run) a call counts only when its tensor is not on the
  CPU, and ``.to(...)`` counts when it moves a tensor from the device to the CPU; with
  ``device_only=False`` (a CPU-only run, where nothing synchronises) every call of those
  methods counts, since each would be a host read had the tensor been on a GPU (``.to`` is not
  counted there: on the CPU it cannot tell a copy to the host from a no-op). It is a proxy: a
  boolean ``__setitem__`` with a scalar value does not synchronise on a GPU, and reads made
  from C++ or through a function imported before the block (``from torch import nonzero``) are
  not seen. A call made inside another counted call (from Python) is not counted again.

Example:
    >>> x = torch.arange(4.0)
    >>> with HostReads() as reads:
    ...     _ = x.sum().item(), x[x > 1]
    >>> reads.count, dict(reads.counts)
    (2, {'item': 1, '__getitem__[mask]': 1})

Run ``python benchmarks/_syncs.py`` for a self-check.
"""

import threading
import warnings
from collections import Counter
from typing import Any, Self

import torch

_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero")
_MASKED = ("__getitem__", "__setitem__")
_SYNC_MESSAGE = "synchronizing CUDA operation"  # torch's text: "called a synchronizing CUDA operation"


def _is_mask(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


class HostReads:
    """Counts calls of the tensor methods that read values back to the host (see the module
    docstring); restores every wrapped attribute on exit, however the block ends.

    Args:
        device_only: count only calls on tensors that are not on the CPU (a CUDA run); False
            counts every call (the CPU proxy).
    """

    def __init__(self, device_only: bool = False):
        self.device_only = device_only
        self.counts: Counter = Counter()
        self._saved: list[tuple[Any, str, Any]] = []
        self._local = threading.local()

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    def _counts(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and (not self.device_only or t.device.type != "cpu")

    def _wrap(self, owner: Any, name: str, original: Any, when: Any, key: str | None = None) -> Any:
        local, counts = self._local, self.counts

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(local, "depth", 0)
            local.depth = depth + 1
            try:
                out = original(*args, **kwargs)
            finally:
                local.depth = depth
            if depth == 0 and when(args, out):
                counts[key or name] += 1
            return out

        wrapper.__name__ = name
        return wrapper

    def _patch(self, owner: Any, name: str, when: Any, key: str | None = None) -> None:
        own = owner.__dict__.get(name, None)  # None: inherited (torch.Tensor's methods live on TensorBase)
        self._saved.append((owner, name, own))
        setattr(owner, name, self._wrap(owner, name, getattr(owner, name), when, key))

    def __enter__(self) -> Self:
        if self._saved:
            raise RuntimeError("HostReads is not re-entrant")
        self.counts.clear()
        try:
            for name in _METHODS:
                self._patch(torch.Tensor, name, lambda a, out: self._counts(a[0]))
            for name in _MASKED:
                self._patch(
                    torch.Tensor, name, lambda a, out: self._counts(a[0]) and _is_mask(a[1]), key=f"{name}[mask]"
                )
            self._patch(torch, "nonzero", lambda a, out: bool(a) and self._counts(a[0]), key="torch.nonzero")
            if self.device_only:
                self._patch(
                    torch.Tensor,
                    "to",
                    lambda a, out: self._counts(a[0]) and isinstance(out, torch.Tensor) and out.device.type == "cpu",
                    key="to(cpu)",
                )
        except BaseException:
            self._restore()
            raise
        return self

    def _restore(self) -> None:
        while self._saved:
            owner, name, own = self._saved.pop()
            if own is None:
                delattr(owner, name)
            else:
                setattr(owner, name, own)

    def __exit__(self, *exc: object) -> None:
        self._restore()


class CudaSyncs:
    """Counts the host-GPU synchronisations in the block with ``torch.cuda.set_sync_debug_mode("warn")``
    (the previous mode and warning filters are restored on exit). CUDA only."""

    def __init__(self):
        self.counts: Counter = Counter()
        self._records: list | None = None

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    def __enter__(self) -> Self:
        if not torch.cuda.is_available():
            raise RuntimeError("CudaSyncs needs CUDA; use HostReads on a CPU-only machine")
        torch.cuda.synchronize()
        self._catch = warnings.catch_warnings(record=True)
        self._records = self._catch.__enter__()
        warnings.simplefilter("always")
        self._mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            torch.cuda.set_sync_debug_mode(self._mode)
        finally:
            self._catch.__exit__(*exc)
        self.counts = Counter("sync" for w in self._records if _SYNC_MESSAGE in str(w.message))


def _self_check() -> None:
    names = [*_METHODS, *_MASKED, "to"]
    before = {n: torch.Tensor.__dict__.get(n) for n in names}
    nonzero = torch.nonzero
    x = torch.arange(4.0)
    with HostReads() as reads:
        x.sum().item()
        bool(x.any())
        int(x[0])  # an integer index is not a read; int() is
        float(x[1])
        x.tolist()
        x.cpu()
        x.numpy()
        x.nonzero()
        torch.nonzero(x)
        x[x > 1]
        y = x.clone()
        y[y > 2] = 0.0
        _ = x + 1, x[1:], x.to(torch.float64)  # no reads
        list(range(torch.tensor(2)))  # __index__
    assert reads.counts == {
        "item": 1,
        "__bool__": 1,
        "__int__": 1,
        "__float__": 1,
        "tolist": 1,
        "cpu": 1,
        "numpy": 1,
        "nonzero": 1,
        "torch.nonzero": 1,
        "__getitem__[mask]": 1,
        "__setitem__[mask]": 1,
        "__index__": 1,
    }, dict(reads.counts)
    assert {n: torch.Tensor.__dict__.get(n) for n in names} == before and torch.nonzero is nonzero, "not restored"
    with HostReads(device_only=True) as dev:  # CPU tensors do not count in the device mode
        x.sum().item()
        x.to("cpu")
        x[x > 1]
    assert dev.count == 0, dict(dev.counts)
    try:
        with HostReads() as reads:
            x[0].item()
            raise KeyError("boom")
    except KeyError:
        pass
    assert reads.count == 1 and torch.Tensor.__dict__.get("item") is None, "not restored after an exception"
    print(f"HostReads: ok ({len(names) + 1} attributes wrapped and restored)")
    if torch.cuda.is_available():
        g = torch.arange(4.0, device="cuda")
        with CudaSyncs() as syncs:
            g.sum().item()
            g[g > 1]
            _ = g + 1
        with HostReads(device_only=True) as dev:
            g.sum().item()
            g.to("cpu")
            _ = g + 1
        print(
            f"CudaSyncs: {syncs.count} syncs for .item() and a mask index (expected >= 2); "
            f"HostReads(device_only=True): {dict(dev.counts)}"
        )
        assert syncs.count >= 2 and dev.counts == {"item": 1, "to(cpu)": 1}


if __name__ == "__main__":
    _self_check()
