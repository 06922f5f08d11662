"""The kernels a tensor-parallel engine runs against the ones the profile times, on one GPU.

Two questions the published TP deployments raise (docs/validation.md, "The corpus"):

* **Narrow experts.** Under expert tensor parallelism every expert is ``moe_tp`` times narrower.
  The profile times ``torch._scaled_grouped_mm``; TP-MoE engines run a Triton fused-MoE kernel
  tiled per shape (``kernels/triton_grouped_gemm.py``). Both on the gate-up (N = 2F/tp, K = D) and
  down (N = D, K = F/tp) GEMMs of V3 and V4.1-Flash, at 1/2/4/8-way expert TP, over experts and
  rows per expert from decode to prefill sizes.
* **Prefill attention.** V3's MHA-form prefill ran FlashAttention through PyTorch (FA2-class on
  Hopper); engines run FA3 there. PyTorch's cuDNN attention is the FA3-class kernel this image
  has: both on the heads of one TP slice (128 / tp), chunks after a prefix — cuDNN with an
  end-aligned mask, and the split form the profile now times (``mla.prefill_attention``: the
  chunk over itself, causal, and over the prefix, unmasked, merged by log-sum-exps).
* **The experts' combine.** Each token's k expert rows weighted and summed: the reference's
  float32 copies with ``index_add_`` against the Triton combine (``kernels/triton_combine.py``).
* **The split attention's merge.** The two partial outputs of a chunk with a prefix merged by
  their log-sum-exps: the reference's float32 passes against the Triton merge
  (``kernels/triton_merge.py``), at each TP slice's heads.

    python -m deepinfer_sim.kernels.tp_kernel_bench --out FILE.json [--quick]
    python -m deepinfer_sim.kernels.tp_kernel_bench --dry-run       # the cases, no GPU

Each case reports every kernel's median time (``triton.testing.do_bench``) and its output's
relative error against a float32 reference, so a fast but wrong kernel shows.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..models.registry import load_model

MODELS = ("deepseek-v3", "deepseek-v4.1-flash")
MOE_TP = (1, 2, 4, 8)
EXPERTS = (8, 32)
ROWS = (4, 16, 64, 256, 1024)
HEADS = (16, 32, 128)  # V3's 128 heads over TP 8, 4, 1
CHUNKS = ((4096, 0), (8192, 0), (8192, 8192), (8192, 24576))  # (new tokens, prefix)
COMBINE_TOKENS = (256, 2048, 8192, 16384)
MERGE_TOKENS = (1024, 8192, 16384)


def moe_cases(models: tuple[str, ...] = MODELS, quick: bool = False) -> list[dict[str, Any]]:
    """Every (model, moe_tp, GEMM, E experts, m rows per expert, N, K) case."""
    out = []
    for name in models:
        spec = load_model(name)
        w, h = spec.moe.expert_width, spec.hidden
        for tp in (1, 8) if quick else MOE_TP:
            f = w // tp
            for gemm, n, k in (("gate_up", 2 * f, h), ("down", h, f)):
                for e in EXPERTS:
                    for m in (16, 256) if quick else ROWS:
                        out.append(
                            {"model": name, "moe_tp": tp, "gemm": gemm, "experts": e, "m": m,
                             "n": n, "k": k}
                        )  # fmt: skip
    return out


def attention_cases(quick: bool = False) -> list[dict[str, Any]]:
    """V3's MHA-form prefill (q/k 192 wide, v 128) at each TP slice's heads."""
    return [
        {"heads": hd, "new": n, "prefix": p, "d_qk": 192, "d_v": 128}
        for hd in ((16, 128) if quick else HEADS)
        for n, p in (CHUNKS[1:3] if quick else CHUNKS)
    ]


def combine_cases(quick: bool = False) -> list[dict[str, Any]]:
    """V3's combine (8 rows of 7,168 per token) at decode to prefill token counts."""
    return [
        {"tokens": t, "top_k": 8, "hidden": 7168}
        for t in (COMBINE_TOKENS[1:3] if quick else COMBINE_TOKENS)
    ]


def merge_cases(quick: bool = False) -> list[dict[str, Any]]:
    """V3's merge (value heads 128 wide) at each TP slice's heads."""
    return [
        {"heads": hd, "tokens": t, "d_v": 128}
        for hd in ((16, 128) if quick else HEADS)
        for t in (MERGE_TOKENS[1:] if quick else MERGE_TOKENS)
    ]


