"""Speculative decoding in a decode group: draft acceptance and the verify-length policies.

Every step a draft proposes up to ``max_draft`` tokens per sequence; the target model verifies a
prefix of v of them (plus its own next token), so a sequence emits accepted + 1 tokens and the
step computes 1 + v tokens for it. A :class:`VerifyPolicy` chooses v; ``VERIFY_POLICIES`` maps
the config's ``policies.speculative.policy`` tag to one:

- ``none`` (:class:`NoSpeculation`): v = 0, plain decoding;
- ``mtp1`` (:class:`Mtp1`): v = 1 (the MTP-1 baseline verifies 2 tokens);
- ``fixed`` (:class:`FixedK`): v = k for every sequence (k capped at the draft limit);
- ``dspark`` (:class:`DSpark`): a confidence head predicts each draft token's acceptance; the
  survival probability of draft j is the product of the predicted confidences up to j; all
  candidates of the group are ranked by it and the prefix that maximizes expected tokens per
  second — expected accepted tokens over the step time at the resulting verify batch, the step
  time taken from the decode cost model — is verified. The cut-off is re-optimized every
  ``retune_steps`` steps (it moves slowly with the batch) and applied to every step's survival
  probabilities. With ``lag_steps: 2`` (the production variant) the truncation uses the
  confidences of two steps earlier. Its confidence head and scheduling cost ``overhead_s`` per
  step.

Acceptance model (per traffic class), shared by every policy in :class:`DraftChain`: each
request draws an "easiness" α ~ Beta(mean·κ, (1 − mean)·κ) at admission; draft j of a step is
accepted with probability q_j = α·decay^(j−1), given the drafts before it were. The confidence
head reports logistic(logit(q_j) + N(0, σ)). Everything is sampled vectorized over the group's
sequences, from the group's own seeded stream (the chain and the policy draw from the same one).

:class:`SpecDecoder` is what a decode group holds: the chain and the policy together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ... import fpmath
from ...errors import ConfigError
from ...jit import COMPILED, exp, log, next_double, njit
from ...models.draft import DraftCost
from ...models.spec import ModelSpec
from ...rng import beta, bit_source, normal, normal_fill
from ...scenario import Speculative

HIST_BINS = 256

StepTime = Callable[[float], float]
"""``step_time(extra)``: the group's step time with ``extra`` verify tokens added uniformly."""


@dataclass(frozen=True)
class ClassAcceptance:
    mean: float
    concentration: float
    position_decay: float


