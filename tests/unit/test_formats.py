"""More trace formats (BurstGPT, Qwen-Bailian, Vidur, TraceLab), native parquet, trace stats.

Like the Mooncake and Azure readers, these readers promise three things, and the tests below
are their documentation: valid rows read back as exactly the requests written (sorted stably by
arrival), every malformed row is a ``TraceError`` naming the file, the line and the field, and
no row is ever dropped. The native parquet format round-trips a source bit for bit.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import assert_same_source
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_sim.errors import TraceError
from deepinfer_sim.traces import RequestSource, read_trace
from deepinfer_sim.traces._files import FORMATS, SERVEGEN, sniff_format
from deepinfer_sim.traces.readers import (
    PARQUET_METADATA_KEY,
    QWEN_BLOCK_TOKENS,
    read_burstgpt,
    read_parquet,
    read_qwen,
    read_tracelab,
    read_vidur,
    write_parquet,
)
from deepinfer_sim.traces.stats import lru_prefix_hit_tokens, trace_stats

SHARED = Path(__file__).parents[2] / ".." / "shared" / "traces"
TRACELAB = SHARED / "tracelab_example" / "round_trace.jsonl"
SERVEGEN_DIR = SHARED / "servegen_mm_image"


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def block_lists(source: RequestSource) -> list[list[int]]:
    return [source.blocks(i).tolist() for i in range(len(source))]


def broken(path: Path, read: Any, line: int, expected: str) -> None:
    """``read(path)`` fails at ``path:line`` with ``expected`` in the message."""
    with pytest.raises(TraceError) as info:
        read(path)
    assert info.value.line == line, str(info.value)
    assert str(info.value).startswith(f"{path}:{line}: "), str(info.value)
    assert expected in str(info.value)


# ------------------------------------------------------------------------ BurstGPT

BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def burst_row(ts: Any = 5, request: Any = 472, response: Any = 18) -> str:
    total = request + response if isinstance(request, int) and isinstance(response, int) else 0
    return f"{ts},ChatGPT,{request},{response},{total},Conversation log"


def test_burstgpt_keeps_timestamps_and_sorts_stably(tmp_path):
    """``Timestamp`` is already seconds from the trace start: it is kept, only sorted."""
    path = write_lines(
        tmp_path / "b.csv",
        [BURST_HEADER, burst_row(9.5, 10, 1), burst_row(2, 1025, 2), burst_row(9.5, 3, 3)],
    )
    source = read_burstgpt(path)
    assert source.arrival_s.tolist() == [2.0, 9.5, 9.5]
    assert source.input_len.tolist() == [1025, 10, 3]
    assert source.output_len.tolist() == [2, 1, 3]
    assert source.n_blocks.tolist() == [3, 1, 1]
    assert len(np.unique(source.block_hashes)) == 5  # lengths only: no shared prefix
    assert source.class_names == ("chatbot",) and source.name == "b"


BURST_BROKEN = {
    "text length": (burst_row(request="many"), "column 'Request tokens': expected an integer"),
    "float length": (burst_row(response="1.5"), "column 'Response tokens': expected an integer"),
    "negative length": (burst_row(request=-3), "column 'Request tokens': must be >= 1"),
    "zero response": (burst_row(response=0), "column 'Response tokens': must be >= 1"),
    "negative time": (burst_row(ts=-1), "column 'Timestamp': must be >= 0"),
    "text time": (burst_row(ts="noon"), "column 'Timestamp': expected a finite number"),
    "nan time": (burst_row(ts="nan"), "column 'Timestamp': expected a finite number"),
    "far time": (burst_row(ts=1e300), "column 'Timestamp': must be at most 1e+09 s"),
    "missing cells": ("7,ChatGPT", "column 'Request tokens': expected an integer"),
    "blank line": ("", "expected"),
}


@pytest.mark.parametrize(("bad_row", "expected"), BURST_BROKEN.values(), ids=BURST_BROKEN)
def test_a_broken_burstgpt_row_names_file_line_and_column(tmp_path, bad_row, expected):
    path = write_lines(tmp_path / "b.csv", [BURST_HEADER, burst_row(), bad_row, burst_row(9)])
    broken(path, read_burstgpt, 3, expected)


def test_burstgpt_failed_requests_can_count_as_one_token(tmp_path):
    """The files with failures have 0 response tokens; ``zero_output="one"`` keeps them."""
    path = write_lines(tmp_path / "b.csv", [BURST_HEADER, burst_row(response=0)])
    assert read_burstgpt(path, zero_output="one").output_len.tolist() == [1]
    with pytest.raises(ValueError, match="zero_output"):
        read_burstgpt(path, zero_output="drop")


def test_burstgpt_header_problems_point_at_line_one(tmp_path):
    path = write_lines(tmp_path / "b.csv", ["Timestamp,Model,Request tokens", "1,x,5"])
    broken(path, read_burstgpt, 1, "'Response tokens'")
    with pytest.raises(TraceError, match="no requests"):
        read_burstgpt(write_lines(tmp_path / "h.csv", [BURST_HEADER]))
    with pytest.raises(TraceError, match="empty"):
        read_burstgpt(write_lines(tmp_path / "e.csv", []))


burst_rows = st.lists(
    st.tuples(
        st.floats(0, 1e8, allow_nan=False, allow_infinity=False),
        st.integers(1, 50_000),
        st.integers(1, 5_000),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None)
@given(rows=burst_rows)
def test_valid_burstgpt_rows_round_trip(tmp_path_factory, rows):
    """Any valid rows read back as the same requests, exact times, sorted stably."""
    lines = [BURST_HEADER, *(burst_row(repr(t), i, o) for t, i, o in rows)]
    source = read_burstgpt(write_lines(tmp_path_factory.mktemp("b") / "t.csv", lines))
    order = sorted(range(len(rows)), key=lambda k: rows[k][0])
    assert source.arrival_s.tolist() == [rows[k][0] for k in order]
    assert source.input_len.tolist() == [rows[k][1] for k in order]
    assert source.output_len.tolist() == [rows[k][2] for k in order]


# ------------------------------------------------------------------------ Vidur

VIDUR_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens"


def test_vidur_reads_its_trace_csv_and_ignores_extra_columns(tmp_path):
    path = write_lines(
        tmp_path / "v.csv",
        [VIDUR_HEADER + ",note", "4.314579,396,109,a", "0.0,374,44,b", "4.314579,1,1,c"],
    )
    source = read_vidur(path, traffic_class="batch")
    assert source.arrival_s.tolist() == [0.0, 4.314579, 4.314579]
    assert source.input_len.tolist() == [374, 396, 1]
    assert source.output_len.tolist() == [44, 109, 1]
    assert source.class_names == ("batch",)


VIDUR_BROKEN = {
    "text length": ("1.0,lots,3", "column 'num_prefill_tokens': expected an integer"),
    "negative length": ("1.0,3,-2", "column 'num_decode_tokens': must be >= 1"),
    "zero length": ("1.0,0,2", "column 'num_prefill_tokens': must be >= 1"),
    "missing time": (",3,2", "column 'arrived_at': expected a finite number"),
    "inf time": ("inf,3,2", "column 'arrived_at': expected a finite number"),
    "far time": ("1e300,3,2", "column 'arrived_at': must be at most 1e+09 s (31.7 years)"),
}


@pytest.mark.parametrize(("bad_row", "expected"), VIDUR_BROKEN.values(), ids=VIDUR_BROKEN)
def test_a_broken_vidur_row_names_file_line_and_column(tmp_path, bad_row, expected):
    path = write_lines(tmp_path / "v.csv", [VIDUR_HEADER, "0,1,1", "1,2,2", bad_row])
    broken(path, read_vidur, 4, expected)


def test_vidur_needs_its_three_columns(tmp_path):
    path = write_lines(tmp_path / "v.csv", ["Time,PromptTokenCount,CompletionTokenCount", "0,1,1"])
    broken(path, read_vidur, 1, "missing column(s) ['arrived_at', 'num_prefill_tokens'")


@settings(max_examples=40, deadline=None)
@given(rows=burst_rows)
def test_valid_vidur_rows_round_trip(tmp_path_factory, rows):
    lines = [VIDUR_HEADER, *(f"{t!r},{i},{o}" for t, i, o in rows)]
    source = read_vidur(write_lines(tmp_path_factory.mktemp("v") / "t.csv", lines))
    order = sorted(range(len(rows)), key=lambda k: rows[k][0])
    assert source.arrival_s.tolist() == [rows[k][0] for k in order]
    assert source.input_len.tolist() == [rows[k][1] for k in order]
    assert source.output_len.tolist() == [rows[k][2] for k in order]


# ------------------------------------------------------------------------ Qwen-Bailian


def qwen_row(
    chat: Any = 0,
    parent: Any = -1,
    ts: Any = 0.0,
    input_length: Any = 40,
    output_length: Any = 5,
    hash_ids: Any = None,
    **extra: Any,
) -> str:
    if hash_ids is None:
        count = -(-input_length // QWEN_BLOCK_TOKENS) if isinstance(input_length, int) else 3
        hash_ids = [1000 * chat + k for k in range(count)]
    row = {
        "chat_id": chat,
        "parent_chat_id": parent,
        "timestamp": ts,
        "input_length": input_length,
        "output_length": output_length,
        "type": "text",
        "turn": 1,
        "hash_ids": hash_ids,
    }
    row.update(extra)
    return json.dumps({k: v for k, v in row.items() if v is not ...})


def test_qwen_blocks_sessions_and_classes(tmp_path):
    """16-token blocks keep their ids; sessions are the root of each ``parent_chat_id`` chain;
    ``type`` becomes the class (sorted names), ``chatbot`` where a row has none."""
    path = write_lines(
        tmp_path / "q.jsonl",
        [
            qwen_row(1, -1, 0.5, 40, hash_ids=[1, 2, 3], type="text"),
            qwen_row(2, 1, 9.0, 60, hash_ids=[1, 2, 3, 4], type="image", turn=2),
            qwen_row(7, -1, 0.1, 16, hash_ids=[9], type=...),
            qwen_row(3, 2, 12.0, 17, hash_ids=[1, 5], type="text", turn=3),
            qwen_row(8, 55, 12.0, 1, hash_ids=[6], type="file"),  # parent outside the file
        ],
    )
    source = read_qwen(path)
    assert source.block_tokens == 16
    assert source.arrival_s.tolist() == [0.1, 0.5, 9.0, 12.0, 12.0]
    assert block_lists(source) == [[9], [1, 2, 3], [1, 2, 3, 4], [1, 5], [6]]
    assert source.session_id.tolist() == [7, 1, 1, 1, 55]
    assert source.class_names == ("chatbot", "file", "image", "text")
    names = [source.class_names[c] for c in source.traffic_class]
    assert names == ["chatbot", "text", "image", "text", "file"]
    assert source.prefix_hit_tokens().tolist() == [0, 0, 48, 16, 0]
    assert read_qwen(path, traffic_class="chatbot").class_names == ("chatbot",)


def test_qwen_ids_that_are_not_chained_are_rechained(tmp_path):
    """An id seen after two different predecessors is a per-block hash, not a prefix hash:
    ids are then rebuilt so that a block is shared only with its whole prefix."""
    path = write_lines(
        tmp_path / "q.jsonl",
        [
            qwen_row(1, ts=0, input_length=32, hash_ids=[7, 8]),
            qwen_row(2, ts=1, input_length=32, hash_ids=[9, 8]),
            qwen_row(3, ts=2, input_length=48, hash_ids=[7, 8, 8]),
        ],
    )
    lists = block_lists(read_qwen(path))
    assert lists[0][0] == lists[2][0] and lists[0][1] == lists[2][1]  # same prefix [7, 8]
    assert lists[1][1] != lists[0][1]  # block 8 after 9 is another prefix
    assert len({lists[2][1], lists[2][2]}) == 2
    assert len(np.unique(np.concatenate([np.asarray(x) for x in lists]))) == 5


def _qwen_variant(**change: Any) -> str:
    return qwen_row(5, **change)


QWEN_BROKEN = {
    "bad JSON": ('{"chat_id": 5,', "invalid JSON"),
    "not an object": ("[5]", "expected a JSON object"),
    "missing field": (
        json.dumps({"chat_id": 5, "parent_chat_id": -1, "timestamp": 1}),
        "missing field 'input_length'",
    ),
    "string length": (_qwen_variant(input_length="40"), "'input_length': expected an integer"),
    "negative output": (_qwen_variant(output_length=-1), "'output_length': must be >= 1"),
    "zero output": (_qwen_variant(output_length=0), "'output_length': must be >= 1"),
    "string time": (_qwen_variant(ts="1.5"), "'timestamp': expected a number"),
    "negative time": (_qwen_variant(ts=-0.5), "'timestamp': must be finite and >= 0"),
    "far time": (_qwen_variant(ts=1e300), "'timestamp': must be at most 1e+09 s"),
    "bad parent": (_qwen_variant(parent=-2), "'parent_chat_id': must be >= -1"),
    "own parent": (_qwen_variant(parent=5), "cannot be its own parent"),
    "hash count": (_qwen_variant(input_length=33, hash_ids=[1, 2]), "ceil(33/16) = 3"),
    "hash type": (_qwen_variant(hash_ids=[1, 2.0, 3]), "'hash_ids'[1]: expected an integer"),
    "bad type": (_qwen_variant(type=3), "'type': expected a non-empty string"),
    "bad turn": (_qwen_variant(turn=0), "'turn': must be >= 1"),
    "conflicting parent": (qwen_row(1, parent=4, ts=3.0), "chat 1 has parent 4 here but -1"),
    "blank line": ("", "blank line"),
}


@pytest.mark.parametrize(("bad_row", "expected"), QWEN_BROKEN.values(), ids=QWEN_BROKEN)
def test_a_broken_qwen_row_names_file_line_and_field(tmp_path, bad_row, expected):
    path = write_lines(tmp_path / "q.jsonl", [qwen_row(1), qwen_row(2, 1, 1.0), bad_row])
    broken(path, read_qwen, 3, expected)


def test_a_qwen_parent_cycle_is_an_error(tmp_path):
    path = write_lines(tmp_path / "q.jsonl", [qwen_row(1, 2), qwen_row(2, 3), qwen_row(3, 1)])
    with pytest.raises(TraceError, match="form a cycle"):
        read_qwen(path)


@st.composite
def qwen_sessions(draw: Any) -> list[dict[str, Any]]:
    """Rows whose hash lists extend an earlier row's prefix (so ids are chained)."""
    n = draw(st.integers(1, 25))
    rows: list[dict[str, Any]] = []
    next_hash = 0
    for chat in range(n):
        input_length = draw(st.integers(1, 120))
        count = -(-input_length // 16)
        parent = draw(st.integers(-1, chat - 1)) if chat else -1
        base: list[int] = []
        if rows and draw(st.booleans()):
            base = rows[draw(st.integers(0, len(rows) - 1))]["hash_ids"]
        keep = base[: draw(st.integers(0, min(len(base), count)))]
        fresh = list(range(next_hash, next_hash + count - len(keep)))
        next_hash += len(fresh)
        rows.append(
            {
                "chat_id": chat * 3 + 1,
                "parent_chat_id": parent * 3 + 1 if parent >= 0 else -1,
                "timestamp": draw(st.integers(0, 20)) / 4,
                "input_length": input_length,
                "output_length": draw(st.integers(1, 100)),
                "type": draw(st.sampled_from(["text", "search", "image", "file"])),
                "hash_ids": keep + fresh,
            }
        )
    return rows


@settings(max_examples=50, deadline=None)
@given(rows=qwen_sessions())
def test_valid_qwen_rows_round_trip(tmp_path_factory, rows):
    """Chained ids are kept; every request lands in the session of its chain's root."""
    path = tmp_path_factory.mktemp("q") / "t.jsonl"
    write_lines(path, [json.dumps(r) for r in rows])
    source = read_qwen(path)
    order = sorted(range(len(rows)), key=lambda k: rows[k]["timestamp"])
    parent = {r["chat_id"]: r["parent_chat_id"] for r in rows}

    def root(chat: int) -> int:
        while parent[chat] != -1:
            chat = parent[chat]
        return chat

    assert source.arrival_s.tolist() == [rows[k]["timestamp"] for k in order]
    assert source.input_len.tolist() == [rows[k]["input_length"] for k in order]
    assert source.output_len.tolist() == [rows[k]["output_length"] for k in order]
    assert block_lists(source) == [rows[k]["hash_ids"] for k in order]
    assert source.session_id.tolist() == [root(rows[k]["chat_id"]) for k in order]
    names = [source.class_names[c] for c in source.traffic_class]
    assert names == [rows[k]["type"] for k in order]


@settings(max_examples=50, deadline=None)
@given(lists=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=12))
def test_rechained_ids_share_a_block_exactly_when_the_prefix_agrees(tmp_path_factory, lists):
    """Whatever the raw ids, block ``p`` of two requests is shared iff raw ids ``0..p`` agree."""
    rows = [
        qwen_row(k, ts=float(k), input_length=16 * len(h), hash_ids=h) for k, h in enumerate(lists)
    ]
    got = block_lists(read_qwen(write_lines(tmp_path_factory.mktemp("q") / "t.jsonl", rows)))
    for a in range(len(lists)):
        for b in range(len(lists)):
            for p in range(min(len(lists[a]), len(lists[b]))):
                same_prefix = lists[a][: p + 1] == lists[b][: p + 1]
                assert (got[a][p] == got[b][p]) == same_prefix


