"""DeepGEMM's masked grouped FP8 GEMM (DeepSeek's decode MoE kernel) against the GEMM the
project's routed experts run today (``torch._scaled_grouped_mm``, row-wise scales), on the same
decode shapes: E local experts × m rows each, the gate-up GEMM (N = 2 × expert width, K = hidden)
and the down GEMM (N = hidden, K = expert width) of a model.

    python -m deepinfer_sim.kernels.deepgemm_moe_bench --out DIR [--models deepseek-v3,...]
    python -m deepinfer_sim.kernels.deepgemm_moe_bench --dry-run     # the shapes, no GPU

Each case reports both kernels' median time (``triton.testing.do_bench``) and each output's
relative error against a bf16 einsum of the unquantized inputs, so a fast but wrong call shows.
DeepGEMM takes 1×128 activation and 128×128 weight scales (its own casting helpers); the torch
path takes per-row and per-output-channel scales, as ``kernels/moe.py`` quantizes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..models.registry import load_model
from ._util import rel_err, time_cases

MODELS = ("deepseek-v3", "deepseek-v4.1-flash")
EXPERTS = (8, 32)
ROWS = (16, 64, 256)


def shapes(models: tuple[str, ...] = MODELS) -> list[dict[str, Any]]:
    """Every (model, GEMM, E experts, m rows per expert, N, K) case timed."""
    out = []
    for name in models:
        spec = load_model(name)
        w, h = spec.moe.expert_width, spec.hidden
        for gemm, n, k in (("gate_up", 2 * w, h), ("down", h, w)):
            for e in EXPERTS:
                for m in ROWS:
                    out.append({"model": name, "gemm": gemm, "experts": e, "m": m, "n": n, "k": k})
    return out


def time_case(case: dict[str, Any]) -> dict[str, Any]:
    """Both kernels on one shape (GPU only)."""
    import deep_gemm
    import torch
    from deep_gemm.utils.math import per_block_cast_to_fp8, per_token_cast_to_fp8
    from triton.testing import do_bench

    e, m, n, k = case["experts"], case["m"], case["n"], case["k"]
    dev = "cuda"
    a = torch.randn((e, m, k), device=dev, dtype=torch.bfloat16)
    b = torch.randn((e, n, k), device=dev, dtype=torch.bfloat16) / k**0.5
    ref = torch.einsum("gmk,gnk->gmn", a, b)
    # DeepGEMM masked layout: [E, max_m, K] with 1x128 / 128x128 scales
    aq = torch.empty((e, m, k), device=dev, dtype=torch.float8_e4m3fn)
    asf = torch.empty((e, m, k // 128), device=dev, dtype=torch.float32)
    bq = torch.empty((e, n, k), device=dev, dtype=torch.float8_e4m3fn)
    bsf = torch.empty((e, (n + 127) // 128, k // 128), device=dev, dtype=torch.float32)
    for g in range(e):
        aq[g], asf[g] = per_token_cast_to_fp8(a[g], use_ue8m0=False)
        bq[g], bsf[g] = per_block_cast_to_fp8(b[g], use_ue8m0=False)
    d = torch.empty((e, m, n), device=dev, dtype=torch.bfloat16)
    masked = torch.full((e,), m, device=dev, dtype=torch.int32)

    def deepgemm() -> None:
        deep_gemm.m_grouped_fp8_gemm_nt_masked(
            (aq, asf), (bq, bsf), d, masked, m, disable_ue8m0_cast=True
        )

    deepgemm()
    err_dg = rel_err(d, ref)
    # the project's path: rows of all experts back to back, per-row / per-channel scales
    rows = a.reshape(e * m, k)
    ra = rows.float().abs().amax(-1).clamp_min(1e-12) / 448.0
    rq = (rows.float() / ra[:, None]).to(torch.float8_e4m3fn)
    wb = b.float().abs().amax(-1).clamp_min(1e-12) / 448.0  # [E, N]
    wq = (b.float() / wb[..., None]).to(torch.float8_e4m3fn)
    offs = torch.arange(1, e + 1, device=dev, dtype=torch.int32) * m

    def scaled() -> Any:
        return torch._scaled_grouped_mm(
            rq, wq.transpose(-2, -1), scale_a=ra, scale_b=wb, offs=offs, out_dtype=torch.bfloat16
        )

    err_sg = rel_err(scaled().reshape(e, m, n), ref)
    t_dg = do_bench(deepgemm, return_mode="median") * 1e-3
    t_sg = do_bench(scaled, return_mode="median") * 1e-3
    flops = 2.0 * e * m * n * k
    return {
        **case,
        "deepgemm_s": t_dg,
        "scaled_grouped_mm_s": t_sg,
        "speedup": t_sg / t_dg,
        "deepgemm_tflops": flops / t_dg / 1e12,
        "scaled_grouped_mm_tflops": flops / t_sg / 1e12,
        "deepgemm_rel_err": err_dg,
        "scaled_grouped_mm_rel_err": err_sg,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", help="folder for deepgemm_moe.json")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dry-run", action="store_true", help="list the shapes only (no GPU)")
    a = ap.parse_args(argv)
    cases = shapes(tuple(a.models.split(",")))
    if a.dry_run:
        for c in cases:
            print(json.dumps(c))
        return 0
    if not a.out:
        ap.error("--out is required unless --dry-run")
    return time_cases(cases, time_case, Path(a.out) / "deepgemm_moe.json")


if __name__ == "__main__":
    sys.exit(main())
