"""Prefill chunk policies, each driven directly on a few queued prompts: no cluster, no prefill
instance. ``plan`` walks one DP rank's first-come-first-served list the way the instance does:
it asks the policy for each sequence's chunk, charges it to the step's budgets (time past the
quadratic's fixed term, tokens) and stops where the policy says the step is full.
"""

from __future__ import annotations

from typing import get_args

import pytest

from deepinfer_sim.errors import ConfigError
from deepinfer_sim.scenario import PrefillPool
from deepinfer_sim.sim.policies.chunking import (
    CHUNK_POLICIES,
    ChunkPolicy,
    QuadraticChunks,
    WholePrompts,
    chunk_time,
    make_chunk_policy,
)

B = 1.0 / 1024  # s per token: exact in binary, so the time budget's chunk sizes are exact too


def plan(
    policy: ChunkPolicy,
    queued: list[tuple[int, int]],
    time_s: float = 1e9,
    tokens: int = 10_000,
    quad: tuple[float, float, float] = (B, 0.0, 0.0),
) -> list[int]:
    """Chunk sizes one step takes from ``queued`` (remaining tokens, computed prefix) pairs."""
    b, c, d = quad
    time_left, tokens_left = time_s, tokens
    taken: list[int] = []
    for remaining, pos in queued:
        n = policy.take(remaining, pos, time_left, tokens_left, not taken, b, c, d)
        if n <= 0:
            break
        taken.append(n)
        time_left -= chunk_time(n, pos, b, c, d)
        tokens_left -= n
        if policy.full(time_left, tokens_left):
            break
    return taken


def test_whole_prompts_fill_the_token_budget_first_come_first_served():
    """Two prompts fit the 10,000-token budget; the third would overflow it, so it waits for the
    next step (no partial prompt) and so does the small one behind it (no overtaking)."""
    assert plan(WholePrompts(), [(4000, 0), (5000, 0), (3000, 0), (100, 0)]) == [4000, 5000]


def test_chunked_fills_the_token_budget_with_a_partial_chunk():
    """The same queue under chunking: the third prompt contributes the 1,000 tokens still free."""
    assert plan(QuadraticChunks(), [(4000, 0), (5000, 0), (3000, 0), (100, 0)]) == [
        4000,
        5000,
        1000,
    ]


def test_a_prompt_larger_than_the_budget_runs_alone_whole_or_is_cut_when_chunked():
    queue = [(50_000, 0), (10, 0)]
    assert plan(WholePrompts(), queue) == [50_000]
    assert plan(QuadraticChunks(), queue) == [10_000]


def test_only_chunking_respects_the_step_time_budget():
    """4 s at 1/1024 s per token is 4,096 tokens: chunking cuts the second prompt there, the
    whole-prompt baseline ignores time and takes both."""
    queue = [(3000, 0), (3000, 0)]
    assert plan(QuadraticChunks(), queue, time_s=4.0) == [3000, 1096]
    assert plan(WholePrompts(), queue, time_s=4.0) == [3000, 3000]


def test_chunked_takes_the_largest_chunk_whose_quadratic_cost_fits():
    """With attention to the computed prefix (c) and the n² term (d), the chosen chunk fits the
    time left and one more token would not."""
    b, c, d = 1e-4, 1e-9, 1e-8
    pos, time_left = 20_000, 0.75
    n = QuadraticChunks().take(1 << 20, pos, time_left, 1 << 20, True, b, c, d)
    assert 0 < n < 1 << 20
    assert chunk_time(n, pos, b, c, d) <= time_left < chunk_time(n + 1, pos, b, c, d)


def test_a_step_out_of_time_is_full_only_for_chunking():
    assert QuadraticChunks().full(-0.1, 500) and not WholePrompts().full(-0.1, 500)
    assert QuadraticChunks().full(1.0, 0) and WholePrompts().full(1.0, 0)
    assert not QuadraticChunks().full(1.0, 500) and not WholePrompts().full(1.0, 500)


def test_registry_covers_the_config_tags_and_refuses_others():
    assert set(CHUNK_POLICIES) == set(get_args(PrefillPool.model_fields["scheduler"].annotation))
    assert type(make_chunk_policy("chunked")) is QuadraticChunks
    assert type(make_chunk_policy("whole")) is WholePrompts
    with pytest.raises(ConfigError, match="unknown prefill scheduler 'greedy'"):
        make_chunk_policy("greedy")
