"""Reading trace files into memory: missing files, gzip and format sniffing.

Every failure becomes a :class:`~deepinfer_sim.errors.TraceError` naming the file, so readers
can stay about parsing. Compression is recognised by the gzip magic bytes, not by the file
name, so ``trace.jsonl`` that is really gzip-compressed still reads.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

from deepinfer_sim.errors import TraceError

__all__ = ["FORMATS", "read_bytes", "sniff_format"]

FORMATS = ("mooncake", "azure")
"""Trace formats :func:`deepinfer_sim.traces.read_trace` accepts."""

_GZIP_MAGIC = b"\x1f\x8b"


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The file's content, decompressed when it is gzip; ``TraceError`` when unreadable."""
    file = str(path)
    p = Path(path)
    if not p.exists():
        raise TraceError(file, "no such file")
    if p.is_dir():
        raise TraceError(file, "is a directory, expected a trace file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise TraceError(file, f"cannot read: {e.strerror or e}") from None
    if data.startswith(_GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceError(file, f"corrupt gzip data: {e}") from None
    return data


def sniff_format(path: str | os.PathLike[str]) -> str:
    """Guess the trace format from the file name, else from the first line of content."""
    file = str(path)
    name = Path(path).name.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "mooncake"
    if name.endswith(".csv"):
        return "azure"
    first = read_bytes(path).lstrip()[:200]
    if first.startswith(b"{"):
        return "mooncake"
    if first.upper().startswith(b"TIMESTAMP"):
        return "azure"
    raise TraceError(
        file,
        "cannot tell the trace format from the name or content; "
        f"pass format= one of {', '.join(FORMATS)}",
    )
