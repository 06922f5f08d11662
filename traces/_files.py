"""Reading trace files into memory: missing files, gzip and format sniffing.

Every failure becomes a :class:`~deepinfer_sim.errors.TraceError` naming the file, so readers
can stay about parsing. Compression is recognised by the gzip magic bytes, not by the file
name, so ``trace.jsonl`` that is really gzip-compressed still reads.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from pathlib import Path

from deepinfer_sim.errors import TraceError

__all__ = ["FORMATS", "SERVEGEN", "read_bytes", "sniff_format"]

FORMATS = ("mooncake", "azure", "burstgpt", "qwen", "vidur", "tracelab", "parquet")
"""Trace formats :func:`deepinfer_sim.traces.read_trace` accepts (one module of
``traces/readers/`` each)."""

SERVEGEN = "servegen"
"""What :func:`sniff_format` says for ServeGen rate/length files, which hold no requests."""

_SERVEGEN_RATE_ROW = re.compile(rb"^\d+(\.\d*)?,[^,]*,[^,]*,(Gamma|Weibull|Exponential)?,")

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


def _head(path: str | os.PathLike[str], size: int = 1 << 16) -> bytes:
    """The first ``size`` bytes (decompressed when gzip); empty when unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read(size)
            if not data.startswith(_GZIP_MAGIC):
                return data
        with gzip.open(path, "rb") as g:
            return g.read(size)
    except (OSError, EOFError, zlib.error):
        return b""


def _sniff_json(head: bytes) -> str:
    """Mooncake unless the first object has the Qwen-Bailian or TraceLab keys.

    Keys are looked for in the text of the first line, which may be cut short by ``head``.
    """
    line = head.split(b"\n", 1)[0]
    if re.search(rb'"(chat_id|parent_chat_id)"\s*:', line):
        return "qwen"
    if re.search(rb'"(input_tokens_total|round_index)"\s*:', line):
        return "tracelab"
    if re.match(rb'\{\s*"\d+"\s*:\s*\{\s*"(text|image|audio|video|output)_', head):
        return SERVEGEN  # chunk-*-dataset.json: {window: {field: PMF}}
    return "mooncake"


def _sniff_csv(head: bytes) -> str:
    """Azure unless the header names another format's columns (or it is a ServeGen rate file)."""
    line = head.split(b"\n", 1)[0].strip()
    header = line.lower()
    if b"request tokens" in header and b"response tokens" in header:
        return "burstgpt"
    if b"arrived_at" in header:
        return "vidur"
    if _SERVEGEN_RATE_ROW.match(line):
        return SERVEGEN
    return "azure"


def sniff_format(path: str | os.PathLike[str]) -> str:
    """Guess the trace format from the file name and its first line.

    ``.jsonl``/``.json``/``.ndjson`` (or a first line starting with ``{``) is Mooncake unless
    the first object has Qwen-Bailian or TraceLab fields; ``.csv`` (or a first line starting
    with ``TIMESTAMP``) is Azure unless the header is BurstGPT's or Vidur's; ``.parquet`` (or
    parquet's magic bytes) is the native format. ServeGen rate and length files come back as
    :data:`SERVEGEN`, which no reader accepts.
    """
    file = str(path)
    name = Path(path).name.lower().removesuffix(".gz")
    if name.endswith(".parquet"):
        return "parquet"
    head = _head(path)
    first = head.lstrip()[:200]
    if name.endswith((".jsonl", ".json", ".ndjson")) or first.startswith(b"{"):
        return _sniff_json(head.lstrip())
    if name.endswith(".csv") or first.upper().startswith(b"TIMESTAMP"):
        return _sniff_csv(head.lstrip())
    if head.startswith(b"PAR1"):
        return "parquet"
    if not head:
        read_bytes(path)  # says why when the file is missing or unreadable
    raise TraceError(
        file,
        "cannot tell the trace format from the name or content; "
        f"pass format= one of {', '.join(FORMATS)}",
    )
