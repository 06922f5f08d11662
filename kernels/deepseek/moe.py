"""Routed experts of one rank with activations quantized once per token, gathered in FP8.

``MoEBlock`` (the reference) gathers bf16 token rows by expert and quantizes them inside each
grouped GEMM call with several small ops. Here the layer input is quantized once (one fused
kernel over T rows, not T·k), FP8 rows and scales are gathered, and SwiGLU is fused into the
quantization that feeds the down projection — the data flow of DeepGEMM's grouped FP8 MoE, on
``torch._scaled_grouped_mm``. Where that has no kernel (the CPU) the same quantized numbers go
through the reference's grouped bf16/float32 path ("emulated").

Each grouped GEMM runs on ``torch._scaled_grouped_mm`` or the project's Triton grouped GEMM
(``kernels/triton_grouped_gemm.py``), whichever was faster as a CUDA graph at both ends of its
row bucket when the (GEMM, experts, bucket) was first seen (``ROUTED_TIMINGS``), as an engine
picks its tuned MoE kernel per shape: torch's costs nearly as much for experts 256 columns wide as
for 1,024 (device call 33, ``validation/h200-deepseek/call33/tp_kernels.json``), the Triton one
about a quarter, so expert tensor parallelism is timed with the kernel class TP-MoE engines run.

On a GPU the combine reads each token's k rows once in a Triton kernel
(``kernels/triton_combine.py``), as engines' combine kernels do, instead of the reference's
float32 copies and atomic adds; ``DEEPINFER_COMBINE=torch`` keeps the reference's.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import torch

from .._util import decided_once, next_pow2
from ..moe import MoEBlock
from . import fp8
from .fp8 import quantize_rows

# (N, K, experts, rows bucket) -> (torch seconds, Triton seconds), summed at the bucket's ends
ROUTED_TIMINGS: dict[tuple[int, int, int, int], tuple[float, float]] = {}
# device -> does the Triton combine run there and agree with its reference
_COMBINE_OK: dict[str, bool] = {}


def triton_combine_ok(device: torch.device) -> bool:
    """Decided once per device, outside any graph capture (inside one, an undecided device
    takes the reference combine): the kernel on 300 tokens × 8 rows against its reference."""
    if os.environ.get("DEEPINFER_COMBINE") == "torch" or device.type != "cuda":
        return False
    return decided_once(_COMBINE_OK, str(device), lambda: _combine_agrees(device)) is True


def _combine_agrees(device: torch.device) -> bool:
    from ..triton_combine import combine_reference, combine_rows

    g = torch.Generator(device=device).manual_seed(5)
    y = torch.randn((2400, 1536), generator=g, device=device).to(torch.bfloat16)
    pos = torch.randperm(2400, generator=g, device=device).view(300, 8).to(torch.int32)
    w = torch.rand((300, 8), generator=g, device=device)
    try:
        got, want = combine_rows(y, pos, w).float(), combine_reference(y, pos, w).float()
    except Exception:  # no Triton, or no kernel for this GPU: the reference's
        return False
    return bool((got - want).norm() <= 1e-2 * want.norm())


class DSMoEBlock(MoEBlock):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        triton_combine_ok(self.device)  # decided here, before any graph is captured

    def _grouped(
        self, aq: torch.Tensor, a_s: torch.Tensor, which: int, offs: torch.Tensor
    ) -> torch.Tensor:
        if self.path == "scaled_grouped_mm":
            if self._triton_faster(aq, which):
                fp8.used.add("triton_grouped_gemm")
                return self._triton_gmm(aq, a_s, which, offs)
            fp8.used.add("scaled_grouped_mm")
            return self._scaled_gmm(aq, a_s, which, offs)
        a = (aq.float() * a_s.unsqueeze(-1)).to(self.dtype)
        return self._gmm(a, which, offs, "grouped_mm" if self.path == "grouped_mm" else "loop")

    def gather_rows(self, x: torch.Tensor, tok: torch.Tensor) -> Any:
        if self.dtype_mode != "fp8":
            return super().gather_rows(x, tok)
        xq, xs, _ = quantize_rows(x)  # once per token, then FP8 rows and scales gathered
        return xq[0].index_select(0, tok), xs[0].index_select(0, tok)

    def forward_experts(self, rows: Any, offs: torch.Tensor) -> torch.Tensor:
        if self.dtype_mode != "fp8":
            return super().forward_experts(rows, offs)
        aq, a_s = rows
        h = self._grouped(aq, a_s, 13, offs)
        r = h.shape[0]
        gq, gs, _ = quantize_rows(h, silu=True)
        return self._grouped(gq[0, :r], gs[0, :r], 2, offs)

    def combine(
        self,
        y: torch.Tensor,
        order: torch.Tensor,
        tok: torch.Tensor,
        topk_weights: torch.Tensor,
        t: int,
    ) -> torch.Tensor:
        if not triton_combine_ok(y.device):
            return super().combine(y, order, tok, topk_weights, t)
        from ..triton_combine import combine_rows, sorted_positions

        fp8.used.add("triton_combine")
        pos = sorted_positions(order, topk_weights.shape[1])
        return combine_rows(y, pos, topk_weights).to(self.dtype)

    def _triton_gmm(
        self, aq: torch.Tensor, a_s: torch.Tensor, which: int, offs: torch.Tensor
    ) -> torch.Tensor:
        from ..triton_grouped_gemm import grouped_fp8_gemm

        wq = self._weights(which, quantized=True)
        ws = self.w13_s if which == 13 else self.w2_s
        return grouped_fp8_gemm(aq, a_s.reshape(-1), wq, ws, offs)

    def _triton_faster(self, aq: torch.Tensor, which: int) -> bool:
        """Is the Triton grouped GEMM faster than torch's for this GEMM at this many rows?
        Timed once per row bucket; inside a graph capture an untimed bucket takes torch's, and
        ``DEEPINFER_ROUTED_GEMM=torch`` takes torch's always (to time the old kernel as a
        baseline on the same GPU)."""
        if os.environ.get("DEEPINFER_ROUTED_GEMM") == "torch":  # calibration's baseline
            return False
        e, n, k = (int(d) for d in self._weights(which, quantized=True).shape)
        bucket = next_pow2(max(1, int(aq.shape[0])))
        timings = decided_once(
            ROUTED_TIMINGS, (n, k, e, bucket), lambda: self._time_kernels(which, bucket, aq)
        )
        if timings is None:  # inside a capture, not timed yet: torch's
            return False
        torch_s, triton_s = timings
        return triton_s < torch_s

    def _time_kernels(self, which: int, bucket: int, like: torch.Tensor) -> tuple[float, float]:
        """(torch, Triton) seconds as CUDA graphs, each summed over the bucket's two ends, the
        rows spread evenly over the experts; Triton that fails to run counts as infinitely slow."""
        e = self.shape.local_experts
        torch_s = triton_s = 0.0
        for m in sorted({bucket // 2 + 1, bucket}):
            q = torch.zeros((m, like.shape[1]), device=like.device).to(like.dtype)
            s = torch.ones(m, device=like.device)
            ends = (torch.arange(1, e + 1, device=like.device) * m) // e
            offs = ends.to(torch.int32)
            torch_s += fp8._graphed_seconds(
                partial(self._scaled_gmm, q, s, which, offs), like.device
            )
            try:
                self._triton_gmm(q, s, which, offs)  # autotune outside the capture
                triton_s += fp8._graphed_seconds(
                    partial(self._triton_gmm, q, s, which, offs), like.device
                )
            except Exception:  # no Triton, or no kernel for this GPU: torch's
                triton_s = float("inf")
        return torch_s, triton_s
