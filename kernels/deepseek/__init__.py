"""The ``deepseek`` kernel backend: one layer on DeepSeek's open kernels (``kernels/backend.py``).

==============  ===================================================================================
``layout``      FlashMLA's FP8 ``MODEL1`` KV-cache layout (write / read with torch ops)
``flashmla``    FlashMLA's sparse decode, sparse prefill and dense MLA decode, each with a torch
                emulation (CPU, toy widths) that ``gpu_check`` compares with the kernel
``fp8``         fused RMSNorm/SwiGLU + FP8 row quantization (Triton), concatenated FP8 GEMMs
``v4``          ``DSAttentionBlock`` (SWA / CSA / HCA) and its pool ``DSPool``
``mla``         ``MLABlock`` (V3: absorbed decode on FlashMLA, MHA-form prefill) and ``MLAPool``
``moe``         ``DSMoEBlock``: routed experts with one quantization per token
==============  ===================================================================================

DeepGEMM: its FP8 GEMMs are replaced by ``torch._scaled_mm`` / ``torch._scaled_grouped_mm``
(row-wise scales) and its indexer logits by the project's Triton indexer; ``versions()`` records
what a measurement ran. The import of this package stays light: torch is imported by the modules.
"""

from __future__ import annotations

from typing import Any


def attention_block(shape: Any, kind: str, device: Any, fp8: bool, seed: int = 0, **kw: Any) -> Any:
    if kind == "mla":
        from .mla import MLABlock

        return MLABlock(shape, kind, device, fp8, seed, **kw)
    from .v4 import DSAttentionBlock

    return DSAttentionBlock(shape, kind, device, fp8, seed, **kw)  # type: ignore[arg-type]


def moe_block(shape: Any, device: Any, fp8: bool, seed: int = 0, **kw: Any) -> Any:
    from .moe import DSMoEBlock

    return DSMoEBlock(shape, device, "fp8" if fp8 else "bf16", seed=seed, **kw)


def unavailable(device: Any) -> str | None:
    """Why FlashMLA cannot run on ``device``; None on the CPU, where it is emulated (tests)."""
    import torch

    from . import flashmla

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    if flashmla.kernels_available(dev):
        return None
    err = flashmla.import_error()
    if err:
        return f"flash_mla does not import ({err}); build it with vendor/build-on-gpu.sh"
    name = torch.cuda.get_device_name(dev)
    return f"this FlashMLA build runs on SM90 (H100/H200/H800); the device is {name}"


def versions() -> dict[str, str]:
    """What a measurement with this backend ran (recorded in the profile)."""
    import importlib.metadata

    import torch

    from . import flashmla, fp8

    try:
        fm = importlib.metadata.version("flash_mla")
    except importlib.metadata.PackageNotFoundError:
        fm = "not installed"
    ran = sorted(flashmla.used | fp8.used)
    grouped = "; ".join(
        f"{g}x{n}x{k} <={rows} rows: batched {b * 1e6:.0f} / per group {p * 1e6:.0f} us"
        " (summed at both ends of the bucket)"
        for (g, n, k, rows), (b, p) in sorted(fp8.GROUPED_TIMINGS.items())
    )
    from .moe import ROUTED_TIMINGS

    routed = "; ".join(
        f"E{e} N{n} K{k} <={rows} rows: torch {a * 1e6:.0f} / Triton {b * 1e6:.0f} us"
        for (n, k, e, rows), (a, b) in sorted(ROUTED_TIMINGS.items())
    )
    return {
        "flash_mla": fm,
        "attention": ", ".join(x for x in ran if "sparse" in x or "dense" in x) or "none yet",
        "gemm": "torch._scaled_mm / torch._scaled_grouped_mm, row-wise FP8 (DeepGEMM not used)"
        + (
            "; routed experts also on the project's Triton grouped GEMM where it timed faster"
            if "triton_grouped_gemm" in ran
            else ""
        ),
        "routed_gemm": routed or "no routed-expert GEMM timed",
        "grouped_projection": grouped or "none ran (the model has no grouped projection)",
        "quantization": ", ".join(x for x in ran if "quantize" in x) or "none yet",
        "indexer": "project Triton lightning indexer, bf16 keys",
        "torch": torch.__version__,
    }
