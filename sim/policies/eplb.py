"""EPLB: DeepSeek's expert-parallel load balancer, vectorized over MoE layers.

Given each logical expert's load per layer, ``rebalance`` returns a :class:`Placement`: which
logical expert sits in every physical slot, slots rank-major (rank r owns slots
[r·spr, (r+1)·spr)). Written from the published description:

1. replicate — start with one replica per expert and give the next redundant slot to the expert
   with the largest load per replica, until every slot is used;
2. balanced packing — take replicas heaviest first and put each on the least-loaded rank that
   still has a free slot, so every rank holds the same number and the maximum load is small;
3. hierarchical when the model has expert groups that divide evenly over the nodes of the group:
   first pack whole expert groups onto nodes, then replicate and pack within each node (keeps a
   group's traffic inside a node). Otherwise (V4 models have no groups) global.

``match_ranks`` optionally renumbers the new packs onto ranks to keep as many experts where they
already are (an assignment problem per layer), so a rebalance moves fewer weights.

When a group's experts move is an :class:`ExpertPlacement`; ``EXPERT_PLACEMENT`` maps the
config's ``policies.eplb.{prefill,decode}.policy`` tag to one:

- ``static`` (:class:`StaticPlacement`, the reference double): the contiguous blocks of
  :func:`static_placement` forever; it keeps no statistics window, so nothing ever moves;
- ``eplb`` (:class:`Rebalancing`): starts from the EPLB placement of the expected load
  (``warm_start``) or the static blocks, and every ``period_steps`` steps re-places from the
  group's last ``window_steps`` steps of expert loads, renumbering ranks to keep experts where
  they are when ``minimize_moves``.

The group (``sim/stages/expert_parallel.py``) keeps the window, the step count since the last
re-placement and the sampling of the window's loads; the policy says how long a window it wants,
when it is due and what the next placement is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ...errors import ConfigError
from ...jit import COMPILED, njit
from ...scenario import EplbPool

if TYPE_CHECKING:
    from ..stages.expert_parallel import GroupShape


@dataclass(frozen=True)
class Placement:
    phy2log: np.ndarray  # (L, S) logical expert in each slot; E marks an empty slot
    replicas: np.ndarray  # (L, E) replicas per logical expert (>= 1)
    ranks: int

    @property
    def slots_per_rank(self) -> int:
        return self.phy2log.shape[1] // self.ranks

    def rank_counts(self, experts: int) -> np.ndarray:
        """(L, R, E + 1) replicas of each expert on each rank (last column: empty slots)."""
        layers, slots = self.phy2log.shape
        rank_of_slot = np.arange(slots) // self.slots_per_rank
        key = (np.arange(layers)[:, None] * self.ranks + rank_of_slot) * (experts + 1)
        key = key + self.phy2log
        counts = np.bincount(key.ravel(), minlength=layers * self.ranks * (experts + 1))
        return counts.reshape(layers, self.ranks, experts + 1)


def slots_per_rank(experts: int, ranks: int, redundant_per_rank: int) -> int:
    return -(-experts // ranks) + redundant_per_rank


def static_placement(layers: int, experts: int, ranks: int, redundant_per_rank: int) -> Placement:
    """No balancer: rank r owns a contiguous block of experts; redundant slots stay empty."""
    spr = slots_per_rank(experts, ranks, redundant_per_rank)
    phy2log = np.full((ranks, spr), experts, dtype=np.int64)
    for r, block in enumerate(np.array_split(np.arange(experts), ranks)):
        phy2log[r, : block.size] = block
    return Placement(
        np.tile(phy2log.ravel(), (layers, 1)), np.ones((layers, experts), np.int64), ranks
    )


def replicate(weight: np.ndarray, slots: int) -> np.ndarray:
    """(L, E) replicas per expert: each extra slot goes to the largest load per replica."""
    layers, experts = weight.shape
    reps = np.ones((layers, experts), dtype=np.int64)
    rows = np.arange(layers)
    per_replica = weight.astype(np.float64, copy=True)
    for _ in range(slots - experts):
        hot = per_replica.argmax(axis=1)
        reps[rows, hot] += 1
        per_replica[rows, hot] = weight[rows, hot] / reps[rows, hot]
    return reps


def balanced_packing(weight: np.ndarray, bins: int) -> np.ndarray:
    """(L, N) bin of each item: heaviest first onto the lightest bin with room, N/bins each."""
    order = np.argsort(-weight, axis=1, kind="stable")
    sorted_w = np.take_along_axis(weight, order, axis=1)
    if COMPILED:
        return balanced_packing_compiled(order, sorted_w, bins)
    layers, items = weight.shape
    per_bin = items // bins
    rows = np.arange(layers)
    load = np.zeros((layers, bins))  # a full bin's load is set to inf
    count = np.zeros((layers, bins), dtype=np.int64)
    bin_of = np.empty((layers, items), dtype=np.int64)
    for j in range(items):
        b = load.argmin(axis=1)
        bin_of[rows, order[:, j]] = b
        load[rows, b] += sorted_w[:, j]
        count[rows, b] += 1
        full = count[rows, b] == per_bin
        if full.any():
            load[rows[full], b[full]] = np.inf
    return bin_of


@njit
def balanced_packing_compiled(order: np.ndarray, sorted_w: np.ndarray, bins: int) -> np.ndarray:
    """:func:`balanced_packing`'s loop, compiled, layer by layer: the items in ``order``
    (heaviest first, their weights ``sorted_w``) each onto the first lightest bin with room —
    the same additions in the same order, so the same bins."""
    layers, items = order.shape
    per_bin = items // bins
    bin_of = np.empty((layers, items), dtype=np.int64)
    load = np.empty(bins)
    count = np.empty(bins, dtype=np.int64)
    for lay in range(layers):
        load[:] = 0.0
        count[:] = 0
        for j in range(items):
            b = 0
            for c in range(1, bins):  # argmin: the first of equal loads
                if load[c] < load[b]:
                    b = c
            bin_of[lay, order[lay, j]] = b
            load[b] += sorted_w[lay, j]
            count[b] += 1
            if count[b] == per_bin:
                load[b] = np.inf
    return bin_of


def _replicate_and_pack(weight: np.ndarray, slots: int, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Global EPLB on (L, E) loads: (phy2log (L, slots) rank-major, replicas (L, E))."""
    layers, experts = weight.shape
    reps = replicate(weight, slots)
    # the replicas as items: logical id and load per replica, in expert order
    item_log = np.stack([np.repeat(np.arange(experts), reps[i]) for i in range(layers)])
    rows = np.arange(layers)[:, None]
    item_w = weight[rows, item_log] / reps[rows, item_log]
    bin_of = balanced_packing(item_w, bins)
    # order items by (bin, heaviest first) so each bin's slots are contiguous
    order = np.lexsort((-item_w, bin_of), axis=1)
    return np.take_along_axis(item_log, order, axis=1), reps


