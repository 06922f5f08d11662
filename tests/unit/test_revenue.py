"""Revenue as providers bill it: cached input tokens may be priced apart from misses."""

from __future__ import annotations

import pytest

from deepinfer_sim import load_scenario, simulate

SMALL = ["workload.max_requests=150", "sim.progress=false"]


@pytest.fixture(scope="module")
def runs():
    same = simulate(load_scenario("default", SMALL)).summary
    cheap = simulate(
        load_scenario("default", [*SMALL, "prices.revenue.input_cache_hit_per_mtok_usd=0.014"])
    ).summary
    return same, cheap


def test_revenue_says_which_tokens_earned_it(runs) -> None:
    same, _ = runs
    cost = same["cost"]
    parts = cost["revenue_usd_per_hour_by_tokens"]
    assert sum(parts.values()) == pytest.approx(cost["revenue_usd_per_hour"])
    hit = same["cache"]["hit_rate_tokens"]
    assert 0 < hit < 1  # the default workload reuses prefixes
    # without a cache-hit price, hits earn what misses earn, per token
    assert parts["input_cache_hit"] / parts["input_cache_miss"] == pytest.approx(hit / (1 - hit))


def test_cheaper_cache_hits_lower_revenue_by_the_hit_tokens_only(runs) -> None:
    same, cheap = runs
    a, b = (
        same["cost"]["revenue_usd_per_hour_by_tokens"],
        cheap["cost"]["revenue_usd_per_hour_by_tokens"],
    )
    assert b["input_cache_hit"] == pytest.approx(a["input_cache_hit"] / 10)
    assert b["input_cache_miss"] == pytest.approx(a["input_cache_miss"])
    assert b["output"] == pytest.approx(a["output"])
    assert cheap["cost"]["revenue_usd_per_hour"] < same["cost"]["revenue_usd_per_hour"]
