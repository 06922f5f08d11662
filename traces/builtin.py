"""Traces shipped inside the package, addressed as ``"builtin:NAME"``.

Users do not have the project's shared trace folder, so the default workloads travel with the
package under ``traces/data/`` (gzip copies of the public originals; provenance, checksums and
licences are in ``traces/data/README.md``).
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

from deepinfer_sim.errors import TraceError

__all__ = ["BUILTIN_PREFIX", "BUILTIN_TRACES", "resolve_trace_path"]

BUILTIN_PREFIX = "builtin:"

BUILTIN_TRACES: dict[str, tuple[str, str, str]] = {
    "mooncake_conversation": ("mooncake_conversation.jsonl.gz", "mooncake", "chatbot"),
    "azure_conv": ("azure_conv_2023.csv.gz", "azure", "chatbot"),
    "azure_code": ("azure_code_2023.csv.gz", "azure", "agent"),
}
"""Builtin name -> (file under ``traces/data/``, format, default traffic class)."""


def resolve_trace_path(spec: str | os.PathLike[str]) -> tuple[Path, str | None, str | None]:
    """Turn a trace spec into ``(path, format, default_traffic_class)``.

    ``"builtin:NAME"`` names a shipped trace and returns its format and class; anything else is
    a file path, returned with ``None`` for both (the caller sniffs the format).
    """
    if not (isinstance(spec, str) and spec.startswith(BUILTIN_PREFIX)):
        return Path(spec), None, None
    name = spec.removeprefix(BUILTIN_PREFIX)
    if name not in BUILTIN_TRACES:
        raise TraceError(
            spec, f"unknown builtin trace {name!r}; available: {', '.join(sorted(BUILTIN_TRACES))}"
        )
    file, fmt, traffic_class = BUILTIN_TRACES[name]
    resource = files("deepinfer_sim.traces") / "data" / file
    if not resource.is_file():
        raise TraceError(spec, f"shipped file data/{file} is missing; reinstall deepinfer-sim")
    return Path(str(resource)), fmt, traffic_class
