"""Speculative decoding in a decode group: draft acceptance and the verify-length policies.

Every step a draft proposes up to ``max_draft`` tokens per sequence; the target model verifies a
prefix of v of them (plus its own next token), so a sequence emits accepted + 1 tokens and the
step computes 1 + v tokens for it. Policies choose v:

- ``none``: v = 0 (plain decoding); ``mtp1``: v = 1 (the MTP-1 baseline verifies 2 tokens);
  ``fixed``: v = k for every sequence;
- ``dspark``: a confidence head predicts each draft token's acceptance; the survival probability
  of draft j is the product of the predicted confidences up to j; all candidates of the group are
  ranked by it and the prefix that maximizes expected tokens per second — expected accepted
  tokens over the step time at the resulting verify batch, the step time taken from the decode
  cost model — is verified. The cut-off is re-optimized every ``retune_steps`` steps (it moves
  slowly with the batch) and applied to every step's survival probabilities. With
  ``lag_steps: 2`` (the production variant) the truncation uses the confidences of two steps
  earlier.

Acceptance model (per traffic class): each request draws an "easiness" α ~ Beta(mean·κ,
(1 − mean)·κ) at admission; draft j of a step is accepted with probability q_j = α·decay^(j−1),
given the drafts before it were. The confidence head reports logistic(logit(q_j) + N(0, σ)).
Everything is sampled vectorized over the group's sequences, from the group's own seeded stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

HIST_BINS = 256


@dataclass(frozen=True)
class ClassAcceptance:
    mean: float
    concentration: float
    position_decay: float


class SpecDecoder:
    """Per-group speculative decoding state and maths (vectorized over slots)."""

    def __init__(
        self,
        policy: str,
        max_draft: int,
        fixed_k: int,
        lag_steps: int,
        noise_sigma: float,
        overhead_s: float,
        retune_steps: int,
        classes: Sequence[ClassAcceptance],
        capacity: int,
        rng: np.random.Generator,
    ) -> None:
        self.policy = policy
        self.k = max_draft if policy in ("dspark", "fixed") else 1
        self.fixed_k = min(fixed_k, max_draft)
        self.lag = lag_steps
        self.sigma = noise_sigma
        self.overhead_s = overhead_s if policy == "dspark" else 0.0
        self.classes = classes
        self.rng = rng
        self.decay = np.array([[c.position_decay**j for j in range(self.k)] for c in classes])
        self.alpha = np.zeros(capacity)
        self.cls = np.zeros(capacity, dtype=np.int64)
        # per slot, fixed for the request's life (position-major: rows are draft positions, so
        # the per-step products run over k contiguous rows): the true survival probability of
        # each draft position and the logit of its acceptance
        self.survival = np.zeros((self.k, capacity))
        self.logit = np.zeros((self.k, capacity))
        # confidences of the last ``lag`` steps, per slot (ring), for the production variant
        self.hist = np.zeros((max(1, lag_steps), self.k, capacity))
        self.hist_valid = np.zeros((max(1, lag_steps), capacity), dtype=bool)
        self.step = 0
        self.retune_steps = max(1, retune_steps)
        self.threshold: float | None = None  # survival cut-off, re-optimized every retune_steps
        self.v = np.zeros(capacity, dtype=np.int64)

    @property
    def active(self) -> bool:
        return self.policy != "none"

    def admit(self, slot: int, traffic_class: int) -> None:
        c = self.classes[traffic_class]
        a = c.mean * c.concentration
        b = (1.0 - c.mean) * c.concentration
        alpha = self.rng.beta(a, b)
        self.alpha[slot] = alpha
        self.cls[slot] = traffic_class
        q = [min(1.0, max(0.0, alpha * d)) for d in self.decay[traffic_class].tolist()]
        s = 1.0
        for j, qj in enumerate(q):
            s *= qj
            self.survival[j, slot] = s
            qc = min(1 - 1e-6, max(1e-6, qj))
            self.logit[j, slot] = math.log(qc / (1.0 - qc))
        self.hist_valid[:, slot] = False

    def choose(
        self,
        hw: int,
        live: np.ndarray,
        step_time: Callable[[float], float],
    ) -> np.ndarray:
        """Verify lengths for slots [0, hw) (0 for holes). ``step_time(extra)`` is the group's
        step time when ``extra`` verify tokens are added uniformly across its ranks."""
        v = self.v[:hw]
        v[:] = 0
        if self.policy == "none":
            return v
        if self.policy == "mtp1":
            v[live] = 1
            return v
        if self.policy == "fixed":
            v[live] = self.fixed_k
            return v
        # Hot path (once per step): logistic(logit(q) + noise) over the group's drafts.
        noise = self.rng.standard_normal((self.k, hw))
        noise *= -self.sigma
        noise -= self.logit[:, :hw]
        np.exp(noise, out=noise)
        noise += 1.0
        conf = np.reciprocal(noise, out=noise)
        use = conf
        if self.lag:
            slot = self.step % self.lag
            old, valid = self.hist[slot, :, :hw], self.hist_valid[slot, :hw]
            use = np.where(valid[None, :], old, conf)
            old[:] = conf
            valid[:] = live
        self.step += 1
        survival = np.cumprod(use, axis=0)
        survival[:, ~live] = 0.0
        if self.threshold is None or self.step % self.retune_steps == 1 or self.retune_steps == 1:
            self.threshold = self._best_threshold(survival, int(live.sum()), step_time)
        v[:] = (survival >= self.threshold).sum(axis=0)
        return v

    def _best_threshold(
        self, survival: np.ndarray, n_live: int, step_time: Callable[[float], float]
    ) -> float:
        """Threshold on survival that maximizes (B + Σ selected survival) / T(B + K)."""
        if n_live == 0:
            return 2.0
        flat = survival.ravel()
        b = np.minimum((flat * HIST_BINS).astype(np.int64), HIST_BINS - 1)
        count = np.bincount(b, minlength=HIST_BINS)[::-1].cumsum()  # from the top bin down
        mass = np.bincount(b, weights=flat, minlength=HIST_BINS)[::-1].cumsum()
        t0 = step_time(0.0)
        slope = (step_time(float(self.k * n_live)) - t0) / (self.k * n_live)
        k_sel = np.concatenate([[0], count[:-1]])  # never select the bottom (zero) bin
        m_sel = np.concatenate([[0.0], mass[:-1]])
        rate = (n_live + m_sel) / (t0 + slope * k_sel)
        best = int(np.argmax(rate))
        return 2.0 if best == 0 else (HIST_BINS - best) / HIST_BINS

    def accept(self, hw: int, live: np.ndarray, left: np.ndarray) -> np.ndarray:
        """Tokens each slot emits this step: leading accepted drafts among its v, plus one."""
        v = self.v[:hw]
        if self.policy == "none":
            emitted = live.astype(np.int64)
        else:
            # The drafts form a chain: P(at least j accepted) = survival of position j, so one
            # uniform per sequence decides how far it gets (exact, and one draw instead of k).
            u = self.rng.random(hw)
            reached = (self.survival[:, :hw] > u[None, :]).sum(axis=0)
            emitted = np.where(live, np.minimum(reached, v) + 1, 0)
        return np.minimum(emitted, np.maximum(left, 0))
