"""Trace readers, one module per public format, and the registry ``read_trace`` dispatches on.

Every reader turns one format into a :class:`RequestSource` and is strict: any malformed row
raises :class:`~deepinfer_sim.errors.TraceError` naming the file, the 1-based line (for text
formats; a 0-based row for parquet) and the field. No row is skipped or repaired, except where a
keyword argument says how (``zero_output``). Rows are sorted stably by arrival, so ties keep file
order. Text files may be gzip-compressed.

ServeGen's ``chunk-*-trace.csv`` / ``chunk-*-dataset.json`` files are *not* request traces but
per-client rate and length distributions: ``read_format`` hands them to the multimodal
generator (one synthesized day of the client).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from deepinfer_sim.errors import TraceError
from deepinfer_sim.traces._files import FORMATS, SERVEGEN, sniff_format
from deepinfer_sim.traces.builtin import resolve_trace_path
from deepinfer_sim.traces.readers.azure import read_azure
from deepinfer_sim.traces.readers.burstgpt import read_burstgpt
from deepinfer_sim.traces.readers.mooncake import (
    MOONCAKE_BLOCK_TOKENS,
    mooncake_source,
    read_mooncake,
)
from deepinfer_sim.traces.readers.parquet import PARQUET_METADATA_KEY, read_parquet, write_parquet
from deepinfer_sim.traces.readers.qwen import QWEN_BLOCK_TOKENS, read_qwen
from deepinfer_sim.traces.readers.tracelab import read_tracelab
from deepinfer_sim.traces.readers.vidur import read_vidur
from deepinfer_sim.traces.source import RequestSource

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "PARQUET_METADATA_KEY",
    "QWEN_BLOCK_TOKENS",
    "READERS",
    "read_azure",
    "read_burstgpt",
    "read_format",
    "read_mooncake",
    "read_parquet",
    "read_qwen",
    "read_trace",
    "read_tracelab",
    "read_vidur",
    "write_parquet",
]

Reader = Callable[[str | os.PathLike[str], str | None], RequestSource]

READERS: dict[str, Reader] = {
    "mooncake": lambda path, cls: read_mooncake(path, cls or "chatbot"),
    "azure": lambda path, cls: read_azure(path, cls or "chatbot"),
    "burstgpt": lambda path, cls: read_burstgpt(path, cls or "chatbot"),
    "qwen": read_qwen,  # no class: each request's ``type``
    "vidur": lambda path, cls: read_vidur(path, cls or "chatbot"),
    "tracelab": lambda path, cls: read_tracelab(path, cls or "agent"),
    "parquet": read_parquet,  # no class: the stored ones
}
"""Format name -> reader(path, traffic_class or None for the format's own default)."""


def read_format(
    path: str | os.PathLike[str], format: str, traffic_class: str | None = None
) -> RequestSource:
    """Read ``path`` as ``format`` (one of :data:`FORMATS`, or ServeGen's client files).

    ``traffic_class=None`` keeps each format's own default: ``"chatbot"`` for Mooncake, Azure,
    BurstGPT and Vidur, ``"agent"`` for TraceLab, the ``type`` field for Qwen, the stored classes
    for parquet.
    """
    if format == SERVEGEN:
        from deepinfer_sim.traces.synth.multimodal import read_servegen

        return read_servegen(path)
    reader = READERS.get(format)
    if reader is None:
        raise TraceError(
            str(path), f"unknown trace format {format!r}; accepted: {', '.join(FORMATS)}"
        )
    return reader(path, traffic_class)


def read_trace(
    path: str | os.PathLike[str],
    format: str | None = None,
    traffic_class: str | None = None,
) -> RequestSource:
    """Read a trace file or a shipped one (``"builtin:NAME"``).

    ``format`` is one of :data:`FORMATS`; when omitted it comes from the builtin table, else from
    the file name and first line (see :func:`sniff_format`). ``traffic_class`` defaults to the
    builtin's class, else the format's default (``"chatbot"`` for most).
    """
    resolved, builtin_format, builtin_class = resolve_trace_path(path)
    fmt = format if format is not None else builtin_format
    if fmt is None:
        fmt = sniff_format(resolved)
    if fmt not in READERS and fmt != SERVEGEN:
        raise TraceError(str(path), f"unknown trace format {fmt!r}; accepted: {', '.join(FORMATS)}")
    if builtin_format is None:
        return read_format(resolved, fmt, traffic_class)
    from .._cache import cached_columns  # it imports this package

    name = str(path).removeprefix("builtin:")
    columns = cached_columns(resolved) if fmt == "mooncake" else None
    if columns is not None:  # the shipped copy, parsed in advance (traces/_cache.py)
        return mooncake_source(columns, traffic_class or builtin_class or "chatbot", name)
    return read_format(resolved, fmt, traffic_class or builtin_class).with_name(name)
