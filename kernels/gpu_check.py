"""GPU smoke test and timing of every kernel at full V4.1-Flash widths (< 60 s on an H200).

    python -m deepinfer_sim.kernels.gpu_check --out DIR            # CUDA, full widths
    python -m deepinfer_sim.kernels.gpu_check --out DIR --toy --device cpu   # local smoke run

For each kernel: first correctness against the float64 reference (``reference.py``) at a modest
size on fresh random inputs, then timing with CUDA events (warm-up, median of repeats). Every
check is isolated: a failure records its error and the script goes on. It writes
``gpu_check.json`` (versions, which fast paths ran, every result) to DIR and prints a table.

Correctness sizes are chosen so that no CSA query has more visible entries than ``index_topk``
(the selection is then exact and the bf16 kernel can be compared with a float64 reference whose
top-k could otherwise break near-ties differently).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..models.registry import load_model
from . import _util
from ._util import Timer, as_device, fp8_supported, grouped_mm_supported, rel_err, synchronize
from .attention import AttentionBlock, DecodePlan
from .engine import EngineCore
from .linear import Linear
from .moe import MoEBlock
from .reference import (
    ref_attention_block,
    ref_indexer_scores,
    ref_linear,
    ref_moe_routed,
    ref_vision_encoder,
)
from .shapes import LayerShape
from .vision import VisionEncoder


class Checker:
    def __init__(self, device: torch.device, toy: bool) -> None:
        self.device, self.toy = device, toy
        self.timer = Timer(device)
        self.results: list[dict[str, Any]] = []
        self.fast_paths: dict[str, set[str]] = {}

    def run(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        t0 = time.perf_counter()
        try:
            res = fn()
            res.setdefault("ok", True)
        except Exception as exc:  # a failing kernel is recorded, the rest still runs
            res = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-2000:],
            }
        res["name"] = name
        res["wall_s"] = time.perf_counter() - t0
        self.results.append(res)
        status = "ok" if res["ok"] else "FAIL " + res.get("error", "")[:100]
        print(f"[{res['wall_s']:6.2f}s] {name}: {status}", flush=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def used(self, kind: str, path: str) -> None:
        self.fast_paths.setdefault(kind, set()).add(path)


def _shape(toy: bool, experts: int) -> LayerShape:
    if toy:
        return LayerShape.toy(local_experts=experts, top_k=min(6, experts))
    return LayerShape.from_model(load_model("deepseek-v4.1-flash"), experts)


def check_gemm_ceiling(c: Checker) -> dict[str, Any]:
    n = 512 if c.toy else 8192
    fp8, bf16 = _util.gemm_rates(c.device, n, warmup=2, repeat=5)
    res: dict[str, Any] = {"n": n, "bf16_tflops": bf16 / 1e12}
    if fp8 is not None:
        res["fp8_tflops"] = fp8 / 1e12
    return res


def check_linear(c: Checker, fp8: bool) -> dict[str, Any]:
    k, n = (64, 96) if c.toy else (5120, 32768)
    lin = Linear(k, n, device=c.device, fp8=fp8, seed=3)
    c.used("linear", lin.path)
    x = torch.randn(256, k, device=c.device).to(lin.dtype)
    err = rel_err(lin(x), ref_linear(x, lin.weight))
    m = 512 if c.toy else 8192
    xb = torch.randn(m, k, device=c.device).to(lin.dtype)
    t = c.timer(lambda: lin(xb))
    tol = 0.1 if fp8 else 2e-2
    return {
        "path": lin.path,
        "rel_err": err,
        "ok": err < tol,
        "M": m,
        "K": k,
        "N": n,
        "time_s": t,
        "tflops": 2 * m * k * n / t / 1e12,
    }


def check_attention(c: Checker, kind: str, shape: LayerShape) -> dict[str, Any]:
    blk = AttentionBlock(shape, kind, c.device, fp8=False, seed=5)  # type: ignore[arg-type]
    res: dict[str, Any] = {"kind": kind}
    # correctness: prefill in two chunks + a decode of 2 verify tokens vs the whole-sequence ref
    n_tot = 96 if c.toy else 1024
    x = torch.randn(n_tot, shape.hidden, device=c.device).to(blk.dtype)
    pool = blk.new_pool(2, n_tot)
    s = pool.alloc()
    half = (n_tot - 2) // 2
    y1 = blk.prefill(x[:half], pool, s)
    y2 = blk.prefill(x[half : n_tot - 2], pool, s)
    y3 = blk.decode(x[n_tot - 2 :].unsqueeze(0), pool, [s])[0]
    y = torch.cat([y1, y2, y3])  # type: ignore[list-item]
    ref = ref_attention_block(blk, x)
    res["rel_err"] = rel_err(y, ref)
    res["rel_err_decode"] = rel_err(y3, ref[n_tot - 2 :])
    res["ok"] = bool(res["rel_err"] < 3e-2 and res["rel_err_decode"] < 3e-2)
    del pool
    # prefill timing at (n new tokens, prefix p)
    grid = [(256, 0), (256, 1024)] if c.toy else [(4096, 0), (8192, 32768), (8192, 131072)]
    prefill_rows = []
    for n, p in grid:
        pool = blk.new_pool(1, p + n)
        s = pool.alloc()
        xn = torch.randn(n, shape.hidden, device=c.device).to(blk.dtype)

        def step(xn: torch.Tensor = xn, pool: Any = pool, s: int = s, p: int = p) -> None:
            pool.fill_random(s, p)
            blk.prefill(xn, pool, s)

        t = c.timer(step, warmup=1, repeat=3)
        prefill_rows.append({"n": n, "p": p, "time_s": t})
        del pool
        if c.device.type == "cuda":
            torch.cuda.empty_cache()
    res["prefill"] = prefill_rows
    # decode timing at (B sequences, each K/B long, verify v)
    grid_d = (
        [(8, 256, 1), (8, 256, 4)] if c.toy else [(64, 8192, 1), (64, 8192, 4), (128, 32768, 1)]
    )
    decode_rows = []
    for b, each, v in grid_d:
        pool = blk.new_pool(b, each + v)
        slots = [pool.alloc() for _ in range(b)]
        xd = torch.randn(b, v, shape.hidden, device=c.device).to(blk.dtype)

        def dstep(
            pool: Any = pool,
            slots: list[int] = slots,
            xd: torch.Tensor = xd,
            each: int = each,
            v: int = v,
        ) -> None:
            for sl in slots:
                pool.fill_random(sl, each)
            plan = DecodePlan.from_pool(pool, slots, v)
            blk.decode(xd, pool, plan)

        t = c.timer(dstep, warmup=1, repeat=5)
        for sl in slots:
            pool.fill_random(sl, each)
        synchronize(c.device)
        t_plan = time.perf_counter()
        for _ in range(5):  # host time to build a step's plan (buckets, masks, index copies)
            plan = DecodePlan.from_pool(pool, slots, v)
            plan.window(shape.window)
            if blk.m:
                plan.compression(blk.m, pool.max_entries)
        plan_s = (time.perf_counter() - t_plan) / 5
        decode_rows.append(
            {"B": b, "kv_total": b * each, "v": v, "time_s": t, "plan_host_ms": plan_s * 1e3}
        )
        del pool
        if c.device.type == "cuda":
            torch.cuda.empty_cache()
    res["decode"] = decode_rows
    return res


def check_indexer(c: Checker, shape: LayerShape) -> dict[str, Any]:
    """Fused (Triton) against torch indexer scores at a long-prefix prefill chunk's size."""
    from . import attention as A

    nq, ne = (64, 512) if c.toy else (512, 65536)
    dt = _util.default_dtype(c.device)
    iq = torch.randn(1, nq, shape.indexer_heads, shape.indexer_dim, device=c.device).to(dt)
    iw = torch.randn(1, nq, shape.indexer_heads, device=c.device).to(dt)
    keys = torch.randn(1, ne, shape.indexer_dim, device=c.device).to(dt)
    vis = torch.full((1, nq), ne, device=c.device)
    res: dict[str, Any] = {"Q": nq, "N": ne}
    ref = ref_indexer_scores(iq[:, :16], iw[:, :16], keys)
    flops = 2 * nq * ne * shape.indexer_heads * shape.indexer_dim
    for impl in ("torch", "triton"):
        try:
            out = A.indexer_scores(iq, iw, keys, vis=vis, impl=impl)
            err = rel_err(out[:, :16], ref)
            t = c.timer(lambda impl=impl: A.indexer_scores(iq, iw, keys, vis=vis, impl=impl))
            res[impl] = {"rel_err": err, "time_s": t, "tflops": flops / t / 1e12}
        except Exception as exc:
            res[impl] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    res["ok"] = res["torch"].get("rel_err", 1.0) < 2e-2 and (
        "error" in res["triton"] or res["triton"]["rel_err"] < 2e-2
    )
    res["auto_fallback_reason"] = A.indexer_fallback_reason
    return res


