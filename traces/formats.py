"""More trace formats, and the native parquet format.

Design notes
------------
Each reader turns one public format into a :class:`RequestSource` and is as strict as the
Mooncake and Azure readers: any malformed row raises :class:`~deepinfer_sim.errors.TraceError`
naming the file, the 1-based line (for text formats; a 0-based row for parquet) and the field.
No row is skipped or repaired, except where a keyword argument says how (``zero_output``). Rows
are sorted stably by arrival, so ties keep file order. Text files may be gzip-compressed.

- **BurstGPT** CSV (Wang et al., 2024; ``HPMLL/BurstGPT``): ``Timestamp`` (seconds from 0:00 of
  the first day), ``Model``, ``Request tokens``, ``Response tokens``, ``Total tokens``,
  ``Log Type``. Lengths only: every block id is fresh, so a prefix cache finds no reuse.
- **Qwen-Bailian** JSONL (``alibaba-edu/qwen-bailian-usagetraces-anon``, e.g.
  ``qwen_traceA_blksz_16.jsonl``): ``chat_id``, ``parent_chat_id`` (-1 for a root),
  ``timestamp`` (seconds), ``input_length``, ``output_length``, ``type``, ``turn`` and
  ``hash_ids``, one salted hash per **16-token** block (:data:`QWEN_BLOCK_TOKENS`).
- **Vidur** trace CSV (``microsoft/vidur``, ``data/processed_traces/*.csv``): ``arrived_at``
  (seconds), ``num_prefill_tokens``, ``num_decode_tokens``. Lengths only.
- **TraceLab** rounds JSONL (``uw-syfi/TraceLab``, ``round_trace.jsonl``): one LLM call of a
  coding-agent session per line, with ``session_id``, ``round_index``, ``input_tokens_total``,
  ``prefix_tokens`` (tokens the provider served from its prompt cache), ``output_tokens`` and
  ``timing_events``. There are no block hashes; see :func:`read_tracelab` for how prefix
  reuse becomes block ids.
- **parquet**, the native format: :func:`write_parquet` stores every column of a source (block
  hashes as a list column; name, block size and class names in the file's key-value metadata)
  and :func:`read_parquet` reads it back exactly.

ServeGen's ``chunk-*-trace.csv`` / ``chunk-*-dataset.json`` files are *not* request traces but
per-client rate and length distributions; :func:`read_format` names them and refuses.
"""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from deepinfer_sim.errors import TraceError
from deepinfer_sim.traces._files import FORMATS, SERVEGEN, read_bytes
from deepinfer_sim.traces.readers import (
    _Check,
    _describe,
    _int_column,
    _jsonl_objects,
    _lengths_only,
    _raise_first_bad,
    _read_csv,
    _trace_name,
)
from deepinfer_sim.traces.source import RequestSource

__all__ = [
    "PARQUET_METADATA_KEY",
    "QWEN_BLOCK_TOKENS",
    "read_burstgpt",
    "read_format",
    "read_parquet",
    "read_qwen",
    "read_tracelab",
    "read_vidur",
    "write_parquet",
]

QWEN_BLOCK_TOKENS = 16
"""Tokens per ``hash_ids`` entry in the Qwen-Bailian traces (the ``blksz_16`` in their names)."""

PARQUET_METADATA_KEY = b"deepinfer_sim.trace"
"""Key of the JSON metadata (version, name, block_tokens, class_names) in a native parquet."""

_PARQUET_VERSION = 1
_TRACELAB_INPUT_EVENTS = frozenset({"user_message", "tool_result"})
_ZERO_OUTPUT = ("error", "one")


def _check_zero_output(zero_output: str) -> int:
    """The smallest output length a reader accepts under ``zero_output``."""
    if zero_output not in _ZERO_OUTPUT:
        raise ValueError(f"zero_output: expected 'error' or 'one', got {zero_output!r}")
    return 0 if zero_output == "one" else 1


