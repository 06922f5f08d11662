"""What one run builds and counts: the cluster of stage instances, the event clock, and the
conservation checks at its end (a failure is a simulator bug and fails loudly)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from ...errors import InvariantError
from ...models.spec import ModelSpec
from ...scenario import Scenario
from ..policies.admission import Admission
from ..stages.decode import DecodeGroup
from ..stages.prefill import PrefillEngine
from ..stages.prefill_path import PrefillPath
from ..stages.vision import VisionInstance
from .network import Link
from .requests import RequestTable, State

if TYPE_CHECKING:
    from .flow import RequestFlow


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules (``sim.events``)."""

    def __init__(self, initial_time: float = 0) -> None:
        super().__init__(initial_time)
        self.events = 0

    def schedule(
        self, event: simpy.events.Event, priority: Any = simpy.events.NORMAL, delay: float = 0
    ) -> None:
        """Schedule ``event`` ``delay`` seconds from now, counted. The clock is kept a Python
        float: a delay computed from numpy arrays is an ``np.float64``, which would make ``now``
        one too, and then every time sum and every comparison in the event heap a numpy scalar
        operation (the same IEEE value, several times slower)."""
        self.events += 1
        super().schedule(event, priority, float(delay))


@dataclass
class Cluster:
    """Everything one run builds; handed to the sampler, the summary and the invariant checks."""

    sc: Scenario
    model: ModelSpec
    env: CountingEnvironment
    table: RequestTable
    vision: list[VisionInstance]
    prefill: Sequence[PrefillEngine]  # prefill instances, or the aggregated instances
    decode: list[DecodeGroup]
    links: list[Link]
    kv_capacity_tokens: float
    seq_overhead_tokens: float  # per-sequence constant HBM (SWA slot) in KV-token units
    arrived: int = 0
    ended: int = 0
    all_ended: simpy.Event | None = None
    counters: dict[str, int] = field(default_factory=dict)
    backup_links: list[Link] = field(default_factory=list)
    path: PrefillPath | None = None
    # decode ranks up, scheduled rank repairs still to come, and the requests waiting for a
    # repair because every rank was down: (request id, prefill instance holding its KV, or -1
    # when its KV is lost and it recomputes where it lands)
    live_ranks: int = 0
    repairs_pending: int = 0
    parked: deque[tuple[int, int]] = field(default_factory=deque)
    flow: RequestFlow | None = None  # the hand-offs between stages (sim/core/flow.py)
    admission: Admission = field(default_factory=Admission)  # policies.admission

    def count_end(self) -> None:
        self.ended += 1
        if self.ended == self.table.n and self.all_ended is not None:
            self.all_ended.succeed()


def check_invariants(cl: Cluster) -> None:
    """Conservation at the end of a run; a failure is a simulator bug and fails loudly."""
    t = cl.table
    errs: list[str] = []
    states = np.bincount(t.state, minlength=len(State))
    if int(states[State.PENDING]) != t.n - cl.arrived:
        errs.append("arrived count does not match requests that left PENDING")
    done, rejected = int(states[State.DONE]), int(states[State.REJECTED])
    in_flight = cl.arrived - done - rejected
    if in_flight < 0:
        errs.append("more requests ended than arrived")
    if done + rejected != cl.ended:
        errs.append(f"ended counter {cl.ended} != done {done} + rejected {rejected}")
    finished = t.state == State.DONE
    if np.isnan(t.t_done[finished]).any():
        errs.append("a completed request has no completion time")
    order_ok = t.t_done[finished] >= t.arrival[finished] - 1e-9
    if not order_ok.all():
        errs.append("a request completed before it arrived")
    for g in cl.decode:
        errs.extend(g.check())
        running = int(states[State.DECODE])
        if sum(gr.n for gr in cl.decode) != running:
            errs.append("running decode slots do not match requests in DECODE state")
            break
    if cl.path is not None:
        errs.extend(cl.path.check())
    in_transfer = int(states[State.TRANSFER])
    links = [*cl.links, *cl.backup_links]
    transfers = sum(1 for link in links for fid in link.callbacks if fid % 2 == 0)
    if transfers != in_transfer:
        errs.append(f"{transfers} P->D flows on the links but {in_transfer} requests in TRANSFER")
    if errs:
        raise InvariantError("; ".join(errs))
