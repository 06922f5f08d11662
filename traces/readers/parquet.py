"""The native format: :func:`write_parquet` stores every column of a source (block hashes as a
list column; name, block size and class names in the file's key-value metadata) and
:func:`read_parquet` reads it back exactly.

Every data page carries a CRC checksum, verified on read, so a flipped bit in a stored trace is
a ``TraceError`` naming the file rather than different requests read silently (zstd alone
caught about one flip in eight). Both need pyarrow >= 15; pyarrow 14, the oldest supported,
writes and reads without them.
"""

from __future__ import annotations

import inspect
import json
import os
from functools import cache
from typing import Any

import numpy as np

from deepinfer_sim.errors import TraceError
from deepinfer_sim.traces._files import read_bytes
from deepinfer_sim.traces.readers._common import MAX_ARRIVAL_S, _describe
from deepinfer_sim.traces.source import RequestSource

PARQUET_METADATA_KEY = b"deepinfer_sim.trace"
"""Key of the JSON metadata (version, name, block_tokens, class_names) in a native parquet."""


_PARQUET_VERSION = 1


@cache
def _checksum_options() -> tuple[dict[str, bool], dict[str, bool]]:
    """(write_table, read_table) keywords that write and verify page checksums, where this
    pyarrow has them (15 and later); none on older ones."""
    import pyarrow.parquet as pq

    write = "write_page_checksum" in inspect.signature(pq.write_table).parameters
    read = "page_checksum_verification" in inspect.signature(pq.read_table).parameters
    return (
        {"write_page_checksum": True} if write else {},
        {"page_checksum_verification": True} if read else {},
    )


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
    zstd-compressed, with a CRC checksum on every page. An unwritable path is a ``TraceError``.
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
        pq.write_table(table, str(path), compression="zstd", **_checksum_options()[0])
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
    replaces the stored classes: every request gets that one class. A page whose CRC checksum
    does not match (the file changed after it was written) is a ``TraceError``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = str(path)
    data = read_bytes(path)
    try:
        table = pq.read_table(pa.BufferReader(data), **_checksum_options()[1])
    except (pa.ArrowException, OSError) as e:
        if "checksum" in str(e).lower():
            raise TraceError(
                file,
                f"corrupt: a data page fails its CRC checksum, so the file changed after it was "
                f"written (write it again from its source trace) ({e})",
            ) from None
        raise TraceError(file, f"not a readable parquet file: {e}") from None
    name, block_tokens, class_names = _parquet_meta(file, table.schema.metadata)
    columns: dict[str, Any] = {}  # arrays, passed as from_columns keywords
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
    late = columns["arrival_s"] > MAX_ARRIVAL_S
    if late.any():
        k = int(np.argmax(late))
        raise TraceError(
            file,
            f"column 'arrival_s': must be at most {MAX_ARRIVAL_S:g} s (31.7 years) from the "
            f"trace's start, got {float(columns['arrival_s'][k]):.6g} (first at row {k})",
        )
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
