"""One EP group's experts at run time: its placement, EPLB statistics and each step's imbalance.

Every step the group reports the routed tokens it runs per traffic class and per layer set (a
prefill step runs its chunks through the prefill layers and its SWA replay through the
replay-only layers; a decode step runs every layer), together with Σ t² over its requests.
``step`` then

1. re-places its experts when its placement policy (``sim/policies/eplb.py``: ``static`` never,
   ``eplb`` every period) is due: the policy gets the window's expert loads, sampled in aggregate
   (each expert's count ~ Normal with the Poisson-plus-request-bias variance of its mean); the
   weights that move are a stall charged to this step;
2. samples every (layer, rank) load of this step from the same moments under the current
   placement (numpy, (L, R) normals — never per token) and returns the step-level factor
   Σ_layers max_r / Σ_layers mean_r that the step cost multiplies into its MoE time.

The popularity the group sees moves with the shared :class:`ExpertLoadModel`; shares under the
placement are recomputed only when either changes.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ...jit import COMPILED, njit, pairwise_sum, sum_block
from ...models.hardware import HardwareSpec
from ...models.spec import ModelSpec
from ...rng import bit_source, normal, normal_fill
from ...scenario import EplbPool
from ..policies.eplb import Placement, make_expert_placement, moved_experts, static_placement
from .expert_load import ExpertLoadModel, SlotWeights, slot_moments

Pool = Literal["prefill", "decode"]


@dataclass(frozen=True)
class GroupShape:
    ranks: int
    redundant_per_rank: int
    layer_set: np.ndarray  # (L,) which of the step's token counts each MoE layer runs
    expert_bytes: float
    move_bytes_per_s: float  # per rank, into the rank
    groups: int = 1  # expert groups of the model (hierarchical EPLB)
    nodes: int = 1  # nodes the EP group spans


def pool_layer_sets(model: ModelSpec, pool: Pool) -> np.ndarray:
    """(L,) layer set of each MoE layer: prefill chunks run set 0, SWA replay the replay-only
    layers (set 1); decode runs every layer as set 0."""
    layers = np.arange(model.moe_layer_count("decode"))
    if pool == "prefill":
        return (layers >= model.moe_layer_count("prefill")).astype(np.int64)
    return np.zeros(layers.size, dtype=np.int64)


def group_shape(
    model: ModelSpec, hw: HardwareSpec, pool: Pool, ep: int, redundant: int
) -> GroupShape:
    """The EP group geometry of a pool at this width on its hardware (weights move over its
    scale-up link inside one domain, else over the scale-out link)."""
    within = ep <= hw.scaleup.domain_gpus
    return GroupShape(
        ranks=ep,
        redundant_per_rank=redundant,
        layer_set=pool_layer_sets(model, pool),
        expert_bytes=model.expert_bytes,
        move_bytes_per_s=hw.scaleup.bytes_per_s_per_dir if within else hw.scaleout.bytes_per_s,
        groups=model.moe.expert_groups,
        nodes=-(-ep // hw.scaleup.domain_gpus),
    )


class GroupExperts:
    def __init__(
        self,
        load: ExpertLoadModel,
        policy: EplbPool,
        shape: GroupShape,
        rng: np.random.Generator,
    ) -> None:
        self.load = load
        self.policy = policy
        self.shape = shape
        self.rng = rng
        self.placer = make_expert_placement(policy, shape)
        layers, experts = load.layers, load.experts
        # groups of one shape under one policy start alike (16 prefill instances: one EPLB run)
        key = (policy, shape.ranks, shape.redundant_per_rank, shape.groups, shape.nodes)
        start = load.initial_placements.get((key, load.version))
        if start is None:
            static = static_placement(layers, experts, shape.ranks, shape.redundant_per_rank)
            start = self.placer.initial(static, load.mean_popularity)
            load.initial_placements[(key, load.version)] = start
        self.placement = start
        # the statistics window (maxlen 0 for a policy that keeps none: appends are no-ops)
        self.window: deque[tuple[np.ndarray, np.ndarray, np.ndarray]] = deque(
            maxlen=self.placer.window_steps
        )
        self.since = self.placer.phase(rng)  # steps since the last re-placement
        self._version = -1
        self.rebalances = 0
        self.moved_bytes = 0.0
        self.moved_experts = 0
        self.stall_total_s = 0.0
        self.factor_sum = 0.0
        self.factor_steps = 0
        self.factors = array("d")  # every step's factor, for the summary's percentiles
        self.trace: list[tuple[float, np.ndarray, np.ndarray]] | None = None  # set to record
        self._slots = self._slot_weights()
        self._moments: tuple[np.ndarray, np.ndarray, np.ndarray] = slot_moments(
            load.pop, self._slots, load.het
        )
        self._z = np.empty(self._moments[0].shape[1:])  # a step's (L, R) normals, reused

    def place(self, placement: Placement) -> None:
        """Adopt a placement (the moments are recomputed at the next step)."""
        self.placement = placement
        self._slots = self._slot_weights()
        self._version = -1

    def _slot_weights(self) -> SlotWeights:
        p = self.placement
        return SlotWeights(p.phy2log, p.replicas, p.ranks)

    def _refresh(self) -> None:
        load = self.load
        if self._version != load.version:
            self._moments = slot_moments(load.pop, self._slots, load.het)
            self._version = load.version

    def step(self, now: float, tokens: np.ndarray, sq_tokens: np.ndarray) -> tuple[float, float]:
        """(imbalance factor, stall seconds) of a step running ``tokens`` (C, sets) routed
        tokens per class and layer set, whose requests' tokens square-sum to ``sq_tokens``."""
        self.load.advance(now)
        stall = 0.0
        self.since += 1
        if self.window and self.placer.due(self.since):
            stall = self._rebalance()
        self.window.append((self.load.pop, tokens, sq_tokens))
        factor = self._sample(tokens, sq_tokens)
        self.factor_sum += factor
        self.factor_steps += 1
        self.factors.append(factor)
        if self.trace is not None:
            self.trace.append((now, tokens, sq_tokens))
        return factor, stall

    def _sample(self, tokens: np.ndarray, sq_tokens: np.ndarray) -> float:
        self._refresh()
        share, q2, bias = self._moments
        args = (share, q2, bias, tokens, sq_tokens, self.shape.layer_set, self.load.top_k)
        if COMPILED:  # _z: filled in the call from this group's stream
            return float(imbalance_factor_drawn(bit_source(self.rng), self._z, sum_block(), *args))
        return imbalance_factor(*args, normal(self.rng, share.shape[1:]))

    def window_loads(self) -> np.ndarray:
        """(L, E) expert loads over the statistics window, sampled in aggregate."""
        load = self.load
        sets = self.shape.layer_set
        k = load.top_k
        mean = np.zeros((load.layers, load.experts))
        bias_var = np.zeros_like(mean)
        # steps under the same popularity are summed before touching (C, L, E) arrays
        runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for pop, tok, sq in self.window:
            if runs and runs[-1][0] is pop:
                runs[-1] = (pop, runs[-1][1] + tok, runs[-1][2] + sq)
            else:
                runs.append((pop, tok, sq))
        add = add_window_run_compiled if COMPILED else add_window_run
        for pop, tok, sq in runs:
            add(mean, bias_var, pop, tok[:, sets] * k, sq[:, sets] * (k * k))
        var = mean + bias_var * load.het[:, None]
        return np.maximum(mean + np.sqrt(var) * normal(self.rng, mean.shape), 0.0)

    def _rebalance(self) -> float:
        s = self.shape
        old = self.placement
        new = self.placer.place(old, self.window_loads())
        experts = self.load.experts
        moved = moved_experts(old, new, experts)  # (L, R)
        self.place(new)
        self.since = 0
        self.rebalances += 1
        n_moved = int(moved.sum())
        self.moved_experts += n_moved
        self.moved_bytes += n_moved * s.expert_bytes
        stall = float(moved.sum(axis=0).max()) * s.expert_bytes / s.move_bytes_per_s
        self.stall_total_s += stall
        return stall

    @property
    def imbalance_mean(self) -> float:
        return self.factor_sum / self.factor_steps if self.factor_steps else float("nan")

    def report(self) -> dict[str, str | int | float | array[float]]:
        """The group's EPLB part of the summary: its policy, its redundant slots per rank, every
        step's imbalance factor (``factors``, the array itself: no copy, so the time series can
        ask every sample) with their sum and count, and the rebalances with the experts and bytes
        they moved and the stall they cost."""
        return {
            "policy": self.policy.policy,
            "window_steps": self.policy.window_steps,
            "period_steps": self.policy.period_steps,
            "redundant_experts_per_gpu": self.shape.redundant_per_rank,
            "factors": self.factors,
            "factor_sum": self.factor_sum,
            "factor_steps": self.factor_steps,
            "rebalances": self.rebalances,
            "moved_bytes": self.moved_bytes,
            "moved_experts": self.moved_experts,
            "stall_s": self.stall_total_s,
        }


