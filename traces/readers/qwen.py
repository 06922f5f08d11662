"""Qwen-Bailian JSONL (``alibaba-edu/qwen-bailian-usagetraces-anon``, e.g.
``qwen_traceA_blksz_16.jsonl``): ``chat_id``, ``parent_chat_id`` (-1 for a root),
``timestamp`` (seconds), ``input_length``, ``output_length``, ``type``, ``turn`` and
``hash_ids``, one salted hash per **16-token** block (:data:`QWEN_BLOCK_TOKENS`).
"""

from __future__ import annotations

import os
from array import array

import numpy as np

from deepinfer_sim.errors import TraceError
from deepinfer_sim.traces.readers._common import (
    _check_zero_output,
    _jsonl_objects,
    _Row,
    _trace_name,
)
from deepinfer_sim.traces.source import RequestSource

QWEN_BLOCK_TOKENS = 16
"""Tokens per ``hash_ids`` entry in the Qwen-Bailian traces (the ``blksz_16`` in their names)."""


def _is_chained(offsets: np.ndarray, hashes: np.ndarray) -> bool:
    """Whether every id always follows the same predecessor (-1 at a request's start)."""
    if len(hashes) == 0:
        return True
    prev = np.empty_like(hashes)
    prev[0] = -1
    prev[1:] = hashes[:-1]
    starts = offsets[:-1][np.diff(offsets) > 0]
    prev[starts] = -1
    order = np.lexsort((prev, hashes))
    h, p = hashes[order], prev[order]
    return not bool(np.any((h[1:] == h[:-1]) & (p[1:] != p[:-1])))


def _rechain(offsets: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """Replace block ids by chained ones: one new id per distinct (previous id, raw id) path.

    Two requests get the same new id at position ``p`` exactly when their raw ids agree at
    positions ``0..p``. One vectorized pass per block position.
    """
    counts = np.diff(offsets)
    out = np.empty_like(raw)
    if len(raw) == 0:
        return out
    order = np.argsort(-counts, kind="stable")
    neg_sorted = -counts[order]  # ascending
    prev = np.full(len(counts), -1, dtype=np.int64)
    next_id = 0
    for p in range(int(counts.max())):
        rows = order[: int(np.searchsorted(neg_sorted, -p, side="left"))]
        at = offsets[rows] + p
        keys = np.stack([prev[rows], raw[at]], axis=1)
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        ids = next_id + inverse.reshape(-1)
        next_id += len(uniq)
        out[at] = ids
        prev[rows] = ids
    return out


def _session_roots(file: str, parent_of: dict[int, tuple[int, int]]) -> dict[int, int]:
    """Root chat of every chat in ``parent_of``, following parent links (path-compressed)."""
    roots: dict[int, int] = {}
    for start in parent_of:
        path: list[int] = []
        on_path: set[int] = set()
        chat = start
        while chat not in roots:
            link = parent_of.get(chat)
            if link is None or link[0] == -1:  # a root, or a parent outside the file
                roots[chat] = chat
                break
            if chat in on_path:
                raise TraceError(
                    file,
                    f"field 'parent_chat_id': chats {sorted(on_path)} form a cycle",
                    line=link[1],
                )
            path.append(chat)
            on_path.add(chat)
            chat = link[0]
        root = roots[chat]
        for c in path:
            roots[c] = root
    return roots


def read_qwen(
    path: str | os.PathLike[str],
    traffic_class: str | None = None,
    *,
    zero_output: str = "error",
) -> RequestSource:
    """Read a Qwen-Bailian JSONL trace (``qwen_traceA_blksz_16.jsonl`` and its siblings).

    - ``arrival_s`` is ``timestamp`` unchanged (seconds from trace start).
    - ``hash_ids`` become the block ids with ``block_tokens = 16``; a row needs
      ``ceil(input_length / 16)`` of them. When the ids are already chained (each id always
      follows the same id, or always starts its request) they are kept as they are;
      otherwise each is replaced by a chained id, so that two requests share block ``p`` only
      when they agree on blocks ``0..p`` (the prefix-cache rule).
    - ``session_id`` is the root ``chat_id`` of the request's chain of ``parent_chat_id``
      links; a parent that is not in the file is taken as the root. A cycle, or one
      ``chat_id`` given two different parents, is a ``TraceError``.
    - The traffic class is the row's ``type`` (``text``, ``search``, ``image``, ``file``, ...,
      kept as class names, sorted), ``"chatbot"`` for a row without one; pass
      ``traffic_class`` to give every request that class instead. ``image_count`` stays 0: an
      ``image`` request's image tokens are already in ``input_length``.
    - ``turn``, when present, must be an integer >= 1; it is not otherwise used.

    ``zero_output`` is as in :func:`read_burstgpt`.
    """
    file = str(path)
    min_output = _check_zero_output(zero_output)
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    hashes = array("q")  # 8 bytes an id, not a Python int each
    counts: list[int] = []
    chats: list[int] = []
    types: list[str | None] = []
    parent_of: dict[int, tuple[int, int]] = {}  # chat -> (parent, line)
    for line, obj in _jsonl_objects(path):
        row = _Row(file, line, obj)
        chat = row.integer("chat_id", 0)
        parent = row.integer("parent_chat_id", -1)
        if parent == chat:
            raise row.fail("parent_chat_id", f"a chat cannot be its own parent ({chat})")
        known = parent_of.get(chat)
        if known is not None and known[0] != parent:
            raise row.fail(
                "parent_chat_id",
                f"chat {chat} has parent {parent} here but {known[0]} on line {known[1]}",
            )
        parent_of.setdefault(chat, (parent, line))
        times.append(row.seconds("timestamp"))
        input_len = row.integer("input_length", 1)
        inputs.append(input_len)
        outputs.append(max(row.integer("output_length", min_output), 1))
        if "turn" in obj:
            row.integer("turn", 1)
        types.append(row.text("type") if "type" in obj else None)
        expected = -(-input_len // QWEN_BLOCK_TOKENS)
        ids = row.id_list(
            "hash_ids", expected, f"input_length {input_len} needs ceil({input_len}/16)"
        )
        hashes.extend(ids)
        counts.append(len(ids))
        chats.append(chat)

    roots = _session_roots(file, parent_of)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    block_ids = np.asarray(hashes, dtype=np.int64)
    if not _is_chained(offsets, block_ids):
        block_ids = _rechain(offsets, block_ids)
    if traffic_class is not None:
        names: tuple[str, ...] = (traffic_class,)
        codes = np.zeros(len(types), dtype=np.int8)
    else:
        labels = [t if t is not None else "chatbot" for t in types]
        names = tuple(sorted(set(labels)))
        if len(names) > 127:
            raise TraceError(file, f"field 'type': {len(names)} distinct types; at most 127")
        index = {name: k for k, name in enumerate(names)}
        codes = np.asarray([index[t] for t in labels], dtype=np.int8)
    return RequestSource.from_columns(
        arrival_s=np.asarray(times, dtype=np.float64),
        input_len=np.asarray(inputs, dtype=np.int64),
        output_len=np.asarray(outputs, dtype=np.int64),
        block_offsets=offsets,
        block_hashes=block_ids,
        block_tokens=QWEN_BLOCK_TOKENS,
        traffic_class=codes,
        class_names=names,
        session_id=np.asarray([roots[c] for c in chats], dtype=np.int64),
        name=_trace_name(path),
        sort=True,
    )