def check_moe(c: Checker, mode: str, experts: int) -> dict[str, Any]:
    shape = _shape(c.toy, experts)
    moe = MoEBlock(shape, c.device, mode, seed=7)  # type: ignore[arg-type]
    c.used("moe", moe.path)
    x = torch.randn(64, shape.hidden, device=c.device).to(moe.dtype)
    ids, w = moe.route(x)
    err = rel_err(moe.forward_routed(x, ids, w), ref_moe_routed(moe, x, ids, w))
    tol = 0.1 if mode == "fp8" else 2e-2
    rows = []
    for t in [256, 4096] if not c.toy else [64, 256]:
        xt = torch.randn(t, shape.hidden, device=c.device).to(moe.dtype)
        ids_t, w_t = moe.uniform_routing(t)
        dt = c.timer(lambda xt=xt, ids_t=ids_t, w_t=w_t: moe.forward_routed(xt, ids_t, w_t))
        flops = 2 * t * shape.top_k * 3 * shape.hidden * shape.expert_width
        rows.append({"T": t, "E": experts, "time_s": dt, "tflops": flops / dt / 1e12})
    return {"mode": mode, "path": moe.path, "rel_err": err, "ok": err < tol, "timing": rows}


def check_vision(c: Checker) -> dict[str, Any]:
    kw: dict[str, Any] = (
        {"width": 32, "layers": 2, "heads": 4, "mlp": 48, "patch": 4, "image_size": 18}
        if c.toy
        else {}
    )
    small = VisionEncoder(c.device, **{**kw, "layers": 2}, seed=1)
    px = small.random_images(1)
    err = rel_err(small.forward(px), ref_vision_encoder(small, px))
    del small
    enc = VisionEncoder(c.device, **kw, seed=2)
    rows = []
    for imgs in (1, 8):
        t = c.timer(lambda imgs=imgs: enc.encode(imgs), warmup=1, repeat=3)
        rows.append({"images": imgs, "tokens": enc.tokens * imgs, "time_s": t})
    return {
        "rel_err_2_layers": err,
        "ok": err < 2e-2,
        "timing": rows,
        "width": enc.width,
        "layers": len(enc.blocks),
        "tokens_per_image": enc.tokens,
    }


