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
   earlier id are first occurrences and skip the sort: traces that issue ids in first-seen
   order (Mooncake) sort only their repeated references, about a third.
2. Consecutive references of one request whose previous accesses are consecutive references
   of one earlier request (or are all first occurrences) are collapsed into *runs*: one gap and
   one owner each. A request's chain typically makes two -- the blocks shared with an earlier
   turn, then the new ones -- so the per-TTL work is on runs (2.4 per Mooncake request), not on
   references (24 per request).
3. A grid of TTL settings that is non-decreasing in every class is evaluated at once by giving
   each run a *level*, the first grid point at which its blocks are present; a block hits at
   grid point ``s`` iff the running maximum of the levels along its request (the prefix rule:
   stop at the first miss, robust to duplicates and per-class TTLs) is ``<= s``. Hit tokens are
   then one weighted histogram over levels, cumulated.
4. Storage: a block's residency after a touch lasts ``min(gap to next touch, TTL)`` (or
   ``min(end - touch, TTL)`` after its last touch) and is charged to the toucher's class. The
   time average is the sum of those over ``[first arrival, end_s]``; the peak comes from an
   event count at the distinct arrival times, after every request of that instant (+1 when an
   absent block is touched, -1 at ``touch + TTL`` when the next touch comes later; per class, a
   touch by another class hands the block over). A partial last block counts as one block.

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