# ------------------------------------------------------------------------ TraceLab


def tracelab_row(
    session: str = "s1",
    round_index: int = 0,
    input_tokens: Any = 2000,
    prefix: Any = 0,
    output: Any = 10,
    events: Any = None,
) -> str:
    if events is None:
        events = [
            {"event_type": "user_message", "timestamp": "2026-06-01T05:40:20.000Z"},
            {"event_type": "text", "timestamp": "2026-06-01T05:40:29.000Z"},
        ]
    return json.dumps(
        {
            "session_id": session,
            "round_index": round_index,
            "input_tokens_total": input_tokens,
            "prefix_tokens": prefix,
            "output_tokens": output,
            "timing_events": events,
        }
    )


def events_at(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"event_type": kind, "timestamp": f"2026-06-01T{t}Z"} for kind, t in pairs]


def test_tracelab_arrivals_and_prefix_reuse(tmp_path):
    """A round is sent after its last input event; it reuses ``prefix_tokens // block`` blocks
    of the session's previous round (at most that round's full blocks)."""
    a1_events = [("tool_result", "00:00:10"), ("tool_result", "00:00:30"), ("text", "00:00:31")]
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            tracelab_row("a", 1, 2000, 1500, events=events_at(*a1_events)),
            tracelab_row("a", 0, 1200, 900, events=events_at(("user_message", "00:00:00"))),
            tracelab_row("b", 0, 600, 0, events=events_at(("reasoning", "00:00:05"))),
            tracelab_row("a", 2, 2100, 2050, events=events_at(("user_message", "00:01:00"))),
        ],
    )
    source = read_tracelab(path)
    assert source.arrival_s.tolist() == [0.0, 5.0, 30.0, 60.0]
    assert source.session_id.tolist() == [0, 1, 0, 0]
    first, other, second, third = block_lists(source)
    assert len(first) == 3 and len(second) == 4 and len(third) == 5
    assert second[:2] == first[:2] and second[2] not in first  # min(1500//512, 1200//512) = 2
    assert third[:3] == second[:3] and third[3] != second[3]  # min(2050//512, 2000//512) = 3
    assert not set(other) & set(first + second + third)
    assert source.class_names == ("agent",)
    assert source.prefix_hit_tokens().tolist() == [0, 0, 1024, 1536]


