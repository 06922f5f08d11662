"""Vidur trace CSV (``microsoft/vidur``, ``data/processed_traces/*.csv``): ``arrived_at``
(seconds), ``num_prefill_tokens``, ``num_decode_tokens``. Lengths only.
"""

from __future__ import annotations

import os

from deepinfer_sim.traces.readers._common import read_lengths_csv
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
    return read_lengths_csv(path, _VIDUR_COLUMNS, traffic_class, block_tokens)
