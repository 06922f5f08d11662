"""The storage nodes of the KV-cache cluster: their bandwidth queues, erasure-coded reads and
writes, failures and rebuilds.

Nodes form disjoint coding groups of ``data + parity`` nodes (10 + 2 by default); a block's
stripe has one chunk of ``block / data`` bytes on every node of its group. Each node is a FIFO
work queue measured in seconds of its own time: a read chunk costs ``bytes / read_bw``, a write
chunk ``bytes / write_bw``, so concurrent reads and writes share the node. A node answers
``queue wait + service + latency`` with the latency exponential around ``node_latency_s``.

- A read goes to ``data + 1`` live nodes of the group (the least busy) and completes at the
  ``data``-th answer (an order statistic). With fewer live nodes than that (parity failed) it
  must wait for all ``data`` survivors: a degraded read.
- A write goes to every live node and completes at the last one.
- A group with more than ``parity`` failed nodes has lost its stripes (the block index drops
  them); after repair, a node of a surviving group is rebuilt: ``data`` survivors each read the
  repaired node's share and it writes it back, occupying their queues.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...jit import COMPILED, njit
from ...rng import exponential
from ...scenario import StoragePool

_LATENCY_BLOCK = 4096  # node latencies drawn from the stream at a time


class StorageNodes:
    __slots__ = (
        "_drawn",
        "_next",
        "busy",
        "cfg",
        "data",
        "degraded_reads",
        "failed",
        "groups",
        "latency_s",
        "read_bytes",
        "read_s_per_byte",
        "rebuild_bytes",
        "recorder",
        "rng",
        "width",
        "write_bytes",
        "write_s_per_byte",
    )

    def __init__(self, cfg: StoragePool, rng: np.random.Generator) -> None:
        self.cfg = cfg
        self.rng = rng
        self.width = cfg.width
        self.data = cfg.data_chunks
        self.groups = cfg.nodes // cfg.width
        self.busy = np.zeros(cfg.nodes)  # time each node's queue drains
        self.failed = np.zeros(cfg.nodes, dtype=np.bool_)
        self.read_s_per_byte = 1.0 / (cfg.read_gbytes_per_s * 1e9)
        self.write_s_per_byte = 1.0 / (cfg.write_gbytes_per_s * 1e9)
        self.latency_s = cfg.node_latency_s
        self._drawn = np.zeros(0)  # node latencies drawn, used from ``_next`` on
        self._next = 0
        self.read_bytes = 0.0
        self.write_bytes = 0.0
        self.rebuild_bytes = 0.0
        self.degraded_reads = 0
        # (nodes, service s, service end per node, bytes per node, is write) per queued chunk
        # set: the timeline export's recorder (sim/results/timeline.py); None, the default,
        # records nothing
        self.recorder: Callable[[list[int], float, list[float], float, bool], None] | None = None

    def members(self, group: int) -> range:
        return range(group * self.width, (group + 1) * self.width)

    def live(self, group: int) -> list[int]:
        failed = self.failed
        return [n for n in self.members(group) if not failed[n]]

    def failed_in(self, group: int) -> int:
        return int(np.count_nonzero(self.failed[group * self.width : (group + 1) * self.width]))

    def readable(self, group: int) -> bool:
        return self.failed_in(group) <= self.cfg.parity_chunks

    def _serve(self, nodes: list[int], nbytes: float, s_per_byte: float, now: float) -> list[float]:
        """Queue ``nbytes`` on each of ``nodes``; their answer times."""
        busy = self.busy
        service = nbytes * s_per_byte
        done = []
        for n in nodes:
            t = max(float(busy[n]), now) + service
            busy[n] = t
            done.append(t)
        if self.recorder is not None:
            self.recorder(nodes, service, done, nbytes, s_per_byte == self.write_s_per_byte)
        if self.latency_s > 0:
            lat = self._latencies(len(nodes))
            done = [d + x for d, x in zip(done, lat, strict=True)]
        return done

    def _latencies(self, n: int) -> list[float]:
        """``n`` exponential node latencies, drawn from the stream in blocks."""
        self._have_latencies(n)
        out = self._drawn[self._next : self._next + n].tolist()
        self._next += n
        return out

    def _have_latencies(self, n: int) -> None:
        """At least ``n`` latencies drawn and not used yet. (The stream serves only them, so
        when a block is drawn does not change which latency each chunk gets.)"""
        if self._next + n > len(self._drawn):
            fresh = exponential(self.rng, self.latency_s, _LATENCY_BLOCK)
            self._drawn = np.concatenate([self._drawn[self._next :], fresh])
            self._next = 0

    def _compiled(self) -> bool:
        """Whether reads and writes take :func:`serve_group` (not while a recorder listens)."""
        return bool(COMPILED) and self.recorder is None

    def _serve_group(self, group: int, nbytes: float, now: float, read: bool) -> float:
        """:meth:`read` or :meth:`write` of a group, compiled."""
        use_latency = self.latency_s > 0
        if use_latency:
            self._have_latencies(self.width)
        args = (self.busy, self.failed, group * self.width, self.width, self.data)
        per_byte = self.read_s_per_byte if read else self.write_s_per_byte
        service = nbytes / self.data * per_byte
        end, served = serve_group(*args, service, now, self._drawn, self._next, use_latency, read)
        if use_latency:
            self._next += served
        if read:
            self.read_bytes += nbytes * served / self.data
            if served < self.data + 1:
                self.degraded_reads += 1
        else:
            self.write_bytes += nbytes * served / self.data
        return end - now

    def read(self, group: int, nbytes: float, now: float) -> float:
        """Seconds until ``nbytes`` of ``group``'s stripes are decoded (group must be readable)."""
        if self._compiled():
            return self._serve_group(group, nbytes, now, True)
        live = self.live(group)
        want = self.data + 1
        if len(live) > want:
            busy = self.busy
            live = sorted(live, key=busy.__getitem__)[:want]
        elif len(live) < want:
            self.degraded_reads += 1
        self.read_bytes += nbytes * len(live) / self.data
        answers = self._serve(live, nbytes / self.data, self.read_s_per_byte, now)
        return sorted(answers)[self.data - 1] - now

    def write(self, group: int, nbytes: float, now: float) -> float:
        """Seconds until every live node of ``group`` holds its chunk of ``nbytes``."""
        if self._compiled():
            return self._serve_group(group, nbytes, now, False)
        live = self.live(group)
        self.write_bytes += nbytes * len(live) / self.data
        return max(self._serve(live, nbytes / self.data, self.write_s_per_byte, now)) - now

    def report(self) -> dict[str, float]:
        """The nodes' traffic (bytes read, written, rebuilt over every node) and the reads
        served degraded; ``failed_nodes`` is how many are down now."""
        return {
            "read_bytes": self.read_bytes,
            "write_bytes": self.write_bytes,
            "rebuild_bytes": self.rebuild_bytes,
            "degraded_reads": self.degraded_reads,
            "failed_nodes": int(np.count_nonzero(self.failed)),
        }

    def fail(self, node: int) -> None:
        self.failed[node] = True

    def repair(self, node: int, group_bytes: float, now: float) -> None:
        """Bring ``node`` back; if its group kept its data, rebuild the node's share of it."""
        self.failed[node] = False
        group = node // self.width
        share = group_bytes / self.data
        if share <= 0 or not self.readable(group):
            return
        sources = [n for n in self.live(group) if n != node][: self.data]
        self._serve(sources, share, self.read_s_per_byte, now)
        self._serve([node], share, self.write_s_per_byte, now)
        self.rebuild_bytes += share * (len(sources) + 1)