TRACELAB_BROKEN = {
    "prefix above input": (tracelab_row(prefix=2001), "'prefix_tokens': must be <= 2000"),
    "zero output": (tracelab_row(output=0), "'output_tokens': must be >= 1"),
    "string input": (tracelab_row(input_tokens="2000"), "'input_tokens_total': expected an int"),
    "duplicate round": (tracelab_row("s0", 0), "round 0 of this session is already on line 1"),
    "no events": (tracelab_row(events=[]), "'timing_events': expected a non-empty list"),
    "bad time": (
        tracelab_row(events=[{"event_type": "text", "timestamp": "yesterday"}]),
        "'timing_events[0].timestamp': expected an ISO 8601 time",
    ),
    "no event type": (
        tracelab_row(events=[{"timestamp": "2026-06-01T00:00:00Z"}]),
        "'timing_events[0].event_type': expected a string",
    ),
    "missing session": ('{"round_index": 0}', "missing field 'session_id'"),
    "centuries later": (
        tracelab_row(events=[{"event_type": "text", "timestamp": "2999-01-01T00:00:00Z"}]),
        "arrival 3.06919e+10 s after the first must be at most 1e+09 s",
    ),
}


@pytest.mark.parametrize(("bad_row", "expected"), TRACELAB_BROKEN.values(), ids=TRACELAB_BROKEN)
def test_a_broken_tracelab_row_names_file_line_and_field(tmp_path, bad_row, expected):
    path = write_lines(tmp_path / "t.jsonl", [tracelab_row("s0"), tracelab_row("s0", 1), bad_row])
    broken(path, read_tracelab, 3, expected)


