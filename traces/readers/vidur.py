"""Vidur trace CSV (``microsoft/vidur``, ``data/processed_traces/*.csv``): ``arrived_at``
(seconds), ``num_prefill_tokens``, ``num_decode_tokens``. Lengths only.
"""

from __future__ import annotations

import os

from deepinfer_sim.traces.readers._common import (
    _int_column,
    _lengths_only,
    _raise_first_bad,
    _read_csv,
    _seconds_column,
    _trace_name,
)
from deepinfer_sim.traces.source import RequestSource

_VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


def read_vidur(
    path: str | os.PathLike[str],
    traffic_class: str = "chatbot",
    *,
    block_tokens: int = 512,
) -> RequestSource:
    """Read a Vidur trace CSV (``arrived_at``, ``num_prefill_tokens``, ``num_decode_tokens``).

    ``arrival_s`` is ``arrived_at`` unchanged (seconds). Other columns are read past. Every
    request gets class ``traffic_class`` and fresh block ids: there is no prefix information.
    """
    file, df = _read_csv(path, _VIDUR_COLUMNS)
    arrival, time_checks = _seconds_column(df, "arrived_at")
    input_len, input_checks = _int_column(df, "num_prefill_tokens", low=1)
    output_len, output_checks = _int_column(df, "num_decode_tokens", low=1)
    _raise_first_bad(file, df, [*time_checks, *input_checks, *output_checks])
    name = _trace_name(path)
    return _lengths_only(name, arrival, input_len, output_len, block_tokens, traffic_class)
