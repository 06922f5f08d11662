"""TorchBench: the calibration ``Bench`` implemented with the real kernels of ``kernels/``.

Times one V4.1-Flash-width layer's attention block (plus shared expert), the routed experts of
one rank, the device's copy bandwidth, the vision encoder and — when a second GPU is visible —
an NCCL all-to-all between two processes. Timing follows the device method: warm up first,
CUDA events around the region, the median of several repeats, fresh random inputs (never zeros).
Cache state for a prefix of p tokens is made with ``KVPool.fill_random`` (no compute), and each
timed call is rolled back with ``KVPool.truncate`` so repeats see the same shape.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .profile import Dtypes

DETECT = {"H200": "h200", "H100": "h100", "H800": "h800", "B200": "b200", "GB200": "gb200"}


def detect_hardware(device_name: str) -> str:
    for key, name in DETECT.items():
        if key in device_name.upper():
            return name
    raise ValueError(f"cannot tell the hardware of {device_name!r}; pass --hardware")


class TorchBench:
    def __init__(
        self,
        device: str = "cuda",
        model: str = "deepseek-v4.1-flash",
        hardware: str | None = None,
        fp8: bool = True,
        repeats: int = 5,
        max_prefix: int = 262_144,
        max_chunk: int = 32_768,
        max_batch: int = 256,
        max_context: int = 65_536,
    ) -> None:
        import torch

        from ..kernels.shapes import LayerShape
        from ..models.registry import load_model

        self.torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.device_name = torch.cuda.get_device_name(self.device) if self.cuda else "cpu"
        self.hardware = hardware or detect_hardware(self.device_name)
        self.software = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
        self.spec = load_model(model)
        self.fp8 = fp8 and self.cuda and torch.cuda.get_device_capability(self.device) >= (8, 9)
        self.dtypes = Dtypes(
            dense="fp8" if self.fp8 else "bf16",
            experts="fp8" if self.fp8 else "bf16",
            attention="bf16",
        )
        self.repeats = repeats
        self.shape = LayerShape.from_model(self.spec, local_experts=8)
        self.limits = (max_prefix, max_chunk, max_batch, max_context)
        self._blocks: dict[str, object] = {}
        self._prefill_pools: dict[str, object] = {}
        self._decode_pools: dict[str, object] = {}
        self._moe: dict[int, object] = {}
        self._gen = torch.Generator(device=self.device).manual_seed(0)
        self.use_graphs = True
        self.graph_failures = 0
        self.decode_host_overhead: list[float] = []  # eager − graphed, per decode layer call

    # ---- timing --------------------------------------------------------------------------------
    def _time(self, fn: Callable[[], object], reset: Callable[[], None] | None = None) -> float:
        torch = self.torch
        times = []
        for i in range(self.repeats + 1):  # the first run warms up (kernels, autotuning, caches)
            if reset is not None:
                reset()
            if self.cuda:
                torch.cuda.synchronize(self.device)
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                t = a.elapsed_time(b) / 1e3
            else:
                t0 = time.perf_counter()
                fn()
                t = time.perf_counter() - t0
            if i:
                times.append(t)
        return float(np.median(times))

    def _x(self, *shape: int):  # type: ignore[no-untyped-def]
        return self.torch.randn(
            shape, generator=self._gen, device=self.device, dtype=self.torch.float32
        ).to(self.torch.bfloat16 if self.cuda else self.torch.float32)

    def _block(self, kind: str):  # type: ignore[no-untyped-def]
        from ..kernels.attention import AttentionBlock

        if kind not in self._blocks:
            self._blocks[kind] = AttentionBlock(self.shape, kind, self.device, self.fp8, seed=1)
        return self._blocks[kind]

    # ---- Bench ---------------------------------------------------------------------------------
    def prefill(self, kind: str, n: int, p: int) -> float:
        block = self._block(kind)
        if kind not in self._prefill_pools:
            max_prefix, max_chunk, _, _ = self.limits
            self._prefill_pools[kind] = block.new_pool(1, max_prefix + max_chunk + 8)  # type: ignore[attr-defined]
        pool = self._prefill_pools[kind]
        seq = 0
        if not pool.in_use[seq]:  # type: ignore[attr-defined]
            pool.alloc(seq)  # type: ignore[attr-defined]
        x = self._x(n, self.shape.hidden)

        def reset() -> None:
            pool.fill_random(seq, p) if pool.length(seq) < p else pool.truncate(seq, p)  # type: ignore[attr-defined]

        return self._time(lambda: block.prefill(x, pool, seq), reset)  # type: ignore[attr-defined]

    def decode(self, kind: str, batch: int, context: int, verify: int) -> float:
        from ..kernels.attention import DecodePlan

        block = self._block(kind)
        if kind not in self._decode_pools:
            _, _, max_batch, max_context = self.limits
            self._decode_pools[kind] = block.new_pool(max_batch, max_context + 8)  # type: ignore[attr-defined]
        pool = self._decode_pools[kind]
        for s in range(batch):
            if not pool.in_use[s]:  # type: ignore[attr-defined]
                pool.alloc(s)  # type: ignore[attr-defined]
        seqs = np.arange(batch)
        x = self._x(batch, verify, self.shape.hidden)

        def reset() -> None:
            for s in range(batch):
                if pool.length(s) < context:  # type: ignore[attr-defined]
                    pool.fill_random(s, context)  # type: ignore[attr-defined]
                else:
                    pool.truncate(s, context)  # type: ignore[attr-defined]

        holder: dict[str, object] = {}

        def reset_and_plan() -> None:
            reset()
            holder["plan"] = DecodePlan.from_pool(pool, seqs, verify)  # host work, not timed

        eager = self._time(lambda: block.decode(x, pool, holder["plan"]), reset_and_plan)  # type: ignore[attr-defined]
        graphed = self._time_graph(lambda: block.decode(x, pool, holder["plan"]), reset_and_plan)  # type: ignore[attr-defined]
        if graphed is None:
            return eager
        self.decode_host_overhead.append(max(0.0, eager - graphed))
        return graphed

    def _time_graph(self, fn: Callable[[], object], reset: Callable[[], None]) -> float | None:
        """Median time of ``fn`` replayed as a CUDA graph (the GPU's own time, no launch gaps),
        or None where it cannot be captured (CPU, or an op that syncs with the host)."""
        torch = self.torch
        if not self.cuda or not self.use_graphs:
            return None
        try:
            reset()
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream(self.device).wait_stream(side)
            reset()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
        except Exception as exc:  # capture is best effort: fall back to eager timing
            self.graph_failures += 1
            if self.graph_failures <= 3:
                print(f"  cuda graph capture failed ({type(exc).__name__}: {str(exc)[:100]})")
            torch.cuda.synchronize(self.device)
            return None
        t = self._time(graph.replay, lambda: None)
        del graph
        return t

    def moe(self, local_experts: int, tokens: int) -> float:
        from ..kernels.moe import MoEBlock

        if local_experts not in self._moe:
            self._moe.clear()  # one expert set in memory at a time
            shape = self.shape.scaled(
                local_experts=local_experts, top_k=min(self.spec.moe.top_k, local_experts)
            )
            mode = "fp8" if self.fp8 else "bf16"
            self._moe[local_experts] = MoEBlock(shape, self.device, mode, seed=2)
        moe = self._moe[local_experts]
        x = self._x(tokens, self.shape.hidden)
        ids, w = moe.uniform_routing(tokens, seed=tokens)  # type: ignore[attr-defined]
        return self._time(lambda: moe.forward_routed(x, ids, w))  # type: ignore[attr-defined]

    def copy_bandwidth(self) -> float:
        torch = self.torch
        n = (1 << 30) if self.cuda else (1 << 24)
        src = torch.empty(n, dtype=torch.float32, device=self.device).uniform_()
        dst = torch.empty_like(src)
        t = self._time(lambda: dst.copy_(src))
        return 2 * 4 * n / t  # bytes read + bytes written

    def vision(self) -> float | None:
        from ..kernels.vision import VisionEncoder

        enc = VisionEncoder(self.device, seed=3)
        images = 8
        return self._time(lambda: enc.encode(images)) / images

    def a2a_table(self) -> list[tuple[float, float]]:
        """(bytes each of two GPUs sends the other, seconds) over NCCL; [] with one GPU."""
        if not self.cuda or self.torch.cuda.device_count() < 2:
            return []
        return run_a2a_bench()


def run_a2a_bench(
    tokens: tuple[int, ...] = (16, 64, 256, 1024, 4096, 16384),
) -> list[tuple[float, float]]:
    """Run ``kernels/ep_bench.py`` on two GPUs (child processes, NVLink multicast off) and return
    (bytes crossing to the peer, median seconds) for its dispatch and combine payloads."""
    env = dict(
        os.environ,
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
        WORLD_SIZE="2",
    )
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "deepinfer_sim.kernels.ep_bench", "--out", tmp, "--tokens"]
        cmd += [str(t) for t in tokens]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        print(proc.stdout[-3000:], file=sys.stderr)
        path = Path(tmp) / "ep_bench.json"
        if proc.returncode != 0 or not path.exists():
            print(proc.stderr[-3000:], file=sys.stderr)
            return []
        data = json.loads(path.read_text())
    out = []
    for row in data["rows"]:
        if row["payload"] in ("dispatch_fp8", "combine_bf16"):
            world = row["world"]
            out.append((row["sent_bytes"] * (world - 1) / world, row["median_s"]))
    return out
