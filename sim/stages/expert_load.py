"""Expert-load model: how the routed tokens of a step spread over the experts of each MoE layer.

One model serves every pool (the same weights see the same traffic). Popularity of expert e in
MoE layer l for traffic class c:

    p[c, l, e] ∝ base[l, e] · exp(class_sigma · G[c, l, e]) · exp(X[l, e])

- ``base``: skewed per layer — Zipf (p ∝ rank^-skew over a random expert order) or Dirichlet
  (concentration ``skew``; smaller is more skewed).
- ``G``: a fixed standard-normal tilt per class, so the class mix of a step moves its load.
- ``X``: a log-popularity walk shared by every class, mean-reverting (Ornstein-Uhlenbeck with
  σ = ``drift_sigma`` per √s and reversion time ``drift_reversion_s``), started in its stationary
  distribution and moved on a fixed ``drift_update_s`` grid, so the path depends on simulated time
  only (not on who asks), and two scenarios with the same seed see the same drift.

Hash-routed layers (the leading ``hash_routed_layers`` MoE layers) route by token id: uniform,
no drift and no per-request bias.

Within a step, a request's tokens route by their own distribution π ~ Dirichlet(κ·p[c]) (the
tokens of one prompt share a topic; κ = ``request_concentration``), each token choosing top-k
experts. ``rank_moments`` turns that into the mean and variance of every rank's load under a
placement, which is all the per-step sampler needs (sim/stages/expert_parallel.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import fpmath
from ...jit import COMPILED, exp, njit, pairwise_sum, sum_block
from ...models.spec import ModelSpec
from ...rng import log_dirichlet, normal, stream
from ...scenario import ExpertLoad


class ExpertLoadModel:
    def __init__(
        self, cfg: ExpertLoad, model: ModelSpec, class_names: Sequence[str], seed: int
    ) -> None:
        moe = model.moe
        self.cfg = cfg
        self.layers = model.moe_layer_count("decode")
        # the first placement of each group shape and policy, by popularity version
        # (GroupExperts: a placement is never changed in place, so groups can share one)
        self.initial_placements: dict[tuple[Any, int], Any] = {}
        self.experts = moe.routed_experts
        self.top_k = moe.top_k
        self.hashed = np.zeros(self.layers, dtype=bool)
        self.hashed[: min(moe.hash_routed_layers, self.layers)] = True
        # a request's routing bias: Var[share] = (Σ s²p − (Σ s p)²)·het (0 for hash routing)
        self.het = np.where(self.hashed, 0.0, 1.0 / (cfg.request_concentration + 1.0))
        log_base = fpmath.log(self._base(stream(seed, "experts/base")))
        tilts = []
        for name in class_names:
            g = normal(stream(seed, f"experts/class/{name}"), log_base.shape)
            tilts.append(log_base + cfg.class_sigma * g)
        self.log_class = np.stack(tilts)  # (C, L, E)
        self.log_class[:, self.hashed, :] = 0.0
        self._drift_rng = stream(seed, "experts/drift")
        self._stationary_sd = cfg.drift_sigma * np.sqrt(cfg.drift_reversion_s / 2.0)
        self.x = self._stationary_sd * normal(self._drift_rng, log_base.shape)
        self.x[self.hashed] = 0.0
        decay = fpmath.exp(-cfg.drift_update_s / cfg.drift_reversion_s)
        self._decay = decay
        self._innovation_sd = self._stationary_sd * np.sqrt(1.0 - decay * decay)
        self.t_grid = 0.0  # simulated time the popularity below belongs to
        self.version = 0  # bumped whenever ``pop`` changes
        self.pop = self._popularity()

    @property
    def classes(self) -> int:
        return self.log_class.shape[0]

    def _base(self, rng: np.random.Generator) -> np.ndarray:
        layers, experts = self.layers, self.experts
        cfg = self.cfg
        if cfg.family == "zipf":
            ranks = fpmath.power(np.arange(1, experts + 1, dtype=np.float64), -cfg.skew)
            base = np.stack([rng.permutation(ranks) for _ in range(layers)])
        else:
            base = fpmath.exp(log_dirichlet(rng, np.full(experts, cfg.skew), layers))
            base = np.maximum(base, 1e-12)  # tiny alphas give components below any float
        base[self.hashed] = 1.0
        return base / base.sum(axis=1, keepdims=True)

    def _popularity(self) -> np.ndarray:
        """p[c, l, e] under the current drift state, a fresh array (never changed afterwards: a
        group's statistics window keeps the ``pop`` of each of its steps)."""
        if COMPILED:
            return popularity_compiled(self.log_class, self.x, sum_block())
        return popularity(self.log_class, self.x)

    def advance(self, now: float) -> None:
        """Move the drift to the last grid point at or before ``now``."""
        step = self.cfg.drift_update_s
        moved = False
        while self.t_grid + step <= now:
            self.t_grid += step
            if self._innovation_sd > 0:
                z = normal(self._drift_rng, self.x.shape)
                self.x = self._decay * self.x + self._innovation_sd * z
                self.x[self.hashed] = 0.0
                moved = True
        if moved:
            self.pop = self._popularity()
            self.version += 1

    def mean_popularity(self) -> np.ndarray:
        """p[l, e] averaged over the classes (what a placement made without traffic sees)."""
        return self.pop.mean(axis=0)


def popularity(log_class: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Each class's softmax over the experts of each layer of ``log_class`` (C, L, E) + ``x``
    (L, E): :meth:`ExpertLoadModel._popularity` in numpy, the reference of
    :func:`popularity_compiled`."""
    logits = log_class + x
    logits -= logits.max(axis=2, keepdims=True)
    p = fpmath.exp(logits)
    p /= p.sum(axis=2, keepdims=True)
    return p


@njit
def popularity_compiled(log_class: np.ndarray, x: np.ndarray, block: int) -> np.ndarray:
    """:func:`popularity`, compiled: per (class, layer) row the same operations in the same
    order (``block``: how numpy sums, :func:`~deepinfer_sim.jit.sum_block`)."""
    classes, layers, experts = log_class.shape
    p = np.empty((classes, layers, experts))
    for c in range(classes):
        for lay in range(layers):
            row = p[c, lay]
            for e in range(experts):
                row[e] = log_class[c, lay, e] + x[lay, e]
            top = row[0]
            for e in range(1, experts):
                if row[e] > top:
                    top = row[e]
            for e in range(experts):
                row[e] = exp(row[e] - top)
            total = pairwise_sum(row, block)
            for e in range(experts):
                row[e] = row[e] / total
    return p


class SlotWeights:
    """A placement in the form the per-step moments need: for every physical slot (flattened
    over layers) the index of its expert in a flattened (L, E) popularity, and 1/rep, 1/rep²
    (zero for an empty slot)."""

    __slots__ = ("flat", "ranks", "w1", "w2")

    def __init__(self, phy2log: np.ndarray, replicas: np.ndarray, ranks: int) -> None:
        layers, experts = replicas.shape
        empty = phy2log >= experts
        expert = np.where(empty, 0, phy2log)
        rows = np.arange(layers)[:, None]
        rep = replicas[rows, expert].astype(np.float64)
        self.flat = (rows * experts + expert).ravel()
        self.w1 = np.where(empty, 0.0, 1.0 / rep)  # (L, S)
        self.w2 = self.w1 * self.w1
        self.ranks = ranks


def rank_moments(
    pop: np.ndarray, phy2log: np.ndarray, replicas: np.ndarray, ranks: int, het: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per class, layer and rank, for one routed token-choice and one request under a placement:

    - ``share`` q = Σ_slots p/rep — expected fraction of the layer's token-choices on the rank;
    - ``q2`` = Σ_slots p/rep² — its Poisson variance per token-choice (tokens for a replicated
      expert split evenly over its replicas);
    - ``bias`` = (q2 − q²)·het — variance of a request's fraction from its routing bias.

    ``pop`` (C, L, E); ``phy2log`` (L, S) logical expert per physical slot (E = an empty slot),
    slots rank-major; ``replicas`` (L, E).
    """
    return slot_moments(pop, SlotWeights(phy2log, replicas, ranks), het)


def slot_moments(
    pop: np.ndarray, slots: SlotWeights, het: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`rank_moments` for a placement already in :class:`SlotWeights` form (compiled,
    :func:`slot_moments_compiled`, where the run takes the compiled steps)."""
    if COMPILED:
        c, layers, _ = pop.shape
        share, q2, bias = (np.empty((c, layers, slots.ranks)) for _ in range(3))
        slot_moments_compiled(
            pop, slots.flat, slots.w1, slots.w2, het, share, q2, bias, sum_block()
        )
        return share, q2, bias
    return slot_moments_reference(pop, slots, het)


def slot_moments_reference(
    pop: np.ndarray, slots: SlotWeights, het: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`slot_moments` in numpy: the reference of :func:`slot_moments_compiled`."""
    c, layers, _ = pop.shape
    per_slot = np.take(pop.reshape(c, -1), slots.flat, axis=1).reshape(c, layers, -1)  # (C, L, S)
    shape = (c, layers, slots.ranks, -1)
    share = (per_slot * slots.w1).reshape(shape).sum(axis=-1)
    q2 = (per_slot * slots.w2).reshape(shape).sum(axis=-1)
    bias = np.maximum(q2 - share * share, 0.0) * het[None, :, None]
    return share, q2, bias


@njit
def slot_moments_compiled(
    pop: np.ndarray,
    flat: np.ndarray,
    w1: np.ndarray,
    w2: np.ndarray,
    het: np.ndarray,
    share: np.ndarray,
    q2: np.ndarray,
    bias: np.ndarray,
    block: int,
) -> None:
    """:func:`slot_moments_reference`, compiled, into ``share``, ``q2`` and ``bias`` (C, L, R):
    each rank's slots summed in numpy's order (``block``: :func:`~deepinfer_sim.jit.sum_block`),
    without the (C, L, S) temporaries."""
    classes, layers, experts = pop.shape
    ranks = share.shape[2]
    slots = w1.shape[1]
    per = slots // ranks
    pop_flat = pop.reshape(classes, layers * experts)
    terms1 = np.empty(per)
    terms2 = np.empty(per)
    for c in range(classes):
        row = pop_flat[c]
        for lay in range(layers):
            at = flat[lay * slots : (lay + 1) * slots]
            for r in range(ranks):
                if per < 8:  # numpy sums under 8 terms in turn: as the products are made
                    a = 0.0
                    b = 0.0
                    for s in range(r * per, (r + 1) * per):
                        p = row[at[s]]
                        a += p * w1[lay, s]
                        b += p * w2[lay, s]
                else:
                    for j in range(per):
                        s = r * per + j
                        p = row[at[s]]
                        terms1[j] = p * w1[lay, s]
                        terms2[j] = p * w2[lay, s]
                    a = pairwise_sum(terms1, block)
                    b = pairwise_sum(terms2, block)
                share[c, lay, r] = a
                q2[c, lay, r] = b
                d = b - a * a
                bias[c, lay, r] = (d if d >= 0.0 or d != d else 0.0) * het[lay]
