"""Two partial attention outputs merged by their log-sum-exps, in Triton.

Chunked MLA prefill runs attention as two calls — the chunk over itself (causal) and over its
prefix (unmasked) — and merges them per query row and head:

    out = (o_new · e^(l_new − m) + o_pre · e^(l_pre − m)) / (e^(l_new − m) + e^(l_pre − m)),
    m = max(l_new, l_pre)

One program reads a (token, head)'s two rows and two log-sum-exps once and writes its output
row once, in the ``[n, H, d_v]`` layout the block continues with — what engines' merge kernels
do (vLLM's ``merge_attn_states``, FlashInfer's ``merge_state`` in SGLang). ``merge_reference``
is the same function in torch on any device: float32 copies, products, a sum and a quotient
over ``n·H·d_v`` values and a transposing copy, where the kernel reads each pair of bf16 rows once
and writes one (``docs/validation.md``, "The prefill attention's waves", has both timed). The
kernel needs a CUDA GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["merge_reference", "merge_states", "random_states"]


def merge_reference(
    o_new: torch.Tensor, l_new: torch.Tensor, o_pre: torch.Tensor, l_pre: torch.Tensor
) -> torch.Tensor:
    """``o_* [1, H, n, d_v]``, ``l_* [1, H, n]`` (natural-log LSEs) -> ``[n, H, d_v]`` in
    ``o_new``'s dtype, merged in float32."""
    m = torch.maximum(l_new, l_pre)
    w_new, w_pre = torch.exp(l_new - m), torch.exp(l_pre - m)
    out = (o_new.float() * w_new.unsqueeze(-1) + o_pre.float() * w_pre.unsqueeze(-1)) / (
        w_new + w_pre
    ).unsqueeze(-1)
    return out[0].transpose(0, 1).to(o_new.dtype)


def random_states(
    heads: int, n: int, d_v: int, device: torch.device | str, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded merge inputs: two bf16 partial outputs ``[1, heads, n, d_v]`` and two float32
    log-sum-exps ``[1, heads, n]`` a few nats apart (``o_new, l_new, o_pre, l_pre``), what the
    kernel is checked and timed on."""
    g = torch.Generator(device=device).manual_seed(seed)
    o_new, o_pre = (
        torch.randn((1, heads, n, d_v), generator=g, device=device).to(torch.bfloat16)
        for _ in range(2)
    )
    l_new, l_pre = (4 * torch.randn((1, heads, n), generator=g, device=device) for _ in range(2))
    return o_new, l_new, o_pre, l_pre


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, compiled on first use (Triton imports only here)."""
    import triton.language as tl
    from triton import jit

    @jit
    def kernel(
        on_ptr, ln_ptr, op_ptr, lp_ptr, out_ptr, DV,
        s_oh, s_on, s_lh, s_ln, s_ph, s_pn, s_qh, s_qn, s_tn, s_th,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < DV
        l_new = tl.load(ln_ptr + h * s_lh + t * s_ln)
        l_pre = tl.load(lp_ptr + h * s_qh + t * s_qn)
        m = tl.maximum(l_new, l_pre)
        w_new, w_pre = tl.exp(l_new - m), tl.exp(l_pre - m)
        a = tl.load(on_ptr + h * s_oh + t * s_on + cols, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(op_ptr + h * s_ph + t * s_pn + cols, mask=ok, other=0.0).to(tl.float32)
        merged = (a * w_new + b * w_pre) / (w_new + w_pre)
        tl.store(out_ptr + t * s_tn + h * s_th + cols, merged.to(out_ptr.dtype.element_ty), mask=ok)

    return kernel


def merge_states(
    o_new: torch.Tensor, l_new: torch.Tensor, o_pre: torch.Tensor, l_pre: torch.Tensor
) -> torch.Tensor:
    """:func:`merge_reference` as one Triton kernel (a CUDA GPU; the rows' last dimension
    contiguous)."""
    _, heads, n, dv = o_new.shape
    if (
        o_pre.shape != o_new.shape
        or l_new.shape != (1, heads, n)
        or l_pre.shape != (1, heads, n)
        or o_new.stride(3) != 1
        or o_pre.stride(3) != 1
    ):
        raise ValueError(
            f"merge_states: o_new {tuple(o_new.shape)}, o_pre {tuple(o_pre.shape)}, "
            f"l_new {tuple(l_new.shape)}, l_pre {tuple(l_pre.shape)} do not agree"
        )
    out = torch.empty((n, heads, dv), device=o_new.device, dtype=o_new.dtype)
    if n:
        block = 1 << (dv - 1).bit_length()
        l_new, l_pre = l_new.float(), l_pre.float()
        _kernel()[(n, heads)](
            o_new, l_new, o_pre, l_pre, out, dv,
            o_new.stride(1), o_new.stride(2), l_new.stride(1), l_new.stride(2),
            o_pre.stride(1), o_pre.stride(2), l_pre.stride(1), l_pre.stride(2),
            out.stride(0), out.stride(1),
            BLOCK=block,
        )  # fmt: skip
    return out
