"""Chunk sizing for prefill steps: the largest chunk the step's time and token budgets allow.

A step's time is predicted by the fitted quadratic t = a + Σ_i (b·n_i + c·n_i·p_i + d·n_i²) over
the sequences it computes (n new tokens after a computed prefix p). Given the time still free in
the step, the largest n for one more sequence solves d·n² + (b + c·p)·n ≤ remaining, in closed
form; it is then capped by the sequence's remaining tokens and the step's token budget.
"""

from __future__ import annotations

import math


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
