"""The kernel table: one layer of each kind timed on both kernel backends next to its roofline.

    python -m deepinfer_sim.calibration.kernel_table --out table.json [--device cuda]
    python -m deepinfer_sim.calibration.kernel_table --render table.json   # markdown

Rows, per attention kind of V4.1-Flash (and V3's MLA): decode of 64 sequences × 8,192 context
with 1 and with 6 query tokens each, and prefill per token of an 8,192-token prompt. Columns: the
reference kernels and DeepSeek's (``TorchBench`` of each backend: the very function calibration
times, CUDA-graph replays), and the roofline bound — the larger of the bytes the layer must move
over the measured copy bandwidth and its FLOPs over the measured GEMM rates (FP8 for the
projections, bf16 for attention and the indexer). The byte and FLOP counts (``layer_work``) are
those of the deepseek kernels' formats: FP8 weights, FP8 MODEL1 cache rows (584 B), bf16
indexer keys.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..kernels.shapes import LayerShape
from ..models.registry import load_model

DECODE_BATCH, DECODE_CONTEXT, PREFILL_TOKENS = 64, 8192, 8192
MODELS = {
    "csa": "deepseek-v4.1-flash",
    "hca": "deepseek-v4.1-flash",
    "swa": "deepseek-v4-flash",
    "mla": "deepseek-v3",
}
CACHE_ROW_BYTES = 584  # FlashMLA MODEL1: 448 FP8 + 64 bf16 + 8 scale bytes


@dataclass(frozen=True)
class Work:
    bytes: float
    flops_fp8: float
    flops_bf16: float

    def roofline_s(self, bytes_per_s: float, fp8_flops: float, bf16_flops: float) -> float:
        return max(
            self.bytes / bytes_per_s, self.flops_fp8 / fp8_flops + self.flops_bf16 / bf16_flops
        )


def layer_params(s: LayerShape, kind: str) -> float:
    """Weights of attention + shared expert of one layer (no routed experts)."""
    shared = 3 * s.hidden * s.shared_width
    if kind == "mla":
        return (
            s.hidden * s.q_lora
            + s.q_lora * s.heads * (s.qk_nope + s.rope_dim)
            + s.hidden * (s.kv_lora + s.rope_dim)
            + s.kv_lora * s.heads * (s.qk_nope + s.v_head)
            + s.heads * s.v_head * s.hidden
            + shared
        )
    p = (
        s.hidden * s.q_lora
        + s.q_lora * s.heads * s.head_dim
        + s.hidden * s.head_dim
        + s.heads * s.head_dim * s.o_lora
        + s.o_groups * s.o_lora * s.hidden
        + shared
    )
    if kind == "csa":
        p += s.hidden * (s.indexer_dim + s.indexer_heads + s.indexer_heads * s.indexer_dim)
    return p


def attended(s: LayerShape, kind: str, position: float) -> tuple[float, float]:
    """(cache rows one query attends to, compressed entries its indexer scores)."""
    if kind == "mla":
        return position, 0.0
    m = s.compression(kind)  # type: ignore[arg-type]
    entries = position / m if m else 0.0
    if kind == "csa":
        return min(s.window, position) + min(s.index_topk, entries), entries
    return min(s.window, position) + entries, 0.0


def decode_work(s: LayerShape, kind: str, batch: int, context: int, verify: int) -> Work:
    params = layer_params(s, kind)
    tokens = batch * verify
    rows, scored = attended(s, kind, context)
    kv_bytes: float
    if kind == "mla":
        width, kv_bytes = s.kv_lora + s.rope_dim, (s.kv_lora + s.rope_dim) * 2.0 * context
        attn = 2 * s.heads * rows * (width + s.kv_lora) + 4 * s.heads * s.qk_nope * s.kv_lora
    else:
        width = s.head_dim
        kv_bytes = rows * CACHE_ROW_BYTES + scored * s.indexer_dim * 2
        attn = 2 * s.heads * rows * 2 * width + 2 * s.indexer_heads * s.indexer_dim * scored
    return Work(params + batch * kv_bytes, 2 * params * tokens, attn * tokens)


def prefill_work(s: LayerShape, kind: str, n: int, prefix: int = 0) -> Work:
    """All n tokens of a chunk after ``prefix`` tokens (attention summed over positions)."""
    params = layer_params(s, kind)
    attn = 0.0
    step = max(1, n // 64)
    for pos in range(prefix, prefix + n, step):  # midpoint sum over the chunk
        rows, scored = attended(s, kind, pos + step / 2)
        if kind == "mla":  # MHA form: 192-wide q·k, 128-wide p·v per head
            attn += step * 2 * s.heads * rows / 2 * (s.qk_nope + s.rope_dim + s.v_head)
        else:
            attn += step * (
                2 * s.heads * rows * 2 * s.head_dim + 2 * s.indexer_heads * s.indexer_dim * scored
            )
    return Work(params, 2 * params * n, attn)


def measure(device: str = "cuda") -> dict[str, Any]:
    """Time every row on both backends (GPU), plus the copy bandwidth and GEMM rates."""
    import torch

    from ..kernels._util import gemm_rates
    from .torch_bench import TorchBench

    out: dict[str, Any] = {"rows": []}
    rates_done = False
    for kind, model in MODELS.items():
        for backend in ("reference", "deepseek"):
            try:
                bench = TorchBench(
                    device=device,
                    model=model,
                    backend=backend,
                    max_prefix=0,
                    max_chunk=PREFILL_TOKENS,
                    max_batch=DECODE_BATCH,
                    max_context=DECODE_CONTEXT + 8,
                )
            except Exception as exc:  # e.g. the reference backend has no MLA kernels
                out["rows"].append({"kind": kind, "backend": backend, "error": str(exc)[:200]})
                continue
            if not rates_done:
                bench.warmup()
                out["copy_bytes_per_s"] = bench.copy_bandwidth()
                out["fp8_flops"], out["bf16_flops"] = gemm_rates(bench.device)
                out["device"] = bench.device_name
                rates_done = True
            row: dict[str, Any] = {"kind": kind, "backend": backend, "model": model}
            for v in (1, 6):
                try:
                    row[f"decode_v{v}_s"] = bench.decode(kind, DECODE_BATCH, DECODE_CONTEXT, v)
                except Exception as exc:
                    row[f"decode_v{v}_error"] = str(exc)[:200]
            try:
                row["prefill_per_token_s"] = bench.prefill(kind, PREFILL_TOKENS, 0) / PREFILL_TOKENS
            except Exception as exc:
                row["prefill_error"] = str(exc)[:200]
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
            del bench
            torch.cuda.empty_cache()
    return out


def roofline_row(kind: str, data: dict[str, Any]) -> dict[str, float]:
    s = LayerShape.from_model(load_model(MODELS[kind]), local_experts=8)
    rates = (data["copy_bytes_per_s"], data["fp8_flops"], data["bf16_flops"])
    return {
        "decode_v1_s": decode_work(s, kind, DECODE_BATCH, DECODE_CONTEXT, 1).roofline_s(*rates),
        "decode_v6_s": decode_work(s, kind, DECODE_BATCH, DECODE_CONTEXT, 6).roofline_s(*rates),
        "prefill_per_token_s": prefill_work(s, kind, PREFILL_TOKENS).roofline_s(*rates)
        / PREFILL_TOKENS,
    }


def render(data: dict[str, Any]) -> str:
    """The markdown table of a measured JSON."""
    by = {(r["kind"], r["backend"]): r for r in data["rows"]}

    def us(r: dict[str, Any] | None, key: str) -> str:
        return f"{r[key] * 1e6:,.0f}" if r and key in r else "—"

    lines = [
        f"Measured on {data.get('device', '?')}: copy {data['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
        f"FP8 GEMM {data['fp8_flops'] / 1e12:,.0f} TFLOP/s, bf16 GEMM "
        f"{data['bf16_flops'] / 1e12:,.0f} TFLOP/s. Times in µs per layer (attention + shared "
        f"expert); decode at {DECODE_BATCH} sequences × {DECODE_CONTEXT:,} context; prefill per "
        f"token of a {PREFILL_TOKENS:,}-token prompt in ns.",
        "",
        "| kind (model) | decode ×1: reference | DeepSeek | roofline | decode ×6: reference "
        "| DeepSeek | roofline | prefill/token (ns): reference | DeepSeek | roofline |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, model in MODELS.items():
        ref, ds = by.get((kind, "reference")), by.get((kind, "deepseek"))
        roof = roofline_row(kind, data)

        def ns(r: dict[str, Any] | None) -> str:
            key = "prefill_per_token_s"
            return f"{r[key] * 1e9:,.0f}" if r and key in r else "—"

        lines.append(
            f"| {kind} ({model}) | {us(ref, 'decode_v1_s')} | {us(ds, 'decode_v1_s')} | "
            f"{roof['decode_v1_s'] * 1e6:,.0f} | {us(ref, 'decode_v6_s')} | "
            f"{us(ds, 'decode_v6_s')} | {roof['decode_v6_s'] * 1e6:,.0f} | {ns(ref)} | {ns(ds)} | "
            f"{roof['prefill_per_token_s'] * 1e9:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", help="measure on the device and write this JSON")
    ap.add_argument("--render", help="print the markdown table of a measured JSON")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    if a.out:
        data = measure(a.device)
        Path(a.out).write_text(json.dumps(data, indent=2) + "\n")
        print(render(data))
    if a.render:
        print(render(json.loads(Path(a.render).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
