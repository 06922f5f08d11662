"""BurstGPT CSV (Wang et al., 2024; ``HPMLL/BurstGPT``): ``Timestamp`` (seconds from 0:00 of
the first day), ``Model``, ``Request tokens``, ``Response tokens``, ``Total tokens``,
``Log Type``. Lengths only: every block id is fresh, so a prefix cache finds no reuse.
"""

from __future__ import annotations

import os

from deepinfer_sim.traces.readers._common import _check_zero_output, read_lengths_csv
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
    return read_lengths_csv(path, _BURSTGPT_COLUMNS, traffic_class, block_tokens, min_output)
