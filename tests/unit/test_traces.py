"""Traces: reading public workloads into a ``RequestSource`` and reshaping them.

These tests double as the documentation of what the readers promise: the public traces parse to
the statistics their READMEs record, the shipped gzip copies are the originals byte for byte,
every malformed row is reported with its file and line (never skipped), and the derived sources
(``window``, ``head``, ``scale_rate``, ``spread_buckets``) keep each request's prefix blocks
attached to it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_same_source
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_sim.errors import TraceError
from deepinfer_sim.traces import (
    BUILTIN_TRACES,
    RequestSource,
    read_azure,
    read_mooncake,
    read_trace,
    resolve_trace_path,
    spread_buckets,
)

SHARED = Path(__file__).parents[2] / ".." / "shared" / "traces"
MOONCAKE = SHARED / "mooncake_fast25" / "conversation_trace.jsonl"
AZURE_CONV = SHARED / "azure_llm_inference_2023" / "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = SHARED / "azure_llm_inference_2023" / "AzureLLMInferenceTrace_code.csv"

needs_shared = pytest.mark.skipif(
    not MOONCAKE.exists() or not AZURE_CONV.exists() or not AZURE_CODE.exists(),
    reason=f"shared traces not found under {SHARED.resolve()} (only in the project workspace)",
)

ORIGINAL_SHA256 = {
    "mooncake_conversation": "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
    "azure_conv": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
    "azure_code": "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
}
SHARED_ORIGINAL = {
    "mooncake_conversation": MOONCAKE,
    "azure_conv": AZURE_CONV,
    "azure_code": AZURE_CODE,
}


def make_source(
    arrival_s, input_len, *, block_tokens=4, hashes=None, output_len=None, name="test"
) -> RequestSource:
    """A small source; block ids default to fresh ones, session ids number the rows."""
    input_len = np.asarray(input_len, dtype=np.int64)
    counts = -(-input_len // block_tokens)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return RequestSource.from_columns(
        arrival_s=arrival_s,
        input_len=input_len,
        output_len=np.ones(len(input_len), np.int64) if output_len is None else output_len,
        block_offsets=offsets,
        block_hashes=np.arange(offsets[-1]) if hashes is None else hashes,
        block_tokens=block_tokens,
        session_id=np.arange(len(input_len)),
        name=name,
    )


def block_lists(source: RequestSource) -> list[list[int]]:
    return [source.blocks(i).tolist() for i in range(len(source))]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def mooncake_row(ts=0, input_length=600, output_length=10, hash_ids=None) -> str:
    if hash_ids is None:
        hash_ids = list(range(-(-input_length // 512)))
    return json.dumps(
        {
            "timestamp": ts,
            "input_length": input_length,
            "output_length": output_length,
            "hash_ids": hash_ids,
        }
    )


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


# ------------------------------------------------------------------------ the public traces


@needs_shared
def test_mooncake_trace_matches_its_readme():
    """The Mooncake conversation trace parses to the numbers its README records.

    Prefix reuse is the token-weighted share of prompt tokens an infinite prefix cache would
    serve, replaying requests in arrival order: 37.4% for this trace.
    """
    source = read_mooncake(MOONCAKE)
    source.validate()
    stats = source.stats()
    assert stats["count"] == 12_031
    assert stats["input_mean"] == pytest.approx(12_035, abs=0.5)
    assert stats["input_p50"] == 6_909
    assert stats["output_mean"] == pytest.approx(343, abs=0.5)
    assert stats["span_s"] == pytest.approx(3_537, abs=0.5)
    assert stats["rate_per_s"] == pytest.approx(3.40, abs=0.005)
    assert stats["block_refs"] == 288_500
    assert stats["unique_blocks"] == 182_790
    assert stats["prefix_reuse_tokens"] == pytest.approx(0.374, abs=0.001)
    assert source.block_tokens == 512
    assert source.class_names == ("chatbot",)
    assert np.all(source.session_id == -1)


@needs_shared
@pytest.mark.parametrize(
    ("path", "rows", "input_mean", "output_mean", "span_s"),
    [
        (AZURE_CONV, 19_366, 1_155, 211, 3_502),
        (AZURE_CODE, 8_819, 2_048, 27.9, 3_436),
    ],
    ids=["conv", "code"],
)
def test_azure_traces_match_their_readme(path, rows, input_mean, output_mean, span_s):
    """The Azure 2023 traces parse fully; arrivals count seconds from the first timestamp.

    They carry no prefix information, so every block id is fresh and nothing is reused.
    """
    source = read_azure(path)
    stats = source.stats()
    assert stats["count"] == rows
    assert stats["input_mean"] == pytest.approx(input_mean, rel=1e-3)
    assert stats["output_mean"] == pytest.approx(output_mean, rel=2e-3)
    assert stats["span_s"] == pytest.approx(span_s, abs=1)
    assert source.arrival_s[0] == 0.0
    assert stats["unique_blocks"] == stats["block_refs"]
    assert stats["prefix_reuse_tokens"] == 0.0


@pytest.mark.parametrize("name", sorted(BUILTIN_TRACES))
def test_shipped_copies_are_the_originals(name):
    """Each shipped ``.gz`` decompresses to the original file, checked by its sha256."""
    file = BUILTIN_TRACES[name][0]
    data = gzip.decompress((files("deepinfer_sim.traces") / "data" / file).read_bytes())
    assert hashlib.sha256(data).hexdigest() == ORIGINAL_SHA256[name]


@needs_shared
@pytest.mark.parametrize("name", sorted(BUILTIN_TRACES))
def test_builtin_traces_parse_like_the_shared_originals(name):
    """``read_trace("builtin:NAME")`` gives the same arrays as reading the shared original."""
    _, fmt, traffic_class = BUILTIN_TRACES[name]
    builtin = read_trace(f"builtin:{name}")
    original = read_trace(SHARED_ORIGINAL[name], format=fmt, traffic_class=traffic_class)
    assert_same_source(builtin, original)
    assert builtin.name == name


def test_builtin_classes_come_from_the_table():
    """The Azure code trace is agent traffic by default; the caller can override it."""
    assert read_trace("builtin:azure_code").class_names == ("agent",)
    assert read_trace("builtin:azure_code", traffic_class="batch").class_names == ("batch",)


def test_resolving_builtin_and_plain_paths():
    """A builtin spec resolves to a shipped file and its format; a path resolves to itself."""
    path, fmt, traffic_class = resolve_trace_path("builtin:mooncake_conversation")
    assert path.is_file() and path.name == "mooncake_conversation.jsonl.gz"
    assert (fmt, traffic_class) == ("mooncake", "chatbot")
    assert resolve_trace_path("some/trace.csv") == (Path("some/trace.csv"), None, None)


def test_unknown_builtin_lists_the_available_names():
    """A mistyped builtin name fails with the list of names that do exist."""
    with pytest.raises(TraceError, match="builtin:nope") as info:
        read_trace("builtin:nope")
    for name in BUILTIN_TRACES:
        assert name in str(info.value)


# ------------------------------------------------------------------------ Mooncake reader


def test_mooncake_rows_are_sorted_stably_and_gzip_is_recognised(tmp_path):
    """Out-of-order rows are sorted by timestamp; equal timestamps keep file order.

    Compression is recognised by content, so a gzip file named ``.jsonl`` reads too.
    """
    rows = [
        mooncake_row(ts=2000, output_length=1),
        mooncake_row(ts=0, output_length=2),
        mooncake_row(ts=2000, output_length=3),
        mooncake_row(ts=1000, output_length=4, input_length=1025, hash_ids=[7, 8, 9]),
    ]
    plain = write_lines(tmp_path / "t.jsonl", rows)
    packed = tmp_path / "packed.jsonl"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, packed):
        source = read_mooncake(path)
        assert source.output_len.tolist() == [2, 4, 1, 3]
        assert source.arrival_s.tolist() == [0.0, 1.0, 2.0, 2.0]
        assert source.blocks(1).tolist() == [7, 8, 9]


def test_a_missing_trailing_newline_is_fine(tmp_path):
    """The last line may end without a newline; nothing else is optional."""
    path = tmp_path / "t.jsonl"
    path.write_text(mooncake_row() + "\n" + mooncake_row(ts=5))
    assert len(read_mooncake(path)) == 2


MOONCAKE_BROKEN = {
    "bad JSON": ('{"timestamp": 0,', "invalid JSON"),
    "not an object": ("[1, 2]", "expected a JSON object"),
    "missing field": ('{"timestamp": 0, "input_length": 5, "hash_ids": [0]}', "'output_length'"),
    "string length": (
        mooncake_row().replace('"input_length": 600', '"input_length": "600"'),
        "'input_length': expected an integer",
    ),
    "float length": (
        mooncake_row().replace('"output_length": 10', '"output_length": 10.0'),
        "'output_length': expected an integer",
    ),
    "bool length": (
        mooncake_row().replace('"output_length": 10', '"output_length": true'),
        "'output_length': expected an integer",
    ),
    "negative length": (mooncake_row(input_length=-5, hash_ids=[]), "'input_length': must be >= 1"),
    "zero output": (mooncake_row(output_length=0), "'output_length': must be >= 1"),
    "negative timestamp": (mooncake_row(ts=-1), "'timestamp': must be finite and >= 0"),
    # issue 29: 1e300 ms made `run` spin and `trace stats` fail; past 31.7 years is refused
    "far timestamp": (mooncake_row(ts=1e300), "'timestamp': must be at most 1e+12 ms"),
    "string timestamp": (mooncake_row(ts="0"), "'timestamp': expected a number"),
    "hash count": (mooncake_row(input_length=1025, hash_ids=[1, 2]), "needs ceil(1025/512) = 3"),
    "hash type": (mooncake_row(hash_ids=[0, "1"]), "'hash_ids'[1]: expected an integer"),
    "negative hash": (mooncake_row(hash_ids=[0, -1]), "'hash_ids'[1]"),
    "hash not a list": (mooncake_row(hash_ids=3), "'hash_ids': expected a list"),
    "blank line": ("", "blank line"),
}


@pytest.mark.parametrize(("bad_row", "expected"), MOONCAKE_BROKEN.values(), ids=MOONCAKE_BROKEN)
def test_a_broken_mooncake_row_names_file_line_and_field(tmp_path, bad_row, expected):
    """A bad third line fails with ``file:3:`` and says which field is wrong and how."""
    path = write_lines(
        tmp_path / "broken.jsonl", [mooncake_row(), mooncake_row(ts=5), bad_row, mooncake_row(ts=9)]
    )
    with pytest.raises(TraceError) as info:
        read_mooncake(path)
    assert info.value.line == 3
    assert f"{path}:3: " in str(info.value)
    assert expected in str(info.value)


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["empty", "whitespace"])
def test_an_empty_trace_is_an_error(tmp_path, content):
    """A file without requests is refused rather than simulated as an idle cluster."""
    for name, reader in (("e.jsonl", read_mooncake), ("e.csv", read_azure)):
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(TraceError, match="empty") as info:
            reader(path)
        assert str(path) in str(info.value)


def test_corrupt_gzip_is_an_error(tmp_path):
    """A truncated download is reported as corrupt gzip, naming the file."""
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(mooncake_row().encode())[:-12])
    with pytest.raises(TraceError, match="corrupt gzip"):
        read_mooncake(path)


# ------------------------------------------------------------------------ Azure reader


def test_azure_arrivals_are_seconds_from_the_earliest_timestamp(tmp_path):
    """Timestamps keep their 100 ns digits; rows out of order are sorted by time."""
    path = write_lines(
        tmp_path / "a.csv",
        [
            AZURE_HEADER,
            "2023-11-16 18:15:47.0000001,100,5",
            "2023-11-16 18:15:46.5000000,513,7",
            "2023-11-16 18:16:46.5000000,1,1",
        ],
    )
    source = read_azure(path, traffic_class="agent")
    assert source.arrival_s.tolist() == pytest.approx([0.0, 0.5000001, 60.0], abs=1e-9)
    assert source.input_len.tolist() == [513, 100, 1]
    assert source.n_blocks.tolist() == [2, 1, 1]
    assert len(np.unique(source.block_hashes)) == 4  # fresh ids: no prefix is shared
    assert source.class_names == ("agent",)


AZURE_BROKEN = {
    "bad timestamp": ("2023-13-45 99:00:00.0,10,2", "'TIMESTAMP': expected a date-time"),
    "empty timestamp": (",10,2", "'TIMESTAMP'"),
    "float tokens": ("2023-11-16 18:15:47.0,10.5,2", "'ContextTokens': expected an integer"),
    "text tokens": ("2023-11-16 18:15:47.0,10,many", "'GeneratedTokens': expected an integer"),
    "negative tokens": ("2023-11-16 18:15:47.0,-3,2", "'ContextTokens': must be >= 1"),
    "zero output": ("2023-11-16 18:15:47.0,10,0", "'GeneratedTokens': must be >= 1"),
    "missing value": ("2023-11-16 18:15:47.0,10", "'GeneratedTokens': expected an integer"),
    "extra value": ("2023-11-16 18:15:47.0,10,2,9", "malformed CSV"),
    "blank line": ("", "'TIMESTAMP'"),
    "centuries later": ("2262-01-01 00:00:00.0,10,2", "arrival 7.51449e+09 s after the first must"),
}


@pytest.mark.parametrize(("bad_row", "expected"), AZURE_BROKEN.values(), ids=AZURE_BROKEN)
def test_a_broken_azure_row_names_file_line_and_column(tmp_path, bad_row, expected):
    """The header is line 1, so the third data row is line 4."""
    path = write_lines(
        tmp_path / "broken.csv",
        [
            AZURE_HEADER,
            "2023-11-16 18:15:46.0,10,2",
            "2023-11-16 18:15:46.5,10,2",
            bad_row,
            "2023-11-16 18:15:48.0,10,2",
        ],
    )
    with pytest.raises(TraceError) as info:
        read_azure(path)
    assert info.value.line == 4
    assert f"{path}:4: " in str(info.value)
    assert expected in str(info.value)


def test_the_earliest_bad_azure_row_is_reported_whatever_the_column(tmp_path):
    """Columns are checked together, so a bad count on line 2 wins over a bad time on line 3."""
    path = write_lines(
        tmp_path / "two.csv", [AZURE_HEADER, "2023-11-16 18:15:46.0,10,x", "yesterday,10,2"]
    )
    with pytest.raises(TraceError, match="GeneratedTokens") as info:
        read_azure(path)
    assert info.value.line == 2


def test_azure_zero_outputs_can_be_counted_as_one_token(tmp_path):
    """Zero-token outputs are an error by default; ``zero_output="one"`` makes them 1 token."""
    path = write_lines(tmp_path / "z.csv", [AZURE_HEADER, "2023-11-16 18:15:46.0,10,0"])
    with pytest.raises(TraceError, match="GeneratedTokens"):
        read_azure(path)
    assert read_azure(path, zero_output="one").output_len.tolist() == [1]


def test_azure_header_problems_point_at_line_one(tmp_path):
    """A wrong header is a line-1 error; a header with no rows is an error too."""
    path = write_lines(tmp_path / "h.csv", ["TIMESTAMP,Context,GeneratedTokens", "x,1,1"])
    with pytest.raises(TraceError, match="ContextTokens") as info:
        read_azure(path)
    assert info.value.line == 1
    header_only = write_lines(tmp_path / "only.csv", [AZURE_HEADER])
    with pytest.raises(TraceError, match="no requests"):
        read_azure(header_only)


# ------------------------------------------------------------------------ read_trace dispatch


def test_read_trace_picks_the_format_from_name_or_content(tmp_path):
    """Without ``format=``, ``.jsonl``/``.csv`` names decide, else the first line does."""
    jsonl = write_lines(tmp_path / "a.jsonl.gz", [mooncake_row()])  # not really gzip: fine
    csv = write_lines(tmp_path / "b.csv", [AZURE_HEADER, "2023-11-16 18:15:46.0,10,2"])
    bare_json = write_lines(tmp_path / "c", [mooncake_row()])
    bare_csv = write_lines(tmp_path / "d", [AZURE_HEADER, "2023-11-16 18:15:46.0,10,2"])
    assert read_trace(jsonl).block_tokens == 512
    assert read_trace(csv).input_len.tolist() == [10]
    assert len(read_trace(bare_json)) == 1
    assert len(read_trace(bare_csv)) == 1
    assert len(read_trace(bare_csv, format="azure")) == 1


def test_read_trace_reports_missing_files_and_unknown_formats(tmp_path):
    """A missing file says so; an unrecognisable one lists the accepted formats."""
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(TraceError, match="no such file") as info:
        read_trace(missing)
    assert str(missing) in str(info.value)
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "nowhere")
    odd = write_lines(tmp_path / "odd.txt", ["hello"])
    with pytest.raises(TraceError, match="mooncake, azure") as info:
        read_trace(odd)
    assert str(odd) in str(info.value)
    with pytest.raises(TraceError, match="unknown trace format 'nosuch'"):
        read_trace(odd, format="nosuch")


# ------------------------------------------------------------------------ RequestSource


def test_from_columns_converts_and_validates():
    """Columns are copied into canonical dtypes and frozen; bad input is a ``ValueError``."""
    source = make_source([0.0, 1.0], [5, 4])
    assert source.input_len.dtype == np.int64 and source.traffic_class.dtype == np.int8
    assert source.blocks(0).tolist() == [0, 1] and source.blocks(1).tolist() == [2]
    with pytest.raises(ValueError, match="read-only"):
        source.arrival_s[0] = 3.0
    with pytest.raises(ValueError, match="non-decreasing"):
        make_source([1.0, 0.0], [5, 4])
    with pytest.raises(ValueError, match="expected integers"):
        RequestSource.from_columns(
            arrival_s=[0.0],
            input_len=[5.5],
            output_len=[1],
            block_offsets=[0, 2],
            block_hashes=[0, 1],
            block_tokens=4,
        )
    with pytest.raises(ValueError, match=r"ceil\(input_len / 4\)"):
        RequestSource.from_columns(
            arrival_s=[0.0],
            input_len=[5],
            output_len=[1],
            block_offsets=[0, 3],
            block_hashes=[0, 1, 2],
            block_tokens=4,
        )
    with pytest.raises(ValueError, match="output_len: must be >= 1"):
        make_source([0.0], [5], output_len=[0])


def test_class_codes_and_frame():
    """Class names map to codes; ``to_frame`` gives a per-request table without block ids."""
    source = make_source([0.0, 1.0], [5, 4])
    assert source.class_code("chatbot") == 0
    with pytest.raises(KeyError, match="agent"):
        source.class_code("agent")
    frame = source.to_frame()
    assert list(frame["n_blocks"]) == [2, 1]
    assert list(frame["traffic_class"]) == ["chatbot", "chatbot"]


def test_prefix_reuse_counts_only_an_unbroken_prefix():
    """An infinite prefix cache serves a block only if every earlier block of the request hit.

    Request 1 shares its first block (4 tokens) with request 0. Request 2 shares block 0 and
    block 2, but misses block 1, so only block 0 counts. Request 3 repeats request 0 exactly
    and hits all 6 tokens, including the 2-token last block.
    """
    source = make_source(
        [0.0, 1.0, 2.0, 3.0],
        [6, 8, 12, 6],
        hashes=[10, 11, 10, 20, 10, 30, 11, 10, 11],
    )
    assert source.prefix_hit_tokens().tolist() == [0, 4, 4, 6]
    assert source.stats()["prefix_reuse_tokens"] == pytest.approx(14 / 32)


def test_window_head_and_scale_rate_keep_blocks_with_their_requests():
    """Derived sources are valid and every request keeps its own block list."""
    source = make_source([0.0, 0.5, 1.0, 1.0, 2.5, 4.0], [1, 9, 4, 5, 13, 2])
    blocks = block_lists(source)

    part = source.window(1.0, 4.0)
    part.validate()
    assert part.arrival_s.tolist() == [0.0, 0.0, 1.5]
    assert block_lists(part) == blocks[2:5]

    first = source.head(2)
    first.validate()
    assert block_lists(first) == blocks[:2]
    assert len(source.head(100)) == len(source)

    fast = source.scale_rate(2.0)
    fast.validate()
    assert fast.arrival_s.tolist() == [0.0, 0.25, 0.5, 0.5, 1.25, 2.0]
    assert block_lists(fast) == blocks
    with pytest.raises(ValueError):
        source.scale_rate(0.0)


def test_select_keeps_arrival_order():
    """Picking rows in any order still yields an arrival-sorted source."""
    source = make_source([0.0, 1.0, 2.0], [1, 5, 9])
    picked = source.select([2, 0])
    assert picked.session_id.tolist() == [0, 2]
    assert block_lists(picked) == [[0], [3, 4, 5]]
    assert source.select(source.input_len > 2).session_id.tolist() == [1, 2]


def test_merge_keeps_sources_independent():
    """Merged sources interleave by time, unite their classes and never share a block id."""
    a = make_source([0.0, 2.0], [4, 4], hashes=[0, 0])
    b = RequestSource.from_columns(
        arrival_s=[1.0],
        input_len=[8],
        output_len=[3],
        block_offsets=[0, 2],
        block_hashes=[0, 1],
        block_tokens=4,
        class_names=("agent",),
    )
    merged = RequestSource.merge(a, b, name="mix")
    merged.validate()
    assert merged.arrival_s.tolist() == [0.0, 1.0, 2.0]
    assert merged.class_names == ("chatbot", "agent")
    assert merged.traffic_class.tolist() == [0, 1, 0]
    assert block_lists(merged) == [[0], [1, 2], [0]]
    assert merged.session_id.tolist() == [0, -1, 1]


def test_an_empty_source_is_allowed():
    """A window can be empty; an empty source still has stats and can be sliced."""
    empty = make_source([], [])
    assert len(empty) == 0
    assert empty.stats()["count"] == 0
    assert len(empty.window(0.0, 1.0)) == 0


# ------------------------------------------------------------------------ spread_buckets


@needs_shared
@pytest.mark.parametrize("method", ["uniform", "even"])
def test_spreading_mooncake_buckets_stays_inside_each_bucket(method):
    """Each request moves to ``[t, t + 3 s)`` of its own bucket, taking its blocks along."""
    trace = read_mooncake(MOONCAKE)
    tagged = RequestSource.from_columns(
        arrival_s=trace.arrival_s,
        input_len=trace.input_len,
        output_len=trace.output_len,
        block_offsets=trace.block_offsets,
        block_hashes=trace.block_hashes,
        block_tokens=trace.block_tokens,
        session_id=np.arange(len(trace)),
    )
    spread = spread_buckets(tagged, 3.0, method, rng=np.random.default_rng(7))
    spread.validate()
    assert len(spread) == len(trace)
    row = spread.session_id  # the original row of each spread request
    assert np.all(spread.arrival_s >= trace.arrival_s[row])
    assert np.all(spread.arrival_s < trace.arrival_s[row] + 3.0)
    np.testing.assert_array_equal(spread.input_len, trace.input_len[row])
    for i in range(0, len(spread), 997):
        np.testing.assert_array_equal(spread.blocks(i), trace.blocks(int(row[i])))
    assert len(np.unique(spread.arrival_s)) > 10 * len(np.unique(trace.arrival_s))


def test_uniform_spreading_is_reproducible_per_seed():
    """The same seed gives the same arrivals; an int seed equals a Generator from it."""
    source = make_source([0.0] * 5 + [3.0] * 5, [4] * 10)
    one = spread_buckets(source, 3.0, "uniform", rng=np.random.default_rng(1))
    again = spread_buckets(source, 3.0, "uniform", rng=np.random.default_rng(1))
    other = spread_buckets(source, 3.0, "uniform", rng=np.random.default_rng(2))
    assert_same_source(one, again)
    assert not np.array_equal(one.arrival_s, other.arrival_s)
    assert_same_source(one, spread_buckets(source, 3.0, "uniform", rng=1))
    with pytest.raises(ValueError, match="needs rng"):
        spread_buckets(source, 3.0, "uniform")


def test_even_spreading_and_none():
    """ "even" spaces a bucket of k requests ``window/k`` apart in file order; a lone request
    and "none" change nothing."""
    source = make_source([0.0, 0.0, 0.0, 0.0, 3.0, 6.0, 6.0], [4] * 7)
    even = spread_buckets(source, 2.0, "even")
    assert even.arrival_s.tolist() == [0.0, 0.5, 1.0, 1.5, 3.0, 6.0, 7.0]
    assert even.session_id.tolist() == list(range(7))
    assert spread_buckets(source, 2.0, "none") is source
    with pytest.raises(ValueError, match="method"):
        spread_buckets(source, 2.0, "gaussian")


# ------------------------------------------------------------------------ properties

mooncake_rows = st.lists(
    st.tuples(
        st.integers(0, 10_000),  # timestamp, ms (small range: many ties)
        st.integers(1, 3_000),  # input length
        st.integers(1, 2_000),  # output length
        st.integers(0, 2**62),  # first block id
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(rows=mooncake_rows)
def test_valid_mooncake_rows_round_trip(tmp_path_factory, rows):
    """Any valid rows written as JSONL read back as the same requests, sorted stably by time."""
    lines = [
        mooncake_row(ts, il, ol, [h + k for k in range(-(-il // 512))]) for ts, il, ol, h in rows
    ]
    path = write_lines(tmp_path_factory.mktemp("rt") / "t.jsonl", lines)
    source = read_mooncake(path)
    source.validate()
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    assert source.arrival_s.tolist() == [rows[i][0] / 1000 for i in order]
    assert source.input_len.tolist() == [rows[i][1] for i in order]
    assert source.output_len.tolist() == [rows[i][2] for i in order]
    assert [b[0] for b in block_lists(source)] == [rows[i][3] for i in order]


@st.composite
def sources(draw):
    n = draw(st.integers(0, 30))
    ticks = sorted(draw(st.lists(st.integers(0, 20), min_size=n, max_size=n)))
    lengths = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    return make_source(np.asarray(ticks, dtype=float) / 4, lengths)


@settings(max_examples=100, deadline=None)
@given(
    source=sources(),
    start=st.floats(0, 6),
    width=st.floats(0, 6),
    factor=st.floats(0.01, 100),
)
def test_window_and_scale_invariants(source, start, width, factor):
    """A window keeps exactly the requests in ``[start, end)``, shifted by ``start``; scaling
    the rate only rescales time. Both keep every request's blocks."""
    end = start + width
    part = source.window(start, end)
    part.validate()
    inside = (source.arrival_s >= start) & (source.arrival_s < end)
    np.testing.assert_array_equal(part.session_id, source.session_id[inside])
    np.testing.assert_allclose(part.arrival_s, source.arrival_s[inside] - start, atol=1e-12)
    kept = np.flatnonzero(inside)
    assert block_lists(part) == [block_lists(source)[i] for i in kept]

    fast = source.scale_rate(factor)
    fast.validate()
    np.testing.assert_allclose(fast.arrival_s * factor, source.arrival_s, rtol=1e-12)
    np.testing.assert_array_equal(fast.block_hashes, source.block_hashes)