def _previous_access(hashes: npt.NDArray[np.int64]) -> np.ndarray:
    """For each position ``a``, the last earlier position holding the same id.

    A first occurrence gets ``a - (n + 1)`` instead (negative, and consecutive first occurrences
    differ by one, as consecutive references of one earlier chain do: the run detection needs
    no extra test). int32 when the positions fit, to halve the memory traffic.
    """
    n = len(hashes)
    dtype = np.int32 if n < 1 << 30 else np.int64
    prev: np.ndarray = np.arange(n, dtype=dtype)
    np.subtract(prev, n + 1, out=prev)
    if n < 2:
        return prev
    # An id larger than every earlier one is a first occurrence (a "record"). Traces that issue
    # ids in first-seen order, as Mooncake does, make most first occurrences records, so only
    # the other references -- a third of Mooncake's -- need the sort.
    runmax = np.maximum.accumulate(hashes)
    rest = np.flatnonzero(hashes[1:] <= runmax[:-1])
    rest += 1
    m = len(rest)
    if m == 0:
        return prev
    ids = hashes[rest]
    lo = int(ids.min())
    width = int(ids.max()) - lo + 1
    shift = max(1, (m - 1).bit_length())
    if width << shift < 1 << 62:
        # Hot path: sort (id, rank) packed into one int64 -- sorting values is several times
        # faster than an argsort, and the rank bits (position order) make it stable.
        if lo:
            ids -= lo
        ids <<= shift
        ids |= np.arange(m, dtype=np.int64)
        ids.sort()
        order = ids & ((1 << shift) - 1)
        ids >>= shift
        ids += lo
    else:
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
    pos = rest[order]  # the non-record references, grouped by id, in position order
    del rest, order
    same = ids[1:] == ids[:-1]
    repeat = np.flatnonzero(same)
    prev[pos[1:][repeat]] = pos[repeat]
    # the first of each group was preceded only by the id's record, if it has one: the first
    # position where the running maximum reaches the id
    heads = np.flatnonzero(~same)
    heads += 1
    heads = np.concatenate([[0], heads])
    head_ids = ids[heads]
    at = np.searchsorted(runmax, head_ids)
    np.minimum(at, n - 1, out=at)
    found = runmax[at] == head_ids
    prev[pos[heads[found]]] = at[found]
    return prev


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
    references of one earlier request (or all first occurrences): one gap and one owner each."""

    start: npt.NDArray[np.int64]  # first reference
    length: npt.NDArray[np.int64]
    row: npt.NDArray[np.int64]
    cls: npt.NDArray[np.int64]  # class of the request
    gap: npt.NDArray[np.float64]  # inf for first occurrences
    owner: npt.NDArray[np.int64]  # class of the previous accessor, -1 for first occurrences
    group: npt.NDArray[np.int64]  # distinct-arrival-time index of the request
    prev_group: npt.NDArray[np.int64]  # ... of the previous access (-1 for none)
    usable: npt.NDArray[np.int64]  # references before the request's hit cap


def _runs(source: RequestSource, group: np.ndarray) -> _Runs:
    offsets = source.block_offsets
    n_refs = int(offsets[-1])
    prev = _previous_access(source.block_hashes)
    # hot path: one subtraction and one comparison per reference find the run starts
    cut = np.empty(n_refs, dtype=bool)
    cut[0] = True
    np.not_equal(np.subtract(prev[1:], prev[:-1]), 1, out=cut[1:])
    cut[offsets[1:-1]] = True
    row_of = np.repeat(np.arange(len(source), dtype=prev.dtype), source.n_blocks)
    start = np.flatnonzero(cut)
    first = prev[start]
    length = np.diff(start, append=n_refs)
    seen = first >= 0
    # a run whose previous accesses cross into the next earlier request is split there (rare)
    lo_row = row_of[first[seen]]
    hi_row = row_of[first[seen] + length[seen] - 1]
    crossing = np.flatnonzero(hi_row != lo_row)
    if crossing.size:
        k0, k1 = lo_row[crossing].astype(np.int64), hi_row[crossing].astype(np.int64)
        reps = k1 - k0
        base = np.repeat(start[seen][crossing] - first[seen][crossing], reps)
        # request starts k0+1 .. k1 of each crossing run, shifted back to this request's refs
        rows = np.repeat(k0 + 1 - np.cumsum(reps) + reps, reps) + np.arange(int(reps.sum()))
        cut[base + offsets[rows]] = True
        start = np.flatnonzero(cut)
        first = prev[start]
        length = np.diff(start, append=n_refs)
        seen = first >= 0
        lo_row = row_of[first[seen]]
    row = row_of[start].astype(np.int64)
    del cut, row_of
    owner = np.full(len(start), -1, dtype=np.int64)
    prev_row = lo_row.astype(np.int64)
    codes = source.traffic_class.astype(np.int64)
    owner[seen] = codes[prev_row]
    arrival = source.arrival_s
    gap = np.full(len(start), np.inf)
    gap[seen] = arrival[row[seen]] - arrival[prev_row]
    prev_group = np.full(len(start), -1, dtype=np.int64)
    prev_group[seen] = group[prev_row]
    cap = (source.input_len - 1) // source.block_tokens  # leave one token to compute
    cap_end = offsets[:-1] + cap
    usable = np.clip(cap_end[row] - start, 0, length)
    return _Runs(
        start=start,
        length=length,
        row=row,
        cls=codes[row],
        gap=gap,
        owner=owner,
        group=group[row],
        prev_group=prev_group,
        usable=usable,
    )


# ---------------------------------------------------------------------------------- evaluation


def _bincount(x: np.ndarray, weights: np.ndarray, minlength: int) -> npt.NDArray[np.float64]:
    """``np.bincount`` with weights, always float64.

    numpy returns int64 zeros for an empty ``x`` even with weights (a class that owns no runs,
    e.g. one whose blocks are all first occurrences), which the in-place float arithmetic
    below cannot write into.
    """
    return np.bincount(x, weights, minlength).astype(np.float64, copy=False)


def _level(ttls: np.ndarray, gap: np.ndarray) -> np.ndarray:
    """Index of the first of the sorted ``ttls`` with ``gap <= ttl`` (``len(ttls)`` if none)."""
    if len(ttls) > 32:
        return np.searchsorted(ttls, gap, side="left")
    # a few vector comparisons beat a binary search per element on a short grid
    level = np.zeros(len(gap), dtype=np.int64)
    for t in ttls:
        level += gap > t
    return level


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
        # per owner class: the runs it owns (indices), split by who touches them next
        self.owned = [np.flatnonzero(r.owner == k) for k in range(c)]
        for k, i in enumerate(self.owned):
            self.last_touches[k] -= _bincount(r.prev_group[i], r.length[i], u)
        self.seen = np.flatnonzero(r.owner >= 0)
        self.gap_weight = r.gap * r.length  # block-seconds held between touches, when present
        self.usable = r.usable * self.measured[r.row]

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
        u = len(self.times)
        hit_blocks = np.zeros((s_count, c))
        resident = np.zeros((s_count, c))
        peak = np.zeros((s_count, c))
        total = np.zeros((s_count, u))
        # residency after last touches: min(tail, TTL), charged to the last toucher's class
        for k in range(c):
            resident[:, k] = np.minimum(self.tail[None, :], ttl[:, k, None]) @ self.last_touches[k]
        r = self.runs
        if r is None:
            return _Evaluated(hit_blocks, resident, peak, np.zeros(s_count))
        width = s_count + 1
        # level: the first setting at which a run's blocks are present (s_count = never)
        level = np.full(len(r.start), s_count, dtype=np.int64)
        if c > 1 and np.all(ttl == ttl[:, :1]):
            level[self.seen] = _level(ttl[:, 0], r.gap[self.seen])
        else:
            for k in range(c):
                level[self.owned[k]] = _level(ttl[:, k], r.gap[self.owned[k]])
        # prefix rule: a reference hits only if every earlier one of its request hit, i.e. the
        # running max of levels along the request; the row offset keeps the max per request.
        offset = r.row * (width + 1)
        key = offset + level
        np.maximum.accumulate(key, out=key)
        key -= offset
        key += r.cls * width
        hist = _bincount(key, self.usable, c * width).reshape(c, width)
        hit_blocks[:] = np.cumsum(hist, axis=1)[:, :s_count].T
        befores: dict[float, np.ndarray] = {}
        for k in range(c):
            i = self.owned[k]
            lev = level[i]
            length = r.length[i]
            # residency between touches: present runs held `gap`, the others `TTL`
            held = np.cumsum(_bincount(lev, self.gap_weight[i], width))[:s_count]
            count = _bincount(lev, length, width)
            present = np.cumsum(count)[:s_count]
            absent = count.sum() - present
            resident[:, k] += held + np.where(absent > 0, ttl[:, k], 0.0) * absent  # no inf * 0
            # peak: class k's resident blocks at t_u = its touches up to t_u that found no block
            # of its own present (a fresh write, an expired block, or one taken from another
            # class), minus its blocks that expired (touch + TTL < t_u, next touch later), minus
            # its blocks another class touched in time (handed over). Per distinct time u:
            # held(u) = cum[refs_k - present_k](u) - cum[refs_k - followed_k](before(u)).
            lev_u = lev * u
            taken = _bincount(lev_u + r.group[i], length, width * u)
            taken = np.cumsum(taken.reshape(width, u), axis=0)[:s_count]
            followed = _bincount(lev_u + r.prev_group[i], length, width * u)
            followed = np.cumsum(followed.reshape(width, u), axis=0)[:s_count]
            refs = self.refs[k]
            np.subtract(refs, taken, out=taken)
            held_now = np.cumsum(taken, axis=1, out=taken)
            expired = np.zeros((s_count, u + 1))
            np.cumsum(np.subtract(refs, followed, out=followed), axis=1, out=expired[:, 1:])
            before = np.empty((s_count, u), dtype=np.int64)
            for s in range(s_count):
                t = float(ttl[s, k])
                if t not in befores:  # groups strictly before t_u - TTL have expired by t_u
                    befores[t] = np.searchsorted(self.times, self.times - t, side="left")
                before[s] = befores[t]
            np.subtract(held_now, expired[np.arange(s_count)[:, None], before], out=held_now)
            total += held_now
            window = self.measured_times
            peak[:, k] = held_now[:, window].max(axis=1) if window.any() else 0.0
        if not self.measured_times.any():
            return _Evaluated(hit_blocks, resident, peak, np.zeros(s_count))
        return _Evaluated(hit_blocks, resident, peak, total[:, self.measured_times].max(axis=1))


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
