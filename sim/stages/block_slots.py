"""Numpy-backed state for block caches: dense slots for 64-bit block keys, per-slot columns and
FIFO queues of slots with lazy deletion.

A cache of millions of 512-token blocks kept in Python dicts and OrderedDicts costs ~300 bytes
per block (the key object, the dict entries, one linked-list node per ordering). Here a block is
a slot number: its state is one element of a few numpy columns (~20 bytes), the key-to-slot map
costs nothing for the small non-negative ids traces use (slot = id + 1) and 16-24 bytes per
key for arbitrary 64-bit hashes, and an ordering (LRU, TTL age) is a :class:`SlotQueue` of
4-byte entries. Every operation takes a request's whole block array, so the cache's hot path
is a few numpy calls per request rather than a Python loop per block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
SlotArray = npt.NDArray[np.intp]
LiveMask = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``live(entries, positions)``: which queue entries are their slot's live entry."""

_FIBONACCI_INT = 0x9E3779B97F4A7C15  # multiplicative hashing of the keys
_FIBONACCI = np.uint64(_FIBONACCI_INT)
_MASK64 = (1 << 64) - 1


class SlotColumns:
    """Per-slot numpy columns (attributes named by the constructor's keywords), zero-filled and
    grown together; slot 0 belongs to no key and keeps its zeros."""

    def __init__(self, **dtypes: Any) -> None:
        self._dtypes = dtypes
        self.size = 1
        for name, dtype in dtypes.items():
            setattr(self, name, np.zeros(1, dtype=dtype))

    def __getattr__(self, name: str) -> np.ndarray:
        """Only for names that are not columns (the columns are plain attributes): typed so
        that a column reads as an array."""
        raise AttributeError(f"no column {name!r}")

    def clear(self) -> None:
        """Back to slot 0 alone (frees the columns)."""
        self.size = 1
        for name, dtype in self._dtypes.items():
            setattr(self, name, np.zeros(1, dtype=dtype))

    def grow(self, size: int) -> None:
        """At least ``size`` slots. New slots are zero (untouched zero pages cost no memory)."""
        if size <= self.size:
            return
        for name, dtype in self._dtypes.items():
            old = getattr(self, name)
            new = np.zeros(size, dtype=dtype)
            new[: self.size] = old
            setattr(self, name, new)
        self.size = size


