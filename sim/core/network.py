"""Links with fair (processor-sharing) bandwidth for KV transfers.

A :class:`Link` carries concurrent transfers that share its bandwidth equally: with k flows in
flight each progresses at ``bandwidth / k``. Bookkeeping uses a virtual clock ``V`` (bytes served
to every active flow so far): a flow that starts at ``V0`` with ``b`` bytes finishes when ``V``
reaches ``V0 + b``, so the flows live in a heap keyed by that finish tag and the link keeps one
pending wake-up for the smallest (kept when a new flow only delays it). A transfer costs about
one event however many flows share the link. A link can be cut (no progress: flows stall) and
repaired; the stall shows in the transfer time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import simpy


class Link:
    """A shared link: flows progress at bandwidth / n_active; latency is added per transfer."""

    __slots__ = (
        "_heap",
        "_last",
        "_pending_at",
        "_version",
        "_virtual",
        "bytes_per_s",
        "bytes_total",
        "callbacks",
        "env",
        "latency_s",
        "name",
        "transfers",
        "up",
    )

    def __init__(
        self, env: simpy.Environment, name: str, bytes_per_s: float, latency_s: float
    ) -> None:
        if bytes_per_s <= 0:
            raise ValueError(f"link {name}: bandwidth must be positive")
        self.env = env
        self.name = name
        self.bytes_per_s = bytes_per_s
        self.latency_s = latency_s
        self._heap: list[tuple[float, int]] = []  # (finish tag on the virtual clock, flow id)
        self.callbacks: dict[int, Callable[[int], None]] = {}
        self._virtual = 0.0
        self._last = env.now
        self._version = 0
        self._pending_at = float("inf")
        self.up = True
        self.transfers = 0
        self.bytes_total = 0.0

    @property
    def active(self) -> int:
        return len(self._heap)

    def _rate_per_flow(self) -> float:
        return self.bytes_per_s / len(self._heap) if self.up and self._heap else 0.0

    def _advance(self) -> None:
        now = self.env.now
        self._virtual += self._rate_per_flow() * (now - self._last)
        self._last = now

    def _reschedule(self) -> None:
        rate = self._rate_per_flow()
        if rate <= 0:
            self._version += 1  # cut or idle: any pending wake-up is void
            self._pending_at = float("inf")
            return
        delay = max(0.0, (self._heap[0][0] - self._virtual) / rate)
        target = self.env.now + delay
        if self._pending_at <= target:
            return  # an earlier wake-up is pending: it will re-check and reschedule
        self._version += 1
        version = self._version
        self._pending_at = target
        self.env.timeout(delay).callbacks.append(lambda _ev: self._on_wake(version))

    def _on_wake(self, version: int) -> None:
        if version != self._version:
            return  # superseded by an earlier wake-up, a cut or a repair
        self._pending_at = float("inf")
        self._advance()
        # A wake-up scheduled for the smallest tag lands on it exactly (no round-off drift); an
        # early one (the rates changed since) just finds nothing finished and reschedules.
        tag = self._heap[0][0]
        if tag - self._virtual <= 1e-9 * tag + 1e-6:
            self._virtual = max(self._virtual, tag)
        finished = []
        while self._heap and self._heap[0][0] <= self._virtual:
            finished.append(heapq.heappop(self._heap)[1])
        self._reschedule()
        for fid in finished:
            self.callbacks.pop(fid)(fid)

    def send(self, flow_id: int, nbytes: float, on_done: Callable[[int], None]) -> None:
        """Start a transfer; ``on_done(flow_id)`` is called when its last byte arrives.

        The latency is charged as ``latency × bandwidth`` extra bytes on the flow: exact for a
        flow alone on the link, and it saves an event per transfer (latencies here are µs)."""
        self.transfers += 1
        self.bytes_total += nbytes
        self._advance()
        size = float(nbytes) + self.latency_s * self.bytes_per_s
        heapq.heappush(self._heap, (self._virtual + size, flow_id))
        self.callbacks[flow_id] = on_done
        self._reschedule()

    def cut(self) -> None:
        self._advance()
        self.up = False
        self._reschedule()

    def drain(self) -> list[tuple[int, float, Callable[[int], None]]]:
        """Remove every flow: (flow id, bytes left, callback), to re-send them elsewhere."""
        self._advance()
        out = [
            (fid, max(0.0, tag - self._virtual), self.callbacks.pop(fid)) for tag, fid in self._heap
        ]
        self._heap.clear()
        self._reschedule()
        return out

    def repair(self) -> None:
        self._advance()
        self.up = True
        self._reschedule()

    def report(self) -> dict[str, float]:
        """The link's own counts: transfers started, their bytes, flows in flight now."""
        return {"transfers": self.transfers, "bytes": self.bytes_total, "active": self.active}
