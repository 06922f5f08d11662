"""The SWA cache: one fixed-size slot per sequence in the host memory of the prefill machine that
produced it, and the in-memory directory of which machine holds which slot.

A slot holds the encoder layers' sliding-window state at a block boundary of a prompt, keyed by
the chained hash of the last full block before that boundary (so a later request whose
prefix-cache hit ends at that block can resume from it). Each machine keeps its slots LRU within
its host memory. A lookup from a machine is a local hit, a remote hit (the slot is fetched over
the VLAN) or a miss (the last tokens of the hit prefix are replayed instead).
"""

from __future__ import annotations

from collections import OrderedDict
from enum import IntEnum


class SwaLookup(IntEnum):
    MISS = 0
    LOCAL = 1
    REMOTE = 2


class SwaDirectory:
    def __init__(self, machines: int, slots_per_machine: int) -> None:
        if slots_per_machine < 1:
            raise ValueError("a machine must hold at least one SWA slot")
        self.capacity = slots_per_machine
        self.where: dict[int, int] = {}  # key -> machine holding it
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(machines)]
        self.evictions = 0

    def lookup(self, key: int, machine: int) -> SwaLookup:
        holder = self.where.get(key)
        if holder is None:
            return SwaLookup.MISS
        self.lru[holder].move_to_end(key)
        return SwaLookup.LOCAL if holder == machine else SwaLookup.REMOTE

    def holder(self, key: int) -> int | None:
        return self.where.get(key)

    def insert(self, key: int, machine: int) -> None:
        """Store the slot for ``key`` on ``machine`` (moving it if another machine had it)."""
        old = self.where.get(key)
        if old is not None:
            del self.lru[old][key]
        lru = self.lru[machine]
        lru[key] = None
        self.where[key] = machine
        if len(lru) > self.capacity:
            evicted, _ = lru.popitem(last=False)
            del self.where[evicted]
            self.evictions += 1

    def slots(self, machine: int) -> int:
        return len(self.lru[machine])

    def check(self) -> list[str]:
        errs = []
        if sum(len(m) for m in self.lru) != len(self.where):
            errs.append("SWA directory and per-machine slots disagree")
        if any(len(m) > self.capacity for m in self.lru):
            errs.append("a machine holds more SWA slots than its host memory allows")
        return errs
