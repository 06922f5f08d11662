"""Routed experts of one rank with activations quantized once per token, gathered in FP8.

``MoEBlock`` (the reference) gathers bf16 token rows by expert and quantizes them inside each
grouped GEMM call with several small ops. Here the layer input is quantized once (one fused
kernel over T rows, not T·k), FP8 rows and scales are gathered, and SwiGLU is fused into the
quantization that feeds the down projection — the data flow of DeepGEMM's grouped FP8 MoE, on
``torch._scaled_grouped_mm``. Where that has no kernel (the CPU) the same quantized numbers go
through the reference's grouped bf16/float32 path ("emulated").
"""

from __future__ import annotations

from typing import Any

import torch

from ..moe import MoEBlock
from .fp8 import quantize_rows


class DSMoEBlock(MoEBlock):
    def _grouped(
        self, aq: torch.Tensor, a_s: torch.Tensor, which: int, offs: torch.Tensor
    ) -> torch.Tensor:
        if self.path == "scaled_grouped_mm":
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
