"""Readers for public trace formats, each returning a :class:`RequestSource`.

- Mooncake FAST'25 JSONL: one JSON object per line with ``timestamp`` (ms), ``input_length``,
  ``output_length`` and ``hash_ids`` (chained 512-token prefix blocks).
- Azure LLM inference 2023 CSV (the Splitwise trace): ``TIMESTAMP`` (wall clock),
  ``ContextTokens``, ``GeneratedTokens``; no prefix information.

Both accept gzip-compressed files. Readers are strict: any malformed row raises
:class:`~deepinfer_sim.errors.TraceError` with the file, the 1-based line and the field; no row
is ever skipped or repaired. Rows are sorted stably by arrival time, so ties keep file order.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from deepinfer_sim.errors import TraceError
from deepinfer_sim.traces._files import FORMATS, SERVEGEN, read_bytes, sniff_format
from deepinfer_sim.traces.builtin import resolve_trace_path
from deepinfer_sim.traces.source import RequestSource

__all__ = ["read_azure", "read_mooncake", "read_trace"]

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry in the Mooncake traces."""

_MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _trace_name(path: str | os.PathLike[str]) -> str:
    name = Path(path).name
    for suffix in (".gz", ".jsonl", ".json", ".ndjson", ".csv"):
        name = name.removesuffix(suffix)
    return name