def add_window_run(
    mean: np.ndarray, bias_var: np.ndarray, pop: np.ndarray, t: np.ndarray, h: np.ndarray
) -> None:
    """Add to the (L, E) ``mean`` and ``bias_var`` of a window's expert loads the steps that ran
    under popularity ``pop`` (C, L, E): their routed token-choices ``t`` and squared request
    tokens ``h`` per class and layer (C, L). The numpy reference of
    :func:`add_window_run_compiled`."""
    mean += (t[:, :, None] * pop).sum(axis=0)
    bias_var += (h[:, :, None] * (pop * (1.0 - pop))).sum(axis=0)


@njit
def add_window_run_compiled(
    mean: np.ndarray, bias_var: np.ndarray, pop: np.ndarray, t: np.ndarray, h: np.ndarray
) -> None:
    """:func:`add_window_run`, compiled: the classes added in turn, as numpy sums axis 0."""
    classes, layers, experts = pop.shape
    for lay in range(layers):
        for e in range(experts):
            p = pop[0, lay, e]
            m = t[0, lay] * p
            b = h[0, lay] * (p * (1.0 - p))
            for c in range(1, classes):
                p = pop[c, lay, e]
                m += t[c, lay] * p
                b += h[c, lay] * (p * (1.0 - p))
            mean[lay, e] += m
            bias_var[lay, e] += b


