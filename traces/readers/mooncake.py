"""Mooncake FAST'25 JSONL: ``timestamp`` (ms), ``input_length``, ``output_length`` and
``hash_ids`` (chained 512-token prefix blocks), one JSON object per line.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from deepinfer_sim.errors import TraceError
from deepinfer_sim.traces.readers._common import _describe, _jsonl_objects, _trace_name
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
