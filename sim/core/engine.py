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

import math
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from ...errors import ConfigError, ConfigWarning, InvariantError, UserError
from ...models.cost import PoolShape, RooflineStepCost, StepCost
from ...models.hardware import HardwareSpec
from ...models.profile import load_profile
from ...models.profile_cost import ProfileStepCost
from ...models.registry import load_hardware, load_model
from ...models.spec import ModelSpec
from ...rng import stream
from ...scenario import Scenario
from ...traces import RequestSource
from ...traces.workload import build_source
from ..policies.admission import Admission, make_admission
from ..policies.balancer import make_balancer
from ..policies.kv_admission import make_kv_admission
from ..policies.speculative import (
    ClassAcceptance,
    PolicyParts,
    SpecDecoder,
    make_verify_policy,
    max_draft,
)
from ..results.itl import itl_summary
from ..results.result import Result
from ..results.revenue import unpriced_classes
from ..results.summary import summarize
from ..results.timeseries import TimeseriesSampler
from ..stages.decode import DecodeGroup
from ..stages.expert_load import ExpertLoadModel
from ..stages.expert_parallel import GroupExperts, Pool, group_shape
from ..stages.kvstore import KvStore
from ..stages.prefill import PrefillInstance
from ..stages.prefill_path import PrefillPath
from ..stages.vision import VisionInstance, least_outstanding
from .network import Link
from .requests import RejectReason, RequestTable, State


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules (``sim.events``)."""

    def __init__(self, initial_time: float = 0) -> None:
        super().__init__(initial_time)
        self.events = 0

    def schedule(
        self, event: simpy.events.Event, priority: Any = simpy.events.NORMAL, delay: float = 0
    ) -> None:
        self.events += 1
        super().schedule(event, priority, delay)


def make_step_cost(
    sc: Scenario, pool: str, model: ModelSpec, hw: HardwareSpec, ep: int, redundant: float
) -> StepCost:
    """The pool's StepCost: the roofline, or the named calibration profile on this hardware
    (with the pool's two-batch-overlap setting)."""
    cm = sc.cost_model
    ref = cm.for_pool(pool)
    cfg = sc.pools.prefill if pool == "prefill" else sc.pools.decode
    shape = PoolShape(ep, redundant, pool != "vision" and cfg.two_batch_overlap)
    if ref == "roofline":
        return RooflineStepCost(model, hw, shape, cm.roofline, cm.step)
    profile = load_profile(ref)
    coefs = profile.coefs(model, hw.name)
    return ProfileStepCost(model, hw, shape, coefs, cm.step, profile.name)


def decode_kv_capacity_tokens(sc: Scenario, model: ModelSpec, hw: HardwareSpec) -> float:
    """KV tokens one decode rank can hold after its weights and activation reserve."""
    pool = sc.pools.decode
    weights = model.weight_bytes_per_gpu(pool.ep, pool.redundant_per_gpu)
    free = hw.hbm_bytes - weights - pool.activation_reserve_bytes
    if free <= 0:
        raise ConfigError(
            "pools.decode",
            f"weights ({weights / 1e9:.1f} GB) + activation reserve do not fit in "
            f"{hw.name} HBM ({hw.hbm_bytes / 1e9:.0f} GB) at ep={pool.ep}",
        )
    return free * pool.kv_hbm_fraction / model.kv_hbm_bytes_per_token()


def check_prefill_fits(sc: Scenario, model: ModelSpec, hw: HardwareSpec) -> None:
    pool = sc.pools.prefill
    weights = model.weight_bytes_per_gpu(pool.ep, pool.redundant_per_gpu)
    if weights >= hw.hbm_bytes:
        raise ConfigError(
            "pools.prefill.ep",
            f"weights ({weights / 1e9:.1f} GB per GPU) do not fit in {hw.name} HBM "
            f"({hw.hbm_bytes / 1e9:.0f} GB) at ep={pool.ep}; use a wider EP",
        )


def vision_seconds_per_image(sc: Scenario, hw: HardwareSpec) -> float:
    """Encoder time per image: the profile's measurement, else a roofline of the encoder."""
    ref = sc.cost_model.vision
    if ref != "roofline":
        coefs = load_profile(ref).coefs(load_model(sc.model), hw.name)
        measured = coefs.vision_seconds_per_image
        if measured is None:
            raise ConfigError("cost_model.vision", f"profile {ref!r} has no vision measurement")
        return measured
    v = sc.pools.vision
    return 2 * v.encoder_params_b * 1e9 * v.tokens_per_image / (hw.flops("bf16") * v.efficiency)


def make_expert_load(
    sc: Scenario, model: ModelSpec, source: RequestSource
) -> ExpertLoadModel | None:
    """The run's shared expert-load model, or None when the imbalance is a constant."""
    eplb = sc.policies.eplb
    if eplb.imbalance != "live":
        return None
    return ExpertLoadModel(eplb.load, model, source.class_names, sc.seed)


def make_group_experts(
    sc: Scenario, pool: Pool, load: ExpertLoadModel | None, name: str
) -> GroupExperts | None:
    """An EP group's live expert balance, or None when the imbalance is a constant."""
    if load is None:
        return None
    cfg = sc.pools.prefill if pool == "prefill" else sc.pools.decode
    policy = sc.policies.eplb.prefill if pool == "prefill" else sc.policies.eplb.decode
    slots = cfg.redundant_per_gpu
    if slots != int(slots):
        raise ConfigError(
            f"pools.{pool}.redundant_experts",
            f"live EPLB places whole redundant slots per rank: {cfg.redundant_experts} over "
            f"ep={cfg.ep} leaves {slots:.3f} per GPU (use a multiple of ep, or "
            f"policies.eplb.imbalance: constant)",
        )
    shape = group_shape(sc, pool, cfg.ep, int(slots))
    return GroupExperts(load, policy, shape, stream(sc.seed, f"experts/{name}"))


def make_spec_decoder(
    sc: Scenario, model: ModelSpec, source: RequestSource, capacity: int, group: int
) -> SpecDecoder:
    """The group's speculative decoder (one seeded stream per group)."""
    spec = sc.policies.speculative
    classes = [
        ClassAcceptance(a.mean, a.concentration, a.position_decay)
        for a in (spec.for_class(name) for name in source.class_names)
    ]
    rng = stream(sc.seed, f"speculative/{group}")
    policy = make_verify_policy(spec, PolicyParts(max_draft(spec, model), capacity, rng))
    return SpecDecoder(policy=policy, classes=classes, capacity=capacity, rng=rng)


@dataclass
class Cluster:
    """Everything one run builds; handed to the sampler, the summary and the invariant checks."""

    sc: Scenario
    model: ModelSpec
    env: CountingEnvironment
    table: RequestTable
    vision: list[VisionInstance]
    prefill: list[PrefillInstance]
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
    route_decode: Callable[[int, int], None] | None = None
    admission: Admission = field(default_factory=Admission)  # policies.admission

    def count_end(self) -> None:
        self.ended += 1
        if self.ended == self.table.n and self.all_ended is not None:
            self.all_ended.succeed()


def build_cluster(sc: Scenario, source: RequestSource) -> Cluster:
    model = load_model(sc.model)
    hw = {pool: load_hardware(name) for pool, name in sc.hardware_kinds().items()}
    check_prefill_fits(sc, model, hw["prefill"])
    env = CountingEnvironment()
    table = RequestTable(source)
    pools = sc.pools
    imb = sc.policies.expert_imbalance
    load = make_expert_load(sc, model, source)
    kv_cap = decode_kv_capacity_tokens(sc, model, hw["decode"])
    kv_per_token, slot_bytes = model.kv_bytes_per_token(), model.swa_slot_bytes
    seq_overhead = slot_bytes / model.kv_hbm_bytes_per_token()  # SWA slot in KV-token units
    cl = Cluster(sc, model, env, table, [], [], [], [], kv_cap, seq_overhead)
    cl.all_ended = env.event()

    def on_decode_done(rid: int) -> None:
        cl.count_end()

    decode_cost = make_step_cost(
        sc, "decode", model, hw["decode"], pools.decode.ep, pools.decode.redundant_per_gpu
    )
    for g in range(pools.decode.groups):
        cl.decode.append(
            DecodeGroup(
                env=env,
                idx=g,
                ep=pools.decode.ep,
                cost=decode_cost,
                max_seqs_per_rank=pools.decode.max_seqs_per_rank,
                kv_capacity_tokens=kv_cap,
                kv_admission=make_kv_admission(pools.decode.kv_policy, seq_overhead),
                imbalance=imb.decode,
                table=table,
                on_done=on_decode_done,
                spec=make_spec_decoder(
                    sc, model, source, pools.decode.ep * pools.decode.max_seqs_per_rank, g
                ),
                ideal_balance=pools.decode.ideal_balance,
                experts=make_group_experts(sc, "decode", load, f"decode/{g}"),
            )
        )
    balancer = make_balancer(
        sc.policies.decode_balancer, cl.decode, sc.policies.long_request_tokens
    )

    link_bw = sc.network.pd_gbps_per_8_gpus * 1e9 / 8 * pools.prefill.ep / 8
    for i in range(pools.prefill.instances):
        cl.links.append(Link(env, f"pd{i}", link_bw, sc.network.pd_latency_s))
    backups = [
        Link(env, f"pd{i}b", link_bw, sc.network.pd_latency_s)
        for i in range(pools.prefill.instances if sc.network.backup_links else 0)
    ]
    cl.backup_links = backups

    def on_transfer_done(flow: int) -> None:
        rid = flow // 2  # egress flows: 2·rid = P->D transfer, 2·rid + 1 = store write
        table.t_transfer_end[rid] = env.now
        cl.decode[int(table.decode_group[rid])].arrive(rid)

    cl.live_ranks = pools.decode.groups * pools.decode.ep

    def route_decode(rid: int, inst: int) -> None:
        """Send a request to a live decode rank: its KV goes over prefill instance ``inst``'s
        link, or (``inst`` = -1, its KV was lost with a failed rank) it queues there at once and
        recomputes. With every rank down it waits for the next repair, or is rejected when no
        repair will come (a whole-pool outage never loops on a dead rank)."""
        if cl.live_ranks <= 0:
            if cl.repairs_pending > 0:
                cl.parked.append((rid, inst))
                table.state[rid] = State.DECODE_WAIT
                cl.counters["parked"] = cl.counters.get("parked", 0) + 1
            else:
                table.reject(rid, RejectReason.NO_DECODE_RANK)
                cl.count_end()
            return
        g, r = balancer.choose(rid)
        group = cl.decode[g]
        if group.down[r]:  # a balancer bug, not a state to loop on
            raise InvariantError(f"decode balancer chose rank {r} of group {g}, which is down")
        group.assign(rid, r)
        if inst < 0:
            group.arrive(rid)
        else:
            transfer(rid, inst)

    cl.route_decode = route_decode

    def on_prefill_done(rid: int, inst: int) -> None:
        cl.admission.prefilled()
        if table.output_len[rid] <= 1:  # the prefill's token is the whole answer
            table.t_transfer_end[rid] = env.now
            table.t_done[rid] = env.now
            table.state[rid] = State.DONE
            cl.count_end()
            return
        route_decode(rid, inst)

    def transfer(rid: int, inst: int) -> None:
        nbytes = kv_per_token * float(table.input_len[rid]) + slot_bytes
        table.transfer_bytes[rid] = nbytes
        table.state[rid] = State.TRANSFER
        link = cl.links[inst]
        if not link.up and backups:
            link = backups[inst]
            cl.counters["rerouted_transfers"] = cl.counters.get("rerouted_transfers", 0) + 1
        link.send(2 * rid, nbytes, on_transfer_done)

    prefill_cost = make_step_cost(
        sc,
        "prefill",
        model,
        hw["prefill"],
        pools.prefill.ep,
        pools.prefill.redundant_per_gpu,
    )
    cl.path = PrefillPath(
        sc,
        model,
        hw["prefill"],
        env,
        table,
        source,
        prefill_cost,
        imb.prefill,
        cl.links,
        on_prefill_done,
        lambda i: make_group_experts(sc, "prefill", load, f"prefill/{i}"),
    )
    cl.prefill = cl.path.instances
    to_prefill = cl.path.admit
    cl.admission = admission = make_admission(sc.policies.admission, sc.slo, cl.prefill)

    if pools.vision.instances:
        ve_hw = hw["vision"]
        v = pools.vision
        per_image = vision_seconds_per_image(sc, ve_hw)
        images = source.image_count
        for i in range(v.instances):
            cl.vision.append(VisionInstance(env, i, per_image, table, images, to_prefill))

    max_ctx = model.max_context_tokens

    def admit(rid: int) -> None:
        cl.arrived += 1
        need = float(table.input_len[rid] + table.output_len[rid])
        if need > max_ctx:
            table.reject(rid, RejectReason.CONTEXT_TOO_LONG)
        elif need + seq_overhead > kv_cap:
            table.reject(rid, RejectReason.KV_CAPACITY)
        elif source.image_count[rid] > 0 and not cl.vision:
            table.reject(rid, RejectReason.NO_VISION_ENCODER)
        elif reason := admission.reason(rid):  # policies.admission: turned away under load
            table.reject(rid, reason)
        elif source.image_count[rid] > 0:
            admission.admitted()
            least_outstanding(cl.vision).submit(rid)
            return
        else:
            admission.admitted()
            to_prefill(rid)
            return
        cl.count_end()

    def arrivals():
        arrival = source.arrival_s
        for rid in range(len(source)):
            delay = arrival[rid] - env.now
            if delay > 0:
                yield env.timeout(delay)
            admit(rid)

    env.process(arrivals())

    def reroute(rid: int) -> None:
        """A request that lost its decode rank goes to a live one (KV recomputed there)."""
        table.failures[rid] += 1
        cl.counters["requeued"] = cl.counters.get("requeued", 0) + 1
        route_decode(rid, -1)

    for group in cl.decode:
        group.on_evict = reroute
    kv = cl.path.kv if cl.path is not None else None
    for fault in sc.faults:
        if fault.kind == "link_cut":
            env.process(link_cut(cl, fault.target, fault.at_s, fault.duration_s))
        elif fault.kind == "storage_node_fail":
            if kv is not None:
                env.process(storage_node_fail(cl, kv, fault.target, fault.at_s, fault.duration_s))
        else:
            env.process(rank_fail(cl, fault.target, fault.rank, fault.at_s, fault.duration_s))
    if kv is not None and sc.pools.storage.mtbf_h is not None:
        start_random_storage_failures(cl, kv, stream(sc.seed, "storage/failures"))
    return cl


def storage_node_fail(cl: Cluster, kv: KvStore, node: int, at_s: float, duration_s: float):
    """A storage node is down for a while; its group degrades or loses its blocks, then rebuilds."""
    env = cl.env
    yield env.timeout(at_s)
    if kv.nodes.failed[node]:
        return  # already down (a scheduled and a random failure overlap)
    kv.fail_node(node)
    cl.counters["storage_node_failures"] = cl.counters.get("storage_node_failures", 0) + 1
    yield env.timeout(duration_s)
    kv.repair_node(node, env.now)


def start_random_storage_failures(cl: Cluster, kv: KvStore, rng: np.random.Generator) -> None:
    """Every node fails after an exponential time to failure (mean MTBF) and is repaired after
    an exponential time to repair (mean MTTR), over and over."""
    cfg = cl.sc.pools.storage
    assert cfg.mtbf_h is not None
    mtbf_s, mttr_s = cfg.mtbf_h * 3600.0, cfg.mttr_h * 3600.0

    def life(node: int):
        while True:
            up, down = float(rng.exponential(mtbf_s)), float(rng.exponential(mttr_s))
            yield from storage_node_fail(cl, kv, node, up, down)

    for node in range(cfg.nodes):
        cl.env.process(life(node))


def _count_live_ranks(cl: Cluster) -> None:
    cl.live_ranks = sum(int(g.ep - g.down.sum()) for g in cl.decode)


def rank_fail(cl: Cluster, group: int, rank: int, at_s: float, duration_s: float):
    """A decode rank fails for a while; its requests are re-routed, none is lost. When it was
    the last live rank anywhere they wait for a repair (``decode.parked_no_live_rank``), or are
    rejected (``no_decode_rank``) when none will come (an infinite duration: API only, since
    configs must be finite)."""
    yield cl.env.timeout(at_s)
    g = cl.decode[group]
    repairs = math.isfinite(duration_s)
    if repairs:
        cl.repairs_pending += 1
    was_up = not g.down.all()
    evicted = g.fail_rank(rank)
    _count_live_ranks(cl)
    if was_up and g.down.all():
        cl.counters["group_outages"] = cl.counters.get("group_outages", 0) + 1
    assert g.on_evict is not None
    for rid in evicted:
        g.on_evict(rid)
    if not repairs:
        return
    yield cl.env.timeout(duration_s)
    g.repair_rank(rank)
    cl.repairs_pending -= 1
    _count_live_ranks(cl)
    assert cl.route_decode is not None
    while cl.parked and cl.live_ranks > 0:  # requests that waited for a live rank
        rid, inst = cl.parked.popleft()
        cl.route_decode(rid, inst)


def link_cut(cl: Cluster, target: int, at_s: float, duration_s: float):
    """Cut instance ``target``'s P->D link for a while; with a backup path its flows move there
    (and ``transfer`` sends new P->D transfers there until the repair: ``transfer.rerouted``
    counts both)."""
    env = cl.env
    yield env.timeout(at_s)
    link = cl.links[target]
    link.cut()
    cl.counters["link_cuts"] = cl.counters.get("link_cuts", 0) + 1
    if cl.backup_links:
        backup = cl.backup_links[target]
        for fid, left, cb in link.drain():
            backup.send(fid, left, cb)
            # flow ids: 2·rid P->D transfer, 2·rid + 1 store write (sharing the egress link)
            key = "rerouted_transfers" if fid % 2 == 0 else "rerouted_store_writes"
            cl.counters[key] = cl.counters.get(key, 0) + 1
    yield env.timeout(duration_s)
    link.repair()


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


def simulate(
    sc: Scenario,
    source: RequestSource | None = None,
    progress: Callable[[float, int, int], None] | None = None,
    on_build: Callable[[Cluster], None] | None = None,
) -> Result:
    """Run one scenario. ``source`` overrides the scenario's workload (tests, notebooks);
    ``on_build`` sees the cluster before it starts (e.g. to record expert steps)."""
    wall0 = time.perf_counter()
    if source is None:
        source = build_source(sc.workload, sc.seed)
    unpriced = unpriced_classes(sc.prices.revenue, source.class_names)
    if unpriced:  # shown once per process for the same workload (Python's default filter)
        warnings.warn(
            f"prices.revenue.by_class: {', '.join(unpriced)} never appear in the workload "
            f"(its traffic classes: {', '.join(source.class_names)}); those prices are unused",
            ConfigWarning,
            stacklevel=2,
        )
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
    check_invariants(cl)
    wall = time.perf_counter() - wall0
    itl_stats, itl_max = itl_summary(cl.table, cl.decode, sc.sim.percentiles)
    timeseries = sampler.frame()
    summary = summarize(
        cl, itl_stats, wall, sampler.read_gbps_peak, sampler.queue_stats(), timeseries
    )
    return Result(
        scenario=sc,
        requests=cl.table.frame(itl_max),
        timeseries=timeseries,
        summary=summary,
    )
