"""Scenario: one YAML file that describes a whole simulated deployment.

``load_scenario`` reads a scenario (a path, or a bundled name such as ``default``), applies dotted
``--set key=value`` overrides to the raw mapping, and validates it into a frozen pydantic
:class:`Scenario`. Unknown keys and bad values are :class:`~deepinfer_sim.errors.ConfigError`\\ s
naming the dotted key path. The same override mechanism drives sweeps.

Every number from the spec (EP widths, redundant experts, link budgets, SLOs, prices...) lives
here or in the model/hardware YAML, never in simulator code.
"""

from __future__ import annotations

import itertools
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, Field, TypeAdapter, model_validator

from .errors import ConfigError
from .models.cost import RooflineParams, StepParams
from .models.registry import bundled_dir, load_hardware, load_model, resolve
from .models.spec import ModelSpec
from .traces.workload import Workload
from .validation import FrozenModel, read_yaml, validate

# Upper bounds of sizes, rates and time grids (issue 16): generous, so that a real deployment
# validates (100k GPUs, a year of sessions), yet small enough that what validates can be built
# and run; a value past one is a ConfigError naming the key and the bound.
MAX_INSTANCES = 100_000  # prefill / vision instances, decode groups, storage nodes
MAX_EP = 1024  # ranks of one expert-parallel group
MAX_GBPS = 1e6  # a link: 1 Pb/s
MAX_LATENCY_S = 10.0  # one-way latency of a link or a storage node's response
MIN_TIMESERIES_INTERVAL_S = 0.01  # sim.timeseries_interval_s: one sample per 10 ms at most
MAX_HORIZON_S = 366 * 86400.0  # sim.horizon_s: a year

# How much work a run does (issue 29): a run's clocks (the time-series sampler, the tiered
# router's rounds, the expert-popularity walk, random storage failures) tick over its whole
# simulated span, so a tiny period, a tiny rate scale (a long span) or a far trace timestamp
# would spin for hours without a request moving. ``check_run_size`` counts the ticks before a
# run starts and refuses more than this many, naming the key that sets the most of them: ten
# million ticks are about an hour of CPU on the default cluster (a time-series sample costs about
# 0.3 ms), while a week of sessions sampled every second with a live expert walk is 1.4 million.
MAX_CLOCK_TICKS = 10_000_000


class ExpertParallelPool(FrozenModel):
    """What prefill instances and decode groups share: GPUs whose routed experts are spread by
    expert parallelism, with redundant expert slots; how attention and dense layers split over
    them (``tp``: tensor parallel within a data-parallel rank; 1, DeepSeek's shape: every GPU a
    rank) and the experts (``moe_tp``: each expert sliced over that many GPUs); how a step
    overlaps its all-to-all."""

    ep: int = Field(1, ge=1, le=MAX_EP, description="GPUs of one instance (= DP when tp = 1)")
    tp: int = Field(
        1,
        ge=1,
        le=72,
        description="tensor-parallel width of attention and dense layers: each data-parallel "
        "rank spans tp GPUs of one scale-up domain (dp = ep / tp ranks)",
    )
    moe_tp: int = Field(
        1,
        ge=1,
        le=72,
        description="expert tensor parallelism: each routed expert sliced over moe_tp GPUs, "
        "the experts spread over ep / moe_tp groups (1: whole experts, expert parallelism)",
    )
    redundant_experts_per_gpu: int = Field(0, ge=0, le=1024)
    redundant_experts: int | None = Field(
        None,
        ge=0,
        description="redundant expert slots of one EP group in total (DeepSeek's decode: 32 over "
        "144 GPUs); overrides redundant_experts_per_gpu, may leave a fraction per GPU",
    )
    two_batch_overlap: bool = Field(
        False,
        description="split each step into two micro-batches whose all-to-all hides behind the "
        "other's compute (replaces cost_model.step.comm_overlap for this pool)",
    )

    @model_validator(mode="after")
    def _parallel_widths_divide(self) -> ExpertParallelPool:
        for name in ("tp", "moe_tp"):
            width = getattr(self, name)
            if self.ep % width:
                raise ValueError(f"{name} ({width}) must divide ep ({self.ep}), the pool's GPUs")
        return self

    @property
    def dp(self) -> int:
        """Data-parallel ranks of one instance or group: each holds its own sequences."""
        return self.ep // self.tp

    @property
    def expert_groups(self) -> int:
        """Expert-parallel groups the routed experts are spread over."""
        return self.ep // self.moe_tp

    @property
    def redundant_per_gpu(self) -> float:
        """Redundant expert slots per GPU (fractional when a group's total does not divide)."""
        if self.redundant_experts is not None:
            return self.redundant_experts / self.ep
        return float(self.redundant_experts_per_gpu)


class PrefillPool(ExpertParallelPool):
    """Prefill instances of ``ep`` GPUs: ``dp`` ranks of ``tp`` GPUs each (no context
    parallelism)."""

    instances: int = Field(16, ge=1, le=MAX_INSTANCES)
    ep: int = Field(4, ge=1, le=64, description="GPUs of one instance (= DP when tp = 1)")
    hardware: str = "gb200"
    redundant_experts_per_gpu: int = Field(4, ge=0, le=1024)
    max_tokens_per_step: int = Field(
        32768, ge=1, le=1 << 24, description="token budget of one DP rank's prefill step"
    )
    step_time_budget_s: float = Field(
        1.0,
        gt=0,
        le=3600,
        description="time a prefill step may take; the chunk scheduler fills it",
    )
    scheduler: Literal["chunked", "whole"] = Field(
        "chunked",
        description="chunked: quadratic-cost chunks within the time and token budgets; "
        "whole: first come, first served, whole prompts within the token budget",
    )
    gemm_sms: Literal["shared", "reserved"] = Field(
        "shared",
        description="with two_batch_overlap, whose normal-mode exchange holds SMs: 'reserved' "
        "runs every GEMM of the overlapped step on the SMs the exchange leaves, whether an "
        "exchange runs beside it or not (SGLang: DeepGEMM on the SMs less DeepEP's for the "
        "whole forward); 'shared' slows compute only while an exchange runs beside it",
    )

    @model_validator(mode="after")
    def _reservation_needs_overlap(self) -> PrefillPool:
        if self.gemm_sms == "reserved" and not self.two_batch_overlap:
            raise ValueError(
                "gemm_sms 'reserved' needs two_batch_overlap (it is how an overlapped step "
                "shares the SMs)"
            )
        return self

    @property
    def gpus(self) -> int:
        return self.instances * self.ep


class DecodePool(ExpertParallelPool):
    """Decode groups of ``ep`` GPUs stepping in lockstep: ``dp`` ranks of ``tp`` GPUs each
    (DeepSeek's Wide-EP: tp = 1, every GPU a rank)."""

    groups: int = Field(1, ge=1, le=MAX_INSTANCES)
    ep: int = Field(64, ge=1, le=MAX_EP, description="GPUs per group (= ranks when tp = 1)")
    hardware: str = "gb200"
    redundant_experts_per_gpu: int = Field(1, ge=0, le=1024)
    max_seqs_per_rank: int = Field(256, ge=1, le=1 << 20)
    kv_hbm_fraction: float = Field(
        0.9, gt=0, le=1, description="share of HBM left after weights that may hold KV"
    )
    activation_reserve_bytes: float = Field(8e9, ge=0, description="HBM kept for activations")
    ideal_balance: bool = Field(
        False, description="benchmark only: cost each step as if every rank held the mean load"
    )
    kv_policy: Literal["reserve", "preempt"] = Field(
        "reserve",
        description="reserve: admit only when the whole context fits (requests wait, nothing is "
        "preempted); preempt: admit on the current context, grow, and when a rank runs out drop "
        "its newest sequences, which recompute their KV when readmitted",
    )

    @property
    def gpus(self) -> int:
        return self.groups * self.ep


