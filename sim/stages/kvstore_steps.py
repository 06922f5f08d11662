"""The KV-cache store's per-request block work, compiled: a lookup's scan of the leading held
blocks and a one-group store's touch and write, each one call over the request's block array.

:class:`~.kvstore.KvStore` keeps its numpy code as the readable reference and calls these
when :data:`~deepinfer_sim.jit.COMPILED` is on, for the common case: block ids that are
direct slots (slot = id + 1, :class:`~.block_slots.BlockSlots`), and, for touch and write, a
store of one coding group whose reads refresh the TTL (the default). A store in hash mode or of
several groups takes the reference; so does the rare write that repeats a block, after the
kernel, for its first copies' second queue entries. (A request's prefix is a few dozen blocks:
the reference spends most of its time in a dozen numpy calls' dispatch, which these fold into
one.)
"""

from __future__ import annotations

import numpy as np

from ...jit import njit


@njit
def leading_hits(
    keys: np.ndarray,
    span: int,
    where: np.ndarray,
    age: np.ndarray,
    cls: np.ndarray,
    ttl: np.ndarray,
    now: float,
) -> tuple[int, int, int]:
    """(hit, slot, where) of a lookup of ``keys`` in a store whose slots are direct (slot =
    key + 1 for keys in [0, ``span``), else 0): ``hit`` leading blocks are held and unexpired
    (``where`` > 0 and ``age + ttl[cls] >= now``, as :meth:`~.kvstore.KvStore.lookup`
    computes it); the first block that is not, its slot and its ``where`` (0, 0 when every
    block hit)."""
    n = keys.size
    for i in range(n):
        key = keys[i]
        slot = key + 1 if 0 <= key < span else 0
        w = where[slot]
        if w <= 0 or age[slot] + ttl[cls[slot]] < now:
            return i, slot, int(w)
    return n, 0, 0


@njit
def touch_direct(
    keys: np.ndarray,
    hit: int,
    items: np.ndarray,
    tail: int,
    lru_pos: np.ndarray,
    age: np.ndarray,
    cls: np.ndarray,
    now: float,
    traffic_class: int,
    refresh: bool,
) -> None:
    """A one-group store's :meth:`~.kvstore.KvStore._touch` of the first ``hit`` blocks of
    ``keys`` (direct slots): appended to the LRU queue (``items`` from ``tail``, which has the
    room); with ``refresh`` their TTL restarts now, under ``traffic_class`` when it is given
    (>= 0). A block listed twice keeps its last queue position, as numpy's assignment does."""
    for i in range(hit):
        slot = keys[i] + 1
        items[tail + i] = slot
        lru_pos[slot] = tail + i
        if refresh:
            age[slot] = now
            if traffic_class >= 0:
                cls[slot] = traffic_class


@njit
def direct_high(keys: np.ndarray) -> int:
    """The largest of ``keys`` (non-empty) read as unsigned, as :meth:`~.block_slots.BlockSlots.
    add` reads them; -1 when that is above the largest int64 (a negative key)."""
    high = np.uint64(0)
    for key in keys:
        u = np.uint64(key)
        if u > high:
            high = u
    if high > np.uint64(0x7FFFFFFFFFFFFFFF):
        return -1
    return int(np.int64(high))  # (int() of the uint64 would unify with -1 as a float)


@njit
def store_direct(
    keys: np.ndarray,
    where: np.ndarray,
    cls: np.ndarray,
    age: np.ndarray,
    items: np.ndarray,
    tail: int,
    lru_pos: np.ndarray,
    code: int,
    traffic_class: int,
    now: float,
) -> tuple[int, bool, bool]:
    """A one-group store's :meth:`~.kvstore.KvStore._store` of ``keys`` (direct slots, the
    columns large enough): each block held in the group (``where`` = ``code``) under
    ``traffic_class`` with its TTL from now, appended to the LRU queue (``items`` from
    ``tail``, which has the room). Returns (blocks newly held, whether every copy was fresh,
    whether every copy is its block's last): a block not held before counts once, at its last
    copy, as the reference counts ``fresh & last``."""
    n = keys.size
    fresh = np.empty(n, np.bool_)
    all_fresh = True
    for i in range(n):
        f = where[keys[i] + 1] <= 0
        fresh[i] = f
        if not f:
            all_fresh = False
    for i in range(n):
        slot = keys[i] + 1
        where[slot] = code
        cls[slot] = traffic_class
        age[slot] = now
        items[tail + i] = slot
        lru_pos[slot] = tail + i
    count = 0
    all_last = True
    for i in range(n):
        if lru_pos[keys[i] + 1] == tail + i:
            if fresh[i]:
                count += 1
        else:
            all_last = False
    return count, all_fresh, all_last
