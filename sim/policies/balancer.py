"""Decode balancer policies: which (decode group, rank) a prefilled request is sent to.

The choice is made when prefill finishes, before the KV transfer, because the KV is sent to one
rank's memory. Policies:

- ``two_dim`` (DeepSeek's): balances request count and KV length per rank at once. A request
  holding L context tokens gets weight w = L / (L + long_tokens): a short one (w → 0) goes where
  few requests run, preferring ranks with long caches among those; a long one (w → 1) goes where
  the cache is small. Score per rank = (1 − w)·(c − ¼·k) + w·k with c and k the rank's routed
  requests and routed KV tokens relative to the group mean; the lowest score wins.
- ``least_requests``: fewest requests routed to the rank and not finished.
- ``round_robin``: every rank of every group in turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from ..stages.decode import DecodeGroup


class DecodeBalancer(Protocol):
    def choose(self, rid: int) -> tuple[int, int]: ...


class RoundRobinBalancer:
    def __init__(self, groups: Sequence[DecodeGroup]) -> None:
        self.groups = groups
        self.slots = [(g.idx, r) for g in groups for r in range(g.ep)]
        self.next = 0

    def choose(self, rid: int) -> tuple[int, int]:
        for _ in range(len(self.slots)):  # skip ranks that are down
            choice = self.slots[self.next]
            self.next = (self.next + 1) % len(self.slots)
            if not self.groups[choice[0]].down[choice[1]]:
                return choice
        raise RuntimeError("every decode rank is down")


class LeastRequestsBalancer:
    def __init__(self, groups: Sequence[DecodeGroup]) -> None:
        self.groups = groups

    def choose(self, rid: int) -> tuple[int, int]:
        best: tuple[int, int] = (0, 0)
        best_load = None
        for g in self.groups:
            loads = g.assigned + g.penalty  # a rank that is down costs infinity
            r = int(np.argmin(loads))
            load = float(loads[r])
            if best_load is None or load < best_load:
                best, best_load = (g.idx, r), load
        return best


class TwoDimBalancer:
    def __init__(self, groups: Sequence[DecodeGroup], long_tokens: int) -> None:
        self.groups = groups
        self.long_tokens = float(long_tokens)

    def choose(self, rid: int) -> tuple[int, int]:
        t = self.groups[0].table
        L = float(t.input_len[rid] + t.output_len[rid])
        w = L / (L + self.long_tokens)
        best: tuple[int, int] = (0, 0)
        best_score = np.inf
        for g in self.groups:
            # (1 − w)·(c − ¼k) + w·k with c, k relative to the group means, as one linear form
            mean_c = max(1e-9, float(g.assigned.sum()) / g.ep)
            mean_k = max(1e-9, float(g.assigned_kv.sum()) / g.ep)
            score = (
                g.assigned * ((1.0 - w) / mean_c)
                + g.assigned_kv * ((w - 0.25 * (1.0 - w)) / mean_k)
                + g.penalty
            )
            r = int(np.argmin(score))
            if score[r] < best_score:
                best, best_score = (g.idx, r), float(score[r])
        return best


def make_balancer(
    name: str, groups: Sequence[DecodeGroup], long_tokens: int = 16384
) -> DecodeBalancer:
    if name == "two_dim":
        return TwoDimBalancer(groups, long_tokens)
    balancers: dict[str, type[RoundRobinBalancer | LeastRequestsBalancer]] = {
        "round_robin": RoundRobinBalancer,
        "least_requests": LeastRequestsBalancer,
    }
    return balancers[name](groups)
