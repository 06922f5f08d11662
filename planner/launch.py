"""Launch files for a deployment: a resolved Scenario as the engines' own command lines.

``write_launch_files(sc, DIR)`` writes ``DIR/launch/`` (``launch_files(sc)`` returns the texts;
``sglang_script``, ``vllm_script`` and ``dynamo_manifest`` each one of them):

- ``sglang.sh``: the SGLang servers (``python3 -m sglang.launch_server``) of each pool and the
  router in front of them (``smg launch``, the gateway SGLang's router became);
- ``vllm.sh``: the same deployment as ``vllm serve`` lines and ``vllm-router``;
- ``dynamo.yaml``: a Dynamo ``DynamoGraphDeployment`` (Kubernetes), SGLang workers by default.

Each script takes a role (``prefill``, ``decode``, ``router``; ``server`` when aggregated), reads
the node it runs on from the environment (``NODE_RANK``, ``HEAD``) and with ``DRY_RUN=1`` prints
the command instead of running it. Every flag carries a comment naming the scenario field it
comes from; what the scenario says that an engine has no setting for is a ``# not expressed:``
line, and the sections that only steer the simulation are named on one ``# simulator only:`` line:
nothing is dropped silently.

The mapping, per pool (prefill instance, decode group or aggregated instance) of ``ep`` GPUs, ``dp
= ep / tp`` data-parallel ranks and experts over ``ep / moe_tp`` GPUs:

- SGLang counts a server's GPUs as ``--tp`` (its world size) and its attention-DP ranks as
  ``--attn-dp-size`` (0.5.23 deprecates ``--enable-dp-attention``); ``--chunked-prefill-size``
  and ``--max-running-requests`` are the server's, which SGLang divides over its DP ranks: so
  they are the scenario's per-rank figures times ``dp``. DeepEP (``--moe-a2a-backend deepep``)
  sets the expert-parallel width to the whole server, so it is used only with whole experts.
- vLLM runs ``dp`` engines of ``--tensor-parallel-size tp`` each; ``--max-num-seqs`` and
  ``--max-num-batched-tokens`` are per engine, the scenario's per-rank figures as they are.

Checked against (``tests/integration/test_launch_engines.py`` parses every server and router line
with the engine's own parser, and the manifest against the templates Dynamo's profiler fills):
:data:`CHECKED_AGAINST`. The engine rules applied here (which all-to-all backend DSpark allows, what
DeepSeek-V4.1 refuses) were read in those versions' sources and are named where they apply.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..models.hardware import HardwareSpec
from ..models.registry import load_hardware, load_model
from ..models.spec import ModelSpec
from ..scenario import EplbPool, Scenario

CHECKED_AGAINST = {
    "sglang": "0.5.23",
    "smg": "1.13.0",
    "vllm": "0.33.0",
    "vllm-router": "0.1.17",
    "ai-dynamo": "1.6.1",
}
"""The releases whose argument parsers and manifest templates the launch files were checked
against."""

DYNAMO_IMAGES = {
    "sglang": f"nvcr.io/nvidia/ai-dynamo/sglang-runtime:{CHECKED_AGAINST['ai-dynamo']}",
    "vllm": f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{CHECKED_AGAINST['ai-dynamo']}",
}

Role = Literal["prefill", "decode", "aggregated"]
Engine = Literal["sglang", "vllm"]


# ---- the checkpoint ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """The Hugging Face checkpoint that serves a model, and its ``config.json`` model_type (the
    engines key their model-specific rules on it)."""

    repo: str
    model_type: str


CHECKPOINTS = {
    "deepseek-v3": Checkpoint("deepseek-ai/DeepSeek-V3", "deepseek_v3"),
    # NVIDIA's ModelOpt NVFP4 checkpoint (configs/models/deepseek-v3-nvfp4.yaml cites it)
    "deepseek-v3-nvfp4": Checkpoint("nvidia/DeepSeek-R1-FP4", "deepseek_v3"),
    "deepseek-v4-flash": Checkpoint("deepseek-ai/DeepSeek-V4-Flash", "deepseek_v4"),
    "deepseek-v4-pro": Checkpoint("deepseek-ai/DeepSeek-V4-Pro", "deepseek_v4"),
    "deepseek-v4.1-flash": Checkpoint("deepseek-ai/DeepSeek-V4.1-Flash", "deepseek_v41"),
}
"""Model file name -> checkpoint. A model not listed (a custom file, the INT8 R1 that Huawei's
CloudMatrix serves, the 3-layer validation stack) gets a placeholder: set ``MODEL``."""


def checkpoint_of(model: ModelSpec) -> Checkpoint | None:
    return CHECKPOINTS.get(model.name)


# ---- the deployment's shape --------------------------------------------------------------------


@dataclass(frozen=True)
class PoolShape:
    """One pool as the engines see it: ``count`` servers of ``gpus`` GPUs each."""

    role: Role
    count: int  # prefill instances, decode groups or aggregated instances
    gpus: int  # GPUs of one server (the pool's ep)
    tp: int  # attention / dense tensor parallelism within a DP rank
    moe_tp: int  # GPUs each routed expert is sliced over
    hardware: HardwareSpec
    two_batch_overlap: bool
    redundant_experts: int  # redundant expert slots of one server in total
    eplb: EplbPool
    max_seqs_per_rank: int | None
    max_tokens_per_step: int | None
    scheduler: str | None  # the prefill or aggregated pool's; None for a decode group

    @property
    def whole_prompts(self) -> bool:
        """Prompts never chunked (prefill or aggregated scheduler "whole")."""
        return self.scheduler == "whole"

    @property
    def mixed(self) -> bool:
        """An aggregated step carries chunks beside the decode tokens ("tokens", "chunked")."""
        return self.role == "aggregated" and self.scheduler in ("tokens", "chunked")

    @property
    def dp(self) -> int:
        return self.gpus // self.tp

    @property
    def expert_width(self) -> int:
        """GPUs the routed experts are spread over (the engines' EP size)."""
        return self.gpus // self.moe_tp

    @property
    def nodes(self) -> int:
        """Nodes one server spans."""
        return math.ceil(self.gpus / self.hardware.gpus_per_node)

    @property
    def gpus_per_pod(self) -> int:
        return min(self.gpus, self.hardware.gpus_per_node)

    @property
    def servers_per_node(self) -> int:
        return max(1, self.hardware.gpus_per_node // self.gpus)

    def summary(self) -> str:
        noun = {"prefill": "instance", "decode": "group", "aggregated": "instance"}[self.role]
        noun += "s" if self.count > 1 else ""
        experts = f"experts EP{self.expert_width}" + (
            f" x TP{self.moe_tp}" if self.moe_tp > 1 else ""
        )
        nodes = f"{self.nodes} node{'s' if self.nodes > 1 else ''} of {self.gpus_per_pod}"
        return (
            f"{self.role}: {self.count} {noun} x {self.gpus} {self.hardware.name} GPUs "
            f"({self.dp} DP ranks x TP{self.tp}, {experts}; {nodes} GPUs each): "
            f"{self.count * self.gpus} GPUs"
        )


def pool_shapes(sc: Scenario, base_dir: Path | None = None) -> list[PoolShape]:
    """The pools that serve: prefill and decode, or the aggregated instances."""
    p = sc.pools
    eplb = sc.policies.eplb

    def shape(role: Role, count: int, pool: Any, hardware: str, eplb_pool: EplbPool) -> PoolShape:
        return PoolShape(
            role=role,
            count=count,
            gpus=pool.ep,
            tp=pool.tp,
            moe_tp=pool.moe_tp,
            hardware=load_hardware(hardware, base_dir),
            two_batch_overlap=pool.two_batch_overlap,
            redundant_experts=round(pool.redundant_per_gpu * pool.ep),
            eplb=eplb_pool,
            max_seqs_per_rank=getattr(pool, "max_seqs_per_rank", None),
            max_tokens_per_step=getattr(pool, "max_tokens_per_step", None),
            scheduler=getattr(pool, "scheduler", None),
        )

    if sc.aggregated and p.aggregated is not None:
        a = p.aggregated  # aggregated instances use the decode pool's EPLB settings
        return [shape("aggregated", a.instances, a, a.hardware, eplb.decode)]
    pre, dec = p.prefill, p.decode
    return [
        shape("prefill", pre.instances, pre, pre.hardware, eplb.prefill),
        shape("decode", dec.groups, dec, dec.hardware, eplb.decode),
    ]


# ---- command-line words ------------------------------------------------------------------------


class Sh(str):
    """A word the shell expands (``$MODEL``, ``$HEAD:$DIST_PORT``): written in double quotes."""

    __slots__ = ()


@dataclass(frozen=True)
class Arg:
    """Flags that belong together, and where in the scenario they come from."""

    words: tuple[str, ...]
    why: str = ""


def _arg(*words: str | int | float, why: str = "") -> Arg:
    return Arg(tuple(w if isinstance(w, str) else _number(w) for w in words), why)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _number(x: int | float) -> str:
    """A flag's number as the engines read it: an integer in full (never 1.04858e+06)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _word(w: str) -> str:
    return f'"{w}"' if isinstance(w, Sh) else shlex.quote(w)


def _json(obj: dict[str, Any]) -> str:
    """A flag's JSON value, compact (one shell word)."""
    return json.dumps(obj, separators=(",", ":"))


@dataclass
class Notes:
    """What one engine cannot express of the scenario, collected while its flags are built."""

    lines: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        if text not in self.lines:
            self.lines.append(text)


# ---- what both engines share -------------------------------------------------------------------


@dataclass(frozen=True)
class Speculation:
    """How the engines draft: the drafter the checkpoint ships and how many tokens it drafts."""

    drafter: Literal["mtp", "dspark"]
    tokens: int
    dynamic: bool  # policy dspark: verify a per-sequence truncation of the drafts


def speculation(sc: Scenario, model: ModelSpec, notes: Notes) -> Speculation | None:
    spec = sc.policies.speculative
    if spec.policy == "none":
        return None
    if model.draft.kind == "none":
        notes.add(
            f"policies.speculative.policy {spec.policy}: {model.name} ships no drafter "
            "(model draft.kind none); speculative decoding not launched"
        )
        return None
    tokens = {"mtp1": 1, "fixed": spec.fixed_k, "dspark": spec.max_draft_tokens}[spec.policy]
    if spec.policy == "dspark":
        notes.add(
            f"policies.speculative.lag_steps {spec.lag_steps}, confidence_noise "
            f"{spec.confidence_noise:g}, retune_steps {spec.retune_steps}, overhead_s "
            f"{spec.overhead_s:g}, acceptance: how the simulator models DSpark's truncation, "
            "not engine settings"
        )
    return Speculation(model.draft.kind, tokens, spec.policy == "dspark")


def _common_notes(sc: Scenario, model: ModelSpec, shapes: list[PoolShape], notes: Notes) -> None:
    """What neither engine has a setting for."""
    p = sc.pools
    for s in shapes:
        if s.hardware.vendor != "nvidia":
            notes.add(
                f"pools.{s.role}.hardware {s.hardware.name} ({s.hardware.vendor}): these lines "
                "are for NVIDIA GPUs; the engines' Ascend builds (SGLang --device npu, "
                "vLLM-Ascend) take other backend flags"
            )
        if s.role == "prefill" and not s.whole_prompts:
            notes.add(
                f"pools.prefill.step_time_budget_s {p.prefill.step_time_budget_s:g}: the chunk "
                "scheduler's time budget; the engines cap a step by tokens only"
            )
        if s.role in ("decode", "aggregated"):
            pool = p.decode if s.role == "decode" else p.aggregated
            assert pool is not None
            notes.add(
                f"pools.{s.role}.kv_hbm_fraction {pool.kv_hbm_fraction:g} and "
                f"activation_reserve_bytes {pool.activation_reserve_bytes:g}: the engines size "
                "KV from a fraction of all HBM (SGLang --mem-fraction-static, vLLM "
                "--gpu-memory-utilization), left at their defaults"
            )
            if pool.kv_policy == "reserve":
                notes.add(
                    f"pools.{s.role}.kv_policy reserve: the engines admit on the current "
                    "context and retract (preempt) when KV runs out"
                )
        agg = p.aggregated
        if s.role == "aggregated" and agg is not None and agg.scheduler == "chunked":
            notes.add(
                f"pools.aggregated.scheduler chunked (step_time_budget_s "
                f"{agg.step_time_budget_s:g}): the engines cap a step by tokens only"
            )
        if s.eplb.policy == "eplb":
            eplb = sc.policies.eplb.for_pool(s.role)
            if eplb.warm_start or eplb.minimize_moves:
                notes.add(
                    f"policies.eplb.{'prefill' if s.role == 'prefill' else 'decode'}: "
                    "warm_start / minimize_moves: the engines start from their own placement "
                    "and re-pack whole"
                )
    if not sc.aggregated:
        n = sc.network
        notes.add(
            f"network (pd_gbps_per_8_gpus {n.pd_gbps_per_8_gpus:g}, placement {n.placement}, "
            f"backup_links {str(n.backup_links).lower()}): properties of the cluster's network"
        )
    if p.vision.instances:
        notes.add(
            f"pools.vision: {p.vision.instances} vision-encoder GPUs ({p.vision.hardware}) are "
            "not launched: the checkpoints listed serve text"
        )
    if sc.cache.prefix.enabled and p.storage.nodes:
        st = p.storage
        ttl = ", ".join(f"{k} {v:g} s" for k, v in st.ttl_s.items())
        notes.add(
            f"pools.storage: the 3FS cluster ({st.nodes} nodes x {st.disks_per_node} disks, "
            f"{st.data_chunks}+{st.parity_chunks} erasure coding, watermarks "
            f"{st.low_watermark:g}-{st.high_watermark:g}) is deployed apart, and its per-class "
            f"TTL ({ttl}; default {st.default_ttl_s:g} s, refresh_on_read "
            f"{str(st.refresh_on_read).lower()}) has no engine setting"
        )
    if sc.cache.prefix.enabled and sc.cache.prefix.capacity_tokens is not None:
        notes.add(
            f"cache.prefix.capacity_tokens {sc.cache.prefix.capacity_tokens}: the engines' "
            "prefix caches are sized by the KV pool"
        )
    if model.swa_slot_bytes > 0:
        sw = sc.cache.swa
        notes.add(
            f"cache.swa (host_fraction {sw.host_fraction:g}, vlan_gbps {sw.vlan_gbps:g}): "
            "where SWA slots live between requests is the engine's"
        )
    adm = sc.policies.admission
    if adm.policy != "none":
        notes.add(
            f"policies.admission {adm.policy}: no engine or router setting rejects by "
            "predicted wait or prefill queue length"
        )


def _simulator_only_line() -> str:
    return (
        "# simulator only (steer the simulation, not a deployment): seed, workload, slo, "
        "planner, compare_api, prices, cost_model, sim, faults, policies.expert_imbalance, "
        "policies.eplb.imbalance/load/benchmark, pools.decode.ideal_balance"
    )


def _kv_dtype(engine: Engine, model: ModelSpec, notes: Notes) -> str | None:
    dtype = model.precision.kv_main
    table = {
        "sglang": {"bf16": "bf16", "fp8": "fp8_e4m3", "mxfp8": "mxfp8", "nvfp4": "nvfp4"},
        "vllm": {"bf16": "bfloat16", "fp16": "float16", "fp8": "fp8", "nvfp4": "nvfp4"},
    }[engine]
    if dtype not in table:
        notes.add(f"model {model.name}: KV cache dtype {dtype} has no {engine} --kv-cache-dtype")
        return None
    return table[dtype]


def _engram_host(model: ModelSpec) -> bool | None:
    """Whether the model's n-gram (engram) tables stay in host memory; None without them."""
    if model.ngram_memory.params_b <= 0:
        return None
    return model.ngram_memory.location == "host"


# ---- SGLang ------------------------------------------------------------------------------------


def _is_v41(model: ModelSpec) -> bool:
    ck = checkpoint_of(model)
    return ck is not None and ck.model_type == "deepseek_v41"


def sglang_flags(
    sc: Scenario, s: PoolShape, model: ModelSpec, spec: Speculation | None, notes: Notes
) -> list[Arg]:
    """What SGLang sets of one pool's servers, wherever they are started (no ports, nodes)."""
    v41 = _is_v41(model)
    pool = f"pools.{s.role}"
    args = [
        _arg(
            "--tp", s.gpus, "--attn-dp-size", s.dp,
            why=f"{pool}.ep {s.gpus} GPUs, tp {s.tp}: {_n(s.dp, 'attention-DP rank')}",
        )
    ]  # fmt: skip
    dspark_dp = spec is not None and spec.drafter == "dspark" and s.dp > 1
    replay_dp = v41 and sc.cache.swa.mode == "bounded" and s.dp > 1
    if s.expert_width > 1:
        args.append(
            _arg(
                "--ep", s.expert_width,
                why=f"{pool}.moe_tp {s.moe_tp}: experts over {s.expert_width} GPUs",
            )
        )  # fmt: skip
        if s.moe_tp > 1:
            notes.add(
                f"{pool}.moe_tp {s.moe_tp}: SGLang's DeepEP spans the whole server, so experts "
                f"EP{s.expert_width} x TP{s.moe_tp} run on its built-in MoE all-to-all"
            )
        elif dspark_dp or replay_dp:
            why = "DSpark" if dspark_dp else "DeepSeek-V4.1 decoder SWA bounded replay"
            args.append(_arg("--moe-a2a-backend", "none", why=f"{why} under attention DP"))
            notes.add(
                f"{pool}: DeepEP not used: SGLang {CHECKED_AGAINST['sglang']} runs {why} under "
                "attention DP only with its built-in MoE all-to-all (none) or megamoe"
            )
        else:
            args.append(_arg("--moe-a2a-backend", "deepep", why="whole experts: DeepEP"))
    if s.redundant_experts and s.expert_width > 1:
        args.append(
            _arg(
                "--ep-num-redundant-experts", s.redundant_experts,
                why=f"{pool} redundant expert slots of one server",
            )
        )  # fmt: skip
    if s.eplb.policy == "eplb" and s.expert_width > 1:
        args.append(
            _arg(
                "--enable-eplb",
                "--eplb-rebalance-num-iterations", s.eplb.period_steps,
                "--expert-distribution-recorder-buffer-size", s.eplb.window_steps,
                why=f"policies.eplb.{_eplb_key(s)}: period_steps, window_steps",
            )
        )  # fmt: skip
    if s.two_batch_overlap:
        if v41:
            notes.add(
                f"{pool}.two_batch_overlap: SGLang {CHECKED_AGAINST['sglang']} serves "
                "DeepSeek-V4.1 without two-batch overlap"
            )
        else:
            args.append(_arg("--enable-two-batch-overlap", why=f"{pool}.two_batch_overlap"))
    if s.max_tokens_per_step is not None:
        if s.whole_prompts:
            args.append(_arg("--chunked-prefill-size", -1, why=f"{pool}.scheduler whole"))
            notes.add(
                f"{pool}.max_tokens_per_step {s.max_tokens_per_step} with scheduler whole: "
                "SGLang's prefill batch budget (--max-prefill-tokens) is left at its default"
            )
            if s.role == "aggregated":
                notes.add(
                    f"{pool}.scheduler whole: SGLang mixes prompts into decode steps only "
                    "when it chunks them (--enable-mixed-chunk); whole prompts get steps of "
                    "their own (scheduler prefill_first)"
                )
        else:
            args.append(
                _arg(
                    "--chunked-prefill-size", s.max_tokens_per_step * s.dp,
                    why=f"{pool}.max_tokens_per_step {s.max_tokens_per_step} per DP rank "
                    f"x {s.dp}",
                )
            )  # fmt: skip
    if s.mixed:
        args.append(
            _arg("--enable-mixed-chunk", why=f"{pool}.scheduler: chunks ride in decode steps")
        )
    if s.max_seqs_per_rank is not None:
        args.append(
            _arg(
                "--max-running-requests", s.max_seqs_per_rank * s.dp,
                "--cuda-graph-max-bs-decode", s.max_seqs_per_rank,
                why=f"{pool}.max_seqs_per_rank {s.max_seqs_per_rank} x {_n(s.dp, 'DP rank')}",
            )
        )  # fmt: skip
    args += _sglang_balance(sc, s, notes)
    dtype = _kv_dtype("sglang", model, notes)
    if dtype is not None:
        why = f"model precision.kv_main {model.precision.kv_main}"
        args.append(_arg("--kv-cache-dtype", dtype, why=why))
    args += _sglang_cache(sc, s, v41)
    args += _sglang_speculation(s, spec, v41, dspark_dp, notes)
    return args


def _eplb_key(s: PoolShape) -> str:
    return "prefill" if s.role == "prefill" else "decode"


def _sglang_balance(sc: Scenario, s: PoolShape, notes: Notes) -> list[Arg]:
    """How a decode (or aggregated) server spreads requests over its DP ranks."""
    if s.role == "prefill" or s.dp <= 1:
        return []
    balancer = sc.policies.decode_balancer
    method = {"least_requests": "total_requests", "round_robin": "round_robin"}.get(balancer)
    if method is None:
        notes.add(
            f"policies.decode_balancer {balancer} (long_request_tokens "
            f"{sc.policies.long_request_tokens}) within a server: no SGLang DP balancing "
            "method counts long and short requests apart; its default is used"
        )
        return []
    return [_arg("--load-balance-method", method, why=f"policies.decode_balancer {balancer}")]


def _sglang_cache(sc: Scenario, s: PoolShape, v41: bool) -> list[Arg]:
    out = []
    if not sc.cache.prefix.enabled:
        out.append(_arg("--disable-radix-cache", why="cache.prefix.enabled false"))
    elif sc.pools.storage.nodes and s.role in ("prefill", "aggregated"):
        out.append(
            _arg(
                "--enable-hierarchical-cache", "--hicache-storage-backend", "hf3fs",
                why=f"pools.storage: prefix KV in 3FS ({sc.pools.storage.nodes} nodes)",
            )
        )  # fmt: skip
    if v41 and s.role in ("prefill", "aggregated"):
        mode = sc.cache.swa.mode
        flag = (
            "--enable-decoder-swa-bounded-replay"
            if mode == "bounded"
            else "--no-enable-decoder-swa-bounded-replay"
        )
        out.append(_arg(flag, why=f"cache.swa.mode {mode}"))
    return out


def _sglang_speculation(
    s: PoolShape, spec: Speculation | None, v41: bool, dspark_dp: bool, notes: Notes
) -> list[Arg]:
    if spec is None:
        return []
    why = f"policies.speculative: {_n(spec.tokens, 'draft')} ({spec.drafter} drafter)"
    if spec.drafter == "mtp":
        if spec.dynamic:
            notes.add(
                "policies.speculative.policy dspark with an MTP drafter: SGLang verifies every "
                "draft (EAGLE); the confidence truncation is not expressible"
            )
        return [
            _arg(
                "--speculative-algorithm", "EAGLE",
                "--speculative-num-steps", spec.tokens,
                "--speculative-eagle-topk", 1,
                "--speculative-num-draft-tokens", spec.tokens + 1,
                why=why,
            )
        ]  # fmt: skip
    out = [
        _arg(
            "--speculative-algorithm", "DSPARK",
            "--speculative-dspark-block-size", spec.tokens,
            why=why,
        )
    ]  # fmt: skip
    if dspark_dp:
        out.append(_arg("--enable-dp-lm-head", why="DSpark under attention DP needs it"))
    if spec.dynamic and v41 and s.role == "decode":
        notes.add(
            f"policies.speculative.policy dspark: SGLang {CHECKED_AGAINST['sglang']} runs "
            "DeepSeek-V4.1 DSpark under PD disaggregation only with static verify "
            "(SGLANG_RAGGED_VERIFY_MODE=static, its default): every draft is verified"
        )
    elif spec.dynamic and s.role != "prefill":
        notes.add(
            "policies.speculative.policy dspark: SGLang truncates drafts with an SPS cost table "
            "profiled offline (--speculative-dspark-sps-table-path, SGLANG_RAGGED_VERIFY_MODE="
            "cap-accept or compact); without one it verifies every draft"
        )
    return out


def _sglang_server(
    sc: Scenario, s: PoolShape, model: ModelSpec, spec: Speculation | None, notes: Notes
) -> Server:
    args = [
        _arg("--model-path", Sh("$MODEL"), "--trust-remote-code", why=f"model {model.name}"),
        _arg("--host", "0.0.0.0", "--port", Sh("$PORT")),
    ]
    if s.role != "aggregated":
        args.append(
            _arg(
                "--disaggregation-mode", s.role,
                "--disaggregation-transfer-backend", "nixl",
                "--disaggregation-bootstrap-port", Sh("$BOOTSTRAP_PORT"),
                why="serving: disaggregated",
            )
        )  # fmt: skip
    args += sglang_flags(sc, s, model, spec, notes)
    if s.servers_per_node > 1 and s.count > 1:
        why = f"{s.servers_per_node} servers share a node: give each BASE_GPU_ID, PORT"
        args.append(_arg("--base-gpu-id", Sh("$BASE_GPU_ID"), why=why))
    if s.nodes > 1:
        args.append(
            _arg(
                "--nnodes", s.nodes, "--node-rank", Sh("$NODE_RANK"),
                "--dist-init-addr", Sh("$HEAD:$DIST_PORT"),
                why=f"{s.gpus} GPUs over {s.nodes} nodes of {s.hardware.gpus_per_node}",
            )
        )  # fmt: skip
    return Server(
        role=_role_word(s),
        shape=s,
        program=("python3", "-m", "sglang.launch_server"),
        args=tuple(args),
        env=_sglang_env(model),
    )


def _sglang_env(model: ModelSpec) -> tuple[tuple[str, str, str], ...]:
    if not _engram_host(model):
        return ()
    why = f"model ngram_memory.location host ({model.ngram_memory.params_b:g} B params)"
    return (("SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE", "1", why),)


_SMG_POLICIES = {
    "round_robin": "round_robin",
    "least_outstanding": "least_load",
    "cache_affinity": "cache_aware",
    "least_requests": "least_load",
}
_VLLM_ROUTER_POLICIES = {"round_robin": "round_robin", "cache_affinity": "cache_aware"}


def _router_policies(sc: Scenario, table: dict[str, str], router: str, notes: Notes) -> list[Arg]:
    """The router's policy flags; a policy it has no equivalent of is a note."""
    pol = sc.policies
    pairs = [("--policy" if sc.aggregated else "--prefill-policy", "prefill_router")]
    if not sc.aggregated:
        pairs.append(("--decode-policy", "decode_balancer"))
    out = []
    for flag, key in pairs:
        policy = getattr(pol, key)
        name = table.get(policy)
        if name is not None:
            out.append(_arg(flag, name, why=f"policies.{key} {policy}"))
        elif policy == "tiered":
            t = pol.tiers
            notes.add(
                f"policies.prefill_router tiered (boundaries {list(t.boundaries)}, round_s "
                f"{t.round_s:g}): {router} has no prompt-length tiers; its default policy is used"
            )
        elif policy == "two_dim":
            notes.add(
                f"policies.decode_balancer two_dim across decode groups: {router} has no policy "
                "that counts long and short requests apart; its default is used"
            )
        else:
            notes.add(f"policies.{key} {policy}: {router} has no equivalent; its default is used")
    return out


def _router(sc: Scenario, shapes: list[PoolShape], engine: Engine, notes: Notes) -> Server | None:
    if sc.aggregated and shapes[0].count == 1:
        return None
    if engine == "sglang":
        program: tuple[str, ...] = ("smg", "launch")
        mode = "--pd-disaggregation"
        name = f"smg {CHECKED_AGAINST['smg']}"
        table = _SMG_POLICIES
    else:
        program, mode = ("vllm-router",), "--vllm-pd-disaggregation"
        name = f"vllm-router {CHECKED_AGAINST['vllm-router']}"
        table = _VLLM_ROUTER_POLICIES
    args = [] if sc.aggregated else [_arg(mode, why="serving: disaggregated")]
    args.append(Arg((Sh("${WORKERS[@]}"),), why="the servers' first nodes (*_HOSTS above)"))
    args += _router_policies(sc, table, name, notes)
    args.append(_arg("--host", "0.0.0.0", "--port", Sh("$ROUTER_PORT")))
    return Server(role="router", shape=shapes[0], program=program, args=tuple(args))


# ---- vLLM --------------------------------------------------------------------------------------


def vllm_flags(
    sc: Scenario, s: PoolShape, model: ModelSpec, spec: Speculation | None, notes: Notes
) -> list[Arg]:
    """What vLLM sets of one pool's servers, wherever they are started (no ports, nodes)."""
    pool = f"pools.{s.role}"
    args = [
        _arg(
            "--tensor-parallel-size", s.tp, "--data-parallel-size", s.dp,
            why=f"{pool}.ep {s.gpus} GPUs, tp {s.tp}: {_n(s.dp, 'data-parallel engine')}",
        )
    ]  # fmt: skip
    if s.expert_width > 1:
        args.append(_arg("--enable-expert-parallel", why=f"{pool}: experts over the GPUs"))
        a2a = {"prefill": "deepep_high_throughput", "decode": "deepep_low_latency"}
        if s.moe_tp > 1:
            notes.add(
                f"{pool}.moe_tp {s.moe_tp}: vLLM's expert parallelism spans all {s.gpus} GPUs "
                f"(TP x DP): experts EP{s.expert_width} x TP{s.moe_tp} are not expressible"
            )
        elif s.role in a2a:
            args.append(_arg("--all2all-backend", a2a[s.role], why="whole experts: DeepEP"))
        if s.eplb.policy == "eplb":
            eplb = {
                "window_size": s.eplb.window_steps,
                "step_interval": s.eplb.period_steps,
                "num_redundant_experts": s.redundant_experts,
            }
            args.append(
                _arg(
                    "--enable-eplb", "--eplb-config", _json(eplb),
                    why=f"policies.eplb.{_eplb_key(s)}, {pool} redundant experts",
                )
            )  # fmt: skip
        elif s.redundant_experts:
            notes.add(
                f"{pool}: {s.redundant_experts} redundant experts with policies.eplb."
                f"{_eplb_key(s)}.policy static: vLLM places redundant experts only with EPLB"
            )
    if s.two_batch_overlap:
        args.append(_arg("--enable-dbo", why=f"{pool}.two_batch_overlap (dual-batch overlap)"))
    if s.role == "aggregated" and s.scheduler == "prefill_first":
        notes.add(
            f"{pool}.scheduler prefill_first: vLLM's scheduler puts prefill chunks into the "
            "decode steps (as scheduler tokens)"
        )
    if s.max_tokens_per_step is not None:
        if s.whole_prompts:
            args.append(_arg("--no-enable-chunked-prefill", why=f"{pool}.scheduler whole"))
        args.append(
            _arg(
                "--max-num-batched-tokens", s.max_tokens_per_step,
                why=f"{pool}.max_tokens_per_step (per DP engine)",
            )
        )  # fmt: skip
    if s.max_seqs_per_rank is not None:
        why = f"{pool}.max_seqs_per_rank (per DP engine)"
        args.append(_arg("--max-num-seqs", s.max_seqs_per_rank, why=why))
    dtype = _kv_dtype("vllm", model, notes)
    if dtype is not None:
        why = f"model precision.kv_main {model.precision.kv_main}"
        args.append(_arg("--kv-cache-dtype", dtype, why=why))
    if not sc.cache.prefix.enabled:
        args.append(_arg("--no-enable-prefix-caching", why="cache.prefix.enabled false"))
    engram = _engram_host(model)
    if engram is not None:
        why = f"model ngram_memory.location {model.ngram_memory.location}"
        args.append(_arg("--engram-config", _json({"cpu_offload": engram}), why=why))
    if spec is not None and s.role != "prefill":  # vLLM drafts on the decode side only
        config: dict[str, Any] = {"method": spec.drafter, "num_speculative_tokens": spec.tokens}
        if spec.dynamic and spec.drafter == "dspark":
            config["enable_adaptive_verification"] = True
        elif spec.dynamic:
            notes.add(
                "policies.speculative.policy dspark with an MTP drafter: vLLM's adaptive "
                "verification is DSpark's only; every draft is verified"
            )
        why = f"policies.speculative: {_n(spec.tokens, 'draft')} ({spec.drafter} drafter)"
        args.append(_arg("--speculative-config", _json(config), why=why))
    if s.role == "prefill" and sc.cache.prefix.enabled and sc.pools.storage.nodes:
        notes.add(
            "pools.storage: vLLM would read prefix KV from 3FS through its hf3fs KV connector "
            "beside NIXL (a MultiConnector): not emitted"
        )
    if s.dp > 1 and s.role != "prefill" and sc.policies.decode_balancer != "least_requests":
        notes.add(
            f"policies.decode_balancer {sc.policies.decode_balancer} within a server: vLLM "
            "balances its DP engines by their load (no setting)"
        )
    return args


def _vllm_server(
    sc: Scenario, s: PoolShape, model: ModelSpec, spec: Speculation | None, notes: Notes
) -> Server:
    args = [
        _arg("--trust-remote-code", why=f"model {model.name}"),
        _arg("--host", "0.0.0.0", "--port", Sh("$PORT")),
    ]
    if s.role != "aggregated":
        args.append(
            _arg(
                "--kv-transfer-config", _json(_nixl(s.role)),
                why="serving: disaggregated (NIXL P->D transfer)",
            )
        )  # fmt: skip
    args += vllm_flags(sc, s, model, spec, notes)
    node_lines: list[str] = []
    gpn = s.hardware.gpus_per_node
    if s.nodes > 1 and s.tp <= gpn:
        local = gpn // s.tp
        args.append(
            _arg(
                "--data-parallel-size-local", local,
                "--data-parallel-address", Sh("$HEAD"),
                "--data-parallel-rpc-port", Sh("$DP_RPC_PORT"),
                why=f"{s.dp} DP engines over {s.nodes} nodes, {local} per node",
            )
        )  # fmt: skip
        node_lines.append(
            "if (( NODE_RANK > 0 )); then args+=(--headless --data-parallel-start-rank "
            f'"$((NODE_RANK * {local}))"); fi'
        )
    elif s.nodes > 1:  # one engine's TP spans nodes
        args.append(
            _arg(
                "--nnodes", s.nodes, "--node-rank", Sh("$NODE_RANK"), "--master-addr", Sh("$HEAD"),
                why=f"TP{s.tp} over {s.nodes} nodes of {gpn}",
            )
        )  # fmt: skip
        node_lines.append("if (( NODE_RANK > 0 )); then args+=(--headless); fi")
        if s.dp > 1:
            notes.add(
                f"pools.{s.role}: data parallelism over engines whose TP spans nodes: vLLM's "
                "multi-node DP flags assume an engine within a node; start one server per engine"
            )
    if s.servers_per_node > 1 and s.count > 1:
        notes.add(
            f"pools.{s.role}: {s.servers_per_node} servers share a node: start each with its "
            "own CUDA_VISIBLE_DEVICES and PORT"
        )
    return Server(
        role=_role_word(s),
        shape=s,
        program=("vllm", "serve", Sh("$MODEL")),
        args=tuple(args),
        node_lines=tuple(node_lines),
    )


def _nixl(role: Role) -> dict[str, str]:
    """vLLM's NIXL connector: prefill produces KV, decode consumes it (Dynamo's and SMG's
    spelling)."""
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
    }


# ---- the scripts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    """One pool's servers (or the router) in a script: the role word, the program, its flags,
    what is set in the environment and the shell lines that add per-node flags."""

    role: str
    shape: PoolShape
    program: tuple[str, ...]
    args: tuple[Arg, ...]
    env: tuple[tuple[str, str, str], ...] = ()  # (name, value, why)
    node_lines: tuple[str, ...] = ()


def _role_word(s: PoolShape) -> str:
    return "server" if s.role == "aggregated" else s.role


@dataclass(frozen=True)
class Script:
    """One engine's launch lines for a scenario, and what it cannot express of it."""

    engine: Engine
    model: ModelSpec
    servers: tuple[Server, ...]
    router: Server | None
    notes: tuple[str, ...]


def engine_script(sc: Scenario, engine: Engine, base_dir: Path | None = None) -> Script:
    model = load_model(sc.model, base_dir)
    shapes = pool_shapes(sc, base_dir)
    notes = Notes()
    if checkpoint_of(model) is None:
        notes.add(
            f"model {model.name}: no published checkpoint known to deepinfer-sim: set MODEL "
            "to the Hugging Face repo or path that serves it"
        )
    spec = speculation(sc, model, notes)
    build = _sglang_server if engine == "sglang" else _vllm_server
    servers = tuple(build(sc, s, model, spec, notes) for s in shapes)
    router = _router(sc, shapes, engine, notes)
    _common_notes(sc, model, shapes, notes)
    return Script(engine, model, servers, router, tuple(notes.lines))


def _model_default(model: ModelSpec) -> str:
    ck = checkpoint_of(model)
    return ck.repo if ck is not None else model.name


def render_script(sc: Scenario, script: Script) -> str:
    """The bash text of one engine's script."""
    engine, model = script.engine, script.model
    checked = (
        f"sglang {CHECKED_AGAINST['sglang']} (servers), smg {CHECKED_AGAINST['smg']} (router)"
        if engine == "sglang"
        else f"vllm {CHECKED_AGAINST['vllm']} (servers), vllm-router "
        f"{CHECKED_AGAINST['vllm-router']} (router)"
    )
    roles = [s.role for s in script.servers] + ([script.router.role] if script.router else [])
    about = f": {sc.description}" if sc.description else ""
    out = [
        "#!/usr/bin/env bash",
        f"# {engine} launch lines for scenario {sc.name!r}{about}",
        "# Written by `deepinfer-sim launch` from the resolved scenario (planner/launch.py).",
        f"# Flags checked against {checked}: every line parses with the engine's own parser.",
        "#",
        *(f"# {s.shape.summary()}" for s in script.servers),
        "#",
        f"# Usage: {engine}.sh {'|'.join(roles)}",
        "#   Run a server role on every node of each of its servers; a server over several",
        "#   nodes needs NODE_RANK (0 on its first node) and HEAD (its first node's address).",
        "#   The router reaches the servers' first nodes, listed in the *_HOSTS variables.",
        "#   DRY_RUN=1 prints the command instead of running it.",
        "#",
        *(f"# not expressed: {line}" for line in script.notes),
        _simulator_only_line(),
        "set -euo pipefail",
        "",
        f"MODEL=${{MODEL:-{_model_default(model)}}}  # model {model.name}",
        "PORT=${PORT:-30000}",
        "ROUTER_PORT=${ROUTER_PORT:-8000}",
        "NODE_RANK=${NODE_RANK:-0}",
        "HEAD=${HEAD:-127.0.0.1}",
    ]
    if engine == "sglang":
        out += [
            "BOOTSTRAP_PORT=${BOOTSTRAP_PORT:-8998}",
            "DIST_PORT=${DIST_PORT:-5000}",
            "BASE_GPU_ID=${BASE_GPU_ID:-0}",
        ]
    else:
        out.append("DP_RPC_PORT=${DP_RPC_PORT:-13345}")
    out += [_hosts_line(s.shape) for s in script.servers]
    out += [
        "",
        "run() {",
        "  if [[ -n \"${DRY_RUN:-}\" ]]; then printf '%q ' \"$@\"; printf '\\n'; "
        'else exec "$@"; fi',
        "}",
        "",
        'case "${1:-}" in',
    ]
    for server in script.servers:
        out += _case(server)
    if script.router is not None:
        out += _case(script.router, _workers_lines(engine, script.servers))
    out += [
        "  *)",
        f'    echo "usage: $0 {"|".join(roles)}" >&2',
        "    exit 2",
        "    ;;",
        "esac",
        "",
    ]
    return "\n".join(out)


_HOSTS = {"prefill": "PREFILL_HOSTS", "decode": "DECODE_HOSTS", "aggregated": "SERVER_HOSTS"}


def _hosts_line(s: PoolShape) -> str:
    name, word = _HOSTS[s.role], _role_word(s)
    hosts = f"$(seq -s ' ' -f '{word}-%g' 0 {s.count - 1})"
    return f"{name}=${{{name}:-{hosts}}}  # the first node of each of the {s.count}"


def _workers_lines(engine: Engine, servers: tuple[Server, ...]) -> list[str]:
    """Shell lines that fill WORKERS with the router's server flags, from the host lists."""
    lines = ["WORKERS=()"]
    for server in servers:
        role = server.shape.role
        if role == "prefill":
            bootstrap = ' "$BOOTSTRAP_PORT"' if engine == "sglang" else ""
            add = f'--prefill "http://$h:$PORT"{bootstrap}'
        elif role == "decode":
            add = '--decode "http://$h:$PORT"'
        else:
            lines[0] = "WORKERS=(--worker-urls)"
            add = '"http://$h:$PORT"'
        lines.append(f"for h in ${_HOSTS[role]}; do WORKERS+=({add}); done")
    return lines


def _case(server: Server, before: Iterable[str] = ()) -> list[str]:
    s = server.shape
    if server.role == "router":
        what = "the router"
    else:
        what = f"{s.count} x {s.gpus} GPUs" + (f", {s.nodes} nodes each" if s.nodes > 1 else "")
    lines = [f"  {server.role})  # {what}"]
    lines += [f"    {line}" for line in before]
    lines += [f"    export {n}={shlex.quote(v)}  # {why}" for n, v, why in server.env]
    lines.append("    args=(")
    for arg in server.args:
        text = " ".join(_word(w) for w in arg.words)
        lines.append(f"      {text}" + (f"  # {arg.why}" if arg.why else ""))
    lines.append("    )")
    lines += [f"    {line}" for line in server.node_lines]
    program = " ".join(_word(w) for w in server.program)
    lines += [f'    run {program} "${{args[@]}}"', "    ;;"]
    return lines


def sglang_script(sc: Scenario, base_dir: Path | None = None) -> str:
    return render_script(sc, engine_script(sc, "sglang", base_dir))


def vllm_script(sc: Scenario, base_dir: Path | None = None) -> str:
    return render_script(sc, engine_script(sc, "vllm", base_dir))


# ---- Dynamo ------------------------------------------------------------------------------------

DYNAMO_BOOTSTRAP_PORT = "12345"  # the SGLang templates' --disaggregation-bootstrap-port
DYNAMO_AGG_WORKER = {"sglang": "decode", "vllm": "worker"}
"""An aggregated worker's component name, as Dynamo's planner looks it up
(dynamo/planner/config/backend_components.py: SGLang has no aggregated name of its own)."""


def dynamo_manifest(sc: Scenario, backend: Engine = "sglang", base_dir: Path | None = None) -> str:
    """A ``DynamoGraphDeployment`` (nvidia.com/v1beta1) of ``sc`` with ``backend`` workers, in the
    shape of ai-dynamo's own profiler templates (``dynamo/profiler/templates/dgd/<backend>/``):
    a frontend, then one worker component per pool with its replicas, GPUs per pod and, for a
    server over several nodes, ``multinode.nodeCount`` (the operator adds the node flags)."""
    model = load_model(sc.model, base_dir)
    shapes = pool_shapes(sc, base_dir)
    notes = Notes()
    if checkpoint_of(model) is None:
        notes.add(f"model {model.name}: no published checkpoint known: set the --model args")
    spec = speculation(sc, model, notes)
    repo = _model_default(model)
    image = DYNAMO_IMAGES[backend]
    frontend = ["-m", "dynamo.frontend"]
    policy = sc.policies.prefill_router
    if policy == "cache_affinity":
        frontend += ["--router-mode", "kv"]
    elif policy != "round_robin":
        notes.add(
            f"policies.prefill_router {policy}: Dynamo's frontend routes round-robin (its "
            "default, used) or by KV overlap (--router-mode kv)"
        )
    components: list[dict[str, Any]] = [
        {
            "name": "Frontend",
            "type": "frontend",
            "replicas": 1,
            "podTemplate": {"spec": {"containers": [_container(image, ["python3"], frontend)]}},
        }
    ]
    storage = f"{max(2, math.ceil(model.weight_bytes_per_gpu(1) * 1.1 / 2**30))}Gi"
    for s in shapes:
        if backend == "sglang":
            words = _sglang_worker_args(sc, s, model, spec, repo, notes)
            container = _container(image, ["python3", "-m", "dynamo.sglang"], words)
            env = _sglang_env(model)
        else:
            words = _vllm_worker_args(sc, s, model, spec, repo, notes)
            container = _container(image, ["python3", "-m", "dynamo.vllm"], words)
            env = ()
        container["workingDir"] = f"/workspace/examples/backends/{backend}"
        if env:
            container["env"] = [{"name": n, "value": v} for n, v, _ in env]
        container["resources"] = {
            "limits": {"nvidia.com/gpu": str(s.gpus_per_pod)},
            "requests": {"ephemeral-storage": storage},
        }
        component: dict[str, Any] = {
            "name": DYNAMO_AGG_WORKER[backend] if s.role == "aggregated" else s.role,
            "type": "worker" if s.role == "aggregated" else s.role,
            "replicas": s.count,
        }
        if s.nodes > 1:
            component["multinode"] = {"nodeCount": s.nodes}
        component["podTemplate"] = {"spec": {"containers": [container]}}
        components.append(component)
    _common_notes(sc, model, shapes, notes)
    body = yaml.safe_dump(
        {
            "apiVersion": "nvidia.com/v1beta1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": _k8s_name(sc.name)},
            "spec": {"components": components},
        },
        sort_keys=False,
        width=1000,
    )
    mode = "agg" if sc.aggregated else "disagg"
    header = [
        f"# Dynamo DynamoGraphDeployment for scenario {sc.name!r} ({backend} workers)",
        "# Written by `deepinfer-sim launch` from the resolved scenario (planner/launch.py).",
        f"# Shaped after ai-dynamo {CHECKED_AGAINST['ai-dynamo']}'s profiler template "
        f"dgd/{backend}/{mode}.yaml and checked against it; worker args checked with "
        f"{backend} {CHECKED_AGAINST[backend]}'s parser.",
        "# Multinode workers: Dynamo's operator adds the node flags (SGLang --nnodes, "
        "--node-rank, --dist-init-addr; vLLM the data-parallel address, local size, RPC port "
        "and start rank).",
        "# ephemeral-storage: the checkpoint's weights as deepinfer-sim counts them, + 10 %.",
        *(f"# {s.summary()}" for s in shapes),
        *(f"# not expressed: {line}" for line in notes.lines),
        _simulator_only_line(),
    ]
    return "\n".join(header) + "\n" + body