class AggregatedPool(ExpertParallelPool):
    """Aggregated serving (``serving: aggregated``): instances of ``ep`` GPUs, each ``dp`` ranks
    of ``tp`` GPUs (experts over ``ep / moe_tp`` groups, as the other pools), every rank
    prefilling and decoding its own requests: by default each running sequence's decode tokens
    first, prefill chunks filling the rest of the step's token budget, oldest request first
    (vLLM's chunked prefill; ``scheduler`` gives SGLang's and TensorRT-LLM's schedules). A prompt
    is decoded on the rank that prefilled it: no P->D transfer."""

    instances: int = Field(1, ge=1, le=MAX_INSTANCES, description="aggregated instances")
    ep: int = Field(8, ge=1, le=MAX_EP, description="GPUs of one instance (= DP when tp = 1)")
    hardware: str = "h200"
    max_tokens_per_step: int = Field(
        8192,
        ge=1,
        le=1 << 24,
        description="token budget of one DP rank's step, decode tokens (1 + drafts per "
        "sequence) and prefill chunks together (SGLang's chunked_prefill_size, vLLM's "
        "max_num_batched_tokens); at least max_seqs_per_rank x (1 + drafts)",
    )
    max_seqs_per_rank: int = Field(
        256,
        ge=1,
        le=1 << 20,
        description="requests one rank runs at once, prefilling or decoding (vLLM's "
        "max_num_seqs, SGLang's max_running_requests)",
    )
    kv_hbm_fraction: float = Field(
        0.9, gt=0, le=1, description="share of HBM left after weights that may hold KV"
    )
    activation_reserve_bytes: float = Field(8e9, ge=0, description="HBM kept for activations")
    kv_policy: Literal["reserve", "preempt"] = Field(
        "reserve",
        description="as pools.decode.kv_policy; a prompt reserves its KV when its first chunk "
        "is scheduled",
    )
    scheduler: Literal["tokens", "chunked", "whole", "prefill_first"] = Field(
        "tokens",
        description="tokens: chunks fill what the decode tokens leave of the token budget, in "
        "the same step (vLLM's chunked prefill, SGLang's with mixed chunks); chunked: also keep "
        "the chunks' predicted prefill time within step_time_budget_s (a stall bound); whole: "
        "whole prompts only, as many as fit beside the decode tokens (TensorRT-LLM's in-flight "
        "batching without chunked context, as on Hopper); prefill_first: a step prefills "
        "whenever a prompt can start or continue, its chunks taking the whole budget while the "
        "running sequences wait, and decodes otherwise, rank by rank (SGLang's default, mixed "
        "chunks off)",
    )
    step_time_budget_s: float = Field(
        1.0,
        gt=0,
        le=3600,
        description="scheduler chunked: prefill time a step's chunks may take",
    )

    @property
    def gpus(self) -> int:
        return self.instances * self.ep


class VisionPool(FrozenModel):
    """Vision-encoder instances, one GPU each (a cheaper GPU is recommended)."""

    instances: int = Field(0, ge=0, le=MAX_INSTANCES)
    hardware: str = "l40s"
    encoder_params_b: float = Field(
        0.6, gt=0, description="encoder parameters (billions) each image token passes"
    )
    tokens_per_image: int = Field(
        576, ge=1, le=1 << 20, description="image tokens handed to prefill"
    )
    efficiency: float = Field(0.4, gt=0, le=1, description="fraction of peak FLOP/s reached")

    @property
    def gpus(self) -> int:
        return self.instances


DAY_S = 86400.0


class StoragePool(FrozenModel):
    """The 3FS-style KV-cache cluster (sim/stages/kvstore.py, sim/stages/storage_nodes.py).
    ``nodes: 0`` keeps the in-memory reference prefix store (``cache.prefix``) instead."""

    nodes: int = Field(
        0,
        ge=0,
        le=MAX_INSTANCES,
        description="storage nodes; a multiple of the coding width (data + parity)",
    )
    disks_per_node: int = Field(20, ge=1, le=1024)
    disk_tb: float = Field(
        30.73,
        gt=0,
        le=1e4,
        description="capacity of one SSD, TB (10^12 bytes); disks so small that a coding group "
        "holds no KV block are refused when the store is built",
    )
    read_gbytes_per_s: float = Field(
        40.0,
        gt=0,
        le=MAX_GBPS,
        description="sustained read per node, GB/s; without sim.horizon_s, a node that cannot "
        "read one 512-token KV block within sim.drain_limit_s is refused (no run could drain)",
    )
    write_gbytes_per_s: float = Field(
        5.0,
        gt=0,
        le=MAX_GBPS,
        description="sustained write per node, GB/s (the same floor as read_gbytes_per_s)",
    )
    data_chunks: int = Field(10, ge=1, le=256, description="erasure coding: data chunks per stripe")
    parity_chunks: int = Field(
        2, ge=0, le=256, description="erasure coding: parity chunks per stripe"
    )
    node_latency_s: float = Field(
        200e-6,
        ge=0,
        le=MAX_LATENCY_S,
        description="mean (exponential) response latency of a node on top of its queue",
    )
    high_watermark: float = Field(0.95, gt=0, le=1, description="GC starts above this used share")
    low_watermark: float = Field(0.85, gt=0, le=1, description="GC evicts LRU down to this share")
    ttl_s: dict[str, float] = Field(
        default_factory=lambda: {"agent": 3 * DAY_S, "chatbot": 7 * DAY_S},
        description="TTL per traffic class, enforced storage-side",
    )
    default_ttl_s: float = Field(
        7 * DAY_S, gt=0, description="TTL of a traffic class not named in ttl_s"
    )
    refresh_on_read: bool = Field(
        True, description="a read restarts the block's TTL (false: TTL counts from its last write)"
    )
    mtbf_h: float | None = Field(
        None,
        gt=0,
        description="per-node mean time between failures (None: scheduled faults only); each "
        "failure and repair is an event, counted against the run's clock ticks",
    )
    mttr_h: float = Field(4.0, gt=0, description="mean time to repair a failed node")

    @property
    def width(self) -> int:
        return self.data_chunks + self.parity_chunks

    @property
    def node_physical_bytes(self) -> float:
        return self.disks_per_node * self.disk_tb * 1e12

    @property
    def logical_bytes(self) -> float:
        """What the cluster holds of KV before erasure coding (physical × data / width)."""
        return self.nodes * self.node_physical_bytes * self.data_chunks / self.width

    def ttl_for(self, traffic_class: str) -> float:
        return self.ttl_s.get(traffic_class, self.default_ttl_s)

    @model_validator(mode="after")
    def _shape(self) -> StoragePool:
        if self.nodes % self.width:
            raise ValueError(
                f"nodes: {self.nodes} is not a multiple of the coding width {self.width} "
                f"({self.data_chunks} data + {self.parity_chunks} parity)"
            )
        if self.low_watermark >= self.high_watermark:
            raise ValueError("low_watermark must be below high_watermark")
        bad = [k for k, v in self.ttl_s.items() if not v > 0]
        if bad:
            raise ValueError(f"ttl_s.{bad[0]}: a TTL must be > 0 seconds")
        return self


class Pools(FrozenModel):
    prefill: PrefillPool = PrefillPool()
    decode: DecodePool = DecodePool()
    vision: VisionPool = VisionPool()
    storage: StoragePool = StoragePool()
    aggregated: AggregatedPool | None = Field(
        None,
        description="serving: aggregated: the instances that prefill and decode together "
        "(pools.prefill and pools.decode are then not used)",
    )

    def gpus_by_pool(self) -> dict[str, int]:
        """Online GPUs of each pool (the storage nodes hold none): vision, prefill and decode,
        or vision and aggregated."""
        if self.aggregated is not None:
            return {"vision": self.vision.gpus, "aggregated": self.aggregated.gpus}
        return {
            "vision": self.vision.gpus,
            "prefill": self.prefill.gpus,
            "decode": self.decode.gpus,
        }

    @property
    def gpus(self) -> int:
        return sum(self.gpus_by_pool().values())


class Network(FrozenModel):
    """Prefill -> decode KV transfer links."""

    pd_gbps_per_8_gpus: float = Field(
        400,
        gt=0,
        le=MAX_GBPS,
        description="interconnect budget per 8 GPUs (floor: a prefill instance's link moves one "
        "512-token KV block within sim.drain_limit_s)",
    )
    placement: Literal["same_dc", "cross_dc"] = "same_dc"
    latency_s: float = Field(
        2e-5, ge=0, le=MAX_LATENCY_S, description="one-way latency inside a data centre"
    )
    cross_dc_latency_s: float = Field(
        5e-4, ge=0, le=MAX_LATENCY_S, description="one-way latency between adjacent data centres"
    )
    backup_links: bool = Field(
        False, description="each prefill instance also has a backup P->D path (another route)"
    )

    @property
    def pd_latency_s(self) -> float:
        return self.cross_dc_latency_s if self.placement == "cross_dc" else self.latency_s


