"""The draft model's time in a decode step: proposing drafts, beside verifying them.

A step verifies 1 + v tokens per sequence (the StepCost charges those rows); the draft model
proposes the drafts first. A drafter of ``layers`` decoder layers costs what that many of the
target's decode layers cost at the drafter's rows: the target's step at those rows, less its
fixed step overhead, scaled by layers / the target's layer count (its attention, experts and
exchange alike). An MTP chain runs one pass per draft over one row per sequence; a block drafter
(DSpark's) one pass over every draft position. Its vocabulary projection is not charged apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cost import StepCost
from .spec import ModelSpec


@dataclass(frozen=True, slots=True)
class DraftCost:
    passes: int  # forward passes of the drafter per step
    rows: int  # rows per sequence in each pass
    share: float  # the drafter's layers over the target's

    @classmethod
    def of(cls, model: ModelSpec, drafts: int) -> DraftCost | None:
        """The drafter of ``model`` proposing ``drafts`` tokens a step; None when it costs
        nothing (no drafts, or a drafter of no stated size)."""
        layers = model.draft.layers
        if drafts <= 0 or layers <= 0:
            return None
        share = layers / model.n_layers
        return cls(1, drafts, share) if model.draft.block else cls(drafts, 1, share)

    def step_s(self, cost: StepCost, batch: np.ndarray, kv: np.ndarray, imbalance: float) -> float:
        """Drafting time of a step whose ranks hold ``batch`` sequences with ``kv`` context
        tokens in all (per rank, as in :meth:`StepCost.decode_step_packed`)."""
        probe = np.stack((batch, kv, batch * self.rows, kv * self.rows))
        one_pass = cost.decode_step_packed(probe, imbalance) - cost.step_overhead_s
        return float(self.passes * self.share * one_pass)
