"""One V4 attention layer (+ shared expert) on DeepSeek's kernels: SWA, CSA and HCA.

It computes the function of ``kernels/attention.py::AttentionBlock`` (same weights for the same
seed: it takes them from a reference block) the way the production engine lays it out:

* **Projections**: RMSNorm + FP8 quantization fused in one kernel, then ONE FP8 GEMM for every
  projection of the layer input (q_lora, the KV vector, and for CSA the indexer keys, weights and
  queries); the q up-projection, the grouped output projection, ``wo_b`` and the shared expert
  each read activations quantized once, with SwiGLU fused into the quantization (``fp8.py``).
* **Caches** (``DSPool``): the sliding window and the compressed entries in FlashMLA's FP8
  ``MODEL1`` layout (``layout.py``); the window is a 256-token ring page per sequence, the
  compressed entries 64-entry pages; the partial compression group and the indexer keys in bf16.
* **Decode**: every index the step needs is computed on the device from the plan's slot and
  length tensors (no host work between layers, no host sync), so a decode step captures into a
  CUDA graph. The new tokens are written, completed compression groups folded (every sequence's
  group is compressed each verify position and written only where it completed — the rest go to
  a scratch slot), the CSA indexer scores and top-k run, and FlashMLA's sparse FP8 decode attends
  to the 128 window tokens plus the selected (CSA) or all visible (HCA) entries.
* **Prefill**: one sequence chunk at a time, FlashMLA's sparse prefill over the window keys
  (previous ≤ 128 tokens read back from the FP8 ring + the chunk) and the visible compressed
  entries (read back from the FP8 cache), with per-query indices.

Differences from the reference that change numbers, not work: the caches hold FP8 values (the
reference's are bf16), and activations are quantized per token from float32 rather than from bf16.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._util import as_device, default_dtype, empty, next_pow2, randn
from ..attention import TIE_BREAK, AttentionBlock, compress_groups, indexer_scores
from ..block import LayerBlock
from ..cache import SlotBook
from ..shapes import Kind, LayerShape
from . import flashmla, fused
from .fp8 import FP8Linear, GroupedFP8Linear, quantize_rows, residual_and_shared_expert
from .layout import Model1Cache, Model1Layout
from .plan import DevicePlan

ENTRY_BLOCK = 64  # compressed entries per page block
TOPK_ALIGN = 128  # FlashMLA's sparse prefill wants top-k in multiples of 2 × 64


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class DSPool(SlotBook):
    """One V4 layer's cache for ``max_seqs`` sequences (+ one scratch slot) in FlashMLA layouts.

    Slot bookkeeping is ``SlotBook``'s (as the reference KVPool); the state is filled with random
    values at construction, so ``fill_random`` only sets a length. ``exact`` (the block's
    ``fp8=False``, tests only) keeps unrounded values beside the FP8 bytes.
    """

    def __init__(
        self,
        *,
        kind: Kind,
        shape: LayerShape,
        max_seqs: int,
        max_tokens: int,
        device: torch.device,
        seed: int = 0,
        exact: bool = False,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        if max_seqs <= 0 or max_tokens <= 0:
            raise ValueError("max_seqs and max_tokens must be positive")
        self.kind, self.shape, self.device, self.dtype = kind, shape, device, dtype
        self.kv_dtype = "fp8"  # window and compressed entries (MODEL1); the rest is bookkeeping
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        self.scratch = max_seqs
        slots = max_seqs + 1
        self.layout = Model1Layout.for_head_dim(shape.head_dim)
        self.ring = max(256, next_pow2(2 * shape.window))
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        self.window = Model1Cache(self.layout, slots, self.ring, device, exact)
        self.window.fill_random(gen)
        self.m = shape.compression(kind)
        self.max_entries = -(-max_tokens // self.m) if self.m else 0
        self.e_pad = _round_up(max(self.max_entries, 1), ENTRY_BLOCK) if self.m else 0
        self.comp: Model1Cache | None = None
        self.ring_kv = self.ring_idx = self.comp_idx = None
        d, di = shape.head_dim, shape.indexer_dim
        if self.m:
            pages = slots * self.e_pad // ENTRY_BLOCK
            self.comp = Model1Cache(self.layout, pages, ENTRY_BLOCK, device, exact)
            self.comp.fill_random(gen)
            self.ring_kv = self._rand(gen, slots, self.m, d)
            if kind == "csa":
                self.ring_idx = self._rand(gen, slots, self.m, di)
                self.comp_idx = self._rand(gen, slots, self.e_pad, di)
        self.lengths = np.zeros(max_seqs, dtype=np.int64)
        self.in_use = np.zeros(max_seqs, dtype=bool)

    def _rand(self, gen: torch.Generator, *shape: int) -> torch.Tensor:
        return randn(shape, std=1.0, gen=gen, device=self.device, dtype=self.dtype)

    def window_rows(self, slots: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return slots * self.ring + pos % self.ring

    def entry_rows(self, slots: torch.Tensor, entries: torch.Tensor) -> torch.Tensor:
        return slots * self.e_pad + entries


@dataclass
class DSDecodePlan(DevicePlan):
    """A V4 decode step's device inputs plus the static cap of visible compressed entries per
    compression factor (the indexer and attention index shapes)."""

    entry_cap: dict[int, int] = field(default_factory=dict)
    # FlashMLA's tile-scheduler metadata, computed by the first layer of a kind in a step and
    # reused by the others (it depends on shapes and lengths only), shared by the step's plans
    sched: dict[Any, Any] = field(default_factory=dict)

    @property
    def graph_key(self) -> tuple[int, ...]:
        return tuple(v for kv in sorted(self.entry_cap.items()) for v in kv)

    @classmethod
    def build(
        cls, pool: DSPool, seqs: np.ndarray | list[int], v: int, share: object = None
    ) -> DSDecodePlan:
        slots, lengths, slots_t, lengths_t = cls.inputs(pool, seqs, v, pool.device, share)
        sched = cls.step_sched(share, slots_t)
        caps: dict[int, int] = {}
        if pool.m:
            need = int(((lengths + v - 1) // pool.m).max()) if slots.size else 0
            caps[pool.m] = max(ENTRY_BLOCK, _round_up(need, ENTRY_BLOCK))
        return cls(slots, lengths, v, slots_t, lengths_t, caps, sched)


class DSAttentionBlock(LayerBlock):
    """Attention + shared expert of one V4 layer on FlashMLA and fused FP8 projections."""

    def __init__(
        self,
        shape: LayerShape,
        kind: Kind,
        device: torch.device | str | None = None,
        fp8: bool = True,
        seed: int = 0,
        *,
        dtype: torch.dtype | None = None,
        max_tmp_bytes: int = 1 << 30,
    ) -> None:
        if kind not in ("swa", "csa", "hca"):
            raise ValueError(f"unknown V4 attention kind {kind!r}")
        self.shape, self.kind, self.fp8 = shape, kind, fp8
        self.device = as_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.max_tmp_bytes = max_tmp_bytes
        # the reference block of the same seed owns the weights: same function, checkable
        self.ref = AttentionBlock(shape, kind, self.device, False, seed, dtype=self.dtype)
        r = self.ref
        self.m = r.m
        self.scale = r.scale
        heads_in = [r.wq_a.weight, r.wkv.weight]
        if kind == "csa":
            assert r.wik is not None and r.wiw is not None and r.wiq is not None
            heads_in += [r.wik.weight, r.wiw.weight, r.wiq.weight]
        self.w_in = FP8Linear(heads_in, fp8)
        self.w_qb = FP8Linear([r.wq_b.weight], fp8)
        self.wo_a = GroupedFP8Linear(r.wo_a.weight, fp8)
        self.wo_b = FP8Linear([r.wo_b.weight], fp8)
        self.w_gu = FP8Linear([r.w_gate_up.weight], fp8) if r.w_gate_up is not None else None
        self.w_down = FP8Linear([r.w_down.weight], fp8) if r.w_down is not None else None

    def new_pool(self, max_seqs: int, max_tokens: int, seed: int = 0) -> DSPool:
        return DSPool(
            kind=self.kind,
            shape=self.shape,
            max_seqs=max_seqs,
            max_tokens=max_tokens,
            device=self.device,
            seed=seed,
            exact=not self.fp8,
            dtype=self.dtype,
        )

    def plan_decode(
        self,
        pool: DSPool,
        seqs: np.ndarray | list[int],
        v: int,
        share: object = None,
        **kw: object,
    ) -> DSDecodePlan:
        return DSDecodePlan.build(pool, seqs, v, share)

    # ---- the mixed batch (prefill() and decode() come from LayerBlock) ----
    def forward(
        self,
        x: torch.Tensor,
        pool: DSPool,
        prefill: list[tuple[int, int]] | tuple[tuple[int, int], ...] = (),
        decode: DSDecodePlan | None = None,
        *,
        return_ffn_input: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Rows of ``x``: the prefill segments ``(seq, n)`` in order, then ``B·v`` decode rows."""
        s = self.shape
        t = x.shape[0]
        H, d = s.heads, s.head_dim
        n_dec = decode.B * decode.v if decode is not None else 0
        if sum(n for _, n in prefill) + n_dec != t:
            raise ValueError("rows of x do not match the prefill segments + decode rows")
        r, fp8 = self.ref, self.fp8
        hq, hs, _ = quantize_rows(x, norm_weight=r.attn_norm, fp8=fp8)
        parts = self.w_in(hq[0], hs[0], t)
        qlq, qls, _ = quantize_rows(parts[0], norm_weight=r.q_norm, fp8=fp8)
        q = self.w_qb.one(qlq[0], qls[0], t).view(t, H, d)
        kv = parts[1]  # normalized (and written to the cache) per segment
        idx = tuple(parts[2:5]) if self.kind == "csa" else None
        att = empty((t, H, d), dtype=q.dtype, device=self.device)
        row = 0
        for seq, n in prefill:
            sl = slice(row, row + n)
            sub = tuple(p[sl] for p in idx) if idx is not None else None
            att[sl] = self._prefill_attention(pool, seq, q[sl], kv[sl], sub)
            row += n
        if decode is not None and n_dec:
            sl = slice(row, row + n_dec)
            sub = tuple(p[sl] for p in idx) if idx is not None else None
            att[sl] = self._decode_attention(pool, decode, q[sl], kv[sl], sub)
            pool.lengths[decode.slots] += decode.v
        oq, os_, _ = quantize_rows(att.view(t, H * d), groups=s.o_groups, fp8=fp8)
        o = self.wo_a(oq, os_, t)
        o2q, o2s, _ = quantize_rows(o, fp8=fp8)
        proj = self.wo_b.one(o2q[0], o2s[0], t)
        return residual_and_shared_expert(
            x, proj, r.ffn_norm, self.w_gu, self.w_down, fp8, return_ffn_input
        )

    # ---- prefill ----
    def _prefill_attention(
        self,
        pool: DSPool,
        seq: int,
        q: torch.Tensor,
        kv: torch.Tensor,
        idx: tuple[torch.Tensor, ...] | None,
    ) -> torch.Tensor:
        s, w, m = self.shape, self.shape.window, self.m
        dev = self.device
        pool._check(seq)
        p, n = int(pool.lengths[seq]), kv.shape[0]
        pool._check_capacity(p + n)
        slot = torch.full((1,), seq, device=dev)  # a kernel, not a host copy: capturable
        w0 = min(p, w)
        prev = pool.window.read(
            pool.window_rows(slot, torch.arange(p - w0, p, device=dev)), q.dtype
        )
        c = fused.kv_norm_write(
            kv, self.ref.kv_norm, pool.window, pool.ring, slot, torch.full((1,), p, device=dev),
            n, write_from=max(0, n - pool.ring),
        )  # fmt: skip
        n_ent = self._compress_prefill(pool, seq, p, c, idx[0] if idx is not None else None)
        ents = c[:0]
        if n_ent and pool.comp is not None:
            ents = pool.comp.read(pool.entry_rows(slot, torch.arange(n_ent, device=dev)), q.dtype)
        kv_rows = torch.cat([prev, c.to(q.dtype), ents.to(q.dtype)])
        qpos = p + torch.arange(n, device=dev)
        n_win = torch.clamp(qpos + 1, max=w)  # valid window keys: the newest first
        base = w0 + n  # kv row of compressed entry 0
        if m and n_ent:
            vis = qpos // m
            if self.kind == "hca":
                width = _round_up(n_ent, TOPK_ALIGN)
                extra = base + torch.arange(width, device=dev).expand(n, width)
                n_extra = vis
            else:
                assert idx is not None
                sel = self._select_prefill(pool, seq, idx, vis, n_ent)
                extra = torch.where(sel >= 0, sel + base, -1)
                n_extra = (sel >= 0).sum(1)
        else:
            extra = torch.zeros((n, 0), dtype=torch.long, device=dev)
            n_extra = torch.zeros_like(qpos)
        # one row per query: its window keys, then its entries, then empty (-1) slots
        j = torch.arange(w + extra.shape[1], device=dev).view(1, -1)
        nw = n_win.view(n, 1)
        win_rows = (qpos.view(n, 1) - j) - (p - w0)
        ex = extra.gather(1, (j - nw).clamp(0, max(extra.shape[1] - 1, 0))) if extra.numel() else j
        indices = torch.where(j < nw, win_rows, torch.where(j - nw < n_extra.view(n, 1), ex, -1))
        topk_len = (n_win + n_extra).to(torch.int32)
        out = flashmla.sparse_prefill(
            q, kv_rows, indices.to(torch.int32), self.scale, topk_len, d_v=s.head_dim
        )
        pool.lengths[seq] = p + n
        return out

    def _select_prefill(
        self,
        pool: DSPool,
        seq: int,
        idx: tuple[torch.Tensor, ...],
        vis: torch.Tensor,
        n_ent: int,
    ) -> torch.Tensor:
        """CSA: the indexer's top-k visible entries per query ``[n, k_pad]``, best first (``-1``
        after the visible ones), scored in query chunks so the ``[chunk, entries]`` scores stay
        under the temp budget."""
        s = self.shape
        _, iw, iq = idx
        n = vis.shape[0]
        assert pool.comp_idx is not None
        keys = pool.comp_idx[seq, :n_ent].unsqueeze(0)
        k = min(s.index_topk, n_ent)
        k_pad = _round_up(k, TOPK_ALIGN)
        out = torch.full((n, k_pad), -1, dtype=torch.int64, device=self.device)
        chunk = max(1, min(n, self.max_tmp_bytes // max(1, n_ent * 8)))
        for c0 in range(0, n, chunk):
            c1 = min(n, c0 + chunk)
            sc = indexer_scores(
                iq[c0:c1].reshape(1, c1 - c0, s.indexer_heads, s.indexer_dim).to(keys.dtype),
                iw[c0:c1].reshape(1, c1 - c0, s.indexer_heads).to(keys.dtype),
                keys,
                vis=vis[c0:c1].view(1, -1),
                max_tmp_bytes=self.max_tmp_bytes // 2,
            )[0]
            top_v, top_i = sc.topk(k, dim=-1, sorted=True)
            out[c0:c1, :k] = torch.where(torch.isfinite(top_v), top_i, -1)
        return out

    def _compress_prefill(
        self, pool: DSPool, seq: int, p: int, c: torch.Tensor, ik: torch.Tensor | None
    ) -> int:
        """Fold the new KV vectors into complete groups (as the reference); entries go to the FP8
        cache, indexer keys to bf16. Returns the entries the sequence now holds."""
        m = self.m
        if not m:
            return 0
        assert pool.ring_kv is not None and pool.comp is not None
        dev = self.device
        r = p % m
        n = c.shape[0]
        c = c.to(pool.ring_kv.dtype)
        arr = torch.cat([pool.ring_kv[seq, :r], c]) if r else c
        arr_i = None
        if ik is not None:
            assert pool.ring_idx is not None
            ik = ik.to(pool.ring_idx.dtype)
            arr_i = torch.cat([pool.ring_idx[seq, :r], ik]) if r else ik
        g = (r + n) // m
        e0 = p // m
        if g:
            ent, ent_i = compress_groups(
                arr[: g * m].view(g, m, -1),
                self.ref.gate,
                self.ref.gate_bias,
                arr_i[: g * m].view(g, m, -1) if arr_i is not None else None,
            )
            slot = torch.full((g,), seq, device=dev)
            pool.comp.write(pool.entry_rows(slot, torch.arange(e0, e0 + g, device=dev)), ent)
            if ent_i is not None:
                assert pool.comp_idx is not None
                pool.comp_idx[seq, e0 : e0 + g] = ent_i
        rest = r + n - g * m
        if rest:
            pool.ring_kv[seq, :rest] = arr[g * m :]
            if arr_i is not None:
                assert pool.ring_idx is not None
                pool.ring_idx[seq, :rest] = arr_i[g * m :]
        return e0 + g

    # ---- decode ----
    def _decode_attention(
        self,
        pool: DSPool,
        plan: DSDecodePlan,
        q: torch.Tensor,
        kv: torch.Tensor,
        idx: tuple[torch.Tensor, ...] | None,
    ) -> torch.Tensor:
        """Device-only: no host reads, so the step can be captured in a CUDA graph."""
        s, w, m = self.shape, self.shape.window, self.m
        B, v, H, d = plan.B, plan.v, s.heads, s.head_dim
        slots, L = plan.slots_t, plan.lengths_t
        c = fused.kv_norm_write(kv, self.ref.kv_norm, pool.window, pool.ring, slots, L, v)
        if m:
            fused.compress_decode(
                pool, self.ref.gate, self.ref.gate_bias, c, idx[0] if idx else None, slots, L, v
            )
        cap = plan.entry_cap.get(m, 0)
        hca = (m, cap, pool.e_pad) if self.kind == "hca" else None
        win, extra_idx, extra_len = fused.decode_indices(slots, L, v, w, pool.ring, hca)
        if self.kind == "csa":
            assert idx is not None and pool.comp_idx is not None
            _, iw, iq = idx
            sc = fused.decode_indexer_scores(
                iq, iw, pool.comp_idx, slots, L, v, m, cap, s.indexer_heads, s.indexer_dim,
                TIE_BREAK,
            )  # fmt: skip
            top_v, top_i = sc.topk(min(s.index_topk, cap), dim=-1, sorted=False)
            extra_idx = fused.rows_from_topk(top_v, top_i, slots, pool.e_pad)
        out = flashmla.sparse_decode(
            q.view(B, v, H, d),
            pool.window,
            win,
            self.scale,
            pool.comp if m else None,
            extra_idx,
            extra_len,
            sched=plan.sched,
            sched_key=(self.kind, cap),
        )
        return out.view(B * v, H, d)
