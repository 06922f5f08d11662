"""Parsed copies of the shipped Mooncake traces, so the default scenario starts without
parsing 12,000 lines of JSON.

``traces/data/NAME.columns.npz`` holds the columns :func:`mooncake_columns` parses from the
shipped ``NAME.jsonl.gz``, plus the SHA-256 of that file. :func:`cached_columns` serves them only
while the digest matches, so an edited trace is parsed again, never served stale; the result is
the same source either way (``tests/unit/test_startup.py`` checks it). Rebuild the copies with::

    python -m deepinfer_sim.traces._cache
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .builtin import BUILTIN_PREFIX, BUILTIN_TRACES, resolve_trace_path
from .readers.mooncake import MooncakeColumns, mooncake_columns

__all__ = ["cache_path", "cached_columns", "write_cache"]

_DIGEST_KEY = "source_sha256"


def cache_path(trace: Path) -> Path:
    """Where the parsed copy of ``trace`` lives: next to it, ``NAME.columns.npz``."""
    return trace.with_name(trace.name.split(".", 1)[0] + ".columns.npz")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cached_columns(trace: Path) -> MooncakeColumns | None:
    """The parsed columns of ``trace`` from its copy; None when there is none or it is stale."""
    cache = cache_path(trace)
    if not cache.is_file():
        return None
    try:
        with np.load(cache, allow_pickle=False) as npz:
            if str(npz[_DIGEST_KEY]) != _digest(trace):
                return None
            return {key: npz[key] for key in npz.files if key != _DIGEST_KEY}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None  # unreadable copy: parse the trace instead


def write_cache(trace: Path) -> Path:
    """Parse ``trace`` (a Mooncake file) and write its copy; return the copy's path."""
    cache = cache_path(trace)
    arrays: dict[str, Any] = {**mooncake_columns(trace), _DIGEST_KEY: np.str_(_digest(trace))}
    np.savez_compressed(cache, **arrays)
    return cache


def main() -> None:
    for name, (_, fmt, _) in BUILTIN_TRACES.items():
        if fmt == "mooncake":
            trace = resolve_trace_path(BUILTIN_PREFIX + name)[0]
            print(f"wrote {write_cache(trace)}")


if __name__ == "__main__":
    main()