class BlockSlots:
    """Slot numbers (>= 1) for int64 block keys; slot 0 answers an unknown key.

    While every key added is a non-negative int below ``direct_span`` (or below four times the
    keys added so far), slot = key + 1 and there is no table: trace block ids are dense
    counters. The first other key switches to an open-addressing hash table (linear probing,
    at most half full) that keeps the slots given so far and numbers new keys after them.
    ``direct_span=0`` starts with the table (for a few keys spread over a wide range).
    """

    def __init__(self, columns: SlotColumns, direct_span: int = 1 << 25) -> None:
        self.columns = columns
        self.direct_span = direct_span
        self._added = 0  # keys passed to add() while direct, repeats included
        self._high = -1  # the largest key added while direct
        self._table: npt.NDArray[np.int32] | None = None  # hash mode: bucket -> slot, 0 empty
        self._keys = np.zeros(0, dtype=np.int64)  # hash mode: slot -> key
        self._used = 0  # hash mode: slots numbered so far, slot 0 included
        self._shift = np.uint64(64)
        if direct_span == 0:
            self._to_hash_mode()

    @property
    def direct(self) -> bool:
        return self._table is None

    def reserve(self, largest_key: int) -> None:
        """Size the columns now for keys up to ``largest_key`` (the workload's largest block
        id), when they will be direct slots: they then never grow by a copy, which holds the
        old and the new columns at once (a 1 M-request store: ~130 MB twice). Untouched slots
        cost no memory."""
        if self._table is None and 0 <= largest_key < self.direct_span:
            self.columns.grow(largest_key + 2)

    def find(self, keys: IntArray) -> SlotArray:
        """The slot of each key; 0 for keys never added. (A direct slot may answer an id never
        added, as may the ids below the largest direct one after a switch: such a slot's
        columns are still zero.)"""
        if self._table is None:
            inside = keys.view(np.uint64) < self.columns.size - 1
            return np.where(inside, keys + 1, 0)
        return self._probe(keys)

    def find_one(self, key: int) -> int:
        """The slot of one key; 0 if never added."""
        if self._table is None:
            return key + 1 if 0 <= key < self.columns.size - 1 else 0
        return self._probe_one(key)[0]

    def add_one(self, key: int) -> int:
        """The slot of one key, numbering it if it is new."""
        if self._table is None:
            if 0 <= key < self.columns.size - 1:
                self._high = max(self._high, key)
                return key + 1
            return int(self.add(np.array([key], dtype=np.int64))[0])
        slot, bucket = self._probe_one(key)
        return slot if slot else self._insert_one(key, bucket)

    def add(self, keys: IntArray) -> SlotArray:
        """The slot of each key, numbering the keys never added (columns grow to fit them)."""
        if self._table is None:
            if not len(keys):
                return np.zeros(0, dtype=np.intp)
            high = int(keys.view(np.uint64).max())  # a negative key reads as a huge one
            if self.stays_direct(len(keys), high):
                self.take_direct(len(keys), high)
                return keys + 1
            self._to_hash_mode()
        slots = self._probe(keys)
        new = slots == 0
        if new.any():
            slots[new] = self._insert(keys[new])
        return slots

    def stays_direct(self, count: int, high: int) -> bool:
        """Whether adding ``count`` keys whose largest, read as unsigned, is ``high`` (-1: above
        the largest int64) keeps the slots direct."""
        return self._table is None and 0 <= high < max(self.direct_span, 4 * (self._added + count))

    def take_direct(self, count: int, high: int) -> None:
        """Account for ``count`` keys up to ``high`` added as direct slots (the columns grow to
        fit them); :meth:`stays_direct` said they may be."""
        self._added += count
        self._high = max(self._high, high)
        if high + 2 > self.columns.size:
            self.columns.grow(max(high + 2, 2 * self.columns.size))

    # ---- hash mode --------------------------------------------------------------------------
    def _to_hash_mode(self) -> None:
        """Keep the direct slots (slot = key + 1) and index them in a new table."""
        self._used = self._high + 2
        self._keys = np.arange(-1, self._used - 1, dtype=np.int64)
        self._resize_table(max(1024, 4 * self._used))

    def _bucket(self, keys: IntArray) -> SlotArray:
        return ((keys.view(np.uint64) * _FIBONACCI) >> self._shift).astype(np.intp)

    def _probe(self, keys: IntArray) -> SlotArray:
        """Slots of ``keys`` (0: absent), following each key's probe sequence to a match or an
        empty bucket."""
        table = self._table
        assert table is not None
        bucket = self._bucket(keys)
        slots = table[bucket].astype(np.intp)
        going = (slots != 0) & (self._keys[slots] != keys)
        if not going.any():
            return slots
        mask = len(table) - 1
        todo = np.flatnonzero(going)
        while todo.size:
            b = (bucket[todo] + 1) & mask
            bucket[todo] = b
            s = table[b]
            slots[todo] = s
            todo = todo[(s != 0) & (self._keys[s] != keys[todo])]
        return slots

    def _probe_one(self, key: int) -> tuple[int, int]:
        """(slot, bucket) of one key, or (0, the empty bucket that ends its probe sequence)."""
        table, keys = self._table, self._keys
        assert table is not None
        mask = len(table) - 1
        bucket = (((key & _MASK64) * _FIBONACCI_INT) & _MASK64) >> int(self._shift)
        while True:
            slot = int(table[bucket])
            if slot == 0 or int(keys[slot]) == key:
                return slot, bucket
            bucket = (bucket + 1) & mask

    def _insert_one(self, key: int, bucket: int) -> int:
        """Number one new key, whose probe sequence ended at the empty ``bucket``."""
        slot = self._used
        self._grow_keys(slot + 1)
        self._keys[slot] = key
        assert self._table is not None
        if 2 * self._used > len(self._table):
            self._resize_table(4 * self._used)
        else:
            self._table[bucket] = slot
        return slot

    def _grow_keys(self, used: int) -> None:
        """``used`` slots numbered: the columns and the key of each slot fit them."""
        self._used = used
        if used > self.columns.size:
            self.columns.grow(max(used, self.columns.size + self.columns.size // 2))
        if used > len(self._keys):
            keys = np.zeros(self.columns.size, dtype=np.int64)
            keys[: len(self._keys)] = self._keys
            self._keys = keys

    def _insert(self, keys: IntArray) -> SlotArray:
        """Number keys that are not in the table (repeats get one slot); their slots."""
        unique, inverse = np.unique(keys, return_inverse=True)
        first = self._used
        self._grow_keys(first + len(unique))
        slots = np.arange(first, self._used, dtype=np.intp)
        self._keys[slots] = unique
        assert self._table is not None
        if 2 * self._used > len(self._table):
            self._resize_table(4 * self._used)
        else:
            self._place(slots)
        return slots[inverse.reshape(-1)]

    def _resize_table(self, buckets: int) -> None:
        bits = max(10, (buckets - 1).bit_length())
        self._table = np.zeros(1 << bits, dtype=np.int32)
        self._shift = np.uint64(64 - bits)
        self._place(np.arange(1, self._used, dtype=np.intp))

    def _place(self, slots: SlotArray) -> None:
        """Put slots (of distinct keys, none in the table yet) into empty buckets."""
        table = self._table
        assert table is not None
        mask = len(table) - 1
        bucket = self._bucket(self._keys[slots])
        while slots.size:
            free = table[bucket] == 0
            table[bucket[free]] = slots[free]  # of two slots for one bucket, one wins
            won = np.zeros(len(slots), dtype=bool)
            won[free] = table[bucket[free]] == slots[free]
            slots, bucket = slots[~won], (bucket[~won] + 1) & mask


class SlotQueue:
    """A FIFO of slots with lazy deletion: a slot's live entry is the one at ``pos[slot]``
    (``pos``: the owner's per-slot column; the owner's ``live`` also checks that the slot still
    belongs to this queue). Requeuing a slot appends it and leaves its old entry dead; dead
    entries are skipped at the front and dropped when the queue compacts. ``marks`` are
    positions of the owner's (cursors into the queue) that compaction moves with the entries."""

    __slots__ = ("head", "items", "marks", "tail")

    def __init__(self, marks: int = 0) -> None:
        self.items = np.zeros(64, dtype=np.int32)
        self.head = 0
        self.tail = 0
        self.marks = [0] * marks

    def __len__(self) -> int:
        """Entries, dead ones included."""
        return self.tail - self.head

    def push(self, slots: SlotArray, pos: np.ndarray, live: LiveMask) -> np.ndarray:
        """Append ``slots`` in order; their positions (now in ``pos``)."""
        n = len(slots)
        self.make_room(n, pos, live)
        at = np.arange(self.tail, self.tail + n, dtype=np.int32)
        self.items[self.tail : self.tail + n] = slots
        pos[slots] = at
        self.tail += n
        return at

    def make_room(self, n: int, pos: np.ndarray, live: LiveMask) -> None:
        """Room for ``n`` more entries after ``tail`` (compacting first if there is none)."""
        if self.tail + n > len(self.items):
            self._compact(n, pos, live)

    def push_one(self, slot: int, pos: np.ndarray, live: LiveMask) -> None:
        """Append one slot."""
        if self.tail == len(self.items):
            self._compact(1, pos, live)
        self.items[self.tail] = slot
        pos[slot] = self.tail
        self.tail += 1

    def first_live(self, live: LiveMask) -> int:
        """Pop entries up to and including the first live one; its slot (0: none left)."""
        scan = 16
        while len(self):
            slots, at = self.front(scan)
            alive = live(slots, at)
            first = int(alive.argmax())
            if alive[first]:
                self.pop(first + 1)
                return int(slots[first])
            self.pop(len(slots))
            scan *= 2
        return 0

    def at(self, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` entries from position ``start`` on, and their positions."""
        end = min(start + n, self.tail)
        return self.items[start:end], np.arange(start, end, dtype=np.int32)

    def front(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` entries from the front and their positions (nothing is removed)."""
        return self.at(self.head, n)

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """Every entry and its position."""
        return self.front(self.tail - self.head)

    def pop(self, n: int) -> None:
        """Remove ``n`` entries from the front."""
        self.head += n

    def _compact(self, room: int, pos: np.ndarray, live: LiveMask) -> None:
        """Keep the live entries at the start, renumbered, with ``room`` free after them; grow
        by a quarter when that would leave the queue more than 80 % full (so a queue of live
        entries holds at most ~1.25 entries per live one, and compacts at most every ~fifth of
        its length pushed). The entries move down in place, :data:`COMPACT_CHUNK` at a time, so
        the temporaries stay small however long the queue (a 1 M-request store's LRU queue
        holds ~9 M); only growing copies the kept entries into a new array."""
        marks = np.maximum(np.array(self.marks, dtype=np.int64), self.head)
        new_marks = np.zeros(len(marks), dtype=np.int64)
        write = 0
        for start in range(self.head, self.tail, COMPACT_CHUNK):
            end = min(start + COMPACT_CHUNK, self.tail)
            items, at = self.at(start, end - start)
            alive = live(items, at)
            keep = items[alive]  # a copy: writing below ``start`` cannot touch it
            if len(marks):  # a mark moves to the first kept entry at or after it
                here = (marks >= start) & (marks < end)
                new_marks[here] = write + np.searchsorted(at[alive], marks[here])
            self.items[write : write + len(keep)] = keep
            pos[keep] = np.arange(write, write + len(keep), dtype=np.int32)
            write += len(keep)
        new_marks[marks >= self.tail] = write
        self.marks = new_marks.tolist()
        size = len(self.items)
        need = write + room
        if 5 * need > 4 * size:
            size = max(need + need // 4, 64)
            grown = np.zeros(size, dtype=np.int32)
            grown[:write] = self.items[:write]
            self.items = grown
        self.head, self.tail = 0, write


COMPACT_CHUNK = 1 << 20
"""Queue entries a compaction reads at a time."""
