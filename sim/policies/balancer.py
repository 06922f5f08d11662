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

from ...jit import COMPILED, njit, pairwise_sum, sum_block

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
        # the groups' per-rank routing counts as rows of (groups, ranks) matrices, so that one
        # compiled call scores every rank of every group (None: groups of different widths)
        self.rows = share_routing_rows(groups)

    def choose(self, rid: int) -> tuple[int, int]:
        t = self.groups[0].table
        L = float(t.input_len[rid] + t.output_len[rid])
        w = L / (L + self.long_tokens)
        if self.rows is not None and COMPILED:
            row, rank = two_dim_choose_compiled(*self.rows, w, sum_block())
            return self.groups[row].idx, rank
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


def share_routing_rows(
    groups: Sequence[DecodeGroup],
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Move the groups' ``assigned``, ``assigned_kv`` and ``penalty`` (per rank) into rows of
    three (groups, ranks) matrices, which the groups then update in place as before; None
    (nothing moved) when the groups differ in width. Called once, when the cluster is built."""
    if not groups or len({g.ep for g in groups}) != 1:
        return None
    assigned = np.stack([g.assigned for g in groups])
    assigned_kv = np.stack([g.assigned_kv for g in groups])
    penalty = np.stack([g.penalty for g in groups])
    for i, g in enumerate(groups):
        g.assigned, g.assigned_kv, g.penalty = assigned[i], assigned_kv[i], penalty[i]
    return assigned, assigned_kv, penalty


@njit
def two_dim_choose_compiled(
    assigned: np.ndarray, assigned_kv: np.ndarray, penalty: np.ndarray, w: float, block: int
) -> tuple[int, int]:
    """:meth:`TwoDimBalancer.choose`'s loop over the groups (rows), compiled: the same sums
    and scores in the same order; (group row, rank)."""
    groups, ranks = assigned.shape
    best_g, best_r = 0, 0
    best_score = np.inf
    for g in range(groups):
        mean_c = max(1e-9, float(assigned[g].sum()) / ranks)
        mean_k = max(1e-9, pairwise_sum(assigned_kv[g], block) / ranks)
        c_weight = (1.0 - w) / mean_c
        k_weight = (w - 0.25 * (1.0 - w)) / mean_k
        r_min, s_min = 0, np.inf
        for r in range(ranks):
            s = assigned[g, r] * c_weight + assigned_kv[g, r] * k_weight + penalty[g, r]
            if r == 0 or s < s_min:
                r_min, s_min = r, s
        if s_min < best_score:
            best_g, best_r, best_score = g, r_min, s_min
    return best_g, best_r


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
