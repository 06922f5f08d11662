"""One-pass TTL (and capacity) hit-rate sweep of a storage-side prefix KV store.

Design notes
------------
The store being swept (SPEC.md §2.5: TTL is set on the storage side, per traffic class) keeps a
block -- ``block_tokens`` tokens keyed by a chained hash id -- while it was last *touched* within
the TTL of the class of the request that last touched it. A request looks its blocks up in order
and stops at the first absent one (``k`` hit blocks, capped at ``(input_len - 1) //
block_tokens`` so that at least one token is computed, as ``PrefillPath.admit`` does); the hit
blocks are refreshed ("refresh on read") and the missed ones, ``hashes[k:]``, are written.

One simplification makes the whole sweep a function of the trace alone: **every block of a
request is touched at its arrival**. The real store writes the missed blocks at prefill end,
seconds later; here the write is moved to arrival, so a request arriving during another's
prefill can hit blocks the simulator would still be writing, and a block lives a few seconds
less than it would (both effects are of the order of a prefill time against TTLs of hours to
days). With that, whether access ``(i, k)`` finds its block present depends only on the *reuse
gap* -- the time since the previous access of the same id -- and on the class of the previous
accessor (the block's owner): present iff ``gap <= TTL[owner class]``.

So the sweep is:

1. :func:`reuse_gaps`: the previous access of every block reference, by one sort of packed
   ``(hash, position)`` int64 keys (no per-access Python). References whose id exceeds every
   earlier id (*records*) are first occurrences and skip the sort: traces that issue ids in
   first-seen order (Mooncake) sort only their repeated references, about a third. The sort is
   stable (timsort), which merges the increasing stretch each request's chain contributes
   instead of sorting anew; when the records are consecutive ids, as there, the record an id
   was first seen at is found by its rank, without a search.
2. Consecutive references of one request whose previous accesses are consecutive references
   of one earlier request (or are all first occurrences) are collapsed into *runs*: one gap and
   one owner each. A request's chain typically makes two -- the blocks shared with an earlier
   turn, then the new ones -- so the per-TTL work is on runs (2.4 per Mooncake request), not on
   references (24 per request).
3. A grid of TTL settings that is non-decreasing in every class is evaluated at once by giving
   each run a *level*, the first grid point at which its blocks are present; a block hits at
   grid point ``s`` iff the running maximum of the levels along its request (the prefix rule:
   stop at the first miss, robust to duplicates and per-class TTLs) is ``<= s``. Hit tokens are
   then one weighted histogram over levels, cumulated. Runs of first occurrences never hit and
   stop their request's lookup, so only the runs before the first of them are looked at.
4. Storage: a block's residency after a touch lasts ``min(gap to next touch, TTL)`` (or
   ``min(end - touch, TTL)`` after its last touch) and is charged to the toucher's class. The
   time average is the sum of those over ``[first arrival, end_s]``; the peak comes from an
   event count at the distinct arrival times, after every request of that instant (+1 when an
   absent block is touched, -1 at ``touch + TTL`` when the next touch comes later; per class, a
   touch by another class hands the block over), in int64: block counts are integers, and
   integer prefix sums are several times faster than float ones. A partial last block counts
   as one block.

Exact (equal to a block-by-block store, as the tests check): hit tokens, mean and peak resident
blocks, for uniform TTLs and for per-class TTLs. Approximate: the write-at-arrival rule above,
and the capacity axis below.

Capacity (an LRU cache of ``C`` blocks, refresh on read) uses **Che's approximation**, not exact
LRU: the characteristic time ``T_C`` is the TTL whose time-averaged occupancy equals ``C``, and a
block hits iff its gap is within ``min(TTL, T_C)``. Exact stack distances need an O(n log n)
dominance count that has no fast numpy form. ``tests/unit/test_ttl_sweep.py`` measures the
error of the approximation against a brute-force LRU.

Costs: one O(R log R) sort over the R block references; O(R) for the runs; then O(runs + U·S)
for S grid points, U being the number of distinct arrival times (the peak is evaluated there).
On a million Mooncake requests (24 M references, ``benchmarks/ttl_sweep.py``) the previous
accesses take about half the time, the runs a fifth, a 20-point grid of two classes a sixth.
The passes over every reference avoid reference-sized temporaries (chunked, or reusing a
buffer): on a virtual machine the page faults of fresh memory cost a fifth to a third of the
time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from ...traces import RequestSource

__all__ = ["ReuseGaps", "TtlSweep", "plot_ttl_sweep", "reuse_gaps", "ttl_sweep"]

ALL = "all"
"""The ``traffic_class`` label of the rows that add up every class."""


# ---------------------------------------------------------------------------------- reuse gaps


@dataclass(frozen=True, slots=True, eq=False)
class ReuseGaps:
    """Per block reference (CSR order of ``source.block_hashes``): its previous access."""

    row: npt.NDArray[np.int64]
    """The request of each reference."""
    prev: npt.NDArray[np.int64]
    """Index (into the references) of the previous access of the same id, -1 for the first."""
    prev_time_s: npt.NDArray[np.float64]
    """Arrival time of that previous access, ``-inf`` for the first."""
    gap_s: npt.NDArray[np.float64]
    """Time since the previous access of the same id; ``inf`` for a first occurrence."""
    prev_class: npt.NDArray[np.int8]
    """Traffic-class code of the previous accessor (the block's owner); -1 for the first."""

    def __len__(self) -> int:
        return len(self.row)


def _previous_access(hashes: npt.NDArray[np.int32] | npt.NDArray[np.int64]) -> np.ndarray:
    """For each position ``a``, the last earlier position holding the same id.

    A first occurrence gets ``a - (n + 1)`` instead (negative, and consecutive first occurrences
    differ by one, as consecutive references of one earlier chain do: the run detection needs
    no extra test). int32 when the positions fit, to halve the memory traffic.
    """
    n = len(hashes)
    dtype = np.int32 if n < 1 << 30 else np.int64
    prev: np.ndarray = np.arange(-(n + 1), -1, dtype=dtype)
    if n < 2:
        return prev
    # An id larger than every earlier one is a first occurrence (a "record"). Traces that issue
    # ids in first-seen order, as Mooncake does, make most first occurrences records, so only
    # the other references -- a third of Mooncake's -- need the sort.
    repeat, top = _not_records(hashes)
    rest = np.flatnonzero(repeat)
    if len(rest) == 0:
        return prev
    ids, pos = _group_by_id(hashes.take(rest).astype(np.int64, copy=False), rest, n)
    # each reference follows the one before it in its id's group; the first of a group follows
    # the id's record, if it has one
    head = np.empty(len(ids), dtype=bool)
    head[0] = True
    np.not_equal(ids[1:], ids[:-1], out=head[1:])
    heads = np.flatnonzero(head)
    at, found = _record_of(ids.take(heads), hashes, repeat, top)
    before = np.empty(len(pos), dtype=dtype)
    before[1:] = pos[:-1]
    before[heads] = np.where(found, at, pos.take(heads) - (n + 1))
    prev[pos] = before  # one scatter in id order: cheaper than one per kind of predecessor
    return prev


_CHUNK = 1 << 16
"""References per step of the chunked passes over every reference (the running maximum, the
run cuts, the record lookup): a step's temporaries stay in the CPU cache, and no pass allocates
an array as long as the references."""


def _not_records(
    hashes: npt.NDArray[np.int32] | npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.bool_], int]:
    """Whether each id is at most some earlier one, i.e. is not a record; and the largest id
    (n >= 1)."""
    n = len(hashes)
    repeat = np.empty(n, dtype=bool)
    repeat[0] = False
    top = hashes[0]  # the maximum before the chunk
    runmax = np.empty(min(n, _CHUNK), dtype=hashes.dtype)
    for a in range(1, n, _CHUNK):
        b = min(a + _CHUNK, n)
        m = runmax[: b - a]
        np.maximum.accumulate(hashes[a - 1 : b - 1], out=m)  # of the references before each
        np.maximum(m, top, out=m)
        np.less_equal(hashes[a:b], m, out=repeat[a:b])
        top = m[-1]
    return repeat, max(int(top), int(hashes[-1]))


