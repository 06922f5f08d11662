"""How a request moves between the stages, from arrival to its decode rank.

Admission at arrival (context and KV limits, a vision encoder for images, the admission
policy), then the prefill -> decode hand-off: route to a live decode rank, send the KV over the
prefill instance's link (or its backup while the link is cut), hand it to the rank when it lands.
A request whose rank fails is re-routed (its KV recomputed where it lands); while no decode rank
is up it waits for a repair, or is rejected when none will come. Under aggregated serving a
prompt is decoded where it was prefilled: its first token is out when its prefill ends, and the
hand-off is local (``decode_locally``). One object per run, built from resolved parts by
``sim/core/assemble.py``; the cluster holds the counters it updates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import InvariantError
from ..stages.vision import least_outstanding
from .requests import RejectReason, State

if TYPE_CHECKING:
    from ..policies.balancer import DecodeBalancer
    from .cluster import Cluster


@dataclass(frozen=True)
class RequestLimits:
    """What a request may need, and what its hand-off moves."""

    max_context_tokens: int
    kv_capacity_tokens: float  # one decode rank's KV, in tokens
    seq_overhead_tokens: float  # a sequence's SWA slot, in KV tokens
    kv_bytes_per_token: float  # P->D transfer bytes per prompt token
    slot_bytes: float  # the SWA slot sent with every transfer


class RequestFlow:
    """The hand-offs of one run: ``admit`` at arrival, ``prefilled`` when a prompt's prefill
    ends, ``reroute`` when a decode rank drops a request, ``route_decode`` after a repair."""

    def __init__(
        self,
        cl: Cluster,
        limits: RequestLimits,
        balancer: DecodeBalancer,
        to_prefill: Callable[[int], None],
        decode_locally: Callable[[int, int], None] | None = None,
    ) -> None:
        """``decode_locally(rid, instance)``: aggregated serving's hand-off, on the instance
        that prefilled the prompt (None: route to a decode rank and transfer the KV)."""
        self.cl = cl
        self.limits = limits
        self.balancer = balancer
        self.to_prefill = to_prefill
        self.decode_locally = decode_locally

    def admit(self, rid: int) -> None:
        """An arrival: rejected with its reason, or sent to a vision encoder or to prefill."""
        cl, lim = self.cl, self.limits
        table = cl.table
        cl.arrived += 1
        need = float(table.input_len[rid] + table.output_len[rid])
        images = table.source.image_count[rid]
        if need > lim.max_context_tokens:
            table.reject(rid, RejectReason.CONTEXT_TOO_LONG)
        elif need + lim.seq_overhead_tokens > lim.kv_capacity_tokens:
            table.reject(rid, RejectReason.KV_CAPACITY)
        elif images > 0 and not cl.vision:
            table.reject(rid, RejectReason.NO_VISION_ENCODER)
        elif reason := cl.admission.reason(rid):  # policies.admission: turned away under load
            table.reject(rid, reason)
        elif images > 0:
            cl.admission.admitted()
            least_outstanding(cl.vision).submit(rid)
            return
        else:
            cl.admission.admitted()
            self.to_prefill(rid)
            return
        cl.count_end()

    def prefilled(self, rid: int, inst: int) -> None:
        """Prefill instance ``inst`` finished ``rid``'s prompt."""
        cl = self.cl
        cl.admission.prefilled()
        table = cl.table
        if self.decode_locally is not None:
            table.t_transfer_end[rid] = cl.env.now  # the first token: no transfer to wait for
            self.decode_locally(rid, inst)
            return
        if table.output_len[rid] <= 1:  # the prefill's token is the whole answer
            now = cl.env.now
            table.t_transfer_end[rid] = now
            table.t_done[rid] = now
            table.state[rid] = State.DONE
            cl.count_end()
            return
        self.route_decode(rid, inst)

    def route_decode(self, rid: int, inst: int) -> None:
        """Send a request to a live decode rank: its KV goes over prefill instance ``inst``'s
        link, or (``inst`` = -1, its KV was lost with a failed rank) it queues there at once and
        recomputes. With every rank down it waits for the next repair, or is rejected when no
        repair will come (a whole-pool outage never loops on a dead rank)."""
        cl = self.cl
        table = cl.table
        if cl.live_ranks <= 0:
            if cl.repairs_pending > 0:
                cl.parked.append((rid, inst))
                table.state[rid] = State.DECODE_WAIT
                cl.counters["parked"] = cl.counters.get("parked", 0) + 1
            else:
                table.reject(rid, RejectReason.NO_DECODE_RANK)
                cl.count_end()
            return
        g, r = self.balancer.choose(rid)
        group = cl.decode[g]
        if group.down[r]:  # a balancer bug, not a state to loop on
            raise InvariantError(f"decode balancer chose rank {r} of group {g}, which is down")
        group.assign(rid, r)
        if inst < 0:
            group.arrive(rid)
        else:
            self.transfer(rid, inst)

    def transfer(self, rid: int, inst: int) -> None:
        """``rid``'s KV (prompt + SWA slot) over instance ``inst``'s link, or its backup."""
        cl, lim = self.cl, self.limits
        table = cl.table
        nbytes = lim.kv_bytes_per_token * float(table.input_len[rid]) + lim.slot_bytes
        table.transfer_bytes[rid] = nbytes
        table.state[rid] = State.TRANSFER
        link = cl.links[inst]
        if not link.up and cl.backup_links:
            link = cl.backup_links[inst]
            cl.counters["rerouted_transfers"] = cl.counters.get("rerouted_transfers", 0) + 1
        link.send(2 * rid, nbytes, self.transferred)

    def transferred(self, flow: int) -> None:
        """A link delivered a flow: egress flow 2·rid is rid's P->D transfer."""
        rid = flow // 2  # (2·rid + 1, the store write of the same egress link, never lands here)
        cl = self.cl
        cl.table.t_transfer_end[rid] = cl.env.now
        cl.decode[int(cl.table.decode_group[rid])].arrive(rid)

    def reroute(self, rid: int) -> None:
        """A request that lost its decode rank goes to a live one (KV recomputed there)."""
        cl = self.cl
        cl.table.failures[rid] += 1
        cl.counters["requeued"] = cl.counters.get("requeued", 0) + 1
        self.route_decode(rid, -1)
