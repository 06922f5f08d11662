"""The routed experts' combine in Triton: each token's k expert rows, weighted and summed.

After the experts' grouped GEMMs the output rows are sorted by expert; a token's k rows sit
wherever its (token, expert) pairs were sorted to. The combine returns, per token t,

    out[t] = Σ_j w[t, j] · y[pos[t, j]]      (float32 accumulation, stored in ``y``'s dtype)

with ``pos [T, k]`` the sorted row of each pair (``sorted_positions``). One program reads a
token's k rows once and writes its output once — what engines' combine kernels do (vLLM's and
SGLang's ``moe_sum`` after the weights are applied in the down GEMM's epilogue, DeepEP's combine).
The reference path (``MoEBlock.combine``) multiplies every row into a float32 copy and adds them
with ``index_add_``: three float32 passes over ``T·k × hidden`` values and atomic adds, which on
the H200 cost more than the expert GEMMs themselves at prefill sizes. ``combine_reference`` is
the kernel's function in torch (any device); the kernel needs a CUDA GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["combine_reference", "combine_rows", "sorted_positions"]

BLOCK_D = 1024  # output columns per program (DeepSeek's hidden widths: 4,096-7,168)


def sorted_positions(order: torch.Tensor, k: int) -> torch.Tensor:
    """``pos [T, k]`` int32: where pair ``t·k + j`` went when the flat pairs were sorted into
    ``order`` (``order[i]`` = the pair at sorted row i). Device ops only (graph-capturable)."""
    pos = torch.empty_like(order)
    pos.scatter_(0, order, torch.arange(order.numel(), device=order.device, dtype=order.dtype))
    return pos.view(-1, k).to(torch.int32)


def combine_reference(y: torch.Tensor, pos: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The kernel's function in torch: ``[T, D]`` in ``y``'s dtype."""
    rows = y.index_select(0, pos.reshape(-1).to(torch.int64)).view(*pos.shape, y.shape[1])
    return (rows.float() * w.float().unsqueeze(-1)).sum(1).to(y.dtype)


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, compiled on first use (Triton imports only here)."""
    import triton.language as tl
    from triton import jit

    @jit
    def kernel(
        y_ptr, pos_ptr, w_ptr, out_ptr, D, stride_y, stride_o,
        K: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        t = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < D
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for j in tl.static_range(K):
            row = tl.load(pos_ptr + t * K + j).to(tl.int64)
            wj = tl.load(w_ptr + t * K + j)
            acc += wj * tl.load(y_ptr + row * stride_y + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + t * stride_o + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)

    return kernel


def combine_rows(y: torch.Tensor, pos: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``out [T, D]`` (see the module docstring) on a CUDA GPU; ``w [T, k]`` any float dtype."""
    t, k = pos.shape
    if w.shape != (t, k) or y.dim() != 2 or y.stride(1) != 1:
        raise ValueError(
            f"combine_rows: y {tuple(y.shape)}, pos {tuple(pos.shape)}, w {tuple(w.shape)} "
            "do not agree"
        )
    d = y.shape[1]
    out = torch.empty((t, d), device=y.device, dtype=y.dtype)
    if t:
        grid = (t, -(-d // BLOCK_D))
        _kernel()[grid](
            y, pos.contiguous(), w.float().contiguous(), out, d, y.stride(0), out.stride(0),
            K=k, BLOCK=BLOCK_D,
        )  # fmt: skip
    return out
