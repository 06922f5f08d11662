"""The SWA cache: one fixed-size slot per sequence in the host memory of the prefill machine that
produced it, and the in-memory directory of which machine holds which slot.

A slot holds the encoder layers' sliding-window state at a block boundary of a prompt, keyed by
the chained hash of the last full block before that boundary (so a later request whose
prefix-cache hit ends at that block can resume from it). Each machine keeps its slots LRU within
its host memory. A lookup from a machine is a local hit, a remote hit (the slot is fetched over
the VLAN) or a miss (the last tokens of the hit prefix are replayed instead).

The directory keeps a key's holder in a numpy column indexed by the key's slot
(sim/stages/block_slots.py) and each machine's LRU order as a queue of slots, a few bytes per
key rather than a dict entry and a linked-list node.
"""

from __future__ import annotations

from enum import IntEnum
from functools import partial

import numpy as np

from .block_slots import BlockSlots, SlotColumns, SlotQueue


class SwaLookup(IntEnum):
    MISS = 0
    LOCAL = 1
    REMOTE = 2


class SwaDirectory:
    def __init__(self, machines: int, slots_per_machine: int) -> None:
        if slots_per_machine < 1:
            raise ValueError("a machine must hold at least one SWA slot")
        self.capacity = slots_per_machine
        # per key slot: 1 + the machine holding it (0: none), its position in that machine's LRU
        self.cols = SlotColumns(machine=np.int16 if machines < 32767 else np.int32, pos=np.int32)
        self.keys = BlockSlots(self.cols, direct_span=0)  # a key per prompt: sparse ids
        self.lru = [SlotQueue() for _ in range(machines)]
        self.held = [0] * machines
        self._live = [partial(self._live_on, m) for m in range(machines)]
        self.evictions = 0

    def _live_on(self, machine: int, slots: np.ndarray, at: np.ndarray) -> np.ndarray:
        return (self.cols.machine[slots] == machine + 1) & (self.cols.pos[slots] == at)

    def lookup(self, key: int, machine: int) -> SwaLookup:
        slot = self.keys.find_one(key)
        holder = int(self.cols.machine[slot]) - 1
        if holder < 0:
            return SwaLookup.MISS
        self.lru[holder].push_one(slot, self.cols.pos, self._live[holder])
        return SwaLookup.LOCAL if holder == machine else SwaLookup.REMOTE

    def holder(self, key: int) -> int | None:
        holder = int(self.cols.machine[self.keys.find_one(key)]) - 1
        return holder if holder >= 0 else None

    def insert(self, key: int, machine: int) -> None:
        """Store the slot for ``key`` on ``machine`` (moving it if another machine had it)."""
        slot = self.keys.add_one(key)
        machines = self.cols.machine
        old = int(machines[slot]) - 1
        if old >= 0:
            self.held[old] -= 1  # its entry in the old order dies
        machines[slot] = machine + 1
        self.lru[machine].push_one(slot, self.cols.pos, self._live[machine])
        self.held[machine] += 1
        if self.held[machine] > self.capacity:
            evicted = self.lru[machine].first_live(self._live[machine])
            machines[evicted] = 0
            self.held[machine] -= 1
            self.evictions += 1

    def release(self) -> None:
        """Forget the keys and orders to free their memory when the run is over (the slot
        counts and evictions keep their values); the directory takes no more traffic."""
        self.cols.clear()
        self.keys = BlockSlots(self.cols, direct_span=0)
        self.lru = [SlotQueue() for _ in self.lru]

    def slots(self, machine: int) -> int:
        return self.held[machine]

    def check(self) -> list[str]:
        errs = []
        live = 0
        for machine, lru in enumerate(self.lru):
            slots, at = lru.entries()
            live += int(np.count_nonzero(self._live[machine](slots, at)))
        holders = int(np.count_nonzero(self.cols.machine))
        if not live == holders == sum(self.held):
            errs.append("SWA directory and per-machine slots disagree")
        if any(held > self.capacity for held in self.held):
            errs.append("a machine holds more SWA slots than its host memory allows")
        return errs
