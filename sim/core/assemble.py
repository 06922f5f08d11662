"""Build the cluster a Scenario describes: the one place that reads the whole scenario.

Resolves its parts — model and hardware specs, each pool's StepCost (roofline or a calibration
profile), KV capacity per decode rank, the expert-load model and each EP group's live balance,
each decode group's speculative decoder — and builds the stages from them: decode groups and
their balancer, P->D links (and backups), the prefill path, the admission policy, vision
encoders, then the request flow between them, the arrival process and the faults. Aggregated
serving (``build_aggregated_cluster``) builds aggregated instances in place of both pools. The
resolvers are also what the planner's analyses use to cost a pool without a run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from ...errors import ConfigError
from ...models.cost import PoolShape, RooflineStepCost, StepCost
from ...models.draft import DraftCost
from ...models.hardware import HardwareSpec
from ...models.precision import DtypeRule, profile_coefs
from ...models.profile import load_profile
from ...models.profile_cost import ProfileStepCost
from ...models.registry import load_hardware, load_model
from ...models.spec import ModelSpec
from ...rng import stream
from ...scenario import AggregatedPool, DecodePool, PrefillPool, Scenario
from ...traces import RequestSource
from ..policies.admission import make_admission
from ..policies.balancer import make_balancer
from ..policies.chunking import make_chunk_policy
from ..policies.kv_admission import make_kv_admission
from ..policies.router import RankRouter
from ..policies.speculative import (
    ClassAcceptance,
    PolicyParts,
    SpecDecoder,
    make_verify_policy,
    max_draft,
)
from ..stages.aggregated import AggregatedInstance
from ..stages.decode import DecodeGroup
from ..stages.expert_load import ExpertLoadModel
from ..stages.expert_parallel import GroupExperts, Pool, group_shape
from ..stages.kvstore import KvStore
from ..stages.prefill_path import (
    PrefillPath,
    PrefillRouting,
    check_step_time_budget,
    flop_counter,
    instances_per_machine,
)
from ..stages.prefix_cache import MemoryPrefixStore, PrefixStore
from ..stages.vision import VisionInstance
from .cluster import Cluster, CountingEnvironment
from .faults import start_faults, start_random_storage_failures
from .flow import RequestFlow, RequestLimits
from .network import Link
from .requests import RequestTable


def pool_config(sc: Scenario, pool: str) -> PrefillPool | DecodePool | AggregatedPool:
    """The config of an expert-parallel pool: ``prefill``, ``aggregated``, else ``decode``."""
    if pool == "aggregated":
        assert sc.pools.aggregated is not None  # the scenario fills in its defaults
        return sc.pools.aggregated
    return sc.pools.prefill if pool == "prefill" else sc.pools.decode


def make_step_cost(
    sc: Scenario, pool: str, model: ModelSpec, hw: HardwareSpec, ep: int, redundant: float
) -> StepCost:
    """The pool's StepCost: the roofline, or the named calibration profile on this hardware
    (with the pool's two-batch-overlap setting)."""
    cm = sc.cost_model
    ref = cm.for_pool(pool)
    cfg = pool_config(sc, pool)
    tbo = pool != "vision" and cfg.two_batch_overlap
    reserved = isinstance(cfg, PrefillPool) and cfg.gemm_sms == "reserved"
    shape = PoolShape(ep, redundant, tbo, tp=cfg.tp, moe_tp=cfg.moe_tp, reserved_gemm_sms=reserved)
    gpu = model.tp_slice(cfg.tp, cfg.moe_tp)  # what one GPU of a rank holds and computes
    if ref == "roofline":
        return RooflineStepCost(gpu, hw, shape, cm.roofline, cm.step)
    profile = load_profile(ref)
    try:  # in the model's own dtypes, by the rule models/precision.py states (or refused)
        coefs, _ = profile_coefs(profile, gpu, hw)
    except ConfigError as exc:
        raise ConfigError(f"cost_model.{pool}", str(exc)) from None
    return ProfileStepCost(gpu, hw, shape, coefs, cm.step, profile.name)


def dtype_rules(sc: Scenario) -> dict[str, DtypeRule]:
    """Per pool on a profile, the rule that moves the profile's fits to the model's dtypes where
    they differ (models/precision.py): what ``run``, ``cost`` and ``plan`` print."""
    rules: dict[str, DtypeRule] = {}
    model = load_model(sc.model)
    for pool in sc.serving_pools:
        ref = sc.cost_model.for_pool(pool)
        if ref == "roofline":
            continue
        cfg = pool_config(sc, pool)
        hw = load_hardware(cfg.hardware)
        _, rule = profile_coefs(load_profile(ref), model.tp_slice(cfg.tp, cfg.moe_tp), hw)
        if not rule.identity:
            rules[pool] = rule
    return rules


def decode_kv_capacity_tokens(sc: Scenario, model: ModelSpec, hw: HardwareSpec) -> float:
    """KV tokens one decode rank can hold after its weights and activation reserve (each GPU
    of a tensor-parallel rank holds the rank's whole latent cache beside its weight slice)."""
    return rank_kv_capacity_tokens(sc.pools.decode, "pools.decode", model, hw)


def rank_kv_capacity_tokens(
    pool: DecodePool | AggregatedPool, key: str, model: ModelSpec, hw: HardwareSpec
) -> float:
    """KV tokens one rank of a decode group or aggregated instance (config at ``key``) holds
    after its weights and activation reserve."""
    gpu = model.tp_slice(pool.tp, pool.moe_tp)
    weights = gpu.weight_bytes_per_gpu(pool.expert_groups, pool.redundant_per_gpu)
    free = hw.hbm_bytes - weights - pool.activation_reserve_bytes
    if free <= 0:
        raise ConfigError(
            key,
            f"weights ({weights / 1e9:.1f} GB) + activation reserve do not fit in "
            f"{hw.name} HBM ({hw.hbm_bytes / 1e9:.0f} GB) at ep={pool.ep}",
        )
    return free * pool.kv_hbm_fraction / model.kv_hbm_bytes_per_token()


def check_prefill_fits(sc: Scenario, model: ModelSpec, hw: HardwareSpec) -> None:
    pool = sc.pools.prefill
    gpu = model.tp_slice(pool.tp, pool.moe_tp)
    weights = gpu.weight_bytes_per_gpu(pool.expert_groups, pool.redundant_per_gpu)
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
    sc: Scenario, pool: Pool | Literal["aggregated"], load: ExpertLoadModel | None, name: str
) -> GroupExperts | None:
    """An EP group's live expert balance, or None when the imbalance is a constant. An
    aggregated instance rebalances on the decode pool's EPLB schedule (its steps come as often)
    and counts its tokens by layer set as prefill does (chunks, SWA replay)."""
    if load is None:
        return None
    cfg = pool_config(sc, pool)
    policy = sc.policies.eplb.for_pool(pool)
    layer_sets: Pool = "decode" if pool == "decode" else "prefill"
    slots = cfg.redundant_per_gpu
    if slots != int(slots):
        raise ConfigError(
            f"pools.{pool}.redundant_experts",
            f"live EPLB places whole redundant slots per rank: {cfg.redundant_experts} over "
            f"ep={cfg.ep} leaves {slots:.3f} per GPU (use a multiple of ep, or "
            f"policies.eplb.imbalance: constant)",
        )
    model = load_model(sc.model)
    shape = group_shape(
        model, load_hardware(cfg.hardware), layer_sets, cfg.expert_groups, int(slots)
    )
    return GroupExperts(load, policy, shape, stream(sc.seed, f"experts/{name}"))