def imbalance_factor(
    share: np.ndarray,
    q2: np.ndarray,
    bias: np.ndarray,
    tokens: np.ndarray,
    sq_tokens: np.ndarray,
    sets: np.ndarray,
    k: int,
    z: np.ndarray,
) -> float:
    """Σ_layers max_r / Σ_layers mean_r of one step's (L, R) expert loads: each load is its
    mean plus sqrt(variance) × ``z`` (standard normals, (L, R)), floored at 0. The moments per
    traffic class (``share``, ``q2``, ``bias``: (C, L, R)) are scaled by the class's routed
    token-choices (``tokens`` × top-``k``) and its requests' squared tokens (``sq_tokens``),
    both (C, layer sets), taken at each layer's set ``sets``. The numpy reference of
    :func:`imbalance_factor_compiled`."""
    if share.shape[0] == 1:  # one traffic class: skip the sums over classes
        t1 = (tokens[0, sets] * k)[:, None]  # (L, 1) token-choices per layer
        mean = share[0] * t1
        var = q2[0] * t1
        var += bias[0] * (sq_tokens[0, sets] * (k * k))[:, None]
    else:
        t = (tokens[:, sets] * k)[:, :, None]  # (C, L, 1)
        h = (sq_tokens[:, sets] * (k * k))[:, :, None]
        mean = (t * share).sum(axis=0)
        var = (t * q2 + h * bias).sum(axis=0)
    loads = np.sqrt(var, out=var)  # the (L, R) loads, built in place
    loads *= z
    loads += mean
    np.maximum(loads, 0.0, out=loads)
    total = loads.sum()
    if total <= 0:
        return 1.0
    return float(loads.max(axis=1).sum() * share.shape[2] / total)


@njit
def imbalance_factor_drawn(source: np.ndarray, z: np.ndarray, block: int, *moments: Any) -> float:
    """:func:`imbalance_factor_compiled` of the step's ``moments`` (its arguments before ``z``)
    and ``z`` (L, R) filled first with standard normals from the group's stream (``source``:
    :func:`~deepinfer_sim.rng.bit_source`), as :func:`~deepinfer_sim.rng.normal` draws them:
    one call a step."""
    normal_fill(source, z.reshape(z.size))
    return imbalance_factor_compiled(*moments, z, block)  # type: ignore[call-arg]


@njit
def imbalance_factor_compiled(
    share: np.ndarray,
    q2: np.ndarray,
    bias: np.ndarray,
    tokens: np.ndarray,
    sq_tokens: np.ndarray,
    sets: np.ndarray,
    k: int,
    z: np.ndarray,
    block: int,
) -> float:
    """:func:`imbalance_factor`, compiled: the same operations in the same order (``block``:
    how numpy sums, :func:`~deepinfer_sim.jit.sum_block`)."""
    classes, layers, ranks = share.shape
    kk = k * k
    loads = np.empty((layers, ranks))
    for lay in range(layers):
        s = sets[lay]
        for r in range(ranks):
            t = tokens[0, s] * k
            mean = share[0, lay, r] * t
            var = q2[0, lay, r] * t
            var += bias[0, lay, r] * (sq_tokens[0, s] * kk)
            for c in range(1, classes):  # the classes in turn, as numpy sums axis 0
                tc = tokens[c, s] * k
                mean += tc * share[c, lay, r]
                var += tc * q2[c, lay, r] + (sq_tokens[c, s] * kk) * bias[c, lay, r]
            x = math.sqrt(var) * z[lay, r] + mean
            loads[lay, r] = x if x > 0.0 else 0.0
    total = pairwise_sum(loads, block)
    if total <= 0:
        return 1.0
    peak = np.empty(layers)
    for lay in range(layers):
        m = loads[lay, 0]
        for r in range(1, ranks):
            if loads[lay, r] > m:
                m = loads[lay, r]
        peak[lay] = m
    return pairwise_sum(peak, block) * ranks / total
