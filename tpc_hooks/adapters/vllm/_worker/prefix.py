"""What lets a monitored request read vLLM's prefix cache: the monitor's running state at every
KV block boundary, kept under the block's content (:class:`BlockStates`), and per request the
chain hash of what it has computed so far (:class:`Chain`).

A request that finds its first ``c`` tokens in the engine's prefix cache never computes them, so
no monitor sees their activations; but whoever computed those blocks first went through the
monitor, which kept its running state (pooled sum and count, running maximum, last row, or a
per-token aggregate) at the end of each block. The key of a block's state is a hash chained over
every token from the sequence's start to the block's end (and the LoRA adapter it ran with), as
the KV cache's own block hashes are: it names the content of the prefix, not a physical block,
so a block evicted and filled again by another prompt can never bring back the first prompt's
state, and a recomputed prefix finds the state it would have built. A request whose cached
prefix has no kept state (computed before the monitor was armed, restored from an offload tier,
or forgotten by the bounded store) is never scored on part of its prompt: the caller recomputes
it.

Imports no vLLM: the rule is tested on its own.
"""

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np


def root(lora: Any = None) -> bytes:
    """The chain's start: what, besides the tokens, changes a prefix's activations."""
    return hashlib.blake2b(f"tpc-hooks-prefix:{lora!r}".encode(), digest_size=16).digest()


def link(prev: bytes, tokens: Sequence[int]) -> bytes:
    """The hash of a block: the previous block's hash and this block's token ids."""
    return hashlib.blake2b(prev + np.asarray(tokens, dtype=np.int64).tobytes(), digest_size=16).digest()


def prefix_hash(tokens: Sequence[int], block_size: int, lora: Any = None) -> bytes:
    """The chain hash of ``tokens`` (a whole number of blocks).

    Example:
        >>> a = prefix_hash(list(range(8)), 4)
        >>> a == prefix_hash(list(range(8)), 4), a == prefix_hash(list(range(8)), 4, lora=1)
        (True, False)
    """
    if len(tokens) % block_size:
        raise ValueError(f"a prefix of {len(tokens)} tokens is not a whole number of {block_size}-token blocks")
    h = root(lora)
    for a in range(0, len(tokens), block_size):
        h = link(h, tokens[a : a + block_size])
    return h


class Chain:
    """One request's position in its chain: the hash of its last full block and the tokens since.

    :meth:`extend` takes the token ids the request computed in a pass and returns the offsets
    (within them, 1-based) at which a block was completed, with each block's hash.

    Example:
        >>> c = Chain(block_size=4)
        >>> [off for off, _ in c.extend([1, 2, 3, 4, 5, 6])], c.computed
        ([4], 6)
        >>> [off for off, _ in c.extend([7, 8])], c.computed
        ([2], 8)
    """

    def __init__(self, block_size: int, lora: Any = None):
        self.block_size = block_size
        self.hash = root(lora)
        self.lora = lora
        self.tail: list[int] = []
        self.computed = 0  # tokens the request has computed (or read from the cache) so far

    def start(self, prefix: Sequence[int], known: bytes | None = None) -> bytes:
        """Places the chain after a cached ``prefix`` (whole blocks); returns its hash (``known``:
        the caller has it already)."""
        self.hash = prefix_hash(prefix, self.block_size, self.lora) if known is None else known
        self.tail, self.computed = [], len(prefix)
        return self.hash

    def extend(self, tokens: Sequence[int]) -> list[tuple[int, bytes]]:
        done = []
        need = self.block_size - len(self.tail)
        at = 0
        while len(tokens) - at >= need:
            self.hash = link(self.hash, self.tail + list(tokens[at : at + need]))
            at += need
            done.append((at, self.hash))
            self.tail, need = [], self.block_size
        self.tail += list(tokens[at:])
        self.computed += len(tokens)
        return done


class BlockStates:
    """The monitor's state at block ends, by chain hash, bounded (least recently used goes first).

    Example:
        >>> store = BlockStates(capacity=2)
        >>> store.put(b"a", 1); store.put(b"b", 2); store.get(b"a"); store.put(b"c", 3)
        1
        >>> store.get(b"b") is None, store.get(b"a"), len(store)
        (True, 1, 2)
    """

    def __init__(self, capacity: int):
        self.capacity = max(1, int(capacity))
        self._states: OrderedDict[bytes, Any] = OrderedDict()
        self.hits = self.misses = 0

    def put(self, key: bytes, state: Any) -> None:
        self._states[key] = state
        self._states.move_to_end(key)
        while len(self._states) > self.capacity:
            self._states.popitem(last=False)

    def get(self, key: bytes) -> Any:
        state = self._states.get(key)
        if state is None:
            self.misses += 1
            return None
        self.hits += 1
        self._states.move_to_end(key)
        return state

    def __contains__(self, key: bytes) -> bool:  # a look that counts neither a hit nor a miss
        return key in self._states

    def clear(self) -> None:
        self._states.clear()

    def __len__(self) -> int:
        return len(self._states)