class Fault(FrozenModel):
    """One scheduled failure at ``at_s`` lasting ``duration_s``.

    ``link_cut``: the P->D link of prefill instance ``target`` is cut; its transfers stall until
    repair, or move to the backup link when the network has one. ``rank_fail``: rank ``rank``
    of decode group ``target`` fails; its running and queued requests are re-routed by the
    decode balancer to live ranks, keep the tokens they have produced, and recompute their KV
    where they land. ``storage_node_fail``: storage node ``target`` fails; its coding group
    serves degraded reads, loses its blocks at parity + 1 failed nodes, and rebuilds on repair."""

    kind: Literal["link_cut", "rank_fail", "storage_node_fail"]
    at_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)
    target: int = Field(0, ge=0)
    rank: int = Field(0, ge=0)


class ExpertImbalance(FrozenModel):
    """Constant slowest-rank/mean expert load: the step factor when ``eplb.imbalance`` is
    ``constant``, and always what the prefill chunk scheduler plans with."""

    prefill: float = Field(1.074, ge=1)
    decode: float = Field(1.090, ge=1)


class ExpertLoad(FrozenModel):
    """The one expert-load model every pool shares (sim/stages/expert_load.py)."""

    # defaults: fitted by benchmarks/eplb_fit.py to the article's three imbalances (docs/eplb.md)
    family: Literal["zipf", "dirichlet"] = "zipf"
    skew: float = Field(
        0.3,
        ge=0,
        description="zipf: exponent s, p ∝ rank^-s; dirichlet: concentration (smaller = skewed)",
    )
    drift_sigma: float = Field(0.004, ge=0, description="log-popularity walk: σ per √second")
    drift_reversion_s: float = Field(
        3600.0,
        gt=0,
        description="mean-reversion time of the walk (its stationary σ is "
        "drift_sigma·√(reversion/2))",
    )
    drift_update_s: float = Field(
        1.0,
        gt=0,
        description="time grid the popularity moves on: the walk takes one step per grid point "
        "of the run's simulated span, counted against the run's clock ticks (MAX_CLOCK_TICKS)",
    )
    request_concentration: float = Field(
        30.0,
        gt=0,
        description="κ: a request routes by π ~ Dirichlet(κ·p); smaller = requests more topical",
    )
    class_sigma: float = Field(
        0.3, ge=0, description="σ of the fixed log-popularity tilt of each traffic class"
    )

    @model_validator(mode="after")
    def _dirichlet_positive(self) -> ExpertLoad:
        if self.family == "dirichlet" and self.skew <= 0:
            raise ValueError("skew: the dirichlet concentration must be > 0")
        return self


class EplbPool(FrozenModel):
    """How one pool balances its experts (its redundant slots are set on the pool)."""

    policy: Literal["eplb", "static"] = Field(
        "eplb", description="eplb: replicate and re-pack periodically; static: fixed blocks"
    )
    window_steps: int = Field(ge=1, description="steps of expert-load statistics EPLB sees")
    period_steps: int = Field(ge=1, description="steps between re-assignments")
    warm_start: bool = Field(
        True, description="start from the EPLB placement of the expected load (steady state)"
    )
    minimize_moves: bool = Field(
        True, description="renumber new packs onto ranks to keep experts where they are"
    )


class EplbBenchmark(FrozenModel):
    """The steady operating point ``deepinfer-sim eplb`` (and benchmarks/eplb_fit.py) measure
    at, unless told otherwise."""

    prefill_requests_per_rank: int = Field(4, ge=1, description="prompts per DP rank per step")
    prefill_tokens_per_request: int = Field(8192, ge=1, description="new tokens per prompt")
    decode_requests_per_rank: int = Field(
        60, ge=1, description="sequences per rank (the article's DSpark/EPLB benchmark point)"
    )
    decode_context_tokens: int = Field(8192, ge=1, description="context of every sequence")


class Eplb(FrozenModel):
    imbalance: Literal["live", "constant"] = Field(
        "live",
        description="live: sample every step's expert imbalance from the load model and the "
        "group's placement; constant: use policies.expert_imbalance",
    )
    load: ExpertLoad = ExpertLoad()
    prefill: EplbPool = EplbPool(window_steps=100, period_steps=1000)
    decode: EplbPool = EplbPool(window_steps=1000, period_steps=10000)
    benchmark: EplbBenchmark = EplbBenchmark()

    @model_validator(mode="before")
    @classmethod
    def _pool_defaults(cls, data: Any) -> Any:
        """A pool block that sets only some keys keeps that pool's own defaults for the rest."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for pool in ("prefill", "decode"):
            given = out.get(pool)
            if isinstance(given, dict):
                default = cls.model_fields[pool].default.model_dump()
                out[pool] = {**default, **given}
        return out

    def for_pool(self, pool: str) -> EplbPool:
        """The balancing of ``pool``'s steps: prefill's for prefill, decode's for any other (an
        aggregated instance rebalances on the decode pool's schedule)."""
        return self.prefill if pool == "prefill" else self.decode


class Tiers(FrozenModel):
    """Prefill length tiers (by total context) and how often instances are re-assigned."""

    boundaries: tuple[int, ...] = Field(
        (16384, 65536, 262144), description="upper bounds of all but the last tier, increasing"
    )
    round_s: float = Field(
        60.0,
        gt=0,
        description="re-assignment round length: one round per period of the run's simulated "
        "span, counted against the run's clock ticks (MAX_CLOCK_TICKS)",
    )

    @model_validator(mode="after")
    def _increasing(self) -> Tiers:
        b = self.boundaries
        if any(x <= 0 for x in b) or any(y <= x for x, y in itertools.pairwise(b)):
            raise ValueError("boundaries must be positive and strictly increasing")
        return self

    def names(self) -> list[str]:
        edges = [0, *self.boundaries]
        out = [
            f"<{b // 1024}K" if i == 0 else f"{edges[i] // 1024}K-{b // 1024}K"
            for i, b in enumerate(self.boundaries)
        ]
        out.append(f">={edges[-1] // 1024}K")
        return out


class Acceptance(FrozenModel):
    """Draft acceptance of one traffic class: easiness α ~ Beta(mean·κ, (1−mean)·κ) per request,
    draft j accepted (given the earlier ones were) with probability α·decay^(j−1)."""

    # defaults: fitted by benchmarks/dspark_fit.py (docs/decode.md)
    mean: float = Field(0.64238, gt=0, lt=1)
    concentration: float = Field(1.5, gt=0)
    position_decay: float = Field(1.0, gt=0, le=1)


class Speculative(FrozenModel):
    """Speculative decoding: who verifies how many draft tokens per sequence-step."""

    policy: Literal["dspark", "fixed", "mtp1", "none"] = "dspark"
    max_draft_tokens: int = Field(5, ge=1, le=16, description="drafts proposed per step")
    fixed_k: int = Field(5, ge=1, description="verify length of the fixed policy")
    lag_steps: int = Field(
        2, ge=0, le=8, description="dspark: truncate with confidences this many steps old"
    )
    confidence_noise: float = Field(
        0.3, ge=0, description="confidence head error: σ of logit noise on the true acceptance"
    )
    overhead_s: float = Field(
        4e-4, ge=0, description="dspark: confidence head and scheduling time added per step"
    )
    retune_steps: int = Field(
        8, ge=1, description="dspark: re-optimize the survival cut-off every this many steps"
    )
    acceptance: dict[str, Acceptance] = Field(
        default_factory=lambda: {"default": Acceptance()},
        description="per traffic class; 'default' covers classes not listed",
    )

    @model_validator(mode="after")
    def _default(self) -> Speculative:
        if "default" not in self.acceptance:
            raise ValueError("acceptance needs a 'default' entry")
        return self

    def for_class(self, name: str) -> Acceptance:
        return self.acceptance.get(name, self.acceptance["default"])


class NoAdmission(FrozenModel):
    """Admit every request that can run at all (queues grow without bound under overload)."""

    policy: Literal["none"] = "none"


