"""``RequestSource``: a whole workload as columnar numpy arrays.

Design notes
------------
A trace is read once and then only sliced, rescaled or re-timed, so it is stored as a struct of
arrays (one row per request, rows sorted by arrival) rather than as a list of request objects.
Every operation here is vectorized; the simulator pulls rows out by index at arrival time.

Prefix information uses a CSR layout: request ``i`` owns the block-hash ids
``block_hashes[block_offsets[i]:block_offsets[i + 1]]``, one id per ``block_tokens`` tokens of
its prompt (the last block may be partial). Ids are *chained*: two requests that carry the same
id at the same position share the whole prefix up to and including that block, which is what a
prefix cache can reuse. Ids are int64 values; they are kept in 4 bytes each when every one fits
(trace and generated ids are counters: a million-request workload holds ~40 M references), and
:meth:`RequestSource.blocks` hands them out as int64, so nothing downstream sees the difference.

The arrays of a source built by :meth:`RequestSource.from_columns` or by any derived operation
are read-only, so one source can be shared by many scenarios without one run changing another's
input. Derived operations (``window``, ``head``, ``scale_rate``, ``select``, ``with_arrivals``,
``with_classes``, ``merge``) return new sources and never modify ``self``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # imported by to_frame() only: start-up does not pay for pandas
    import pandas as pd

__all__ = ["RequestSource"]

_INT64_MAX = int(np.iinfo(np.int64).max)
_INT32 = np.iinfo(np.int32)

_INT_COLUMNS = {
    "input_len": np.int64,
    "output_len": np.int64,
    "block_offsets": np.int64,
    "block_hashes": np.int64,
    "traffic_class": np.int8,
    "image_count": np.int16,
    "session_id": np.int64,
}


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


def _as_column(values: Any, dtype: type, field: str, copy: bool = True) -> np.ndarray:
    """``values`` as a 1-D array of ``dtype``, copied unless ``copy`` is False and it already is
    one; refuse lossy casts (float -> int, wraps)."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{field}: expected a 1-D array, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=dtype)
    target: np.dtype[Any] = np.dtype(dtype)
    if target.kind == "f":
        if arr.dtype.kind not in "iuf":
            raise ValueError(f"{field}: expected numbers, got dtype {arr.dtype}")
        return arr.astype(target, copy=copy)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{field}: expected integers, got dtype {arr.dtype}")
    if arr.dtype != target:
        info = np.iinfo(target)
        if arr.min() < info.min or arr.max() > info.max:
            raise ValueError(f"{field}: values outside the {target} range [{info.min}, {info.max}]")
    return arr.astype(target, copy=copy)


def _id_dtype(low: int, high: int) -> type:
    """The narrowest of int32 and int64 that holds block ids from ``low`` to ``high``."""
    return np.int32 if _INT32.min <= low and high <= _INT32.max else np.int64


def _block_id_column(values: Any, copy: bool) -> np.ndarray:
    """Block ids as int64 values (refusing what int64 cannot hold), stored as int32 when every
    one fits; copied unless ``copy`` is False and they already are such an array."""
    if isinstance(values, np.ndarray) and values.dtype == np.int32:
        return _as_column(values, np.int32, "block_hashes", copy)
    arr = _as_column(values, np.int64, "block_hashes", copy=False)
    if arr.size and _id_dtype(int(arr.min()), int(arr.max())) is np.int32:
        return arr.astype(np.int32)
    return arr.copy() if copy and arr is values else arr


_CHUNK_REFS = 1 << 20
"""Block references gathered per step: bounds the temporaries of a gather to a few MB."""


def _row_chunks(offsets: np.ndarray) -> list[tuple[int, int]]:
    """Row ranges ``[a, b)`` of a CSR whose block references add up to about ``_CHUNK_REFS``
    each (at least one row per range)."""
    n = len(offsets) - 1
    if n <= 0:
        return []
    marks = np.arange(_CHUNK_REFS, int(offsets[-1]), _CHUNK_REFS)
    cuts = np.searchsorted(offsets, marks, side="right") - 1
    bounds = np.unique(np.concatenate([[0], np.clip(cuts, 1, n), [n]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))


def _copy_rows(
    out: np.ndarray,
    out_starts: np.ndarray,
    hashes: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    low: int = 0,
    base: int = 0,
) -> None:
    """``out[out_starts[r] + k] = hashes[starts[r] + k] - low + base`` for ``k < counts[r]``,
    over all rows ``r``, a chunk of rows at a time."""
    ends = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=ends[1:])
    for a, b in _row_chunks(ends):
        c = counts[a:b]
        local = np.arange(ends[a], ends[b], dtype=np.int64) - np.repeat(ends[a:b], c)
        src = hashes[np.repeat(starts[a:b], c) + local]
        if low or base:  # ids >= low: no int64 wrap (merge checks the top)
            src = (src.astype(np.int64) - low) + base
        out[np.repeat(out_starts[a:b], c) + local] = src


