"""Prefill router policies: which prefill instance a request goes to.

A policy is a small object with ``choose(rid) -> instance index``. The reference policies here are
``round_robin`` and ``least_outstanding`` (fewest queued + running prompt tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .prefill import PrefillInstance


class PrefillRouter(Protocol):
    def choose(self, rid: int) -> int: ...


class RoundRobinRouter:
    def __init__(self, instances: Sequence[PrefillInstance]) -> None:
        self.n = len(instances)
        self.next = 0

    def choose(self, rid: int) -> int:
        i = self.next
        self.next = (i + 1) % self.n
        return i


class LeastOutstandingRouter:
    def __init__(self, instances: Sequence[PrefillInstance]) -> None:
        self.instances = instances

    def choose(self, rid: int) -> int:
        load = [p.queued_tokens + p.running_tokens for p in self.instances]
        return load.index(min(load))


def make_router(name: str, instances: Sequence[PrefillInstance]) -> PrefillRouter:
    routers: dict[str, type[RoundRobinRouter | LeastOutstandingRouter]] = {
        "round_robin": RoundRobinRouter,
        "least_outstanding": LeastOutstandingRouter,
    }
    return routers[name](instances)
