"""Counting host reads of tensors in tests: the calls that would synchronise with a GPU
(``item``, ``tolist``, ``bool``, ``nonzero``, copies to the host). On a CPU-only machine there is
no synchronisation to observe, so the tests count the calls instead."""

import contextlib
import os
import sys

import torch


class HostReads:
    """Counts host reads of tensors: the calls that synchronise on a GPU.

    Calls made by torch's own code are not counted: its bookkeeping tensors (an optimizer's step
    counter, say) live on the CPU even when the model is on a GPU, so reading them syncs nothing.
    """

    NAMES = ("item", "tolist", "__bool__", "__int__", "__float__", "nonzero", "cpu", "numpy")
    TORCH = os.path.dirname(torch.__file__)

    def __init__(self):
        self.count = 0

    @contextlib.contextmanager
    def counting(self):
        saved = {n: getattr(torch.Tensor, n) for n in self.NAMES}

        def wrap(fn):
            def counted(t, *a, **kw):
                if not sys._getframe(1).f_code.co_filename.startswith(self.TORCH):
                    self.count += 1
                return fn(t, *a, **kw)

            return counted

        try:
            for n, fn in saved.items():
                setattr(torch.Tensor, n, wrap(fn))
            yield self
        finally:
            for n, fn in saved.items():
                setattr(torch.Tensor, n, fn)


def reads_per_step(run_n) -> float:
    """Host reads per decode step of ``run_n(n)`` (generating n tokens), from two lengths."""
    counts = {}
    for n in (4, 12):
        reads = HostReads()
        with reads.counting():
            run_n(n)
        counts[n] = reads.count
    return (counts[12] - counts[4]) / 8
