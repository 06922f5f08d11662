"""Azure LLM inference 2023 CSV (the Splitwise trace): ``TIMESTAMP`` (wall clock),
``ContextTokens``, ``GeneratedTokens``; no prefix information.
"""

from __future__ import annotations

import os

import numpy as np

from deepinfer_sim.traces.readers._common import (
    _Check,
    _int_column,
    _lengths_only,
    _raise_first_bad,
    _read_csv,
    _trace_name,
    check_arrival_span,
)
from deepinfer_sim.traces.source import RequestSource

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read_azure(
    path: str | os.PathLike[str],
    traffic_class: str = "chatbot",
    *,
    block_tokens: int = 512,
    zero_output: str = "error",
) -> RequestSource:
    """Read an Azure LLM inference 2023 CSV trace (optionally gzip-compressed).

    ``arrival_s`` counts seconds from the earliest ``TIMESTAMP`` (kept to 100 ns). The trace
    has no prefix information, so every request gets fresh block ids that no other request
    shares (``ceil(ContextTokens / block_tokens)`` of them): a prefix cache finds no reuse.

    ``GeneratedTokens`` of 0 cannot be simulated (a request needs one output token). By
    default (``zero_output="error"``) such a row is a ``TraceError``; ``zero_output="one"``
    counts it as a one-token output instead. The two 2023 files have no such rows.
    """
    import pandas as pd

    if zero_output not in ("error", "one"):
        raise ValueError(f"zero_output: expected 'error' or 'one', got {zero_output!r}")
    file, df = _read_csv(path, _AZURE_COLUMNS)

    stamps = df["TIMESTAMP"].str.strip()
    parsed = pd.to_datetime(stamps, format="ISO8601", errors="coerce")
    input_len, input_checks = _int_column(df, "ContextTokens", low=1)
    min_output = 0 if zero_output == "one" else 1
    output_len, output_checks = _int_column(df, "GeneratedTokens", low=min_output)
    time_check: _Check = (
        parsed.isna().to_numpy(),
        "TIMESTAMP",
        "expected a date-time like '2023-11-16 18:15:46.6805900'",
    )
    _raise_first_bad(file, df, [time_check, *input_checks, *output_checks])

    if getattr(parsed.dt, "tz", None) is not None:
        parsed = parsed.dt.tz_convert(None)
    ns = parsed.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    arrival = (ns - ns.min()) / 1e9
    check_arrival_span(file, arrival, lambda k: k + 2)  # data row k is file line k + 2
    output_len = np.maximum(output_len, 1)

    name = _trace_name(path)
    return _lengths_only(name, arrival, input_len, output_len, block_tokens, traffic_class)
