"""Outputs assembled without per-row objects or whole-frame copies: the time-series column log,
the row-group parquet writer, the level-at-a-time range maximum, and the source's chunked
block-id gathers and merges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from deepinfer_sim.sim.results import result as result_mod
from deepinfer_sim.sim.results.itl import range_max
from deepinfer_sim.sim.results.timeseries import ColumnLog
from deepinfer_sim.traces import source as source_mod
from deepinfer_sim.traces.source import RequestSource


def test_column_log_infers_dtypes_as_pandas_does_from_rows() -> None:
    rows = [
        {"t": 1.0, "n": 3, "flip": 1, "ok": True, "i": np.int64(2)},
        {"t": 2.0, "n": 4, "flip": 0.5, "ok": False, "i": np.int64(5)},
        {"t": 3.0, "n": 5, "flip": float("nan"), "ok": True, "i": np.int64(7)},
    ]
    log = ColumnLog()
    for row in rows:
        log.append(row)
    got, want = log.table().to_pandas(), pd.DataFrame(rows)
    pd.testing.assert_frame_equal(got, want)
    assert log.column("n").tolist() == [3, 4, 5]
    assert ColumnLog().table().to_pandas().equals(pd.DataFrame([]))


def test_parquet_is_written_a_row_group_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(result_mod, "_ROW_GROUP", 7)
    n = 50
    frame = pd.DataFrame(
        {
            "x": np.arange(n, dtype=float),
            "c": pd.Categorical.from_codes(
                np.arange(n, dtype=np.int8) % 3, pd.Index(["a", "b", "c"])
            ),
            "k": np.arange(n) * 2,
        }
    )
    result_mod.write_parquet(frame, tmp_path / "f.parquet")
    back = pd.read_parquet(tmp_path / "f.parquet")
    pd.testing.assert_frame_equal(back, frame)
    assert not list(tmp_path.glob(".*.tmp"))


def test_range_max_matches_a_loop() -> None:
    rng = np.random.default_rng(3)
    values = rng.random(1000)
    lo = rng.integers(0, 1000, 400)
    hi = np.minimum(999, lo + rng.integers(0, 600, 400))
    want = [values[a : b + 1].max() for a, b in zip(lo, hi, strict=True)]
    assert range_max(values, lo, hi).tolist() == want
    assert range_max(values, lo[:0], hi[:0]).size == 0


def source(n: int, seed: int, block_tokens: int = 4) -> RequestSource:
    rng = np.random.default_rng(seed)
    inputs = rng.integers(1, 40, n)
    counts = -(-inputs // block_tokens)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return RequestSource.from_columns(
        arrival_s=np.sort(rng.random(n) * 10),
        input_len=inputs,
        output_len=rng.integers(1, 9, n),
        block_offsets=offsets,
        block_hashes=rng.integers(-50, 500, int(offsets[-1])),
        block_tokens=block_tokens,
        session_id=rng.integers(-1, 5, n),
    )


def blocks(src: RequestSource) -> list[list[int]]:
    return [src.blocks(i).tolist() for i in range(len(src))]


def test_gathers_and_merges_in_small_chunks_match_whole_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = source(60, 1), source(45, 2)
    whole_select = blocks(a.select([5, 3, 3, 40]))
    whole_merge = RequestSource.merge(a, b)
    monkeypatch.setattr(source_mod, "_CHUNK_REFS", 5)
    assert blocks(a.select([5, 3, 3, 40])) == whole_select
    assert blocks(a.head(7)) == blocks(a)[:7]
    merged = RequestSource.merge(a, b)
    assert blocks(merged) == blocks(whole_merge)
    # by hand: rows interleave by arrival (ties: a first), b's ids shifted past a's
    rows = sorted(
        [(t, 0, i) for i, t in enumerate(a.arrival_s)]
        + [(t, 1, i) for i, t in enumerate(b.arrival_s)]
    )
    a_top = int(a.block_hashes.max()) - int(a.block_hashes.min()) + 1
    want = [
        [h - int(a.block_hashes.min()) for h in a.blocks(i).tolist()]
        if k == 0
        else [h - int(b.block_hashes.min()) + a_top for h in b.blocks(i).tolist()]
        for _, k, i in rows
    ]
    assert blocks(merged) == want
    merged.validate()
