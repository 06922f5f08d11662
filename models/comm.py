"""Expert-parallel all-to-all (MoE dispatch + combine) as DeepEP moves it.

Two kernel modes, as in DeepEP:

- **normal** (prefill, SWA replay): a token crosses the scale-out link once per *remote node*
  that holds one of its experts and fans out over NVLink inside that node. With node-limited
  routing (DeepSeek-V3: experts in ``expert_groups`` groups, each token confined to
  ``topk_groups`` of them) the number of nodes a token reaches is bounded by the groups it may
  use, so at EP32 on H800 a V3 token crosses InfiniBand ~2.4 times, not top-k = 8 times.
- **low latency** (decode): every (token, expert) copy is written straight to the expert's GPU
  (pure RDMA, no forwarding); copies inside the sender's scale-up domain use the scale-up link.

Per MoE layer and per exchange (dispatch, then combine) a rank spends a latency plus the larger
of its scale-out and scale-up transfer times at the mode's achieved bandwidth (a share of the
datasheet link); the normal kernels also hold a share of the SMs while they run, which the
compute beside them loses (``StepCost.compose``). Expected node and GPU counts come from drawing
a token's experts uniformly
without replacement from the groups it may use (an upper bound on spread: real gating is
correlated). All O(1) per call.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from ..validation import FrozenModel
from .hardware import HardwareSpec
from .spec import ModelSpec, dtype_bytes

Phase = Literal["prefill", "decode", "replay"]
PHASE_MODE: dict[Phase, str] = {"prefill": "normal", "replay": "normal", "decode": "low_latency"}


class AllToAllParams(FrozenModel):
    """Achieved bandwidth (share of the datasheet link) and latency per exchange of DeepEP's two
    kernel modes. Defaults: DeepEP's README (H800, NVLink ~160 GB/s achievable, CX7 400 Gb/s
    InfiniBand ~50 GB/s), V3 shapes, FP8 dispatch and BF16 combine."""

    normal_scaleup_efficiency: float = Field(
        0.77, gt=0, le=1.5, description="intranode EP8: 153-158 GB/s of H800's 200 GB/s per dir"
    )
    normal_scaleout_efficiency: float = Field(
        1.0,
        gt=0,
        le=1.5,
        description="internode EP16/32/64: 43/58/51 GB/s per 50 GB/s NIC (node-deduplicated bytes)",
    )
    low_latency_scaleout_efficiency: float = Field(
        0.78, gt=0, le=1.5, description="EP128/256, 128 tokens: 39-40 GB/s per 50 GB/s NIC"
    )
    low_latency_scaleup_efficiency: float = Field(
        0.57,
        gt=0,
        le=1.5,
        description="EP8 in one node: 98 (FP8 dispatch) / 127 (BF16 combine) GB/s of 200, "
        "byte-weighted",
    )
    latency_s: float | None = Field(
        None, ge=0, description="per exchange; default: the datasheet latency of the links used"
    )
    normal_sm_share: float = Field(
        0.15,
        ge=0,
        lt=1,
        description="share of the GPU's SMs the normal kernels hold while they run, taken from "
        "compute that overlaps them (DeepEP Buffer.num_sms default 20 of H800's 132 SMs)",
    )
    low_latency_sm_share: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="the same for the low-latency kernels: 0, their hook-based receive holds no "
        "SM (DeepEP README)",
    )
    normal_permute_memory_efficiency: float = Field(
        0.88,
        gt=0,
        le=1,
        description="share of HBM bandwidth at which the engine permutes the rows the normal "
        "kernels deliver (into expert order before the experts, weighted back per token after): "
        "the copy bandwidth measured on the H200, 4.22 of 4.8 TB/s",
    )


def _comb_ratio(n: float, m: float, k: int) -> float:
    """C(n − m, k) / C(n, k): no draw of k out of n (without replacement) hits a set of m."""
    if k <= 0:
        return 1.0
    if n - m < k:
        return 0.0
    ratio = 1.0  # Γ(x + 1) / Γ(x − k + 1) = x(x − 1)…(x − k + 1), for x = n − m and x = n
    for i in range(k):
        ratio *= (n - m - i) / (n - i)
    return ratio


def routing_spread(model: ModelSpec, ep: int, domain_gpus: int) -> tuple[float, float, float]:
    """(remote nodes, GPUs in the sender's node, GPUs elsewhere) one token's experts reach on
    average, for ``ep`` ranks in scale-up domains of ``domain_gpus``."""
    moe = model.moe
    k, E = moe.top_k, moe.routed_experts
    G = moe.expert_groups
    M = moe.topk_groups or G
    nodes = max(1, math.ceil(ep / domain_gpus))
    per_node = min(ep, domain_gpus)
    if nodes > 1 and M < G and G % nodes == 0:
        # whole groups per node: a node is missed when none of the token's M groups is on it
        miss = _comb_ratio(G, G // nodes, M)
    else:
        miss = _comb_ratio(E, E / nodes, k)
    remote_nodes = (nodes - 1) * (1 - miss)
    # GPUs: the token's experts lie in M/G of the experts (its groups), spread over the ranks
    eligible = E * M / G
    per_gpu = E / ep
    gpu_miss = _comb_ratio(eligible, per_gpu, k)
    gpus = ep * M / G * (1 - gpu_miss)
    local_gpus = gpus * per_node / ep
    return remote_nodes, local_gpus, gpus - local_gpus


class AllToAll:
    """EP dispatch + combine time per step over all MoE layers of a phase."""

    __slots__ = (
        "_bw",
        "_bytes",
        "_latency",
        "_layers",
        "_permute_s",
        "_sm_share",
        "dispatch_share",
        "ep",
    )

    def __init__(
        self,
        model: ModelSpec,
        hw: HardwareSpec,
        ep: int,
        params: AllToAllParams | None = None,
        scaleup_efficiency: float | None = None,
        latency_s: float | None = None,
    ) -> None:
        """``scaleup_efficiency`` / ``latency_s``: a measured scale-up exchange (a calibration
        profile's) in place of the parameters' for the links inside a node."""
        p = params or AllToAllParams()
        self.ep = ep
        dispatch = dtype_bytes(model.precision.activations_dispatch)
        combine = dtype_bytes(model.precision.activations_combine)
        payload = model.hidden * (dispatch + combine)  # one token-copy's dispatch + combine bytes
        # the dispatch's share of an exchange (by bytes: FP8 out, BF16 back gives 1/3; DeepEP's
        # EP128 low-latency kernels: 192 of 192 + 369 µs)
        self.dispatch_share = dispatch / (dispatch + combine)
        remote_nodes, local_gpus, remote_gpus = routing_spread(model, ep, hw.scaleup.domain_gpus)
        k = model.moe.top_k
        per_node = min(ep, hw.scaleup.domain_gpus)
        # expert copies by where the expert sits: the sender's node (self included) or elsewhere
        copies_local = k * per_node / ep
        copies_remote = k - copies_local
        self_share = 1.0 / per_node
        up, out = hw.scaleup.bytes_per_s_per_dir, hw.scaleout.bytes_per_s
        up_normal = up * (scaleup_efficiency or p.normal_scaleup_efficiency)
        up_ll = up * (scaleup_efficiency or p.low_latency_scaleup_efficiency)
        # (scale-out bytes, scale-up bytes) per token of a rank, both exchanges
        self._bytes = {
            # normal: once per remote node over the NIC; forwarded and local copies over NVLink
            # (one per GPU reached, less the sender's own)
            "normal": (
                remote_nodes * payload,
                (local_gpus + remote_gpus) * (1 - self_share) * payload,
            ),
            # low latency: every copy goes straight to its expert's GPU
            "low_latency": (copies_remote * payload, copies_local * (1 - self_share) * payload),
        }
        self._bw = {
            "normal": (out * p.normal_scaleout_efficiency, up_normal),
            "low_latency": (out * p.low_latency_scaleout_efficiency, up_ll),
        }
        spans_nodes = ep > hw.scaleup.domain_gpus
        link_latency = hw.scaleout.latency_s if spans_nodes else hw.scaleup.latency_s
        lat = latency_s if latency_s is not None else p.latency_s
        self._latency = 2 * (link_latency if lat is None else lat)  # dispatch and combine
        self._layers = {ph: model.moe_layer_count(ph) for ph in PHASE_MODE}
        self._sm_share = {"normal": p.normal_sm_share, "low_latency": p.low_latency_sm_share}
        # The normal kernels deliver each token once per GPU it reaches, in arrival order; the
        # engine writes one row per (token, local expert) in expert order (read the token, write
        # the row) and, after the experts, reads the rows back and writes their weighted sum per
        # token: (rows + tokens received) × payload through HBM — per token sent, k rows and one
        # arrival per GPU it reaches. The low-latency kernels write the expert layout and sum the
        # rows themselves.
        permute_bw = hw.hbm_bytes_per_s * p.normal_permute_memory_efficiency
        self._permute_s = {
            "normal": (k + local_gpus + remote_gpus) * payload / permute_bw if ep > 1 else 0.0,
            "low_latency": 0.0,
        }

    def time(self, tokens_per_rank: float, phase: Phase) -> float:
        if self.ep <= 1 or tokens_per_rank <= 0:
            return 0.0
        mode = PHASE_MODE[phase]
        out_b, up_b = self._bytes[mode]
        bw_out, bw_up = self._bw[mode]
        transfer = tokens_per_rank * max(out_b / bw_out, up_b / bw_up)
        return (self._latency + transfer) * self._layers[phase]

    def packed(self, phase: Phase) -> tuple[int, float, float, int, float, float, float]:
        """The phase's exchange as plain numbers for a compiled step: (EP width, latency per
        layer, seconds per token per layer, layers, permute seconds per token per layer, SM
        share, dispatch share) — :meth:`time` is (latency + tokens × per token) × layers."""
        mode = PHASE_MODE[phase]
        (out_b, up_b), (bw_out, bw_up) = self._bytes[mode], self._bw[mode]
        return (
            self.ep,
            self._latency,
            max(out_b / bw_out, up_b / bw_up),
            self._layers[phase],
            self._permute_s[mode],
            self._sm_share[mode],
            self.dispatch_share,
        )

    def permute_s(self, tokens_per_rank: float, phase: Phase) -> float:
        """The engine's permutes around the phase's exchanges over all MoE layers, for a rank
        receiving ``tokens_per_rank`` tokens' worth of expert rows (``k`` rows per token)."""
        if tokens_per_rank <= 0:
            return 0.0
        return tokens_per_rank * self._permute_s[PHASE_MODE[phase]] * self._layers[phase]

    def sm_share(self, phase: Phase) -> float:
        """Share of the SMs the phase's exchange takes from compute running beside it."""
        return self._sm_share[PHASE_MODE[phase]]

    def bytes_per_token(self, phase: Phase) -> tuple[float, float]:
        """(scale-out, scale-up) bytes a rank sends per token over one MoE layer's exchanges."""
        return self._bytes[PHASE_MODE[phase]]
