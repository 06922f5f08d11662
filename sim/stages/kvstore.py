"""The 3FS-style KV-cache store: which blocks it holds, for how long, and what reading costs.

Blocks are 512-token prefix blocks keyed by their chained hash (sim/stages/prefix_cache.py has the
lookup contract). Each block lives in one coding group of :class:`StorageNodes` (chosen by its
hash; the next readable group when that one has lost its data) and carries the traffic class of
the request that last touched it (wrote it, or read it when reads refresh):

- **TTL, storage-side**: a block expires ``ttl(class)`` after its last write, or after its last
  read too when ``refresh_on_read`` (the default: a prefix that keeps being hit stays). Expiry
  is applied lazily at lookup and swept from the front of per-(group, class) queues ordered by
  that time, so it costs O(1) per block.
- **Watermark GC**: every node of a group holds ``1/data`` of each of the group's blocks, so a
  group's nodes fill together; when a write takes the group above ``high_watermark`` of node
  capacity, its GC worker evicts least-recently-used blocks down to ``low_watermark``.
- **Failures**: a group with more than ``parity`` failed nodes loses every block it holds (later
  lookups of them miss and the prefill recomputes them, never an error); up to ``parity``
  failed nodes it serves degraded reads. Repair rebuilds the node's share (StorageNodes.repair).

``read`` and ``write`` return the storage-side latency of moving a request's hit or new blocks;
the prefill path adds the network transfer on top.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from ...errors import ConfigError
from ...jit import COMPILED
from ...scenario import StoragePool
from .block_slots import BlockSlots, SlotArray, SlotColumns, SlotQueue
from .kvstore_steps import direct_high, leading_hits, store_direct, touch_direct
from .storage_nodes import StorageNodes

_LOST = -1  # ``where`` of a block its group lost (a later lookup counts a lost miss)
_SCAN = 256  # queue entries examined per step of a sweep or a GC


class KvStore:
    """Block state lives in numpy columns indexed by slot (sim/stages/block_slots.py):
    ``where`` (1 + the coding group holding the block; 0 not held, -1 lost), ``cls`` (traffic
    class), ``age`` (when its TTL started) and its entry's position in the group's LRU queue. A
    queue entry is live while the block is still held there and the position matches, so moving
    a block to the end of an order is one append.

    When reads refresh the TTL (the default), every use restarts a block's TTL, so a class's
    blocks expire in the group's LRU order: the sweep walks that queue with a cursor per class.
    Otherwise each (group, class) keeps its own TTL queue (``age``, positions in ``age_pos``)."""

    def __init__(
        self,
        cfg: StoragePool,
        class_names: Sequence[str],
        block_bytes: float,
        rng: np.random.Generator,
        largest_id: int = -1,
    ) -> None:
        """``largest_id``: the workload's largest block id, when known (the block columns are
        sized for it up front: :meth:`~.block_slots.BlockSlots.reserve`)."""
        self.cfg = cfg
        self.nodes = StorageNodes(cfg, rng)
        self.groups = self.nodes.groups
        self.block_bytes = block_bytes
        self.class_names = list(class_names)
        self.ttl = [cfg.ttl_for(name) for name in class_names]
        self._ttl = np.array(self.ttl, dtype=np.float64)
        self.refresh_on_read = cfg.refresh_on_read
        per_group_node_bytes = cfg.node_physical_bytes
        self.capacity_blocks = int(per_group_node_bytes * cfg.data_chunks // block_bytes)
        if self.capacity_blocks < 1:  # pools.storage.disk_tb: 1e-9 divided by zero below
            raise ConfigError(
                "pools.storage.disk_tb",
                f"a coding group's nodes ({cfg.disks_per_node} disks of {cfg.disk_tb:g} TB, "
                f"{cfg.data_chunks} data chunks) hold no {block_bytes / 1e6:.3g} MB KV block: "
                "a store of no capacity caches nothing",
            )
        self.high = int(cfg.high_watermark * self.capacity_blocks)
        self.low = int(cfg.low_watermark * self.capacity_blocks)
        columns: dict[str, Any] = {
            "where": np.int16 if self.groups < 32000 else np.int32,
            "cls": np.int8 if len(self.class_names) < 128 else np.int16,
            "age": np.float64,
            "lru_pos": np.int32,
        }
        if not self.refresh_on_read:
            columns["age_pos"] = np.int32
        self.cols = SlotColumns(**columns)
        self.slots = BlockSlots(self.cols)
        self.slots.reserve(largest_id)
        self.held = [0] * self.groups  # blocks per group
        # per group, blocks in least-recently-used order (marks: each class's sweep cursor
        # when reads refresh)
        self.lru = [SlotQueue() for _ in range(self.groups)]
        # without refresh on read: per group and class, blocks in the order of the time their
        # TTL counts from
        self.age: list[list[SlotQueue]] = [[] for _ in range(self.groups)]
        for group in range(self.groups):
            self._new_queues(group)
        self._lru_live = [partial(self._live_lru, g) for g in range(self.groups)]
        self._age_live = [
            [partial(self._live_age, g, c) for c in range(len(class_names))]
            for g in range(self.groups)
        ]
        self.writable = [True] * self.groups  # at most ``parity`` failed nodes
        # a new block's group: by hash, or the next one that can still take writes (-1: none)
        self._target = np.arange(self.groups, dtype=np.int64)
        self._next_sweep = -np.inf
        self.reads = 0
        self.writes = 0
        self.writes_failed = 0
        self.read_blocks = 0
        self.written_blocks = 0
        self.expirations = 0
        self.evictions_gc = 0
        self.lost_blocks = 0
        self.lost_misses = 0
        self.used_peak_blocks = 0  # of the fullest group, after GC

    def _new_queues(self, group: int) -> None:
        """Empty orders for the group."""
        if self.refresh_on_read:
            self.lru[group] = SlotQueue(marks=len(self.class_names))
        else:
            self.lru[group] = SlotQueue()
            self.age[group] = [SlotQueue() for _ in self.class_names]

    # ---- the PrefixStore interface ------------------------------------------------------------
    def lookup(self, hashes: np.ndarray, now: float, traffic_class: int = -1) -> int:
        """Leading blocks present; a read by a request of ``traffic_class`` (when given and
        ``refresh_on_read``) restarts their TTL under that class's TTL."""
        n = len(hashes)
        if not n:
            return 0
        if COMPILED and self.slots.direct:
            return self._lookup_direct(hashes, now, traffic_class)
        c = self.cols
        slots = self.slots.find(hashes)
        where = c.where[slots]
        bad = (where <= 0) | (c.age[slots] + self._ttl[c.cls[slots]] < now)
        hit = int(bad.argmax())
        if not bad[hit]:
            hit = n
        else:
            self._missed(slots[hit : hit + 1], int(where[hit]))
        if hit:
            self._touch(slots[:hit], where[:hit], now, traffic_class)
        return hit

    def _lookup_direct(self, hashes: np.ndarray, now: float, traffic_class: int) -> int:
        """:meth:`lookup` with direct slots, compiled (sim/stages/kvstore_steps.py)."""
        c = self.cols
        hit, slot, first = leading_hits(hashes, c.size - 1, c.where, c.age, c.cls, self._ttl, now)
        if hit < len(hashes):
            self._missed(np.array([slot], dtype=np.intp), first)
        if not hit:
            return 0
        if self.groups == 1:
            lru = self.lru[0]
            lru.make_room(hit, c.lru_pos, self._lru_live[0])
            args = (lru.items, lru.tail, c.lru_pos, c.age, c.cls, now, traffic_class)
            touch_direct(hashes, hit, *args, self.refresh_on_read)
            lru.tail += hit
        else:
            slots = hashes[:hit] + 1
            self._touch(slots, c.where[slots], now, traffic_class)
        return hit

    def _missed(self, slot: SlotArray, where: int) -> None:
        """A lookup stopped at this block (``slot``: its one slot; ``where``: its column value):
        held but expired, it is dropped now; lost with its group, it counts a lost miss."""
        if where > 0:
            self._drop(slot, where - 1)
            self.expirations += 1
        elif where == _LOST:
            self.lost_misses += 1

    def insert(self, hashes: np.ndarray, now: float, traffic_class: int) -> None:
        self.write(hashes, now, traffic_class)

    def __len__(self) -> int:
        return sum(self.held)

    def group_of(self, h: int) -> int | None:
        """The coding group holding block ``h`` (None: not held)."""
        where = int(self.cols.where[self.slots.find(np.array([h], dtype=np.int64))[0]])
        return where - 1 if where > 0 else None

    # ---- reads and writes with their storage latency -------------------------------------------
    def read(self, hashes: np.ndarray, now: float) -> float:
        """Storage-side seconds to read these (present) blocks: one read per coding group."""
        if not len(hashes):
            return 0.0
        self.reads += 1
        self.read_blocks += len(hashes)
        if self.groups == 1:
            return self.nodes.read(0, len(hashes) * self.block_bytes, now)
        groups = self.cols.where[self.slots.find(hashes)] - 1
        latency = 0.0
        for group, count in _first_seen_counts(groups):
            latency = max(latency, self.nodes.read(group, count * self.block_bytes, now))
        return latency

    def write(self, hashes: np.ndarray, now: float, traffic_class: int) -> float:
        """Store blocks written by a request of ``traffic_class``; storage-side seconds.

        A block written twice in one call ends up where its last copy puts it in the LRU and
        TTL orders, except in a write of new blocks only, which keeps first copies (as a bulk
        insert of a dict of them did)."""
        self.expire(now)
        self.writes += 1
        if self.groups == 1:
            return self._write_one_group(hashes, now, traffic_class)
        slots = self.slots.add(hashes)
        held = self.cols.where[slots].astype(np.int64)
        fresh = held <= 0
        by_hash = hashes % self.groups
        groups = np.where(fresh, self._target[by_hash], held - 1)
        bulk = bool(fresh.all() and (groups == by_hash).all())
        if bulk:
            counts = _sorted_counts(groups)  # new blocks, each in its own group: by group
        else:
            stored = groups >= 0
            self.writes_failed += int(len(stored) - np.count_nonzero(stored))
            slots, groups, fresh = slots[stored], groups[stored], fresh[stored]
            counts = _first_seen_counts(groups)  # in the order the blocks come
        for group, _ in counts:
            part = groups == group
            self._store(group, slots[part], fresh[part], now, traffic_class, bulk)
        self.written_blocks += len(slots)
        return self._write_nodes(counts, now)

    def _write_one_group(self, hashes: np.ndarray, now: float, traffic_class: int) -> float:
        if not self.writable[0]:
            self.writes_failed += len(hashes)
            return 0.0
        if len(hashes) and not (COMPILED and self._store_direct(hashes, now, traffic_class)):
            slots = self.slots.add(hashes)
            fresh = self.cols.where[slots] <= 0
            self._store(0, slots, fresh, now, traffic_class, bool(fresh.all()))
        self.written_blocks += len(hashes)
        return self._write_nodes([(0, len(hashes))], now)

    def _store_direct(self, hashes: np.ndarray, now: float, traffic_class: int) -> bool:
        """:meth:`_store` of a one-group store's write with direct slots, compiled
        (sim/stages/kvstore_steps.py); False, having changed nothing, where the ids are not
        direct slots or reads do not refresh the TTL (the reference then stores them)."""
        block_slots = self.slots
        if not self.refresh_on_read:
            return False
        high = direct_high(hashes)
        if not block_slots.stays_direct(len(hashes), high):
            return False
        block_slots.take_direct(len(hashes), high)
        c = self.cols
        lru = self.lru[0]
        lru.make_room(len(hashes), c.lru_pos, self._lru_live[0])
        args = (c.where, c.cls, c.age, lru.items, lru.tail, c.lru_pos, 1, traffic_class, now)
        fresh, all_fresh, all_last = store_direct(hashes, *args)
        lru.tail += len(hashes)
        self.held[0] += fresh
        if all_fresh and not all_last:  # a repeated new block: its first copy counts
            self._push_first_copies(0, hashes + 1)
        return True

    def _store(
        self,
        group: int,
        slots: SlotArray,
        fresh: np.ndarray,
        now: float,
        traffic_class: int,
        keep_first: bool,
    ) -> None:
        """Hold ``slots`` (``fresh``: not held before) in ``group`` under ``traffic_class``,
        most recently used, TTL from now; a repeated slot's first copy is the one that counts
        when ``keep_first``, else its last."""
        c = self.cols
        c.where[slots] = group + 1
        c.cls[slots] = traffic_class
        c.age[slots] = now
        lru, lru_live = self.lru[group], self._lru_live[group]
        at = lru.push(slots, c.lru_pos, lru_live)
        last = c.lru_pos[slots] == at
        self.held[group] += int(np.count_nonzero(fresh & last))
        if keep_first and not last.all():
            slots = self._push_first_copies(group, slots)
        if not self.refresh_on_read:
            queue = self.age[group][traffic_class]
            queue.push(slots, c.age_pos, self._age_live[group][traffic_class])

    def _push_first_copies(self, group: int, slots: SlotArray) -> SlotArray:
        """Queue each slot's first copy again, in order (a write of new blocks keeps its first
        copies, as a bulk insert of a dict of them did); those slots."""
        _, first = np.unique(slots, return_index=True)
        slots = slots[np.sort(first)]
        self.lru[group].push(slots, self.cols.lru_pos, self._lru_live[group])
        return slots

    def _write_nodes(self, counts: list[tuple[int, int]], now: float) -> float:
        """Each group's nodes store their share; then collect the groups above the watermark."""
        latency = 0.0
        for group, count in counts:
            latency = max(latency, self.nodes.write(group, count * self.block_bytes, now))
            if self.held[group] > self.high:
                self._collect(group)
            self.used_peak_blocks = max(self.used_peak_blocks, self.held[group])
        return latency

    def _touch(self, slots: SlotArray, where: np.ndarray, now: float, traffic_class: int) -> None:
        """A lookup hit these held blocks: most recently used; with ``refresh_on_read`` their
        TTL restarts now (under the reader's class when it is known)."""
        c = self.cols
        groups = where - 1 if self.groups > 1 else where
        for group, part in _by_value(slots, groups, self.groups):
            self.lru[group].push(part, c.lru_pos, self._lru_live[group])
        if self.refresh_on_read:
            c.age[slots] = now
            if traffic_class >= 0:
                c.cls[slots] = traffic_class

    # ---- queue liveness ------------------------------------------------------------------------
    def _live_lru(self, group: int, slots: np.ndarray, at: np.ndarray) -> np.ndarray:
        c = self.cols
        return (c.where[slots] == group + 1) & (c.lru_pos[slots] == at)

    def _live_age(self, group: int, cls: int, slots: np.ndarray, at: np.ndarray) -> np.ndarray:
        c = self.cols
        live = (c.where[slots] == group + 1) & (c.age_pos[slots] == at)
        return live & (c.cls[slots] == cls)

    # ---- expiry, GC and loss -------------------------------------------------------------------
    def _drop(self, slots: np.ndarray, group: int, where: int = 0) -> None:
        """Stop holding ``slots`` (held in ``group``; each once): their queue entries die."""
        self.cols.where[slots] = where
        self.held[group] -= len(slots)

    def expire(self, now: float) -> None:
        """Drop every block whose TTL ran out by ``now`` (at most one sweep per second of
        simulated time; lookups check expiry themselves)."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        for group in range(self.groups):
            for cls in range(len(self.class_names)):
                self._sweep(group, cls, now - self.ttl[cls])

    def _sweep(self, group: int, cls: int, deadline: float) -> None:
        """Drop the class's blocks of the group aged before ``deadline``: in the order their TTL
        started (a live entry's age is when it was queued), up to the first one that stays."""
        c = self.cols
        if self.refresh_on_read:  # the class's blocks in the LRU queue, from its cursor
            queue, live_of = self.lru[group], self._lru_live[group]
            start = max(queue.marks[cls], queue.head)
        else:
            queue, live_of = self.age[group][cls], self._age_live[group][cls]
            start = queue.head
        scan = _SCAN
        while start < queue.tail:
            slots, at = queue.at(start, scan)
            live = live_of(slots, at)
            if self.refresh_on_read:
                live &= c.cls[slots] == cls
            stays = live & (c.age[slots] >= deadline)
            stop = int(stays.argmax()) if stays.any() else len(slots)
            gone = slots[:stop][live[:stop]]
            if len(gone):
                self._drop(gone, group)
                self.expirations += len(gone)
            start += stop
            if stop < len(slots):
                break
            scan *= 2
        if self.refresh_on_read:
            queue.marks[cls] = start
        else:
            queue.pop(start - queue.head)

    def _collect(self, group: int) -> None:
        """Evict least-recently-used blocks until the group is down to the low watermark."""
        queue = self.lru[group]
        scan = _SCAN
        while self.held[group] > self.low and len(queue):
            slots, at = queue.front(scan)
            live = self._lru_live[group](slots, at)
            need = self.held[group] - self.low
            taken = np.cumsum(live)
            stop = int(np.searchsorted(taken, need)) + 1 if taken[-1] >= need else len(slots)
            gone = slots[:stop][live[:stop]]
            self._drop(gone, group)
            self.evictions_gc += len(gone)
            queue.pop(stop)
            scan *= 2

    def fail_node(self, node: int) -> None:
        group = node // self.nodes.width
        was_readable = self.nodes.readable(group)
        self.nodes.fail(node)
        self._set_writable(group, self.nodes.readable(group))
        if was_readable and not self.writable[group]:
            self._lose(group)

    def repair_node(self, node: int, now: float) -> None:
        group = node // self.nodes.width
        self.nodes.repair(node, self.held[group] * self.block_bytes, now)
        self._set_writable(group, self.nodes.readable(group))

    def _set_writable(self, group: int, writable: bool) -> None:
        self.writable[group] = writable
        groups = self.groups
        for g in range(groups):
            ring = [(g + step) % groups for step in range(groups)]
            self._target[g] = next((x for x in ring if self.writable[x]), -1)

    def _lose(self, group: int) -> None:
        slots, at = self.lru[group].entries()
        gone = slots[self._lru_live[group](slots, at)]
        self.lost_blocks += len(gone)
        self._drop(gone, group, _LOST)
        self._new_queues(group)

    def release(self) -> None:
        """Forget the blocks (their state, keys and orders) to free their memory when the run is
        over; counters and the report keep their values, the store takes no more traffic."""
        self.cols.clear()
        self.slots = BlockSlots(self.cols)
        for group in range(self.groups):
            self._new_queues(group)

    # ---- accounting ----------------------------------------------------------------------------
    @property
    def used_fraction_peak(self) -> float:
        return self.used_peak_blocks / self.capacity_blocks if self.capacity_blocks else 0.0

    def used_fraction(self) -> float:
        """Used share of the fullest group's node capacity."""
        if not self.groups or not self.capacity_blocks:
            return 0.0
        return max(self.held) / self.capacity_blocks

    def group_blocks(self) -> list[int]:
        return list(self.held)

    def report(self) -> dict[str, Any]:
        """The store's own part of the summary: its configuration (nodes, coding, logical
        capacity, TTL per traffic class), reads and writes with their blocks and the nodes'
        bytes, what it holds now and at its fullest, and what expiry, GC and failures cost."""
        cfg = self.cfg
        nodes = self.nodes.report()
        return {
            "nodes": cfg.nodes,
            "coding": f"{cfg.data_chunks}+{cfg.parity_chunks}",
            "logical_tb": cfg.logical_bytes / 1e12,
            "ttl_s": {name: self.ttl[i] for i, name in enumerate(self.class_names)},
            "refresh_on_read": cfg.refresh_on_read,
            "reads": self.reads,
            "writes": self.writes,
            "read_blocks": self.read_blocks,
            "written_blocks": self.written_blocks,
            "read_bytes": nodes["read_bytes"],
            "write_bytes": nodes["write_bytes"],
            "blocks_held": len(self),
            "used_fraction": self.used_fraction(),
            "used_fraction_peak": self.used_fraction_peak,
            "evictions_gc": self.evictions_gc,
            "expirations": self.expirations,
            "degraded_reads": nodes["degraded_reads"],
            "lost_blocks": self.lost_blocks,
            "lost_block_misses": self.lost_misses,
            "writes_failed": self.writes_failed,
            "rebuild_bytes": nodes["rebuild_bytes"],
        }

    def check(self) -> list[str]:
        errors = []
        groups = range(self.groups)
        lru = sum(self._live_count(self.lru[g], self._lru_live[g]) for g in groups)
        aged = lru
        if not self.refresh_on_read:
            aged = sum(
                self._live_count(q, self._age_live[g][c])
                for g in groups
                for c, q in enumerate(self.age[g])
            )
        where = int(np.count_nonzero(self.cols.where > 0))
        if not lru == aged == where == len(self):
            errors.append(
                f"kv store: index sizes disagree ({lru} lru, {aged} ttl, {where} held, {len(self)})"
            )
        if any(held > self.capacity_blocks for held in self.held):
            errors.append("kv store: a coding group holds more than its capacity")
        return errors

    @staticmethod
    def _live_count(queue: SlotQueue, live: Any) -> int:
        slots, at = queue.entries()
        return int(np.count_nonzero(live(slots, at)))


def _by_value(slots: SlotArray, values: np.ndarray, count: int) -> list[tuple[int, SlotArray]]:
    """``slots`` split by their ``values`` (in ``[0, count)``), in order within each part."""
    if count == 1:
        return [(0, slots)]
    first = int(values[0])
    if (values == first).all():
        return [(first, slots)]
    return [(v, slots[values == v]) for v in np.unique(values).tolist()]


def _sorted_counts(values: np.ndarray) -> list[tuple[int, int]]:
    """(value, occurrences) by value."""
    unique, counts = np.unique(values, return_counts=True)
    return list(zip(unique.tolist(), counts.tolist(), strict=True))


def _first_seen_counts(values: np.ndarray) -> list[tuple[int, int]]:
    """(value, occurrences) in the order each value first occurs."""
    unique, first, counts = np.unique(values, return_index=True, return_counts=True)
    order = np.argsort(first)
    return list(zip(unique[order].tolist(), counts[order].tolist(), strict=True))