def _seconds_column(df: pd.DataFrame, column: str) -> tuple[np.ndarray, list[_Check]]:
    """Parse a non-negative seconds column exactly (Python's float rounding, not pandas')."""
    text = df[column].fillna("").str.strip()
    try:
        values = text.to_numpy(dtype=object).astype(np.float64)
        ok = np.isfinite(values)
    except ValueError:  # some cell is not a number; find which
        coerced = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64)
        ok = np.isfinite(coerced)
        values = np.where(ok, coerced, 0.0)
    return values, [
        (~ok, column, "expected a finite number of seconds"),
        (ok & (values < 0), column, "must be >= 0"),
    ]


# ---------------------------------------------------------------------------- BurstGPT


_BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def read_burstgpt(
    path: str | os.PathLike[str],
    traffic_class: str = "chatbot",
    *,
    block_tokens: int = 512,
    zero_output: str = "error",
) -> RequestSource:
    """Read a BurstGPT CSV trace.

    ``arrival_s`` is ``Timestamp`` unchanged (seconds from 0:00 of the trace's first day).
    ``Timestamp``, ``Request tokens`` and ``Response tokens`` are required; ``Model``,
    ``Total tokens`` and ``Log Type`` are read past. Every request gets class
    ``traffic_class`` and fresh block ids (``ceil(Request tokens / block_tokens)`` of them).

    The ``BurstGPT_*.csv`` files (not the ``without_fails`` ones) hold failed requests with 0
    response tokens. By default (``zero_output="error"``) such a row is a ``TraceError``;
    ``zero_output="one"`` counts it as a one-token output.
    """
    min_output = _check_zero_output(zero_output)
    file, df = _read_csv(path, _BURSTGPT_COLUMNS)
    arrival, time_checks = _seconds_column(df, "Timestamp")
    input_len, input_checks = _int_column(df, "Request tokens", low=1)
    output_len, output_checks = _int_column(df, "Response tokens", low=min_output)
    _raise_first_bad(file, df, [*time_checks, *input_checks, *output_checks])
    output_len = np.maximum(output_len, 1)
    name = _trace_name(path)
    return _lengths_only(name, arrival, input_len, output_len, block_tokens, traffic_class)


# ---------------------------------------------------------------------------- Vidur


_VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


def read_vidur(
    path: str | os.PathLike[str],
    traffic_class: str = "chatbot",
    *,
    block_tokens: int = 512,
) -> RequestSource:
    """Read a Vidur trace CSV (``arrived_at``, ``num_prefill_tokens``, ``num_decode_tokens``).

    ``arrival_s`` is ``arrived_at`` unchanged (seconds). Other columns are read past. Every
    request gets class ``traffic_class`` and fresh block ids: there is no prefix information.
    """
    file, df = _read_csv(path, _VIDUR_COLUMNS)
    arrival, time_checks = _seconds_column(df, "arrived_at")
    input_len, input_checks = _int_column(df, "num_prefill_tokens", low=1)
    output_len, output_checks = _int_column(df, "num_decode_tokens", low=1)
    _raise_first_bad(file, df, [*time_checks, *input_checks, *output_checks])
    name = _trace_name(path)
    return _lengths_only(name, arrival, input_len, output_len, block_tokens, traffic_class)


# ---------------------------------------------------------------------------- JSONL helpers


