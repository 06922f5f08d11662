"""Block ids are kept in 4 bytes when every one fits, and nothing downstream sees it: the same
values come out of ``blocks()`` as int64, merges and tiles keep them exact, and a run gives the
same results as with the ids in 8 bytes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from deepinfer_sim import load_scenario, simulate
from deepinfer_sim.traces.source import RequestSource
from deepinfer_sim.traces.workload import build_source, tile


def _source(ids: np.ndarray, n: int = 4, block_tokens: int = 16) -> RequestSource:
    per = len(ids) // n
    return RequestSource.from_columns(
        arrival_s=np.arange(n, dtype=float),
        input_len=np.full(n, per * block_tokens),
        output_len=np.full(n, 3),
        block_offsets=np.arange(n + 1) * per,
        block_hashes=ids,
        block_tokens=block_tokens,
    )


@pytest.mark.parametrize(
    ("low", "high", "dtype"),
    [
        (0, 10, np.int32),
        (-(2**31), 2**31 - 1, np.int32),
        (0, 2**31, np.int64),
        (-(2**31) - 1, 0, np.int64),
        (-(2**62), 2**62, np.int64),
    ],
)
def test_ids_take_four_bytes_only_when_every_one_fits(low: int, high: int, dtype: type) -> None:
    ids = np.array([low, 1, 2, high, 3, 4, 5, 6], dtype=np.int64)
    src = _source(ids)
    assert src.block_hashes.dtype == dtype
    got = np.concatenate([src.blocks(i) for i in range(len(src))])
    assert got.dtype == np.int64 and got.tolist() == ids.tolist()
    assert not src.blocks(0).flags.writeable or src.block_hashes.dtype == np.int32


def test_given_int32_ids_are_kept_without_a_copy_when_asked() -> None:
    ids = np.arange(8, dtype=np.int32)
    src = RequestSource.from_columns(
        arrival_s=np.arange(4.0),
        input_len=np.full(4, 32),
        output_len=np.full(4, 3),
        block_offsets=np.arange(5) * 2,
        block_hashes=ids,
        block_tokens=16,
        copy=False,
    )
    assert src.block_hashes is ids


def test_merge_and_tile_keep_the_values_and_widen_only_past_int32() -> None:
    a = _source(np.arange(8, dtype=np.int64) + 5)  # ids 5..12: shifted to 0..7
    b = _source(np.arange(8, dtype=np.int64) * 3)  # ids 0..21: shifted to 8..29
    merged = RequestSource.merge(a, b)
    assert merged.block_hashes.dtype == np.int32
    assert sorted(merged.block_hashes.tolist()) == sorted(
        [*range(8), *(8 + 3 * k for k in range(8))]
    )
    top = _source(np.array([0, 2**31 - 1] * 4, dtype=np.int64))  # in int32 on its own
    wide = RequestSource.merge(a, top)
    assert top.block_hashes.dtype == np.int32 and wide.block_hashes.dtype == np.int64
    assert sorted(set(wide.block_hashes.tolist())) == [*range(8), 8, 2**31 + 7]
    tiled = tile(a, 3, 10.0)
    assert tiled.block_hashes.dtype == np.int32
    assert sorted(tiled.block_hashes.tolist()) == list(range(24))  # each copy its own ids


def test_a_run_is_the_same_with_the_ids_in_eight_bytes() -> None:
    sc = load_scenario("default", ["workload.max_requests=60", "workload.repeat=1"])

    narrow = build_source(sc.workload, sc.seed)
    assert narrow.block_hashes.dtype == np.int32
    wide = dataclasses.replace(narrow, block_hashes=narrow.block_hashes.astype(np.int64))
    wide.validate()
    one, two = simulate(sc, narrow), simulate(sc, wide)
    for summary in (one.summary, two.summary):
        summary["sim"].pop("wall_s")
    assert one.summary == two.summary
    assert one.requests.equals(two.requests)
    assert one.summary["cache"]["hit_tokens"] > 0  # the ids were looked up, and matched


def test_a_run_forgets_the_ids_only_of_a_source_it_built() -> None:
    """``simulate`` drops the block ids of the workload it built before assembling the results
    (the run's memory peak at a million requests); a source handed to it is left whole, and the
    results are the same either way."""
    sc = load_scenario("default", ["workload.max_requests=60", "workload.repeat=1"])
    given = build_source(sc.workload, sc.seed)
    ids = given.block_hashes.copy()
    own, handed = simulate(sc), simulate(sc, given)
    np.testing.assert_array_equal(given.block_hashes, ids)
    given.validate()
    for summary in (own.summary, handed.summary):
        summary["sim"].pop("wall_s")
    assert own.summary == handed.summary
    assert own.requests.equals(handed.requests)
    assert own.summary["cache"]["hit_tokens"] > 0


def test_a_forgotten_source_has_no_blocks_and_keeps_the_rest() -> None:
    src = _source(np.arange(8, dtype=np.int64))
    classes, lengths = src.traffic_class.copy(), src.input_len.copy()
    src.forget_blocks()
    assert len(src.block_hashes) == 0 and src.block_hashes.dtype == np.int32
    assert all(len(src.blocks(i)) == 0 for i in range(len(src)))
    np.testing.assert_array_equal(src.traffic_class, classes)
    np.testing.assert_array_equal(src.input_len, lengths)