def _describe(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{type(value).__name__} {text}"


# ---------------------------------------------------------------------------- Mooncake rows


def _mooncake_row(obj: Any, file: str, line: int) -> tuple[float, int, int, list[int]]:
    """Check one parsed JSONL object; return (timestamp_ms, input, output, hash_ids)."""
    if type(obj) is not dict:
        raise TraceError(file, f"expected a JSON object, got {_describe(obj)}", line=line)
    for field in _MOONCAKE_FIELDS:
        if field not in obj:
            raise TraceError(file, f"missing field {field!r}", line=line)
    ts = obj["timestamp"]
    if type(ts) not in (int, float):
        raise TraceError(
            file, f"field 'timestamp': expected a number (ms), got {_describe(ts)}", line=line
        )
    if not (math.isfinite(ts) and ts >= 0):
        raise TraceError(file, f"field 'timestamp': must be finite and >= 0, got {ts}", line=line)
    lengths = []
    for field in ("input_length", "output_length"):
        value = obj[field]
        if type(value) is not int:
            raise TraceError(
                file, f"field {field!r}: expected an integer, got {_describe(value)}", line=line
            )
        if value < 1:
            raise TraceError(file, f"field {field!r}: must be >= 1, got {value}", line=line)
        lengths.append(value)
    input_len, output_len = lengths
    hash_ids = obj["hash_ids"]
    if type(hash_ids) is not list:
        raise TraceError(
            file, f"field 'hash_ids': expected a list of integers, got {_describe(hash_ids)}", line
        )
    for k, h in enumerate(hash_ids):
        if type(h) is not int or not 0 <= h < 2**63:
            raise TraceError(
                file,
                f"field 'hash_ids'[{k}]: expected an integer in [0, 2**63), got {_describe(h)}",
                line=line,
            )
    expected = -(-input_len // MOONCAKE_BLOCK_TOKENS)
    if len(hash_ids) != expected:
        raise TraceError(
            file,
            f"field 'hash_ids': has {len(hash_ids)} ids, but input_length {input_len} needs "
            f"ceil({input_len}/{MOONCAKE_BLOCK_TOKENS}) = {expected}",
            line=line,
        )
    return ts, input_len, output_len, hash_ids


# ---------------------------------------------------------------------------- shared helpers


def _jsonl_objects(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line, object)`` for every line; blank lines and non-objects are errors."""
    file = str(path)
    data = read_bytes(path)
    if not data.strip():
        raise TraceError(file, "file is empty: no requests")
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    for line, raw in enumerate(lines, start=1):
        if not raw.strip():
            raise TraceError(file, "blank line; expected one JSON object per line", line=line)
        try:
            obj = json.loads(raw)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            col = f" at column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
            raise TraceError(file, f"invalid JSON: {msg}{col}", line=line) from None
        if type(obj) is not dict:
            raise TraceError(file, f"expected a JSON object, got {_describe(obj)}", line=line)
        yield line, obj


def _fresh_blocks(input_len: np.ndarray, block_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR offsets and never-repeated block ids for a trace without prefix information."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens: expected a positive int, got {block_tokens}")
    counts = -(-input_len // block_tokens)
    offsets = np.zeros(len(input_len) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets, np.arange(offsets[-1], dtype=np.int64)


def _lengths_only(
    name: str,
    arrival: np.ndarray,
    input_len: np.ndarray,
    output_len: np.ndarray,
    block_tokens: int,
    traffic_class: str,
    image_count: np.ndarray | None = None,
) -> RequestSource:
    """A one-class source without prefix information: fresh block ids for every request."""
    offsets, ids = _fresh_blocks(input_len, block_tokens)
    return RequestSource.from_columns(
        arrival_s=arrival,
        input_len=input_len,
        output_len=output_len,
        block_offsets=offsets,
        block_hashes=ids,
        block_tokens=block_tokens,
        class_names=(traffic_class,),
        image_count=image_count,
        name=name,
        sort=True,
    )


# ---------------------------------------------------------------------------- Mooncake


def read_mooncake(path: str | os.PathLike[str], traffic_class: str = "chatbot") -> RequestSource:
    """Read a Mooncake FAST'25 JSONL trace (optionally gzip-compressed).

    ``timestamp`` is milliseconds from trace start and becomes ``arrival_s`` unchanged apart
    from the unit. Every request gets class ``traffic_class``; there are no sessions or images.
    """
    file = str(path)
    timestamps: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    hashes: list[int] = []
    counts: list[int] = []
    for line, obj in _jsonl_objects(path):
        ts, input_len, output_len, hash_ids = _mooncake_row(obj, file, line)
        timestamps.append(ts)
        inputs.append(input_len)
        outputs.append(output_len)
        hashes.extend(hash_ids)
        counts.append(len(hash_ids))
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return RequestSource.from_columns(
        arrival_s=np.asarray(timestamps, dtype=np.float64) / 1000.0,
        input_len=np.asarray(inputs, dtype=np.int64),
        output_len=np.asarray(outputs, dtype=np.int64),
        block_offsets=offsets,
        block_hashes=np.asarray(hashes, dtype=np.int64),
        block_tokens=MOONCAKE_BLOCK_TOKENS,
        class_names=(traffic_class,),
        name=_trace_name(path),
        sort=True,
    )


# ---------------------------------------------------------------------------- CSV helpers and Azure


_Check = tuple[np.ndarray, str, str]
"""(bad-row mask, column, what is expected) for one CSV column check."""


def _int_column(df: pd.DataFrame, column: str, low: int) -> tuple[np.ndarray, list[_Check]]:
    """Parse an integer column (values 0 where bad) and return it with its checks."""
    text = df[column].fillna("").str.strip()
    ok = text.str.fullmatch(r"[+-]?\d{1,18}").to_numpy(dtype=bool)
    values = text.where(ok, "0").astype(np.int64).to_numpy()
    return values, [
        (~ok, column, "expected an integer"),
        (ok & (values < low), column, f"must be >= {low}"),
    ]


def _read_csv(path: str | os.PathLike[str], required: tuple[str, ...]) -> tuple[str, pd.DataFrame]:
    """Parse a CSV with a header into string columns; check the ``required`` columns."""
    file = str(path)
    data = read_bytes(path)
    if not data.strip():
        raise TraceError(file, "file is empty: no header and no requests")
    try:
        df = pd.read_csv(
            io.BytesIO(data),
            dtype=str,
            na_filter=False,
            keep_default_na=False,
            skip_blank_lines=False,
            encoding="utf-8",
        )
    except pd.errors.ParserError as e:
        match = re.search(r"in line (\d+)", str(e))
        line = int(match.group(1)) if match else None
        raise TraceError(file, f"malformed CSV: {str(e).splitlines()[-1]}", line=line) from None
    except UnicodeDecodeError as e:
        raise TraceError(file, f"not UTF-8 text: {e}") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise TraceError(
            file,
            f"missing column(s) {missing}; expected a header with {','.join(required)}, "
            f"got {','.join(map(str, df.columns))}",
            line=1,
        )
    if df.empty:
        raise TraceError(file, "no requests after the header line")
    return file, df


def _raise_first_bad(file: str, df: pd.DataFrame, checks: list[_Check]) -> None:
    """Raise for the earliest bad row over all checks (data row k is file line k + 2)."""
    firsts = [(int(np.argmax(bad)), i) for i, (bad, _, _) in enumerate(checks) if bad.any()]
    if firsts:
        k, i = min(firsts)
        _, column, what = checks[i]
        raise TraceError(file, f"column {column!r}: {what}, got {df[column].iloc[k]!r}", line=k + 2)


def read_azure(
    path: str | os.PathLike[str],
    traffic_class: str = "chatbot",
    *,
    block_tokens: int = 512,
    zero_output: str = "error",
) -> RequestSource:
    """Read an Azure LLM inference 2023 CSV trace (optionally gzip-compressed).

    ``arrival_s`` counts seconds from the earliest ``TIMESTAMP`` (kept to 100 ns). The trace
    has no prefix information, so every request gets fresh block ids that no other request
    shares (``ceil(ContextTokens / block_tokens)`` of them): a prefix cache finds no reuse.

    ``GeneratedTokens`` of 0 cannot be simulated (a request needs one output token). By
    default (``zero_output="error"``) such a row is a ``TraceError``; ``zero_output="one"``
    counts it as a one-token output instead. The two 2023 files have no such rows.
    """
    if zero_output not in ("error", "one"):
        raise ValueError(f"zero_output: expected 'error' or 'one', got {zero_output!r}")
    file, df = _read_csv(path, _AZURE_COLUMNS)

    stamps = df["TIMESTAMP"].str.strip()
    parsed = pd.to_datetime(stamps, format="ISO8601", errors="coerce")
    input_len, input_checks = _int_column(df, "ContextTokens", low=1)
    min_output = 0 if zero_output == "one" else 1
    output_len, output_checks = _int_column(df, "GeneratedTokens", low=min_output)
    time_check: _Check = (
        parsed.isna().to_numpy(),
        "TIMESTAMP",
        "expected a date-time like '2023-11-16 18:15:46.6805900'",
    )
    _raise_first_bad(file, df, [time_check, *input_checks, *output_checks])

    if getattr(parsed.dt, "tz", None) is not None:
        parsed = parsed.dt.tz_convert(None)
    ns = parsed.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    arrival = (ns - ns.min()) / 1e9
    output_len = np.maximum(output_len, 1)

    name = _trace_name(path)
    return _lengths_only(name, arrival, input_len, output_len, block_tokens, traffic_class)


# ---------------------------------------------------------------------------- dispatch


def read_trace(
    path: str | os.PathLike[str],
    format: str | None = None,
    traffic_class: str | None = None,
) -> RequestSource:
    """Read a trace file or a shipped one (``"builtin:NAME"``).

    ``format`` is one of :data:`FORMATS` (``"mooncake"``, ``"azure"``, or one read by
    :mod:`deepinfer_sim.traces.formats`); when omitted it comes from the builtin table, else
    from the file name and first line (see :func:`sniff_format`). ``traffic_class`` defaults to
    the builtin's class, else the format's default (``"chatbot"`` for most).
    """
    resolved, builtin_format, builtin_class = resolve_trace_path(path)
    fmt = format if format is not None else builtin_format
    if fmt is None:
        fmt = sniff_format(resolved)
    cls = traffic_class or builtin_class or "chatbot"
    if fmt == "mooncake":
        source = read_mooncake(resolved, traffic_class=cls)
    elif fmt == "azure":
        source = read_azure(resolved, traffic_class=cls)
    elif fmt in FORMATS or fmt == SERVEGEN:
        from deepinfer_sim.traces.formats import read_format  # imports this module

        source = read_format(resolved, fmt, traffic_class=traffic_class or builtin_class)
    else:
        raise TraceError(str(path), f"unknown trace format {fmt!r}; accepted: {', '.join(FORMATS)}")
    if builtin_format is not None:
        source = source.with_name(str(path).removeprefix("builtin:"))
    return source