class _Row:
    """Typed field access on one parsed JSON object, raising ``TraceError`` on bad values."""

    __slots__ = ("file", "line", "obj")

    def __init__(self, file: str, line: int, obj: dict[str, Any]) -> None:
        self.file, self.line, self.obj = file, line, obj

    def fail(self, field: str, what: str) -> TraceError:
        return TraceError(self.file, f"field {field!r}: {what}", line=self.line)

    def get(self, field: str) -> Any:
        if field not in self.obj:
            raise TraceError(self.file, f"missing field {field!r}", line=self.line)
        return self.obj[field]

    def integer(self, field: str, low: int, high: int = 2**63 - 1) -> int:
        value = self.get(field)
        if type(value) is not int:
            raise self.fail(field, f"expected an integer, got {_describe(value)}")
        if value < low:
            raise self.fail(field, f"must be >= {low}, got {value}")
        if value > high:
            raise self.fail(field, f"must be <= {high}, got {value}")
        return value

    def seconds(self, field: str) -> float:
        value = self.get(field)
        if type(value) not in (int, float):
            raise self.fail(field, f"expected a number (seconds), got {_describe(value)}")
        if not (math.isfinite(value) and value >= 0):
            raise self.fail(field, f"must be finite and >= 0, got {value}")
        return float(value)

    def text(self, field: str) -> str:
        value = self.get(field)
        if type(value) is not str or not value:
            raise self.fail(field, f"expected a non-empty string, got {_describe(value)}")
        return value

    def id_list(self, field: str, expected: int, why: str) -> list[int]:
        ids = self.get(field)
        if type(ids) is not list:
            raise self.fail(field, f"expected a list of integers, got {_describe(ids)}")
        for k, h in enumerate(ids):
            if type(h) is not int or not 0 <= h < 2**63:
                raise TraceError(
                    self.file,
                    f"field {field!r}[{k}]: expected an integer in [0, 2**63), got {_describe(h)}",
                    line=self.line,
                )
        if len(ids) != expected:
            raise self.fail(field, f"has {len(ids)} ids, but {why} = {expected}")
        return ids


# ---------------------------------------------------------------------------- Qwen-Bailian


def _is_chained(offsets: np.ndarray, hashes: np.ndarray) -> bool:
    """Whether every id always follows the same predecessor (-1 at a request's start)."""
    if len(hashes) == 0:
        return True
    prev = np.empty_like(hashes)
    prev[0] = -1
    prev[1:] = hashes[:-1]
    starts = offsets[:-1][np.diff(offsets) > 0]
    prev[starts] = -1
    order = np.lexsort((prev, hashes))
    h, p = hashes[order], prev[order]
    return not bool(np.any((h[1:] == h[:-1]) & (p[1:] != p[:-1])))


