"""Admission control: which arrivals are turned away before they queue (``policies.admission``).

Without it an overloaded cluster rejects nothing: its queues, and every TTFT, grow for as long
as the overload lasts. A policy decides at arrival, after the checks that a request can run at
all (context window, KV capacity, a vision encoder for images), and a rejection carries its
reason into ``requests.rejected_by_reason``:

- ``none``: admit everything (the reference implementation).
- ``queue_time``: reject when the predicted wait before the prompt's prefill starts exceeds
  the limit (``queue_time``). The wait is what the prefill instances already predict for the
  router: the least-loaded instance's queued work ``outstanding_s`` (balanced-step seconds of
  every queued chunk) over its DP ranks, which drain in parallel. It leaves out the prefix load
  and any vision encoding ahead of the prefill. ``slo_aware`` derives the limit from the TTFT
  SLO (a share of it, the rest being the prefill itself and the transfer).
- ``queue_length``: reject when ``max_queued`` prompts are already between admission and the
  end of their prefill across the pool (``queue_length``).

Cost per arrival: a counter (``queue_length``), or one pass over the prefill instances'
``outstanding_s`` (``queue_time``), the pass the router makes anyway; nothing depends on how
many requests are queued.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...scenario import AdmissionPolicy, QueueLengthAdmission, QueueTimeAdmission, Slo
from ..core.requests import RejectReason

if TYPE_CHECKING:
    from ..stages.prefill import PrefillEngine


class Admission:
    """Admits everything; counts prompts between admission and the end of their prefill."""

    __slots__ = ("backlog", "backlog_max", "limit_s", "max_queued", "wait_max_s")

    def __init__(self) -> None:
        self.backlog = 0  # admitted prompts whose prefill has not ended (vision and load too)
        self.backlog_max = 0
        self.wait_max_s = 0.0  # largest predicted wait seen at an arrival (queue_time)
        self.limit_s: float | None = None
        self.max_queued: int | None = None

    def reason(self, rid: int) -> RejectReason:
        """Why request ``rid`` is turned away now, or ``RejectReason.NONE`` to admit it."""
        return RejectReason.NONE

    def admitted(self) -> None:
        self.backlog += 1
        if self.backlog > self.backlog_max:
            self.backlog_max = self.backlog

    def prefilled(self) -> None:
        self.backlog -= 1

    def report(self) -> dict[str, float | None]:
        """The policy's own part of the summary: its limits (None where it sets none), the
        largest predicted wait it saw (None without a wait limit) and the largest backlog."""
        return {
            "max_wait_s": self.limit_s,
            "max_queued": self.max_queued,
            "predicted_wait_max_s": self.wait_max_s if self.limit_s is not None else None,
            "prefill_backlog_max": self.backlog_max,
        }


class QueueTime(Admission):
    __slots__ = ("instances",)

    def __init__(self, instances: Sequence[PrefillEngine], limit_s: float) -> None:
        super().__init__()
        self.instances = instances
        self.limit_s = limit_s

    def predicted_wait_s(self) -> float:
        return min(inst.outstanding_s / inst.dp for inst in self.instances)

    def reason(self, rid: int) -> RejectReason:
        wait = self.predicted_wait_s()
        if wait > self.wait_max_s:
            self.wait_max_s = wait
        assert self.limit_s is not None
        return RejectReason.QUEUE_TIME if wait > self.limit_s else RejectReason.NONE


class QueueLength(Admission):
    __slots__ = ()

    def __init__(self, max_queued: int) -> None:
        super().__init__()
        self.max_queued = max_queued

    def reason(self, rid: int) -> RejectReason:
        assert self.max_queued is not None
        return RejectReason.QUEUE_LENGTH if self.backlog >= self.max_queued else RejectReason.NONE


def queue_time_limit_s(cfg: QueueTimeAdmission, slo: Slo) -> float:
    """The wait limit: ``max_wait_s``, the SLO-derived one, or the smaller of the two."""
    limits = [] if cfg.max_wait_s is None else [cfg.max_wait_s]
    if cfg.slo_aware:
        limits.append(cfg.slo_wait_fraction * slo.ttft_s)
    return min(limits)


def make_admission(cfg: AdmissionPolicy, slo: Slo, instances: Sequence[PrefillEngine]) -> Admission:
    if isinstance(cfg, QueueTimeAdmission):
        return QueueTime(instances, queue_time_limit_s(cfg, slo))
    if isinstance(cfg, QueueLengthAdmission):
        return QueueLength(cfg.max_queued)
    return Admission()
