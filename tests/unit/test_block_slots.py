"""Numpy-backed block state: key -> slot maps, lazy-deletion queues, and the stores built on them
keeping the semantics of the dict/OrderedDict versions they replaced."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import pytest

from deepinfer_sim.scenario import StoragePool
from deepinfer_sim.sim.stages import block_slots
from deepinfer_sim.sim.stages.block_slots import BlockSlots, SlotColumns, SlotQueue
from deepinfer_sim.sim.stages.kvstore import KvStore
from deepinfer_sim.sim.stages.prefix_cache import MemoryPrefixStore
from deepinfer_sim.sim.stages.swa import SwaDirectory, SwaLookup


def keys(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def test_small_ids_map_directly_to_slots() -> None:
    slots = BlockSlots(SlotColumns(x=np.int8))
    assert slots.find(keys(0, 5)).tolist() == [0, 0]  # never added
    assert slots.add(keys(5, 0, 5)).tolist() == [6, 1, 6]
    assert slots.direct and slots.columns.size >= 7
    assert slots.find(keys(0, 5, 7)).tolist() == [1, 6, 0]
    assert slots.find_one(5) == 6 and slots.find_one(-3) == 0


def test_a_large_or_negative_key_switches_to_the_hash_table_keeping_slots() -> None:
    slots = BlockSlots(SlotColumns(x=np.int8), direct_span=100)
    first = slots.add(keys(3, 7))
    big = [2**62, -(2**62), 10**12]
    more = slots.add(np.array([*big, 3, 2**62], dtype=np.int64))
    assert not slots.direct
    assert slots.find(keys(3, 7)).tolist() == first.tolist()  # slots given before stay
    assert len(set(more[:3].tolist())) == 3 and more[4] == more[0] and more[3] == first[0]
    assert slots.find(np.array(big, dtype=np.int64)).tolist() == more[:3].tolist()
    assert slots.find(keys(99, 2**40)).tolist() == [0, 0]
    assert slots.columns.size > int(more.max())


def test_the_hash_table_finds_every_key_after_growing() -> None:
    rng = np.random.default_rng(1)
    slots = BlockSlots(SlotColumns(x=np.int8), direct_span=0)
    values = np.unique(rng.integers(-(2**63), 2**63 - 1, 50_000, dtype=np.int64))
    given = np.concatenate([slots.add(part) for part in np.array_split(values, 37)])
    assert len(np.unique(given)) == len(values) and given.min() >= 1
    assert np.array_equal(slots.find(values), given)
    assert not slots.find(np.setdiff1d(values ^ 1, values)).any()  # keys never added: 0


def test_one_key_at_a_time_agrees_with_whole_arrays() -> None:
    rng = np.random.default_rng(2)
    one = BlockSlots(SlotColumns(x=np.int8), direct_span=0)
    many = BlockSlots(SlotColumns(x=np.int8), direct_span=0)
    values = rng.integers(-(2**40), 2**40, 3000)
    got = [one.add_one(int(v)) for v in values]
    assert got == [one.find_one(int(v)) for v in values]
    whole = many.add(values).tolist()  # the same keys share a slot either way
    assert len(set(zip(got, whole, strict=True))) == len(set(got)) == len(set(whole))
    assert one.find_one(2**50) == 0


def test_a_queue_keeps_the_live_entry_of_each_slot_in_order() -> None:
    pos = np.zeros(10, dtype=np.int32)
    member = np.zeros(10, dtype=bool)

    def live(slots: np.ndarray, at: np.ndarray) -> np.ndarray:
        return member[slots] & (pos[slots] == at)

    q = SlotQueue()
    for s in (1, 2, 3):
        member[s] = True
    q.push(np.array([1, 2, 3]), pos, live)
    q.push(np.array([1]), pos, live)  # 1 becomes the most recent
    member[2] = False  # 2 dropped: its entry is dead
    slots, at = q.entries()
    assert slots[live(slots, at)].tolist() == [3, 1]
    for _ in range(200):  # compaction keeps only live entries and their order
        q.push(np.array([3]), pos, live)
        q.push(np.array([1]), pos, live)
    slots, at = q.entries()
    assert slots[live(slots, at)].tolist() == [3, 1] and len(q) <= 64
    assert q.first_live(live) == 3


def test_compaction_moves_marks_with_the_entries() -> None:
    pos = np.zeros(300, dtype=np.int32)
    member = np.ones(300, dtype=bool)

    def live(slots: np.ndarray, at: np.ndarray) -> np.ndarray:
        return member[slots] & (pos[slots] == at)

    q = SlotQueue(marks=2)
    q.push(np.arange(1, 61), pos, live)
    q.marks = [10, 40]  # cursors at the entries of slots 11 and 41
    member[1:30] = False  # dead entries before both marks
    q.push(np.arange(100, 110), pos, live)  # full: compacts
    slots, _ = q.entries()
    assert slots[q.marks[0]] == 30 and slots[q.marks[1]] == 41


def _compact_at_once(q: SlotQueue, pos: np.ndarray, live) -> tuple[list[int], list[int]]:
    """What a compaction leaves (live entries in order, marks), computed over the whole queue."""
    items, at = q.entries()
    alive = live(items, at)
    marks = np.maximum(np.array(q.marks, dtype=np.int64), q.head)
    return items[alive].tolist(), np.searchsorted(at[alive], marks).tolist()


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 20])
def test_compaction_a_chunk_at_a_time_is_compaction_at_once(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(block_slots, "COMPACT_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    pos = np.zeros(500, dtype=np.int32)
    member = np.zeros(500, dtype=bool)

    def live(slots: np.ndarray, at: np.ndarray) -> np.ndarray:
        return member[slots] & (pos[slots] == at)

    q = SlotQueue(marks=3)
    compactions = 0
    for _ in range(300):
        slots = rng.choice(np.arange(1, 500), size=int(rng.integers(1, 12)), replace=False)
        member[slots] = True
        member[rng.integers(1, 500, 4)] = False
        if q.tail + len(slots) > len(q.items):  # this push compacts: predict it first
            q.marks = sorted(int(m) for m in rng.integers(q.head, q.tail + 3, 3))
            want_items, want_marks = _compact_at_once(q, pos, live)
            q.push(slots, pos, live)
            got, at = q.entries()
            n = len(want_items)
            assert got[:n].tolist() == want_items and q.marks == want_marks
            kept = ~np.isin(got[:n], slots)  # (a slot pushed again has moved on since)
            assert (pos[got[:n]][kept] == at[:n][kept]).all()  # every kept entry renumbered
            compactions += 1
        else:
            q.push(slots, pos, live)
    assert compactions >= 3


# ---- the stores against the dict/OrderedDict definitions they replaced -------------------------


class DictPrefixStore:
    """The reference: an OrderedDict of blocks in LRU order."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity, self.blocks, self.evictions = capacity, OrderedDict[int, None](), 0

    def lookup(self, hashes: np.ndarray) -> int:
        hit = 0
        for h in hashes.tolist():
            if h not in self.blocks:
                break
            if self.capacity is not None:
                self.blocks.move_to_end(h)
            hit += 1
        return hit

    def insert(self, hashes: np.ndarray) -> None:
        for h in hashes.tolist():
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while self.capacity is not None and len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)
            self.evictions += 1