@njit
def serve_group(
    busy: np.ndarray,
    failed: np.ndarray,
    first: int,
    width: int,
    data: int,
    service: float,
    now: float,
    latencies: np.ndarray,
    start: int,
    use_latency: bool,
    read: bool,
) -> tuple[float, int]:
    """(answer time, nodes served) of a read (``read``) or a write of a chunk of ``service``
    seconds on each node of the group of nodes [first, first + width): as
    :meth:`StorageNodes.read` and :meth:`StorageNodes.write` do it — a read on the ``data`` + 1
    least busy live nodes (ties in node order), answered at the ``data``-th answer; a write on
    every live node, answered at the last; each node's answer is its queue's end plus, with
    ``use_latency``, the next of ``latencies`` from ``start``, in the order the nodes are served."""
    live = np.empty(width, np.int64)
    m = 0
    for n in range(first, first + width):
        if not failed[n]:
            live[m] = n
            m += 1
    live = live[:m]
    if read and m > data + 1:
        live = live[np.argsort(busy[live], kind="mergesort")[: data + 1]]
        m = data + 1
    done = np.empty(m)
    for i in range(m):
        n = live[i]
        t = max(busy[n], now) + service
        busy[n] = t
        done[i] = t + latencies[start + i] if use_latency else t
    if read:
        return np.sort(done)[data - 1], m
    return done.max(), m