def _rechain(offsets: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """Replace block ids by chained ones: one new id per distinct (previous id, raw id) path.

    Two requests get the same new id at position ``p`` exactly when their raw ids agree at
    positions ``0..p``. One vectorized pass per block position.
    """
    counts = np.diff(offsets)
    out = np.empty_like(raw)
    if len(raw) == 0:
        return out
    order = np.argsort(-counts, kind="stable")
    neg_sorted = -counts[order]  # ascending
    prev = np.full(len(counts), -1, dtype=np.int64)
    next_id = 0
    for p in range(int(counts.max())):
        rows = order[: int(np.searchsorted(neg_sorted, -p, side="left"))]
        at = offsets[rows] + p
        keys = np.stack([prev[rows], raw[at]], axis=1)
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        ids = next_id + inverse.reshape(-1)
        next_id += len(uniq)
        out[at] = ids
        prev[rows] = ids
    return out


def read_qwen(
    path: str | os.PathLike[str],
    traffic_class: str | None = None,
    *,
    zero_output: str = "error",
) -> RequestSource:
    """Read a Qwen-Bailian JSONL trace (``qwen_traceA_blksz_16.jsonl`` and its siblings).

    - ``arrival_s`` is ``timestamp`` unchanged (seconds from trace start).
    - ``hash_ids`` become the block ids with ``block_tokens = 16``; a row needs
      ``ceil(input_length / 16)`` of them. When the ids are already chained (each id always
      follows the same id, or always starts its request) they are kept as they are;
      otherwise each is replaced by a chained id, so that two requests share block ``p`` only
      when they agree on blocks ``0..p`` (the prefix-cache rule).
    - ``session_id`` is the root ``chat_id`` of the request's chain of ``parent_chat_id``
      links; a parent that is not in the file is taken as the root. A cycle, or one
      ``chat_id`` given two different parents, is a ``TraceError``.
    - The traffic class is the row's ``type`` (``text``, ``search``, ``image``, ``file``, ...,
      kept as class names, sorted), ``"chatbot"`` for a row without one; pass
      ``traffic_class`` to give every request that class instead. ``image_count`` stays 0: an
      ``image`` request's image tokens are already in ``input_length``.
    - ``turn``, when present, must be an integer >= 1; it is not otherwise used.

    ``zero_output`` is as in :func:`read_burstgpt`.
    """
    file = str(path)
    min_output = _check_zero_output(zero_output)
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    hashes: list[int] = []
    counts: list[int] = []
    chats: list[int] = []
    types: list[str | None] = []
    parent_of: dict[int, tuple[int, int]] = {}  # chat -> (parent, line)
    for line, obj in _jsonl_objects(path):
        row = _Row(file, line, obj)
        chat = row.integer("chat_id", 0)
        parent = row.integer("parent_chat_id", -1)
        if parent == chat:
            raise row.fail("parent_chat_id", f"a chat cannot be its own parent ({chat})")
        known = parent_of.get(chat)
        if known is not None and known[0] != parent:
            raise row.fail(
                "parent_chat_id",
                f"chat {chat} has parent {parent} here but {known[0]} on line {known[1]}",
            )
        parent_of.setdefault(chat, (parent, line))
        times.append(row.seconds("timestamp"))
        input_len = row.integer("input_length", 1)
        inputs.append(input_len)
        outputs.append(max(row.integer("output_length", min_output), 1))
        if "turn" in obj:
            row.integer("turn", 1)
        types.append(row.text("type") if "type" in obj else None)
        expected = -(-input_len // QWEN_BLOCK_TOKENS)
        ids = row.id_list(
            "hash_ids", expected, f"input_length {input_len} needs ceil({input_len}/16)"
        )
        hashes.extend(ids)
        counts.append(len(ids))
        chats.append(chat)

    roots = _session_roots(file, parent_of)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    block_ids = np.asarray(hashes, dtype=np.int64)
    if not _is_chained(offsets, block_ids):
        block_ids = _rechain(offsets, block_ids)
    if traffic_class is not None:
        names: tuple[str, ...] = (traffic_class,)
        codes = np.zeros(len(types), dtype=np.int8)
    else:
        labels = [t if t is not None else "chatbot" for t in types]
        names = tuple(sorted(set(labels)))
        if len(names) > 127:
            raise TraceError(file, f"field 'type': {len(names)} distinct types; at most 127")
        index = {name: k for k, name in enumerate(names)}
        codes = np.asarray([index[t] for t in labels], dtype=np.int8)
    return RequestSource.from_columns(
        arrival_s=np.asarray(times, dtype=np.float64),
        input_len=np.asarray(inputs, dtype=np.int64),
        output_len=np.asarray(outputs, dtype=np.int64),
        block_offsets=offsets,
        block_hashes=block_ids,
        block_tokens=QWEN_BLOCK_TOKENS,
        traffic_class=codes,
        class_names=names,
        session_id=np.asarray([roots[c] for c in chats], dtype=np.int64),
        name=_trace_name(path),
        sort=True,
    )


def _session_roots(file: str, parent_of: dict[int, tuple[int, int]]) -> dict[int, int]:
    """Root chat of every chat in ``parent_of``, following parent links (path-compressed)."""
    roots: dict[int, int] = {}
    for start in parent_of:
        path: list[int] = []
        on_path: set[int] = set()
        chat = start
        while chat not in roots:
            link = parent_of.get(chat)
            if link is None or link[0] == -1:  # a root, or a parent outside the file
                roots[chat] = chat
                break
            if chat in on_path:
                raise TraceError(
                    file,
                    f"field 'parent_chat_id': chats {sorted(on_path)} form a cycle",
                    line=link[1],
                )
            path.append(chat)
            on_path.add(chat)
            chat = link[0]
        root = roots[chat]
        for c in path:
            roots[c] = root
    return roots


# ---------------------------------------------------------------------------- TraceLab


def _iso_seconds(row: _Row, k: int, value: Any) -> float:
    """POSIX seconds of an ISO 8601 time (a time without a zone is taken as UTC)."""
    where = f"timing_events[{k}].timestamp"
    if type(value) is not str:
        raise row.fail(where, f"expected an ISO 8601 time string, got {_describe(value)}")
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise row.fail(where, f"expected an ISO 8601 time, got {value!r}") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def _tracelab_arrival(row: _Row) -> float:
    """When the round's request was sent: its last input event, else its first event."""
    events = row.get("timing_events")
    if type(events) is not list or not events:
        raise row.fail("timing_events", f"expected a non-empty list, got {_describe(events)}")
    first = math.inf
    last_input = -math.inf
    for k, event in enumerate(events):
        if type(event) is not dict:
            raise row.fail(f"timing_events[{k}]", f"expected an object, got {_describe(event)}")
        kind = event.get("event_type")
        if type(kind) is not str:
            raise row.fail(
                f"timing_events[{k}].event_type", f"expected a string, got {_describe(kind)}"
            )
        t = _iso_seconds(row, k, event.get("timestamp"))
        first = min(first, t)
        if kind in _TRACELAB_INPUT_EVENTS:
            last_input = max(last_input, t)
    return last_input if last_input > -math.inf else first


def read_tracelab(
    path: str | os.PathLike[str],
    traffic_class: str = "agent",
    *,
    block_tokens: int = 512,
    zero_output: str = "error",
) -> RequestSource:
    """Read a TraceLab ``round_trace.jsonl``: one coding-agent LLM call (round) per line.

    - ``arrival_s``: a round's request is sent when its input is complete, so its time is the
      latest ``user_message``/``tool_result`` event in ``timing_events`` (the first event when
      there is none), in seconds from the earliest such time in the file.
    - ``session_id``: sessions numbered 0, 1, ... in order of first appearance.
    - Blocks: TraceLab gives prefix reuse as a token count, ``prefix_tokens`` (what the
      provider's prompt cache served), not as hashes. Within a session, in ``round_index``
      order, round ``r`` reuses the first ``min(prefix_tokens // block_tokens, full blocks of
      round r-1)`` block ids of round ``r-1`` and gets fresh ids for the rest. So an infinite
      cache serves about ``prefix_tokens`` (rounded down to blocks), except in a session's
      first round, whose cached prefix was written before the trace and counts as a miss.
    - Every round gets class ``traffic_class``; ``output_tokens`` of 0 follows
      ``zero_output`` as in :func:`read_burstgpt`.

    ``input_tokens_total`` >= 1 and ``0 <= prefix_tokens <= input_tokens_total`` are checked;
    two rows with the same ``session_id`` and ``round_index`` are an error.
    """
    file = str(path)
    min_output = _check_zero_output(zero_output)
    if block_tokens < 1:
        raise ValueError(f"block_tokens: expected a positive int, got {block_tokens}")
    sessions: dict[str, int] = {}
    seen: dict[tuple[int, int], int] = {}
    times: list[float] = []
    inputs: list[int] = []
    prefixes: list[int] = []
    outputs: list[int] = []
    session_codes: list[int] = []
    rounds: list[int] = []
    for line, obj in _jsonl_objects(path):
        row = _Row(file, line, obj)
        session = sessions.setdefault(row.text("session_id"), len(sessions))
        round_index = row.integer("round_index", 0)
        if (session, round_index) in seen:
            raise row.fail(
                "round_index",
                f"round {round_index} of this session is already on line "
                f"{seen[session, round_index]}",
            )
        seen[session, round_index] = line
        input_len = row.integer("input_tokens_total", 1)
        prefixes.append(row.integer("prefix_tokens", 0, high=input_len))
        inputs.append(input_len)
        outputs.append(max(row.integer("output_tokens", min_output), 1))
        times.append(_tracelab_arrival(row))
        session_codes.append(session)
        rounds.append(round_index)

    n = len(inputs)
    n_blocks = [-(-i // block_tokens) for i in inputs]
    blocks: list[np.ndarray] = [np.zeros(0, np.int64)] * n
    next_id = 0
    previous: dict[int, int] = {}  # session -> row of its latest round so far
    for i in sorted(range(n), key=lambda r: (session_codes[r], rounds[r])):
        prev = previous.get(session_codes[i])
        reuse = 0
        if prev is not None:
            reuse = min(prefixes[i] // block_tokens, inputs[prev] // block_tokens)
        fresh = np.arange(next_id, next_id + n_blocks[i] - reuse, dtype=np.int64)
        next_id += n_blocks[i] - reuse
        blocks[i] = fresh if prev is None else np.concatenate([blocks[prev][:reuse], fresh])
        previous[session_codes[i]] = i
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_blocks, out=offsets[1:])
    arrival = np.asarray(times, dtype=np.float64)
    return RequestSource.from_columns(
        arrival_s=arrival - arrival.min(),
        input_len=np.asarray(inputs, dtype=np.int64),
        output_len=np.asarray(outputs, dtype=np.int64),
        block_offsets=offsets,
        block_hashes=np.concatenate(blocks),
        block_tokens=block_tokens,
        class_names=(traffic_class,),
        session_id=np.asarray(session_codes, dtype=np.int64),
        name=_trace_name(path),
        sort=True,
    )


# ---------------------------------------------------------------------------- parquet

_PARQUET_COLUMNS = {
    "arrival_s": "float",
    "input_len": "integer",
    "output_len": "integer",
    "traffic_class": "integer",
    "image_count": "integer",
    "session_id": "integer",
}


def write_parquet(source: RequestSource, path: str | os.PathLike[str]) -> None:
    """Write ``source`` as a native parquet trace that :func:`read_parquet` reads back exactly.

    One row per request: ``arrival_s`` (double), ``input_len``, ``output_len``,
    ``session_id`` (int64), ``traffic_class`` (int8 codes), ``image_count`` (int16) and
    ``block_hashes`` (a list of int64 ids). The trace's ``name``, ``block_tokens`` and
    ``class_names`` are JSON under the schema metadata key :data:`PARQUET_METADATA_KEY`.
    zstd-compressed. An unwritable path is a ``TraceError``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    hashes = pa.LargeListArray.from_arrays(
        pa.array(source.block_offsets, type=pa.int64()),
        pa.array(source.block_hashes, type=pa.int64()),
    )
    table = pa.table(
        {
            "arrival_s": pa.array(source.arrival_s, type=pa.float64()),
            "input_len": pa.array(source.input_len, type=pa.int64()),
            "output_len": pa.array(source.output_len, type=pa.int64()),
            "traffic_class": pa.array(source.traffic_class, type=pa.int8()),
            "image_count": pa.array(source.image_count, type=pa.int16()),
            "session_id": pa.array(source.session_id, type=pa.int64()),
            "block_hashes": hashes,
        }
    )
    meta = {
        "version": _PARQUET_VERSION,
        "name": source.name,
        "block_tokens": source.block_tokens,
        "class_names": list(source.class_names),
    }
    table = table.replace_schema_metadata({PARQUET_METADATA_KEY: json.dumps(meta)})
    try:
        pq.write_table(table, str(path), compression="zstd")
    except OSError as e:
        raise TraceError(str(path), f"cannot write: {e}") from None


def _parquet_meta(file: str, raw: dict[bytes, bytes] | None) -> tuple[str, int, tuple[str, ...]]:
    """(name, block_tokens, class_names) from the schema metadata, strictly checked."""
    key = PARQUET_METADATA_KEY.decode()
    if not raw or PARQUET_METADATA_KEY not in raw:
        raise TraceError(file, f"no {key!r} schema metadata: not a trace written by write_parquet")
    try:
        meta = json.loads(raw[PARQUET_METADATA_KEY])
    except ValueError as e:
        raise TraceError(file, f"metadata {key!r}: invalid JSON: {e}") from None
    if type(meta) is not dict:
        raise TraceError(file, f"metadata {key!r}: expected a JSON object, got {_describe(meta)}")
    for field in ("version", "name", "block_tokens", "class_names"):
        if field not in meta:
            raise TraceError(file, f"metadata {key!r}: missing field {field!r}")
    if meta["version"] != _PARQUET_VERSION:
        raise TraceError(
            file,
            f"metadata {key!r}: version {meta['version']!r} is not supported "
            f"(this deepinfer-sim reads version {_PARQUET_VERSION})",
        )
    name, block_tokens, names = meta["name"], meta["block_tokens"], meta["class_names"]
    if type(name) is not str:
        raise TraceError(file, f"metadata field 'name': expected a string, got {_describe(name)}")
    if type(block_tokens) is not int or block_tokens < 1:
        raise TraceError(
            file,
            f"metadata field 'block_tokens': expected an integer >= 1, got "
            f"{_describe(block_tokens)}",
        )
    if type(names) is not list or not names or not all(type(c) is str and c for c in names):
        raise TraceError(
            file,
            f"metadata field 'class_names': expected a list of non-empty strings, got "
            f"{_describe(names)}",
        )
    return name, block_tokens, tuple(names)


def read_parquet(path: str | os.PathLike[str], traffic_class: str | None = None) -> RequestSource:
    """Read a native parquet trace written by :func:`write_parquet`.

    Columns are checked for presence, type and nulls (extra columns are ignored), then the
    whole source is validated; problems are a ``TraceError`` naming the column and the
    0-based row. Rows out of arrival order are sorted (stably). ``traffic_class``, when given,
    replaces the stored classes: every request gets that one class.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = str(path)
    data = read_bytes(path)
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as e:
        raise TraceError(file, f"not a readable parquet file: {e}") from None
    name, block_tokens, class_names = _parquet_meta(file, table.schema.metadata)
    columns: dict[str, np.ndarray] = {}
    for column, kind in _PARQUET_COLUMNS.items():
        col = _parquet_column(file, table, column)
        ok = pa.types.is_floating(col.type) or pa.types.is_integer(col.type)
        if kind == "integer":
            ok = pa.types.is_integer(col.type)
        if not ok:
            raise TraceError(file, f"column {column!r}: expected {kind} values, got {col.type}")
        columns[column] = col.to_numpy(zero_copy_only=False)
    col = _parquet_column(file, table, "block_hashes")
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) or not (
        pa.types.is_integer(col.type.value_type)
    ):
        raise TraceError(
            file, f"column 'block_hashes': expected a list of integers, got {col.type}"
        )
    values = col.flatten()
    if values.null_count:
        raise TraceError(file, "column 'block_hashes': null block ids")
    offsets = np.asarray(col.offsets, dtype=np.int64)
    offsets = offsets - offsets[0]
    if traffic_class is not None:
        class_names = (traffic_class,)
        columns["traffic_class"] = np.zeros(len(table), dtype=np.int8)
    try:
        return RequestSource.from_columns(
            block_offsets=offsets,
            block_hashes=values.to_numpy(zero_copy_only=False),
            block_tokens=block_tokens,
            class_names=class_names,
            name=name,
            sort=True,
            **columns,
        )
    except ValueError as e:
        raise TraceError(file, f"invalid trace data: {e}") from None


def _parquet_column(file: str, table: Any, column: str) -> Any:
    """One column as a single (combined) arrow array, without nulls."""
    if column not in table.column_names:
        raise TraceError(
            file, f"missing column {column!r}; columns: {', '.join(table.column_names)}"
        )
    col = table.column(column).combine_chunks()
    if col.null_count:
        row = int(np.flatnonzero(np.asarray(col.is_null()))[0])
        raise TraceError(file, f"column {column!r}: null value (first at row {row})")
    return col


# ---------------------------------------------------------------------------- dispatch


def read_format(
    path: str | os.PathLike[str], format: str, traffic_class: str | None = None
) -> RequestSource:
    """Read ``path`` as one of this module's formats (used by ``read_trace``).

    ``traffic_class=None`` keeps each format's own default: ``"chatbot"`` for BurstGPT and
    Vidur, ``"agent"`` for TraceLab, the ``type`` field for Qwen, the stored classes for
    parquet.
    """
    if format == "burstgpt":
        return read_burstgpt(path, traffic_class or "chatbot")
    if format == "vidur":
        return read_vidur(path, traffic_class or "chatbot")
    if format == "qwen":
        return read_qwen(path, traffic_class)
    if format == "tracelab":
        return read_tracelab(path, traffic_class or "agent")
    if format == "parquet":
        return read_parquet(path, traffic_class)
    if format == SERVEGEN:  # a workload description: one synthesized day of the client
        from deepinfer_sim.traces.synth.multimodal import read_servegen

        return read_servegen(path)
    raise TraceError(str(path), f"unknown trace format {format!r}; accepted: {', '.join(FORMATS)}")
