"""Routed experts of one layer on one EP rank: router, grouped GEMMs, SwiGLU, weighted combine.

``MoEBlock(shape, device, dtype_mode)`` holds ``shape.local_experts`` experts of width
``expert_width`` (gate and up projections stacked as ``w13 [E, 2F, D]``, down ``w2 [E, D, F]``).

``forward(x)`` routes (softmax over the local experts, top-k without replacement, weights
renormalized to 1) and calls ``forward_routed(x, topk_ids, topk_weights)``, which the calibration
uses to time a given routing. The (token, expert) pairs are sorted by expert (a stable argsort, no
host sync), the token rows gathered in that order, and each projection is ONE grouped GEMM over
all experts with the cumulative per-expert offsets:

* ``bf16``: ``torch._grouped_mm`` (CUTLASS on sm90+);
* ``fp8``: weights quantized once to e4m3 with per-(expert, output row) scales, activations per
  row at call time, ``torch._scaled_grouped_mm``.

Where a fast path does not run (``_scaled_grouped_mm`` has no CPU kernel; old torch; a GPU without
it) the same function is computed by the next one down: FP8 numbers dequantized into a grouped
bf16/float32 GEMM ("fp8_emulated"), or a per-expert loop ("loop", which syncs to read the
offsets). ``path`` records the one chosen, tried once at construction on a small input.
Outputs are combined in float32 with ``index_add_`` and returned in the compute dtype.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from ._util import as_device, default_dtype, empty, generator, randn
from .linear import dequantize_rowwise, quantize_rowwise
from .shapes import LayerShape

DtypeMode = Literal["bf16", "fp8"]


def _grouped_loop(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Reference-shaped fallback: ``a[rows of e] @ w[e].T`` per expert (reads offs on the host)."""
    out = empty((a.shape[0], w.shape[1]), dtype=a.dtype, device=a.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = a[start:end] @ w[e].t()
        start = end
    return out


class MoEBlock:
    def __init__(
        self,
        shape: LayerShape,
        device: torch.device | str | None = None,
        dtype_mode: DtypeMode = "bf16",
        seed: int = 0,
        *,
        dtype: torch.dtype | None = None,
    ) -> None:
        if dtype_mode not in ("bf16", "fp8"):
            raise ValueError("dtype_mode must be 'bf16' or 'fp8'")
        self.shape = shape
        self.device = as_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.dtype_mode = dtype_mode
        e, d, f = shape.local_experts, shape.hidden, shape.expert_width
        gen = generator(self.device, seed * 1000 + 500)
        dev, dt = self.device, self.dtype
        self.router = randn((e, d), std=d**-0.5, gen=gen, device=dev, dtype=dt)
        self.w13 = randn((e, 2 * f, d), std=d**-0.5, gen=gen, device=dev, dtype=dt)
        self.w2 = randn((e, d, f), std=f**-0.5, gen=gen, device=dev, dtype=dt)
        if dtype_mode == "fp8":
            self.w13_q, self.w13_s = quantize_rowwise(self.w13)  # [E, 2F, D], [E, 2F]
            self.w2_q, self.w2_s = quantize_rowwise(self.w2)
            self.w13_dq = dequantize_rowwise(self.w13_q, self.w13_s, dt)
            self.w2_dq = dequantize_rowwise(self.w2_q, self.w2_s, dt)
        self.path = self._choose_path()

    # ---- path selection --------------------------------------------------------------------------
    def _choose_path(self) -> str:
        """Try the fastest path on a small input; fall back to the next one on any error."""
        x = torch.ones((16, self.shape.hidden), device=self.device, dtype=self.dtype)
        offs = torch.full((self.shape.local_experts,), 16, dtype=torch.int32, device=self.device)
        candidates = []
        if self.dtype_mode == "fp8" and self.device.type == "cuda":
            candidates.append("scaled_grouped_mm")
        if self.device.type != "cuda" or self.dtype == torch.bfloat16:
            candidates.append("grouped_mm")
        for path in candidates:
            try:
                self._gmm(x, 13, offs, path)
                return path
            except (RuntimeError, NotImplementedError, AttributeError, TypeError):
                continue
        return "loop"

    def _weights(self, which: int, quantized: bool = False) -> torch.Tensor:
        if self.dtype_mode == "fp8":
            if quantized:
                return self.w13_q if which == 13 else self.w2_q
            return self.w13_dq if which == 13 else self.w2_dq
        return self.w13 if which == 13 else self.w2

    def _gmm(self, a: torch.Tensor, which: int, offs: torch.Tensor, path: str) -> torch.Tensor:
        """``[M, K] x expert weights -> [M, N]`` over the expert groups given by ``offs``."""
        if path == "scaled_grouped_mm":
            aq, a_s = quantize_rowwise(a)
            return self._scaled_gmm(aq, a_s, which, offs).to(self.dtype)
        if self.dtype_mode == "fp8":  # emulate the FP8 numbers: quantize the activations too
            aq, a_s = quantize_rowwise(a)
            a = dequantize_rowwise(aq, a_s, self.dtype)
        w = self._weights(which)
        if path == "grouped_mm":
            return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
        return _grouped_loop(a, w, offs)

    def _scaled_gmm(
        self, aq: torch.Tensor, a_s: torch.Tensor, which: int, offs: torch.Tensor
    ) -> torch.Tensor:
        """Row-scaled e4m3 rows × this rank's FP8 expert weights, grouped by ``offs``, in bf16."""
        wq = self._weights(which, quantized=True)
        ws = self.w13_s if which == 13 else self.w2_s
        return torch._scaled_grouped_mm(
            aq, wq.transpose(-2, -1), scale_a=a_s, scale_b=ws, offs=offs, out_dtype=torch.bfloat16
        )

    # ---- public ----------------------------------------------------------------------------------
    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids ``[T, k]`` int64, weights ``[T, k]`` float32 summing to 1 per token)."""
        logits = (x @ self.router.t()).float()
        probs = torch.softmax(logits, dim=-1)
        w, ids = probs.topk(self.shape.top_k, dim=-1)
        return ids, w / w.sum(-1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, w = self.route(x)
        return self.forward_routed(x, ids, w)

    __call__ = forward

    def forward_routed(
        self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        """``sum_j w[t,j] * Expert_{ids[t,j]}(x[t])`` for ``x [T, hidden]``."""
        t, d = x.shape
        if t == 0:
            return x.new_zeros((0, d))
        order, tok, offs = self.sort_by_expert(topk_ids)
        y = self.forward_experts(self.gather_rows(x, tok), offs)
        return self.combine(y, order, tok, topk_weights, t)

    def gather_rows(self, x: torch.Tensor, tok: torch.Tensor) -> Any:
        """The experts' input rows, token ``tok[i]`` as row i (sorted by expert)."""
        return x.index_select(0, tok)

    def forward_experts(self, rows: Any, offs: torch.Tensor) -> torch.Tensor:
        """The experts' own work on rows already sorted by expert (``gather_rows``), with the
        cumulative per-expert offsets: grouped GEMM, SwiGLU, grouped GEMM. Under expert
        parallelism this is what a rank computes between the exchange's dispatch (which sorts,
        quantizes and delivers the rows) and its combine (which weights and sums them)."""
        f = self.shape.expert_width
        h = self._gmm(rows, 13, offs, self.path)  # [T*k, 2F]
        a = torch.nn.functional.silu(h[:, :f]) * h[:, f:]
        return self._gmm(a, 2, offs, self.path)  # [T*k, D]

    def prepare_experts(self, x: torch.Tensor, topk_ids: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """(rows, offsets) for :meth:`forward_experts`: what an EP exchange hands the experts."""
        _, tok, offs = self.sort_by_expert(topk_ids)
        return self.gather_rows(x, tok), offs

    def sort_by_expert(
        self, topk_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(order of the token-expert pairs sorted by expert, their tokens, cumulative
        per-expert offsets as int32) — no host sync."""
        k = topk_ids.shape[1]
        flat = topk_ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tok = torch.div(order, k, rounding_mode="floor")
        counts = torch.zeros(self.shape.local_experts, dtype=torch.int64, device=flat.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat))
        return order, tok, torch.cumsum(counts, 0).to(torch.int32)

    def combine(
        self,
        y: torch.Tensor,
        order: torch.Tensor,
        tok: torch.Tensor,
        topk_weights: torch.Tensor,
        t: int,
    ) -> torch.Tensor:
        """Σ over a token's experts of weight × expert output, in float32, as ``[t, D]``."""
        wsort = topk_weights.reshape(-1).index_select(0, order).float()
        out = torch.zeros((t, y.shape[1]), dtype=torch.float32, device=y.device)
        out.index_add_(0, tok, y.float() * wsort.unsqueeze(1))
        return out.to(self.dtype)

    def uniform_routing(self, tokens: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A balanced routing for timing: each token to ``top_k`` consecutive (mod E) experts from
        a uniformly random start; weights 1/k. Every expert expects ``tokens*top_k/E`` rows."""
        e, k = self.shape.local_experts, self.shape.top_k
        g = generator(self.device, seed)
        start = torch.randint(0, e, (tokens, 1), generator=g, device=self.device)
        ids = (start + torch.arange(k, device=self.device).view(1, k)) % e
        return ids, torch.full((tokens, k), 1.0 / k, device=self.device)
