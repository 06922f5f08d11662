"""Decode KV admission policies, each driven directly with a few numpy arrays: no cluster, no
decode group. A rank's capacity is in KV tokens; every sequence also reserves a fixed overhead.
"""

from __future__ import annotations

import numpy as np
import pytest

from deepinfer_sim.errors import ConfigError
from deepinfer_sim.sim.policies.kv_admission import (
    KvAdmission,
    PreemptNewest,
    ReserveWholeContext,
    make_kv_admission,
)

OVERHEAD = 10.0


def slots(rank, k0, ctx, req=None):
    """Per-slot arrays as the decode group keeps them (request id -1: a hole)."""
    rank = np.asarray(rank, dtype=np.int64)
    req = np.arange(rank.size, dtype=np.int64) if req is None else np.asarray(req, np.int64)
    return rank, req, np.asarray(k0, dtype=np.int64), np.asarray(ctx, dtype=np.int64)


def test_reserve_holds_the_whole_context_and_refuses_what_would_not_fit():
    """A request of 1,000 prompt + 500 output tokens, 1,200 of them held so far, reserves all
    1,500 (and the overhead): on a rank with 1,400 free it waits, though what it holds would
    fit."""
    kv = ReserveWholeContext(OVERHEAD)
    need = kv.reservation(1200, 1500)
    assert need == 1500 + OVERHEAD
    assert not kv.fits(600.0, need, 2000.0)
    assert kv.fits(2000.0 - need, need, 2000.0)  # exactly full is allowed


def test_reserve_never_grows_nor_preempts():
    kv = ReserveWholeContext(OVERHEAD)
    reserved = np.array([100.0, 200.0])
    kv.grow(reserved, np.array([3.0, 4.0]))
    assert reserved.tolist() == [100.0, 200.0]
    # even a rank past its capacity (which admission never lets happen) drops nothing
    drop = kv.victims(np.array([5000.0, 0.0]), 1000.0, *slots([0, 0], [0, 1], [400, 400]))
    assert drop.size == 0


def test_preempt_admits_on_the_current_context():
    """The same request as above reserves only the 1,200 tokens it holds, so it is admitted."""
    kv = PreemptNewest(OVERHEAD)
    need = kv.reservation(1200, 1500)
    assert need == 1200 + OVERHEAD
    assert kv.fits(600.0, need, 2000.0)


def test_preempt_grows_by_the_tokens_each_rank_gained():
    kv = PreemptNewest(OVERHEAD)
    reserved = np.array([100.0, 200.0, 0.0])
    kv.grow(reserved, np.array([3.0, 0.0, 5.0]))
    assert reserved.tolist() == [103.0, 200.0, 5.0]


def test_preempt_drops_nothing_while_every_rank_fits():
    kv = PreemptNewest(OVERHEAD)
    drop = kv.victims(np.array([1000.0, 999.0]), 1000.0, *slots([0, 1], [0, 0], [990, 989]))
    assert drop.size == 0


def test_an_overflowing_rank_drops_its_newest_sequences_until_the_rest_fit():
    """Rank 0 holds four sequences admitted at steps 0, 3, 1, 2 (slot order) and is 250 tokens
    over: dropping the newest (step 3: 100 + overhead) is not enough, the next newest (step 2)
    brings it back. Rank 1 fits and loses nothing; the hole (request -1) on rank 0 is skipped
    even though it looks newest."""
    kv = PreemptNewest(OVERHEAD)
    rank, req, k0, ctx = slots(
        [0, 0, 1, 0, 0, 0], [0, 3, 0, 1, 2, 9], [500, 100, 300, 400, 200, 0], [0, 1, 2, 3, 4, -1]
    )
    capacity = 1000.0
    reserved = np.array([capacity + 250.0, 310.0])
    drop = kv.victims(reserved, capacity, rank, req, k0, ctx)
    assert drop.tolist() == [1, 4]  # newest first
    assert reserved[0] - (ctx[drop] + OVERHEAD).sum() <= capacity
    assert reserved.tolist() == [capacity + 250.0, 310.0]  # the group releases them, not this


def test_overflowing_ranks_come_in_rank_order_and_may_lose_everything():
    """Rank 1 is over by more than all it holds: every sequence goes, newest first (ties in
    admission step keep slot order); rank 0's victims come first."""
    kv = PreemptNewest(OVERHEAD)
    rank, req, k0, ctx = slots([1, 0, 1, 1, 0], [4, 0, 7, 4, 5], [50, 600, 50, 50, 100])
    drop = kv.victims(np.array([800.0, 10_000.0]), 700.0, rank, req, k0, ctx)
    assert drop.tolist() == [4, 2, 0, 3]


@pytest.mark.parametrize("policy", [ReserveWholeContext, PreemptNewest])
def test_a_dropped_sequence_recomputes_its_whole_context(policy):
    assert policy(OVERHEAD).recompute(1234) == (1234, 0)


def test_the_registry_resolves_the_config_tags_and_refuses_others():
    kv: KvAdmission = make_kv_admission("reserve", OVERHEAD)
    assert type(kv) is ReserveWholeContext and kv.seq_overhead == OVERHEAD
    assert type(make_kv_admission("preempt", 0.0)) is PreemptNewest
    with pytest.raises(ConfigError, match=r"kv_policy.*'evict_all'"):
        make_kv_admission("evict_all", 0.0)
