"""Linear layers in bf16 or FP8 (e4m3, per-row scales).

``Linear(in, out, fp8=...)`` holds one weight. In FP8 mode the weight is quantized once, at
construction, to e4m3 with one float32 scale per output row; each call quantizes the activations
per row (one scale per token) and multiplies with ``torch._scaled_mm`` when the device has FP8
tensor cores (CUDA capability >= 8.9). Without them the same quantized numbers are dequantized and
multiplied in the compute dtype ("fp8_emulated"): the function computed is the same, only slower,
so CPU tests check the FP8 numerics too. ``path`` says which one a layer uses.

``GroupedLinear`` is the first half of V4's grouped low-rank output projection: G independent
``[k_in -> k_out]`` maps over the G column slices of the input (a batched matmul in bf16; one
``_scaled_mm`` per group in FP8).

``quantize_rowwise`` is shared with the MoE kernel.
"""

from __future__ import annotations

import torch

from ._util import FP8, FP8_MAX, default_dtype, fp8_supported, generator, randn


def quantize_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 values and float32 scales, one per row of the last dim: ``x ≈ q * scale[..., None]``

    The multiply runs in ``x``'s dtype (fewer bytes than a float32 pass); the stored scale is the
    exact inverse of the (rounded) multiplier, so dequantizing stays consistent.
    """
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12)
    inv = (FP8_MAX / amax).to(x.dtype)
    q = (x * inv).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return q, (1.0 / inv.float()).squeeze(-1)


def dequantize_rowwise(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale.unsqueeze(-1)).to(dtype)


class Linear:
    """``y = x @ W.T`` with ``W`` of shape ``[out, in]`` drawn N(0, 1/in) from ``seed``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        device: torch.device,
        fp8: bool = False,
        dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        self.in_features = in_features
        self.out_features = out_features
        self.device = device
        self.dtype = dtype or default_dtype(device)
        self.fp8 = fp8
        gen = generator(device, seed)
        self.weight = randn(
            (out_features, in_features),
            std=in_features**-0.5,
            gen=gen,
            device=device,
            dtype=self.dtype,
        )
        self.path = "matmul"
        if fp8:
            self.w_q, self.w_scale = quantize_rowwise(self.weight)
            if fp8_supported(device):
                self.path = "scaled_mm"
                self.w_scale_row = self.w_scale.view(1, -1).contiguous()
            else:
                self.path = "fp8_emulated"
                self.w_dq = dequantize_rowwise(self.w_q, self.w_scale, self.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] == 0:
            return x.new_empty((*lead, self.out_features))
        if self.path == "matmul":
            y = x2 @ self.weight.t()
        else:
            xq, xs = quantize_rowwise(x2)
            if self.path == "scaled_mm":
                y = scaled_mm_rows(xq, xs, self.w_q, self.w_scale_row).to(self.dtype)
            else:
                y = dequantize_rowwise(xq, xs, self.dtype) @ self.w_dq.t()
        return y.reshape(*lead, self.out_features)


def scaled_mm_rows(
    xq: torch.Tensor, xs: torch.Tensor, w_q: torch.Tensor, w_scale_row: torch.Tensor
) -> torch.Tensor:
    """``torch._scaled_mm`` of row-scaled FP8 activations by row-scaled FP8 weights, in bf16.

    cuBLASLt's FP8 GEMM wants the activation rows in a fresh, 16-aligned buffer: a single row
    sliced out of a wider tensor keeps the parent's leading dimension and is refused
    (CUBLAS_STATUS_NOT_SUPPORTED, seen on the H200 at one decode token), so rows are copied into
    a buffer padded to a multiple of 16 and the padding is dropped from the result.
    """
    t = xq.shape[0]
    if t % 16 == 0 and xq.stride() == (xq.shape[1], 1):
        sa = xs.reshape(-1, 1).contiguous()
        return torch._scaled_mm(
            xq, w_q.t(), scale_a=sa, scale_b=w_scale_row, out_dtype=torch.bfloat16
        )
    rows = -(-t // 16) * 16
    a = torch.zeros((rows, xq.shape[1]), dtype=xq.dtype, device=xq.device)
    a[:t] = xq
    sa = torch.ones((rows, 1), dtype=xs.dtype, device=xs.device)
    sa[:t, 0] = xs.reshape(-1)
    y = torch._scaled_mm(a, w_q.t(), scale_a=sa, scale_b=w_scale_row, out_dtype=torch.bfloat16)
    return y[:t]


class GroupedLinear:
    """G maps ``[k_in -> k_out]`` over the G column slices of ``x[..., G*k_in]``."""

    def __init__(
        self,
        groups: int,
        k_in: int,
        k_out: int,
        *,
        device: torch.device,
        fp8: bool = False,
        dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        self.groups, self.k_in, self.k_out = groups, k_in, k_out
        self.device = device
        self.dtype = dtype or default_dtype(device)
        gen = generator(device, seed)
        # [G, out, in] like Linear's weights, one per group
        self.weight = randn(
            (groups, k_out, k_in), std=k_in**-0.5, gen=gen, device=device, dtype=self.dtype
        )
        self.path = "bmm"
        if fp8:
            self.w_q, self.w_scale = quantize_rowwise(self.weight)  # scales [G, out]
            if fp8_supported(device):
                self.path = "scaled_mm"
            else:
                self.path = "fp8_emulated"
                self.w_dq = dequantize_rowwise(self.w_q, self.w_scale, self.dtype)
        self.w_t = self.weight.transpose(1, 2)  # [G, in, out] view for bmm

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        g, k_in, k_out = self.groups, self.k_in, self.k_out
        x3 = x.reshape(-1, g, k_in)
        t = x3.shape[0]
        if t == 0:
            return x.new_empty((*lead, g * k_out))
        if self.path == "bmm":
            y = torch.bmm(x3.transpose(0, 1), self.w_t)  # [G, T, out]
            return y.transpose(0, 1).reshape(*lead, g * k_out)
        xq, xs = quantize_rowwise(x3)  # [T, G, in], [T, G]
        if self.path == "fp8_emulated":
            xd = dequantize_rowwise(xq, xs, self.dtype)
            y = torch.bmm(xd.transpose(0, 1), self.w_dq.transpose(1, 2))
            return y.transpose(0, 1).reshape(*lead, g * k_out)
        outs = [
            scaled_mm_rows(xq[:, i], xs[:, i], self.w_q[i], self.w_scale[i].view(1, -1))
            for i in range(g)
        ]
        return torch.cat(outs, dim=-1).to(self.dtype).reshape(*lead, g * k_out)