class QueueTimeAdmission(FrozenModel):
    """Reject a request at arrival when the predicted wait before its prefill starts exceeds a
    limit: ``max_wait_s``, or (``slo_aware``) ``slo_wait_fraction`` of ``slo.ttft_s``; with both,
    the smaller. The wait is the least-loaded prefill instance's queued work (its predicted
    ``outstanding_s`` over its DP ranks)."""

    policy: Literal["queue_time"]
    max_wait_s: float | None = Field(None, gt=0, le=MAX_HORIZON_S)
    slo_aware: bool = Field(False, description="derive the limit from slo.ttft_s")
    slo_wait_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="slo_aware: share of the TTFT SLO the queue may take (the rest is left to "
        "the prefill itself and the P->D transfer)",
    )

    @model_validator(mode="after")
    def _limit(self) -> QueueTimeAdmission:
        if self.max_wait_s is None and not self.slo_aware:
            raise ValueError("queue_time needs max_wait_s, or slo_aware: true")
        return self


class QueueLengthAdmission(FrozenModel):
    """Reject a request at arrival when ``max_queued`` prompts already wait for, or are in,
    prefill across the pool (from admission, through any vision encoding, to the prefill end)."""

    policy: Literal["queue_length"]
    max_queued: int = Field(ge=1, le=10**9)


AdmissionPolicy = Annotated[
    NoAdmission | QueueTimeAdmission | QueueLengthAdmission, Field(discriminator="policy")
]
"""``policies.admission``: which arrivals are turned away (``rejected_by_reason``)."""


class Policies(FrozenModel):
    prefill_router: Literal["tiered", "least_outstanding", "round_robin", "cache_affinity"] = (
        "tiered"
    )
    tiers: Tiers = Tiers()
    affinity_slack_s: float = Field(
        0.5, ge=0, description="cache_affinity: extra queued work accepted to stay local"
    )
    decode_balancer: Literal["two_dim", "least_requests", "round_robin"] = "two_dim"
    long_request_tokens: int = Field(
        16384, ge=1, description="two_dim: context at which a request counts as long"
    )
    speculative: Speculative = Speculative()
    expert_imbalance: ExpertImbalance = ExpertImbalance()
    eplb: Eplb = Eplb()
    admission: AdmissionPolicy = NoAdmission()


class PrefixCache(FrozenModel):
    """Prefix caching of 512-token blocks. With storage nodes (``pools.storage``) the blocks live
    in the 3FS store; without, in the in-memory reference store bounded by ``capacity_tokens``."""

    enabled: bool = True
    capacity_tokens: int | None = Field(
        None,
        ge=512,
        description="in-memory store only: LRU capacity; None = unbounded (every block kept)",
    )
    load_gbps_per_8_gpus: float = Field(
        400,
        gt=0,
        le=MAX_GBPS,
        description="ingress bandwidth a prefill instance loads hits and slots with (floor: one "
        "512-token KV block within sim.drain_limit_s)",
    )


class SwaCache(FrozenModel):
    """SWA slots in prefill machines' host memory, and how a miss is rebuilt."""

    mode: Literal["bounded", "exact"] = Field(
        "bounded",
        description="decoder SWA rebuild per prefill: bounded replays the last 128 tokens, "
        "exact recomputes the last 2,560 through the decoder layers",
    )
    host_fraction: float = Field(
        0.5, gt=0, le=1, description="share of a machine's host memory that holds SWA slots"
    )
    vlan_gbps: float = Field(
        400,
        gt=0,
        le=MAX_GBPS,
        description="cross-machine slot fetch bandwidth (floor: one SWA slot within "
        "sim.drain_limit_s)",
    )


class Cache(FrozenModel):
    prefix: PrefixCache = PrefixCache()
    swa: SwaCache = SwaCache()


class Slo(FrozenModel):
    """Goodput counts a request meeting every SLO that is set (``goodput.slo`` lists them); the
    planner holds the p99 TTFT and TPOT to theirs."""

    ttft_s: float = Field(5.0, gt=0)
    tpot_s: float = Field(0.05, gt=0)
    e2e_s: float | None = Field(
        None, gt=0, le=MAX_HORIZON_S, description="end-to-end latency SLO (None: not applied)"
    )
    min_user_tok_s: float | None = Field(
        None, gt=0, description="planner: minimum per-user output tokens/s (1 / p99 TPOT)"
    )


class Planner(FrozenModel):
    """The deployment shapes ``deepinfer-sim plan`` searches and how it probes each one."""

    target_rate_rps: float | None = Field(
        None,
        gt=0,
        le=1e7,
        description="request rate to serve (default: the workload's mean rate); at most 10 "
        "million requests/s, far past any deployment the planner can size",
    )
    traffic_scale: float = Field(
        1.0,
        gt=0,
        le=1e4,
        description="multiply the target rate (what-ifs); at most 10,000, as workload.rate_scale",
    )
    prefill_ep: tuple[int, ...] = Field((4, 8), min_length=1)
    prefill_instances: tuple[int, ...] = Field(
        (4, 8, 12, 16, 24, 32), min_length=1, description="prefill instances per decode group"
    )
    decode_ep: tuple[int, ...] = Field((64, 128), min_length=1)
    probe_seconds: float = Field(
        120.0,
        gt=0,
        le=86400,
        description="arrival span of each load probe (queues must have time to grow); at most a "
        "day: every probe is a whole simulation, and a plan runs tens of them",
    )
    probe_min_requests: int = Field(
        1000,
        ge=50,
        le=10_000_000,
        description="requests per probe at least; at most 10 million (a probe is a whole "
        "simulation, and a plan runs tens of them)",
    )
    bisection_steps: int = Field(5, ge=2, le=20, description="load probes per shape")
    headroom: float = Field(
        0.85, gt=0, le=1, description="run each replica at this share of its sustainable rate"
    )
    gpus: int | None = Field(
        None,
        ge=1,
        le=1 << 20,
        description="a GPU budget: plan the deployment within it that serves the highest rate "
        "meeting the SLOs (plan --gpus); None: the cheapest deployment for target_rate_rps",
    )
    kinds: tuple[Literal["disaggregated", "aggregated"], ...] = Field(
        ("disaggregated",),
        min_length=1,
        description="pool kinds searched: disaggregated units (prefill instances + a decode "
        "group) and aggregated instances (aggregated_ep GPUs each, prefill and decode together)",
    )
    aggregated_ep: tuple[int, ...] = Field(
        (8,), min_length=1, description="GPUs of one aggregated instance, where kinds has it"
    )
    vary: dict[str, Annotated[tuple[Any, ...], Field(min_length=1)]] = Field(
        default_factory=dict,
        description="more axes of the search, every combination tried with every shape: a "
        "scenario key and its values, e.g. {pools.decode.two_batch_overlap: [true, false], "
        "policies.speculative.policy: [none, mtp], pools.decode.tp: [1, 8]}",
    )


class TokenPrices(typing.NamedTuple):
    """USD per million tokens of each kind a provider bills, resolved (no None left)."""

    input_cache_miss: float
    input_cache_hit: float
    output: float


class ClassRevenue(FrozenModel):
    """One traffic class's prices; a price left out is the global one (``prices.revenue``)."""

    input_per_mtok_usd: float | None = Field(None, ge=0, description="input tokens (misses)")
    output_per_mtok_usd: float | None = Field(None, ge=0)
    input_cache_hit_per_mtok_usd: float | None = Field(
        None,
        ge=0,
        description="input tokens served from the prefix cache (None: the global hit price, "
        "or this class's miss price when no hit price is set)",
    )


class Revenue(FrozenModel):
    """What users pay per million tokens (valley pricing by default). Providers that cache
    prompts bill cached input tokens lower (DeepSeek's API: a cache hit at about a quarter to
    a tenth of a miss); ``input_cache_hit_per_mtok_usd`` prices the prefix-cache hits so.
    ``by_class`` prices a traffic class apart (an agent API dearer than a chatbot's)."""

    input_per_mtok_usd: float = Field(0.14, ge=0, description="input tokens (cache misses)")
    output_per_mtok_usd: float = Field(0.21, ge=0)
    input_cache_hit_per_mtok_usd: float | None = Field(
        None, ge=0, description="input tokens served from the prefix cache (None: as a miss)"
    )
    by_class: dict[str, ClassRevenue] = Field(
        default_factory=dict,
        description="per traffic class (chatbot, agent, ...); a price a class leaves out is "
        "the global one",
    )

    def prices(self, traffic_class: str | None = None) -> TokenPrices:
        """The prices of one class (None: the global prices)."""
        own = self.by_class.get(traffic_class) if traffic_class is not None else None
        miss = self.input_per_mtok_usd
        hit = self.input_cache_hit_per_mtok_usd
        out = self.output_per_mtok_usd
        if own is not None:
            miss, out = _or(own.input_per_mtok_usd, miss), _or(own.output_per_mtok_usd, out)
            if own.input_cache_hit_per_mtok_usd is not None:
                hit = own.input_cache_hit_per_mtok_usd
        return TokenPrices(miss, _or(hit, miss), out)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