def _time_kernels(
    row: dict[str, Any],
    kernels: Sequence[tuple[str, Callable[[], Any]]],
    ref: Any,
    warmup: int = 5,
    rep: int = 30,
    view: Callable[[Any], Any] = lambda out: out,
    bench: Callable[..., float] | None = None,
) -> dict[str, Any]:
    """Each kernel's relative error against ``ref`` (of ``view(output)``) and median time in
    ms (``bench``, default ``triton.testing.do_bench``) into ``row`` as ``NAME_err`` /
    ``NAME_us``; a kernel that cannot run this shape is said (``NAME_error``) and the others go
    on."""
    if bench is None:
        from triton.testing import do_bench
    else:
        do_bench = bench
    for name, fn in kernels:
        try:
            got = view(fn()).float()
            row[f"{name}_err"] = float((got - ref).norm() / ref.norm())
            row[f"{name}_us"] = 1e3 * float(do_bench(fn, warmup=warmup, rep=rep))
        except Exception as exc:
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def time_combine(case: dict[str, Any]) -> dict[str, Any]:
    """The reference combine and the Triton combine on one shape (GPU only)."""
    import torch

    from .moe import MoEBlock
    from .triton_combine import combine_reference, combine_rows, sorted_positions

    t, k, d = case["tokens"], case["top_k"], case["hidden"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.stack([torch.randperm(256, device="cuda", generator=gen)[:k] for _ in range(8)])
    ids = ids.repeat(-(-t // 8), 1)[:t]
    w = torch.rand((t, k), device="cuda", generator=gen)
    y = torch.randn((t * k, d), device="cuda", dtype=torch.bfloat16, generator=gen)
    order = torch.argsort(ids.reshape(-1), stable=True)
    tok = torch.div(order, k, rounding_mode="floor")
    pos = sorted_positions(order, k)
    ref = combine_reference(y, pos, w).float()

    holder = SimpleNamespace(dtype=torch.bfloat16)  # what MoEBlock.combine reads of its block

    def reference() -> Any:
        return MoEBlock.combine(holder, y, order, tok, w, t)  # type: ignore[arg-type]

    def triton() -> Any:
        return combine_rows(y, sorted_positions(order, k), w)

    return _time_kernels(dict(case), (("index_add", reference), ("triton", triton)), ref)


def time_merge(case: dict[str, Any]) -> dict[str, Any]:
    """The reference merge and the Triton merge on one shape (GPU only), the outputs in
    cuDNN's head-major layout."""
    from .triton_merge import merge_reference, merge_states, random_states

    states = random_states(case["heads"], case["tokens"], case["d_v"], "cuda", seed=0)
    ref = merge_reference(*states).float()
    kernels = (
        ("reference", lambda: merge_reference(*states)),
        ("triton", lambda: merge_states(*states)),
    )
    return _time_kernels(dict(case), kernels, ref)


def time_moe(case: dict[str, Any]) -> dict[str, Any]:
    """torch._scaled_grouped_mm and the Triton grouped GEMM on one shape (GPU only)."""
    import torch

    from .linear import quantize_rowwise
    from .triton_grouped_gemm import grouped_fp8_gemm, grouped_reference

    e, m, n, k = case["experts"], case["m"], case["n"], case["k"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn((e * m, k), device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn((e, n, k), device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5
    aq, a_s = quantize_rowwise(a)
    wq, ws = quantize_rowwise(w)
    offs = torch.arange(1, e + 1, device="cuda", dtype=torch.int32) * m
    ref = grouped_reference(aq, a_s, wq, ws, offs).float()

    def torch_gmm() -> Any:
        return torch._scaled_grouped_mm(
            aq, wq.transpose(-2, -1), scale_a=a_s, scale_b=ws, offs=offs,
            out_dtype=torch.bfloat16,
        )  # fmt: skip

    def triton_gmm() -> Any:
        return grouped_fp8_gemm(aq, a_s, wq, ws, offs)

    kernels = (("scaled_grouped_mm", torch_gmm), ("triton", triton_gmm))
    return _time_kernels(dict(case), kernels, ref, warmup=10, rep=40)


def time_attention(case: dict[str, Any]) -> dict[str, Any]:
    """FlashAttention (what the profile times, v zero-padded to 192) and cuDNN attention (v at
    its own 128) on one chunk after a prefix, end-aligned causal (GPU only)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    h, n, p, dqk, dv = case["heads"], case["new"], case["prefix"], case["d_qk"], case["d_v"]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape: int) -> Any:
        return torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)

    q, k, v = rnd(1, h, n, dqk), rnd(1, h, p + n, dqk), rnd(1, h, p + n, dv)
    v_pad = torch.nn.functional.pad(v, (0, dqk - dv))
    scale = dqk**-0.5

    def flash() -> Any:
        return torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v_pad, 0.0, True, False, scale=scale
        )[0]

    mask = causal_lower_right(n, p + n) if p else None

    def cudnn() -> Any:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale
            )

    ref = flash()[..., :dv].float()
    row: dict[str, Any] = dict(case)
    # causal pairs attended: every new token sees the prefix and the new tokens up to itself
    pairs = n * p + n * (n + 1) / 2
    row["tflop"] = 2 * h * pairs * (dqk + dv) / 1e12
    from .deepseek import mla

    q3, k3, v3 = (t[0].transpose(0, 1) for t in (q, k, v))

    def split() -> Any:
        return mla._split_attention(q3, k3, v3, scale, mla._cudnn).transpose(0, 1).unsqueeze(0)

    kernels = (("flash", flash), ("cudnn", cudnn), ("split", split))
    return _time_kernels(row, kernels, ref, view=lambda out: out[..., :dv])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true", help="a few cases of each kind")
    ap.add_argument("--dry-run", action="store_true", help="list the cases; no GPU needed")
    ap.add_argument(
        "--skip", choices=("moe", "attention", "combine", "merge"), action="append", default=[]
    )
    args = ap.parse_args(argv)
    moe = [] if "moe" in args.skip else moe_cases(quick=args.quick)
    att = [] if "attention" in args.skip else attention_cases(quick=args.quick)
    comb = [] if "combine" in args.skip else combine_cases(quick=args.quick)
    merge = [] if "merge" in args.skip else merge_cases(quick=args.quick)
    if args.dry_run:
        print(json.dumps({"moe": moe, "attention": att, "combine": comb, "merge": merge}, indent=1))
        return 0
    if args.out is None:
        ap.error("--out is required unless --dry-run")
    import torch

    rows: dict[str, list[dict[str, Any]]] = {"moe": [], "attention": [], "combine": [], "merge": []}
    for kind, cases, fn in (
        ("moe", moe, time_moe),
        ("attention", att, time_attention),
        ("combine", comb, time_combine),
        ("merge", merge, time_merge),
    ):
        for case in cases:
            rows[kind].append(fn(case))
            print(json.dumps(rows[kind][-1]), flush=True)
            args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), **rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