def _container(image: str, command: list[str], args: list[str]) -> dict[str, Any]:
    return {
        "name": "main",
        "image": image,
        "command": command,
        "args": args,
        "envFrom": [{"secretRef": {"name": "hf-token-secret"}}],
    }


def _words(args: Iterable[Arg]) -> list[str]:
    return [w for arg in args for w in arg.words]


def _sglang_worker_args(
    sc: Scenario, s: PoolShape, model: ModelSpec, spec: Speculation | None, repo: str, notes: Notes
) -> list[str]:
    words = ["--model-path", repo, "--served-model-name", repo, "--trust-remote-code"]
    if s.role != "aggregated":
        words += [
            "--disaggregation-mode", s.role,
            "--disaggregation-transfer-backend", "nixl",
            "--disaggregation-bootstrap-port", DYNAMO_BOOTSTRAP_PORT,
        ]  # fmt: skip
    words += _words(sglang_flags(sc, s, model, spec, notes))
    return [*words, "--host", "0.0.0.0"]


def _vllm_worker_args(
    sc: Scenario, s: PoolShape, model: ModelSpec, spec: Speculation | None, repo: str, notes: Notes
) -> list[str]:
    words = ["--model", repo, "--served-model-name", repo, "--trust-remote-code"]
    if s.role != "aggregated":
        words += ["--disaggregation-mode", s.role, "--kv-transfer-config", _json(_nixl(s.role))]
    return words + _words(vllm_flags(sc, s, model, spec, notes))


