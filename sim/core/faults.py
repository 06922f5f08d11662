"""Failures during a run: a decode rank, a P->D link, a storage node (scheduled or random).

Each is a SimPy process on the cluster: it fails its target at a time, counts it, and repairs
it after its duration; a rank's requests are re-routed through the request flow and requests
parked while no rank was up resume at the repair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...rng import exponential
from ..stages.kvstore import KvStore
from .cluster import Cluster

if TYPE_CHECKING:
    from ...scenario import Fault


def start_faults(cl: Cluster, faults: Sequence[Fault], kv: KvStore | None) -> None:
    """Start one process per scheduled fault (``faults:`` of the scenario)."""
    env = cl.env
    for fault in faults:
        if fault.kind == "link_cut":
            env.process(link_cut(cl, fault.target, fault.at_s, fault.duration_s))
        elif fault.kind == "storage_node_fail":
            if kv is not None:
                env.process(storage_node_fail(cl, kv, fault.target, fault.at_s, fault.duration_s))
        else:
            env.process(rank_fail(cl, fault.target, fault.rank, fault.at_s, fault.duration_s))


def storage_node_fail(cl: Cluster, kv: KvStore, node: int, at_s: float, duration_s: float):
    """A storage node is down for a while; its group degrades or loses its blocks, then rebuilds."""
    env = cl.env
    yield env.timeout(at_s)
    if kv.nodes.failed[node]:
        return  # already down (a scheduled and a random failure overlap)
    kv.fail_node(node)
    cl.counters["storage_node_failures"] = cl.counters.get("storage_node_failures", 0) + 1
    yield env.timeout(duration_s)
    kv.repair_node(node, env.now)


def start_random_storage_failures(
    cl: Cluster, kv: KvStore, nodes: int, mtbf_h: float, mttr_h: float, rng: np.random.Generator
) -> None:
    """Every node fails after an exponential time to failure (mean MTBF) and is repaired after
    an exponential time to repair (mean MTTR), over and over."""
    mtbf_s, mttr_s = mtbf_h * 3600.0, mttr_h * 3600.0

    def life(node: int):
        while True:
            up, down = (float(v) for v in exponential(rng, 1.0, 2) * (mtbf_s, mttr_s))
            yield from storage_node_fail(cl, kv, node, up, down)

    for node in range(nodes):
        cl.env.process(life(node))


def _count_live_ranks(cl: Cluster) -> None:
    cl.live_ranks = sum(int(g.ep - g.down.sum()) for g in cl.decode)


def rank_fail(cl: Cluster, group: int, rank: int, at_s: float, duration_s: float):
    """A decode rank fails for a while; its requests are re-routed, none is lost. When it was
    the last live rank anywhere they wait for a repair (``decode.parked_no_live_rank``), or are
    rejected (``no_decode_rank``) when none will come (an infinite duration: API only, since
    configs must be finite)."""
    yield cl.env.timeout(at_s)
    g = cl.decode[group]
    repairs = math.isfinite(duration_s)
    if repairs:
        cl.repairs_pending += 1
    was_up = not g.down.all()
    evicted = g.fail_rank(rank)
    _count_live_ranks(cl)
    if was_up and g.down.all():
        cl.counters["group_outages"] = cl.counters.get("group_outages", 0) + 1
    assert g.on_evict is not None
    for rid in evicted:
        g.on_evict(rid)
    if not repairs:
        return
    yield cl.env.timeout(duration_s)
    g.repair_rank(rank)
    cl.repairs_pending -= 1
    _count_live_ranks(cl)
    assert cl.flow is not None
    while cl.parked and cl.live_ranks > 0:  # requests that waited for a live rank
        rid, inst = cl.parked.popleft()
        cl.flow.route_decode(rid, inst)


def link_cut(cl: Cluster, target: int, at_s: float, duration_s: float):
    """Cut instance ``target``'s P->D link for a while; with a backup path its flows move there
    (and ``transfer`` sends new P->D transfers there until the repair: ``transfer.rerouted``
    counts both)."""
    env = cl.env
    yield env.timeout(at_s)
    link = cl.links[target]
    link.cut()
    cl.counters["link_cuts"] = cl.counters.get("link_cuts", 0) + 1
    if cl.backup_links:
        backup = cl.backup_links[target]
        for fid, left, cb in link.drain():
            backup.send(fid, left, cb)
            # flow ids: 2·rid P->D transfer, 2·rid + 1 store write (sharing the egress link)
            key = "rerouted_transfers" if fid % 2 == 0 else "rerouted_store_writes"
            cl.counters[key] = cl.counters.get(key, 0) + 1
    yield env.timeout(duration_s)
    link.repair()
