"""Decode balancer policies: which (decode group, rank) a prefilled request is sent to.

The choice is made when prefill finishes, before the KV transfer, because the KV is sent to one
rank's memory. Reference policies: ``round_robin`` over every rank of every group, and
``least_requests`` (fewest requests routed to the rank and not yet finished).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .decode import DecodeGroup


class DecodeBalancer(Protocol):
    def choose(self, rid: int) -> tuple[int, int]: ...


class RoundRobinBalancer:
    def __init__(self, groups: Sequence[DecodeGroup]) -> None:
        self.slots = [(g.idx, r) for g in groups for r in range(g.ep)]
        self.next = 0

    def choose(self, rid: int) -> tuple[int, int]:
        choice = self.slots[self.next]
        self.next = (self.next + 1) % len(self.slots)
        return choice


class LeastRequestsBalancer:
    def __init__(self, groups: Sequence[DecodeGroup]) -> None:
        self.groups = groups

    def choose(self, rid: int) -> tuple[int, int]:
        best: tuple[int, int] = (0, 0)
        best_load = None
        for g in self.groups:
            r = int(np.argmin(g.assigned))
            load = int(g.assigned[r])
            if best_load is None or load < best_load:
                best, best_load = (g.idx, r), load
        return best


def make_balancer(name: str, groups: Sequence[DecodeGroup]) -> DecodeBalancer:
    balancers: dict[str, type[RoundRobinBalancer | LeastRequestsBalancer]] = {
        "round_robin": RoundRobinBalancer,
        "least_requests": LeastRequestsBalancer,
    }
    return balancers[name](groups)