class ApiPrices(FrozenModel):
    """What calling the model through its provider's API bills (``deepinfer-sim compare-api``):
    USD per million tokens at peak hours, input tokens the API's context cache served apart
    from those it missed; off-peak hours bill ``off_peak_factor`` of each price.

    Defaults: DeepSeek's list prices for ``deepseek-flash`` (DeepSeek-V4.1-Flash) on its
    Models & Pricing page (api-docs.deepseek.com/quick_start/pricing, as listed in November
    2026, unchanged since V4.1-Flash's release on 2026-09-10): peak $0.006 per million input
    tokens that hit the cache, $0.30 per million that miss it, $1.20 per million output tokens;
    off-peak half of each; peak hours 01:00-04:00 and 06:00-10:00 UTC, Monday to Friday."""

    input_per_mtok_usd: float = Field(
        0.30, ge=0, description="input tokens that missed the API's context cache, at peak"
    )
    input_cache_hit_per_mtok_usd: float = Field(
        0.006, ge=0, description="input tokens the API's context cache served, at peak"
    )
    output_per_mtok_usd: float = Field(1.20, ge=0, description="output tokens, at peak")
    off_peak_factor: float = Field(
        0.5, gt=0, le=1, description="an off-peak price over its peak price (DeepSeek: half)"
    )
    peak_hours_utc: tuple[int, ...] = Field(
        (1, 2, 3, 6, 7, 8, 9),
        max_length=24,
        description="hours (UTC, 0-23) billed at the peak prices on peak days; every other "
        "hour off-peak",
    )
    peak_days_per_week: int = Field(
        5, ge=0, le=7, description="days a week with peak hours (DeepSeek: Monday to Friday)"
    )
    cache_ttl_s: float | None = Field(
        None,
        gt=0,
        le=MAX_HORIZON_S,
        description="how long the API's cache keeps an unused prefix (None: as pools.storage's "
        "per-class TTLs, which default to DeepSeek's own: agent 3 days, chatbot 7 days)",
    )

    @model_validator(mode="after")
    def _sane(self) -> ApiPrices:
        if self.input_cache_hit_per_mtok_usd > self.input_per_mtok_usd:
            raise ValueError(
                f"input_cache_hit_per_mtok_usd ({self.input_cache_hit_per_mtok_usd:g}) must not "
                f"exceed input_per_mtok_usd ({self.input_per_mtok_usd:g}): a cache hit is billed "
                "at most what a miss is"
            )
        hours = self.peak_hours_utc
        if any(not 0 <= h <= 23 for h in hours) or len(set(hours)) != len(hours):
            raise ValueError(f"peak_hours_utc: {list(hours)}: expected distinct hours from 0 to 23")
        return self


class Prices(FrozenModel):
    gpu_hour_usd: dict[str, float] = Field(
        default_factory=lambda: {
            "gb200": 6.0,
            "b200": 5.0,
            "h200": 3.5,
            "h100": 2.5,
            "h800": 2.5,
            "l40s": 1.0,
            "ascend950dt": 3.0,
            "ascend950pr": 2.0,
            # Blackwell Ultra: B200's and GB200's prices x 1.11, the B300 / B200 on-demand ratio
            # at the low end of Ornn's 2026 rental benchmark ($5.00 / $4.50); 910C: no public
            # rental price, assumed H100's x its BF16 rate (752 / 989 TFLOPS)
            "b300": 5.5,
            "gb300": 6.7,
            "ascend910c": 1.9,
        }
    )
    storage_node_hour_usd: float = Field(4.0, ge=0)
    revenue: Revenue = Revenue()
    api: ApiPrices = ApiPrices()


class CompareApi(FrozenModel):
    """``deepinfer-sim compare-api``: self-hosting CONFIG's workload on its deployment's pool
    shapes, resized hour by hour, against the API bill at ``prices.api``
    (planner/analysis/api_compare.py). One prefill instance and one decode group serve what the
    planner's steady model gives (planner/analysis/steady.py), or the figures set here, at
    ``planner.headroom`` of it."""

    min_prefill_instances: int = Field(
        1, ge=0, le=MAX_INSTANCES, description="prefill instances kept in every hour"
    )
    min_decode_groups: int = Field(
        1, ge=0, le=MAX_INSTANCES, description="decode groups kept in every hour"
    )
    spin_up_s: float = Field(
        600.0,
        ge=0,
        le=DAY_S,
        description="from starting an instance or group to serving (loading weights, warm-up; "
        "an assumption): paid, and started this long before the hour that needs it",
    )
    prefill_tok_s_per_instance: float | None = Field(
        None,
        gt=0,
        le=1e12,
        description="new prompt tokens/s one prefill instance serves (None: the steady model "
        "at the workload's mean prompt after its mean cached prefix; set it to a simulated "
        "figure to use one)",
    )
    decode_tok_s_per_group: float | None = Field(
        None,
        gt=0,
        le=1e12,
        description="output tokens/s one decode group serves (None: the steady model's largest "
        "batch giving each user the SLO's speed at the workload's mean context)",
    )
    ttl_variants_s: tuple[Annotated[float, Field(ge=0, le=MAX_HORIZON_S)], ...] = Field(
        (0.0,),
        max_length=3,
        description="uniform KV-cache TTLs self-hosted beside the scenario's per-class ones "
        "(0: no prefix cache and no storage nodes); at most 3, so the plot stays readable",
    )
    warmup_s: float | None = Field(
        None,
        ge=0,
        le=MAX_HORIZON_S,
        description="arrivals before this warm the cache but are not counted (None: the longest "
        "TTL compared, where the workload is at least a day longer than that; else none)",
    )
    clock_utc_offset_h: float = Field(
        0.0,
        ge=-12,
        le=14,
        description="the workload clock's hour 0 is midnight at UTC + this many hours (places "
        "prices.api.peak_hours_utc on the workload's day)",
    )
    volume_range: tuple[
        Annotated[float, Field(gt=0, le=1e7)], Annotated[float, Field(gt=0, le=1e7)]
    ] = Field(
        (0.01, 10_000.0),
        description="daily token volumes compared, as multiples of the workload's own",
    )
    volume_points: int = Field(
        241, ge=3, le=10_001, description="volumes compared, log-spaced over volume_range"
    )

    @model_validator(mode="after")
    def _range(self) -> CompareApi:
        lo, hi = self.volume_range
        if not lo < hi:
            raise ValueError(f"volume_range: [{lo:g}, {hi:g}]: the first must be below the second")
        if len(set(self.ttl_variants_s)) != len(self.ttl_variants_s):
            raise ValueError(f"ttl_variants_s: {list(self.ttl_variants_s)}: repeated TTL")
        return self


class CostModel(FrozenModel):
    """Which step-cost model each pool uses: ``roofline`` or a calibration profile (a shipped
    name such as ``sm100-derived``, or a path to a profile YAML)."""

    prefill: str = "roofline"
    decode: str = "roofline"
    vision: str = "roofline"
    aggregated: str = Field("roofline", description="serving: aggregated: its instances'")
    roofline: RooflineParams = RooflineParams()
    step: StepParams = StepParams()

    def for_pool(self, pool: str) -> str:
        return str(getattr(self, pool))