def check_engine(c: Checker, experts: int) -> dict[str, Any]:
    spec: Any = _shape(True, 8) if c.toy else load_model("deepseek-v4.1-flash")
    big = not c.toy
    eng = EngineCore(
        spec,
        local_experts=experts,
        device=c.device,
        max_seqs=16,
        max_tokens=8192 if big else 512,
        prefill_token_budget=4096 if big else 64,
        max_decode_batch=16,
        verify_tokens=2,
    )
    rng = np.random.default_rng(0)
    n = 12
    reqs = np.stack(
        [
            np.sort(rng.uniform(0, 0.3, n)),
            rng.integers(500, 3000, n) if big else rng.integers(5, 100, n),
            rng.integers(4, 24, n),
        ],
        axis=1,
    )
    r = eng.run(reqs)
    ok = bool(r.requests["done_s"].notna().all() and (r.requests["ttft_s"] >= 0).all())
    return {
        "ok": ok,
        **r.summary(),
        "step_ms_p50": float(((r.steps["end_s"] - r.steps["start_s"]) * 1e3).median()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="kernel smoke test + timing")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default=None)
    ap.add_argument("--toy", action="store_true", help="tiny widths (for a CPU smoke run)")
    ap.add_argument("--experts", type=int, default=48)
    ap.add_argument("--skip", nargs="*", default=[], help="names of checks to skip")
    args = ap.parse_args(argv)
    dev = as_device(args.device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = False
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    experts = 8 if args.toy else args.experts
    c = Checker(dev, args.toy)
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "capability": list(torch.cuda.get_device_capability(dev)) if dev.type == "cuda" else None,
        "has_scaled_mm": hasattr(torch, "_scaled_mm"),
        "has_grouped_mm": hasattr(torch, "_grouped_mm"),
        "has_scaled_grouped_mm": hasattr(torch, "_scaled_grouped_mm"),
        "fp8_supported": fp8_supported(dev),
        "grouped_mm_supported": grouped_mm_supported(dev),
        "toy": args.toy,
        "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
    }
    print(" ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    shape = _shape(args.toy, experts)
    torch.manual_seed(0)
    checks: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("gemm_ceiling", lambda: check_gemm_ceiling(c)),
        ("linear_bf16", lambda: check_linear(c, False)),
        ("linear_fp8", lambda: check_linear(c, True)),
        ("indexer", lambda: check_indexer(c, shape)),
        ("attention_swa", lambda: check_attention(c, "swa", shape)),
        ("attention_csa", lambda: check_attention(c, "csa", shape)),
        ("attention_hca", lambda: check_attention(c, "hca", shape)),
        ("moe_bf16", lambda: check_moe(c, "bf16", experts)),
        ("moe_fp8", lambda: check_moe(c, "fp8", experts)),
        ("vision", lambda: check_vision(c)),
        ("engine", lambda: check_engine(c, experts)),
    ]
    t0 = time.perf_counter()
    for name, fn in checks:
        if name in args.skip:
            continue
        c.run(name, fn)
        synchronize(dev)
    from . import attention as A

    c.fast_paths["indexer"] = set(A.indexer_path_used)
    info["indexer_fallback_reason"] = A.indexer_fallback_reason
    info["fast_paths_used"] = {k: sorted(v) for k, v in c.fast_paths.items()}
    info["total_s"] = time.perf_counter() - t0
    (out / "gpu_check.json").write_text(
        json.dumps({"info": info, "results": c.results}, indent=2, default=str)
    )
    _print_table(info, c.results)
    return 0 if all(r["ok"] for r in c.results) else 1


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        return f"{x:.3g}"
    return str(x)


