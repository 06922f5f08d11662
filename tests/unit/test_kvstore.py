"""The 3FS-style KV store: per-class TTLs, watermark GC, erasure-coded reads, failures."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from deepinfer_sim.scenario import StoragePool
from deepinfer_sim.sim.stages.kvstore import KvStore

CLASSES = ("chatbot", "agent")
BLOCK = 1e6  # bytes per block


def store(**cfg: Any) -> KvStore:
    base: dict[str, Any] = {"nodes": 24, "node_latency_s": 0.0}
    return KvStore(StoragePool(**{**base, **cfg}), CLASSES, BLOCK, np.random.default_rng(0))


def chain(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int64)


def in_group(kv: KvStore, group: int, n: int) -> np.ndarray:
    """``n`` hashes that the store places in ``group`` (hash mod groups)."""
    return np.arange(group, group + n * kv.groups, kv.groups, dtype=np.int64)


def test_ttl_is_per_traffic_class() -> None:
    kv = store(ttl_s={"chatbot": 100.0, "agent": 10.0})
    kv.write(chain(0, 4), 0.0, traffic_class=0)
    kv.write(chain(100, 4), 0.0, traffic_class=1)
    assert kv.lookup(chain(0, 4), 50.0) == 4
    assert kv.lookup(chain(100, 4), 50.0) == 0
    assert kv.expirations >= 1


def test_unlisted_class_gets_the_default_ttl() -> None:
    kv = KvStore(
        StoragePool(nodes=12, ttl_s={"agent": 5.0}, default_ttl_s=50.0),
        ("chatbot", "agent"),
        BLOCK,
        np.random.default_rng(0),
    )
    assert kv.ttl == [50.0, 5.0]


@pytest.mark.parametrize(("refresh", "hit"), [(True, 3), (False, 0)])
def test_refresh_on_read_switch(refresh: bool, hit: int) -> None:
    kv = store(ttl_s={"chatbot": 10.0}, refresh_on_read=refresh)
    kv.write(chain(0, 3), 0.0, 0)
    assert kv.lookup(chain(0, 3), 8.0) == 3  # read at 8 s
    assert kv.lookup(chain(0, 3), 15.0) == hit  # 15 s after the write, 7 s after the read


def test_expire_sweeps_every_group_and_class() -> None:
    kv = store(ttl_s={"chatbot": 10.0, "agent": 20.0})
    kv.write(chain(0, 50), 0.0, 0)
    kv.write(chain(1000, 50), 5.0, 1)
    kv.expire(12.0)
    assert len(kv) == 50 and kv.expirations == 50
    kv.expire(30.0)
    assert len(kv) == 0 and kv.check() == []


def test_lookup_stops_at_the_first_missing_block() -> None:
    kv = store()
    kv.write(np.array([1, 2, 4]), 0.0, 0)
    assert kv.lookup(np.array([1, 2, 3, 4]), 1.0) == 2


def test_gc_keeps_each_group_between_the_watermarks_and_evicts_lru() -> None:
    # one disk of 1e-5 TB per node: 10 MB per node, 10 data chunks -> 100 blocks per group
    kv = store(nodes=12, disks_per_node=1, disk_tb=1e-5, high_watermark=0.9, low_watermark=0.5)
    assert kv.capacity_blocks == 100
    kv.write(chain(0, 80), 0.0, 0)
    assert kv.evictions_gc == 0
    assert kv.lookup(chain(0, 10), 1.0) == 10  # the first ten become most recently used
    kv.write(chain(1000, 15), 2.0, 0)  # 95 > 90: collect down to 50
    assert len(kv) == 50 and kv.evictions_gc == 45
    assert kv.lookup(chain(0, 10), 3.0) == 10  # recently read: kept
    assert kv.lookup(chain(1000, 15), 3.0) == 15  # just written: kept
    assert kv.lookup(chain(10, 1), 3.0) == 0  # least recently used: evicted
    assert kv.used_fraction_peak <= 0.9 and kv.check() == []


@pytest.mark.parametrize("failed", [0, 1, 2])
def test_up_to_parity_failed_nodes_lose_nothing(failed: int) -> None:
    kv = store()
    blocks = in_group(kv, 0, 20)
    kv.write(blocks, 0.0, 0)
    for node in range(failed):
        kv.fail_node(node)
    assert kv.lookup(blocks, 1.0) == 20
    assert kv.read(blocks, 1.0) > 0
    assert kv.lost_blocks == 0
    assert kv.nodes.degraded_reads == (1 if failed == 2 else 0)


def test_three_failed_nodes_lose_that_group_only() -> None:
    kv = store()
    lost, kept = in_group(kv, 0, 20), in_group(kv, 1, 20)
    kv.write(lost, 0.0, 0)
    kv.write(kept, 0.0, 0)
    for node in (0, 5, 11):  # three nodes of group 0
        kv.fail_node(node)
    assert kv.lost_blocks == 20
    assert kv.lookup(kept, 1.0) == 20
    assert kv.lookup(lost, 1.0) == 0 and kv.lost_misses == 1
    # recomputed blocks are written again, to a group that still works
    kv.write(lost, 2.0, 0)
    assert kv.lookup(lost, 3.0) == 20
    assert all(kv.group_of(int(h)) == 1 for h in lost)
    assert kv.check() == []


def test_failures_in_different_groups_lose_nothing() -> None:
    kv = store()
    blocks = chain(0, 40)
    kv.write(blocks, 0.0, 0)
    for node in (0, 1, 12, 13):  # two in each group
        kv.fail_node(node)
    assert kv.lookup(blocks, 1.0) == 40 and kv.lost_blocks == 0


def test_read_completes_at_the_tenth_answer_and_skips_a_busy_node() -> None:
    kv = store(nodes=12)
    blocks = in_group(kv, 0, 10)  # 10 MB: 1 MB per data chunk
    kv.write(blocks, 0.0, 0)
    now = 100.0  # writes drained
    chunk_s = 1e6 / 40e9
    assert kv.read(blocks, now) == pytest.approx(chunk_s)
    kv.nodes.busy[3] = now + 1.0  # one node is busy for a second: the read avoids it
    assert kv.read(blocks, now + 10 * chunk_s) == pytest.approx(chunk_s)
    kv.nodes.busy[:] = 0.0
    kv.nodes.busy[3] = now + 1.0
    kv.fail_node(0)
    kv.fail_node(1)  # ten survivors, one of them busy: the degraded read waits for it
    assert kv.read(blocks, now) == pytest.approx(1.0 + chunk_s)


def test_reads_and_writes_share_a_node() -> None:
    kv = store(nodes=12)
    blocks = in_group(kv, 0, 10)
    kv.write(blocks, 0.0, 0)  # 1 MB per node at 5 GB/s: busy until 200 µs
    assert kv.read(blocks, 0.0) == pytest.approx(1e6 / 5e9 + 1e6 / 40e9)


def test_repair_rebuilds_the_nodes_share_from_ten_survivors() -> None:
    kv = store(nodes=12)
    blocks = in_group(kv, 0, 30)
    kv.write(blocks, 0.0, 0)
    kv.fail_node(4)
    kv.repair_node(4, 100.0)
    share = 30 * BLOCK / 10
    assert kv.nodes.rebuild_bytes == pytest.approx(share * 11)
    assert kv.nodes.busy[4] == pytest.approx(100.0 + share / 5e9)
    assert sum(b > 100.0 for b in kv.nodes.busy) == 11  # ten sources and the rebuilt node


def test_logical_capacity_and_coding_width_validation() -> None:
    cfg = StoragePool(nodes=12)
    assert cfg.logical_bytes == pytest.approx(12 * 20 * 30.73e12 * 10 / 12)
    with pytest.raises(ValueError, match="multiple of the coding width"):
        StoragePool(nodes=13)
    with pytest.raises(ValueError, match="low_watermark"):
        StoragePool(nodes=12, low_watermark=0.9, high_watermark=0.8)


def test_a_read_retags_the_block_with_the_readers_class_when_reads_refresh() -> None:
    kv = store(ttl_s={"chatbot": 100.0, "agent": 10.0})
    kv.write(chain(0, 2), 0.0, traffic_class=1)  # written by an agent: 10 s
    assert kv.lookup(chain(0, 2), 5.0, traffic_class=0) == 2  # read by a chatbot: now 100 s
    assert kv.lookup(chain(0, 2), 50.0) == 2
    assert kv.check() == []
