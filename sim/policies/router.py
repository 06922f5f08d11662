"""Prefill router policies: which prefill instance a request goes to.

A policy is a small object with ``choose(rid, route) -> instance index``, where ``route`` says
the request's length tier, its predicted prefill work and which machine (if any) holds its SWA
slot. Policies:

- ``tiered`` (DeepSeek's): requests are bucketed by total context length into tiers (< 16K,
  16–64K, 64–256K, >= 256K by default). Every ``round_s`` the instances are re-assigned to tiers
  in proportion to the share of predicted compute each tier brought in the round that ended
  (largest-remainder apportionment, at least one instance per tier that had demand). Within its
  tier a request goes to the instance with the least outstanding work. Re-assignment only
  changes where new requests go: queued and running work stays where it is.
- ``least_outstanding``: the instance with the least predicted outstanding work.
- ``round_robin``: in turn.
- ``cache_affinity``: the least-loaded instance on the machine that holds the request's SWA
  slot, unless that instance has more than ``affinity_slack_s`` more outstanding work than the
  least-loaded instance overall (a hot slot — the system prompt's — would otherwise pull every
  request onto one machine); else least outstanding.

Aggregated serving places a request on an instance's DP rank at once, since that rank both
prefills and decodes it: :class:`RankRouter` asks the decode balancer
(``policies.decode_balancer``, ``sim/policies/balancer.py``) over the instances' ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import simpy

if TYPE_CHECKING:
    from ..stages.decode import DecodeGroup
    from ..stages.prefill import PrefillInstance
    from .balancer import DecodeBalancer


@dataclass(slots=True)
class Route:
    tier: int
    work_s: float
    swa_machine: int  # -1: no SWA slot anywhere


class PrefillRouter(Protocol):
    def choose(self, rid: int, route: Route) -> int: ...


def least_loaded(instances: Sequence[PrefillInstance], candidates: Sequence[int]) -> int:
    best = candidates[0]
    best_load = instances[best].outstanding_s
    for i in candidates[1:]:
        load = instances[i].outstanding_s
        if load < best_load:
            best, best_load = i, load
    return best


class RoundRobinRouter:
    def __init__(self, instances: Sequence[PrefillInstance]) -> None:
        self.n = len(instances)
        self.next = 0

    def choose(self, rid: int, route: Route) -> int:
        i = self.next
        self.next = (i + 1) % self.n
        return i


class LeastOutstandingRouter:
    def __init__(self, instances: Sequence[PrefillInstance]) -> None:
        self.instances = instances
        self.all = list(range(len(instances)))

    def choose(self, rid: int, route: Route) -> int:
        return least_loaded(self.instances, self.all)


class CacheAffinityRouter(LeastOutstandingRouter):
    def __init__(self, instances: Sequence[PrefillInstance], slack_s: float) -> None:
        super().__init__(instances)
        self.slack_s = slack_s
        self.on_machine: dict[int, list[int]] = {}
        for i, inst in enumerate(instances):
            self.on_machine.setdefault(inst.machine, []).append(i)

    def choose(self, rid: int, route: Route) -> int:
        best = least_loaded(self.instances, self.all)
        local = self.on_machine.get(route.swa_machine)
        if local:
            near = least_loaded(self.instances, local)
            gap = self.instances[near].outstanding_s - self.instances[best].outstanding_s
            if gap <= self.slack_s:
                return near
        return best


class RankRouter:
    """Aggregated serving: the decode balancer's (instance, rank) for each request — ``two_dim``
    balances the requests and the KV routed to each rank, ``least_requests`` the requests —
    reserved on that instance (``assign``), which prefills the prompt on that rank and decodes
    it there. The instance index is the choice."""

    def __init__(self, balancer: DecodeBalancer, groups: Sequence[DecodeGroup]) -> None:
        self.balancer = balancer
        self.groups = groups

    def choose(self, rid: int, route: Route) -> int:
        g, r = self.balancer.choose(rid)
        self.groups[g].assign(rid, r)
        return g


def apportion(demand: np.ndarray, seats: int) -> np.ndarray:
    """Largest-remainder apportionment of ``seats`` to tiers by ``demand``, at least one seat
    for every tier with demand when there are enough seats."""
    active = demand > 0
    counts = np.zeros(demand.size, dtype=np.int64)
    if not active.any() or seats <= 0:
        return counts
    share = demand / demand.sum() * seats
    counts = np.floor(share).astype(np.int64)
    order = np.argsort(-(share - counts), kind="stable")
    counts[order[: seats - int(counts.sum())]] += 1
    if seats >= int(active.sum()):  # no tier with demand left without an instance
        for t in np.flatnonzero(active & (counts == 0)):
            counts[int(np.argmax(counts))] -= 1
            counts[t] = 1
    return counts


class TieredRouter:
    def __init__(
        self,
        env: simpy.Environment,
        instances: Sequence[PrefillInstance],
        tiers: int,
        round_s: float,
    ) -> None:
        self.instances = instances
        self.all = list(range(len(instances)))
        self.members: list[list[int]] = [self.all] * tiers  # until the first round ends
        self.demand = np.zeros(tiers)
        self.rounds = 0
        self.history: list[tuple[float, list[int]]] = []
        env.process(self._rounds(env, round_s))

    def choose(self, rid: int, route: Route) -> int:
        self.demand[route.tier] += route.work_s
        return least_loaded(self.instances, self.members[route.tier] or self.all)

    def _rounds(self, env: simpy.Environment, round_s: float):
        while True:
            yield env.timeout(round_s)
            self.rebalance(env.now)

    def rebalance(self, now: float) -> None:
        if self.demand.sum() <= 0:
            return
        counts = apportion(self.demand, len(self.instances))
        members: list[list[int]] = []
        start = 0
        for c in counts.tolist():
            members.append(self.all[start : start + c])
            start += c
        self.members = members
        self.history.append((now, counts.tolist()))
        self.demand[:] = 0
        self.rounds += 1


def make_router(
    name: str,
    env: simpy.Environment,
    instances: Sequence[PrefillInstance],
    tiers: int,
    round_s: float,
    affinity_slack_s: float,
) -> PrefillRouter:
    if name == "tiered":
        return TieredRouter(env, instances, tiers, round_s)
    if name == "cache_affinity":
        return CacheAffinityRouter(instances, affinity_slack_s)
    simple: dict[str, type[RoundRobinRouter | LeastOutstandingRouter]] = {
        "round_robin": RoundRobinRouter,
        "least_outstanding": LeastOutstandingRouter,
    }
    return simple[name](instances)