class SimSettings(FrozenModel):
    horizon_s: float | None = Field(
        None,
        gt=0,
        le=MAX_HORIZON_S,
        description="stop at this simulated time; None runs until every request ends",
    )
    timeseries_interval_s: float = Field(
        1.0,
        ge=MIN_TIMESERIES_INTERVAL_S,
        description="time-series sample interval; one sample costs a row of every series, so "
        "a finer grid than 10 ms would make a run take minutes and GB",
    )
    progress: bool = Field(
        True, description="progress: a bar on a terminal, else a plain stderr line every 30 s"
    )
    drain_limit_s: float = Field(
        86400.0,
        gt=0,
        le=MAX_HORIZON_S,
        description="without a horizon, a run whose requests are still in flight this long after "
        "the last arrival stops with an error (a link, pool or store too slow for the load "
        "would otherwise simulate for ever)",
    )
    percentiles: tuple[typing.Annotated[float, Field(ge=0, le=100)], ...] = Field(
        (50, 90, 95, 99, 99.9),
        min_length=1,
        max_length=32,
        description="latency percentiles in summary.json (keys p50, p99.9...); p50, p90 and p99 "
        "are always reported",
    )


class Scenario(FrozenModel):
    """A whole simulated deployment: model, pools, network, policies, workload, SLOs, prices."""

    name: str = "scenario"
    description: str = ""
    seed: int = Field(0, ge=0)
    model: str = "deepseek-v4.1-flash"
    serving: Literal["disaggregated", "aggregated"] = Field(
        "disaggregated",
        description="disaggregated: prefill instances hand prompts to decode groups over P->D "
        "links (pools.prefill, pools.decode); aggregated: instances that prefill and decode "
        "in the same steps (pools.aggregated, its defaults where it is not given)",
    )
    pools: Pools = Pools()
    network: Network = Network()
    policies: Policies = Policies()
    cache: Cache = Cache()
    workload: Workload = Workload()
    slo: Slo = Slo()
    planner: Planner = Planner()
    compare_api: CompareApi = CompareApi()
    prices: Prices = Prices()
    cost_model: CostModel = CostModel()
    sim: SimSettings = SimSettings()
    faults: tuple[Fault, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _aggregated_pool(cls, data: Any) -> Any:
        """``serving: aggregated`` without ``pools.aggregated``: the pool's defaults."""
        if not isinstance(data, dict) or data.get("serving") != "aggregated":
            return data
        pools = data.get("pools")
        if pools is None:
            return {**data, "pools": {"aggregated": {}}}
        if isinstance(pools, dict) and pools.get("aggregated") is None:
            return {**data, "pools": {**pools, "aggregated": {}}}
        return data

    @property
    def aggregated(self) -> bool:
        """Whether prefill and decode run together on ``pools.aggregated``."""
        return self.serving == "aggregated"

    @property
    def serving_pools(self) -> tuple[str, ...]:
        """The expert-parallel pools that run: prefill and decode, or aggregated."""
        return ("aggregated",) if self.aggregated else ("prefill", "decode")

    def serving_pool(self, phase: str) -> str:
        """The pool whose steps do ``phase``'s work (prefill or decode): the aggregated one under
        aggregated serving."""
        return "aggregated" if self.aggregated else phase

    @model_validator(mode="after")
    def _fault_targets(self) -> Scenario:
        for i, f in enumerate(self.faults):
            if self.aggregated and f.kind in ("link_cut", "rank_fail"):
                raise ValueError(
                    f"faults[{i}].kind: {f.kind} needs disaggregated serving (an aggregated "
                    "instance has no P->D link, and its ranks do not fail); storage_node_fail "
                    "applies"
                )
            if f.kind == "link_cut" and f.target >= self.pools.prefill.instances:
                raise ValueError(
                    f"faults[{i}].target: prefill instance {f.target} does not exist "
                    f"({self.pools.prefill.instances} instances)"
                )
            if f.kind == "storage_node_fail" and f.target >= self.pools.storage.nodes:
                raise ValueError(
                    f"faults[{i}].target: storage node {f.target} does not exist "
                    f"({self.pools.storage.nodes} nodes)"
                )
            if f.kind == "rank_fail" and (
                f.target >= self.pools.decode.groups or f.rank >= self.pools.decode.ep
            ):
                raise ValueError(
                    f"faults[{i}]: decode group {f.target} rank {f.rank} does not exist "
                    f"({self.pools.decode.groups} groups of {self.pools.decode.ep} ranks)"
                )
        return self

    def hardware_kinds(self) -> dict[str, str]:
        """The hardware of each pool that runs: vision, prefill and decode, or vision and
        aggregated."""
        p = self.pools
        if self.aggregated and p.aggregated is not None:
            return {"aggregated": p.aggregated.hardware, "vision": p.vision.hardware}
        return {
            "prefill": p.prefill.hardware,
            "decode": p.decode.hardware,
            "vision": p.vision.hardware,
        }

    def gpu_usd_per_hour(self) -> float:
        """$ per hour of the online GPUs at ``prices.gpu_hour_usd`` (storage nodes not counted)."""
        hw = self.hardware_kinds()
        price = self.prices.gpu_hour_usd
        return sum(
            n * price[load_hardware(hw[pool]).name] for pool, n in self.pools.gpus_by_pool().items()
        )


# ---- overrides ----------------------------------------------------------------------------------

_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")


def _split_path(path: str) -> list[str | int]:
    parts: list[str | int] = []
    for seg in path.split("."):
        m = _SEGMENT.match(seg)
        if not m:
            raise ConfigError(path, f"bad key segment {seg!r} (expected name or name[index])")
        parts.append(m.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group(2)))
    return parts


