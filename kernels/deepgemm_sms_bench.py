"""How DeepGEMM's FP8 GEMMs slow down when they run on fewer SMs: the rule behind
``pools.prefill.gemm_sms: reserved`` (``StepCost.compose_tbo``), which charges a GEMM that leaves
a share s of the SMs to the exchange g / (1 - s), measured on V3's prefill shapes.

    python -m deepinfer_sim.kernels.deepgemm_sms_bench --out DIR [--models deepseek-v3]
    python -m deepinfer_sim.kernels.deepgemm_sms_bench --dry-run     # the shapes, no GPU

SGLang's overlapped prefill calls ``deep_gemm.set_num_sms(SMs - DeepEP's)`` around the step;
this times each shape at every SM count in ``--held`` (SMs left to DeepEP: 0, 20, 24 by default)
and reports t(held) / t(0) beside the rule's 1 / (1 - held / SMs). DeepGEMM's first call
crashes on the lent image (vendor/README.md), so the default backend is cuBLASLt's FP8 GEMM
(``torch._scaled_mm``) under its SM carve-out (``torch._C._set_sm_carveout_experimental``), the
same restriction by another GEMM library. Shapes: a prefill
micro-batch's dense GEMMs (M tokens × the layer's projections, ``dense_shapes``) and its routed
experts (E local experts × m rows each, masked grouped GEMM, ``expert_shapes``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..models.registry import load_model
from ._util import rel_err, time_cases

MODELS = ("deepseek-v3",)
TOKENS = (4096, 8192)  # a prefill micro-batch: half of 8K / 16K tokens per GPU
EXPERT_ROWS = (2048, 7168)  # rows per local expert of such a micro-batch (top-8 over EP32)
LOCAL_EXPERTS = 9  # EP32 with one redundant expert per GPU
HELD = (0, 20, 24)  # SMs left to the exchange (DeepEP's default 20; its README's example 24)


def dense_shapes(name: str) -> list[tuple[str, int, int]]:
    """(GEMM, N, K) of one prefill layer's dense projections (MLA's and the shared expert's)."""
    m = load_model(name)
    a, h = m.attention, m.hidden
    heads, qk, rope, v = a.heads, a.mla_qk_head_dim, a.mla_rope_dim, a.mla_value_head_dim
    latent = a.head_dim - rope  # the compressed KV (512 in V3), its rope part beside it
    shared = m.moe.shared_experts * (m.moe.shared_expert_width or m.moe.expert_width)
    return [
        ("q_a + kv_a", a.q_lora + a.head_dim, h),
        ("q_b", heads * qk, a.q_lora),
        ("kv_b", heads * (qk - rope + v), latent),
        ("o", h, heads * v),
        ("shared gate_up", 2 * shared, h),
        ("shared down", h, shared),
    ]


def shapes(models: tuple[str, ...] = MODELS) -> list[dict[str, Any]]:
    """Every case timed: dense GEMMs at each M in ``TOKENS``, the experts' two grouped GEMMs at
    each rows-per-expert in ``EXPERT_ROWS``."""
    out: list[dict[str, Any]] = []
    for name in models:
        for gemm, n, k in dense_shapes(name):
            for m in TOKENS:
                out.append({"model": name, "kind": "dense", "gemm": gemm, "m": m, "n": n, "k": k})
        spec = load_model(name)
        w, h = spec.moe.expert_width, spec.hidden
        for gemm, n, k in (("experts gate_up", 2 * w, h), ("experts down", h, w)):
            for m in EXPERT_ROWS:
                case = {"model": name, "kind": "grouped", "gemm": gemm, "m": m, "n": n, "k": k}
                out.append({**case, "experts": LOCAL_EXPERTS})
    return out


def slowdowns(times: dict[int, float], sms: int) -> dict[str, dict[str, float]]:
    """Per SM count held back: the measured t(held) / t(0) and the rule's 1 / (1 - held / sms)."""
    base = times[0]
    return {
        str(held): {"measured": t / base, "rule": 1.0 / (1.0 - held / sms)}
        for held, t in sorted(times.items())
        if held
    }


