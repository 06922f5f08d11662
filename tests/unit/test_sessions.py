"""Synthetic multi-day sessions: what ``generate_sessions`` promises.

A generated workload is an ordinary ``RequestSource``: valid, sorted by arrival, one
``session_id`` per conversation or agent task, classes ``("chatbot", "agent")``. Its block ids
follow the chained-prefix convention: a later turn of a conversation starts with the full blocks
of the turn before it, system-prompt blocks are shared across sessions, and a partial last
block is never reused. Timing follows the diurnal curve and the return process; contexts stay
within their cap. Bad config values are refused by the pydantic model.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from conftest import assert_same_source
from pydantic import ValidationError

from deepinfer_sim.planner.analysis.ttl_sweep import ALL, ttl_sweep
from deepinfer_sim.traces import RequestSource
from deepinfer_sim.traces.synth.sessions import (
    DEFAULT_AGENT,
    DEFAULT_CHATBOT,
    LogNormalMix,
    SessionClass,
    SessionWorkload,
    diurnal_rate,
    generate_sessions,
)

DAY = 86400.0


def small(**kw: object) -> SessionWorkload:
    """A workload of a few thousand requests (generated in milliseconds)."""
    base: dict[str, object] = {"days": 2.0, "sessions_per_day": 400.0, "agent_fraction": 0.2}
    return SessionWorkload.model_validate(base | kw)


def by_session(src: RequestSource) -> dict[int, np.ndarray]:
    """Row indices of each session, in arrival order."""
    order = np.lexsort((np.arange(len(src)), src.session_id))
    sessions, first = np.unique(src.session_id[order], return_index=True)
    return dict(zip(sessions.tolist(), np.split(order, first[1:]), strict=True))


@pytest.fixture(scope="module")
def default_small() -> RequestSource:
    return generate_sessions(small(), seed=3)


def test_the_source_is_valid_sorted_and_labelled(default_small: RequestSource) -> None:
    src = default_small
    src.validate()
    assert src.class_names == ("chatbot", "agent")
    assert src.block_tokens == 512
    assert np.all(np.diff(src.arrival_s) >= 0)
    assert src.arrival_s.max() < 2 * DAY
    assert np.all(src.session_id >= 0)
    # a session belongs to one class
    for rows in by_session(src).values():
        assert len(set(src.traffic_class[rows].tolist())) == 1


def test_same_seed_same_workload_and_other_seed_another() -> None:
    cfg = small()
    a, b, c = generate_sessions(cfg, 7), generate_sessions(cfg, 7), generate_sessions(cfg, 8)
    assert_same_source(a, b, exact=True)
    assert len(a) != len(c) or not np.array_equal(a.arrival_s, c.arrival_s)


def test_classes_draw_from_their_own_streams() -> None:
    """Changing agent parameters leaves the chatbot requests exactly as they were."""
    a = generate_sessions(small(), 5)
    slower = DEFAULT_AGENT.model_copy(
        update={"think_time_s": LogNormalMix(median=30, sigma=1, low=1)}
    )
    b = generate_sessions(small(agent=slower), 5)
    ca, cb = a.select(a.traffic_class == 0), b.select(b.traffic_class == 0)
    assert np.array_equal(ca.arrival_s, cb.arrival_s)
    assert np.array_equal(ca.input_len, cb.input_len)


def test_a_chatbot_turn_extends_the_previous_turns_full_blocks() -> None:
    """Without rewrites, turn k+1 starts with all full blocks of turn k, then fresh ids."""
    chat = DEFAULT_CHATBOT.model_copy(update={"rewrite_prob": 0.0})
    src = generate_sessions(small(agent_fraction=0.0, chatbot=chat), 1)
    seen_pairs = 0
    for rows in by_session(src).values():
        for prev, cur in itertools.pairwise(rows):
            full = int(src.input_len[prev]) // src.block_tokens
            assert np.array_equal(src.blocks(cur)[:full], src.blocks(prev)[:full])
            assert src.blocks(cur)[full] not in set(src.blocks(prev).tolist())
            seen_pairs += 1
    assert seen_pairs > 100


def test_every_new_block_is_fresh_and_every_kept_block_a_prefix() -> None:
    """With rewrites and compactions on, each request = a prefix of its predecessor's ids
    (at least the system prompt's) + ids never seen before anywhere."""
    agent = DEFAULT_AGENT.model_copy(
        update={
            "max_context": 40_000,
            "system_prompt_tokens": LogNormalMix(median=8000, sigma=0.5, low=2000, high=16_000),
            "compact_tokens": LogNormalMix(median=3000, sigma=0.5, low=100, high=8000),
            "rewrite_prob": 0.3,
        }
    )
    src = generate_sessions(small(days=1, agent_fraction=0.5, agent=agent), 2)
    row = np.repeat(np.arange(len(src)), src.n_blocks)
    ids, first = np.unique(src.block_hashes, return_index=True)
    first_row = dict(zip(ids.tolist(), row[first].tolist(), strict=True))
    for rows in by_session(src).values():
        for prev, cur in itertools.pairwise(rows):
            a, b = src.blocks(prev), src.blocks(cur)
            m = 0
            while m < min(len(a), len(b)) and a[m] == b[m]:
                m += 1
            assert m >= 1  # the system prompt's shared blocks at least
            assert m <= int(src.input_len[prev]) // src.block_tokens  # never the partial block
            assert all(first_row[h] == cur for h in b[m:].tolist())


def test_partial_last_blocks_are_never_reused(default_small: RequestSource) -> None:
    src = default_small
    last = src.block_offsets[1:] - 1
    partial = last[src.input_len % src.block_tokens != 0]
    ids, counts = np.unique(src.block_hashes, return_counts=True)
    count_of = dict(zip(ids.tolist(), counts.tolist(), strict=True))
    assert counts.max() > 1  # there is reuse at all
    assert all(count_of[h] == 1 for h in src.block_hashes[partial].tolist())


def test_an_id_names_one_position_of_one_prefix(default_small: RequestSource) -> None:
    src = default_small
    position = np.arange(len(src.block_hashes)) - np.repeat(src.block_offsets[:-1], src.n_blocks)
    ids, inverse = np.unique(src.block_hashes, return_inverse=True)
    lo = np.full(len(ids), np.iinfo(np.int64).max)
    hi = np.full(len(ids), -1)
    np.minimum.at(lo, inverse, position)
    np.maximum.at(hi, inverse, position)
    assert np.array_equal(lo, hi)


def test_system_prompt_blocks_are_shared_across_sessions(default_small: RequestSource) -> None:
    src = default_small
    for code, params in ((0, DEFAULT_CHATBOT), (1, DEFAULT_AGENT)):
        rows = np.flatnonzero(src.traffic_class == code)
        first_ids = src.block_hashes[src.block_offsets[rows]]
        sessions_per_id = {
            h: len(set(src.session_id[rows][first_ids == h].tolist())) for h in set(first_ids)
        }
        assert len(sessions_per_id) <= params.system_prompts
        assert max(sessions_per_id.values()) > 10


def test_agent_system_prompts_span_several_shared_blocks(default_small: RequestSource) -> None:
    src = default_small
    rows = np.flatnonzero(src.traffic_class == 1)
    third = src.block_hashes[src.block_offsets[rows] + 2]  # agent prompts are >= 2,000 tokens
    assert len(set(third.tolist())) <= DEFAULT_AGENT.system_prompts


def test_diurnal_curve_has_the_configured_peak_and_valley() -> None:
    cfg = small(peak_to_valley=4.0, peak_hour=15.0)
    rate = diurnal_rate(cfg, np.array([15.0, 3.0, 39.0]))
    assert rate[0] / rate[1] == pytest.approx(4.0)
    assert rate[2] == pytest.approx(rate[0])
    assert diurnal_rate(cfg, np.linspace(0, 24, 2401)[:-1]).mean() == pytest.approx(1.0)
    weights = tuple(float(h == 9) + 1.0 for h in range(24))
    stepped = diurnal_rate(small(hourly_weights=weights), np.array([9.5, 10.5]))
    assert stepped[0] / stepped[1] == pytest.approx(2.0)


def test_more_sessions_start_at_peak_than_at_valley() -> None:
    cfg = small(days=4, sessions_per_day=3000, agent_fraction=0.0, peak_to_valley=4.0)
    src = generate_sessions(cfg, 4)
    _, first = np.unique(src.session_id, return_index=True)  # rows are in arrival order
    starts = src.arrival_s[first]
    hour = (starts % DAY) // 3600
    peak, valley = int((hour == 15).sum()), int((hour == 3).sum())
    assert peak > 2.5 * valley > 0


def test_class_mix_is_the_share_of_sessions() -> None:
    src = generate_sessions(small(days=3, sessions_per_day=2000, agent_fraction=0.25), 6)
    sessions, first = np.unique(src.session_id, return_index=True)
    agent = int(src.traffic_class[first].sum())
    assert agent / len(sessions) == pytest.approx(0.25, abs=0.02)
    only_chat = generate_sessions(small(agent_fraction=0.0), 6)
    assert np.all(only_chat.traffic_class == 0)


def test_agent_context_stays_under_the_cap_by_compacting() -> None:
    agent = DEFAULT_AGENT.model_copy(
        update={
            "max_context": 60_000,
            "system_prompt_tokens": LogNormalMix(median=8000, sigma=0.5, low=2000, high=16_000),
            "compact_tokens": LogNormalMix(median=5000, sigma=0.5, low=100, high=10_000),
        }
    )
    src = generate_sessions(small(agent_fraction=1.0, agent=agent), 2)
    assert src.input_len.max() <= 60_000
    drops = 0
    for rows in by_session(src).values():
        drops += int(np.sum(np.diff(src.input_len[rows]) < 0))
    assert drops > 0  # some sessions compacted and went on


def test_chatbot_sessions_end_at_their_cap() -> None:
    chat = DEFAULT_CHATBOT.model_copy(update={"max_context": 20_000})
    src = generate_sessions(small(agent_fraction=0.0, chatbot=chat), 2)
    assert src.input_len.max() <= 20_000
    for rows in by_session(src).values():
        assert np.all(np.diff(src.input_len[rows]) > 0)  # "end" never shrinks a context


def test_default_agent_contexts_grow_long_but_within_one_million() -> None:
    src = generate_sessions(small(days=1, sessions_per_day=1000, agent_fraction=1.0), 9)
    assert src.input_len.max() <= DEFAULT_AGENT.max_context
    assert np.percentile(src.input_len, 99) > 100_000
    assert np.median(src.output_len) < 400


def session_gaps(src: RequestSource, code: int) -> np.ndarray:
    """Gaps between consecutive requests of the same session, for sessions of class ``code``."""
    gaps = [
        np.diff(src.arrival_s[rows])
        for rows in by_session(src).values()
        if src.traffic_class[rows[0]] == code
    ]
    return np.concatenate([np.zeros(0), *gaps])


def test_chatbots_return_after_days_and_agents_rarely() -> None:
    src = generate_sessions(small(days=10, sessions_per_day=200, agent_fraction=0.5), 11)
    chat, agent = session_gaps(src, 0), session_gaps(src, 1)
    assert (chat > DAY).sum() > 20
    assert chat.max() > 3 * DAY
    assert (chat > DAY).mean() > 10 * (agent > DAY).mean()
    assert np.median(agent) < 60 < np.median(chat)
    never = DEFAULT_CHATBOT.model_copy(update={"return_prob": 0.0})
    src = generate_sessions(small(days=3, agent_fraction=0.0, chatbot=never), 11)
    assert session_gaps(src, 0).max() <= 3600 + 2000 / 40


def test_agents_reuse_more_than_chatbots_and_ttls_cut_hits() -> None:
    src = generate_sessions(small(days=5, sessions_per_day=100), 12)
    week = {"chatbot": 7 * DAY, "agent": 3 * DAY}
    frame = ttl_sweep(src, [0.0, 3600.0, math.inf], class_ttl=week).frame
    uniform = frame[frame["policy"] == "ttl"].set_index(["ttl_s", "traffic_class"])["hit_tokens"]
    per_class = frame[frame["policy"] == "class_ttl"].set_index("traffic_class")["hit_tokens"]
    assert uniform[(0.0, ALL)] == 0
    assert uniform[(3600.0, ALL)] < per_class[ALL] <= uniform[(math.inf, ALL)]
    rates = frame[frame["ttl_s"] == math.inf].set_index("traffic_class")["hit_rate"]
    assert 0 < rates["chatbot"] < rates["agent"] < 1
    assert rates["chatbot"] < rates[ALL] < rates["agent"]


def test_an_empty_workload_is_a_valid_empty_source() -> None:
    src = generate_sessions(small(days=0.001, sessions_per_day=1.0), 0)
    assert len(src) == 0
    src.validate()
    assert int(src.prefix_hit_tokens().sum()) == 0


@pytest.mark.parametrize(
    "change",
    [
        {"days": 0},
        {"days": 400},
        {"sessions_per_day": -1},
        {"agent_fraction": 1.5},
        {"peak_to_valley": 0.5},
        {"peak_hour": 24},
        {"hourly_weights": (1.0,) * 23},
        {"hourly_weights": (0.0,) * 24},
        {"block_tokens": 0},
        {"seed": 3},
        {"chatbot": {"return_prob": 1.0}},
        {"chatbot": {"turn_message": {"median": 10, "sigma": 1, "low": 0}}},
        {"chatbot": {"output": {"median": 10, "sigma": -1}}},
        {"chatbot": {"output": {"median": 10, "sigma": 1, "low": 50, "high": 20}}},
        {"chatbot": {"rewrite_keep": {"median": 0.5, "sigma": 1, "high": 2}}},
        {"agent": {"max_context": 10_000}},
        {"agent": {"on_overflow": "truncate"}},
    ],
)
def test_bad_config_values_are_refused(change: dict[str, object]) -> None:
    data = SessionWorkload().model_dump()
    for key, value in change.items():
        if isinstance(value, dict):
            data[key] = data[key] | value
        else:
            data[key] = value
    with pytest.raises(ValidationError):
        SessionWorkload.model_validate(data)


def test_config_is_frozen_and_documented() -> None:
    cfg = SessionWorkload()
    with pytest.raises(ValidationError):
        cfg.__setattr__("days", 3)  # the point: it is frozen
    for model in (SessionWorkload, SessionClass, LogNormalMix):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
