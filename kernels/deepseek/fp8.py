"""FP8 projections the way production engines run them: quantize an activation once, in one
kernel fused with what precedes it, and feed every GEMM that reads it.

The reference ``Linear`` quantizes per call with half a dozen small torch ops, which at decode
sizes takes longer than the GEMM itself. Here:

* ``quantize_rows(x, ...)`` is one Triton kernel per call (torch on the CPU): per row of ``x`` it
  optionally applies SwiGLU (``silu(g) * u`` over the two halves) and/or RMSNorm, writes the row
  in e4m3 with one float32 scale (amax / 448), and optionally the bf16 row it quantized (the
  normalized activation some callers also need). Rows are written padded to a multiple of 16 (the
  FP8 GEMM wants aligned rows); the padding rows are zeros with scale 1. With ``groups=G`` the
  ``G`` column slices of each row become separate rows of a ``[G, rows, K/G]`` output, so a
  grouped projection reads one contiguous matrix per group.
* ``FP8Linear`` holds one or more weights concatenated along the output dimension (q_lora + kv +
  indexer projections of one input become ONE GEMM), quantized once per output row, and
  multiplies pre-quantized rows with ``torch._scaled_mm`` (cuBLASLt, row-wise scales). This is
  the torch FP8 path in place of DeepGEMM's 1×128 / 128×128 block-scaled GEMMs: same bytes and
  FLOPs, a different scale granularity.

Where the FP8 GEMM has no kernel (the CPU) the same quantized numbers are dequantized and
multiplied in float32 ("emulated"), so tests check the numerics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch

from .._util import (
    FP8,
    FP8_MAX,
    capture_graph,
    decided_once,
    fp8_supported,
    median_time,
    next_pow2,
)

ROW_ALIGN = 16
_TRITON: bool | None = None
used: set[str] = set()

try:  # Triton is optional: only the CUDA path uses it
    import triton
    import triton.language as tl

    @triton.jit
    def _quant_rows_kernel(
        X,
        stride_xm,
        stride_xg,
        RES,
        SUM,
        W,
        Q,
        S,
        OUT,
        M,
        M_PAD,
        K,
        eps,
        BLOCK: tl.constexpr,
        SILU: tl.constexpr,
        NORM: tl.constexpr,
        WRITE_OUT: tl.constexpr,
        ADD: tl.constexpr,
    ):
        row = tl.program_id(0)
        grp = tl.program_id(1)
        cols = tl.arange(0, BLOCK)
        mask = cols < K
        out_row = grp * M_PAD + row
        if row < M:
            base = X + row * stride_xm + grp * stride_xg
            v = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
            if SILU:
                u = tl.load(base + K + cols, mask=mask, other=0.0).to(tl.float32)
                v = v / (1.0 + tl.exp(-v)) * u
            if ADD:  # v = x + residual, written out (the layer's running hidden state)
                v += tl.load(RES + row * K + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(SUM + row * K + cols, v.to(tl.bfloat16), mask=mask)
            if NORM:
                ms = tl.sum(v * v, axis=0) / K
                w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
                v = v * tl.rsqrt(ms + eps) * w
            if WRITE_OUT:
                tl.store(OUT + out_row * K + cols, v.to(tl.bfloat16), mask=mask)
            amax = tl.max(tl.abs(v), axis=0)
            scale = tl.maximum(amax, 1e-12) / 448.0
            q = tl.clamp(v / scale, -448.0, 448.0)
            tl.store(Q + out_row * K + cols, q.to(tl.float8e4nv), mask=mask)
            tl.store(S + out_row, scale)
        else:
            zero = tl.zeros([BLOCK], dtype=tl.float32)
            tl.store(Q + out_row * K + cols, zero.to(tl.float8e4nv), mask=mask)
            tl.store(S + out_row, 1.0)

except ImportError:  # pragma: no cover - CPU-only installs
    triton = None


def padded_rows(m: int) -> int:
    return max(ROW_ALIGN, -(-m // ROW_ALIGN) * ROW_ALIGN)


def _triton_ok(x: torch.Tensor) -> bool:
    global _TRITON
    if _TRITON is None:
        _TRITON = triton is not None
    return bool(_TRITON) and x.is_cuda


def quantize_rows(
    x: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    silu: bool = False,
    groups: int = 1,
    want_bf16: bool = False,
    eps: float = 1e-6,
    fp8: bool = True,
    residual: torch.Tensor | None = None,
    sum_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``x [M, C]`` -> (e4m3 ``[G, M_pad, K]``, scales ``[G, M_pad]``, bf16 ``[G, M_pad, K]`` or
    None), with K = C / G (C / 2G with ``silu``). G = 1 callers take ``[0]``. ``fp8=False``
    (tests) returns the rows unquantized in ``x``'s dtype with unit scales. With ``residual``
    (``[M, K]``, G = 1) the rows ``x + residual`` are what is normalized and quantized, and are
    written to ``sum_out``."""
    if residual is not None and (groups != 1 or silu or sum_out is None):
        raise ValueError("residual needs groups=1, no silu, and sum_out")
    m, c = x.shape
    k = c // groups // (2 if silu else 1)
    m_pad = padded_rows(m)
    dev = x.device
    q = torch.empty((groups, m_pad, k), dtype=FP8 if fp8 else x.dtype, device=dev)
    s = torch.empty((groups, m_pad), dtype=torch.float32, device=dev)
    out = torch.empty((groups, m_pad, k), dtype=torch.bfloat16, device=dev) if want_bf16 else None
    if fp8 and _triton_ok(x) and x.stride(1) == 1:
        block = triton.next_power_of_2(k)
        _quant_rows_kernel[(m_pad, groups)](
            x,
            x.stride(0),
            k * (2 if silu else 1),
            residual if residual is not None else x,
            sum_out if sum_out is not None else x,
            norm_weight if norm_weight is not None else x,
            q,
            s,
            out if out is not None else q,
            m,
            m_pad,
            k,
            eps,
            BLOCK=block,
            SILU=silu,
            NORM=norm_weight is not None,
            WRITE_OUT=out is not None,
            ADD=residual is not None,
            num_warps=4 if block <= 2048 else (8 if block <= 8192 else 16),
        )
        used.add("triton.quantize_rows")
        return q, s, out
    used.add("torch.quantize_rows")
    v = x.float().reshape(m, groups, -1)
    if silu:
        g, u = v[..., :k], v[..., k:]
        v = torch.nn.functional.silu(g) * u
    if residual is not None and sum_out is not None:
        v = v + residual.float().view(m, 1, k)
        sum_out.copy_(v.view(m, k).to(sum_out.dtype))
    if norm_weight is not None:
        v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    v = v.transpose(0, 1)  # [G, M, K]
    q.zero_()
    s.fill_(1.0)
    if fp8:
        scale = v.abs().amax(-1).clamp_min(1e-12) / FP8_MAX
        q[:, :m] = (v / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        s[:, :m] = scale
    else:
        q[:, :m] = v.to(x.dtype)
    if out is not None:
        out.zero_()
        out[:, :m] = v.to(torch.bfloat16)
    return q, s, out


def quantize_weight(w: torch.Tensor, fp8: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 ``[N, K]`` and one float32 scale per output row (``fp8=False``: as is, unit scales)."""
    if not fp8:
        return w, torch.ones(w.shape[0], dtype=torch.float32, device=w.device)
    amax = w.float().abs().amax(-1).clamp_min(1e-12)
    scale = amax / FP8_MAX
    return (w.float() / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_gemm(
    xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor
) -> torch.Tensor:
    """``[M_pad, K] e4m3 × [N, K] e4m3 -> [M_pad, N] bf16`` with row scales on both sides
    (unquantized operands: a plain matmul in their dtype)."""
    if xq.dtype != FP8:
        dt = xq.dtype
        return (xq * xs.view(-1, 1).to(dt)) @ (wq.to(dt) * ws.view(-1, 1).to(dt)).t()
    if xq.is_cuda and fp8_supported(xq.device):
        used.add("scaled_mm")
        return torch._scaled_mm(
            xq, wq.t(), scale_a=xs.view(-1, 1), scale_b=ws.view(1, -1), out_dtype=torch.bfloat16
        )
    used.add("emulated_gemm")
    a = xq.float() * xs.view(-1, 1)
    b = wq.float() * ws.view(-1, 1)
    return (a @ b.t()).to(torch.bfloat16)


class FP8Linear:
    """Weights ``[N_i, K]`` concatenated into one ``[ΣN_i, K]`` FP8 GEMM; ``__call__`` takes
    pre-quantized rows and returns the outputs split back per weight, first ``m`` rows."""

    def __init__(self, weights: Sequence[torch.Tensor], fp8: bool = True) -> None:
        w = torch.cat([t.detach() for t in weights], dim=0)
        self.sizes = [int(t.shape[0]) for t in weights]
        self.wq, self.ws = quantize_weight(w, fp8)

    def __call__(self, xq: torch.Tensor, xs: torch.Tensor, m: int) -> list[torch.Tensor]:
        y = fp8_gemm(xq, xs, self.wq, self.ws)[:m]
        return list(torch.split(y, self.sizes, dim=1))

    def one(self, xq: torch.Tensor, xs: torch.Tensor, m: int) -> torch.Tensor:
        return fp8_gemm(xq, xs, self.wq, self.ws)[:m]


# (groups, N, K, rows bucket) -> (batched seconds, per-group seconds): the grouped projection's
# two paths timed as CUDA graphs on first use, each the sum of its times at the bucket's two ends
# (just above half the bucket, and the bucket). On the H200 (torch 2.11) the batched grouped GEMM
# takes a kernel below 2,048 rows that costs 2.4x what it does at 2,048 (device call 16,
# prefill_sizes.json): timed at 2,048 alone it won the 1,025-2,048 bucket by 1 % for V4-Flash and
# then cost 40 % more at 1,100 rows (device call 23).
GROUPED_TIMINGS: dict[tuple[int, int, int, int], tuple[float, float]] = {}
BATCHED_MIN_ROWS = 2048  # the choice where the paths cannot be timed (inside a graph capture)


def _graphed_seconds(fn: Callable[[], object], device: torch.device, repeats: int = 5) -> float:
    """Median GPU time of ``fn`` replayed as a CUDA graph, as the engine and the calibration
    run it: the kernels' time without the host's launch gaps (which, eagerly, made G small
    GEMMs look 4-10x slower than one batched call)."""
    graph = capture_graph(device, fn, lambda: None)
    return median_time(graph.replay, device, warmup=1, repeat=repeats)


class GroupedFP8Linear:
    """G independent ``[K -> N]`` maps over G column slices (V4's grouped output projection);
    input quantized once into ``[G, M_pad, K]``: one batched grouped GEMM, or one FP8 GEMM per
    group — whichever was faster, over both ends of the row bucket (rows to the next power of
    two), when the bucket was first seen (``GROUPED_TIMINGS``), as an engine autotunes a kernel
    per size."""

    def __init__(self, weight: torch.Tensor, fp8: bool = True) -> None:  # [G, N, K]
        self.groups = int(weight.shape[0])
        self.parts = [quantize_weight(weight[g], fp8) for g in range(self.groups)]
        self.wq = torch.stack([wq for wq, _ in self.parts])  # [G, N, K]
        self.ws = torch.stack([ws for _, ws in self.parts])  # [G, N]
        self.batched = fp8 and weight.is_cuda and self._batched_works()

    def _use_batched(self, xq: torch.Tensor) -> bool:
        rows = int(xq.shape[1])
        g, n, k = (int(d) for d in self.wq.shape)
        bucket = next_pow2(rows)
        timings = decided_once(
            GROUPED_TIMINGS, (g, n, k, bucket), lambda: self._time_paths(bucket, xq)
        )
        if timings is None:  # inside a capture, not timed yet
            return rows >= BATCHED_MIN_ROWS
        batched_s, per_group_s = timings
        return batched_s <= per_group_s

    def _time_paths(self, bucket: int, like: torch.Tensor) -> tuple[float, float]:
        """(batched, per-group) seconds, each summed over the bucket's two ends."""
        g, _, k = (int(d) for d in self.wq.shape)
        batched_s = per_group_s = 0.0
        for m in sorted({padded_rows(bucket // 2 + 1), bucket}):
            q = torch.zeros((g, m, k), device=like.device, dtype=torch.bfloat16).to(like.dtype)
            s = torch.ones((g, m), device=like.device)
            batched_s += _graphed_seconds(partial(self._batched, q, s), like.device)
            per_group_s += _graphed_seconds(partial(self._per_group, q, s, m), like.device)
        return batched_s, per_group_s

    def _per_group(self, xq: torch.Tensor, xs: torch.Tensor, m: int) -> torch.Tensor:
        outs = [fp8_gemm(xq[g], xs[g], wq, ws)[:m] for g, (wq, ws) in enumerate(self.parts)]
        return torch.cat(outs, dim=1)

    def _batched_works(self) -> bool:
        """Does ``torch._scaled_grouped_mm`` take the groups as one batched 3-D GEMM here?"""
        k = self.wq.shape[2]
        xq = torch.zeros((self.groups, 16, k), device=self.wq.device).to(self.wq.dtype)
        xs = torch.ones((self.groups, 16), device=self.wq.device)
        try:
            self._batched(xq, xs)
            return True
        except (RuntimeError, NotImplementedError, TypeError):
            return False

    def _batched(self, xq: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        return torch._scaled_grouped_mm(
            xq, self.wq.transpose(-2, -1), scale_a=xs, scale_b=self.ws, out_dtype=torch.bfloat16
        )

    def __call__(self, xq: torch.Tensor, xs: torch.Tensor, m: int) -> torch.Tensor:
        if self.batched and self._use_batched(xq):
            used.add("scaled_grouped_mm.batched")
            y = self._batched(xq, xs)  # [G, M_pad, N]
            return y[:, :m].transpose(0, 1).reshape(m, -1)
        return self._per_group(xq, xs, m)


def residual_and_shared_expert(
    x: torch.Tensor,
    proj: torch.Tensor,
    ffn_norm: torch.Tensor,
    w_gate_up: FP8Linear | None,
    w_down: FP8Linear | None,
    fp8: bool,
    return_ffn_input: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The end of a layer after its attention's output projection ``proj``: y = x + proj (fused
    into the RMSNorm + quantization of the FFN input), then y + SharedExpert(RMSNorm(y)), SwiGLU
    fused into the second quantization. Returns y, or (y, the FFN input) for the routed experts."""
    t = x.shape[0]
    y = torch.empty_like(x)
    zq, zs, z = quantize_rows(
        proj, norm_weight=ffn_norm, want_bf16=return_ffn_input, fp8=fp8, residual=x, sum_out=y
    )
    if w_gate_up is not None and w_down is not None:
        gu = w_gate_up.one(zq[0], zs[0], t)
        aq, as_, _ = quantize_rows(gu, silu=True, fp8=fp8)
        y = y + w_down.one(aq[0], as_[0], t).to(y.dtype)
    if return_ffn_input:
        assert z is not None
        return y, z[0, :t].to(x.dtype)
    return y
