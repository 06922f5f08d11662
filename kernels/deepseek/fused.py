"""Fused Triton kernels of the V4 decode step and V3's latent write (and their torch equivalents).

A decode step at production batch sizes is short (tens of µs of memory traffic per layer), so
its cost is set by how many kernels it launches: the unfused torch path of a V4 layer ran ~70
small kernels (~5 µs each even inside a CUDA graph) against ~60 µs of bytes. These kernels do in
one launch what the torch path does in many, with the same arithmetic:

=======================  ===========================================================================
``kv_norm_write``        RMSNorm of the new KV vectors, their bf16 rows for the caller, and their
                         FP8 MODEL1 bytes + UE8M0 scales written into the window ring pages
``decode_indices``       every query's 128 window indices (newest first: empty ones last) and,
                         for HCA, its visible compressed entries (oldest first) and their count
``decode_indexer``       the CSA lightning indexer of decode queries over their sequences' keys,
                         read in place from the pool (no gather of the keys)
``rows_from_topk``       the CSA indexer's top-k as compressed-cache rows (-1 where -inf)
``compress_decode``      each sequence's v new tokens into its partial compression group, and each
                         group that completes folded into one FP8 entry (+ its bf16 indexer key)
``mla_latent_write``     V3's MLA decode: RMSNorm of the new latents' first ``kv_lora`` values, the
                         rope values beside them, written as bf16 rows of the paged latent cache
=======================  ===========================================================================

Each has a torch path used on the CPU, at toy widths (the kernels assume FlashMLA's MODEL1 layout:
d = 512 = 7 FP8 tiles of 64 + 64 bf16 rope values), and where Triton is missing; ``used`` records
which ran. Indices put empty (-1) entries last: FlashMLA's kernels are tested with invalid
indices at the end of a row, so rows are built that way.
"""

from __future__ import annotations

from typing import Any

import torch

from .._util import rms_norm
from ..attention import compress_groups
from .layout import Model1Cache, Model1Layout

