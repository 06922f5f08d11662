"""Decode KV admission: how much KV a sequence holds on its rank (``pools.decode.kv_policy``).

A decode rank has a fixed KV capacity (tokens). A policy says what a sequence reserves against
it, whether a waiting request fits, how reservations grow as sequences decode, which sequences a
rank drops when its reservations outgrow the capacity, and what a sequence whose KV was dropped
recomputes when it is readmitted. Policies:

- ``reserve`` (the reference): a sequence reserves its request's whole context (prompt + output)
  plus the per-sequence overhead (the SWA slot) at admission, so a rank never outgrows its
  capacity and nothing is preempted; a request waits until its whole context fits.
- ``preempt``: a sequence reserves only the context it holds (plus the overhead) and grows a
  token at a time; a rank whose reservations outgrow the capacity drops its most recently
  admitted sequences until the rest fit.

Either way a sequence whose KV was dropped (preempted, or moved off a failed rank) rebuilds it
when readmitted: a prefill of its whole context with no cached prefix.

The decode group calls ``grow`` and ``victims`` once per step with its per-rank and per-slot
arrays (slots ``[0, hw)``, holes have request id -1); both are vectorized over ranks and slots.
``reservation`` and ``fits`` are scalar: admission already goes request by request.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ...errors import ConfigError

_NONE = np.zeros(0, dtype=np.int64)


class KvAdmission(Protocol):
    seq_overhead: float  # per-sequence KV-token reservation besides its context (SWA slot)

    def reservation(self, ctx: float, context: float) -> float:
        """KV tokens reserved by a sequence holding ``ctx`` context tokens of a request whose
        whole context (prompt + output) is ``context``."""
        ...

    def fits(self, reserved: float, need: float, capacity: float) -> bool:
        """Whether a sequence reserving ``need`` is admitted on a rank with ``reserved`` of its
        ``capacity`` taken."""
        ...

    def grow(self, reserved: np.ndarray, added: np.ndarray) -> None:
        """Sequences on each rank gained ``added`` context tokens this step: update the per-rank
        ``reserved`` in place."""
        ...

    def victims(
        self,
        reserved: np.ndarray,
        capacity: float,
        rank: np.ndarray,
        req: np.ndarray,
        k0: np.ndarray,
        ctx: np.ndarray,
    ) -> np.ndarray:
        """Slots to preempt, in the order to drop them, so that every rank's ``reserved`` is back
        within ``capacity``. Per slot: ``rank``, request id ``req`` (-1: a hole), admission step
        ``k0`` and context tokens ``ctx``."""
        ...

    def recompute(self, ctx: int) -> tuple[int, int]:
        """The prefill (new tokens, cached prefix tokens) a readmitted sequence holding ``ctx``
        context tokens runs to rebuild its dropped KV."""
        ...


class ReserveWholeContext:
    """Reserve the whole context at admission; never preempt."""

    __slots__ = ("seq_overhead",)

    def __init__(self, seq_overhead: float = 0.0) -> None:
        self.seq_overhead = seq_overhead

    def reservation(self, ctx: float, context: float) -> float:
        return context + self.seq_overhead

    def fits(self, reserved: float, need: float, capacity: float) -> bool:
        return reserved + need <= capacity

    def grow(self, reserved: np.ndarray, added: np.ndarray) -> None:
        pass  # the whole context was reserved up front

    def victims(
        self,
        reserved: np.ndarray,
        capacity: float,
        rank: np.ndarray,
        req: np.ndarray,
        k0: np.ndarray,
        ctx: np.ndarray,
    ) -> np.ndarray:
        return _NONE

    def recompute(self, ctx: int) -> tuple[int, int]:
        return (ctx, 0)


class PreemptNewest(ReserveWholeContext):
    """Reserve the current context and grow; an overflowing rank drops its newest sequences."""

    __slots__ = ()

    def reservation(self, ctx: float, context: float) -> float:
        return ctx + self.seq_overhead

    def grow(self, reserved: np.ndarray, added: np.ndarray) -> None:
        reserved += added

    def victims(
        self,
        reserved: np.ndarray,
        capacity: float,
        rank: np.ndarray,
        req: np.ndarray,
        k0: np.ndarray,
        ctx: np.ndarray,
    ) -> np.ndarray:
        over = np.flatnonzero(reserved > capacity)
        if not over.size:
            return _NONE
        live = req >= 0
        held = ctx + self.seq_overhead
        drop = []
        for r in over.tolist():  # ranks out of KV: few, and only when they run out
            slots = np.flatnonzero(live & (rank == r))
            slots = slots[np.argsort(-k0[slots], kind="stable")]
            # what the rank holds after dropping the first j of them, subtracted in turn exactly
            # as the group releases them
            left = np.subtract.accumulate(np.concatenate(([reserved[r]], held[slots])))
            enough = np.flatnonzero(left <= capacity)
            drop.append(slots[: enough[0] if enough.size else slots.size])
        return np.concatenate(drop)


KV_ADMISSION: dict[str, type[ReserveWholeContext]] = {
    "reserve": ReserveWholeContext,
    "preempt": PreemptNewest,
}


def make_kv_admission(tag: str, seq_overhead: float) -> KvAdmission:
    if tag not in KV_ADMISSION:
        known = ", ".join(KV_ADMISSION)
        raise ConfigError("pools.decode.kv_policy", f"unknown KV policy {tag!r} (one of {known})")
    return KV_ADMISSION[tag](seq_overhead)