def make_prefix_store(sc: Scenario, model: ModelSpec, source: RequestSource) -> PrefixStore | None:
    """The prefix store: the 3FS-style KV cluster with storage nodes, the in-memory reference
    store without, None when prefix caching is off."""
    prefix = sc.cache.prefix
    if not prefix.enabled:
        return None
    block = source.block_tokens
    ids = source.block_hashes
    largest = int(ids.max()) if len(ids) else -1
    if sc.pools.storage.nodes:
        block_bytes = model.kv_bytes_per_token() * block
        return KvStore(
            sc.pools.storage,
            source.class_names,
            block_bytes,
            stream(sc.seed, "storage"),
            largest_id=largest,
        )
    cap = prefix.capacity_tokens
    return MemoryPrefixStore(None if cap is None else max(1, cap // block), largest_id=largest)


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
    draft = DraftCost.of(model, policy.depth)
    return SpecDecoder(policy=policy, classes=classes, capacity=capacity, rng=rng, draft=draft)


def build_cluster(sc: Scenario, source: RequestSource) -> Cluster:
    """Every stage instance the scenario describes, wired to the request flow, with the arrival
    process and the fault processes started (in a fixed order: the run is seeded)."""
    if sc.aggregated:
        return build_aggregated_cluster(sc, source)
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

    decode_cost = make_step_cost(
        sc, "decode", model, hw["decode"], pools.decode.ep, pools.decode.redundant_per_gpu
    )
    for g in range(pools.decode.groups):
        cl.decode.append(
            DecodeGroup(
                env=env,
                idx=g,
                ep=pools.decode.dp,
                cost=decode_cost,
                max_seqs_per_rank=pools.decode.max_seqs_per_rank,
                kv_capacity_tokens=kv_cap,
                kv_admission=make_kv_admission(pools.decode.kv_policy, seq_overhead),
                imbalance=imb.decode,
                table=table,
                on_done=lambda rid: cl.count_end(),
                spec=make_spec_decoder(
                    sc, model, source, pools.decode.dp * pools.decode.max_seqs_per_rank, g
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

    cl.live_ranks = pools.decode.groups * pools.decode.dp

    limits = RequestLimits(
        max_context_tokens=model.max_context_tokens,
        kv_capacity_tokens=kv_cap,
        seq_overhead_tokens=seq_overhead,
        kv_bytes_per_token=kv_per_token,
        slot_bytes=slot_bytes,
    )

    prefill_cost = make_step_cost(
        sc,
        "prefill",
        model,
        hw["prefill"],
        pools.prefill.ep,
        pools.prefill.redundant_per_gpu,
    )
    cl.path = PrefillPath(
        pool=pools.prefill,
        cache=sc.cache,
        routing=PrefillRouting(
            sc.policies.prefill_router, sc.policies.tiers, sc.policies.affinity_slack_s
        ),
        load_latency_s=sc.network.latency_s,
        model=model,
        hw=hw["prefill"],
        env=env,
        table=table,
        source=source,
        cost=prefill_cost,
        imbalance=imb.prefill,
        egress=cl.links,
        on_prefilled=lambda rid, inst: flow.prefilled(rid, inst),
        store=make_prefix_store(sc, model, source),
        experts_for=lambda i: make_group_experts(sc, "prefill", load, f"prefill/{i}"),
    )
    cl.prefill = cl.path.instances
    to_prefill = cl.path.admit
    cl.flow = flow = RequestFlow(cl, limits, balancer, to_prefill)
    cl.admission = make_admission(sc.policies.admission, sc.slo, cl.prefill)
    _start(sc, cl, source, hw, to_prefill)
    for group in cl.decode:
        group.on_evict = flow.reroute
    _start_faults(sc, cl)
    return cl


def _start(
    sc: Scenario,
    cl: Cluster,
    source: RequestSource,
    hw: dict[str, HardwareSpec],
    to_prefill: Callable[[int], None],
) -> None:
    """The vision encoders (in front of ``to_prefill``) and the arrival process."""
    env, table, flow = cl.env, cl.table, cl.flow
    assert flow is not None
    if sc.pools.vision.instances:
        ve_hw = hw["vision"]
        v = sc.pools.vision
        per_image = vision_seconds_per_image(sc, ve_hw)
        images = source.image_count
        for i in range(v.instances):
            cl.vision.append(VisionInstance(env, i, per_image, table, images, to_prefill))

    def arrivals():
        arrival = source.arrival_s
        for rid in range(len(source)):
            delay = arrival[rid] - env.now
            if delay > 0:
                yield env.timeout(delay)
            flow.admit(rid)

    env.process(arrivals())


def _start_faults(sc: Scenario, cl: Cluster) -> None:
    """The scheduled faults and the storage nodes' random failures."""
    kv = cl.path.kv if cl.path is not None else None
    start_faults(cl, sc.faults, kv)
    storage = sc.pools.storage
    if kv is not None and storage.mtbf_h is not None:
        rng = stream(sc.seed, "storage/failures")
        start_random_storage_failures(cl, kv, storage.nodes, storage.mtbf_h, storage.mttr_h, rng)


def check_token_budget(agg: AggregatedPool, drafts: int) -> None:
    """An aggregated step's token budget must hold the decode tokens of a full rank (engines
    refuse a smaller one: vLLM's max_num_batched_tokens must cover max_num_seqs): decode goes
    first, and a budget it could fill would starve the prompts."""
    need = agg.max_seqs_per_rank * (1 + drafts)
    if agg.max_tokens_per_step < need:
        spec = f" x (1 + {drafts} drafts, policies.speculative)" if drafts else ""
        raise ConfigError(
            "pools.aggregated.max_tokens_per_step",
            f"{agg.max_tokens_per_step:,} tokens cannot hold the decode tokens of a full rank: "
            f"max_seqs_per_rank {agg.max_seqs_per_rank:,}{spec} = {need:,} (decode tokens go "
            "first, prefill chunks fill the rest); raise it or lower max_seqs_per_rank",
        )


def check_whole_prompts(agg: AggregatedPool, source: RequestSource) -> None:
    """Under ``scheduler: whole`` a prompt never splits, so none may be longer than a step's
    budget (TensorRT-LLM without chunked context refuses such requests too)."""
    if agg.scheduler != "whole" or not len(source.input_len):
        return
    longest = int(source.input_len.max())
    if longest > agg.max_tokens_per_step:
        raise ConfigError(
            "pools.aggregated.max_tokens_per_step",
            f"{agg.max_tokens_per_step:,} tokens are fewer than the workload's longest prompt "
            f"({longest:,} tokens), which scheduler whole cannot split; raise the budget or use "
            "scheduler tokens",
        )


def build_aggregated_cluster(sc: Scenario, source: RequestSource) -> Cluster:
    """Aggregated serving (``serving: aggregated``): ``pools.aggregated.instances`` instances,
    each prefilling and decoding on its DP ranks (``sim/stages/aggregated.py``), behind the
    prefill path (prefix cache, store writes over each instance's link) and the decode balancer
    that places each request on a rank; then the vision encoders, arrivals and faults."""
    model = load_model(sc.model)
    agg = sc.pools.aggregated
    assert agg is not None  # the scenario fills in its defaults
    hw = {pool: load_hardware(name) for pool, name in sc.hardware_kinds().items()}
    ahw = hw["aggregated"]
    env = CountingEnvironment()
    table = RequestTable(source)
    imb = sc.policies.expert_imbalance
    load = make_expert_load(sc, model, source)
    kv_cap = rank_kv_capacity_tokens(agg, "pools.aggregated", model, ahw)
    kv_per_token, slot_bytes = model.kv_bytes_per_token(), model.swa_slot_bytes
    seq_overhead = slot_bytes / model.kv_hbm_bytes_per_token()  # SWA slot in KV-token units
    cl = Cluster(sc, model, env, table, [], [], [], [], kv_cap, seq_overhead)
    cl.all_ended = env.event()

    specs = [
        make_spec_decoder(sc, model, source, agg.dp * agg.max_seqs_per_rank, i)
        for i in range(agg.instances)
    ]
    check_token_budget(agg, specs[0].policy.depth)
    check_whole_prompts(agg, source)
    cost = make_step_cost(sc, "aggregated", model, ahw, agg.ep, agg.redundant_per_gpu)
    chunking = make_chunk_policy(agg.scheduler, aggregated=True)
    flops = flop_counter(model)
    per_machine = instances_per_machine(ahw, agg.ep)
    instances = [
        AggregatedInstance(
            env=env,
            idx=i,
            machine=i // per_machine,
            dp=agg.dp,
            cost=cost,
            max_seqs_per_rank=agg.max_seqs_per_rank,
            max_tokens_per_step=agg.max_tokens_per_step,
            kv_capacity_tokens=kv_cap,
            kv_admission=make_kv_admission(agg.kv_policy, seq_overhead),
            chunking=chunking,
            step_time_budget_s=agg.step_time_budget_s,
            prefill_imbalance=imb.prefill,
            decode_imbalance=imb.decode,
            table=table,
            flops=flops,
            on_done=lambda rid: cl.count_end(),
            spec=specs[i],
            experts=make_group_experts(sc, "aggregated", load, f"aggregated/{i}"),
            prefill_first=agg.scheduler == "prefill_first",
        )
        for i in range(agg.instances)
    ]
    if agg.scheduler == "chunked":
        key = "pools.aggregated.step_time_budget_s"
        check_step_time_budget(instances[0].quad, model, agg.step_time_budget_s, key)
    cl.decode.extend(instances)
    cl.live_ranks = agg.instances * agg.dp
    balancer = make_balancer(
        sc.policies.decode_balancer, instances, sc.policies.long_request_tokens
    )
    limits = RequestLimits(
        max_context_tokens=model.max_context_tokens,
        kv_capacity_tokens=kv_cap,
        seq_overhead_tokens=seq_overhead,
        kv_bytes_per_token=kv_per_token,
        slot_bytes=slot_bytes,
    )
    # each instance's network link: its prompts' new KV blocks go to the store over it
    link_bw = sc.network.pd_gbps_per_8_gpus * 1e9 / 8 * agg.ep / 8
    store_links = [
        Link(env, f"store{i}", link_bw, sc.network.latency_s) for i in range(agg.instances)
    ]
    path = cl.path = PrefillPath(
        pool=agg,
        cache=sc.cache,
        routing=PrefillRouting(
            sc.policies.prefill_router, sc.policies.tiers, sc.policies.affinity_slack_s
        ),
        load_latency_s=sc.network.latency_s,
        model=model,
        hw=ahw,
        env=env,
        table=table,
        source=source,
        cost=cost,
        imbalance=imb.prefill,
        egress=store_links,
        on_prefilled=lambda rid, inst: flow.prefilled(rid, inst),
        store=make_prefix_store(sc, model, source),
        engines=instances,
        router=RankRouter(balancer, instances),
    )
    for inst in instances:
        inst.on_prefilled = path.prompt_done
    cl.prefill = instances
    cl.flow = flow = RequestFlow(
        cl,
        limits,
        balancer,
        path.admit,
        decode_locally=lambda rid, inst: instances[inst].hand_off(rid),
    )
    cl.admission = make_admission(sc.policies.admission, sc.slo, cl.prefill)
    _start(sc, cl, source, hw, path.admit)
    _start_faults(sc, cl)
    return cl