@settings(max_examples=30, deadline=None)
@given(
    rounds=st.lists(
        st.tuples(st.integers(1, 5000), st.integers(0, 5000), st.integers(1, 900)),
        min_size=1,
        max_size=12,
    )
)
def test_valid_tracelab_rounds_round_trip(tmp_path_factory, rounds):
    """One session, one round per second: lengths read back, and an infinite cache serves the
    reused prefix blocks (never more than ``prefix_tokens``)."""
    lines = []
    for k, (inp, pre, out) in enumerate(rounds):
        stamp = f"00:{k // 60:02d}:{k % 60:02d}"
        lines.append(
            tracelab_row("s", k, inp, min(pre, inp), out, events_at(("user_message", stamp)))
        )
    source = read_tracelab(write_lines(tmp_path_factory.mktemp("t") / "r.jsonl", lines))
    assert source.arrival_s.tolist() == [float(k) for k in range(len(rounds))]
    assert source.input_len.tolist() == [r[0] for r in rounds]
    assert source.output_len.tolist() == [r[2] for r in rounds]
    hits = source.prefix_hit_tokens()
    assert hits[0] == 0
    for k in range(1, len(rounds)):
        inp, pre = rounds[k][0], min(rounds[k][1], rounds[k][0])
        assert hits[k] == 512 * min(pre // 512, rounds[k - 1][0] // 512)


@pytest.mark.skipif(not TRACELAB.exists(), reason=f"shared traces not found under {SHARED}")
def test_the_tracelab_example_matches_its_readme():
    """19 rounds in 2 sessions; input mean 27,053, output mean 597 (README)."""
    source = read_trace(TRACELAB)
    assert len(source) == 19 and len(np.unique(source.session_id)) == 2
    assert source.input_len.mean() == pytest.approx(27_053, abs=0.5)
    assert source.output_len.mean() == pytest.approx(597, abs=0.5)
    # The README's cached share is 92.1%; first rounds' prefixes predate the trace and miss.
    hit = source.prefix_hit_tokens().sum() / source.input_len.sum()
    assert 0.8 < hit < 0.921


# ------------------------------------------------------------------------ parquet


def test_parquet_round_trips_the_shipped_mooncake_trace_exactly(tmp_path):
    source = read_trace("builtin:mooncake_conversation")
    path = tmp_path / "m.parquet"
    write_parquet(source, path)
    back = read_parquet(path)
    assert_same_source(source, back, exact=True)
    assert_same_source(source, read_trace(path), exact=True)  # sniffed by the extension


@st.composite
def sources(draw):
    n = draw(st.integers(0, 25))
    block_tokens = draw(st.integers(1, 64))
    arrival = sorted(draw(st.lists(st.floats(0, 1e9, allow_nan=False), min_size=n, max_size=n)))
    inputs = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    counts = [-(-i // block_tokens) for i in inputs]
    hashes = draw(st.lists(st.integers(0, 2**63 - 1), min_size=sum(counts), max_size=sum(counts)))
    names = tuple(
        draw(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=4, unique=True))
    )
    ints = st.integers
    return RequestSource.from_columns(
        arrival_s=np.asarray(arrival, dtype=float),
        input_len=np.asarray(inputs, dtype=np.int64),
        output_len=np.asarray(draw(st.lists(ints(1, 10**6), min_size=n, max_size=n)), np.int64),
        block_offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        block_hashes=np.asarray(hashes, dtype=np.int64),
        block_tokens=block_tokens,
        traffic_class=draw(st.lists(ints(0, len(names) - 1), min_size=n, max_size=n)) or None,
        class_names=names,
        image_count=draw(st.lists(ints(0, 30_000), min_size=n, max_size=n)) or None,
        session_id=draw(st.lists(ints(-1, 2**62), min_size=n, max_size=n)) or None,
        name=draw(st.text(max_size=10)),
    )


@settings(max_examples=40, deadline=None)
@given(source=sources())
def test_parquet_round_trips_any_source(tmp_path_factory, source):
    path = tmp_path_factory.mktemp("p") / "s.parquet"
    write_parquet(source, path)
    assert_same_source(source, read_parquet(path), exact=True)


def _table(**change: Any) -> pa.Table:
    """A valid two-request native table, with columns replaced or (value None) removed."""
    columns: dict[str, Any] = {
        "arrival_s": pa.array([0.0, 1.0]),
        "input_len": pa.array([3, 5], pa.int64()),
        "output_len": pa.array([1, 2], pa.int64()),
        "traffic_class": pa.array([0, 1], pa.int8()),
        "image_count": pa.array([0, 2], pa.int16()),
        "session_id": pa.array([-1, 4], pa.int64()),
        "block_hashes": pa.array([[1], [1, 2]], pa.list_(pa.int64())),
    }
    columns.update(change)
    table = pa.table({k: v for k, v in columns.items() if v is not None})
    meta = {"version": 1, "name": "t", "block_tokens": 4, "class_names": ["a", "b"]}
    return table.replace_schema_metadata({PARQUET_METADATA_KEY: json.dumps(meta)})


def test_a_hand_written_native_table_reads(tmp_path):
    """Any integer widths and plain ``list`` columns are fine; rows get sorted by arrival."""
    path = tmp_path / "t.parquet"
    pq.write_table(
        _table(arrival_s=pa.array([2.0, 1.0]), input_len=pa.array([3, 5], pa.int32())), path
    )
    source = read_parquet(path)
    assert source.arrival_s.tolist() == [1.0, 2.0]
    assert block_lists(source) == [[1, 2], [1]]
    assert source.class_names == ("a", "b") and source.block_tokens == 4
    assert read_parquet(path, traffic_class="x").traffic_class.tolist() == [0, 0]


PARQUET_BROKEN = {
    "missing column": (dict(session_id=None), "missing column 'session_id'"),
    "null value": (dict(output_len=pa.array([1, None], pa.int64())), "null value (first at row 1)"),
    "float lengths": (dict(input_len=pa.array([3.0, 5.0])), "'input_len': expected integer"),
    "string arrival": (dict(arrival_s=pa.array(["0", "1"])), "'arrival_s': expected float"),
    "hashes not lists": (dict(block_hashes=pa.array([1, 2])), "expected a list of integers"),
    "null hash": (
        dict(block_hashes=pa.array([[1], [1, None]], pa.list_(pa.int64()))),
        "null block ids",
    ),
    "wrong block count": (
        dict(block_hashes=pa.array([[1], [1]], pa.list_(pa.int64()))),
        "invalid trace data: block_offsets: each request needs ceil(input_len / 4) blocks",
    ),
    "bad class code": (
        dict(traffic_class=pa.array([0, 2], pa.int8())),
        "traffic_class: must be a code in [0, 2) (first at row 1)",
    ),
    "zero output": (dict(output_len=pa.array([1, 0], pa.int64())), "output_len: must be >= 1"),
    "far arrival": (
        dict(arrival_s=pa.array([0.0, 1e300])),
        "'arrival_s': must be at most 1e+09 s (31.7 years) from the trace's start, got 1e+300 "
        "(first at row 1)",
    ),
}


@pytest.mark.parametrize(("change", "expected"), PARQUET_BROKEN.values(), ids=PARQUET_BROKEN)
def test_a_broken_native_parquet_names_file_and_column(tmp_path, change, expected):
    path = tmp_path / "t.parquet"
    pq.write_table(_table(**change), path)
    with pytest.raises(TraceError) as info:
        read_parquet(path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)


def test_parquet_without_our_metadata_or_not_parquet_at_all(tmp_path):
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"x": [1]}), plain)
    with pytest.raises(TraceError, match="not a trace written by write_parquet"):
        read_parquet(plain)
    future = tmp_path / "future.parquet"
    meta = {"version": 2, "name": "t", "block_tokens": 4, "class_names": ["a"]}
    pq.write_table(
        _table().replace_schema_metadata({PARQUET_METADATA_KEY: json.dumps(meta)}), future
    )
    with pytest.raises(TraceError, match="version 2 is not supported"):
        read_parquet(future)
    junk = write_lines(tmp_path / "junk.parquet", ["hello"])
    with pytest.raises(TraceError, match="not a readable parquet file"):
        read_parquet(junk)
    with pytest.raises(TraceError, match="no such file"):
        read_parquet(tmp_path / "none.parquet")
    with pytest.raises(TraceError, match="cannot write"):
        write_parquet(read_parquet_source(), tmp_path / "no" / "dir" / "x.parquet")