used: set[str] = set()

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _kv_norm_write_kernel(
        KV,
        stride_kv,
        W,
        C,
        SLOTS,
        LENS,
        V,
        WRITE_FROM,
        CACHE,
        page_stride,
        ring,
        eps,
        D: tl.constexpr,
        NOPE: tl.constexpr,
        TILE: tl.constexpr,
        NT: tl.constexpr,
    ):
        r = tl.program_id(0)
        b = r // V
        i = r % V
        slot = tl.load(SLOTS + b).to(tl.int64)
        pos = tl.load(LENS + b) + i
        off = pos % ring
        t = tl.arange(0, NT)[:, None]
        c = tl.arange(0, TILE)[None, :]
        idx = t * TILE + c
        x = tl.load(KV + r * stride_kv + idx).to(tl.float32)
        w = tl.load(W + idx).to(tl.float32)
        ms = tl.sum(tl.sum(x * x, axis=1), axis=0) / D
        y = x * tl.rsqrt(ms + eps) * w
        tl.store(C + r * D + idx, y.to(tl.bfloat16))
        if r >= WRITE_FROM:
            amax = tl.max(tl.abs(y), axis=1)
            e = tl.ceil(tl.log2(tl.maximum(amax / 448.0, 1e-4)))
            q = tl.clamp(y / tl.exp2(e)[:, None], -448.0, 448.0)
            row_bytes = NOPE + 2 * (D - NOPE)
            tok = CACHE + slot * page_stride + off * row_bytes
            nope = idx < NOPE
            tl.store(tok.to(tl.pointer_type(tl.float8e4nv)) + idx, q.to(tl.float8e4nv), mask=nope)
            rope = (tok + NOPE).to(tl.pointer_type(tl.bfloat16))
            tl.store(rope + (idx - NOPE), y.to(tl.bfloat16), mask=idx >= NOPE)
            sc = CACHE + slot * page_stride + ring * row_bytes + off * (NOPE // TILE + 1)
            tiles = tl.arange(0, NT)
            tl.store(sc + tiles, (e + 127.0).to(tl.uint8), mask=tiles < NOPE // TILE)

    @triton.jit
    def _decode_index_kernel(
        SLOTS,
        LENS,
        V,
        WIN,
        ring,
        EXTRA,
        ELEN,
        e_pad,
        m,
        W: tl.constexpr,
        HCA: tl.constexpr,
        BLOCK: tl.constexpr,
        CAP: tl.constexpr,
    ):
        r = tl.program_id(0)
        b = r // V
        i = r % V
        slot = tl.load(SLOTS + b).to(tl.int64)
        qpos = tl.load(LENS + b) + i
        k = tl.arange(0, W)
        kp = qpos - k
        win = tl.where(kp >= 0, slot * ring + kp % ring, -1)
        tl.store(WIN + r * W + k, win.to(tl.int32))
        if HCA:
            vis = qpos // m
            for c0 in tl.static_range(0, CAP, BLOCK):
                e = c0 + tl.arange(0, BLOCK)
                val = tl.where(e < vis, slot * e_pad + e, -1)
                tl.store(EXTRA + r * CAP + e, val.to(tl.int32), mask=e < CAP)
            if i == V - 1:
                tl.store(ELEN + b, tl.minimum(vis, CAP).to(tl.int32))

    @triton.jit
    def _rows_from_topk_kernel(TOPV, TOPI, SLOTS, V, OUT, k, e_pad, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        slot = tl.load(SLOTS + r // V).to(tl.int64)
        j = tl.arange(0, BLOCK)
        mask = j < k
        tv = tl.load(TOPV + r * k + j, mask=mask, other=float("-inf"))
        ti = tl.load(TOPI + r * k + j, mask=mask, other=0)
        val = tl.where(tv > float("-inf"), slot * e_pad + ti, -1)
        tl.store(OUT + r * k + j, val.to(tl.int32), mask=mask)

    @triton.jit
    def _compress_decode_kernel(
        C,
        IK,
        stride_ik,
        SLOTS,
        LENS,
        RING_KV,
        RING_IDX,
        GATE,
        BIAS,
        CACHE,
        page_stride,
        e_pad,
        COMP_IDX,
        M: tl.constexpr,
        M_BLOCK: tl.constexpr,
        D: tl.constexpr,
        DI: tl.constexpr,
        NOPE: tl.constexpr,
        TILE: tl.constexpr,
        NT: tl.constexpr,
        PAGE: tl.constexpr,
        HAS_IDX: tl.constexpr,
        V: tl.constexpr,
    ):
        b = tl.program_id(0)
        slot = tl.load(SLOTS + b).to(tl.int64)
        L = tl.load(LENS + b)
        jm = tl.arange(0, M_BLOCK)
        jmask = jm < M
        dcol = tl.arange(0, D)
        icol = tl.arange(0, DI)
        row_bytes = NOPE + 2 * (D - NOPE)
        for i in tl.static_range(V):
            pos = L + i
            ri = pos % M
            row = b * V + i
            tl.store(RING_KV + (slot * M + ri) * D + dcol, tl.load(C + row * D + dcol))
            if HAS_IDX:
                iv = tl.load(IK + row * stride_ik + icol)
                tl.store(RING_IDX + (slot * M + ri) * DI + icol, iv)
            tl.debug_barrier()
            if (pos + 1) % M == 0:
                acc = tl.zeros([M_BLOCK], dtype=tl.float32)
                for t in tl.static_range(NT):
                    cols = t * TILE + tl.arange(0, TILE)
                    g = tl.load(
                        RING_KV + (slot * M + jm[:, None]) * D + cols[None, :],
                        mask=jmask[:, None],
                        other=0.0,
                    ).to(tl.float32)
                    gv = tl.load(GATE + cols).to(tl.float32)
                    acc += tl.sum(g * gv[None, :], axis=1)
                logits = acc + tl.load(BIAS + jm, mask=jmask, other=0.0).to(tl.float32)
                logits = tl.where(jmask, logits, float("-inf"))
                p = tl.exp(logits - tl.max(logits, axis=0))
                p = p / tl.sum(p, axis=0)
                e = (pos + 1) // M - 1
                erow = slot * e_pad + e
                base = CACHE + (erow // PAGE) * page_stride
                tok = base + (erow % PAGE) * row_bytes
                scb = base + PAGE * row_bytes + (erow % PAGE) * (NOPE // TILE + 1)
                for t in tl.static_range(NT):
                    cols = t * TILE + tl.arange(0, TILE)
                    g = tl.load(
                        RING_KV + (slot * M + jm[:, None]) * D + cols[None, :],
                        mask=jmask[:, None],
                        other=0.0,
                    ).to(tl.float32)
                    val = tl.sum(p[:, None] * g, axis=0)
                    if t * TILE < NOPE:
                        amax = tl.max(tl.abs(val), axis=0)
                        ex = tl.ceil(tl.log2(tl.maximum(amax / 448.0, 1e-4)))
                        q = tl.clamp(val / tl.exp2(ex), -448.0, 448.0)
                        tl.store(tok.to(tl.pointer_type(tl.float8e4nv)) + cols, q.to(tl.float8e4nv))
                        tl.store(scb + t, (ex + 127.0).to(tl.uint8))
                    else:
                        rope = (tok + NOPE).to(tl.pointer_type(tl.bfloat16))
                        tl.store(rope + (cols - NOPE), val.to(tl.bfloat16))
                if HAS_IDX:
                    gi = tl.load(
                        RING_IDX + (slot * M + jm[:, None]) * DI + icol[None, :],
                        mask=jmask[:, None],
                        other=0.0,
                    ).to(tl.float32)
                    vi = tl.sum(p[:, None] * gi, axis=0)
                    tl.store(COMP_IDX + erow * DI + icol, vi.to(tl.bfloat16))
            tl.debug_barrier()

    @triton.jit
    def _decode_indexer_kernel(
        IQ,
        stride_iq,
        IW,
        stride_iw,
        KEYS,
        key_slot_stride,
        SLOTS,
        LENS,
        OUT,
        V,
        m,
        cap,
        tie,
        HI: tl.constexpr,
        DI: tl.constexpr,
        BLOCK_E: tl.constexpr,
    ):
        r = tl.program_id(0)
        eb = tl.program_id(1)
        b = r // V
        i = r % V
        slot = tl.load(SLOTS + b).to(tl.int64)
        vis = (tl.load(LENS + b) + i) // m
        h = tl.arange(0, HI)
        d = tl.arange(0, DI)
        q = tl.load(IQ + r * stride_iq + h[:, None] * DI + d[None, :])
        w = tl.load(IW + r * stride_iw + h).to(tl.float32)  # work ∝ visible entries, not cap
        e = eb * BLOCK_E + tl.arange(0, BLOCK_E)
        if eb * BLOCK_E < vis:  # a block with a visible entry: score it
            k = tl.load(
                KEYS + slot * key_slot_stride + e[:, None] * DI + d[None, :],
                mask=(e < vis)[:, None],
                other=0.0,
            )
            sc = tl.maximum(tl.dot(q, tl.trans(k)), 0.0)  # [HI, BLOCK_E]
            val = tl.sum(sc * w[:, None], axis=0) + e.to(tl.float32) * tie
            val = tl.where(e < vis, val, float("-inf"))
            tl.store(OUT + r * cap + e, val, mask=e < cap)
        else:  # beyond this sequence's entries (the batch's longest sets cap): no key reads
            tl.store(OUT + r * cap + e, tl.full([BLOCK_E], float("-inf"), tl.float32), mask=e < cap)

    @triton.jit
    def _mla_latent_write_kernel(
        KV,
        stride_kv,
        W,
        ROWS,
        CACHE,
        stride_cache,
        eps,
        LAT: tl.constexpr,
        ROPE: tl.constexpr,
    ):
        r = tl.program_id(0)
        row = tl.load(ROWS + r)
        c = tl.arange(0, LAT)
        x = tl.load(KV + r * stride_kv + c).to(tl.float32)
        w = tl.load(W + c).to(tl.float32)
        ms = tl.sum(x * x, axis=0) / LAT
        y = x * tl.rsqrt(ms + eps) * w
        dst = CACHE + row * stride_cache
        tl.store(dst + c, y.to(CACHE.dtype.element_ty))
        e = tl.arange(0, ROPE)
        tl.store(dst + LAT + e, tl.load(KV + r * stride_kv + LAT + e).to(CACHE.dtype.element_ty))

except ImportError:  # pragma: no cover - CPU-only installs
    triton = None


def _triton(t: torch.Tensor, lay: Model1Layout | None = None) -> bool:
    ok = triton is not None and t.is_cuda
    return ok and (lay is None or lay == Model1Layout.flashmla())


def kv_norm_write(
    kv: torch.Tensor,
    weight: torch.Tensor,
    cache: Model1Cache,
    ring: int,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    v: int,
    write_from: int = 0,
    eps: float = 1e-6,
) -> torch.Tensor:
    """RMSNorm the ``[B·v, d]`` KV rows of sequences ``slots`` (at positions ``lengths + i``),
    write rows ``>= write_from`` into their window ring pages; returns the normalized rows."""
    t, d = kv.shape
    if _triton(kv, cache.layout) and cache.exact is None and kv.stride(1) == 1 and t:
        out = torch.empty((t, d), dtype=torch.bfloat16, device=kv.device)
        lay = cache.layout
        _kv_norm_write_kernel[(t,)](
            kv, kv.stride(0), weight, out, slots, lengths, v, write_from, cache.buf,
            cache.stride, ring, eps,
            D=d, NOPE=lay.d_nope, TILE=lay.tile, NT=d // lay.tile, num_warps=4,
        )  # fmt: skip
        used.add("triton.kv_norm_write")
        return out
    used.add("torch.kv_norm_write")
    c = rms_norm(kv, weight, eps)
    b = slots.shape[0]
    pos = lengths.view(b, 1) + torch.arange(v, device=kv.device).view(1, v)
    rows = (slots.view(b, 1) * ring + pos % ring).reshape(-1)
    if write_from < t:
        cache.write(rows[write_from:], c[write_from:])
    return c


def decode_indices(
    slots: torch.Tensor,
    lengths: torch.Tensor,
    v: int,
    window: int,
    ring: int,
    hca: tuple[int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(window indices ``[B, v, W]``, HCA entry indices ``[B, v, cap]``, HCA lengths ``[B]``);
    ``hca = (m, cap, e_pad)``."""
    b = slots.shape[0]
    dev = slots.device
    win = torch.empty((b, v, window), dtype=torch.int32, device=dev)
    extra = elen = None
    if hca is not None:
        m, cap, e_pad = hca
        extra = torch.empty((b, v, cap), dtype=torch.int32, device=dev)
        elen = torch.empty((b,), dtype=torch.int32, device=dev)
    if _triton(slots) and window & (window - 1) == 0 and b:
        m, cap, e_pad = hca if hca is not None else (1, 0, 0)
        _decode_index_kernel[(b * v,)](
            slots, lengths, v, win, ring, extra if extra is not None else win,
            elen if elen is not None else win, e_pad, m,
            W=window, HCA=hca is not None, BLOCK=256, CAP=cap, num_warps=4,
        )  # fmt: skip
        used.add("triton.decode_indices")
        return win, extra, elen
    used.add("torch.decode_indices")
    pos = lengths.view(b, 1) + torch.arange(v, device=dev).view(1, v)
    kp = pos.unsqueeze(-1) - torch.arange(window, device=dev).view(1, 1, window)
    win.copy_(torch.where(kp >= 0, slots.view(b, 1, 1) * ring + kp % ring, -1))
    if hca is not None and extra is not None and elen is not None:
        m, cap, e_pad = hca
        vis = pos // m
        e = torch.arange(cap, device=dev).view(1, 1, cap)
        extra.copy_(torch.where(e < vis.unsqueeze(-1), slots.view(b, 1, 1) * e_pad + e, -1))
        elen.copy_(vis[:, -1].clamp(max=cap))
    return win, extra, elen


def decode_indexer_scores(
    iq: torch.Tensor,
    iw: torch.Tensor,
    keys: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    v: int,
    m: int,
    cap: int,
    heads: int,
    dim: int,
    tie: float,
) -> torch.Tensor:
    """Lightning-indexer scores ``[B, v, cap]`` of each decode query over its sequence's
    compressed keys, read in place from the pool (``keys [slots, entries, dim]``): no gather.
    ``-inf`` where an entry is not yet visible; ``tie · entry`` added as the reference does."""
    b = slots.shape[0]
    dev = iq.device
    if _triton(iq) and heads >= 16 and dim >= 16 and b and iq.stride(1) == 1:
        out = torch.empty((b, v, cap), dtype=torch.float32, device=dev)
        block = 64
        _decode_indexer_kernel[(b * v, triton.cdiv(cap, block))](
            iq, iq.stride(0), iw, iw.stride(0), keys, keys.stride(0), slots, lengths, out, v, m,
            cap, tie, HI=heads, DI=dim, BLOCK_E=block, num_warps=4,
        )  # fmt: skip
        used.add("triton.decode_indexer")
        return out
    used.add("torch.decode_indexer")
    from ..attention import indexer_scores

    vis = (lengths.view(b, 1) + torch.arange(v, device=dev).view(1, v)) // m
    sel = keys[:, :cap].index_select(0, slots)
    return indexer_scores(
        iq.reshape(b, v, heads, dim).to(sel.dtype), iw.reshape(b, v, heads).to(sel.dtype), sel,
        vis=vis,
    )  # fmt: skip


def rows_from_topk(
    top_v: torch.Tensor, top_i: torch.Tensor, slots: torch.Tensor, e_pad: int
) -> torch.Tensor:
    """``[B, v, k]`` compressed-cache rows of a top-k (``-1`` where the score is ``-inf``)."""
    b, v, k = top_v.shape
    if _triton(top_v) and b:
        out = torch.empty((b, v, k), dtype=torch.int32, device=top_v.device)
        _rows_from_topk_kernel[(b * v,)](
            top_v.contiguous(), top_i.contiguous(), slots, v, out, k, e_pad,
            BLOCK=triton.next_power_of_2(k), num_warps=4,
        )  # fmt: skip
        used.add("triton.rows_from_topk")
        return out
    used.add("torch.rows_from_topk")
    rows = torch.where(torch.isfinite(top_v), slots.view(b, 1, 1) * e_pad + top_i, -1)
    return rows.to(torch.int32)


def compress_decode(
    pool: Any,
    gate: torch.Tensor,
    bias: torch.Tensor,
    c: torch.Tensor,
    ik: torch.Tensor | None,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    v: int,
) -> None:
    """Put each sequence's ``v`` new KV vectors (``c [B·v, d]``, indexer keys ``ik``) into its
    partial group; fold each group that completes into an FP8 entry and a bf16 indexer key."""
    m = pool.m
    b = slots.shape[0]
    comp: Model1Cache = pool.comp
    if _triton(c, comp.layout) and comp.exact is None and b:
        lay = comp.layout
        d = c.shape[1]
        has_idx = ik is not None and pool.comp_idx is not None
        _compress_decode_kernel[(b,)](
            c.contiguous(), ik if has_idx else c, ik.stride(0) if ik is not None else 0, slots,
            lengths, pool.ring_kv, pool.ring_idx if has_idx else pool.ring_kv, gate, bias, comp.buf,
            comp.stride, pool.e_pad, pool.comp_idx if has_idx else pool.ring_kv,
            M=m, M_BLOCK=max(2, triton.next_power_of_2(m)), D=d,
            DI=pool.comp_idx.shape[-1] if has_idx else 16, NOPE=lay.d_nope, TILE=lay.tile,
            NT=d // lay.tile, PAGE=comp.block, HAS_IDX=has_idx, V=v, num_warps=4,
        )  # fmt: skip
        used.add("triton.compress_decode")
        return
    used.add("torch.compress_decode")
    c3 = c.view(b, v, -1)
    ik3 = ik.view(b, v, -1) if ik is not None else None
    scratch = torch.full_like(slots, pool.scratch)
    for i in range(v):
        p_i = lengths + i
        ri = p_i % m
        pool.ring_kv.index_put_((slots, ri), c3[:, i].to(pool.ring_kv.dtype))
        if ik3 is not None and pool.ring_idx is not None:
            pool.ring_idx.index_put_((slots, ri), ik3[:, i].to(pool.ring_idx.dtype))
        done = (p_i + 1) % m == 0
        grp_i = pool.ring_idx.index_select(0, slots) if ik3 is not None else None
        ent, ent_i = compress_groups(pool.ring_kv.index_select(0, slots), gate, bias, grp_i)
        t_slot = torch.where(done, slots, scratch)  # groups that did not complete: scratch slot
        t_ent = torch.where(done, (p_i + 1) // m - 1, 0)
        comp.write(pool.entry_rows(t_slot, t_ent), ent)
        if ent_i is not None and pool.comp_idx is not None:
            pool.comp_idx.index_put_((t_slot, t_ent), ent_i)


def mla_latent_write(
    kv: torch.Tensor,
    weight: torch.Tensor,
    cache_rows: torch.Tensor,
    rows: torch.Tensor,
    eps: float = 1e-6,
) -> None:
    """Write the ``[T, lat + rope]`` new latents ``kv`` (the first ``lat`` = ``weight``'s width
    RMS-normalized, the rope values as they are) into ``cache_rows`` at ``rows`` (``[T]``, int64),
    in the cache's dtype: what V3's decode block ran as a norm's six kernels, a concatenation, a
    cast and an index copy."""
    t, width = kv.shape
    lat = weight.shape[0]
    rope = width - lat
    pow2 = lat & (lat - 1) == 0 and rope > 0 and rope & (rope - 1) == 0
    if _triton(kv) and pow2 and kv.stride(1) == 1 and cache_rows.stride(1) == 1 and t:
        _mla_latent_write_kernel[(t,)](
            kv, kv.stride(0), weight, rows, cache_rows, cache_rows.stride(0), eps,
            LAT=lat, ROPE=rope, num_warps=4,
        )  # fmt: skip
        used.add("triton.mla_latent_write")
        return
    used.add("torch.mla_latent_write")
    latent = torch.cat([rms_norm(kv[:, :lat], weight, eps), kv[:, lat:]], dim=1)
    cache_rows.index_copy_(0, rows, latent.to(cache_rows.dtype))
