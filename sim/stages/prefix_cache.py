"""The prefix (block) cache behind the interface the prefill path uses.

Requests carry chained 512-token block hashes: an equal hash at position k means an equal prefix
up to block k, so a lookup counts the leading blocks the store holds and stops at the first
miss. ``MemoryPrefixStore`` is the in-memory reference implementation (unbounded, or LRU within
a capacity in blocks); the 3FS-style store with TTLs, watermark GC and erasure coding implements
the same two methods.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import numpy as np


class PrefixStore(Protocol):
    def lookup(self, hashes: np.ndarray, now: float, traffic_class: int = -1) -> int:
        """Number of leading blocks of ``hashes`` present (refreshing them for a request of
        ``traffic_class``; -1: unknown)."""
        ...

    def insert(self, hashes: np.ndarray, now: float, traffic_class: int) -> None:
        """Make ``hashes`` present (written after a prefill)."""
        ...

    def __len__(self) -> int:
        """Blocks held."""
        ...


class MemoryPrefixStore:
    """Chained-block prefix cache in memory; ``capacity_blocks`` None means unbounded."""

    __slots__ = ("blocks", "capacity", "evictions")

    def __init__(self, capacity_blocks: int | None = None) -> None:
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def lookup(self, hashes: np.ndarray, now: float, traffic_class: int = -1) -> int:
        blocks = self.blocks
        hit = 0
        for h in hashes.tolist():
            if h not in blocks:
                break
            if self.capacity is not None:
                blocks.move_to_end(h)
            hit += 1
        return hit

    def insert(self, hashes: np.ndarray, now: float, traffic_class: int) -> None:
        blocks = self.blocks
        for h in hashes.tolist():
            if h in blocks:
                if self.capacity is not None:
                    blocks.move_to_end(h)
            else:
                blocks[h] = None
        if self.capacity is not None:
            while len(blocks) > self.capacity:
                blocks.popitem(last=False)
                self.evictions += 1

    def __len__(self) -> int:
        return len(self.blocks)