def _has_page_checksums() -> bool:
    import inspect

    return "page_checksum_verification" in inspect.signature(pq.read_table).parameters


@pytest.mark.skipif(not _has_page_checksums(), reason="page checksums need pyarrow >= 15")
def test_a_bit_flipped_in_a_stored_trace_is_an_error_naming_the_file(tmp_path):
    """Issue 29: a parquet trace with a flipped bit in a data page used to read silently, as
    other requests. ``write_parquet`` (what ``trace convert`` writes) now puts a CRC checksum on
    every page and ``read_parquet`` verifies them, so each flip below, in the stored values of
    the ``input_len`` column (the back half of its dictionary page and of its data page, past
    the page headers), is one error naming the file."""
    path = tmp_path / "t.parquet"
    write_parquet(read_trace("builtin:mooncake_conversation").head(200), path)
    row_group = pq.ParquetFile(path).metadata.row_group(0)
    (chunk,) = [
        row_group.column(i)
        for i in range(row_group.num_columns)
        if row_group.column(i).path_in_schema == "input_len"
    ]
    start, data = chunk.dictionary_page_offset, chunk.data_page_offset
    end = start + chunk.total_compressed_size
    clean = path.read_bytes()
    for at in [*range((start + data) // 2, data, 37), *range((data + end) // 2, end, 37)]:
        raw = bytearray(clean)
        raw[at] ^= 0x10
        path.write_bytes(raw)
        with pytest.raises(TraceError) as info:
            read_parquet(path)
        assert str(info.value).startswith(f"{path}: corrupt: a data page fails its CRC checksum")


def read_parquet_source() -> RequestSource:
    return RequestSource.from_columns(
        arrival_s=[0.0], input_len=[1], output_len=[1], block_offsets=[0, 1], block_hashes=[0],
        block_tokens=16,
    )  # fmt: skip


# ------------------------------------------------------------------------ format detection


def test_read_trace_detects_every_format_from_name_and_first_line(tmp_path):
    """``.csv`` headers pick BurstGPT/Vidur over Azure; JSONL keys pick Qwen/TraceLab over
    Mooncake; ``.parquet`` or parquet's magic bytes pick the native format; gzip is fine."""
    burst = write_lines(tmp_path / "b.csv", [BURST_HEADER, burst_row()])
    vidur = write_lines(tmp_path / "v.csv", [VIDUR_HEADER, "0,1,1"])
    qwen = write_lines(tmp_path / "q.jsonl", [qwen_row()])
    packed = tmp_path / "q2.jsonl.gz"
    packed.write_bytes(gzip.compress(qwen.read_bytes()))
    lab = write_lines(tmp_path / "t.jsonl", [tracelab_row()])
    native = tmp_path / "n.parquet"
    write_parquet(read_parquet_source(), native)
    bare = tmp_path / "native_without_extension"
    bare.write_bytes(native.read_bytes())
    expect = {burst: "burstgpt", vidur: "vidur", qwen: "qwen", packed: "qwen", lab: "tracelab"}
    expect |= {native: "parquet", bare: "parquet"}
    for path, fmt in expect.items():
        assert sniff_format(path) == fmt, path
        assert len(read_trace(path)) == 1
        assert len(read_trace(path, format=fmt)) == 1
    assert read_trace(lab).class_names == ("agent",)
    assert read_trace(qwen).class_names == ("text",)
    assert read_trace(qwen, traffic_class="batch").class_names == ("batch",)
    assert set(FORMATS) >= {"burstgpt", "qwen", "vidur", "tracelab", "parquet"}


def test_servegen_chunks_synthesize_their_client_day(tmp_path):
    """A ServeGen chunk (rate windows + length PMFs) reads as that client's synthesized day:
    arrivals follow the window's rate, lengths its PMFs; either file of the pair works."""
    rates = write_lines(tmp_path / "chunk-0-trace.csv", ["0,2.0,1.0,,,", "600,0,0,,,"])
    lengths = tmp_path / "chunk-0-dataset.json"
    pmf = {"text_tokens": "{100: 1.0}", "image_tokens": "{500: 1.0}", "image_count": "{1: 1.0}",
           "output_tokens": "{20: 0.5, 40: 0.5}"}  # fmt: skip
    lengths.write_text(json.dumps({"0": pmf}, indent=2))
    for path in (rates, lengths):
        assert sniff_format(path) == SERVEGEN
        src = read_trace(path)
        assert len(src) == pytest.approx(1200, rel=0.15)  # 2 req/s over one 10-minute window
        assert (src.arrival_s < 600).all() and (src.input_len == 600).all()
        assert set(src.output_len.tolist()) == {20, 40} and (src.image_count == 1).all()
    assert np.array_equal(read_trace(rates).arrival_s, read_trace(lengths).arrival_s)
    (tmp_path / "chunk-0-dataset.json").unlink()
    with pytest.raises(TraceError, match="needs its pair"):
        read_trace(rates)


@pytest.mark.skipif(not SERVEGEN_DIR.exists(), reason=f"shared traces not found under {SHARED}")
def test_every_shared_servegen_file_is_recognised():
    files = sorted(SERVEGEN_DIR.glob("chunk-*"))
    assert len(files) == 70
    assert {sniff_format(p) for p in files} == {SERVEGEN}


# ------------------------------------------------------------------------ stats


def small_source(arrival, inputs, blocks, block_tokens=4, classes=None, names=("chatbot",)):
    counts = [len(b) for b in blocks]
    return RequestSource.from_columns(
        arrival_s=arrival,
        input_len=inputs,
        output_len=[2] * len(inputs),
        block_offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        block_hashes=[h for b in blocks for h in b],
        block_tokens=block_tokens,
        traffic_class=classes,
        class_names=names,
    )


def test_trace_stats_numbers_on_a_small_trace():
    """Three requests: the second reuses the first's two blocks (8 of 10 tokens), the third
    reuses nothing; an LRU of one block keeps only the most recent block."""
    source = small_source(
        [0.0, 30.0, 90.0], [8, 10, 3], [[1, 2], [1, 2, 3], [4]], classes=[0, 1, 1],
        names=("chatbot", "agent"),
    )  # fmt: skip
    s = trace_stats(source, lru_blocks=1)
    assert s["requests"] == 3 and s["sessions"] == 0
    assert s["input_tokens"]["mean"] == pytest.approx(7.0)
    assert s["input_tokens"]["p50"] == 8.0 and s["input_tokens"]["max"] == 10.0
    assert s["rate"]["span_s"] == 90.0 and s["rate"]["mean_per_s"] == pytest.approx(3 / 90)
    assert s["rate"]["interarrival_cv"] == pytest.approx(1 / 3)  # gaps 30, 60
    assert s["rate"]["per_minute_peak"] == 2.0 and s["rate"]["per_minute_mean"] == 1.5
    assert s["rate"]["peak_to_mean_per_minute"] == pytest.approx(4 / 3)
    assert s["prefix"]["infinite_hit_fraction"] == pytest.approx(8 / 21)
    assert s["prefix"]["lru_hit_fraction"] == 0.0
    assert s["prefix"]["block_refs"] == 6 and s["prefix"]["unique_blocks"] == 4
    assert s["classes"]["agent"]["requests"] == 2
    assert s["classes"]["agent"]["infinite_hit_fraction"] == pytest.approx(8 / 13)
    json.dumps(s, allow_nan=False)  # JSON-ready


def test_trace_stats_of_tiny_traces_has_no_nan():
    one = trace_stats(small_source([5.0], [1], [[0]]))
    assert one["rate"]["mean_per_s"] is None and one["rate"]["interarrival_cv"] is None
    empty = trace_stats(small_source(np.zeros(0), np.zeros(0, np.int64), []))
    assert empty["input_tokens"]["mean"] is None
    assert empty["prefix"]["infinite_hit_fraction"] is None
    json.dumps([one, empty], allow_nan=False)


def test_lru_keeps_recently_used_blocks():
    """Capacity 2: [1, 2] then [3] evicts 1; [1, 2] misses block 1, so block 2 does not count."""
    source = small_source([0, 1, 2, 3], [8, 4, 8, 4], [[1, 2], [3], [1, 2], [3]])
    assert lru_prefix_hit_tokens(source, 2).tolist() == [0, 0, 0, 0]
    assert lru_prefix_hit_tokens(source, 3).tolist() == [0, 0, 8, 4]
    assert lru_prefix_hit_tokens(source, 0).tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError):
        lru_prefix_hit_tokens(source, -1)


@settings(max_examples=60, deadline=None)
@given(
    lists=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=5), min_size=1, max_size=15),
    capacity=st.integers(0, 12),
)
def test_a_large_enough_lru_is_the_infinite_cache(lists, capacity):
    """An LRU never serves more than an infinite cache, and equals it once nothing is evicted."""
    chained = [[hash(tuple(b[: p + 1])) % 2**62 for p in range(len(b))] for b in lists]
    source = small_source(list(range(len(lists))), [4 * len(b) - 1 for b in lists], chained)
    infinite = source.prefix_hit_tokens()
    lru = lru_prefix_hit_tokens(source, capacity)
    assert np.all(lru <= infinite)
    if capacity >= len(np.unique(source.block_hashes)):
        np.testing.assert_array_equal(lru, infinite)


def test_every_format_has_one_reader_in_the_registry():
    from deepinfer_sim.traces.readers import READERS, read_format

    assert tuple(READERS) == FORMATS
    with pytest.raises(TraceError, match="unknown trace format 'nope'"):
        read_format("x.csv", "nope")
