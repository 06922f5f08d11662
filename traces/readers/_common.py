"""What every trace reader shares: strict row checks that name the file, line and field,
JSONL and CSV reading, and sources whose requests carry lengths only (fresh block ids).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from deepinfer_sim.errors import TraceError
from deepinfer_sim.traces._files import read_bytes
from deepinfer_sim.traces.source import RequestSource

if TYPE_CHECKING:  # pandas is imported by the CSV readers only, when they run
    import pandas as pd

MAX_ARRIVAL_S = 1e9
"""The latest arrival a trace may hold, in seconds from its start (31.7 years): the simulator's
clock is float64 seconds, which keep sub-microsecond steps only that far (a timestamp of 1e300
made ``run`` spin and ``trace stats`` fail), and no run simulates more than a year anyway."""

_TOO_LATE = f"must be at most {MAX_ARRIVAL_S:g} s (31.7 years) from the trace's start"


def check_arrival_span(file: str, arrival: np.ndarray, line_of_row: Any = None) -> None:
    """Refuse the first arrival past :data:`MAX_ARRIVAL_S` (seconds from the trace start, after
    a reader re-timed it) with a ``TraceError`` naming its line (``line_of_row(k)``; default
    ``k + 1``, one JSON row per line)."""
    late = arrival > MAX_ARRIVAL_S
    if late.any():
        k = int(np.argmax(late))
        line = line_of_row(k) if line_of_row is not None else k + 1
        raise TraceError(
            file, f"arrival {float(arrival[k]):.6g} s after the first {_TOO_LATE}", line=line
        )


def _trace_name(path: str | os.PathLike[str]) -> str:
    name = Path(path).name
    for suffix in (".gz", ".jsonl", ".json", ".ndjson", ".csv"):
        name = name.removesuffix(suffix)
    return name


def _describe(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{type(value).__name__} {text}"


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
    import pandas as pd

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
        import pandas as pd

        coerced = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64)
        ok = np.isfinite(coerced)
        values = np.where(ok, coerced, 0.0)
    return values, [
        (~ok, column, "expected a finite number of seconds"),
        (ok & (values < 0), column, "must be >= 0"),
        (ok & (values > MAX_ARRIVAL_S), column, _TOO_LATE),
    ]


_ZERO_OUTPUT = ("error", "one")


_Check = tuple[np.ndarray, str, str]
"""(bad-row mask, column, what is expected) for one CSV column check."""


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
        if value > MAX_ARRIVAL_S:
            raise self.fail(field, f"{_TOO_LATE}, got {value}")
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


def read_lengths_csv(
    path: str | os.PathLike[str],
    columns: tuple[str, str, str],
    traffic_class: str,
    block_tokens: int,
    min_output: int = 1,
) -> RequestSource:
    """A lengths-only CSV: ``columns`` = (arrival seconds, input tokens, output tokens), every
    row checked; outputs below 1 (allowed by ``min_output`` = 0) count as one token."""
    t_col, in_col, out_col = columns
    file, df = _read_csv(path, columns)
    arrival, time_checks = _seconds_column(df, t_col)
    input_len, input_checks = _int_column(df, in_col, low=1)
    output_len, output_checks = _int_column(df, out_col, low=min_output)
    _raise_first_bad(file, df, [*time_checks, *input_checks, *output_checks])
    output_len = np.maximum(output_len, 1)
    name = _trace_name(path)
    return _lengths_only(name, arrival, input_len, output_len, block_tokens, traffic_class)
