"""Mooncake FAST'25 JSONL: ``timestamp`` (ms), ``input_length``, ``output_length`` and
``hash_ids`` (chained 512-token prefix blocks), one JSON object per line.
"""

from __future__ import annotations

import math
import os
from array import array
from typing import Any

import numpy as np

from deepinfer_sim.errors import TraceError
from deepinfer_sim.traces.readers._common import (
    MAX_ARRIVAL_S,
    _describe,
    _jsonl_objects,
    _trace_name,
)
from deepinfer_sim.traces.source import RequestSource

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry in the Mooncake traces."""


_MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


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
    if ts > MAX_ARRIVAL_S * 1000.0:
        raise TraceError(
            file,
            f"field 'timestamp': must be at most {MAX_ARRIVAL_S * 1000:g} ms (31.7 years) from the "
            f"trace's start, got {ts}",
            line=line,
        )
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


MooncakeColumns = dict[str, np.ndarray]
"""A Mooncake trace as the reader parsed it, in file order: ``arrival_s``, ``input_len``,
``output_len``, ``block_offsets`` and ``block_hashes`` (what :func:`mooncake_source` takes)."""


def read_mooncake(path: str | os.PathLike[str], traffic_class: str = "chatbot") -> RequestSource:
    """Read a Mooncake FAST'25 JSONL trace (optionally gzip-compressed).

    ``timestamp`` is milliseconds from trace start and becomes ``arrival_s`` unchanged apart
    from the unit. Every request gets class ``traffic_class``; there are no sessions or images.
    """
    return mooncake_source(mooncake_columns(path), traffic_class, _trace_name(path))


def mooncake_columns(path: str | os.PathLike[str]) -> MooncakeColumns:
    """Parse and check every line of a Mooncake trace into columns, in file order."""
    file = str(path)
    timestamps: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    hashes = array("q")  # 8 bytes an id, not a Python int each
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
    return {
        "arrival_s": np.asarray(timestamps, dtype=np.float64) / 1000.0,
        "input_len": np.asarray(inputs, dtype=np.int64),
        "output_len": np.asarray(outputs, dtype=np.int64),
        "block_offsets": offsets,
        "block_hashes": np.asarray(hashes, dtype=np.int64),
    }


def mooncake_source(columns: MooncakeColumns, traffic_class: str, name: str) -> RequestSource:
    """The arrival-sorted source of parsed Mooncake columns, every request of one class."""
    return RequestSource.from_columns(
        arrival_s=columns["arrival_s"],
        input_len=columns["input_len"],
        output_len=columns["output_len"],
        block_offsets=columns["block_offsets"],
        block_hashes=columns["block_hashes"],
        block_tokens=MOONCAKE_BLOCK_TOKENS,
        class_names=(traffic_class,),
        name=name,
        sort=True,
    )
