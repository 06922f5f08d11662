"""Checks of the ``deepseek`` kernel backend on a GPU (and its plumbing on the CPU).

    python -m deepinfer_sim.kernels.deepseek_check --out DIR          # CUDA, full widths
    python -m deepinfer_sim.kernels.deepseek_check --out DIR --toy --device cpu

Each check is isolated (``gpu_check.Checker``): a failure is recorded and the rest still runs.
Tolerances (relative L2 error, ``_util.rel_err``), stated once here:

* FlashMLA kernel vs its torch emulation on the same FP8 / bf16 inputs: ``KERNEL_TOL`` (bf16
  arithmetic, split-KV combine order);
* fused Triton quantization vs the torch path (identical FP8 codes but for rounding ties):
  ``QUANT_TOL`` on the dequantized rows;
* a whole block (its contribution ``y − x``) on the kernels vs the same block emulated, and vs
  the reference backend (bf16 caches, other activation rounding): ``FP8_TOL``. Within a block the
  attention output is quantized to FP8 again before the output projection, so the kernels' 0.25 %
  difference flips FP8 roundings and reappears at the FP8 noise level (~4 % at these widths,
  measured); the attention kernels themselves are held to ``KERNEL_TOL`` above;
* a decode step replayed from a CUDA graph vs the same step run eagerly: ``GRAPH_TOL``; the
  same for the engine's graphed prefill step (the caches it writes).

Writes ``deepseek_check.json`` (versions, which paths ran, every result) and prints a table.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch

from ..models.registry import load_model
from . import _util
from ._util import as_device, capture_eagerly, rel_err, synchronize
from .backend import get_backend
from .deepseek import flashmla, fp8, versions
from .deepseek.layout import Model1Cache, Model1Layout
from .gpu_check import Checker, _shape
from .shapes import Kind, LayerShape

KERNEL_TOL = 2e-2
QUANT_TOL = 2e-2
FP8_TOL = 0.12
GRAPH_TOL = 1e-3


def _v4_shape(toy: bool, experts: int = 16) -> LayerShape:
    return LayerShape.toy() if toy else _shape(False, experts)


def _mla_shape(toy: bool) -> LayerShape:
    if toy:
        return LayerShape.toy(heads=4, head_dim=40, kv_lora=32, rope_dim=8, qk_nope=16, v_head=16)
    return LayerShape.from_model(load_model("deepseek-v3"), local_experts=8)


def check_quantize(c: Checker) -> dict[str, Any]:
    """Triton fused quantization against the torch path (the same math)."""
    dev = c.device
    out: dict[str, Any] = {}
    w = torch.rand(5120, device=dev) + 0.5
    cases: dict[str, tuple[torch.Tensor, dict[str, Any]]] = {
        "plain": (torch.randn(37, 5120, device=dev, dtype=torch.bfloat16), {}),
        "rmsnorm": (torch.randn(64, 5120, device=dev, dtype=torch.bfloat16), {"norm_weight": w}),
        "swiglu": (torch.randn(50, 2 * 2304, device=dev, dtype=torch.bfloat16), {"silu": True}),
        "groups": (torch.randn(20, 8 * 4096, device=dev, dtype=torch.bfloat16), {"groups": 8}),
    }
    worst = 0.0
    for name, (x, kw) in cases.items():
        q1, s1, _ = fp8.quantize_rows(x, **kw)
        saved = fp8._TRITON
        fp8._TRITON = False
        try:
            q2, s2, _ = fp8.quantize_rows(x, **kw)
        finally:
            fp8._TRITON = saved
        m = x.shape[0]
        a = q1[:, :m].float() * s1[:, :m, None]
        b = q2[:, :m].float() * s2[:, :m, None]
        err = rel_err(a, b)
        out[name] = err
        worst = max(worst, err)
    out["paths"] = sorted(fp8.used)
    out["ok"] = worst <= QUANT_TOL
    return out


def check_flashmla(c: Checker) -> dict[str, Any]:
    """Each FlashMLA entry point against its emulation on the same inputs."""
    dev = c.device
    if not flashmla.kernels_available(dev):
        return {"ok": c.toy, "skipped": f"no FlashMLA kernels here ({flashmla.import_error()})"}
    g = torch.Generator(device=dev).manual_seed(0)
    lay = Model1Layout.flashmla()
    res: dict[str, Any] = {}

    def both(fn: Any) -> float:
        flashmla.MODE = "kernel"
        try:
            a = fn()
            flashmla.MODE = "emulate"
            b = fn()
        finally:
            flashmla.MODE = "auto"
        return rel_err(a, b)

    # sparse decode, MODEL1: a 256-token window page per sequence + 64-entry compressed pages
    B, sq, H = 16, 2, 64
    win = Model1Cache(lay, B, 256, dev)
    win.fill_random(g)
    comp = Model1Cache(lay, B * 8, 64, dev)
    comp.fill_random(g)
    q = torch.randn((B, sq, H, 512), generator=g, device=dev).to(torch.bfloat16) / 4
    idx = torch.randint(0, B * 256, (B, sq, 128), generator=g, device=dev)
    idx[:, :, :5] = -1
    eidx = torch.randint(0, B * 512, (B, sq, 512), generator=g, device=dev)
    elen = torch.randint(1, 513, (B,), generator=g, device=dev).to(torch.int32)
    res["sparse_decode"] = both(
        lambda: flashmla.sparse_decode(q, win, idx.int(), 512**-0.5, comp, eidx.int(), elen)
    )
    # sparse prefill: 512 queries over 4096 bf16 rows, 640 indices each, lengths per query
    kv = torch.randn((4096, 512), generator=g, device=dev).to(torch.bfloat16) / 4
    qp = torch.randn((512, H, 512), generator=g, device=dev).to(torch.bfloat16) / 4
    pidx = torch.randint(0, 4096, (512, 640), generator=g, device=dev)
    pidx[:, -7:] = -1
    plen = torch.randint(128, 641, (512,), generator=g, device=dev).to(torch.int32)
    res["sparse_prefill"] = both(
        lambda: flashmla.sparse_prefill(qp, kv, pidx.int(), 512**-0.5, plen)
    )
    # dense decode (V3): bf16 pages of 64, d 576, 128 heads, causal over 2 new tokens
    Bd, pages = 8, 40
    cache = torch.randn((Bd * pages, 64, 1, 576), generator=g, device=dev).to(torch.bfloat16) / 4
    qd = torch.randn((Bd, 2, 128, 576), generator=g, device=dev).to(torch.bfloat16) / 4
    table = torch.arange(Bd * pages, device=dev).view(Bd, pages).int()
    lens = torch.randint(2, pages * 64, (Bd,), generator=g, device=dev).int()
    res["dense_decode"] = both(
        lambda: flashmla.dense_decode(qd, cache, table, lens, 576**-0.5, causal=True)
    )
    # small batches, window only and with extra entries, 1 and 3 query tokens
    for bs in (1, 2, 4):
        for sq in (1, 3):
            qs = q[:bs, :1].expand(bs, sq, H, 512).contiguous()
            ws = idx[:bs, :1].expand(bs, sq, 128).contiguous().int()
            es = eidx[:bs, :1].expand(bs, sq, 512).contiguous().int()
            res[f"sparse_decode_b{bs}_s{sq}"] = both(
                lambda qs=qs, ws=ws: flashmla.sparse_decode(qs, win, ws, 512**-0.5)
            )
            res[f"sparse_decode_extra_b{bs}_s{sq}"] = both(
                lambda qs=qs, ws=ws, es=es, el=elen[:bs]: flashmla.sparse_decode(
                    qs, win, ws, 512**-0.5, comp, es, el
                )
            )
    res["ok"] = all(v <= KERNEL_TOL for k, v in res.items() if isinstance(v, float))
    return res


def check_prefill_index_order(c: Checker) -> dict[str, Any]:
    """Sparse prefill with empty (-1) indices first in a row (what a naive window gives the
    first queries of a prompt) and last (what the blocks build), kernel vs emulation."""
    dev = c.device
    if not flashmla.kernels_available(dev):
        return {"ok": c.toy, "skipped": "no FlashMLA kernels here"}
    g = torch.Generator(device=dev).manual_seed(2)
    kv = torch.randn((300, 512), generator=g, device=dev).to(torch.bfloat16) / 4
    q = torch.randn((200, 64, 512), generator=g, device=dev).to(torch.bfloat16) / 4
    t = torch.arange(200, device=dev).view(-1, 1)
    k = torch.arange(128, device=dev).view(1, -1)
    first = torch.where(t - 127 + k >= 0, t - 127 + k, -1).int()  # oldest first: -1 leading
    last = torch.where(t - k >= 0, t - k, -1).int()  # newest first: -1 trailing
    res: dict[str, Any] = {}
    for name, idx in (("empty_first", first), ("empty_last", last)):
        flashmla.MODE = "kernel"
        try:
            a = flashmla.sparse_prefill(q, kv, idx, 512**-0.5)
            flashmla.MODE = "emulate"
            b = flashmla.sparse_prefill(q, kv, idx, 512**-0.5)
        finally:
            flashmla.MODE = "auto"
        res[name] = rel_err(a, b)
    res["ok"] = res["empty_last"] <= KERNEL_TOL
    return res


def check_fused(c: Checker) -> dict[str, Any]:
    """The fused decode kernels (``deepseek/fused.py``) against their torch paths on MODEL1."""
    from .deepseek import fused
    from .deepseek.v4 import DSPool

    dev = c.device
    if c.toy or dev.type != "cuda":
        return {"ok": True, "skipped": "the fused kernels run on CUDA at MODEL1 widths"}
    shape = _v4_shape(False)
    res: dict[str, Any] = {}
    for kind in ("csa", "hca"):
        pools: list[Any] = []
        outs: list[Any] = []
        B, v = 8, 3
        g = torch.Generator(device=dev).manual_seed(3)
        slots = torch.tensor([5, 0, 2, 7, 1, 3, 6, 4], device=dev)
        L = torch.tensor([381, 126, 5, 1000, 255, 3, 127, 62], device=dev)
        kv = torch.randn((B * v, 512), generator=g, device=dev).to(torch.bfloat16)
        ik = torch.randn((B * v, 128), generator=g, device=dev).to(torch.bfloat16)
        w = torch.rand(512, generator=g, device=dev) + 0.5
        gate = torch.randn(512, generator=g, device=dev) * 0.05
        for use_triton in (True, False):
            pool = DSPool(kind=kind, shape=shape, max_seqs=8, max_tokens=2048, device=dev, seed=1)
            bias = torch.linspace(-1, 1, pool.m, device=dev)
            saved = fused.triton
            if not use_triton:
                fused.triton = None
            try:
                cn = fused.kv_norm_write(kv, w, pool.window, pool.ring, slots, L, v)
                fused.compress_decode(
                    pool, gate, bias, cn, ik if kind == "csa" else None, slots, L, v
                )
                hca = (pool.m, 64, pool.e_pad) if kind == "hca" else None
                idx = fused.decode_indices(slots, L, v, 128, pool.ring, hca)
            finally:
                fused.triton = saved
            pools.append(pool)
            outs.append((cn, idx))
        rows = (
            slots.view(B, 1) * pools[0].ring
            + (L.view(B, 1) + torch.arange(v, device=dev)) % pools[0].ring
        ).reshape(-1)
        res[f"{kind}_norm"] = rel_err(outs[0][0], outs[1][0])
        res[f"{kind}_window"] = rel_err(pools[0].window.read(rows), pools[1].window.read(rows))
        ents = [
            int(slots[b]) * pools[0].e_pad + (int(L[b]) + i + 1) // pools[0].m - 1
            for b in range(B)
            for i in range(v)
            if (int(L[b]) + i + 1) % pools[0].m == 0
        ]
        er = torch.tensor(ents, device=dev, dtype=torch.long)
        res[f"{kind}_entries"] = len(ents)
        if ents:
            res[f"{kind}_entry_err"] = rel_err(pools[0].comp.read(er), pools[1].comp.read(er))
            if kind == "csa":
                a = pools[0].comp_idx.view(-1, 128)[er]
                b = pools[1].comp_idx.view(-1, 128)[er]
                res["csa_indexer_key_err"] = rel_err(a, b)
        res[f"{kind}_indices_equal"] = all(
            (x is None and y is None) or bool(torch.equal(x, y))
            for x, y in zip(outs[0][1], outs[1][1], strict=True)
        )
    # the decode indexer reading keys in place vs gathered keys through the reference indexer
    B, v, cap = 8, 3, 512
    keys = torch.randn((9, 2048, 128), device=dev).to(torch.bfloat16)
    iq = torch.randn((B * v, 32 * 128), device=dev).to(torch.bfloat16)
    iw = torch.randn((B * v, 32), device=dev).to(torch.bfloat16)
    slots = torch.tensor([5, 0, 2, 7, 1, 3, 6, 4], device=dev)
    L = torch.tensor([2000, 126, 5, 1000, 255, 3, 127, 62], device=dev)
    scores = []
    for use_triton in (True, False):
        saved = fused.triton
        if not use_triton:
            fused.triton = None
        try:
            scores.append(
                fused.decode_indexer_scores(iq, iw, keys, slots, L, v, 4, cap, 32, 128, 1e-9)
            )
        finally:
            fused.triton = saved
    finite = torch.isfinite(scores[1])
    res["indexer_masks_equal"] = bool(torch.equal(finite, torch.isfinite(scores[0])))
    res["indexer_err"] = rel_err(scores[0][finite], scores[1][finite])
    res["paths"] = sorted(fused.used)
    errs = [v for k, v in res.items() if k.endswith(("_norm", "_window", "_err"))]
    res["ok"] = all(e <= QUANT_TOL for e in errs) and all(
        v for k, v in res.items() if k.endswith(("_indices_equal", "_masks_equal"))
    )
    return res


def profile_decode(c: Checker, kind: Any) -> dict[str, Any]:
    """Kernels of one eager decode step at 64 sequences × 8K (what a CUDA graph replays)."""
    if c.device.type != "cuda" or c.toy:
        return {"ok": True, "skipped": "needs a GPU"}
    from torch.profiler import ProfilerActivity, profile

    dev = c.device
    shape = _mla_shape(False) if kind == "mla" else _v4_shape(False)
    blk = get_backend("deepseek").attention_block(shape, kind, dev, True, seed=4)
    pool = blk.new_pool(64, 8192 + 16)
    for s in range(64):
        pool.alloc(s)
        pool.fill_random(s, 8192)
    x = torch.randn((64, 1, shape.hidden), device=dev).to(torch.bfloat16)
    lengths = pool.lengths.copy()
    for _ in range(2):
        pool.lengths[:] = lengths
        blk.decode(x, pool, blk.plan_decode(pool, np.arange(64), 1))
    synchronize(dev)
    pool.lengths[:] = lengths
    plan = blk.plan_decode(pool, np.arange(64), 1)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        blk.decode(x, pool, plan)
        synchronize(dev)
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in events)
    return {
        "ok": True,
        "kernels": int(sum(e.count for e in events)),
        "gpu_us": total,
        "top": [(e.key[:60], e.count, round(e.device_time_total, 1)) for e in events[:12]],
    }


def _run_block(blk: Any, pool: Any, xs: list[Any], decode_v: tuple[int, ...]) -> Any:
    """Prefill chunks of sequence 0 and 1, then decode steps of both; all outputs in order."""
    outs = []
    for seq, x in xs:
        outs.append(blk.prefill(x, pool, seq))
    for i, v in enumerate(decode_v):
        g = torch.Generator(device=blk.device).manual_seed(100 + i)
        x = torch.randn((2, v, blk.shape.hidden), generator=g, device=blk.device).to(blk.dtype)
        outs.append((x, blk.decode(x, pool, [0, 1])))
    return outs


def _deltas(inputs: list[Any], outs: list[Any]) -> torch.Tensor:
    parts = []
    for inp, out in zip(inputs, outs, strict=True):
        x = inp[0] if isinstance(inp, tuple) else inp
        y = out[1] if isinstance(out, tuple) else out
        parts.append((y.float() - x.float()).reshape(-1))
    return torch.cat(parts)


def check_block(c: Checker, kind: Any) -> dict[str, Any]:
    """A whole block (attention + shared expert) on the kernels, against the same block
    emulated and against the reference backend."""
    dev = c.device
    shape = _mla_shape(c.toy) if kind == "mla" else _v4_shape(c.toy)
    ds = get_backend("deepseek")
    n1, n2 = (40, 13) if c.toy else (700, 300)
    max_tokens = 4096
    g = torch.Generator(device=dev).manual_seed(1)
    dt = _util.default_dtype(dev)
    chunks = [
        (0, torch.randn((n1, shape.hidden), generator=g, device=dev).to(dt)),
        (0, torch.randn((n2, shape.hidden), generator=g, device=dev).to(dt)),
        (1, torch.randn((n2, shape.hidden), generator=g, device=dev).to(dt)),
    ]
    runs: dict[str, list[Any]] = {}
    for mode in ("auto", "emulate"):
        flashmla.MODE = mode
        try:
            blk = ds.attention_block(shape, kind, dev, True, seed=3)
            pool = blk.new_pool(4, max_tokens)
            pool.alloc(0)
            pool.alloc(1)
            runs[mode] = _run_block(blk, pool, chunks, (1, 3))
        finally:
            flashmla.MODE = "auto"
    inputs = [x for _, x in chunks] + [o for o in runs["auto"][len(chunks) :]]
    out_k = [o for o in runs["auto"][: len(chunks)]] + [o[1] for o in runs["auto"][len(chunks) :]]
    out_e = [o for o in runs["emulate"][: len(chunks)]] + [
        o[1] for o in runs["emulate"][len(chunks) :]
    ]
    res: dict[str, Any] = {
        "kernel_vs_emulated": rel_err(_deltas(inputs, out_k), _deltas(inputs, out_e)),
        "per_step": [
            rel_err(_deltas([i], [a]), _deltas([i], [b]))
            for i, a, b in zip(inputs, out_k, out_e, strict=True)
        ],
    }
    if kind != "mla":
        ref = get_backend("reference").attention_block(shape, kind, dev, True, seed=3)
        rpool = ref.new_pool(4, max_tokens)
        rpool.alloc(0)
        rpool.alloc(1)
        out_r = [ref.prefill(x, rpool, seq) for seq, x in chunks]
        out_r += [ref.decode(x, rpool, [0, 1]) for x, _ in runs["auto"][len(chunks) :]]
        res["vs_reference"] = rel_err(_deltas(inputs, out_k), _deltas(inputs, out_r))
    res["attention_paths"] = sorted(flashmla.used)
    res["ok"] = res["kernel_vs_emulated"] <= FP8_TOL and res.get("vs_reference", 0) <= FP8_TOL
    return res


def check_causal_attention(c: Checker) -> dict[str, Any]:
    """MLA prefill's MHA attention after a prefix (keys 192 wide, values 128) against the
    explicit end-aligned causal softmax in float32: the path the calibration takes (on a GPU
    the split form on cuDNN where it passed its own check) and, on a GPU, FlashAttention-2."""
    from .deepseek import mla

    dev, dt = c.device, _util.default_dtype(c.device)
    g = torch.Generator(device=dev).manual_seed(4)
    n, p, H, d, dv = (37, 63, 4, 192, 128) if c.toy else (300, 700, 16, 192, 128)
    q, k = (torch.randn((m, H, d), generator=g, device=dev).to(dt) for m in (n, n + p))
    v = torch.randn((n + p, H, dv), generator=g, device=dev).to(dt)
    scale = d**-0.5
    s = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    visible = torch.arange(n + p, device=dev)[None, :] <= p + torch.arange(n, device=dev)[:, None]
    want = torch.einsum(
        "hqk,khd->qhd", s.masked_fill(~visible, float("-inf")).softmax(-1), v.float()
    )
    err = rel_err(mla.prefill_attention(q, k, v, scale).float(), want)
    res: dict[str, Any] = {"rel_err": err, "ok": err <= KERNEL_TOL}
    if dev.type == "cuda" and dt in (torch.float16, torch.bfloat16):
        res["cudnn_split"] = mla.cudnn_split_ok(dev, dt, d, dv)
        res["triton_merge"] = mla.triton_merge_ok(dev)
        res["flash_rel_err"] = rel_err(mla._flash_causal(q, k, v, scale).float(), want)
        res["ok"] = res["ok"] and res["flash_rel_err"] <= KERNEL_TOL
    return res


def check_mla_fused(c: Checker) -> dict[str, Any]:
    """V3's decode-only step as engines run it (``fused.mla_latent_write``, the step's indices
    once, W_UV in place) against the block's old path (``DEEPINFER_MLA_FUSED=0``): the layer's
    outputs and the cache rows it wrote."""
    from .deepseek import fused

    dev = c.device
    shape = _mla_shape(c.toy)
    outs: dict[str, Any] = {}
    for env in ("1", "0"):
        with mock.patch.dict(os.environ, {"DEEPINFER_MLA_FUSED": env}):
            blk = get_backend("deepseek").attention_block(shape, "mla", dev, True, seed=6)
            pool = blk.new_pool(9, 4096 + 16)
            for s in range(8):
                pool.alloc(s)
                pool.fill_random(s, 100 + 437 * s)
            g = torch.Generator(device=dev).manual_seed(7)
            dt = _util.default_dtype(dev)
            ys = [
                blk.decode(torch.randn((8, v, shape.hidden), generator=g, device=dev).to(dt),
                           pool, np.arange(8))
                for v in (1, 3)
            ]  # fmt: skip
            outs[env] = (torch.cat([y.reshape(-1) for y in ys]), pool.rows.clone())
    out_err = rel_err(outs["1"][0], outs["0"][0])
    rows_err = rel_err(outs["1"][1], outs["0"][1])
    return {
        "ok": out_err <= KERNEL_TOL and rows_err <= KERNEL_TOL,
        "out_rel_err": out_err,
        "cache_rel_err": rows_err,
        "paths": sorted(k for k in fused.used if k.endswith("mla_latent_write")),
    }


def check_graph_decode(c: Checker, kind: Any) -> dict[str, Any]:
    """A decode step captured in a CUDA graph and replayed equals the eager step."""
    if c.device.type != "cuda":
        return {"ok": True, "skipped": "CUDA graphs need a GPU"}
    dev = c.device
    shape = _mla_shape(c.toy) if kind == "mla" else _v4_shape(c.toy)
    blk = get_backend("deepseek").attention_block(shape, kind, dev, True, seed=4)
    pool = blk.new_pool(9, 8192 + 16)
    for s in range(8):
        pool.alloc(s)
        pool.fill_random(s, 3000 + 500 * s)
    seqs = np.arange(8)
    v = 3
    x = torch.randn((8, v, shape.hidden), device=dev).to(torch.bfloat16)
    lengths = pool.lengths.copy()
    plan = blk.plan_decode(pool, seqs, v)
    eager = blk.decode(x, pool, plan).clone()
    pool.lengths[:] = lengths
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        blk.decode(x, pool, plan)
    torch.cuda.current_stream(dev).wait_stream(side)
    pool.lengths[:] = lengths
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = blk.decode(x, pool, plan)
    pool.lengths[:] = lengths
    graph.replay()
    synchronize(dev)
    err = rel_err(out, eager)
    t_graph = c.timer(graph.replay, warmup=3, repeat=20)
    return {"ok": err <= GRAPH_TOL, "graph_vs_eager": err, "graph_replay_us": t_graph * 1e6}


def check_moe(c: Checker) -> dict[str, Any]:
    dev = c.device
    shape = _v4_shape(c.toy, experts=8 if c.toy else 48)
    ds = get_backend("deepseek").moe_block(shape, dev, True, seed=5)
    ref = get_backend("reference").moe_block(shape, dev, True, seed=5)
    t = 64 if c.toy else 512
    x = torch.randn((t, shape.hidden), device=dev).to(ds.dtype)
    ids, w = ref.uniform_routing(t, seed=1)
    err = rel_err(ds.forward_routed(x, ids, w), ref.forward_routed(x, ids, w))
    return {"ok": err <= FP8_TOL / 2, "vs_reference": err, "path": ds.path}


def _engine(c: Checker, layers: list[tuple[Kind, bool]], **kw: Any) -> Any:
    """An engine core on the deepseek backend at the check's widths (toy or V4.1-Flash-mini)."""
    from .engine import EngineCore

    spec: Any = LayerShape.toy() if c.toy else load_model("deepseek-v4.1-flash-mini")
    return EngineCore(
        spec,
        layers,
        local_experts=8 if c.toy else 48,
        device=c.device,
        fp8=True,
        max_tokens=4096,
        backend="deepseek",
        **kw,
    )


