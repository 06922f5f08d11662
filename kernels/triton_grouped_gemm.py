"""A grouped FP8 GEMM for routed experts in Triton, tiled for narrow experts (expert TP).

Engines that split every expert across GPUs (vLLM, SGLang's TP MoE: "expert tensor parallelism")
run the experts through a Triton "fused MoE" kernel whose tiles are chosen per shape, so an
expert 256 columns wide costs about a quarter of one 1,024 wide. ``torch._scaled_grouped_mm``,
which the profile's expert-parallel fits time, costs nearly the same at 256 columns as at 1,024
(device call 32), so it is the wrong kernel to time a TP-MoE engine with. This one computes the
same function as ``torch._scaled_grouped_mm`` with row-wise scales:

    out[r] = (aq[r] @ wq[e].T) * a_s[r] * ws[e]      for the rows r of expert e (bf16)

with ``aq [M, K]`` e4m3 rows sorted by expert, ``offs [E]`` the cumulative row ends (int32),
``wq [E, N, K]`` e4m3 and ``ws [E, N]`` float32. Each program owns BLOCK_M rows of one expert and
BLOCK_N output columns; the map from program to (expert, first row) is built on the device
(no host sync: the grid is sized by an upper bound and the spare programs return at once), so the
call captures into a CUDA graph. BLOCK_M follows the mean rows per expert (16 ... 128), as the
engines' tuned configurations do; BLOCK_N, warps and stages are autotuned per (N, K, BLOCK_M).

``block_map`` (the program map) and ``grouped_reference`` (the same function in torch) run on a
CPU and are tested there; the kernel itself needs a CUDA GPU with FP8 (sm89+).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["block_m_for", "block_map", "grouped_fp8_gemm", "grouped_reference"]


def block_m_for(rows: int, experts: int) -> int:
    """BLOCK_M for ``rows`` (token, expert) rows over ``experts`` experts: the smallest of
    16, 32, 64, 128 that holds the mean rows per expert (128 beyond)."""
    mean = rows / max(experts, 1)
    for bm in (16, 32, 64):
        if mean <= bm:
            return bm
    return 128


def block_map(offs: torch.Tensor, rows: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert, first row) of each of ``cdiv(rows, block_m) + E`` programs — an upper bound on
    the row blocks of any split of ``rows`` rows into E experts; programs past the last block get
    expert -1. Device ops only (graph-capturable)."""
    ends = offs.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    blocks = (ends - starts + block_m - 1) // block_m
    cum = torch.cumsum(blocks, 0)
    n_prog = (rows + block_m - 1) // block_m + offs.numel()
    pid = torch.arange(n_prog, device=offs.device, dtype=torch.int64)
    expert = torch.searchsorted(cum, pid, right=True)
    valid = expert < offs.numel()
    e = expert.clamp(max=offs.numel() - 1)
    first = starts[e] + (pid - (cum[e] - blocks[e])) * block_m
    return torch.where(valid, e, -1).to(torch.int32), first.to(torch.int32)


def grouped_reference(
    aq: torch.Tensor, a_s: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, offs: torch.Tensor
) -> torch.Tensor:
    """The kernel's function in float32 torch (any device), returned in bf16."""
    a = aq.float() * a_s.float()[:, None]
    out = torch.zeros((aq.shape[0], wq.shape[1]), dtype=torch.float32, device=aq.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = a[start:end] @ (wq[e].float() * ws[e].float()[:, None]).t()
        start = end
    return out.to(torch.bfloat16)


@functools.cache
def _kernel() -> Any:
    """The autotuned Triton kernel, compiled on first use (Triton imports only here)."""
    import triton
    import triton.language as tl

    configs = [
        triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bn, w, s in ((64, 4, 4), (128, 4, 4), (128, 8, 3), (256, 8, 3))
    ]

    @triton.autotune(configs=configs, key=["N", "K", "BLOCK_M"])
    @triton.jit
    def kernel(
        a_ptr, as_ptr, w_ptr, ws_ptr, out_ptr, ends_ptr, expert_ptr, first_ptr,
        N, K,
        stride_am, stride_we, stride_wn, stride_wse, stride_om,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        e = tl.load(expert_ptr + pid_m)
        if e < 0:
            return
        first = tl.load(first_ptr + pid_m)
        end = tl.load(ends_ptr + e)
        rows = first + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        row_ok = rows < end
        col_ok = cols < N
        a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :]
        w_ptrs = w_ptr + e.to(tl.int64) * stride_we + cols[None, :] * stride_wn + ks[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = (k0 + ks) < K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc = tl.dot(a, w, acc)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        a_s = tl.load(as_ptr + rows, mask=row_ok, other=0.0)
        w_s = tl.load(ws_ptr + e.to(tl.int64) * stride_wse + cols, mask=col_ok, other=0.0)
        acc = acc * a_s[:, None] * w_s[None, :]
        o_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
        tl.store(o_ptrs, acc.to(tl.bfloat16), mask=row_ok[:, None] & col_ok[None, :])

    return kernel


def grouped_fp8_gemm(
    aq: torch.Tensor,
    a_s: torch.Tensor,
    wq: torch.Tensor,
    ws: torch.Tensor,
    offs: torch.Tensor,
    block_m: int | None = None,
) -> torch.Tensor:
    """``out [M, N]`` bf16 (see the module docstring) on a CUDA GPU."""
    m, k = aq.shape
    e, n, k2 = wq.shape
    if k != k2 or offs.numel() != e or a_s.shape != (m,) or ws.shape != (e, n):
        raise ValueError(
            f"grouped_fp8_gemm: shapes a {tuple(aq.shape)}, a_s {tuple(a_s.shape)}, "
            f"w {tuple(wq.shape)}, ws {tuple(ws.shape)}, offs {tuple(offs.shape)} do not agree"
        )
    import triton

    bm = block_m or block_m_for(m, e)
    expert, first = block_map(offs, m, bm)
    out = torch.empty((m, n), device=aq.device, dtype=torch.bfloat16)
    kernel = _kernel()

    def grid(meta: dict[str, Any]) -> tuple[int, int]:
        return (expert.numel(), triton.cdiv(n, meta["BLOCK_N"]))

    kernel[grid](
        aq, a_s, wq, ws, out, offs, expert, first,
        n, k,
        aq.stride(0), wq.stride(0), wq.stride(1), ws.stride(0), out.stride(0),
        BLOCK_M=bm, BLOCK_K=128,
    )  # fmt: skip
    return out