def _group_by_id(ids: np.ndarray, pos: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` and their positions ``pos`` (increasing, all ``< n``), sorted by id, positions in
    order within an id. Both arrays are overwritten."""
    lo = int(ids.min())
    width = int(ids.max()) - lo + 1
    shift = max(1, (n - 1).bit_length())
    if width << shift >= 1 << 62:
        order = np.argsort(ids, kind="stable")
        return ids[order], pos[order]
    # Hot path: sort (id, position) packed into one int64 -- sorting values is several times
    # faster than an argsort. Stable (timsort) because the keys arrive in long increasing
    # stretches, one per request chain, which it merges instead of sorting anew.
    key = ids
    key -= lo
    key <<= shift
    key |= pos
    key.sort(kind="stable")
    np.bitwise_and(key, (1 << shift) - 1, out=pos)
    key >>= shift
    key += lo
    return key, pos


def _record_of(
    ids: np.ndarray, hashes: np.ndarray, repeat: npt.NDArray[np.bool_], top: int
) -> tuple[np.ndarray, np.ndarray]:
    """Position of the record (first occurrence, larger than every earlier id) of each of the
    sorted ``ids``, and whether it has one; ``top`` is the largest id."""
    lo = int(hashes[0])
    if top - lo + 1 != len(repeat) - int(np.count_nonzero(repeat)):
        runmax = np.maximum.accumulate(hashes)
        at = np.searchsorted(runmax, ids)  # the first position where the running max reaches it
        np.minimum(at, len(runmax) - 1, out=at)
        return at, runmax.take(at) == ids
    # The records are lo, lo + 1, ..., top in turn: an id's rank among them gives its record.
    # Chunk by chunk, so that no array of every record's position is needed.
    found = ids >= lo
    rank = np.where(found, ids - lo, 0)  # sorted (ids far below lo may wrap: not found anyway)
    at = np.empty(len(ids), dtype=np.int64)
    done = 0  # records before the chunk
    for a in range(0, len(repeat), _CHUNK):
        here = np.flatnonzero(~repeat[a : a + _CHUNK])
        i, j = np.searchsorted(rank, [done, done + len(here)])
        at[i:j] = here.take(rank[i:j] - done) + a
        done += len(here)
    return at, found


def reuse_gaps(source: RequestSource) -> ReuseGaps:
    """The reuse gap of every block reference of ``source``.

    For reference ``(i, k)`` (request ``i``, block ``k``) the previous access is the latest
    reference to the same id before it in CSR order -- in an earlier request, or earlier in the
    same request for an id that repeats within a prompt (gap 0). Requests are in arrival order,
    ties in row order, which is the order the store sees them.
    """
    n_refs = len(source.block_hashes)
    row = np.repeat(np.arange(len(source), dtype=np.int64), source.n_blocks)
    t = np.empty(n_refs + 1)
    np.take(source.arrival_s, row, out=t[:n_refs])
    t[n_refs] = -np.inf  # prev == -1 reads this slot
    codes = np.empty(n_refs + 1, dtype=np.int8)
    np.take(source.traffic_class, row, out=codes[:n_refs])
    codes[n_refs] = -1
    prev = _previous_access(source.block_hashes).astype(np.int64)
    prev[prev < 0] = -1
    prev_time = t[prev]
    return ReuseGaps(
        row=row,
        prev=prev,
        prev_time_s=prev_time,
        gap_s=t[:n_refs] - prev_time,
        prev_class=codes[prev],
    )


# ---------------------------------------------------------------------------------- runs


@dataclass(frozen=True, slots=True, eq=False)
class _Runs:
    """Maximal stretches of one request's references whose previous accesses are consecutive
    references of one earlier request (or all first occurrences): one gap and one owner each.

    Only the *seen* runs (blocks accessed before) are kept, in reference order: a run of first
    occurrences holds nothing before it and never hits, and neither does any later run of its
    request (the lookup stops at the first absent block). ``hit`` picks the seen runs before
    that point.
    """

    length: npt.NDArray[np.int64]
    gap: npt.NDArray[np.float64]
    owner: npt.NDArray[np.int64]  # class of the previous accessor
    group: npt.NDArray[np.int64]  # distinct-arrival-time index of the request
    prev_group: npt.NDArray[np.int64]  # ... of the previous access
    hit: npt.NDArray[np.int64]  # the runs that can hit (index into the above)
    hit_row: npt.NDArray[np.int64]  # their request
    hit_usable: npt.NDArray[np.int64]  # their references before the request's hit cap


def _runs(source: RequestSource, group: np.ndarray) -> _Runs:
    offsets = source.block_offsets
    prev = _previous_access(source.block_hashes)
    row_of = np.repeat(np.arange(len(source), dtype=prev.dtype), source.n_blocks)
    start, length, seen, prev_row = _run_starts(prev, offsets, row_of)
    del prev
    row = row_of.take(start).astype(np.int64)
    del row_of
    # a run of first occurrences stops the lookup of its request: mark the runs after one
    stop = row * 2 + 1
    stop[seen] -= 1
    np.maximum.accumulate(stop, out=stop)
    hit = np.flatnonzero((stop.take(seen) & 1) == 0)
    hit_run = seen.take(hit)
    hit_row = row.take(hit_run)
    cap_end = offsets[:-1] + (source.input_len - 1) // source.block_tokens  # one token computed
    seen_row = row.take(seen)
    arrival = source.arrival_s
    codes = source.traffic_class.astype(np.int64)
    return _Runs(
        length=length.take(seen),
        gap=arrival.take(seen_row) - arrival.take(prev_row),
        owner=codes.take(prev_row),
        group=group.take(seen_row),
        prev_group=group.take(prev_row),
        hit=hit,
        hit_row=hit_row,
        hit_usable=np.clip(cap_end.take(hit_row) - start.take(hit_run), 0, length.take(hit_run)),
    )


def _run_starts(
    prev: np.ndarray, offsets: np.ndarray, row_of: np.ndarray
) -> tuple[np.ndarray, ...]:
    """First reference and length of every run, given the previous accesses ``prev``; which
    runs are seen (index among the runs), and the request of their previous accesses."""
    n_refs = len(prev)
    cut = np.empty(n_refs, dtype=bool)
    cut[0] = True
    step = np.empty(min(n_refs, _CHUNK), dtype=prev.dtype)
    for a in range(1, n_refs, _CHUNK):  # chunk by chunk: no reference-sized temporary
        b = min(a + _CHUNK, n_refs)
        np.subtract(prev[a:b], prev[a - 1 : b - 1], out=step[: b - a])
        np.not_equal(step[: b - a], 1, out=cut[a:b])
    cut[offsets[1:-1]] = True
    start = np.flatnonzero(cut)
    while True:
        length = np.diff(start, append=n_refs)
        first = prev.take(start)
        seen = np.flatnonzero(first >= 0)
        first = first.take(seen)
        prev_row = row_of.take(first).astype(np.int64)
        # a run whose previous accesses cross into the next earlier request is split there
        # (rare; one pass splits them all)
        last = first + length.take(seen) - 1
        crossing = np.flatnonzero(last >= offsets.take(prev_row + 1))
        if crossing.size == 0:
            return start, length, seen, prev_row
        k0, k1 = prev_row[crossing], row_of.take(last[crossing]).astype(np.int64)
        reps = k1 - k0
        base = np.repeat(start[seen[crossing]] - first[crossing], reps)
        # request starts k0+1 .. k1 of each crossing run, shifted back to this request's refs
        rows = np.repeat(k0 + 1 - np.cumsum(reps) + reps, reps) + np.arange(int(reps.sum()))
        cut[base + offsets[rows]] = True
        start = np.flatnonzero(cut)


# ---------------------------------------------------------------------------------- evaluation


def _bincount(x: np.ndarray, weights: np.ndarray, minlength: int) -> npt.NDArray[np.float64]:
    """``np.bincount`` with weights, always float64.

    numpy returns int64 zeros for an empty ``x`` even with weights (a class that owns no runs,
    e.g. one whose blocks are all first occurrences), which the in-place float arithmetic
    below cannot write into.
    """
    return np.bincount(x, weights, minlength).astype(np.float64, copy=False)


@dataclass(frozen=True, slots=True)
class _Evaluated:
    hit_blocks: npt.NDArray[np.float64]  # (S, C)
    resident_time: npt.NDArray[np.float64]  # (S, C) block-seconds
    peak: npt.NDArray[np.float64]  # (S, C)
    peak_total: npt.NDArray[np.float64]  # (S,)


class _Sweep:
    """Everything computed once per source; ``evaluate`` runs one family of settings."""

    def __init__(
        self, source: RequestSource, end_s: float | None, measure_from_s: float = -math.inf
    ) -> None:
        self.source = source
        n = len(source)
        c = self.n_classes = len(source.class_names)
        arrival = source.arrival_s
        if n:
            first = np.empty(n, dtype=bool)
            first[0] = True
            np.not_equal(arrival[1:], arrival[:-1], out=first[1:])
            self.times = arrival[first]
            self.row_group = np.cumsum(first) - 1
        else:
            self.times = np.zeros(0)
            self.row_group = np.zeros(0, dtype=np.int64)
        last = float(arrival[-1]) if n else 0.0
        self.end = last if end_s is None else float(end_s)
        if self.end < last:
            raise ValueError(f"end_s={end_s} is before the last arrival ({last})")
        self.span = self.end - (float(arrival[0]) if n else 0.0)
        u = len(self.times)
        codes = source.traffic_class.astype(np.int64)
        # requests before measure_from_s shape the cache but are not counted
        self.measured = arrival >= measure_from_s
        self.measured_times = self.times >= measure_from_s
        m = self.measured
        self.input_tokens = _bincount(codes[m], source.input_len[m], c)
        self.requests = np.bincount(codes[m], minlength=c)
        # references per (class, distinct time), and last touches (no later access) among them
        self.refs = _bincount(codes * u + self.row_group, source.n_blocks, c * u).reshape(c, u)
        self.last_touches = self.refs.copy()
        self.tail = self.end - self.times  # residency left after a last touch, before a TTL
        self.runs: _Runs | None = None
        self._sorted: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        if len(source.block_hashes) == 0:
            return
        r = self.runs = _runs(source, self.row_group)
        # per owner class: the seen runs it owns, and its touches that another one followed
        self.owned = [np.flatnonzero(r.owner == k) for k in range(c)]
        self.by_owner = [(i, r.length[i], r.group[i], r.prev_group[i]) for i in self.owned]
        followed = _bincount(r.owner * u + r.prev_group, r.length, c * u)
        self.last_touches -= followed.reshape(c, u)
        self.gap_weight = r.gap * r.length  # block-seconds held between touches, when present
        self.refs_int = self.refs.astype(np.int64)
        # the runs that can hit, and what their histogram needs
        self.hit_runs = r.hit
        self.hit_row_key = r.hit_row << 32  # keeps a running maximum within each request
        self.hit_cls = codes.take(r.hit_row)
        self.hit_usable = r.hit_usable * self.measured.take(r.hit_row)

    # ---- occupancy (for Che's characteristic time) -------------------------------------------
    def _durations(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per class: residency spans without a TTL (sorted), and prefix sums of their
        counts and of count x span, so that any TTL's occupancy is one binary search."""
        if self._sorted is None:
            self._sorted = []
            for k in range(self.n_classes):
                spans, weights = [self.tail], [self.last_touches[k]]
                if self.runs is not None:
                    spans.append(self.runs.gap[self.owned[k]])
                    weights.append(self.runs.length[self.owned[k]].astype(float))
                d = np.concatenate(spans)
                order = np.argsort(d, kind="stable")
                d, w = d[order], np.concatenate(weights)[order]
                zero = np.zeros(1)
                cw = np.concatenate([zero, np.cumsum(w)])
                cwd = np.concatenate([zero, np.cumsum(w * d)])
                self._sorted.append((d, cw, cwd))
        return self._sorted

    def occupancy(self, ttl: npt.NDArray[np.float64]) -> float:
        """Time-averaged resident blocks when class c keeps blocks ``ttl[c]`` seconds."""
        if self.span <= 0:
            return 0.0
        total = 0.0
        for k, (d, cw, cwd) in enumerate(self._durations()):
            j = int(np.searchsorted(d, ttl[k], side="right"))  # spans within the TTL: whole
            rest = cw[-1] - cw[j]
            total += cwd[j] + (ttl[k] * rest if rest > 0 else 0.0)
        return total / self.span

    def characteristic_time(self, capacity: float, ttl: npt.NDArray[np.float64]) -> float:
        """Che's ``T_C``: occupancy under per-class TTLs ``min(ttl, T_C)`` equals ``capacity``.

        ``inf`` when the TTLs alone keep the average occupancy within the capacity.
        """
        if self.occupancy(ttl) <= capacity:
            return math.inf
        lo, hi = 0.0, max(self.span, 1.0)
        for _ in range(2000):  # bisection to float resolution; occupancy is monotone in T_C
            mid = 0.5 * (lo + hi)
            if mid in (lo, hi):
                break
            if self.occupancy(np.minimum(ttl, mid)) <= capacity:
                lo = mid
            else:
                hi = mid
        return lo

    # ---- one family --------------------------------------------------------------------------
    def evaluate(self, ttl: npt.NDArray[np.float64]) -> _Evaluated:
        """Settings ``ttl[s, c]`` (non-decreasing in ``s`` for every class) evaluated at once."""
        s_count, c = ttl.shape
        resident = self._after_last_touches(ttl)
        if self.runs is None:
            zeros = np.zeros((s_count, c))
            return _Evaluated(zeros, resident, zeros, np.zeros(s_count))
        level = self._levels(ttl)
        resident += self._between_touches(ttl, level)
        peak, peak_total = self._peaks(ttl, level)
        return _Evaluated(self._hit_blocks(level, s_count), resident, peak, peak_total)

    def _after_last_touches(self, ttl: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Block-seconds held after last touches, ``min(tail, TTL)`` each, per (setting, class of
        the last toucher)."""
        resident = np.empty(ttl.shape)
        held = None
        for k in range(ttl.shape[1]):
            if held is None or not np.array_equal(ttl[:, k], ttl[:, k - 1]):
                held = np.minimum(self.tail[None, :], ttl[:, k, None])
            resident[:, k] = held @ self.last_touches[k]
        return resident

    def _levels(self, ttl: npt.NDArray[np.float64]) -> np.ndarray:
        """Each seen run's *level*: the first setting at which its blocks are present (the
        number of settings if none), i.e. the first of its owner's TTLs >= its gap."""
        r = self.runs
        assert r is not None
        if np.all(ttl == ttl[:, :1]):
            return np.searchsorted(ttl[:, 0], r.gap, side="left")
        level = np.empty(len(r.gap), dtype=np.int64)
        for k, owned in enumerate(self.owned):
            level[owned] = np.searchsorted(ttl[:, k], r.gap[owned], side="left")
        return level

    def _hit_blocks(self, level: np.ndarray, s_count: int) -> npt.NDArray[np.float64]:
        """Hit blocks per (setting, request class)."""
        width = s_count + 1
        # prefix rule: a reference hits only if every earlier one of its request hit, i.e. the
        # running max of the levels along the request
        key = level.take(self.hit_runs)
        key |= self.hit_row_key
        np.maximum.accumulate(key, out=key)
        key &= (1 << 32) - 1
        key += self.hit_cls * width
        hist = _bincount(key, self.hit_usable, self.n_classes * width).reshape(-1, width)
        return np.cumsum(hist, axis=1)[:, :s_count].T

    def _between_touches(self, ttl: npt.NDArray[np.float64], level: np.ndarray) -> np.ndarray:
        """Block-seconds held between a touch and the next one, per (setting, owner class):
        present runs held their gap, the others the owner's TTL."""
        r = self.runs
        assert r is not None
        s_count, c = ttl.shape
        width = s_count + 1
        key = r.owner * width + level
        held = np.cumsum(_bincount(key, self.gap_weight, c * width).reshape(c, width), axis=1)
        count = _bincount(key, r.length, c * width).reshape(c, width)
        present = np.cumsum(count, axis=1)
        absent = count.sum(axis=1)[None, :] - present[:, :s_count].T
        return held[:, :s_count].T + np.where(absent > 0, ttl, 0.0) * absent  # no inf * 0

    def _peaks(self, ttl: npt.NDArray[np.float64], level: np.ndarray) -> tuple[np.ndarray, ...]:
        """Peak resident blocks per (setting, class), and of all classes together.

        Class k's resident blocks at t_u are its touches up to t_u that found no block of its
        own present (a fresh write, an expired block, or one taken from another class), minus
        its blocks that expired (touch + TTL < t_u, next touch later), minus its blocks another
        class touched in time (handed over). Per distinct time u:
        held(u) = cum[refs - present](u) - cum[refs - followed](before(u)).
        Block counts are integers: int64 arithmetic is exact and much faster to cumulate.
        """
        s_count, c = ttl.shape
        u = len(self.times)
        window = self.measured_times
        if not window.any():
            return np.zeros((s_count, c)), np.zeros(s_count)
        befores = self._before(ttl)
        peak = np.empty((s_count, c))
        total = np.zeros((s_count, u), dtype=np.int64)
        expired = np.zeros((s_count, u + 1), dtype=np.int64)  # a zero before the first time
        for k, (owned, length, group, prev_group) in enumerate(self.by_owner):
            key = level.take(owned)
            key *= u
            held = self._present(key + group, length, s_count)
            np.subtract(self.refs_int[k], held, out=held)
            np.cumsum(held, axis=1, out=held)
            kept = self._present(key + prev_group, length, s_count)
            np.subtract(self.refs_int[k], kept, out=kept)
            np.cumsum(kept, axis=1, out=expired[:, 1:])
            held -= expired.take(befores[k])
            total += held
            peak[:, k] = (held if window.all() else held[:, window]).max(axis=1)
        return peak, (total if window.all() else total[:, window]).max(axis=1).astype(float)

    def _present(self, key: np.ndarray, length: np.ndarray, s_count: int) -> np.ndarray:
        """Blocks per (setting s, distinct time) of one owner's runs present at s, from the
        runs' ``key`` = level x U + distinct time. One class at a time keeps the arrays small
        enough for the allocator to reuse them rather than map fresh pages."""
        u = len(self.times)
        count = np.bincount(key, length, (s_count + 1) * u)[: s_count * u].astype(np.int64)
        count = count.reshape(s_count, u)
        for s in range(1, s_count):  # row by row: a cumsum over the first axis is far slower
            count[s] += count[s - 1]
        return count

    def _before(self, ttl: npt.NDArray[np.float64]) -> list[np.ndarray]:
        """Per class, per (setting s, distinct time u): the flat index into an (S, U + 1) array
        of row s, column the number of distinct times strictly before t_u - TTL -- those whose
        blocks have expired by t_u."""
        s_count, u = len(ttl), len(self.times)
        rows = np.arange(s_count)[:, None] * (u + 1)
        out: list[np.ndarray] = []
        for k in range(ttl.shape[1]):
            if out and np.array_equal(ttl[:, k], ttl[:, k - 1]):
                out.append(out[-1])
                continue
            index = np.empty((s_count, u), dtype=np.int64)
            for s, t in enumerate(ttl[:, k]):
                index[s] = _count_before(self.times, self.times - t)
            out.append(index + rows)
        return out


def _count_before(times: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``np.searchsorted(times, keys, side="left")`` for sorted ``keys``, by a merge: a stable
    sort of the two sorted runs places each key before the times equal to it, so the count of
    times before key j is its merged position minus j. Twice as fast as the binary searches."""
    order = np.argsort(np.concatenate([keys, times]), kind="stable")
    return np.flatnonzero(order < len(keys)) - np.arange(len(keys))


# ---------------------------------------------------------------------------------- public API


@dataclass(frozen=True, slots=True, eq=False)
class TtlSweep:
    """The sweep's result; ``frame`` has one row per (policy, capacity, TTL, class)."""

    frame: pd.DataFrame
    """Columns: ``policy`` (``"ttl"`` for the uniform grid, ``"class_ttl"`` for the per-class
    point), ``capacity_blocks`` (``inf`` = unbounded), ``ttl_s`` (the class's TTL; NaN on the
    ``"all"`` row of the per-class point), ``char_time_s`` (Che's ``T_C``; ``inf`` when the
    capacity does not bind), ``effective_ttl_s``, ``traffic_class`` (a class name or ``"all"``),
    ``requests``, ``input_tokens``, ``hit_tokens`` (prefill tokens saved), ``hit_rate``
    (token-weighted), ``mean_resident_blocks``, ``peak_resident_blocks`` and the same two in
    bytes (NaN without ``block_bytes``)."""
    span_s: float
    """Averaging window of ``mean_resident_*``: first arrival to ``end_s``."""
    approximate: bool
    """True when a capacity was swept (Che's approximation of LRU)."""


def _check_ttls(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    if arr.size == 0:
        raise ValueError(f"{what}: need at least one value")
    if np.any(np.isnan(arr)) or np.any(arr < 0):
        raise ValueError(f"{what}: values must be >= 0 (inf allowed), got {arr.tolist()}")
    return arr


def ttl_sweep(
    source: RequestSource,
    ttls_s: Sequence[float] | np.ndarray,
    capacities_blocks: Sequence[float] | None = None,
    class_ttl: Mapping[str, float] | None = None,
    *,
    block_bytes: float | None = None,
    end_s: float | None = None,
    measure_from_s: float | None = None,
) -> TtlSweep:
    """Hit rate, prefill tokens saved and storage needed under each TTL of ``ttls_s``.

    Every TTL applies to every class. ``class_ttl`` (class name -> TTL, every class of
    ``source`` named) adds one point where a block's TTL is that of its last toucher's class.
    ``capacities_blocks`` adds an LRU capacity axis (crossed with the TTL grid and the
    per-class point) under Che's approximation. Residency is counted up to ``end_s`` (default:
    the last arrival); ``block_bytes`` converts resident blocks to bytes. With
    ``measure_from_s``, requests arriving earlier warm the cache but are not counted (hit rate,
    requests, input tokens) and the peak is taken from that time on (the steady state of a
    multi-day trace); the mean residency still covers the whole trace.
    """
    ttls = _check_ttls(ttls_s, "ttls_s")
    caps = [math.inf]
    if capacities_blocks is not None:
        caps += [float(x) for x in capacities_blocks]
        if any(not (x > 0) for x in caps):
            raise ValueError(f"capacities_blocks: must be > 0, got {list(capacities_blocks)}")
    names = source.class_names
    per_class: np.ndarray | None = None
    if class_ttl is not None:
        unknown = set(class_ttl) - set(names)
        missing = [n for n in names if n not in class_ttl]
        if unknown or missing:
            raise ValueError(
                f"class_ttl: need exactly the classes {names}; "
                f"unknown {sorted(unknown)}, missing {missing}"
            )
        per_class = _check_ttls([class_ttl[n] for n in names], "class_ttl")
    sweep = _Sweep(source, end_s, -math.inf if measure_from_s is None else measure_from_s)
    c = len(names)
    grid = np.unique(ttls)  # sorted: a valid family
    back = np.searchsorted(grid, ttls)
    rows: list[dict[str, object]] = []

    def emit(policy: str, cap: float, tc: float, ttl: np.ndarray, ev: _Evaluated, s: int) -> None:
        eff = np.minimum(ttl, tc)
        tokens = ev.hit_blocks[s] * source.block_tokens
        mean = ev.resident_time[s] / sweep.span if sweep.span > 0 else np.full(c, np.nan)
        uniform = bool(np.all(ttl == ttl[0]))
        # the "all" row has one TTL only when every class has the same
        ttl_col = [*ttl.tolist(), float(ttl[0]) if uniform else math.nan]
        eff_col = [*eff.tolist(), float(eff[0]) if uniform else math.nan]
        for k in range(c + 1):
            sl = slice(None) if k == c else slice(k, k + 1)
            inp = float(sweep.input_tokens[sl].sum())
            hit = float(tokens[sl].sum())
            m = float(mean[sl].sum())
            pk = float(ev.peak_total[s] if k == c else ev.peak[s, k])
            rows.append(
                {
                    "policy": policy,
                    "capacity_blocks": cap,
                    "ttl_s": ttl_col[k],
                    "char_time_s": tc,
                    "effective_ttl_s": eff_col[k],
                    "traffic_class": ALL if k == c else names[k],
                    "requests": int(sweep.requests[sl].sum()),
                    "input_tokens": int(inp),
                    "hit_tokens": int(hit),
                    "hit_rate": hit / inp if inp else math.nan,
                    "mean_resident_blocks": m,
                    "peak_resident_blocks": pk,
                }
            )

    for cap in caps:
        inf_ttl = np.full(c, math.inf)
        tc = math.inf if math.isinf(cap) else sweep.characteristic_time(cap, inf_ttl)
        eff_grid = np.minimum(grid, tc)
        ev = sweep.evaluate(np.repeat(eff_grid[:, None], c, axis=1))
        if not math.isinf(cap):
            ev = _clip_peak(ev, cap)
        for s in back:
            emit("ttl", cap, tc, np.full(c, grid[s]), ev, int(s))
        if per_class is not None:
            tcc = math.inf if math.isinf(cap) else sweep.characteristic_time(cap, per_class)
            ev = sweep.evaluate(np.minimum(per_class, tcc)[None, :])
            if not math.isinf(cap):
                ev = _clip_peak(ev, cap)
            emit("class_ttl", cap, tcc, per_class, ev, 0)
    frame = pd.DataFrame(rows)
    scale = math.nan if block_bytes is None else float(block_bytes)
    frame["mean_resident_bytes"] = frame["mean_resident_blocks"] * scale
    frame["peak_resident_bytes"] = frame["peak_resident_blocks"] * scale
    return TtlSweep(frame=frame, span_s=sweep.span, approximate=capacities_blocks is not None)


def _clip_peak(ev: _Evaluated, cap: float) -> _Evaluated:
    """An LRU never holds more than its capacity (Che's TTL model can, briefly)."""
    return _Evaluated(
        ev.hit_blocks, ev.resident_time, np.minimum(ev.peak, cap), np.minimum(ev.peak_total, cap)
    )


# ---------------------------------------------------------------------------------- plots


def plot_ttl_sweep(frame: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write ``ttl_hit_rate.png``, ``ttl_prefill_saved.png`` and ``ttl_storage.png``.

    Curves are the uniform-TTL rows without a capacity bound, one per class (log-x; an
    infinite TTL is left out); the per-class-TTL point, when present, is marked on them.
    """
    # the Figure API renders with Agg without touching pyplot's global backend (notebooks)
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    grid = frame[(frame["policy"] == "ttl") & np.isinf(frame["capacity_blocks"])]
    grid = grid[np.isfinite(grid["ttl_s"])].sort_values("ttl_s")
    point = frame[
        (frame["policy"] == "class_ttl")
        & np.isinf(frame["capacity_blocks"])
        & (frame["traffic_class"] != ALL)
    ]
    hours = 3600.0
    panels = [
        ("ttl_hit_rate.png", "hit_rate", 100.0, "token hit rate (%)"),
        ("ttl_prefill_saved.png", "hit_tokens", 1e-9, "prefill tokens saved (billions)"),
    ]
    paths: list[Path] = []
    for name, column, scale, label in panels:
        fig = Figure(figsize=(6.4, 4.0))
        ax = fig.subplots()
        for cls, part in grid.groupby("traffic_class", sort=False):
            ax.plot(part["ttl_s"] / hours, part[column] * scale, marker="o", ms=3, label=cls)
        for j, (_, p) in enumerate(point.iterrows()):
            star = "per-class TTLs" if j == 0 else None
            ax.plot(p["ttl_s"] / hours, p[column] * scale, "k*", ms=9, label=star)
        ax.set_xscale("log")
        ax.set_xlabel("TTL (hours)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(title="class")
        fig.tight_layout()
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=120)
    use_bytes = bool(grid["mean_resident_bytes"].notna().any())
    unit, scale = ("TB", 1e-12) if use_bytes else ("blocks", 1.0)
    suffix = "bytes" if use_bytes else "blocks"
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    for cls, part in grid.groupby("traffic_class", sort=False):
        (line,) = ax.plot(
            part["ttl_s"] / hours, part[f"mean_resident_{suffix}"] * scale, label=f"{cls} mean"
        )
        ax.plot(
            part["ttl_s"] / hours,
            part[f"peak_resident_{suffix}"] * scale,
            "--",
            color=line.get_color(),
            label=f"{cls} peak",
        )
    ax.set_xscale("log")
    ax.set_xlabel("TTL (hours)")
    ax.set_ylabel(f"storage needed ({unit})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(out / "ttl_storage.png")
    fig.savefig(paths[-1], dpi=120)
    return paths
