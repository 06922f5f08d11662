"""TraceLab rounds JSONL (``uw-syfi/TraceLab``, ``round_trace.jsonl``): one LLM call of a
coding-agent session per line, with ``session_id``, ``round_index``, ``input_tokens_total``,
``prefix_tokens`` (tokens the provider served from its prompt cache), ``output_tokens`` and
``timing_events``. There are no block hashes; see :func:`read_tracelab` for how prefix reuse
becomes block ids.
"""

from __future__ import annotations

import math
import os
from datetime import UTC, datetime
from typing import Any

import numpy as np

from deepinfer_sim.traces.readers._common import (
    _check_zero_output,
    _describe,
    _jsonl_objects,
    _Row,
    _trace_name,
    check_arrival_span,
)
from deepinfer_sim.traces.source import RequestSource

_TRACELAB_INPUT_EVENTS = frozenset({"user_message", "tool_result"})


def _iso_seconds(row: _Row, k: int, value: Any) -> float:
    """POSIX seconds of an ISO 8601 time (a time without a zone is taken as UTC)."""
    where = f"timing_events[{k}].timestamp"
    if type(value) is not str:
        raise row.fail(where, f"expected an ISO 8601 time string, got {_describe(value)}")
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise row.fail(where, f"expected an ISO 8601 time, got {value!r}") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def _tracelab_arrival(row: _Row) -> float:
    """When the round's request was sent: its last input event, else its first event."""
    events = row.get("timing_events")
    if type(events) is not list or not events:
        raise row.fail("timing_events", f"expected a non-empty list, got {_describe(events)}")
    first = math.inf
    last_input = -math.inf
    for k, event in enumerate(events):
        if type(event) is not dict:
            raise row.fail(f"timing_events[{k}]", f"expected an object, got {_describe(event)}")
        kind = event.get("event_type")
        if type(kind) is not str:
            raise row.fail(
                f"timing_events[{k}].event_type", f"expected a string, got {_describe(kind)}"
            )
        t = _iso_seconds(row, k, event.get("timestamp"))
        first = min(first, t)
        if kind in _TRACELAB_INPUT_EVENTS:
            last_input = max(last_input, t)
    return last_input if last_input > -math.inf else first


def read_tracelab(
    path: str | os.PathLike[str],
    traffic_class: str = "agent",
    *,
    block_tokens: int = 512,
    zero_output: str = "error",
) -> RequestSource:
    """Read a TraceLab ``round_trace.jsonl``: one coding-agent LLM call (round) per line.

    - ``arrival_s``: a round's request is sent when its input is complete, so its time is the
      latest ``user_message``/``tool_result`` event in ``timing_events`` (the first event when
      there is none), in seconds from the earliest such time in the file.
    - ``session_id``: sessions numbered 0, 1, ... in order of first appearance.
    - Blocks: TraceLab gives prefix reuse as a token count, ``prefix_tokens`` (what the
      provider's prompt cache served), not as hashes. Within a session, in ``round_index``
      order, round ``r`` reuses the first ``min(prefix_tokens // block_tokens, full blocks of
      round r-1)`` block ids of round ``r-1`` and gets fresh ids for the rest. So an infinite
      cache serves about ``prefix_tokens`` (rounded down to blocks), except in a session's
      first round, whose cached prefix was written before the trace and counts as a miss.
    - Every round gets class ``traffic_class``; ``output_tokens`` of 0 follows
      ``zero_output`` as in :func:`read_burstgpt`.

    ``input_tokens_total`` >= 1 and ``0 <= prefix_tokens <= input_tokens_total`` are checked;
    two rows with the same ``session_id`` and ``round_index`` are an error.
    """
    file = str(path)
    min_output = _check_zero_output(zero_output)
    if block_tokens < 1:
        raise ValueError(f"block_tokens: expected a positive int, got {block_tokens}")
    sessions: dict[str, int] = {}
    seen: dict[tuple[int, int], int] = {}
    times: list[float] = []
    inputs: list[int] = []
    prefixes: list[int] = []
    outputs: list[int] = []
    session_codes: list[int] = []
    rounds: list[int] = []
    for line, obj in _jsonl_objects(path):
        row = _Row(file, line, obj)
        session = sessions.setdefault(row.text("session_id"), len(sessions))
        round_index = row.integer("round_index", 0)
        if (session, round_index) in seen:
            raise row.fail(
                "round_index",
                f"round {round_index} of this session is already on line "
                f"{seen[session, round_index]}",
            )
        seen[session, round_index] = line
        input_len = row.integer("input_tokens_total", 1)
        prefixes.append(row.integer("prefix_tokens", 0, high=input_len))
        inputs.append(input_len)
        outputs.append(max(row.integer("output_tokens", min_output), 1))
        times.append(_tracelab_arrival(row))
        session_codes.append(session)
        rounds.append(round_index)

    n = len(inputs)
    n_blocks = [-(-i // block_tokens) for i in inputs]
    blocks: list[np.ndarray] = [np.zeros(0, np.int64)] * n
    next_id = 0
    previous: dict[int, int] = {}  # session -> row of its latest round so far
    for i in sorted(range(n), key=lambda r: (session_codes[r], rounds[r])):
        prev = previous.get(session_codes[i])
        reuse = 0
        if prev is not None:
            reuse = min(prefixes[i] // block_tokens, inputs[prev] // block_tokens)
        fresh = np.arange(next_id, next_id + n_blocks[i] - reuse, dtype=np.int64)
        next_id += n_blocks[i] - reuse
        blocks[i] = fresh if prev is None else np.concatenate([blocks[prev][:reuse], fresh])
        previous[session_codes[i]] = i
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_blocks, out=offsets[1:])
    arrival = np.asarray(times, dtype=np.float64)
    arrival = arrival - arrival.min()
    check_arrival_span(file, arrival)
    return RequestSource.from_columns(
        arrival_s=arrival,
        input_len=np.asarray(inputs, dtype=np.int64),
        output_len=np.asarray(outputs, dtype=np.int64),
        block_offsets=offsets,
        block_hashes=np.concatenate(blocks),
        block_tokens=block_tokens,
        class_names=(traffic_class,),
        session_id=np.asarray(session_codes, dtype=np.int64),
        name=_trace_name(path),
        sort=True,
    )
