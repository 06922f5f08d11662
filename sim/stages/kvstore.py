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

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...scenario import StoragePool
from .storage_nodes import StorageNodes


class KvStore:
    def __init__(
        self,
        cfg: StoragePool,
        class_names: Sequence[str],
        block_bytes: float,
        rng: np.random.Generator,
    ) -> None:
        self.cfg = cfg
        self.nodes = StorageNodes(cfg, rng)
        self.groups = self.nodes.groups
        self.block_bytes = block_bytes
        self.class_names = list(class_names)
        self.ttl = [cfg.ttl_for(name) for name in class_names]
        self.refresh_on_read = cfg.refresh_on_read
        per_group_node_bytes = cfg.node_physical_bytes
        self.capacity_blocks = int(per_group_node_bytes * cfg.data_chunks // block_bytes)
        self.high = int(cfg.high_watermark * self.capacity_blocks)
        self.low = int(cfg.low_watermark * self.capacity_blocks)
        self.where: dict[int, tuple[int, int]] = {}  # hash -> (group, class)
        # per group, blocks in least-recently-used order
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(self.groups)]
        # per group and class, blocks in the order of the time their TTL counts from
        self.age: list[list[OrderedDict[int, float]]] = [
            [OrderedDict() for _ in class_names] for _ in range(self.groups)
        ]
        self.lost: set[int] = set()
        self.writable = [True] * self.groups  # at most ``parity`` failed nodes
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

    # ---- the PrefixStore interface ------------------------------------------------------------
    def lookup(self, hashes: np.ndarray, now: float, traffic_class: int = -1) -> int:
        """Leading blocks present; a read by a request of ``traffic_class`` (when given and
        ``refresh_on_read``) restarts their TTL under that class's TTL."""
        where = self.where
        hit = 0
        refresh = self.refresh_on_read
        for h in hashes.tolist():
            entry = where.get(h)
            if entry is None:
                if h in self.lost:
                    self.lost_misses += 1
                break
            group, cls = entry
            age = self.age[group][cls]
            if age[h] + self.ttl[cls] < now:
                self._drop(h, group, cls)
                self.expirations += 1
                break
            self.lru[group].move_to_end(h)
            if refresh:
                if 0 <= traffic_class != cls:
                    del age[h]
                    age = self.age[group][traffic_class]
                    where[h] = (group, traffic_class)
                age[h] = now
                age.move_to_end(h)
            hit += 1
        return hit

    def insert(self, hashes: np.ndarray, now: float, traffic_class: int) -> None:
        self.write(hashes, now, traffic_class)

    def __len__(self) -> int:
        return len(self.where)

    # ---- reads and writes with their storage latency -------------------------------------------
    def read(self, hashes: np.ndarray, now: float) -> float:
        """Storage-side seconds to read these (present) blocks: one read per coding group."""
        if not len(hashes):
            return 0.0
        self.reads += 1
        self.read_blocks += len(hashes)
        latency = 0.0
        for group, count in self._per_group(hashes).items():
            latency = max(latency, self.nodes.read(group, count * self.block_bytes, now))
        return latency

    def write(self, hashes: np.ndarray, now: float, traffic_class: int) -> float:
        """Store blocks written by a request of ``traffic_class``; storage-side seconds."""
        self.expire(now)
        self.writes += 1
        counts: dict[int, int] = {}
        where = self.where
        ages = [g[traffic_class] for g in self.age]
        lost = self.lost
        hs = hashes.tolist()
        if where.keys().isdisjoint(hs) and self._write_new(hashes, hs, now, traffic_class, counts):
            hs = []  # all fresh blocks, stored in bulk
        for h in hs:
            entry = where.get(h)
            if entry is None:  # a new key lands at the end of both orders by itself
                group = self._group_for(h)
                if group < 0:
                    self.writes_failed += 1
                    continue
                if lost:
                    lost.discard(h)
                where[h] = (group, traffic_class)
                ages[group][h] = now
                self.lru[group][h] = None
            else:
                group, cls = entry
                if cls != traffic_class:
                    del self.age[group][cls][h]
                    where[h] = (group, traffic_class)
                age = ages[group]
                age[h] = now
                age.move_to_end(h)
                self.lru[group].move_to_end(h)
            counts[group] = counts.get(group, 0) + 1
        self.written_blocks += sum(counts.values())
        latency = 0.0
        for group, count in counts.items():
            latency = max(latency, self.nodes.write(group, count * self.block_bytes, now))
            if len(self.lru[group]) > self.high:
                self._collect(group)
            self.used_peak_blocks = max(self.used_peak_blocks, len(self.lru[group]))
        return latency

    def _write_new(
        self,
        hashes: np.ndarray,
        hs: list[int],
        now: float,
        traffic_class: int,
        counts: dict[int, int],
    ) -> bool:
        """Store blocks none of which is held, a whole group at a time (dict updates in C);
        False (nothing done) when a block's own group cannot take writes."""
        if self.groups == 1:
            parts = [(0, hs)] if self.writable[0] else []
        else:
            of = hashes % self.groups
            parts = [(int(g), hashes[of == g].tolist()) for g in np.unique(of)]
        if len(parts) == 0 or not all(self.writable[g] for g, _ in parts):
            return False
        for group, part in parts:
            self.where.update(dict.fromkeys(part, (group, traffic_class)))
            self.age[group][traffic_class].update(dict.fromkeys(part, now))
            self.lru[group].update(dict.fromkeys(part))
            if self.lost:
                self.lost.difference_update(part)
            counts[group] = len(part)
        return True

    def _group_for(self, h: int) -> int:
        """The block's coding group: by hash, or the next one that can still take writes."""
        first = h % self.groups
        if self.writable[first]:
            return first
        for step in range(1, self.groups):
            group = (first + step) % self.groups
            if self.writable[group]:
                return group
        return -1

    def _per_group(self, hashes: np.ndarray) -> dict[int, int]:
        counts: dict[int, int] = {}
        where = self.where
        for h in hashes.tolist():
            group = where[h][0]
            counts[group] = counts.get(group, 0) + 1
        return counts

    # ---- expiry, GC and loss -------------------------------------------------------------------
    def _drop(self, h: int, group: int, cls: int) -> None:
        del self.where[h]
        del self.lru[group][h]
        del self.age[group][cls][h]

    def expire(self, now: float) -> None:
        """Drop every block whose TTL ran out by ``now`` (at most one sweep per second of
        simulated time; lookups check expiry themselves)."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        for group in range(self.groups):
            for cls, age in enumerate(self.age[group]):
                deadline = now - self.ttl[cls]
                while age:
                    h, t = next(iter(age.items()))
                    if t >= deadline:
                        break
                    self._drop(h, group, cls)
                    self.expirations += 1

    def _collect(self, group: int) -> None:
        lru = self.lru[group]
        where = self.where
        while len(lru) > self.low:
            h, _ = lru.popitem(last=False)
            cls = where.pop(h)[1]
            del self.age[group][cls][h]
            self.evictions_gc += 1

    def fail_node(self, node: int) -> None:
        group = node // self.nodes.width
        was_readable = self.nodes.readable(group)
        self.nodes.fail(node)
        self.writable[group] = self.nodes.readable(group)
        if was_readable and not self.writable[group]:
            self._lose(group)

    def repair_node(self, node: int, now: float) -> None:
        group = node // self.nodes.width
        self.nodes.repair(node, len(self.lru[group]) * self.block_bytes, now)
        self.writable[group] = self.nodes.readable(group)

    def _lose(self, group: int) -> None:
        lru = self.lru[group]
        self.lost_blocks += len(lru)
        for h in lru:
            del self.where[h]
            self.lost.add(h)
        lru.clear()
        for age in self.age[group]:
            age.clear()

    # ---- accounting ----------------------------------------------------------------------------
    @property
    def used_fraction_peak(self) -> float:
        return self.used_peak_blocks / self.capacity_blocks if self.capacity_blocks else 0.0

    def used_fraction(self) -> float:
        """Used share of the fullest group's node capacity."""
        if not self.groups:
            return 0.0
        return max(len(lru) for lru in self.lru) / self.capacity_blocks

    def group_blocks(self) -> list[int]:
        return [len(lru) for lru in self.lru]

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
        held = sum(len(lru) for lru in self.lru)
        aged = sum(len(a) for ages in self.age for a in ages)
        if not held == aged == len(self.where):
            errors.append(f"kv store: index sizes disagree ({held} lru, {aged} ttl, {len(self)})")
        if any(len(lru) > self.capacity_blocks for lru in self.lru):
            errors.append("kv store: a coding group holds more than its capacity")
        return errors
