"""The prefix (block) cache behind the interface the prefill path uses.

Requests carry chained 512-token block hashes: an equal hash at position k means an equal prefix
up to block k, so a lookup counts the leading blocks the store holds and stops at the first
miss. ``MemoryPrefixStore`` is the in-memory reference implementation (unbounded, or LRU within
a capacity in blocks); the 3FS-style store with TTLs, watermark GC and erasure coding implements
the same two methods.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .block_slots import BlockSlots, SlotColumns, SlotQueue


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

    def release(self) -> None:
        """Free the per-block state when the run is over (counts keep their values)."""
        ...


class MemoryPrefixStore:
    """Chained-block prefix cache in memory; ``capacity_blocks`` None means unbounded.

    A block is a slot (sim/stages/block_slots.py) with a ``present`` flag; a bounded store
    also keeps its blocks in least-recently-used order, a queue of slots."""

    __slots__ = ("capacity", "cols", "evictions", "held", "order", "slots")

    def __init__(self, capacity_blocks: int | None = None, largest_id: int = -1) -> None:
        """``largest_id``: the workload's largest block id, when known (its slots are sized
        up front: :meth:`BlockSlots.reserve`)."""
        self.capacity = capacity_blocks
        self.cols = SlotColumns(present=np.bool_, pos=np.int32)
        self.slots = BlockSlots(self.cols)
        self.slots.reserve(largest_id)
        self.order = SlotQueue()
        self.held = 0
        self.evictions = 0

    def lookup(self, hashes: np.ndarray, now: float, traffic_class: int = -1) -> int:
        if not len(hashes):
            return 0
        slots = self.slots.find(hashes)
        missing = ~self.cols.present[slots]
        hit = int(missing.argmax())
        if not missing[hit]:
            hit = len(hashes)
        if hit and self.capacity is not None:
            self._use(slots[:hit])
        return hit

    def insert(self, hashes: np.ndarray, now: float, traffic_class: int) -> None:
        if not len(hashes):
            return
        slots = self.slots.add(hashes)
        present = self.cols.present
        new = slots[~present[slots]]
        present[slots] = True
        self.held += len(np.unique(new)) if len(new) > 1 else len(new)
        if self.capacity is not None:
            self._use(slots)
            if self.held > self.capacity:
                self._evict(self.held - self.capacity)

    def _use(self, slots: np.ndarray) -> np.ndarray:
        """Make ``slots`` the most recently used, in order."""
        return self.order.push(slots, self.cols.pos, self._live)

    def _live(self, slots: np.ndarray, at: np.ndarray) -> np.ndarray:
        return self.cols.present[slots] & (self.cols.pos[slots] == at)

    def _evict(self, count: int) -> None:
        """Drop the ``count`` least recently used blocks."""
        scan = 256
        while count:
            slots, at = self.order.front(scan)
            live = self._live(slots, at)
            taken = np.cumsum(live)
            stop = int(np.searchsorted(taken, count)) + 1 if taken[-1] >= count else len(slots)
            gone = slots[:stop][live[:stop]]
            self.cols.present[gone] = False
            self.held -= len(gone)
            self.evictions += len(gone)
            count -= len(gone)
            self.order.pop(stop)
            scan *= 2

    def release(self) -> None:
        """Forget the blocks to free their memory when the run is over (the count of blocks
        held and evictions keep their values); the store takes no more traffic."""
        self.cols.clear()
        self.slots = BlockSlots(self.cols)
        self.order = SlotQueue()

    def __len__(self) -> int:
        return self.held