@settings(max_examples=100, deadline=None)
@given(
    source=sources(),
    window=st.floats(0.01, 5),
    method=st.sampled_from(["uniform", "even"]),
    seed=st.integers(0, 2**32),
)
def test_spreading_invariants(source, window, method, seed):
    """Spreading keeps every request once, inside its bucket, with its own blocks."""
    spread = spread_buckets(source, window, method, rng=seed)
    spread.validate()
    row = spread.session_id
    assert sorted(row.tolist()) == list(range(len(source)))
    t = source.arrival_s[row]
    assert np.all((spread.arrival_s >= t) & (spread.arrival_s < t + window))
    values, counts = np.unique(source.arrival_s, return_counts=True)
    lone = counts[np.searchsorted(values, t)] == 1
    assert np.all(spread.arrival_s[lone] == t[lone])  # lone requests stay put
    original = block_lists(source)
    assert block_lists(spread) == [original[r] for r in row]


def test_with_classes_relabels_without_touching_the_rest():
    src = read_trace("builtin:mooncake_conversation").head(50)
    codes = np.arange(50) % 2
    two = src.with_classes(codes, ("chatbot", "agent"))
    assert two.class_names == ("chatbot", "agent")
    assert two.traffic_class.tolist() == codes.tolist()
    assert_same_source(two.with_classes(src.traffic_class, src.class_names), src)
    with pytest.raises(ValueError):
        src.with_classes(codes, ("chatbot",))  # code 1 has no name