def _k8s_name(name: str) -> str:
    """A DNS-1123 label from a scenario name (lowercase alphanumerics and '-', at most 63)."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-")
    return label or "deepinfer-sim"


# ---- the files ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchFiles:
    """The three files' texts; :meth:`as_dict` keys them by file name."""

    sglang: str
    vllm: str
    dynamo: str

    def as_dict(self) -> dict[str, str]:
        return {"sglang.sh": self.sglang, "vllm.sh": self.vllm, "dynamo.yaml": self.dynamo}


def launch_files(
    sc: Scenario, *, dynamo_backend: Engine = "sglang", base_dir: Path | None = None
) -> LaunchFiles:
    """The launch files of the deployment ``sc`` describes. ``base_dir``: where the scenario's
    relative model and hardware files are (its folder)."""
    return LaunchFiles(
        sglang=sglang_script(sc, base_dir),
        vllm=vllm_script(sc, base_dir),
        dynamo=dynamo_manifest(sc, dynamo_backend, base_dir),
    )


def write_launch_files(
    sc: Scenario,
    out_dir: str | Path,
    *,
    dynamo_backend: Engine = "sglang",
    base_dir: Path | None = None,
) -> list[Path]:
    """Write ``out_dir/launch/{sglang.sh,vllm.sh,dynamo.yaml}`` (the scripts executable);
    return their paths."""
    from ..sim.results.files import write_text

    files = launch_files(sc, dynamo_backend=dynamo_backend, base_dir=base_dir)
    folder = Path(out_dir) / "launch"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.as_dict().items():
        path = folder / name
        write_text(path, text)
        if name.endswith(".sh"):
            path.chmod(0o755)
        paths.append(path)
    return paths