def _deepgemm_call(case: dict[str, Any], a: Any, b: Any, d: Any) -> Callable[[], None]:
    """DeepGEMM's FP8 GEMM on ``a`` × ``b``ᵀ into ``d`` (1×128 / 128×128 scales): the dense
    ``fp8_gemm_nt`` or, for ``grouped`` cases, the masked grouped GEMM."""
    import deep_gemm
    import torch
    from deep_gemm.utils.math import per_block_cast_to_fp8, per_token_cast_to_fp8

    e, m, n, k = a.shape[0], case["m"], case["n"], case["k"]
    aq = torch.empty((e, m, k), device=a.device, dtype=torch.float8_e4m3fn)
    asf = torch.empty((e, m, (k + 127) // 128), device=a.device, dtype=torch.float32)
    bq = torch.empty((e, n, k), device=a.device, dtype=torch.float8_e4m3fn)
    bsf = torch.empty((e, (n + 127) // 128, (k + 127) // 128), device=a.device, dtype=torch.float32)
    for g in range(e):
        aq[g], asf[g] = per_token_cast_to_fp8(a[g], use_ue8m0=False)
        bq[g], bsf[g] = per_block_cast_to_fp8(b[g], use_ue8m0=False)
    if case["kind"] == "dense":
        return lambda: deep_gemm.fp8_gemm_nt(
            (aq[0], asf[0]), (bq[0], bsf[0]), d[0], disable_ue8m0_cast=True
        )
    masked = torch.full((e,), m, device=a.device, dtype=torch.int32)
    return lambda: deep_gemm.m_grouped_fp8_gemm_nt_masked(
        (aq, asf), (bq, bsf), d, masked, m, disable_ue8m0_cast=True
    )


def _cublas_call(case: dict[str, Any], a: Any, b: Any, d: Any) -> Callable[[], None]:
    """cuBLASLt's FP8 GEMM (``torch._scaled_mm``, row-wise scales) on ``a`` × ``b``ᵀ into ``d``,
    one call per expert for ``grouped`` cases (each honours the SM carve-out)."""
    import torch

    def quant(x: Any) -> tuple[Any, Any]:
        scale = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
        return (x.float() / scale).to(torch.float8_e4m3fn), scale

    pairs = [(quant(a[g]), quant(b[g])) for g in range(a.shape[0])]

    def call() -> None:
        for g, ((aq, sa), (bq, sb)) in enumerate(pairs):
            torch._scaled_mm(aq, bq.t(), scale_a=sa, scale_b=sb.t(), out=d[g])

    return call


BACKENDS = {"deepgemm": _deepgemm_call, "cublas": _cublas_call}


def _set_held(backend: str, sms: int, held: int) -> None:
    """Leave ``held`` SMs to the exchange: DeepGEMM's SM count, or cuBLASLt's SM carve-out."""
    if backend == "deepgemm":
        import deep_gemm

        deep_gemm.set_num_sms(sms - held)
    else:
        import torch

        torch._C._set_sm_carveout_experimental(held or None)


def time_case(case: dict[str, Any], held: tuple[int, ...], backend: str) -> dict[str, Any]:
    """One shape at each SM count (GPU only); the output checked against a bf16 product."""
    import torch
    from triton.testing import do_bench

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    e = case.get("experts", 1)
    m, n, k = case["m"], case["n"], case["k"]
    a = torch.randn((e, m, k), device="cuda", dtype=torch.bfloat16)
    b = torch.randn((e, n, k), device="cuda", dtype=torch.bfloat16) / k**0.5
    d = torch.empty((e, m, n), device="cuda", dtype=torch.bfloat16)
    call = BACKENDS[backend](case, a, b, d)
    times: dict[int, float] = {}
    try:
        for h in held:
            _set_held(backend, sms, h)
            call()
            times[h] = do_bench(call, return_mode="median") * 1e-3
    finally:
        _set_held(backend, sms, 0)
    err = rel_err(d, torch.einsum("gmk,gnk->gmn", a, b))
    flops = 2.0 * e * m * n * k
    return {
        **case,
        "backend": backend,
        "sms": sms,
        "seconds": {str(h): t for h, t in times.items()},
        "tflops_all_sms": flops / times[0] / 1e12,
        "slowdown": slowdowns(times, sms),
        "rel_err": err,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", help="folder for deepgemm_sms.json")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--held", default=",".join(map(str, HELD)), help="SMs held back, 0 first")
    ap.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="cublas",
        help="cublas: torch._scaled_mm under cuBLASLt's SM carve-out (runs on this image); "
        "deepgemm: DeepGEMM's set_num_sms (its first call crashes on this image)",
    )
    ap.add_argument("--dry-run", action="store_true", help="list the shapes only (no GPU)")
    a = ap.parse_args(argv)
    try:
        held = tuple(int(x) for x in a.held.split(","))
    except ValueError:
        ap.error(f"--held {a.held!r}: comma-separated whole numbers of SMs")
    if not held or held[0] != 0 or min(held) < 0:
        ap.error(f"--held {a.held!r}: start with 0 (all SMs), none negative")
    cases = shapes(tuple(a.models.split(",")))
    if a.dry_run:
        for c in cases:
            print(json.dumps(c))
        return 0
    if not a.out:
        ap.error("--out is required unless --dry-run")
    return time_cases(
        cases, lambda c: time_case(c, held, a.backend), Path(a.out) / "deepgemm_sms.json"
    )


if __name__ == "__main__":
    sys.exit(main())
