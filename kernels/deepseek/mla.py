"""One DeepSeek-V3 MLA layer (+ shared expert) on DeepSeek's kernels, in both of MLA's forms.

Weights (random, seeded, at the model's widths): ``wq_a [q_lora, hidden]``, ``q_norm``,
``wq_b [H·(nope+rope), q_lora]``, ``wkv_a [kv_lora+rope, hidden]``, ``kv_norm [kv_lora]``,
``wkv_b [H·(nope+v), kv_lora]``, ``wo [hidden, H·v]``, shared expert. Rotary embeddings are left
out (they change no shapes), as in the V4 blocks.

* **Cache** (``MLAPool``): the latent (``kv_lora`` normalized values + ``rope`` values = 576) per
  token in bf16 pages of 64 tokens, the layout FlashMLA's dense decode reads; sequence ``s`` owns
  a contiguous run of pages.
* **Decode, absorbed form** (what engines run for decode): ``q_nope`` is multiplied into the
  latent space by ``W_UK`` (a per-head bmm), FlashMLA's dense MLA decode attends over the paged
  latent cache with 576-wide keys and 512-wide values (causal over the ``s_q`` verify tokens), and
  ``W_UV`` maps the result back per head before ``wo``, writing the ``[T, H, v]`` rows ``wo``'s
  quantization reads. As engines run it, a decode-only batch's new latents are normalized and
  written into the cache in one kernel (``fused.mla_latent_write``), and the step's cache rows,
  page table and lengths are made once per step (kept with FlashMLA's scheduler metadata in
  ``MLADecodePlan.sched``), not in every layer; ``DEEPINFER_MLA_FUSED=0`` restores the block as
  it was before (the norm, concatenation, cast and index copy as torch kernels, the indices per
  layer, the output copied into place): a calibration's baseline on the same GPU.
* **Prefill, MHA form** (what engines run for prefill): the latent of the prefix and the chunk
  is up-projected by ``wkv_b`` to per-head keys (nope + shared rope = 192) and values (128), and
  the chunk's queries attend causally (aligned to the end). On a GPU this runs as engines run
  chunked MLA prefill (vLLM's and SGLang's MLA backends): the chunk over its own keys, causal,
  and the chunk over the prefix's keys, unmasked, each a fused attention kernel returning its
  log-sum-exp, merged by those (``prefill_attention``). The kernel is cuDNN's (FlashAttention-3
  class on Hopper; engines ship FA3, which this image cannot build), checked once per process
  against FlashAttention-2; where cuDNN is missing or disagrees, FlashAttention-2 with an
  end-aligned causal mask and values zero-padded to 192 (2.2-2.4× slower without a prefix,
  device call 33). The up-projection of the prefix is the term of a chunk's cost that grows
  with p.

All projections are FP8 (``fp8.py``); the absorbed bmm's run in bf16, as in DeepSeek's engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._util import as_device, decided_once, default_dtype, generator, randn, rms_norm
from ..block import LayerBlock
from ..cache import SlotBook
from ..shapes import LayerShape
from ..triton_merge import merge_reference, merge_states, random_states
from . import flashmla
from .fp8 import FP8Linear, quantize_rows, residual_and_shared_expert, used
from .fused import mla_latent_write
from .plan import DevicePlan

PAGE = 64  # FlashMLA's dense decode page size


class MLAPool(SlotBook):
    """The paged bf16 latent cache of one MLA layer (+ a scratch slot), KVPool's bookkeeping."""

    def __init__(
        self,
        *,
        shape: LayerShape,
        max_seqs: int,
        max_tokens: int,
        device: torch.device,
        seed: int = 0,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        if max_seqs <= 0 or max_tokens <= 0:
            raise ValueError("max_seqs and max_tokens must be positive")
        self.kind, self.shape, self.device, self.dtype = "mla", shape, device, dtype
        self.kv_dtype = "bf16" if dtype == torch.bfloat16 else "fp32"
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        self.scratch = max_seqs
        self.m = 0
        self.pages_per_seq = -(-max_tokens // PAGE)
        self.width = shape.kv_lora + shape.rope_dim
        gen = generator(device, seed)
        pages = (max_seqs + 1) * self.pages_per_seq
        self.cache = torch.empty((pages, PAGE, 1, self.width), device=device, dtype=dtype)
        self.rows = self.cache.view(pages * PAGE, self.width)
        step = 1 << 18  # rows per chunk: random fill without a float32 copy of the whole cache
        for r0 in range(0, self.rows.shape[0], step):
            chunk = self.rows[r0 : r0 + step]
            chunk.copy_(randn(chunk.shape, std=1.0, gen=gen, device=device, dtype=dtype))
        self.lengths = np.zeros(max_seqs, dtype=np.int64)
        self.in_use = np.zeros(max_seqs, dtype=bool)

    def token_rows(self, slots: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return slots * (self.pages_per_seq * PAGE) + pos


@dataclass
class MLADecodePlan(DevicePlan):
    """An MLA decode step's device inputs plus the page-table width (a graph's shape)."""

    page_cap: int = 1
    # FlashMLA's scheduler metadata, made by the step's first layer and reused by the others
    # (as the V4 blocks' plans share theirs), shared by the step's plans
    sched: dict[Any, Any] = field(default_factory=dict)

    @property
    def graph_key(self) -> tuple[int, ...]:
        return (self.page_cap,)

    @classmethod
    def build(
        cls, pool: MLAPool, seqs: np.ndarray | list[int], v: int, share: object = None
    ) -> MLADecodePlan:
        slots, lengths, slots_t, lengths_t = cls.inputs(pool, seqs, v, pool.device, share)
        need = int((lengths + v).max()) if slots.size else 1
        cap = min(pool.pages_per_seq, -(-need // PAGE))
        sched = cls.step_sched(share, slots_t)
        return cls(slots, lengths, v, slots_t, lengths_t, cap, sched)


class MLABlock(LayerBlock):
    """Attention (MLA) + shared expert of one V3 layer."""

    def __init__(
        self,
        shape: LayerShape,
        kind: str = "mla",
        device: torch.device | str | None = None,
        fp8: bool = True,
        seed: int = 0,
        *,
        dtype: torch.dtype | None = None,
        max_tmp_bytes: int = 1 << 30,
    ) -> None:
        if not shape.is_mla:
            raise ValueError("MLABlock needs a shape with MLA widths (kv_lora, rope_dim, ...)")
        self.shape, self.kind, self.fp8 = shape, "mla", fp8
        self.device = as_device(device)
        self.dtype = dtype or default_dtype(self.device)
        s, dev, dt = shape, self.device, self.dtype
        H, nope, rope, vh, lat = s.heads, s.qk_nope, s.rope_dim, s.v_head, s.kv_lora
        gen = generator(dev, seed * 1000 + 7)

        def w(o: int, i: int) -> torch.Tensor:
            return randn((o, i), std=i**-0.5, gen=gen, device=dev, dtype=dt)

        self.attn_norm = torch.ones(s.hidden, device=dev, dtype=dt)
        self.q_norm = torch.ones(s.q_lora, device=dev, dtype=dt)
        self.kv_norm = torch.ones(lat, device=dev, dtype=dt)
        self.ffn_norm = torch.ones(s.hidden, device=dev, dtype=dt)
        self.wq_a, self.wkv_a = w(s.q_lora, s.hidden), w(lat + rope, s.hidden)
        self.wq_b = w(H * (nope + rope), s.q_lora)
        self.wkv_b = w(H * (nope + vh), lat)
        self.wo = w(s.hidden, H * vh)
        kvb = self.wkv_b.view(H, nope + vh, lat)
        absorb = torch.bfloat16 if fp8 else dt  # the absorbed bmm's run in bf16 in production
        self.w_uk = kvb[:, :nope].to(absorb).contiguous()  # [H, nope, lat]
        self.w_uv_t = kvb[:, nope:].transpose(1, 2).to(absorb).contiguous()  # [H, lat, v]
        self.scale = (nope + rope) ** -0.5
        self.w_in = FP8Linear([self.wq_a, self.wkv_a], fp8)
        self.w_qb = FP8Linear([self.wq_b], fp8)
        self.w_kvb = FP8Linear([self.wkv_b], fp8)
        self.w_o = FP8Linear([self.wo], fp8)
        self.w_gu = self.w_down = None
        if s.shared_width:
            self.w_gate_up = w(2 * s.shared_width, s.hidden)
            self.w_dn = w(s.hidden, s.shared_width)
            self.w_gu, self.w_down = FP8Linear([self.w_gate_up], fp8), FP8Linear([self.w_dn], fp8)
        if dev.type == "cuda" and dt in (torch.float16, torch.bfloat16):
            cudnn_split_ok(dev, dt, nope + rope, vh)  # decided before any graph is captured
            triton_merge_ok(dev)

    def new_pool(self, max_seqs: int, max_tokens: int, seed: int = 0) -> MLAPool:
        return MLAPool(
            shape=self.shape,
            max_seqs=max_seqs,
            max_tokens=max_tokens,
            device=self.device,
            seed=seed,
            dtype=torch.bfloat16 if self.fp8 else self.dtype,
        )

    def plan_decode(
        self,
        pool: MLAPool,
        seqs: np.ndarray | list[int],
        v: int,
        share: object = None,
        **kw: object,
    ) -> MLADecodePlan:
        return MLADecodePlan.build(pool, seqs, v, share)

    def forward(
        self,
        x: torch.Tensor,
        pool: MLAPool,
        prefill: list[tuple[int, int]] | tuple[tuple[int, int], ...] = (),
        decode: MLADecodePlan | None = None,
        *,
        return_ffn_input: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        s = self.shape
        t = x.shape[0]
        H, nope, rope, lat = s.heads, s.qk_nope, s.rope_dim, s.kv_lora
        n_dec = decode.B * decode.v if decode is not None else 0
        if sum(n for _, n in prefill) + n_dec != t:
            raise ValueError("rows of x do not match the prefill segments + decode rows")
        hq, hs, _ = quantize_rows(x, norm_weight=self.attn_norm, fp8=self.fp8)
        ql_raw, kv_raw = self.w_in(hq[0], hs[0], t)
        qlq, qls, _ = quantize_rows(ql_raw, norm_weight=self.q_norm, fp8=self.fp8)
        q = self.w_qb.one(qlq[0], qls[0], t).view(t, H, nope + rope)
        att = torch.empty((t, H, s.v_head), dtype=q.dtype, device=self.device)
        if not prefill and n_dec and fused_decode():  # the engines' decode-only step
            assert decode is not None
            self._decode_attention(pool, decode, q, kv_raw, out=att)
            pool.lengths[decode.slots] += decode.v
            return self._output(x, att, return_ffn_input)
        latent = torch.cat([rms_norm(kv_raw[:, :lat], self.kv_norm), kv_raw[:, lat:]], dim=1)
        row = 0
        for seq, n in prefill:
            sl = slice(row, row + n)
            att[sl] = self._prefill_attention(pool, seq, q[sl], latent[sl])
            row += n
        if decode is not None and n_dec:
            sl = slice(row, row + n_dec)
            att[sl] = self._decode_attention(pool, decode, q[sl], latent[sl])
            pool.lengths[decode.slots] += decode.v
        return self._output(x, att, return_ffn_input)

    def _output(
        self, x: torch.Tensor, att: torch.Tensor, return_ffn_input: bool
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The output projection of the attention rows ``att [T, H, v]``, the residual and the
        shared expert."""
        t = x.shape[0]
        aq, as_, _ = quantize_rows(att.view(t, -1), fp8=self.fp8)
        proj = self.w_o.one(aq[0], as_[0], t)
        return residual_and_shared_expert(
            x, proj, self.ffn_norm, self.w_gu, self.w_down, self.fp8, return_ffn_input
        )

    def _prefill_attention(
        self, pool: MLAPool, seq: int, q: torch.Tensor, latent: torch.Tensor
    ) -> torch.Tensor:
        s, dev = self.shape, self.device
        H, nope, rope, vh, lat = s.heads, s.qk_nope, s.rope_dim, s.v_head, s.kv_lora
        pool._check(seq)
        p, n = int(pool.lengths[seq]), q.shape[0]
        pool._check_capacity(p + n)
        slot = torch.full((1,), seq, device=dev)  # a kernel, not a copy: capturable
        pool.rows.index_copy_(
            0, pool.token_rows(slot, torch.arange(p, p + n, device=dev)), latent.to(pool.dtype)
        )
        allrows = pool.rows.index_select(0, pool.token_rows(slot, torch.arange(p + n, device=dev)))
        lq, ls, _ = quantize_rows(allrows[:, :lat], fp8=self.fp8)
        kvb = self.w_kvb.one(lq[0], ls[0], p + n).view(p + n, H, nope + vh)
        k = torch.cat(
            [kvb[..., :nope], allrows[:, lat:].view(p + n, 1, rope).expand(-1, H, -1)], -1
        )
        out = prefill_attention(q, k, kvb[..., nope:], self.scale)
        pool.lengths[seq] = p + n
        return out

    def _decode_attention(
        self,
        pool: MLAPool,
        plan: MLADecodePlan,
        q: torch.Tensor,
        latent: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Device-only (graph-capturable): write the new latents, absorbed attention. With
        ``out`` (``[T, H, v]``, the fused path) ``latent`` is the projection's raw rows, normalized
        as they are written, and the attention's rows are written into ``out``."""
        s = self.shape
        B, v, H, nope = plan.B, plan.v, s.heads, s.qk_nope
        rows, pages, seqlens = decode_indices(pool, plan, per_step=out is not None)
        if out is not None:
            mla_latent_write(latent, self.kv_norm, pool.rows, rows)
        else:
            pool.rows.index_copy_(0, rows, latent.to(pool.dtype))
        dt = pool.dtype
        q_lat = torch.bmm(q[..., :nope].transpose(0, 1).to(dt), self.w_uk.to(dt))
        q_full = torch.cat([q_lat.transpose(0, 1), q[..., nope:].to(dt)], dim=-1)
        att = flashmla.dense_decode(
            q_full.reshape(B, v, H, -1).contiguous(),
            pool.cache,
            pages,
            seqlens,
            self.scale,
            causal=v > 1,
            d_v=s.kv_lora,
            # DEEPINFER_MLA_SCHED=layer: every layer makes its own (the block as it was, a
            # calibration's baseline on the same GPU)
            sched=None if os.environ.get("DEEPINFER_MLA_SCHED") == "layer" else plan.sched,
            sched_key=("mla", plan.page_cap),
        )  # [B, v, H, kv_lora]
        att_h = att.reshape(B * v, H, -1).transpose(0, 1)
        if out is not None:  # W_UV's bmm writes the [T, H, v] rows in place (as SGLang's)
            torch.bmm(att_h, self.w_uv_t.to(dt), out=out.transpose(0, 1))
            return out
        o = torch.bmm(att_h, self.w_uv_t.to(dt))  # [H, T, v]
        return o.transpose(0, 1)


def fused_decode() -> bool:
    """Whether a decode-only step takes the engines' fused path (``DEEPINFER_MLA_FUSED=0``: the
    block as it was, a calibration's baseline)."""
    return os.environ.get("DEEPINFER_MLA_FUSED") != "0"


def decode_indices(
    pool: MLAPool, plan: MLADecodePlan, per_step: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the new tokens' cache rows ``[B·v]``, the page table ``[B, page_cap]`` and the lengths
    after the step ``[B]``, both int32) of a decode step. ``per_step``: made by the step's first
    layer and kept with its scheduler metadata for the others, as engines make them once per
    step (every layer's pool has the same geometry); else made here."""
    key = ("mla_indices", pool.pages_per_seq, plan.page_cap)
    if per_step and key in plan.sched:
        return plan.sched[key]
    dev = pool.device
    B, v = plan.B, plan.v
    slots, L = plan.slots_t, plan.lengths_t
    pos = L.view(B, 1) + torch.arange(v, device=dev).view(1, v)
    rows = pool.token_rows(slots.view(B, 1), pos).reshape(-1)
    pages = slots.view(B, 1) * pool.pages_per_seq + torch.arange(plan.page_cap, device=dev)
    made = (rows, pages.to(torch.int32), (L + v).to(torch.int32))
    if per_step:
        plan.sched[key] = made
    return made


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """``q [n, H, d]`` (the last n positions) over ``k [p+n, H, d]``, ``v [p+n, H, d_v]``,
    causal, end-aligned (the prefix stays visible): ``[n, H, d_v]``. On a GPU in half precision
    the split form with cuDNN's kernel where it passed its check (``cudnn_split_ok``), else
    FlashAttention-2; elsewhere SDPA with an end-aligned mask."""
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        if cudnn_split_ok(q.device, q.dtype, q.shape[-1], v.shape[-1]):
            return _split_attention(q, k, v, scale, _cudnn)
        return _flash_causal(q, k, v, scale)
    return _sdpa_causal(q, k, v, scale)


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1).unsqueeze(0)  # [m, H, d] -> [1, H, m, d]


def _cudnn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """cuDNN's fused attention of ``[1, H, m, d]`` inputs: (output, natural-log LSE [1, H, m])."""
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=scale
    )[:2]
    return out, lse.reshape(out.shape[:3]).float()


# (q, k, v [1, H, m, d], scale, causal) -> (output, natural-log LSE [1, H, m])
AttentionKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, float, bool], tuple[torch.Tensor, torch.Tensor]
]


def _split_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, kernel: AttentionKernel
) -> torch.Tensor:
    """The chunk over its own keys (causal) and over the prefix (unmasked), merged by their
    log-sum-exps in float32: what engines' chunked MLA prefill computes."""
    n, kv = q.shape[0], k.shape[0]
    p = kv - n
    qh = _heads_first(q)
    o_new, l_new = kernel(qh, _heads_first(k[p:]), _heads_first(v[p:]), scale, True)
    if p == 0:
        return o_new[0].transpose(0, 1)
    o_pre, l_pre = kernel(qh, _heads_first(k[:p]), _heads_first(v[:p]), scale, False)
    if triton_merge_ok(q.device):
        used.add("triton_merge")
        return merge_states(o_new, l_new, o_pre, l_pre)
    return merge_reference(o_new, l_new, o_pre, l_pre)


_MERGE_OK: dict[str, bool] = {}  # device -> does the Triton merge run there and agree


def triton_merge_ok(device: torch.device) -> bool:
    """Decided once per device, outside any graph capture (inside one, an undecided device
    takes the reference merge): the kernel on 300 tokens × 8 heads against its reference;
    ``DEEPINFER_MERGE=torch`` keeps the reference (the baseline the kernel is timed against)."""
    if os.environ.get("DEEPINFER_MERGE") == "torch" or device.type != "cuda":
        return False
    return decided_once(_MERGE_OK, str(device), lambda: _merge_agrees(device)) is True


def _merge_agrees(device: torch.device) -> bool:
    states = random_states(8, 300, 128, device, seed=13)
    try:
        got = merge_states(*states).float()
    except Exception:  # no Triton, or no kernel for this GPU: the reference's
        return False
    want = merge_reference(*states).float()
    return bool((got - want).norm() <= 1e-2 * want.norm())


_CUDNN_SPLIT: dict[tuple[str, torch.dtype, int, int], bool] = {}
CUDNN_TOL = 2e-2  # relative error of the split form against FlashAttention-2, bf16 inputs


def cudnn_split_ok(device: torch.device, dtype: torch.dtype, d_qk: int, d_v: int) -> bool:
    """Does the split form on cuDNN run here and agree with FlashAttention-2 (relative error
    ≤ CUDNN_TOL on a chunk of 200 after a prefix of 300, 8 heads)? Decided once per device,
    dtype and head widths, outside any graph capture (inside one, an undecided case takes
    FlashAttention-2); ``DEEPINFER_PREFILL_ATTENTION=flash`` forces FlashAttention-2."""
    if os.environ.get("DEEPINFER_PREFILL_ATTENTION") == "flash" or device.type != "cuda":
        return False
    key = (str(device), dtype, d_qk, d_v)
    return decided_once(_CUDNN_SPLIT, key, lambda: _split_agrees(device, dtype, d_qk, d_v)) is True


def _split_agrees(device: torch.device, dtype: torch.dtype, d_qk: int, d_v: int) -> bool:
    g = torch.Generator(device=device).manual_seed(11)
    n, p, h = 200, 300, 8
    q, k = (torch.randn((m, h, d_qk), generator=g, device=device).to(dtype) for m in (n, n + p))
    v = torch.randn((n + p, h, d_v), generator=g, device=device).to(dtype)
    try:
        got = _split_attention(q, k, v, d_qk**-0.5, _cudnn).float()
        want = _flash_causal(q, k, v, d_qk**-0.5).float()
    except (RuntimeError, NotImplementedError):  # no cuDNN attention for this GPU / shape
        return False
    return bool((got - want).norm() <= CUDNN_TOL * want.norm())


def _flash_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """FlashAttention-2, whose causal mask is end-aligned when there are more keys than queries
    (SDPA given a lower-right mask may fall back to a slower kernel for the same work: 2× per
    attended pair measured on the H200 with a prefix); values zero-padded to the key width."""
    d, dv = q.shape[-1], v.shape[-1]
    vp = torch.nn.functional.pad(v, (0, d - dv)) if dv < d else v
    out = torch.ops.aten._scaled_dot_product_flash_attention(
        _heads_first(q), _heads_first(k), _heads_first(vp), 0.0, True, False, scale=scale
    )[0]
    return out[0].transpose(0, 1)[..., :dv]


def _sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """SDPA with an end-aligned causal mask (CPU, or float32)."""
    from torch.nn.attention.bias import causal_lower_right

    n, kv = q.shape[0], k.shape[0]
    qh, kh, vh = (_heads_first(t).to(q.dtype) for t in (q, k, v))
    mask = causal_lower_right(n, kv) if kv != n else None
    out = torch.nn.functional.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask, is_causal=mask is None, scale=scale
    )
    return out[0].transpose(0, 1)
