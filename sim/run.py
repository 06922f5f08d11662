"""simulate(): build the cluster a Scenario describes and replay its workload through it.

Data flow (one direction): Scenario + RequestSource + StepCost -> events -> Result.

    arrival ─┬─(images)→ vision encoder ─┐
             └───────────────────────────┴→ prefill router → prefill instance (one event/step)
                → decode balancer picks (group, rank) → P→D KV transfer over the instance's link
                → decode group (one event/step for all its ranks) → completion

Requests are integer ids into a columnar RequestTable; components call each other through plain
callbacks, and each request costs events only at arrival, stage hand-offs and completion.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
import warnings
from collections.abc import Callable

import numpy as np
import simpy

from ..errors import ConfigWarning, UserError
from ..jit import use_for_run
from ..scenario import Scenario, check_run_size
from ..traces import RequestSource
from ..traces.workload import build_source
from .core.assemble import build_cluster
from .core.cluster import Cluster, check_invariants
from .core.requests import State
from .results.itl import itl_summary
from .results.result import Result
from .results.revenue import unpriced_classes
from .results.summary import summarize
from .results.timeseries import TimeseriesSampler


def simulate(
    sc: Scenario,
    source: RequestSource | None = None,
    progress: Callable[[float, int, int], None] | None = None,
    on_build: Callable[[Cluster], None] | None = None,
) -> Result:
    """Run one scenario. ``source`` overrides the scenario's workload (tests, notebooks);
    ``on_build`` sees the cluster before it starts (e.g. to record expert steps)."""
    wall0 = time.perf_counter()
    _return_freed_memory()
    built = source is None
    if source is None:
        source = build_source(sc.workload, sc.seed)
    check_run_size(sc, source.arrival_s)  # a run that would tick for hours is refused up front
    unpriced = unpriced_classes(sc.prices.revenue, source.class_names)
    if unpriced:  # shown once per process for the same workload (Python's default filter)
        warnings.warn(
            f"prices.revenue.by_class: {', '.join(unpriced)} never appear in the workload "
            f"(its traffic classes: {', '.join(source.class_names)}); those prices are unused",
            ConfigWarning,
            stacklevel=2,
        )
    use_for_run(len(source))  # compiled step functions where they pay (same bits either way)
    cl = build_cluster(sc, source)
    if on_build is not None:
        on_build(cl)
    sampler = TimeseriesSampler(cl, sc.sim.timeseries_interval_s)
    env = cl.env
    horizon = sc.sim.horizon_s
    assert cl.all_ended is not None
    if len(source) == 0:
        cl.all_ended.succeed()
    last_arrival = float(source.arrival_s[-1]) if len(source) else 0.0
    step = max(1.0, last_arrival / 50)
    stop = horizon if horizon is not None else last_arrival + sc.sim.drain_limit_s
    while not cl.all_ended.triggered:
        target = min(env.now + step, stop)
        env.run(until=simpy.AnyOf(env, [cl.all_ended, env.timeout(target - env.now)]))
        if progress is not None:
            progress(env.now, cl.ended, cl.table.n)
        if env.now >= stop and not cl.all_ended.triggered:
            if horizon is not None:
                break
            raise UserError(
                f"{cl.arrived - cl.ended:,} requests still in flight {sc.sim.drain_limit_s:g} "
                f"simulated s after the last arrival (t={last_arrival:,.0f} s): the deployment "
                "cannot serve this load (a link, pool or store too slow for it); raise "
                "sim.drain_limit_s, or set sim.horizon_s to cut the run"
            )
    sampler.sample()
    if horizon is not None and cl.arrived and not np.any(cl.table.state == State.DONE):
        warnings.warn(
            f"sim.horizon_s: no request completed within the {horizon:g} simulated s "
            f"({cl.arrived:,} arrived): its latencies are empty (null in summary.json)",
            ConfigWarning,
            stacklevel=2,
        )
    check_invariants(cl)
    _release_blocks(cl)
    if built:  # nobody else holds it: its block ids go before the results are assembled
        source.forget_blocks()
    wall = time.perf_counter() - wall0
    itl_stats, itl_max = itl_summary(cl.table, cl.decode, sc.sim.percentiles)
    timeseries = sampler.table()
    summary = summarize(
        cl, itl_stats, wall, sampler.read_gbps_peak, sampler.queue_stats(), timeseries
    )
    return Result(
        scenario=sc,
        request_table=cl.table.columns(itl_max),
        timeseries_table=timeseries,
        summary=summary,
    )


_MMAP_THRESHOLD = -3  # glibc's mallopt parameter M_MMAP_THRESHOLD
_MAPPED_FROM_BYTES = 1 << 20


@functools.cache
def _return_freed_memory() -> None:
    """Once per process, on glibc: blocks of 1 MiB and more are mapped on their own, so an array
    that size goes back to the system when it is freed. glibc otherwise raises that threshold to
    the largest block freed so far (up to 32 MiB), and the workload's and the results' temporary
    arrays then stay in the heap: a 1 M-request run held 325 MiB after building its workload, 250
    with this. Results do not change."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):  # not Unix, or not glibc
        libc = ""
    if not libc.startswith("glibc"):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_MMAP_THRESHOLD, _MAPPED_FROM_BYTES)


def _release_blocks(cl: Cluster) -> None:
    """The run is over: free the prefix store's and the SWA directory's per-block state (their
    counts stay for the summary) before the results are assembled."""
    path = cl.path
    if path is not None:
        if path.store is not None:
            path.store.release()
        if path.swa is not None:
            path.swa.release()
