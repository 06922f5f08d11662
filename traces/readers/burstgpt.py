"""BurstGPT CSV (Wang et al., 2024; ``HPMLL/BurstGPT``): ``Timestamp`` (seconds from 0:00 of
the first day), ``Model``, ``Request tokens``, ``Response tokens``, ``Total tokens``,
``Log Type``. Lengths only: every block id is fresh, so a prefix cache finds no reuse.
"""

from __future__ import annotations

import os

import numpy as np

from deepinfer_sim.traces.readers._common import (
    _check_zero_output,
    _int_column,
    _lengths_only,
    _raise_first_bad,
    _read_csv,
    _seconds_column,
    _trace_name,
)
from deepinfer_sim.traces.source import RequestSource

_BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def read_burstgpt(
    path: str | os.PathLike[str],
    traffic_class: str = "chatbot",
    *,
    block_tokens: int = 512,
    zero_output: str = "error",
) -> RequestSource:
    """Read a BurstGPT CSV trace.

    ``arrival_s`` is ``Timestamp`` unchanged (seconds from 0:00 of the trace's first day).
    ``Timestamp``, ``Request tokens`` and ``Response tokens`` are required; ``Model``,
    ``Total tokens`` and ``Log Type`` are read past. Every request gets class
    ``traffic_class`` and fresh block ids (``ceil(Request tokens / block_tokens)`` of them).

    The ``BurstGPT_*.csv`` files (not the ``without_fails`` ones) hold failed requests with 0
    response tokens. By default (``zero_output="error"``) such a row is a ``TraceError``;
    ``zero_output="one"`` counts it as a one-token output.
    """
    min_output = _check_zero_output(zero_output)
    file, df = _read_csv(path, _BURSTGPT_COLUMNS)
    arrival, time_checks = _seconds_column(df, "Timestamp")
    input_len, input_checks = _int_column(df, "Request tokens", low=1)
    output_len, output_checks = _int_column(df, "Response tokens", low=min_output)
    _raise_first_bad(file, df, [*time_checks, *input_checks, *output_checks])
    output_len = np.maximum(output_len, 1)
    name = _trace_name(path)
    return _lengths_only(name, arrival, input_len, output_len, block_tokens, traffic_class)