def _gather_csr(
    offsets: np.ndarray, hashes: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return (offsets, hashes) holding the block lists of ``rows``, in that order."""
    starts = offsets[rows]
    counts = offsets[rows + 1] - starts
    new_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(counts, out=new_offsets[1:])
    if len(rows) and int(rows[-1]) - int(rows[0]) == len(rows) - 1 and np.all(np.diff(rows) == 1):
        lo, hi = int(offsets[rows[0]]), int(offsets[rows[-1] + 1])
        return new_offsets, hashes[lo:hi].copy()  # a run of consecutive rows: one slice
    out = np.empty(int(new_offsets[-1]), dtype=hashes.dtype)
    _copy_rows(out, new_offsets[:-1], hashes, starts, counts)
    return new_offsets, out


def _merged_hashes(
    sources: Sequence[RequestSource],
    lows: list[int],
    bases: list[int],
    order: np.ndarray,
    offsets: np.ndarray,
    top: int,
) -> np.ndarray:
    """The block ids of merged ``sources``, rows in ``order`` (of their concatenation), each
    source's ids moved from ``lows[k]`` up to ``bases[k]``, written straight into place (as
    int32 when ``top``, the largest, fits)."""
    out: np.ndarray = np.empty(int(offsets[-1]), dtype=_id_dtype(0, top))
    dest = np.empty(len(order), dtype=np.int64)
    dest[order] = np.arange(len(order), dtype=np.int64)
    first = 0
    for source, low, base in zip(sources, lows, bases, strict=True):
        rows = dest[first : first + len(source)]
        first += len(source)
        starts = source.block_offsets[:-1]
        _copy_rows(out, offsets[rows], source.block_hashes, starts, source.n_blocks, low, base)
    return out


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class RequestSource:
    """A request workload: one row per request, rows sorted by ``arrival_s``.

    Build one with :meth:`from_columns` (which converts and validates) or with a reader from
    :mod:`deepinfer_sim.traces`. The plain constructor does no checking; call :meth:`validate`
    when in doubt.
    """

    arrival_s: npt.NDArray[np.float64]
    """Arrival time in seconds from trace start, non-decreasing."""
    input_len: npt.NDArray[np.int64]
    """Prompt tokens (>= 1)."""
    output_len: npt.NDArray[np.int64]
    """Tokens to generate (>= 1)."""
    block_offsets: npt.NDArray[np.int64]
    """CSR row pointers into ``block_hashes``; length ``n + 1``."""
    block_hashes: npt.NDArray[np.int32] | npt.NDArray[np.int64]
    """Chained prefix-block ids of all requests, concatenated (int32 when every id fits)."""
    traffic_class: npt.NDArray[np.int8]
    """Codes into ``class_names``."""
    class_names: tuple[str, ...]
    image_count: npt.NDArray[np.int16]
    session_id: npt.NDArray[np.int64]
    """Conversation/agent session, -1 when unknown."""
    block_tokens: int
    """Tokens per prefix block (512 for Mooncake)."""
    name: str = "trace"

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_columns(
        cls,
        *,
        arrival_s: Any,
        input_len: Any,
        output_len: Any,
        block_offsets: Any,
        block_hashes: Any,
        block_tokens: int,
        traffic_class: Any = None,
        class_names: Sequence[str] = ("chatbot",),
        image_count: Any = None,
        session_id: Any = None,
        name: str = "trace",
        sort: bool = False,
        copy: bool = True,
    ) -> RequestSource:
        """Build a validated source from array-likes.

        Columns are copied into the canonical dtypes (a lossy cast such as float to int is a
        ``ValueError``). ``traffic_class`` defaults to code 0 (the first of ``class_names``),
        ``image_count`` to 0 and ``session_id`` to -1. With ``sort=True`` rows are first put in
        arrival order (stable, so ties keep their given order); otherwise unsorted input is an
        error. ``copy=False`` hands over arrays that already have the canonical dtype instead of
        copying them (a generator's fresh columns): the source freezes them.
        """
        arrival = _as_column(arrival_s, np.float64, "arrival_s", copy)
        n = len(arrival)
        columns = {
            "input_len": input_len,
            "output_len": output_len,
            "block_offsets": block_offsets,
            "block_hashes": block_hashes,
            "traffic_class": np.zeros(n, np.int8) if traffic_class is None else traffic_class,
            "image_count": np.zeros(n, np.int16) if image_count is None else image_count,
            "session_id": np.full(n, -1, np.int64) if session_id is None else session_id,
        }
        arrays = {
            k: _block_id_column(v, copy)
            if k == "block_hashes"
            else _as_column(v, _INT_COLUMNS[k], k, copy)
            for k, v in columns.items()
        }
        if isinstance(class_names, str):
            raise ValueError("class_names: expected a sequence of names, got one string")
        source = cls(
            arrival_s=arrival,
            class_names=tuple(class_names),
            block_tokens=int(block_tokens),
            name=str(name),
            **arrays,
        )
        source._validate(check_order=not sort)
        if sort:
            order = np.argsort(source.arrival_s, kind="stable")
            if np.any(order != np.arange(n)):
                source = source._take(order)  # a row permutation keeps every other check true
        return source._freeze()

    def _freeze(self) -> RequestSource:
        for field in ("arrival_s", *_INT_COLUMNS):
            _frozen(getattr(self, field))
        return self

    # ------------------------------------------------------------------ access

    def __len__(self) -> int:
        return len(self.arrival_s)

    def __repr__(self) -> str:
        span = float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0
        return (
            f"RequestSource(name={self.name!r}, requests={len(self)}, span_s={span:.3f}, "
            f"blocks={len(self.block_hashes)}, block_tokens={self.block_tokens}, "
            f"classes={self.class_names})"
        )

    def blocks(self, i: int) -> npt.NDArray[np.int64]:
        """The prefix-block ids of request ``i``, int64 (a read-only view, or a copy of ids
        kept in 4 bytes)."""
        ids: np.ndarray = self.block_hashes[self.block_offsets[i] : self.block_offsets[i + 1]]
        return ids if ids.dtype == np.int64 else ids.astype(np.int64)

    def forget_blocks(self) -> None:
        """Drop the prefix-block ids, in place: every request then has none (so the source no
        longer passes :meth:`validate`). :func:`~deepinfer_sim.simulate` calls it on a source it
        built itself, once the run is over: its results never read the ids, and at a million
        requests they are ~150 MB that assembling the results would otherwise hold beside the
        results' own columns (the run's peak memory)."""
        object.__setattr__(self, "block_hashes", self.block_hashes[:0].copy())
        object.__setattr__(self, "block_offsets", np.zeros(len(self.block_offsets), np.int64))

    @property
    def n_blocks(self) -> npt.NDArray[np.int64]:
        """Blocks per request (``ceil(input_len / block_tokens)``)."""
        return np.diff(self.block_offsets)

    def class_code(self, name: str) -> int:
        """The ``traffic_class`` code of class ``name``; ``KeyError`` naming the known classes."""
        try:
            return self.class_names.index(name)
        except ValueError:
            raise KeyError(f"unknown traffic class {name!r}; known: {self.class_names}") from None

    # ------------------------------------------------------------------ checking

    def _check_shapes(self) -> None:
        n = len(self.arrival_s)
        for field, dtype in (("arrival_s", np.float64), *_INT_COLUMNS.items()):
            arr = getattr(self, field)
            if not isinstance(arr, np.ndarray) or arr.ndim != 1:
                raise ValueError(f"{field}: expected a 1-D numpy array")
            allowed = (np.int32, np.int64) if field == "block_hashes" else (dtype,)
            if arr.dtype not in allowed:
                raise ValueError(f"{field}: expected dtype {np.dtype(dtype)}, got {arr.dtype}")
            if field == "block_offsets":
                expected = n + 1
            elif field == "block_hashes":
                expected = len(arr)
            else:
                expected = n
            if len(arr) != expected:
                raise ValueError(f"{field}: expected length {expected}, got {len(arr)}")
        if not isinstance(self.block_tokens, int) or self.block_tokens < 1:
            raise ValueError(f"block_tokens: expected a positive int, got {self.block_tokens!r}")
        names = self.class_names
        if not names or not all(isinstance(c, str) and c for c in names):
            raise ValueError(f"class_names: expected non-empty strings, got {names!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"class_names: duplicate names in {names!r}")

    def validate(self) -> None:
        """Check shapes, dtypes, value ranges, sortedness and CSR consistency.

        Raises ``ValueError`` naming the field and the first offending row.
        """
        self._validate(check_order=True)

    def _validate(self, check_order: bool) -> None:
        self._check_shapes()

        def fail(field: str, bad: np.ndarray, what: str) -> NoReturn:
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{field}: {what} (first at row {row})")

        arrival = self.arrival_s
        if len(arrival):
            if not np.all(np.isfinite(arrival)):
                fail("arrival_s", ~np.isfinite(arrival), "must be finite")
            if np.any(arrival < 0):
                fail("arrival_s", arrival < 0, "must be >= 0")
            if check_order and np.any(np.diff(arrival) < 0):
                fail("arrival_s", np.diff(arrival) < 0, "must be non-decreasing (sorted)")
        for field, low in (("input_len", 1), ("output_len", 1), ("image_count", 0)):
            arr = getattr(self, field)
            if np.any(arr < low):
                fail(field, arr < low, f"must be >= {low}")
        if np.any(self.session_id < -1):
            fail("session_id", self.session_id < -1, "must be >= 0, or -1 for unknown")
        codes = self.traffic_class
        bad = (codes < 0) | (codes >= len(self.class_names))
        if np.any(bad):
            fail("traffic_class", bad, f"must be a code in [0, {len(self.class_names)})")
        offsets = self.block_offsets
        if offsets[0] != 0:
            raise ValueError(f"block_offsets: must start at 0, got {offsets[0]}")
        if offsets[-1] != len(self.block_hashes):
            raise ValueError(
                f"block_offsets: must end at len(block_hashes)={len(self.block_hashes)}, "
                f"got {offsets[-1]}"
            )
        expected = -(-self.input_len // self.block_tokens)
        counts = np.diff(offsets)
        if np.any(counts != expected):
            fail(
                "block_offsets",
                counts != expected,
                f"each request needs ceil(input_len / {self.block_tokens}) blocks",
            )

    # ------------------------------------------------------------------ derived sources

    def _take(self, rows: np.ndarray, arrival_s: np.ndarray | None = None) -> RequestSource:
        """Rows ``rows`` in the given order (no sorting, no validation)."""
        rows = np.asarray(rows, dtype=np.int64)
        offsets, hashes = _gather_csr(self.block_offsets, self.block_hashes, rows)
        return replace(
            self,
            arrival_s=self.arrival_s[rows] if arrival_s is None else arrival_s,
            input_len=self.input_len[rows],
            output_len=self.output_len[rows],
            block_offsets=offsets,
            block_hashes=hashes,
            traffic_class=self.traffic_class[rows],
            image_count=self.image_count[rows],
            session_id=self.session_id[rows],
        )

    def with_arrivals(self, arrival_s: Any) -> RequestSource:
        """The same requests at new arrival times (one per row), re-sorted stably by them.

        Ties keep row order; each request's block list moves with it.
        """
        arrival = _as_column(arrival_s, np.float64, "arrival_s")
        if len(arrival) != len(self):
            raise ValueError(f"arrival_s: expected length {len(self)}, got {len(arrival)}")
        if not np.all(np.isfinite(arrival) & (arrival >= 0)):
            raise ValueError("arrival_s: must be finite and >= 0")
        order = np.argsort(arrival, kind="stable")
        if np.all(order == np.arange(len(order))):
            return replace(self, arrival_s=_frozen(arrival))
        return self._take(order, arrival_s=arrival[order])._freeze()

    def select(self, rows: Any) -> RequestSource:
        """The requests picked by a boolean mask or integer indices, kept in arrival order.

        Repeated indices repeat a request (useful for resampling).
        """
        rows = np.asarray(rows)
        if rows.dtype == bool:
            if rows.shape != (len(self),):
                raise ValueError(f"mask: expected shape ({len(self)},), got {rows.shape}")
            idx = np.flatnonzero(rows)
        elif rows.size == 0:
            idx = np.zeros(0, dtype=np.int64)
        elif rows.dtype.kind in "iu" and rows.ndim == 1:
            if rows.min() < -len(self) or rows.max() >= len(self):
                raise IndexError(f"row index out of range for {len(self)} requests")
            idx = np.sort(np.where(rows < 0, rows + len(self), rows), kind="stable")
        else:
            raise ValueError(
                f"rows: expected a boolean mask or 1-D integer indices, got {rows.dtype}"
            )
        return self._take(idx)._freeze()

    def head(self, n: int) -> RequestSource:
        """The first ``n`` requests (all of them when ``n >= len(self)``)."""
        if n < 0:
            raise ValueError(f"head: n must be >= 0, got {n}")
        return self._take(np.arange(min(n, len(self))))._freeze()

    def window(self, start_s: float, end_s: float) -> RequestSource:
        """Requests arriving in ``[start_s, end_s)``, re-timed so that ``start_s`` becomes 0."""
        if not (math.isfinite(start_s) and start_s >= 0 and end_s >= start_s):
            raise ValueError(f"window: need 0 <= start_s <= end_s, got [{start_s}, {end_s})")
        lo, hi = np.searchsorted(self.arrival_s, [start_s, end_s], side="left")
        rows = np.arange(lo, hi)
        # Clamp at 0: a float subtraction may not round below it, but be explicit.
        arrival = np.maximum(self.arrival_s[rows] - start_s, 0.0)
        return self._take(rows, arrival_s=arrival)._freeze()

    def scale_rate(self, factor: float) -> RequestSource:
        """Multiply the request rate by ``factor`` (arrival times are divided by it)."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"scale_rate: factor must be finite and > 0, got {factor}")
        return replace(self, arrival_s=_frozen(self.arrival_s / factor))

    def with_classes(self, traffic_class: Any, class_names: Sequence[str]) -> RequestSource:
        """The same requests with new traffic-class codes (one per row) and class names."""
        return RequestSource.from_columns(
            arrival_s=self.arrival_s,
            input_len=self.input_len,
            output_len=self.output_len,
            block_offsets=self.block_offsets,
            block_hashes=self.block_hashes,
            block_tokens=self.block_tokens,
            traffic_class=traffic_class,
            class_names=tuple(class_names),
            image_count=self.image_count,
            session_id=self.session_id,
            name=self.name,
        )

    def with_name(self, name: str) -> RequestSource:
        """The same requests under another name."""
        return replace(self, name=name)

    @classmethod
    def merge(cls, *sources: RequestSource, name: str | None = None) -> RequestSource:
        """Interleave several sources by arrival time into one.

        Sources are treated as independent workloads: each one's block ids and session ids are
        shifted into a range of their own, so no prefix or session is shared across sources.
        Class names are united (codes remapped). All sources need the same ``block_tokens``.
        Ties in arrival time keep source order, then row order.
        """
        if not sources:
            raise ValueError("merge: need at least one source")
        block_tokens = sources[0].block_tokens
        if any(s.block_tokens != block_tokens for s in sources):
            raise ValueError(f"merge: block_tokens differ: {[s.block_tokens for s in sources]}")
        names: list[str] = []
        for s in sources:
            names.extend(c for c in s.class_names if c not in names)
        lows, bases, sessions, codes = [], [], [], []
        next_hash = next_session = 0
        for s in sources:
            low = 0
            if len(s.block_hashes):
                low, high = int(s.block_hashes.min()), int(s.block_hashes.max())
                if next_hash + (high - low) > _INT64_MAX:
                    raise ValueError("merge: shifted block ids overflow int64")
            lows.append(low)
            bases.append(next_hash)
            if len(s.block_hashes):
                next_hash += high - low + 1
            known = s.session_id >= 0
            top = int(s.session_id.max()) if known.any() else -1
            if next_session + top > _INT64_MAX:
                raise ValueError("merge: shifted session ids overflow int64")
            sessions.append(np.where(known, s.session_id + next_session, -1))
            next_session += top + 1
            remap = np.array([names.index(c) for c in s.class_names], dtype=np.int8)
            codes.append(remap[s.traffic_class])
        arrival = np.concatenate([s.arrival_s for s in sources])
        order = np.argsort(arrival, kind="stable")
        offsets = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(np.concatenate([s.n_blocks for s in sources])[order], out=offsets[1:])
        hashes = _merged_hashes(sources, lows, bases, order, offsets, next_hash - 1)

        def rows(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(parts)[order]

        return cls.from_columns(
            arrival_s=arrival[order],
            input_len=rows([s.input_len for s in sources]),
            output_len=rows([s.output_len for s in sources]),
            block_offsets=offsets,
            block_hashes=hashes,
            block_tokens=block_tokens,
            traffic_class=rows(codes),
            class_names=tuple(names),
            image_count=rows([s.image_count for s in sources]),
            session_id=rows(sessions),
            name=name if name is not None else "+".join(s.name for s in sources),
            copy=False,
        )

    # ------------------------------------------------------------------ summaries

    def to_frame(self) -> pd.DataFrame:
        """One row per request (no block ids): arrival, lengths, block count, class, session."""
        import pandas as pd

        return pd.DataFrame(
            {
                "arrival_s": self.arrival_s,
                "input_len": self.input_len,
                "output_len": self.output_len,
                "n_blocks": self.n_blocks,
                "traffic_class": pd.Categorical.from_codes(
                    self.traffic_class.astype(np.int64), categories=pd.Index(list(self.class_names))
                ),
                "image_count": self.image_count,
                "session_id": self.session_id,
            }
        )

    def prefix_hit_tokens(self) -> npt.NDArray[np.int64]:
        """Per request, the prompt tokens an infinite prefix cache would serve, in arrival order.

        A block hits when its id was seen in an earlier request *and* every block before it in
        this request hit too (a prefix cache cannot skip a miss). Partial last blocks count
        their actual tokens.
        """
        hashes = self.block_hashes
        n_refs = len(hashes)
        if n_refs == 0:
            return np.zeros(len(self), dtype=np.int64)
        # A reference is "seen" when its id first occurred in an earlier request.
        _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        row = np.repeat(np.arange(len(self), dtype=np.int64), self.n_blocks)
        seen_before = row[first][inverse] < row
        # Prefix rule: a block hits only if no miss precedes it within its request.
        misses = np.cumsum(~seen_before)
        misses_before_row = np.concatenate([[0], misses])[self.block_offsets[:-1]]
        hit = (misses - np.repeat(misses_before_row, self.n_blocks)) == 0
        tokens = np.where(hit, self._block_token_counts(), 0)
        # Float sums are exact here: totals stay far below 2**53.
        return np.bincount(row, weights=tokens, minlength=len(self)).astype(np.int64)

    def _block_token_counts(self) -> npt.NDArray[np.int64]:
        """Tokens in each block reference: ``block_tokens`` except a partial last block."""
        tokens = np.full(len(self.block_hashes), self.block_tokens, dtype=np.int64)
        last = self.block_offsets[1:] - 1
        tokens[last] = self.input_len - self.block_tokens * (self.n_blocks - 1)
        return tokens

    def stats(self) -> dict[str, Any]:
        """Headline numbers: size, span, rate, length percentiles and prefix reuse.

        ``prefix_reuse_tokens`` is the token-weighted share of prompt tokens an infinite prefix
        cache would serve when requests arrive in order (see :meth:`prefix_hit_tokens`).
        """
        n = len(self)
        span = float(self.arrival_s[-1] - self.arrival_s[0]) if n else 0.0
        out: dict[str, Any] = {
            "name": self.name,
            "count": n,
            "span_s": span,
            "rate_per_s": n / span if span > 0 else math.nan,
        }
        for field in ("input_len", "output_len"):
            arr = getattr(self, field)
            key = field.split("_")[0]
            if n:
                p50, p99 = np.percentile(arr, [50, 99])
                out |= {f"{key}_mean": float(arr.mean()), f"{key}_p50": float(p50)}
                out[f"{key}_p99"] = float(p99)
            else:
                out |= {f"{key}_mean": math.nan, f"{key}_p50": math.nan, f"{key}_p99": math.nan}
        total_tokens = int(self.input_len.sum())
        out["block_refs"] = len(self.block_hashes)
        out["unique_blocks"] = len(np.unique(self.block_hashes))
        hits = int(self.prefix_hit_tokens().sum()) if n else 0
        out["prefix_reuse_tokens"] = hits / total_tokens if total_tokens else math.nan
        return out