@pytest.mark.parametrize("capacity", [None, 7, 60])
@pytest.mark.parametrize("sparse", [False, True])
def test_memory_prefix_store_matches_an_ordered_dict(capacity: int | None, sparse: bool) -> None:
    rng = np.random.default_rng(capacity or 0)
    universe = rng.integers(-(2**62), 2**62, 300) if sparse else np.arange(300)
    ref, store = DictPrefixStore(capacity), MemoryPrefixStore(capacity)
    for _ in range(2000):
        start, n = int(rng.integers(0, 280)), int(rng.integers(0, 20))
        hashes = universe[start : start + n].astype(np.int64)
        if rng.random() < 0.5:
            assert store.lookup(hashes, 0.0) == ref.lookup(hashes)
        else:
            store.insert(hashes, 0.0, 0)
            ref.insert(hashes)
        assert len(store) == len(ref.blocks) and store.evictions == ref.evictions


def test_swa_directory_moves_evicts_and_checks() -> None:
    d = SwaDirectory(machines=3, slots_per_machine=2)
    for key in (5, 6, 7):  # the third evicts 5 on machine 0
        d.insert(key, 0)
    assert d.lookup(5, 0) == SwaLookup.MISS and d.evictions == 1
    d.insert(2**60, 1)  # a hash too large for direct slots
    assert d.holder(2**60) == 1 and d.lookup(2**60, 2) == SwaLookup.REMOTE
    d.insert(6, 2)
    assert d.slots(0) == 1 and d.slots(2) == 1 and d.holder(6) == 2
    assert d.check() == []


def kv(**cfg: Any) -> KvStore:
    base: dict[str, Any] = {"nodes": 12, "node_latency_s": 0.0, "disks_per_node": 1}
    pool = StoragePool(**{"disk_tb": 1e-5, **base, **cfg})  # 100 blocks per group
    return KvStore(pool, ("chatbot", "agent"), 1e6, np.random.default_rng(0))


def test_a_repeated_block_in_a_write_of_new_blocks_keeps_its_first_place() -> None:
    store = kv(high_watermark=0.9, low_watermark=0.5)
    store.write(np.array([1, *range(10, 80), 1], dtype=np.int64), 0.0, 0)
    assert len(store) == 71
    store.write(np.arange(100, 121, dtype=np.int64), 1.0, 0)  # 92 > 90: down to 50
    assert store.lookup(keys(1), 2.0) == 0  # block 1 was the oldest, not the newest
    assert store.lookup(keys(79), 2.0) == 1 and store.check() == []


def test_a_repeated_held_block_moves_to_its_last_place() -> None:
    store = kv(high_watermark=0.9, low_watermark=0.5)
    store.write(np.arange(0, 80, dtype=np.int64), 0.0, 0)
    store.write(keys(0, 200, 0), 1.0, 0)  # 0 is held: it ends most recent
    store.write(np.arange(300, 311, dtype=np.int64), 2.0, 0)  # 92 > 90: down to 50
    assert store.lookup(keys(0), 3.0) == 1 and store.lookup(keys(1), 3.0) == 0
    assert len(store) == 50 and store.check() == []


def test_reserved_columns_never_grow_by_a_copy() -> None:
    cols = SlotColumns(where=np.int16, age=np.float64)
    slots = BlockSlots(cols)
    slots.reserve(999)
    assert cols.size == 1001
    where = cols.where
    got = slots.add(np.array([999, 0, 500], dtype=np.int64))
    assert got.tolist() == [1000, 1, 501] and cols.where is where  # the same array: no regrowth
    assert slots.find(np.array([7], dtype=np.int64)).tolist() == [8]  # never added: zero columns
    assert cols.where[8] == 0


@pytest.mark.parametrize("largest", [-1, 1 << 30])
def test_reserve_is_a_no_op_for_keys_that_will_not_be_direct(largest: int) -> None:
    cols = SlotColumns(where=np.int16)
    BlockSlots(cols, direct_span=1 << 20).reserve(largest)
    assert cols.size == 1
    hashed = SlotColumns(where=np.int16)
    BlockSlots(hashed, direct_span=0).reserve(10)
    assert hashed.size == 1