def parse_override(text: str) -> tuple[str, Any]:
    """``"pools.decode.ep=128"`` -> ``("pools.decode.ep", 128)``; the value is read as YAML."""
    if "=" not in text:
        raise ConfigError("", f"--set {text!r}: expected KEY=VALUE (e.g. pools.decode.ep=128)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError("", f"--set {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _unwrap_optional(tp: Any) -> Any:
    """``X | None`` -> ``X``; anything else as it is."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _mapping_default(parts: list[str | int]) -> dict[str, Any] | None:
    """The default of the :class:`Scenario` field at ``parts`` (as raw YAML data) when that field
    is a mapping such as ``prices.gpu_hour_usd`` or ``pools.storage.ttl_s``; else None."""
    tp: Any = Scenario
    field = None
    for part in parts:
        tp = _unwrap_optional(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
            field = tp.model_fields.get(part)
            if field is None:
                return None
            tp = field.annotation
        elif typing.get_origin(tp) is dict and isinstance(part, str):
            field, tp = None, typing.get_args(tp)[1]
        elif typing.get_origin(tp) in (tuple, list) and isinstance(part, int):
            field, tp = None, typing.get_args(tp)[0]
        else:
            return None
    if field is None or typing.get_origin(_unwrap_optional(tp)) is not dict:
        return None
    default = field.get_default(call_default_factory=True)
    if not isinstance(default, dict) or field.annotation is None:
        return None
    dumped: dict[str, Any] = TypeAdapter(field.annotation).dump_python(default, mode="json")
    return dumped


def apply_override(data: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted key in a raw (unvalidated) mapping, creating mappings along the way.

    A key inside a mapping merges into it: ``prices.gpu_hour_usd.gb200=7`` changes that one
    price, and where the scenario file does not spell the mapping out the others keep their
    defaults (the mapping is seeded from the Scenario default before the key is set). A mapping
    *value* (``pools.storage.ttl_s={chatbot: 100}``) replaces the whole mapping, as in YAML.
    """
    parts = _split_path(key)
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        where = ".".join(str(p) for p in parts[: i + 1])
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                raise ConfigError(key, f"{where} is not a list with index {part}")
            node = node[part]
            continue
        if not isinstance(node, dict):
            raise ConfigError(key, f"{where}: cannot set a key inside a non-mapping value")
        if node.get(part) is None:
            node[part] = _mapping_default(parts[: i + 1]) or {}
        node = node[part]
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise ConfigError(key, f"not a list with index {last}")
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(key, "cannot set a key inside a non-mapping value")


# ---- loading ------------------------------------------------------------------------------------


def bundled_scenarios() -> dict[str, Path]:
    """Scenarios addressable by name: ``default`` plus everything in configs/scenarios/."""
    names = {"default": bundled_dir(".") / "default.yaml"}
    names.update({p.stem: p for p in sorted(bundled_dir("scenarios").glob("*.yaml"))})
    return names


def scenario_path(ref: str | Path) -> Path:
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise ConfigError("", f"no such scenario file: {p}")
        return p
    named = bundled_scenarios()
    if str(ref) in named:
        return named[str(ref)]
    published = {p.stem: p for p in sorted(bundled_dir("published").glob("*.yaml"))}
    if str(ref) in published:
        return published[str(ref)]
    raise ConfigError(
        "",
        f"no scenario file or bundled scenario named {ref!r}; bundled: {', '.join(named)}; "
        f"published deployments: {', '.join(published)}",
    )


def _check_references(sc: Scenario, base_dir: Path, source: str) -> Scenario:
    """Model and hardware names must resolve, and classes priced apart must be among the
    workload's where the config tells them; relative trace paths become absolute. What needs the
    model is checked here too: its experts split evenly over both pools' EP widths, and every
    bandwidth moves one KV block within the drain limit."""
    refs = [("model", "models", sc.model)]
    refs += [(f"pools.{pool}.hardware", "hardware", hw) for pool, hw in sc.hardware_kinds().items()]
    for path, kind, ref in refs:
        try:
            (load_model if kind == "models" else load_hardware)(ref, base_dir)
        except ConfigError as exc:
            raise ConfigError(path, str(exc), source=source) from None
    model = load_model(sc.model, base_dir)
    for pool, hw in sc.hardware_kinds().items():
        spec = load_hardware(hw, base_dir)
        name = spec.name
        if name not in sc.prices.gpu_hour_usd:
            raise ConfigError(
                "prices.gpu_hour_usd",
                f"no price for hardware {name!r} used by pools.{pool}",
                source,
            )
        sliced = model
        if pool in ("prefill", "decode", "aggregated"):
            cfg: ExpertParallelPool = getattr(sc.pools, pool)
            if cfg.tp > spec.scaleup.domain_gpus:
                raise ConfigError(
                    f"pools.{pool}.tp",
                    f"TP{cfg.tp} spans more GPUs than one scale-up domain of {name} "
                    f"({spec.scaleup.domain_gpus}): a tensor-parallel rank's all-reduces run "
                    "inside one",
                    source=source,
                )
            try:
                sliced = model.tp_slice(cfg.tp, cfg.moe_tp)
            except ValueError as exc:
                raise ConfigError(f"pools.{pool}.tp", str(exc), source=source) from None
        ref = sc.cost_model.for_pool(pool)
        if ref != "roofline":
            try:
                check_profile(ref, sliced, name, base_dir)
            except ConfigError as exc:
                raise ConfigError(f"cost_model.{pool}", str(exc), source=source) from None
    _check_serving(sc, model, source)
    _check_expert_split(sc, model, source)
    _check_bandwidths(sc, model, source)
    known = sc.workload.traffic_classes()
    for name in sc.prices.revenue.by_class:
        if known is not None and name not in known:
            raise ConfigError(
                f"prices.revenue.by_class.{name}",
                f"the workload has no traffic class {name!r} (its classes: {', '.join(known)})",
                source,
            )
    trace = sc.workload.trace
    if not trace.startswith("builtin:") and not Path(trace).is_absolute():
        wl = sc.workload.model_copy(update={"trace": str((base_dir / trace).resolve())})
        sc = sc.model_copy(update={"workload": wl})
    model_ref = sc.model
    if model_ref.endswith((".yaml", ".yml")) and not Path(model_ref).is_absolute():
        sc = sc.model_copy(update={"model": str(resolve("models", model_ref, base_dir).resolve())})
    return sc


def expert_split_problem(experts: int, ep: int, redundant: int) -> str | None:
    """Why ``experts`` routed experts (plus ``redundant`` redundant slots in all) do not split
    evenly over ``ep`` ranks, or None when they do.

    The rule: every rank holds the same number of routed experts (``ep`` divides ``experts``),
    or the same number of slots once the redundant ones are counted (``ep`` divides
    ``experts + redundant``, as DeepSeek's 256 + 32 over EP144). Engines refuse anything else
    (SGLang and DeepSeek's EPLB need the physical experts to divide by the EP size); the
    simulator would otherwise round the slots per rank up and place experts nobody asked for."""
    if ep <= 1 or experts % ep == 0 or (experts + redundant) % ep == 0:
        return None
    fits = [d for d in range(1, min(experts, MAX_EP) + 1) if experts % d == 0]
    near = sorted(sorted(fits, key=lambda d: (abs(d - ep), d))[:3])
    if redundant:
        why = f"nor do the {experts + redundant} slots with the {redundant} redundant ones"
    else:
        why = "and no redundant slots make up the rest"
    return (
        f"EP{ep} does not split the model's {experts} routed experts evenly ({why}); every "
        f"rank must hold the same number, as engines require: use an EP that divides {experts} "
        f"(nearest: {', '.join(map(str, near))})"
    )


def _redundant_total(pool: ExpertParallelPool, ep: int) -> int:
    if pool.redundant_experts is not None:
        return pool.redundant_experts
    return pool.redundant_experts_per_gpu * ep


def _check_serving(sc: Scenario, model: ModelSpec, source: str) -> None:
    """``pools.aggregated`` is given only with ``serving: aggregated``. (Its token budget is
    checked against the decode tokens of a full rank where the speculative policy's depth is
    known: when the run is built.)"""
    if not sc.aggregated and sc.pools.aggregated is not None:
        raise ConfigError(
            "pools.aggregated",
            "set, but serving is disaggregated: add `serving: aggregated` to run it (or "
            "remove pools.aggregated)",
            source=source,
        )


def _check_expert_split(sc: Scenario, model: ModelSpec, source: str) -> None:
    """The running pools' EP widths split the model's routed experts evenly
    (:func:`expert_split_problem` says the rule). The planner's grid is not checked here: a
    run does not use it, and ``plan`` checks each shape as it builds it."""
    experts = model.moe.routed_experts
    for pool_name in sc.serving_pools:
        pool: ExpertParallelPool = getattr(sc.pools, pool_name)
        groups = pool.expert_groups
        problem = expert_split_problem(experts, groups, _redundant_total(pool, groups))
        if problem is not None:
            raise ConfigError(f"pools.{pool_name}.ep", f"{problem} ({model.name})", source=source)


KV_BLOCK_TOKENS = 512
"""The prefix block the bandwidth floors are stated in (Mooncake's and the sessions' block)."""


def _check_bandwidths(sc: Scenario, model: ModelSpec, source: str) -> None:
    """A floor under every bandwidth a request's KV crosses, in a run without a horizon: it must
    move one 512-token KV block (the SWA VLAN: one sequence's SWA slot) within
    ``sim.drain_limit_s``. A slower one cannot serve a prompt of a few blocks before the run
    gives up on draining, and the run would tick its clocks through the whole drain limit only
    to say so (``pools.storage.read_gbytes_per_s: 1e-9`` spun for minutes)."""
    if sc.sim.horizon_s is not None:
        return  # the horizon bounds the run: a stalled request is cut there, nothing spins
    limit, limit_key = sc.sim.drain_limit_s, "sim.drain_limit_s"
    block = model.kv_bytes_per_token() * KV_BLOCK_TOKENS
    what_block = f"one {KV_BLOCK_TOKENS}-token KV block ({block / 1e6:.3g} MB of {model.name})"
    p = sc.pools
    agg = p.aggregated if sc.aggregated else None
    ep8 = (agg.ep if agg is not None else p.prefill.ep) / 8
    # (key, bytes per second, what moves, what it moves, its bytes)
    paths = [
        (
            "network.pd_gbps_per_8_gpus",
            sc.network.pd_gbps_per_8_gpus * 1e9 / 8 * ep8,
            "a prefill instance's P->D link" if agg is None else "an instance's store writes",
            what_block,
            block,
        )
    ]
    if sc.cache.prefix.enabled:
        paths.append(
            (
                "cache.prefix.load_gbps_per_8_gpus",
                sc.cache.prefix.load_gbps_per_8_gpus * 1e9 / 8 * ep8,
                "a prefill instance's cache load",
                what_block,
                block,
            )
        )
        if p.storage.nodes:
            paths += [
                (
                    f"pools.storage.{op}_gbytes_per_s",
                    bw * 1e9,
                    f"a storage node's {op}",
                    what_block,
                    block,
                )
                for op, bw in (
                    ("read", p.storage.read_gbytes_per_s),
                    ("write", p.storage.write_gbytes_per_s),
                )
            ]
    slot = model.swa_slot_bytes
    if slot > 0:
        paths.append(
            (
                "cache.swa.vlan_gbps",
                sc.cache.swa.vlan_gbps * 1e9 / 8,
                "the SWA VLAN",
                f"one sequence's SWA slot ({slot / 1e6:.3g} MB of {model.name})",
                slot,
            )
        )
    for key, per_s, mover, unit, nbytes in paths:
        seconds = nbytes / per_s
        if seconds > limit:
            raise ConfigError(
                key,
                f"too slow for any run to drain: {mover} moves {unit} in {seconds:.3g} s, "
                f"longer than {limit_key} ({limit:g} s) lets a request take",
                source=source,
            )


def check_run_size(sc: Scenario, arrival_s: Any) -> dict[str, float]:
    """What a run of ``sc`` over arrivals ``arrival_s`` (sorted seconds) will do, stated before
    it starts: the ticks of each of its clocks, keyed by the setting that sets the period.

    Refused with a ConfigError naming the key: a workload whose last arrival lies past a year
    (a tiny ``workload.rate_scale``, a trace timestamp far out) when no ``sim.horizon_s`` cuts
    it; a ``sim.horizon_s`` that ends the run before the first arrival; and clocks that would
    tick more than :data:`MAX_CLOCK_TICKS` times over the span (the horizon, else the last
    arrival plus ``sim.drain_limit_s``: a run that drains early ticks fewer)."""
    n = len(arrival_s)
    first = float(arrival_s[0]) if n else 0.0
    last = float(arrival_s[-1]) if n else 0.0
    horizon = sc.sim.horizon_s
    wl = sc.workload
    if horizon is None and last > MAX_HORIZON_S:
        why = []
        if wl.rate_scale < 1:
            why.append(f"workload.rate_scale={wl.rate_scale:g} divides its arrival times by it")
        if wl.repeat > 1:
            why.append(f"workload.repeat={wl.repeat} tiles it end to end")
        raise ConfigError(
            "workload",
            f"its last request arrives at t={last:.4g} s, past the year a run may simulate "
            f"({MAX_HORIZON_S:,.0f} s){': ' + '; '.join(why) if why else ''}; set sim.horizon_s "
            "to cut the run, or shorten the workload",
        )
    if horizon is not None and n and horizon <= first:
        raise ConfigError(
            "sim.horizon_s",
            f"{horizon:g} s ends the run before the first request arrives (t={first:.6g} s): "
            "nothing would be simulated",
        )
    span = horizon if horizon is not None else last + sc.sim.drain_limit_s
    ticks = clock_ticks(sc, span)
    total = sum(ticks.values())
    if total > MAX_CLOCK_TICKS:
        key = max(ticks, key=lambda k: ticks[k])
        spanned = (
            f"sim.horizon_s = {horizon:g} s"
            if horizon is not None
            else f"the last arrival at {last:,.0f} s + sim.drain_limit_s {sc.sim.drain_limit_s:g} s"
        )
        shares = ", ".join(f"{k} {v:.3g}" for k, v in sorted(ticks.items(), key=lambda kv: -kv[1]))
        raise ConfigError(
            key,
            f"the run's clocks would tick {total:.3g} times over its {span:.4g} simulated s "
            f"({spanned}), more than the {MAX_CLOCK_TICKS:,} a run may take (about an hour of "
            f"CPU); by setting: {shares}. Raise {key}, or shorten the run",
        )
    return ticks


def clock_ticks(sc: Scenario, span_s: float) -> dict[str, float]:
    """How often each clock of a run of ``sc`` ticks over ``span_s`` simulated seconds, keyed by
    the setting of its period: the time-series sampler, the tiered router's rounds, the
    expert-popularity walk (live imbalance) and random storage failures and repairs."""
    ticks = {"sim.timeseries_interval_s": span_s / sc.sim.timeseries_interval_s}
    if sc.policies.prefill_router == "tiered" and not sc.aggregated:  # aggregated: no tiers
        ticks["policies.tiers.round_s"] = span_s / sc.policies.tiers.round_s
    if sc.policies.eplb.imbalance == "live":
        ticks["policies.eplb.load.drift_update_s"] = span_s / sc.policies.eplb.load.drift_update_s
    st = sc.pools.storage
    if st.nodes and st.mtbf_h is not None and sc.cache.prefix.enabled:
        cycle_s = (st.mtbf_h + st.mttr_h) * 3600.0
        ticks["pools.storage.mtbf_h"] = 2 * st.nodes * span_s / cycle_s
    return ticks


def check_profile(ref: str, model: ModelSpec, hardware: str, base_dir: Path | None) -> None:
    """A profile must have fits for the model (its own, or those of a fitted model with the same
    layer widths) on the pool's hardware, for every attention kind of the model's layers; else
    one ConfigError naming what is missing (the model's fits, the hardware or a kind)."""
    from .models.profile import load_profile

    profile = load_profile(ref, base_dir)
    coefs = profile.coefs(model, hardware)
    kinds = list(dict.fromkeys(g.attention for g in model.layer_groups))
    missing = [
        f"{phase} {kind}"
        for kind in kinds
        for phase, table in (("prefill", coefs.prefill), ("decode", coefs.decode))
        if kind not in table
    ]
    if missing:
        raise ConfigError(
            "",
            f"profile {profile.name!r} has no {', '.join(missing)} fit on {hardware} for model "
            f"{model.name} (calibrate it, or use roofline)",
        )


def is_case_file(data: Any) -> bool:
    """A published case file's parsed YAML (``planner/analysis/published.py``): its deployment
    under ``scenario:``, beside its ``cases``."""
    return isinstance(data, dict) and "cases" in data and "scenario" in data


def load_scenario(ref: str | Path = "default", overrides: list[str] | None = None) -> Scenario:
    """Read, override and validate a scenario. Raises ConfigError naming the key path."""
    path = scenario_path(ref)
    data = read_yaml(path)
    if data is None:
        raise ConfigError(
            "",
            "the scenario file is empty (it would run every built-in default; "
            "`deepinfer-sim show default` prints a complete scenario to start from)",
            source=str(path),
        )
    if not isinstance(data, dict):
        raise ConfigError("", "expected a mapping at the top level", source=str(path))
    prefix = ""
    if is_case_file(data):  # a published case file: its deployment
        data, prefix = data["scenario"], "scenario"
        if not isinstance(data, dict):
            raise ConfigError("scenario", "expected a mapping", source=str(path))
    workload = data.get("workload")
    had_sessions = isinstance(workload, dict) and workload.get("sessions") is not None
    keys: list[str] = []
    for text in overrides or []:
        key, value = parse_override(text)
        apply_override(data, key, value)
        keys.append(key)
    if not had_sessions:
        _sessions_replay_from_defaults(data, keys)
    sc = validate(Scenario, data, source=str(path), prefix=prefix)
    return _check_references(sc, path.parent, str(path))


# A trace's replay speed, tuned to that trace (default.yaml replays the Mooncake trace 4 times
# at 25x): not carried over when a --set switches the scenario to generated sessions.
_TRACE_REPLAY_KEYS = ("repeat", "rate_scale")


def _sessions_replay_from_defaults(data: dict[str, Any], keys: list[str]) -> None:
    """When ``--set`` overrides turned a trace scenario into a sessions one, drop the file's
    ``workload.repeat`` / ``rate_scale`` (unless an override set them too): the sessions
    generator has its own rate (``sessions_per_day``) and a trace's 25x would silently multiply
    it."""
    workload = data.get("workload")
    if not isinstance(workload, dict) or workload.get("sessions") is None:
        return
    if "workload" in keys:  # the whole workload mapping was given: it says what it means
        return
    given = {k.split(".")[1].split("[")[0] for k in keys if k.startswith("workload.")}
    for name in _TRACE_REPLAY_KEYS:
        if name not in given:
            workload.pop(name, None)


def scenario_from_dict(data: dict[str, Any], base_dir: Path | None = None) -> Scenario:
    """Validate a mapping (e.g. built in a notebook or a sweep) into a Scenario."""
    sc = validate(Scenario, data)
    return _check_references(sc, base_dir or Path.cwd(), "<dict>")


def dump_scenario(sc: Scenario) -> str:
    """The fully resolved scenario as YAML (every default filled in)."""
    return yaml.safe_dump(sc.model_dump(mode="json"), sort_keys=False)


def json_schema() -> dict[str, Any]:
    return Scenario.model_json_schema()
