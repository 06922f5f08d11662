"""Request workloads for the simulator: trace readers, shipped traces and transforms.

Everything the simulator consumes is a :class:`RequestSource`, a columnar, arrival-sorted table
of requests with chained prefix-block ids in CSR form. It comes from a reader
(:func:`read_trace` dispatches on the format: Mooncake, Azure, BurstGPT, Qwen-Bailian, Vidur,
TraceLab and the native parquet of :func:`write_parquet`) or from a shipped trace named
``"builtin:NAME"`` (see :data:`BUILTIN_TRACES`), and is then shaped with its own methods
(``window``, ``head``, ``scale_rate``, ``merge``) or with :func:`spread_buckets`, which
de-quantizes Mooncake's bucketed timestamps.

Malformed trace input raises :class:`deepinfer_sim.errors.TraceError` naming the file, the line
and the field; rows are never skipped.
"""

from deepinfer_sim.traces.builtin import BUILTIN_TRACES, resolve_trace_path
from deepinfer_sim.traces.readers import (
    read_azure,
    read_burstgpt,
    read_mooncake,
    read_parquet,
    read_qwen,
    read_trace,
    read_tracelab,
    read_vidur,
    write_parquet,
)
from deepinfer_sim.traces.source import RequestSource
from deepinfer_sim.traces.transform import spread_buckets

__all__ = [
    "BUILTIN_TRACES",
    "RequestSource",
    "read_azure",
    "read_burstgpt",
    "read_mooncake",
    "read_parquet",
    "read_qwen",
    "read_trace",
    "read_tracelab",
    "read_vidur",
    "resolve_trace_path",
    "spread_buckets",
    "write_parquet",
]