class DraftChain:
    """Per-slot acceptance state of a group's sequences (vectorized over slots), ``depth``
    draft positions deep."""

    def __init__(
        self,
        *,
        classes: Sequence[ClassAcceptance],
        depth: int,
        capacity: int,
        rng: np.random.Generator,
    ) -> None:
        self.classes = classes
        self.rng = rng
        self.decay = np.array(
            [[fpmath.ipow(c.position_decay, j) for j in range(depth)] for c in classes]
        )
        self.alpha = np.zeros(capacity)
        self.cls = np.zeros(capacity, dtype=np.int64)
        # per slot, fixed for the request's life (position-major: rows are draft positions, so
        # the per-step products run over contiguous rows): the true survival probability of
        # each draft position and the logit of its acceptance
        self.survival = np.zeros((depth, capacity))
        self.logit = np.zeros((depth, capacity))

    def admit(self, slot: int, traffic_class: int) -> None:
        c = self.classes[traffic_class]
        a = c.mean * c.concentration
        b = (1.0 - c.mean) * c.concentration
        alpha = beta(self.rng, a, b)
        self.alpha[slot] = alpha
        self.cls[slot] = traffic_class
        args = (alpha, self.decay[traffic_class], self.survival[:, slot], self.logit[:, slot])
        (chain_slot_compiled if COMPILED else chain_slot)(*args)

    def accept(self, live: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Tokens each slot emits when it verifies ``v`` drafts: its leading accepted ones, plus
        one (0 for holes)."""
        # The drafts form a chain: P(at least j accepted) = survival of position j, so one
        # uniform per sequence decides how far it gets (exact, and one draw instead of k).
        hw = v.size
        u = self.rng.random(hw)
        reached = (self.survival[:, :hw] > u[None, :]).sum(axis=0)
        return np.where(live, np.minimum(reached, v) + 1, 0)


class VerifyPolicy(Protocol):
    """How many drafts each sequence verifies per step."""

    depth: int  # the most drafts it verifies per sequence-step (the chain keeps that many)
    speculates: bool  # False: plain decoding, one token per sequence-step
    overhead_s: float  # added to every step

    def admit(self, slot: int) -> None:
        """A new sequence took ``slot``."""

    def choose(self, v: np.ndarray, live: np.ndarray, chain: DraftChain, step: StepTime) -> None:
        """Fill ``v`` (zeros on entry, one entry per slot) with the verify lengths of the live
        slots."""


class NoSpeculation:
    """Plain decoding: nothing is verified (the reference implementation)."""

    depth = 0
    speculates = False
    overhead_s = 0.0

    def admit(self, slot: int) -> None:
        pass

    def choose(self, v: np.ndarray, live: np.ndarray, chain: DraftChain, step: StepTime) -> None:
        pass


class FixedK:
    """Every live sequence verifies ``k`` drafts."""

    speculates = True
    overhead_s = 0.0

    def __init__(self, *, k: int) -> None:
        self.depth = k

    def admit(self, slot: int) -> None:
        pass

    def choose(self, v: np.ndarray, live: np.ndarray, chain: DraftChain, step: StepTime) -> None:
        v[live] = self.depth


class Mtp1(FixedK):
    """The MTP-1 baseline: one draft verified, 2 tokens computed per sequence-step."""

    def __init__(self) -> None:
        super().__init__(k=1)


class DSpark:
    """Verifies the confidence-ranked prefix of the group's drafts that maximizes expected
    tokens per second, truncating with confidences ``lag_steps`` steps old."""

    speculates = True

    def __init__(
        self,
        *,
        depth: int,
        lag_steps: int,
        noise_sigma: float,
        overhead_s: float,
        retune_steps: int,
        capacity: int,
        rng: np.random.Generator,
    ) -> None:
        self.depth = depth
        self.lag = lag_steps
        self.sigma = noise_sigma
        self.overhead_s = overhead_s
        self.rng = rng
        # confidences of the last ``lag`` steps, per slot (ring), for the production variant
        self.hist = np.zeros((max(1, lag_steps), depth, capacity))
        self.hist_valid = np.zeros((max(1, lag_steps), capacity), dtype=bool)
        self.step = 0
        self.retune_steps = max(1, retune_steps)
        self.threshold: float | None = None  # survival cut-off, re-optimized every retune_steps

    def admit(self, slot: int) -> None:
        self.hist_valid[:, slot] = False

    def choose(self, v: np.ndarray, live: np.ndarray, chain: DraftChain, step: StepTime) -> None:
        hw = v.size
        slot = self.step % self.lag if self.lag else 0
        args = (self.sigma, chain.logit[:, :hw], self.lag > 0)
        hist = (self.hist[slot, :, :hw], self.hist_valid[slot, :hw], live)
        if COMPILED:  # the noise drawn in the call, from this policy's stream
            noise = np.empty((self.depth, hw))
            survival = survival_drawn(bit_source(self.rng), noise, *args, *hist)
        else:
            survival = survival_of(normal(self.rng, (self.depth, hw)), *args, *hist)
        self.step += 1
        if self.threshold is None or self.step % self.retune_steps == 1 or self.retune_steps == 1:
            self.threshold = self._best_threshold(survival, int(live.sum()), step)
        if COMPILED:
            count_at_least_compiled(survival, self.threshold, v)
        else:
            v[:] = (survival >= self.threshold).sum(axis=0)

    def _best_threshold(self, survival: np.ndarray, n_live: int, step_time: StepTime) -> float:
        """Threshold on survival that maximizes (B + Σ selected survival) / T(B + K)."""
        if n_live == 0:
            return 2.0
        t0 = step_time(0.0)
        slope = (step_time(float(self.depth * n_live)) - t0) / (self.depth * n_live)
        pick = best_threshold_compiled if COMPILED else best_threshold
        return float(pick(survival, n_live, t0, slope))


def best_threshold(survival: np.ndarray, n_live: int, t0: float, slope: float) -> float:
    """The survival threshold of :meth:`DSpark._best_threshold` from the drafts' survivals in
    ``HIST_BINS`` bins: selecting a bin and every bin above it verifies their drafts (K of them,
    their survivals summing to M) at a step time of t0 + slope·K; the threshold is the best
    bin's lower edge (2.0: select none). The numpy reference of :func:`best_threshold_compiled`."""
    flat = survival.ravel()
    b = np.minimum((flat * HIST_BINS).astype(np.int64), HIST_BINS - 1)
    count = np.bincount(b, minlength=HIST_BINS)[::-1].cumsum()  # from the top bin down
    mass = np.bincount(b, weights=flat, minlength=HIST_BINS)[::-1].cumsum()
    k_sel = np.concatenate([[0], count[:-1]])  # never select the bottom (zero) bin
    m_sel = np.concatenate([[0.0], mass[:-1]])
    rate = (n_live + m_sel) / (t0 + slope * k_sel)
    best = int(np.argmax(rate))
    return 2.0 if best == 0 else (HIST_BINS - best) / HIST_BINS


@njit
def best_threshold_compiled(survival: np.ndarray, n_live: int, t0: float, slope: float) -> float:
    """:func:`best_threshold`, compiled: the same bins, sums in the same order (bincount adds
    in index order, cumsum from the top bin down) and the first best rate."""
    count = np.zeros(HIST_BINS, np.int64)
    mass = np.zeros(HIST_BINS)
    depth, hw = survival.shape
    for j in range(depth):  # ravel order
        for i in range(hw):
            x = survival[j, i]
            b = min(int(x * HIST_BINS), HIST_BINS - 1)
            count[b] += 1
            mass[b] += x
    best = 0
    best_rate = n_live / t0  # nothing selected: the bottom bin's row of the reference
    k = 0
    m = 0.0
    for r in range(1, HIST_BINS):  # r bins from the top selected
        k += count[HIST_BINS - r]
        m += mass[HIST_BINS - r]
        rate = (n_live + m) / (t0 + slope * k)
        if rate > best_rate:
            best, best_rate = r, rate
    return 2.0 if best == 0 else (HIST_BINS - best) / HIST_BINS


def chain_slot(alpha: float, decay: np.ndarray, survival: np.ndarray, logit: np.ndarray) -> None:
    """A new sequence's draft chain: each position's acceptance q_j = α·decay_j (clipped to
    [0, 1]), its true survival (the product of the q's up to it) and the logit the confidence
    head centres on, written into ``survival`` and ``logit`` (one slot's column). The
    reference of :func:`chain_slot_compiled`."""
    q = [min(1.0, max(0.0, alpha * d)) for d in decay.tolist()]
    s = 1.0
    for j, qj in enumerate(q):
        s *= qj
        survival[j] = s
        qc = min(1 - 1e-6, max(1e-6, qj))
        logit[j] = fpmath.log(qc / (1.0 - qc))


@njit
def chain_slot_compiled(
    alpha: float, decay: np.ndarray, survival: np.ndarray, logit: np.ndarray
) -> None:
    """:func:`chain_slot`, compiled: the same operations in the same order."""
    s = 1.0
    for j in range(decay.size):
        qj = min(1.0, max(0.0, alpha * decay[j]))
        s *= qj
        survival[j] = s
        qc = min(1 - 1e-6, max(1e-6, qj))
        logit[j] = log(qc / (1.0 - qc))


def survival_of(
    noise: np.ndarray,
    sigma: float,
    logit: np.ndarray,
    lagged: bool,
    old: np.ndarray,
    valid: np.ndarray,
    live: np.ndarray,
) -> np.ndarray:
    """(depth, slots) predicted survival of each draft: the confidence head's
    logistic(logit(q) + σ·``noise``) (``noise`` is overwritten), multiplied down the chain,
    zero for holes. ``lagged``: the confidences of ``lag`` steps ago (``old`` where ``valid``)
    are used, and this step's are stored there. The numpy reference of
    :func:`survival_compiled`."""
    noise *= -sigma
    noise -= logit
    noise = fpmath.exp(noise)
    noise += 1.0
    conf = np.reciprocal(noise, out=noise)
    use = conf
    if lagged:
        use = np.where(valid[None, :], old, conf)
        old[:] = conf
        valid[:] = live
    survival = np.cumprod(use, axis=0)
    survival *= live  # holes: nothing survives (survival >= 0, so this is exact)
    return survival


@njit
def survival_drawn(source: np.ndarray, noise: np.ndarray, *rest: Any) -> np.ndarray:
    """:func:`survival_compiled` of ``noise`` (depth, slots) filled first with standard normals
    from the policy's stream (``source``: :func:`~deepinfer_sim.rng.bit_source`), as
    :func:`~deepinfer_sim.rng.normal` draws them, and its other arguments ``rest``: one call a
    step."""
    normal_fill(source, noise.reshape(noise.size))
    return survival_compiled(noise, *rest)


@njit
def survival_compiled(
    noise: np.ndarray,
    sigma: float,
    logit: np.ndarray,
    lagged: bool,
    old: np.ndarray,
    valid: np.ndarray,
    live: np.ndarray,
) -> np.ndarray:
    """:func:`survival_of`, compiled: the same operations in the same order."""
    depth, hw = noise.shape
    survival = np.empty((depth, hw))
    for i in range(hw):
        keep_old = lagged and valid[i]
        s = 1.0
        for j in range(depth):
            c = 1.0 / (exp(noise[j, i] * -sigma - logit[j, i]) + 1.0)
            u = old[j, i] if keep_old else c
            if lagged:
                old[j, i] = c
            s = u if j == 0 else s * u
            survival[j, i] = s
        if lagged:
            valid[i] = live[i]
        if not live[i]:  # a hole: × 0 in the reference, and every survival is finite, >= 0
            survival[:, i] = 0.0
    return survival


@njit
def count_at_least_compiled(survival: np.ndarray, threshold: float, v: np.ndarray) -> None:
    """v[i] = how many drafts of slot i survive at ``threshold`` or above."""
    depth, hw = survival.shape
    for i in range(hw):
        n = 0
        for j in range(depth):
            if survival[j, i] >= threshold:
                n += 1
        v[i] = n


@njit
def accept_drawn(
    source: np.ndarray,
    survival: np.ndarray,
    live: np.ndarray,
    v: np.ndarray,
    left: np.ndarray,
    hw: int,
) -> np.ndarray:
    """:func:`accept_compiled` of ``hw`` uniforms drawn first from the chain's stream
    (``source``: :func:`~deepinfer_sim.rng.bit_source`), as ``Generator.random(hw)`` draws them."""
    u = np.empty(hw)
    for i in range(hw):
        u[i] = next_double(source[1], source[2])
    return accept_compiled(survival, u, live, v, left)


@njit
def accept_compiled(
    survival: np.ndarray, u: np.ndarray, live: np.ndarray, v: np.ndarray, left: np.ndarray
) -> np.ndarray:
    """:meth:`DraftChain.accept` given its uniforms ``u``, capped at each slot's tokens
    ``left`` as :meth:`SpecDecoder.accept` caps it, compiled."""
    hw = u.size
    emitted = np.zeros(hw, np.int64)
    for i in range(hw):
        if not live[i]:
            continue
        reached = 0
        for j in range(survival.shape[0]):
            if survival[j, i] > u[i]:
                reached += 1
        e = min(reached, v[i]) + 1
        emitted[i] = min(e, max(left[i], 0))
    return emitted


# ---- registry ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyParts:
    """What a policy is built from besides its config section."""

    max_draft: int  # drafts proposed per step (the config's, capped by the model's draft)
    capacity: int  # slots of the group
    rng: np.random.Generator  # the group's speculative stream


def _dspark(cfg: Speculative, parts: PolicyParts) -> DSpark:
    return DSpark(
        depth=parts.max_draft,
        lag_steps=cfg.lag_steps,
        noise_sigma=cfg.confidence_noise,
        overhead_s=cfg.overhead_s,
        retune_steps=cfg.retune_steps,
        capacity=parts.capacity,
        rng=parts.rng,
    )


VERIFY_POLICIES: dict[str, Callable[[Speculative, PolicyParts], VerifyPolicy]] = {
    "none": lambda cfg, parts: NoSpeculation(),
    "mtp1": lambda cfg, parts: Mtp1(),
    "fixed": lambda cfg, parts: FixedK(k=min(cfg.fixed_k, parts.max_draft)),
    "dspark": _dspark,
}


def make_verify_policy(cfg: Speculative, parts: PolicyParts) -> VerifyPolicy:
    factory = VERIFY_POLICIES.get(cfg.policy)
    if factory is None:
        raise ConfigError(
            "policies.speculative.policy",
            f"unknown verify policy {cfg.policy!r} (known: {', '.join(VERIFY_POLICIES)})",
        )
    return factory(cfg, parts)


def max_draft(cfg: Speculative, model: ModelSpec) -> int:
    """Drafts proposed per step: the config's, capped by what the model's draft head offers."""
    return min(cfg.max_draft_tokens, model.draft.max_draft_tokens or cfg.max_draft_tokens)


def offline_policy(cfg: Speculative, model: ModelSpec) -> VerifyPolicy:
    """The scenario's policy without slots (it draws nothing): what analyses without a cluster
    run read, its ``depth`` and ``overhead_s``."""
    return make_verify_policy(cfg, PolicyParts(max_draft(cfg, model), 0, np.random.default_rng(0)))


# ---- what a decode group holds -----------------------------------------------------------------


class SpecDecoder:
    """A group's speculative decoding: the draft chain, the verify policy and the drafter's
    cost (None: not charged), over its slots."""

    def __init__(
        self,
        *,
        policy: VerifyPolicy,
        classes: Sequence[ClassAcceptance],
        capacity: int,
        rng: np.random.Generator,
        draft: DraftCost | None = None,
    ) -> None:
        self.policy = policy
        self.chain = DraftChain(classes=classes, depth=policy.depth, capacity=capacity, rng=rng)
        self.overhead_s = policy.overhead_s
        self.draft = draft if policy.speculates else None
        self.v = np.zeros(capacity, dtype=np.int64)

    @property
    def active(self) -> bool:
        return self.policy.speculates

    def admit(self, slot: int, traffic_class: int) -> None:
        self.chain.admit(slot, traffic_class)
        self.policy.admit(slot)

    def choose(self, hw: int, live: np.ndarray, step_time: StepTime) -> np.ndarray:
        """Verify lengths for slots [0, hw) (0 for holes)."""
        v = self.v[:hw]
        v[:] = 0
        self.policy.choose(v, live, self.chain, step_time)
        return v

    def accept(self, hw: int, live: np.ndarray, left: np.ndarray) -> np.ndarray:
        """Tokens each slot emits this step: leading accepted drafts among its v, plus one, at
        most what it has left."""
        if not self.policy.speculates:
            return np.minimum(live.astype(np.int64), np.maximum(left, 0))
        if not COMPILED:
            return np.minimum(self.chain.accept(live, self.v[:hw]), np.maximum(left, 0))
        source = bit_source(self.chain.rng)  # the uniforms drawn in the call, as rng.random(hw)
        return accept_drawn(source, self.chain.survival, live, self.v, left, hw)
