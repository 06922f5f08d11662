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
from typing import TYPE_CHECKING, Literal, cast

import numpy as np

from .profile import Dtypes

if TYPE_CHECKING:
    from ..kernels.attention import AttentionBlock, DecodePlan
    from ..kernels.cache import KVPool
    from ..kernels.moe import MoEBlock
    from ..kernels.shapes import Kind

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
        repeats: int = 7,
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
        self._blocks: dict[str, AttentionBlock] = {}
        self._prefill_pools: dict[str, KVPool] = {}
        self._decode_pools: dict[str, KVPool] = {}
        self._moe: dict[int, MoEBlock] = {}
        self._gen = torch.Generator(device=self.device).manual_seed(0)
        self.use_graphs = True
        self.graph_failures = 0
        self.host_overhead: dict[str, list[float]] = {"prefill": [], "decode": [], "moe": []}

    # ---- timing --------------------------------------------------------------------------------
    def _time(self, fn: Callable[[], object], reset: Callable[[], None] | None = None) -> float:
        """Median of ``repeats`` timed calls after one warm-up (kernels, autotuning, caches)."""
        from ..kernels._util import median_time

        return median_time(fn, self.device, warmup=1, repeat=self.repeats, reset=reset)

    def _x(self, *shape: int):
        return self.torch.randn(
            shape, generator=self._gen, device=self.device, dtype=self.torch.float32
        ).to(self.torch.bfloat16 if self.cuda else self.torch.float32)

    def _block(self, kind: str) -> AttentionBlock:
        from ..kernels.attention import AttentionBlock

        if kind not in self._blocks:
            self._blocks[kind] = AttentionBlock(
                self.shape, cast(Kind, kind), self.device, self.fp8, seed=1
            )
        return self._blocks[kind]

    # ---- Bench ---------------------------------------------------------------------------------
    def prefill(self, kind: str, n: int, p: int) -> float:
        block = self._block(kind)
        if kind not in self._prefill_pools:
            max_prefix, max_chunk, _, _ = self.limits
            self._prefill_pools[kind] = block.new_pool(1, max_prefix + max_chunk + 8)
        pool = self._prefill_pools[kind]
        seq = 0
        if not pool.in_use[seq]:
            pool.alloc(seq)
        x = self._x(n, self.shape.hidden)

        def reset() -> None:
            pool.fill_random(seq, p) if pool.length(seq) < p else pool.truncate(seq, p)

        return self._measure("prefill", lambda: block.prefill(x, pool, seq), reset)

    def decode(self, kind: str, batch: int, context: int, verify: int) -> float:
        from ..kernels.attention import DecodePlan

        block = self._block(kind)
        if kind not in self._decode_pools:
            _, _, max_batch, max_context = self.limits
            self._decode_pools[kind] = block.new_pool(max_batch, max_context + 8)
        pool = self._decode_pools[kind]
        for s in range(batch):
            if not pool.in_use[s]:
                pool.alloc(s)
        seqs = np.arange(batch)
        x = self._x(batch, verify, self.shape.hidden)

        def reset() -> None:
            for s in range(batch):
                if pool.length(s) < context:
                    pool.fill_random(s, context)
                else:
                    pool.truncate(s, context)

        holder: dict[str, DecodePlan] = {}

        def reset_and_plan() -> None:
            reset()
            holder["plan"] = DecodePlan.from_pool(pool, seqs, verify)  # host work, not timed

        return self._measure(
            "decode",
            lambda: block.decode(x, pool, holder["plan"]),
            reset_and_plan,
        )

    def _measure(
        self, component: str, fn: Callable[[], object], reset: Callable[[], None] | None = None
    ) -> float:
        """The graphed GPU time of ``fn`` where it can be captured (else eager), recording what
        eager launching adds for this component."""
        eager = self._time(fn, reset)
        graphed = self._time_graph(fn, reset or (lambda: None))
        if graphed is None:
            return eager
        self.host_overhead[component].append(max(0.0, eager - graphed))
        return graphed

    def warmup(self) -> None:
        """~2 s of large GEMMs so the clocks are up before the first timed shape."""
        if not self.cuda:
            return
        torch = self.torch
        a = torch.randn((8192, 8192), device=self.device, dtype=torch.bfloat16)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2.0:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize(self.device)

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
            mode: Literal["bf16", "fp8"] = "fp8" if self.fp8 else "bf16"
            self._moe[local_experts] = MoEBlock(shape, self.device, mode, seed=2)
        moe = self._moe[local_experts]
        x = self._x(tokens, self.shape.hidden)
        ids, w = moe.uniform_routing(tokens, seed=tokens)
        return self._measure("moe", lambda: moe.forward_routed(x, ids, w))

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

    def engine_steps(self) -> list[tuple[str, int, int, int, float]]:
        """Wall time of whole engine-core steps (3-layer V4.1 stack, 48 experts) at synthetic
        shapes, as the engine's replay loop sees them (host work included, device synced)."""
        from ..kernels.engine import EngineCore
        from ..models.registry import load_model
        from .sweep import ENGINE_MODEL

        torch = self.torch
        spec = load_model(ENGINE_MODEL)
        layers = [
            (cast(Kind, g.attention), g.in_prefill)
            for g in spec.layer_groups
            for _ in range(g.count)
        ]
        eng = EngineCore(
            spec,
            layers,
            local_experts=spec.moe.routed_experts,
            device=self.device,
            fp8=self.fp8,
            max_seqs=72,
            max_tokens=16_400,
            prefill_token_budget=16_384,
            max_decode_batch=64,
            mode="mixed",
            decoder_replay_tokens=0,
            decode_buckets="single",
            seed=5,
        )
        eng.warmup()

        def wall(fn: Callable[[], object], reset: Callable[[], None]) -> float:
            times = []
            for i in range(self.repeats + 1):
                reset()
                if self.cuda:
                    torch.cuda.synchronize(self.device)
                t0 = time.perf_counter()
                fn()
                if self.cuda:
                    torch.cuda.synchronize(self.device)
                if i:
                    times.append(time.perf_counter() - t0)
            return float(np.median(times))

        rows: list[tuple[str, int, int, int, float]] = []
        for b in (1, 4, 16, 32, 64):
            for ctx in (1024, 4096, 8192):
                slots = [eng.alloc_slot() for _ in range(b)]

                def reset_dec(slots: list[int] = slots, ctx: int = ctx) -> None:
                    for s in slots:
                        eng.fill(s, ctx)

                def run_dec(slots: list[int] = slots) -> None:
                    eng.execute([], slots, 1)

                t = wall(run_dec, reset_dec)
                rows.append(("decode", b, 1, ctx, t))
                for s in slots:
                    eng.free_slot(s)
        for n in (512, 2048, 8192, 16384):
            for b in (1, 2, 4):
                if n * b > 16_384:
                    continue
                slots = [eng.alloc_slot() for _ in range(b)]

                def reset_pre(slots: list[int] = slots) -> None:
                    for s in slots:
                        eng.fill(s, 0)

                segs = [(s, n, True) for s in slots]

                def run_pre(segs: list[tuple[int, int, bool]] = segs) -> None:
                    eng.execute(segs, [], 1)

                t = wall(run_pre, reset_pre)
                rows.append(("prefill", b, n, 0, t))
                for s in slots:
                    eng.free_slot(s)
        return rows

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
