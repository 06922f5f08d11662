"""Self-hosting against the API (planner/analysis/api_compare.py): the arithmetic on workloads
whose answer is known by hand — a flat day, a peaked day, hit rates splitting the bill — then
the pools resized hour by hour (the minimum size, the spin-up delay), the break-even where the
two lines cross, and prices the scenario refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from deepinfer_sim.errors import ConfigError
from deepinfer_sim.planner.analysis.api_compare import (
    Capacity,
    DailyShape,
    Fleet,
    PoolPrice,
    Variant,
    api_bill,
    break_even,
    compare_api,
    daily_shape,
    hour_coverage,
    instances_by_hour,
    paid_hours,
    price_factors,
    self_hosted_day,
)
from deepinfer_sim.scenario import ApiPrices, StoragePool, load_scenario
from deepinfer_sim.traces import RequestSource
from deepinfer_sim.traces.workload import build_source

HOUR = 3600.0
DAY = 86400.0


def source(arrival_s, input_len=1000, output_len=100, classes=None, names=("chatbot",)):
    """Requests with fresh prefix blocks (no reuse)."""
    n = len(arrival_s)
    blocks = -(-input_len // 512)
    return RequestSource.from_columns(
        arrival_s=np.asarray(arrival_s, dtype=float),
        input_len=np.full(n, input_len),
        output_len=np.full(n, output_len),
        block_offsets=np.arange(n + 1) * blocks,
        block_hashes=np.arange(n * blocks),
        block_tokens=512,
        traffic_class=None if classes is None else np.asarray(classes),
        class_names=names,
    )


FLAT_PRICES = ApiPrices(
    input_per_mtok_usd=1.0,
    input_cache_hit_per_mtok_usd=0.1,
    output_per_mtok_usd=2.0,
    peak_hours_utc=tuple(range(24)),
    peak_days_per_week=7,
)  # every hour at the peak price: the bill is tokens x price


# ---- the day ----------------------------------------------------------------------------------


def test_a_flat_day_has_the_same_load_every_hour():
    """Ten requests an hour for two days: every hour of the average day holds ten requests,
    10,000 input and 1,000 output tokens; the day holds 240 requests."""
    arrivals = np.arange(0, 2 * DAY, HOUR / 10) + 1.0
    shape = daily_shape(source(arrivals), 0.0, 2 * DAY)
    assert np.allclose(shape.requests, 10.0)
    assert np.allclose(shape.input_tokens, 10_000.0)
    assert np.allclose(shape.output_tokens, 1_000.0)
    assert np.allclose(shape.covered_h, 2.0) and shape.filled == []
    assert shape.tokens_per_day == pytest.approx(24 * 11_000)


def test_a_peaked_day_keeps_its_peak_hour():
    """Two days of one request an hour, plus 99 more at 15:xx each day: hour 15 holds 100
    requests, the others 1."""
    quiet = np.arange(0, 2 * DAY, HOUR) + 60.0
    peak = np.concatenate([d * DAY + 15 * HOUR + np.arange(1, 100) * 30.0 for d in (0, 1)])
    shape = daily_shape(source(np.sort(np.concatenate([quiet, peak]))), 0.0, 2 * DAY)
    expected = np.ones(24)
    expected[15] = 100.0
    assert np.allclose(shape.requests, expected)


def test_a_trace_shorter_than_a_day_fills_the_hours_it_never_covers_with_its_mean():
    """Half an hour of traffic (60 requests) in hour 2: that hour runs at 120 requests an hour,
    and so does every hour the trace never reached."""
    arrivals = 2 * HOUR + np.arange(60) * 30.0
    shape = daily_shape(source(arrivals), float(arrivals[0]), float(arrivals[-1]))
    assert shape.filled == [h for h in range(24) if h != 2]
    assert np.allclose(shape.requests, 60 / ((arrivals[-1] - arrivals[0]) / HOUR))


def test_hour_coverage_counts_each_hour_of_each_day():
    cov = hour_coverage(1.5 * HOUR, DAY + 2 * HOUR)  # 01:30 on day 0 to 02:00 on day 1
    assert cov[0] == pytest.approx(1.0) and cov[1] == pytest.approx(1.5)
    assert cov[5] == pytest.approx(1.0) and cov.sum() == pytest.approx(24.5)


# ---- the API bill -----------------------------------------------------------------------------


def flat_shape(input_by_class, output=1e6, classes=("chatbot", "agent")):
    """A day of input_by_class[c] input tokens an hour per class and ``output`` output tokens."""
    inp = np.repeat(np.asarray(input_by_class, dtype=float)[:, None], 24, axis=1)
    return DailyShape(
        classes=classes,
        requests=np.full(24, 100.0),
        input_tokens=inp,
        output_tokens=np.full(24, float(output)),
        covered_h=np.ones(24),
        start_s=0.0,
        end_s=DAY,
        window_requests=2400,
    )


def test_the_api_bill_splits_input_by_each_classes_hit_rate():
    """1 M chatbot tokens an hour at 50 % hits and 2 M agent tokens at 90 %, 1 M output an hour,
    every hour at peak: hits 24 x (0.5 + 1.8) M x $0.1, misses 24 x (0.5 + 0.2) M x $1,
    output 24 M x $2."""
    shape = flat_shape([1e6, 2e6])
    bill = api_bill(shape, np.array([0.5, 0.9]), FLAT_PRICES, np.ones(24))
    assert bill.input_cache_hit == pytest.approx(24 * 2.3 * 0.1)
    assert bill.input_cache_miss == pytest.approx(24 * 0.7 * 1.0)
    assert bill.output == pytest.approx(24 * 2.0)
    assert bill.total == pytest.approx(24 * (0.23 + 0.7 + 2.0))
    doubled = api_bill(shape, np.array([0.5, 0.9]), FLAT_PRICES, np.ones(24), scale=2.0)
    assert doubled.total == pytest.approx(2 * bill.total)
    no_hits = api_bill(shape, np.zeros(2), FLAT_PRICES, np.ones(24))
    assert no_hits.input_cache_miss == pytest.approx(24 * 3.0) and no_hits.input_cache_hit == 0


def test_deepseeks_peak_hours_land_on_the_workload_clock_through_its_utc_offset():
    """Peak 01-04 and 06-10 UTC on 5 days of 7, off-peak half: a peak hour costs
    5/7 + 2/7 x 0.5 of the peak price on average, an off-peak hour half. A workload on
    Beijing time (UTC+8) has its 09:00 at 01:00 UTC."""
    prices = ApiPrices()
    peak = 5 / 7 + 2 / 7 * 0.5
    utc = price_factors(prices, 0.0)
    assert utc[1] == pytest.approx(peak) and utc[9] == pytest.approx(peak)
    assert utc[0] == pytest.approx(0.5) and utc[4] == pytest.approx(0.5) and utc[15] == 0.5
    beijing = price_factors(prices, 8.0)
    assert beijing[9] == pytest.approx(peak) and beijing[1] == pytest.approx(0.5)
    # at UTC+0:30 the workload's 01:00-02:00 is 00:30-01:30 UTC: half off-peak, half peak
    assert price_factors(prices, 0.5)[1] == pytest.approx((0.5 + peak) / 2)


def test_bad_prices_are_refused_naming_the_key():
    for override, message in (
        ("prices.api.output_per_mtok_usd=-1", "prices.api.output_per_mtok_usd"),
        ("prices.api.input_cache_hit_per_mtok_usd=0.5", "must not exceed input_per_mtok_usd"),
        ("prices.api.off_peak_factor=0", "prices.api.off_peak_factor"),
        ("prices.api.peak_hours_utc=[1, 24]", "expected distinct hours from 0 to 23"),
        ("prices.api.input_per_mtok_usd=.inf", "prices.api.input_per_mtok_usd"),
        ("compare_api.volume_range=[10, 1]", "the first must be below the second"),
        ("compare_api.min_decode_groups=-1", "compare_api.min_decode_groups"),
    ):
        with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
            load_scenario("default", [override])


# ---- resizing ---------------------------------------------------------------------------------


def test_instances_cover_each_hour_and_never_drop_below_the_minimum():
    demand = np.array([0.0, 50.0, 100.0, 100.0000001, 250.0] + [0.0] * 19)
    assert instances_by_hour(demand, 100.0, 0)[:5].tolist() == [0, 1, 1, 2, 3]
    assert instances_by_hour(demand, 100.0, 2)[:5].tolist() == [2, 2, 2, 2, 3]


def test_paid_hours_charge_the_spin_up_before_each_start_and_keep_short_gaps_running():
    """Two instances for 12 hours, one for the other 12: the second is idle 12 hours a day. With
    no spin-up it costs 12 hours; with a 1-hour spin-up 13; with a 13-hour spin-up releasing it
    saves nothing and it runs all day (24)."""
    sizes = np.array([2] * 12 + [1] * 12)
    assert paid_hours(sizes, 0.0) == pytest.approx(24 + 12)
    assert paid_hours(sizes, HOUR) == pytest.approx(24 + 13)
    assert paid_hours(sizes, 13 * HOUR) == pytest.approx(24 + 24)


def test_paid_hours_follow_gaps_across_midnight():
    """One instance serving 20:00-04:00, across midnight: one gap of 16 hours a day, so one
    30-minute spin-up; serving 00-02 and 12-14: two gaps, two spin-ups."""
    sizes = np.array([1] * 4 + [0] * 16 + [1] * 4)
    assert paid_hours(sizes, 1800.0) == pytest.approx(8.5)
    split = np.array([1] * 2 + [0] * 10 + [1] * 2 + [0] * 10)  # two gaps: two spin-ups
    assert paid_hours(split, 1800.0) == pytest.approx(4 + 2 * 0.5)
    assert paid_hours(np.zeros(24, dtype=np.int64), 1800.0) == 0.0


def fleet(min_prefill=1, min_decode=1, spin_up_s=0.0, storage_usd=0.0):
    return Fleet(
        pools={"prefill": PoolPrice(4, 1.0), "decode": PoolPrice(8, 2.0)},
        min_prefill=min_prefill,
        min_decode=min_decode,
        vision_per_prefill=0.0,
        spin_up_s=spin_up_s,
        headroom=1.0,
        storage=StoragePool(),
        storage_node_usd_per_h=storage_usd,
    )


CAP = Capacity(
    prefill_tok_s=1e6 / HOUR,  # one instance prefills 1 M tokens an hour
    decode_tok_s=1e5 / HOUR,  # one group decodes 100 k tokens an hour
    prefill_source="test",
    decode_source="test",
    mean_prompt=1000,
    mean_cached=0,
    decode_context=1000,
    decode_seqs_per_rank=None,
    decode_limit=None,
)


def variant(hit=(0.0,), storage=False, peak_bytes=0.0):
    return Variant("test", 0.0, np.asarray(hit, dtype=float), peak_bytes, storage)


def test_a_flat_day_self_hosted_costs_its_pools_all_day():
    """3 M input tokens and 250 k output tokens an hour, no cache: 3 prefill instances (4 GPUs at
    $1) and 3 decode groups (8 GPUs at $2) every hour: 24 x (12 + 48) = $1,440; nothing freed."""
    shape = flat_shape([3e6], output=2.5e5, classes=("chatbot",))
    day = self_hosted_day(fleet(), shape, variant(), CAP, 1.0)
    assert day.sizes["prefill"].tolist() == [3] * 24 and day.sizes["decode"].tolist() == [3] * 24
    assert day.usd_per_day == pytest.approx(24 * (3 * 4 * 1.0 + 3 * 8 * 2.0))
    assert day.static_usd_per_day == day.usd_per_day and day.gpu_hours_freed == 0
    half = self_hosted_day(fleet(), shape, variant(hit=(0.5,)), CAP, 1.0)
    assert half.sizes["prefill"].tolist() == [2] * 24  # 1.5 M tokens missed an hour


def test_a_peaked_day_frees_gpu_hours_after_paying_the_spin_ups():
    """Demand of 4 prefill instances in hours 12-17 and 1 otherwise (decode always 1): the three
    extra instances serve 6 hours and, with a 30-minute spin-up, cost 6.5 hours each; sized for
    the peak all day they would cost 24. Freed: 3 x 4 GPUs x 17.5 hours."""
    inp = np.full(24, 1e6)
    inp[12:18] = 4e6
    shape = DailyShape(
        classes=("chatbot",),
        requests=np.full(24, 100.0),
        input_tokens=inp[None, :],
        output_tokens=np.full(24, 1e5),
        covered_h=np.ones(24),
        start_s=0.0,
        end_s=DAY,
        window_requests=2400,
    )
    day = self_hosted_day(fleet(spin_up_s=1800.0), shape, variant(), CAP, 1.0)
    assert day.sizes["prefill"].max() == 4 and day.sizes["prefill"].min() == 1
    assert day.gpu_hours_freed == pytest.approx(3 * 4 * (24 - 6.5))
    assert day.usd_per_day == pytest.approx(4 * (24 + 3 * 6.5) * 1.0 + 8 * 24 * 2.0)
    assert day.static_usd_per_day == pytest.approx(4 * 4 * 24 * 1.0 + 8 * 24 * 2.0)
    floor = self_hosted_day(fleet(min_prefill=2, spin_up_s=1800.0), shape, variant(), CAP, 1.0)
    assert floor.sizes["prefill"].min() == 2  # the minimum size holds in the quiet hours


def test_storage_nodes_are_whole_coding_groups_kept_all_day():
    shape = flat_shape([1e6], classes=("chatbot",))
    store = StoragePool()
    day = self_hosted_day(
        fleet(storage_usd=4.0), shape, variant(storage=True, peak_bytes=1e12), CAP, 1.0
    )
    assert day.storage_nodes == store.width  # 1 TB: the smallest cluster, one coding group
    assert day.usd_per_day - self_hosted_day(fleet(), shape, variant(), CAP, 1.0).usd_per_day == (
        pytest.approx(store.width * 4.0 * 24)
    )


# ---- break-even -------------------------------------------------------------------------------


def test_break_even_is_where_the_two_lines_cross():
    """Self-hosting at a flat $1,000 a day against an API at $3 per unit of volume: they cross
    at 333.3; self-hosting cheaper above, the API below."""
    scales = np.geomspace(1, 1e4, 41)
    scale, why = break_even(scales, lambda s: 1000.0 - 3.0 * s)
    assert scale == pytest.approx(1000 / 3, rel=1e-9)
    assert "below it the API is cheaper" in why
    never, why = break_even(scales, lambda s: 1.0)
    assert never is None and "the API is cheaper" in why
    always, why = break_even(scales, lambda s: -1.0)
    assert always is None and "self-hosting is cheaper at every volume" in why


def test_break_even_is_the_last_crossing_of_a_step_cost():
    """A cost that steps up past the API line once more (at 10-12) is cheaper only above the
    last crossing (12)."""
    scales = np.geomspace(1, 100, 201)

    def diff(s: float) -> float:
        return 5.0 - s if s < 10 else (1.0 if s < 12 else -1.0)

    scale, _ = break_even(scales, diff)
    assert scale == pytest.approx(12.0, rel=1e-6)


# ---- the whole comparison ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def sessions():
    sc = load_scenario(
        "default",
        [
            "workload.sessions.days=3",
            "workload.sessions.sessions_per_day=400",
            "compare_api.ttl_variants_s=[0, 3600]",
            "compare_api.warmup_s=86400",
            "compare_api.volume_points=61",
        ],
    )
    return sc, build_source(sc.workload, sc.seed)


def test_the_comparison_crosses_where_it_says_and_is_deterministic(sessions):
    sc, src = sessions
    res = compare_api(sc, src)
    assert res.shape.start_s == DAY and res.shape.end_s == 3 * DAY  # after the warm-up, 2 days
    assert [r.variant.label for r in res.variants] == [
        "TTL chatbot 7 d, agent 3 d",
        "no prefix cache",
        "TTL 1 h",
    ]
    hits = [r.variant.hit_rate @ res.shape.input_tokens.sum(axis=1) for r in res.variants]
    assert hits[0] >= hits[2] > hits[1] == 0  # a longer TTL hits more; no cache, nothing
    for r in res.variants:
        assert r.break_even_scale is not None and r.at_break_even is not None
        api = res.api_at_workload.total * r.break_even_scale
        assert r.at_break_even.usd_per_day <= api * (1 + 1e-9)
        below = r.break_even_scale * (1 - 1e-6)  # just below it, the API is cheaper
        day = self_hosted_day(Fleet.of(sc), res.shape, r.variant, r.capacity, below)
        assert day.usd_per_day > res.api_at_workload.total * below
    # the API line is the bill at the workload's volume, scaled
    assert np.allclose(res.api_curve, res.api_at_workload.total * res.scales)
    assert compare_api(sc, src).as_dict() == res.as_dict()


def test_aggregated_serving_is_refused_in_one_sentence():
    from deepinfer_sim.errors import UserError

    sc = load_scenario("configs/scenarios/v3-h200-aggregated.yaml", ["workload.max_requests=50"])
    with pytest.raises(UserError, match="aggregated is not supported"):
        compare_api(sc, build_source(sc.workload, sc.seed))


def test_the_api_hit_rate_follows_its_own_cache_ttl(sessions):
    """prices.api.cache_ttl_s sets the API cache's retention apart from the self-hosted TTLs:
    an API that keeps prefixes a minute bills fewer hits than one that keeps them for days."""
    sc, src = sessions
    short = sc.model_copy(
        update={"prices": sc.prices.model_copy(update={"api": ApiPrices(cache_ttl_s=60.0)})}
    )
    long_hits = compare_api(sc, src).api_at_workload.input_cache_hit
    short_bill = compare_api(short, src).api_at_workload
    assert short_bill.input_cache_hit < long_hits
    assert math.isfinite(short_bill.total)
