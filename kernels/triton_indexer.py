"""Fused lightning-indexer scores in Triton (used on CUDA when Triton is importable).

``out[b, q, e] = sum_h w[b,q,h] * relu(q[b,q,h,:] · k[b,e,:])`` (+ the tie-break and the
visibility mask of ``attention.indexer_scores``), one program per (entry tile, query tile,
batch): the key tile stays on chip while the program loops over the indexer heads, so the
``[Q, heads, N]`` logits never reach device memory. The torch form writes them, ReLUs them in
place and reads them back — about 8 bytes of traffic per (query, head, entry), which dominates a
long-prefix CSA prefill; this kernel makes the indexer compute-bound instead.

Constraints: ``indexer_dim`` a power of two >= 16 (128 in V4.1). On the CPU the kernel runs only
under ``TRITON_INTERPRET=1`` (the tests use that when Triton is installed).
"""

# no `from __future__ import annotations` here: Triton reads the kernel's annotations
import os

import torch

try:  # Triton is optional: the CPU-only installs (and CI) have no need for it
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment
    HAS_TRITON = False


def available(device: torch.device) -> bool:
    if not HAS_TRITON:
        return False
    if device.type == "cuda":
        return True
    return os.environ.get("TRITON_INTERPRET") == "1"


if HAS_TRITON:
    # (no Python annotations on a @triton.jit signature: Triton resolves them as globals)
    @triton.jit
    def _indexer_kernel(
        Q,
        W,
        K,
        VIS,
        OUT,
        stride_qb,
        stride_qq,
        stride_qh,
        stride_wb,
        stride_wq,
        stride_kb,
        stride_kn,
        stride_vb,
        stride_ob,
        stride_oq,
        NQ,
        NK,
        TIE,
        HI: tl.constexpr,
        D: tl.constexpr,
        HAS_VIS: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        pid_q = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D)
        q_ok = offs_q < NQ
        n_ok = offs_n < NK
        k = tl.load(
            K + b * stride_kb + offs_n[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
            mask=n_ok[:, None],
            other=0.0,
        )
        kt = tl.trans(k)
        acc = tl.zeros([BLOCK_Q, BLOCK_N], dtype=tl.float32)
        q_base = Q + b * stride_qb + offs_q[:, None].to(tl.int64) * stride_qq + offs_d[None, :]
        w_base = W + b * stride_wb + offs_q.to(tl.int64) * stride_wq
        for h in range(HI):
            q = tl.load(q_base + h * stride_qh, mask=q_ok[:, None], other=0.0)
            s = tl.dot(q, kt)
            w = tl.load(w_base + h, mask=q_ok, other=0.0).to(tl.float32)
            acc += tl.maximum(s, 0.0) * w[:, None]
        acc += offs_n[None, :].to(tl.float32) * TIE
        if HAS_VIS:
            vis = tl.load(VIS + b * stride_vb + offs_q, mask=q_ok, other=0)
            acc = tl.where(offs_n[None, :] < vis[:, None], acc, float("-inf"))
        tl.store(
            OUT + b * stride_ob + offs_q[:, None].to(tl.int64) * stride_oq + offs_n[None, :],
            acc,
            mask=q_ok[:, None] & n_ok[None, :],
        )


def indexer_scores_triton(
    iq: torch.Tensor,
    iw: torch.Tensor,
    keys: torch.Tensor,
    vis: torch.Tensor | None,
    tie: float,
    out: torch.Tensor,
) -> torch.Tensor:
    """Fill ``out [B, Q, N]`` (float32); see ``attention.indexer_scores`` for the arguments."""
    b, nq, hi, d = iq.shape
    n = keys.shape[1]
    iq = iq.contiguous()
    iw = iw.contiguous()
    keys = keys.contiguous()
    if n == 0 or nq == 0:
        return out
    block_q = 64 if nq >= 64 else 16
    block_n = 128
    vis_t = vis.to(torch.int32).contiguous() if vis is not None else out  # dummy when absent
    grid = (triton.cdiv(n, block_n), triton.cdiv(nq, block_q), b)
    _indexer_kernel[grid](
        iq,
        iw,
        keys,
        vis_t,
        out,
        iq.stride(0),
        iq.stride(1),
        iq.stride(2),
        iw.stride(0),
        iw.stride(1),
        keys.stride(0),
        keys.stride(1),
        vis_t.stride(0) if vis is not None else 0,
        out.stride(0),
        out.stride(1),
        nq,
        n,
        tie,
        HI=hi,
        D=d,
        HAS_VIS=vis is not None,
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        num_warps=4,
        num_stages=2,
    )
    return out