def rebalance(
    weight: np.ndarray, ranks: int, redundant_per_rank: int, groups: int = 1, nodes: int = 1
) -> Placement:
    """EPLB placement for (L, E) expert loads over ``ranks`` ranks with the given redundancy.

    Hierarchical when ``groups`` > 1 divides evenly over ``nodes`` (and nodes divide the ranks),
    global otherwise."""
    layers, experts = weight.shape
    spr = slots_per_rank(experts, ranks, redundant_per_rank)
    slots = spr * ranks
    weight = np.maximum(np.asarray(weight, dtype=np.float64), 0.0) + 1e-9  # ties, zero loads
    hierarchical = (
        groups > 1
        and nodes > 1
        and groups % nodes == 0
        and ranks % nodes == 0
        and experts % groups == 0
    )
    if not hierarchical:
        phy2log, reps = _replicate_and_pack(weight, slots, ranks)
        return Placement(phy2log, reps, ranks)
    per_group = experts // groups
    group_w = weight.reshape(layers, groups, per_group).sum(axis=2)
    node_of_group = balanced_packing(group_w, nodes)  # (L, G), G/nodes groups per node
    # logical experts of each node, node-major: (L, nodes, E/nodes)
    group_order = np.argsort(node_of_group, axis=1, kind="stable")
    node_experts = (group_order[:, :, None] * per_group + np.arange(per_group)).reshape(
        layers, nodes, experts // nodes
    )
    rows = np.arange(layers)[:, None, None]
    node_w = weight[rows, node_experts].reshape(layers * nodes, -1)
    local, local_reps = _replicate_and_pack(node_w, slots // nodes, ranks // nodes)
    flat_experts = node_experts.reshape(layers * nodes, -1)
    phy2log = np.take_along_axis(flat_experts, local, axis=1).reshape(layers, slots)
    reps = np.empty((layers, experts), dtype=np.int64)
    np.put_along_axis(
        reps, node_experts.reshape(layers, experts), local_reps.reshape(layers, experts), axis=1
    )
    return Placement(phy2log, reps, ranks)


def match_ranks(old: Placement, new: Placement, experts: int, nodes: int = 1) -> Placement:
    """Renumber ``new``'s ranks (within each node) to keep the most experts where they are."""
    from scipy.optimize import linear_sum_assignment  # 0.4 s to import: only where it is used

    layers = new.phy2log.shape[0]
    ranks, spr = new.ranks, new.slots_per_rank
    keep = kept_experts(old, new, experts)
    per_node = ranks // nodes
    slots = new.phy2log.reshape(layers, ranks, spr)
    out = np.empty_like(slots)
    for layer in range(layers):
        for n in range(nodes):
            lo, hi = n * per_node, (n + 1) * per_node
            new_idx, old_idx = linear_sum_assignment(keep[layer, lo:hi, lo:hi], maximize=True)
            out[layer, lo + old_idx] = slots[layer, lo + new_idx]
    return Placement(out.reshape(layers, -1), new.replicas, ranks)


def kept_experts(old: Placement, new: Placement, experts: int) -> np.ndarray:
    """(L, R_new, R_old) slots of each new rank whose expert the old rank already holds."""
    if COMPILED:
        return kept_experts_compiled(old.phy2log, new.phy2log, new.ranks, experts)
    layers, ranks, spr = new.phy2log.shape[0], new.ranks, new.slots_per_rank
    old_has = old.rank_counts(experts)[:, :, :experts] > 0  # (L, R, E)
    old_has = np.concatenate([old_has, np.zeros((layers, ranks, 1), bool)], axis=2)
    kept = old_has.transpose(0, 2, 1)[np.arange(layers)[:, None], new.phy2log]  # (L, S, R_old)
    return kept.reshape(layers, ranks, spr, ranks).sum(axis=2)


@njit
def kept_experts_compiled(old: np.ndarray, new: np.ndarray, ranks: int, experts: int) -> np.ndarray:
    """:func:`kept_experts` over the slot tables: each new slot's expert counted once for every
    old rank that holds it (the holders listed per expert, not an (L, S, R) table)."""
    layers, slots = new.shape
    spr = slots // ranks
    keep = np.zeros((layers, ranks, ranks), np.int64)
    holders = np.empty((experts, ranks), np.int64)
    count = np.zeros(experts, np.int64)
    for lay in range(layers):
        for s in range(slots):  # rank-major: one rank's copies of an expert are adjacent
            e = old[lay, s]
            r = s // spr
            if e < experts and (count[e] == 0 or holders[e, count[e] - 1] != r):
                holders[e, count[e]] = r
                count[e] += 1
        for s in range(slots):
            e = new[lay, s]
            if e < experts:
                for h in range(count[e]):
                    keep[lay, s // spr, holders[e, h]] += 1
        count[:] = 0
    return keep


def moved_experts(old: Placement, new: Placement, experts: int) -> np.ndarray:
    """(L, R) experts each rank must receive to go from ``old`` to ``new``."""
    if COMPILED:
        return moved_experts_compiled(old.phy2log, new.phy2log, new.ranks, experts)
    gained = new.rank_counts(experts) - old.rank_counts(experts)
    return np.maximum(gained[:, :, :experts], 0).sum(axis=2)


@njit
def moved_experts_compiled(
    old: np.ndarray, new: np.ndarray, ranks: int, experts: int
) -> np.ndarray:
    """:func:`moved_experts` over the slot tables, rank by rank: the replicas of each expert a
    rank's new slots hold beyond its old ones."""
    layers, slots = new.shape
    spr = slots // ranks
    moved = np.zeros((layers, ranks), np.int64)
    gained = np.zeros(experts + 1, np.int64)  # the last: empty slots, never counted
    for lay in range(layers):
        for r in range(ranks):
            lo, hi = r * spr, (r + 1) * spr
            for s in range(lo, hi):
                gained[new[lay, s]] += 1
                gained[old[lay, s]] -= 1
            m = 0
            for s in range(lo, hi):
                e = new[lay, s]
                if e < experts and gained[e] > 0:
                    m += gained[e]
                    gained[e] = 0  # each expert once
            moved[lay, r] = m
            for s in range(lo, hi):
                gained[new[lay, s]] = 0
                gained[old[lay, s]] = 0
    return moved


class ExpertPlacement(Protocol):
    window_steps: int  # steps of expert-load statistics the group keeps for it (0: none)

    def initial(self, static: Placement, expected: Callable[[], np.ndarray]) -> Placement:
        """The placement a group starts from, given the static blocks and (called only if
        needed) the expected (L, E) expert loads."""
        ...

    def phase(self, rng: np.random.Generator) -> int:
        """Steps already counted toward the first re-placement (groups join mid-schedule, so
        they do not re-place in step)."""
        ...

    def due(self, since: int) -> bool:
        """Whether a group ``since`` steps past its last re-placement re-places now (it does
        only with a non-empty window)."""
        ...

    def place(self, old: Placement, loads: np.ndarray) -> Placement:
        """The placement that replaces ``old`` given the window's (L, E) expert loads."""
        ...


class StaticPlacement:
    """The static blocks forever: no window, never due, nothing moves."""

    __slots__ = ("window_steps",)

    def __init__(self, cfg: EplbPool | None = None, shape: GroupShape | None = None) -> None:
        self.window_steps = 0

    def initial(self, static: Placement, expected: Callable[[], np.ndarray]) -> Placement:
        return static

    def phase(self, rng: np.random.Generator) -> int:
        return 0  # draws nothing

    def due(self, since: int) -> bool:
        return False

    def place(self, old: Placement, loads: np.ndarray) -> Placement:
        return old


class Rebalancing:
    """EPLB every ``period_steps`` on the last ``window_steps`` steps of expert loads."""

    __slots__ = (
        "groups",
        "minimize_moves",
        "nodes",
        "period_steps",
        "ranks",
        "redundant",
        "warm_start",
        "window_steps",
    )

    def __init__(self, cfg: EplbPool, shape: GroupShape) -> None:
        self.window_steps = cfg.window_steps
        self.period_steps = cfg.period_steps
        self.warm_start = cfg.warm_start
        self.minimize_moves = cfg.minimize_moves
        self.ranks = shape.ranks
        self.redundant = shape.redundant_per_rank
        self.groups = shape.groups
        self.nodes = shape.nodes

    def _eplb(self, weight: np.ndarray) -> Placement:
        return rebalance(weight, self.ranks, self.redundant, self.groups, self.nodes)

    def initial(self, static: Placement, expected: Callable[[], np.ndarray]) -> Placement:
        return self._eplb(expected()) if self.warm_start else static

    def phase(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.period_steps))

    def due(self, since: int) -> bool:
        return since >= self.period_steps

    def place(self, old: Placement, loads: np.ndarray) -> Placement:
        new = self._eplb(loads)
        if self.minimize_moves:
            new = match_ranks(old, new, loads.shape[1], self.nodes)
        return new


EXPERT_PLACEMENT: dict[str, type[StaticPlacement | Rebalancing]] = {
    "static": StaticPlacement,
    "eplb": Rebalancing,
}


def make_expert_placement(cfg: EplbPool, shape: GroupShape) -> ExpertPlacement:
    """The placement policy named by ``cfg.policy`` for a group of this shape."""
    if cfg.policy not in EXPERT_PLACEMENT:
        known = ", ".join(EXPERT_PLACEMENT)
        raise ConfigError(
            "policies.eplb.policy", f"unknown EPLB policy {cfg.policy!r} (one of {known})"
        )
    return EXPERT_PLACEMENT[cfg.policy](cfg, shape)
