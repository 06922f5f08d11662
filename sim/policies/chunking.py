"""Prefill chunking: how much of each queued prompt a DP rank's step computes.

A prefill rank walks its first-come-first-served list every step. For each sequence a
:class:`ChunkPolicy` says how many of its remaining tokens go into this step (0: none, the step
is closed before it) and, once it is in, whether the step is full. ``CHUNK_POLICIES`` maps the
config's ``pools.prefill.scheduler`` tag to one:

- ``chunked`` (:class:`QuadraticChunks`): a step's time is predicted by the fitted quadratic
  t = a + Σ_i (b·n_i + c·n_i·p_i + d·n_i²) over the sequences it computes (n new tokens after a
  computed prefix p). Given the time still free in the step, the largest n for one more sequence
  solves d·n² + (b + c·p)·n ≤ remaining, in closed form (:func:`largest_chunk`); it is then
  capped by the sequence's remaining tokens and the step's token budget. Several sequences share
  a step; a long prompt spans several steps.
- ``whole`` (:class:`WholePrompts`, the baseline and the reference double): first come, first
  served, whole prompts within the token budget; a prompt larger than the budget runs alone.
- ``tokens`` (:class:`TokenBudget`, aggregated serving's default, ``pools.aggregated.scheduler``):
  vLLM's chunked prefill (SGLang's with mixed chunks) — each sequence, oldest first, takes as
  much of the step's token budget as is left (after the running sequences' decode tokens), so a
  long prompt spans several steps; no time budget. ``prefill_first`` chunks the same way, on
  ranks whose sequences sit the step out (``sim/stages/aggregated.py``); an aggregated ``whole``
  (:class:`WholeBeside`) fits whole prompts beside the decode tokens.

The rank keeps the budgets (time left after the fixed term a, tokens left) and charges each
chosen chunk to both the same way under every policy; the policies only read them. All are
O(1) per sequence: the rank already loops over the sequences it schedules.
"""

from __future__ import annotations

import math
from typing import Protocol

from ...errors import ConfigError


def largest_chunk(remaining_s: float, p: float, b: float, c: float, d: float) -> int:
    """Largest integer n >= 0 with d·n² + (b + c·p)·n <= remaining_s."""
    if remaining_s <= 0:
        return 0
    lin = b + c * p
    if d > 0:
        n = (-lin + math.sqrt(lin * lin + 4.0 * d * remaining_s)) / (2.0 * d)
    elif lin > 0:
        n = remaining_s / lin
    else:
        return 1 << 62
    return max(0, int(n * (1 + 1e-12)))


def chunk_time(n: float, p: float, b: float, c: float, d: float) -> float:
    return n * (b + c * p + d * n)


class ChunkPolicy(Protocol):
    def take(
        self,
        remaining: int,
        pos: int,
        time_left: float,
        tokens_left: int,
        first: bool,
        b: float,
        c: float,
        d: float,
    ) -> int:
        """New tokens to compute in this step for the next queued sequence, which has
        ``remaining`` tokens left after a computed prefix of ``pos``, when the step has
        ``time_left`` seconds (past the fixed term) and ``tokens_left`` tokens free and
        ``first`` says no sequence is in it yet; (b, c, d) are the step-time quadratic's
        per-sequence terms. 0 (or less): the step takes no more sequences."""
        ...

    def full(self, time_left: float, tokens_left: int) -> bool:
        """Whether the step, with these budgets left after its last chunk, takes no more."""
        ...


class WholePrompts:
    """First come, first served, whole prompts within the token budget; a prompt larger than the
    budget runs alone in its step. Ignores the time budget."""

    __slots__ = ()
    alone_over_budget = True  # the first prompt of a step goes in whatever its size

    def take(
        self,
        remaining: int,
        pos: int,
        time_left: float,
        tokens_left: int,
        first: bool,
        b: float,
        c: float,
        d: float,
    ) -> int:
        fits = remaining <= tokens_left or (first and self.alone_over_budget)
        return remaining if fits else 0

    def full(self, time_left: float, tokens_left: int) -> bool:
        return tokens_left <= 0


class QuadraticChunks:
    """The largest chunk the step's time (under the fitted quadratic) and token budgets allow."""

    __slots__ = ()

    def take(
        self,
        remaining: int,
        pos: int,
        time_left: float,
        tokens_left: int,
        first: bool,
        b: float,
        c: float,
        d: float,
    ) -> int:
        return min(remaining, tokens_left, largest_chunk(time_left, pos, b, c, d))

    def full(self, time_left: float, tokens_left: int) -> bool:
        return tokens_left <= 0 or time_left <= 0


class TokenBudget:
    """The largest chunk the step's token budget allows (the engines' chunked prefill). Ignores
    the time budget."""

    __slots__ = ()

    def take(
        self,
        remaining: int,
        pos: int,
        time_left: float,
        tokens_left: int,
        first: bool,
        b: float,
        c: float,
        d: float,
    ) -> int:
        return min(remaining, tokens_left)

    def full(self, time_left: float, tokens_left: int) -> bool:
        return tokens_left <= 0


class WholeBeside(WholePrompts):
    """Whole prompts in what the decode tokens leave of the token budget, first come first
    served: the first that does not fit waits for a later step (aggregated ``whole``; a
    workload with a prompt longer than the budget is refused before the run)."""

    __slots__ = ()
    alone_over_budget = False


CHUNK_POLICIES: dict[str, type[WholePrompts | QuadraticChunks]] = {
    "chunked": QuadraticChunks,
    "whole": WholePrompts,
}
"""``pools.prefill.scheduler``."""

AGGREGATED_CHUNK_POLICIES: dict[str, type[TokenBudget | QuadraticChunks | WholeBeside]] = {
    "tokens": TokenBudget,
    "chunked": QuadraticChunks,
    "whole": WholeBeside,
    "prefill_first": TokenBudget,  # the budget is all the chunks' when they run (aggregated.py)
}
"""``pools.aggregated.scheduler``."""


def make_chunk_policy(tag: str, aggregated: bool = False) -> ChunkPolicy:
    """The chunk policy of ``pools.prefill.scheduler`` (or ``pools.aggregated.scheduler``)."""
    policies: dict[str, type[ChunkPolicy]] = dict(
        AGGREGATED_CHUNK_POLICIES if aggregated else CHUNK_POLICIES
    )
    if tag not in policies:
        known = ", ".join(policies)
        key = f"pools.{'aggregated' if aggregated else 'prefill'}.scheduler"
        raise ConfigError(key, f"unknown prefill scheduler {tag!r} (one of {known})")
    return policies[tag]()