def check_engine(c: Checker) -> dict[str, Any]:
    """The engine core on the deepseek backend (CUDA-graph decode on a GPU): a short replay."""
    eng = _engine(
        c,
        [("csa", True), ("hca", True), ("csa", False)],
        max_seqs=12,
        prefill_token_budget=2048,
        max_decode_batch=8,
        mode="decode_only",
        graphs=c.device.type == "cuda",
        seed=1,
    )
    reqs = [(0.0, 300 + 97 * i, 20 + i) for i in range(10)]
    res = eng.run(reqs)
    s = res.summary()
    return {"ok": s["requests"] == 10, "graphs": len(eng._graphs), **s}


def check_graph_prefill(c: Checker) -> dict[str, Any]:
    """A prefill-only step of two prompts replayed from the engine's CUDA graph (on its staging
    slots) writes the caches the same step run eagerly on the same input writes, in every layer:
    window entries, compressed entries and (CSA) indexer keys. On a CPU the graph is an eager
    stand-in, so the comparison itself is what runs there."""
    cuda = c.device.type == "cuda"
    eng = _engine(
        c,
        [("csa", True), ("hca", True)],
        max_seqs=8,
        prefill_token_budget=4096,
        mode="prefill_only",
        prefill_graphs=cuda,
        seed=2,
    )
    if not cuda:
        eng.prefill_graphs = True
        eng._capture_fn = capture_eagerly
    eng.warmup()
    lens = (700, 333) if not c.toy else (70, 33)
    graph = eng._prefill_graph(lens)
    if graph is None:
        return {"ok": False, "error": "no graph captured"}
    eng._replay_prefill(graph, lens)
    staged = eng._staging[: len(lens)]
    slots = [eng.alloc_slot() for _ in lens]
    segs, replay, _ = eng._prefill_rows([(s, n, True) for s, n in zip(slots, lens, strict=True)], 0)
    eng._forward(graph.x, segs, replay, None, None)
    synchronize(c.device)
    errs = []
    for lay in eng.layers:
        pool: Any = lay.pool  # a DSPool on this backend
        for a, b, n in zip(staged, slots, lens, strict=True):
            sa, sb = (torch.full((1,), s, device=c.device) for s in (a, b))
            pos = torch.arange(max(0, n - pool.ring), n, device=c.device)
            errs.append(
                rel_err(
                    pool.window.read(pool.window_rows(sa, pos), torch.float32),
                    pool.window.read(pool.window_rows(sb, pos), torch.float32),
                )
            )
            if pool.comp is not None and n // pool.m:
                ents = torch.arange(n // pool.m, device=c.device)
                errs.append(
                    rel_err(
                        pool.comp.read(pool.entry_rows(sa, ents), torch.float32),
                        pool.comp.read(pool.entry_rows(sb, ents), torch.float32),
                    )
                )
                if pool.comp_idx is not None:
                    errs.append(
                        rel_err(pool.comp_idx[a, : n // pool.m], pool.comp_idx[b, : n // pool.m])
                    )
    err = max(errs)
    return {
        "ok": err <= GRAPH_TOL,
        "graph_vs_eager": err,
        "compared": len(errs),
        "cuda_graph": cuda,
    }


def probe_deepgemm(timeout_s: float = 240.0) -> dict[str, Any]:
    """Does DeepGEMM's first FP8 GEMM run here? In a child process (it has crashed with a
    segmentation fault at its JIT start-up on this image), with HOME and CUDA_HOME set."""
    code = (
        "import torch, deep_gemm, time\n"
        "m, n, k = 128, 4096, 7168\n"
        "a = torch.randn(m, k, device='cuda').to(torch.float8_e4m3fn)\n"
        "b = torch.randn(n, k, device='cuda').to(torch.float8_e4m3fn)\n"
        "sa = torch.ones(m, k // 128, device='cuda')\n"
        "sb = torch.ones((n + 127) // 128, k // 128, device='cuda')\n"
        "d = torch.empty(m, n, device='cuda', dtype=torch.bfloat16)\n"
        "t0 = time.time(); deep_gemm.fp8_gemm_nt((a, sa), (b, sb), d); torch.cuda.synchronize()\n"
        "print('DEEPGEMM_OK first call', round(time.time() - t0, 2), 's')\n"
        "from triton.testing import do_bench\n"
        "for m in (64, 512, 4096):\n"
        "  for n, k in ((32768, 1280), (5120, 8192), (6048, 5120)):\n"
        "    a = torch.randn(m, k, device='cuda').to(torch.float8_e4m3fn)\n"
        "    b = torch.randn(n, k, device='cuda').to(torch.float8_e4m3fn)\n"
        "    sa = torch.ones(m, k // 128, device='cuda')\n"
        "    sb = torch.ones((n + 127) // 128, k // 128, device='cuda')\n"
        "    d = torch.empty(m, n, device='cuda', dtype=torch.bfloat16)\n"
        "    f = lambda: deep_gemm.fp8_gemm_nt((a, sa), (b, sb), d)\n"
        "    t_dg = do_bench(f, return_mode='median')\n"
        "    ra, rb = torch.ones(m, 1, device='cuda'), torch.ones(1, n, device='cuda')\n"
        "    t_mm = do_bench(lambda: torch._scaled_mm(a, b.t(), scale_a=ra, scale_b=rb,"
        " out_dtype=torch.bfloat16), return_mode='median')\n"
        "    print('GEMM', m, n, k, 'deep_gemm_us', round(t_dg * 1e3, 1), 'scaled_mm_us',"
        " round(t_mm * 1e3, 1))\n"
    )
    env = dict(os.environ)
    env.setdefault("HOME", "/root")
    env.setdefault("CUDA_HOME", "/usr/local/cuda")
    env.setdefault("DG_JIT_CACHE_DIR", "/tmp/deep_gemm_cache")
    try:
        p = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "returncode": None, "tail": f"timed out after {timeout_s} s"}
    res: dict[str, Any] = {
        "ok": p.returncode == 0 and "DEEPGEMM_OK" in p.stdout,
        "returncode": p.returncode,
        "tail": (p.stdout + p.stderr)[-3000:],
    }
    if p.returncode and p.returncode < 0 and shutil.which("cuda-gdb"):  # killed by a signal
        env["DG_JIT_DEBUG"] = "1"
        cmd = ["cuda-gdb", "-batch", "-ex", "run", "-ex", "bt 25", "--args", sys.executable]
        env = dict(env)
        try:
            bt = subprocess.run(
                [*cmd, "-c", code], env=env, capture_output=True, text=True, timeout=timeout_s
            )
            res["backtrace"] = (bt.stdout + bt.stderr)[-4000:]
        except subprocess.TimeoutExpired:
            res["backtrace"] = "cuda-gdb timed out"
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default=None)
    ap.add_argument("--toy", action="store_true", help="toy widths (CPU smoke run)")
    ap.add_argument("--deepgemm", action="store_true", help="also probe DeepGEMM in a child")
    a = ap.parse_args(argv)
    dev = as_device(a.device)
    c = Checker(dev, a.toy)
    t0 = time.perf_counter()
    c.run("quantize_rows (Triton vs torch)", lambda: check_quantize(c))
    c.run("flashmla (kernel vs emulation)", lambda: check_flashmla(c))
    c.run("flashmla prefill index order", lambda: check_prefill_index_order(c))
    c.run("fused decode kernels (Triton vs torch)", lambda: check_fused(c))
    for kind in ("swa", "csa", "hca", "mla"):
        c.run(f"block {kind}", functools.partial(check_block, c, kind))
    c.run("mla prefill attention after a prefix", lambda: check_causal_attention(c))
    c.run("mla fused decode step (vs the unfused block)", lambda: check_mla_fused(c))
    for kind in ("csa", "hca", "mla"):
        c.run(f"graph decode {kind}", functools.partial(check_graph_decode, c, kind))
    c.run("moe", lambda: check_moe(c))
    for kind in ("csa", "hca", "swa", "mla"):
        c.run(f"profile decode {kind}", functools.partial(profile_decode, c, kind))
    c.run("engine core (deepseek)", lambda: check_engine(c))
    c.run("graph prefill (engine)", lambda: check_graph_prefill(c))
    if a.deepgemm:
        c.run("deepgemm probe", probe_deepgemm)
    info = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "versions": versions(),
        "seconds": time.perf_counter() - t0,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "deepseek_check.json").write_text(
        json.dumps({"info": info, "results": c.results}, indent=2, default=str) + "\n"
    )
    failed = [r["name"] for r in c.results if not r["ok"]]
    print(f"{len(c.results) - len(failed)}/{len(c.results)} checks passed", flush=True)
    for r in failed:
        print("FAILED:", r)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
