"""Kernel backends: which implementation of one layer the calibration and the engine core run.

A backend builds the two pieces of a layer that ``calibration/torch_bench.py`` times and
``kernels/engine.py`` stacks:

* ``attention_block(shape, kind, ...)``: attention + shared expert of one layer of ``kind``, with
  ``new_pool(max_seqs, max_tokens)`` (its cache), ``prefill(x, pool, seq)``,
  ``plan_decode(pool, seqs, v)`` (host work, untimed) and ``decode(x, pool, plan)``, and
  ``forward(x, pool, prefill=..., decode=plan, return_ffn_input=...)`` for mixed batches;
* ``moe_block(shape, ...)``: the routed experts of one rank (``forward_routed``,
  ``uniform_routing``, ``route``).

Two backends:

=============  =================================================================================
``reference``  plain PyTorch + one Triton kernel (``attention.py``, ``moe.py``): runs anywhere,
               the CPU included; the fallback, and what CPU tests calibrate with
``deepseek``   DeepSeek's open kernels where they run (FlashMLA sparse/dense MLA, DeepGEMM when
               it works) and fused FP8 projections (``deepseek/``): production's step costs
=============  =================================================================================

``get_backend(name)`` returns one; ``backend.unavailable(device)`` says why it cannot run there
(None when it can). ``backend.kinds`` lists the layer kinds it has kernels for, so calibrating a
model with a kind the backend lacks is a clear error, not a crash mid-sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .shapes import Kind, LayerShape

BACKEND_NAMES = ("reference", "deepseek")


@dataclass(frozen=True)
class KernelBackend:
    name: str
    kinds: tuple[Kind, ...]
    make_attention: Callable[..., Any]
    make_moe: Callable[..., Any]
    probe: Callable[[Any], str | None] = field(default=lambda device: None)
    describe: Callable[[], dict[str, str]] = field(default=dict)

    def attention_block(
        self, shape: LayerShape, kind: Kind, device: Any, fp8: bool, seed: int = 0, **kw: Any
    ) -> Any:
        if kind not in self.kinds:
            raise ValueError(f"the {self.name} kernel backend has no {kind!r} attention layer")
        return self.make_attention(shape, kind, device, fp8, seed, **kw)

    def moe_block(self, shape: LayerShape, device: Any, fp8: bool, seed: int = 0, **kw: Any) -> Any:
        return self.make_moe(shape, device, fp8, seed, **kw)

    def unavailable(self, device: Any) -> str | None:
        """Why this backend cannot run on ``device`` (None: it can)."""
        return self.probe(device)

    def versions(self) -> dict[str, str]:
        """Which kernels and libraries a measurement with this backend used (for profiles)."""
        return dict(self.describe())


def _reference() -> KernelBackend:
    def attention(shape: LayerShape, kind: Kind, device: Any, fp8: bool, seed: int, **kw: Any):
        from .attention import AttentionBlock

        return AttentionBlock(shape, kind, device, fp8, seed=seed, **kw)

    def moe(shape: LayerShape, device: Any, fp8: bool, seed: int, **kw: Any):
        from .moe import MoEBlock

        return MoEBlock(shape, device, "fp8" if fp8 else "bf16", seed=seed, **kw)

    def describe() -> dict[str, str]:
        return {"attention": "torch reference (+ Triton indexer)", "gemm": "torch._scaled_mm"}

    return KernelBackend("reference", ("swa", "csa", "hca"), attention, moe, describe=describe)


def _deepseek() -> KernelBackend:
    from . import deepseek

    return KernelBackend(
        "deepseek",
        ("swa", "csa", "hca", "mla"),
        deepseek.attention_block,
        deepseek.moe_block,
        probe=deepseek.unavailable,
        describe=deepseek.versions,
    )


def get_backend(name: str) -> KernelBackend:
    if name == "reference":
        return _reference()
    if name == "deepseek":
        return _deepseek()
    raise ValueError(f"unknown kernel backend {name!r} (choose from {', '.join(BACKEND_NAMES)})")