def _print_table(info: dict[str, Any], results: list[dict[str, Any]]) -> None:
    print()
    print(
        f"torch {info['torch']}  cuda {info['cuda']}  {info['device']}  "
        f"fast paths used: {info['fast_paths_used']}"
    )
    for r in results:
        head = f"{r['name']:<15} {'ok ' if r['ok'] else 'FAIL'}"
        if not r["ok"] and "error" in r:
            print(f"{head} {r['error'][:150]}")
            continue
        parts = []
        for key in (
            "path",
            "rel_err",
            "rel_err_decode",
            "rel_err_2_layers",
            "tflops",
            "bf16_tflops",
            "fp8_tflops",
            "mean_step_s",
            "mean_ttft_s",
            "mean_tpot_s",
        ):
            if key in r:
                parts.append(f"{key}={_fmt(r[key])}")
        print(f"{head} " + " ".join(parts))
        for impl in ("torch", "triton"):
            if impl in r:
                print(
                    f"{'':<20}{impl:<8} " + " ".join(f"{k}={_fmt(v)}" for k, v in r[impl].items())
                )
        for sub in ("prefill", "decode", "timing"):
            for row in r.get(sub, []):
                ms = row.get("time_s", float("nan")) * 1e3
                keys = " ".join(f"{k}={_fmt(v)}" for k, v in row.items() if k != "time_s")
                print(f"{'':<20}{sub:<8} {keys:<40} {ms:9.3f} ms")
    print(f"total {info['total_s']:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
