"""TorchBench: the calibration ``Bench`` implemented with a kernel backend of ``kernels/``.

For ONE model (``--model``), at its own widths (``LayerShape.from_model``), it times one layer at
a time — each of the model's distinct attention kinds (attention block + shared expert), the
routed experts of one rank — plus the device's copy bandwidth, optionally the vision encoder and
whole engine-core steps of the model's reduced stack, and — when a second GPU is visible — an
NCCL all-to-all between two processes. One layer at a time is what lets the big models
(V4-Pro, V3) be calibrated on one GPU.

The blocks come from ``kernels.backend.get_backend(name)``: ``reference`` (plain PyTorch, runs on
the CPU too) or ``deepseek`` (DeepSeek's kernels). A backend that lacks one of the model's kinds,
or cannot run on the device, is refused with a :class:`UserError` before anything is timed.

Timing follows the device method: warm up first, CUDA events around the region, the median of
several repeats, fresh random inputs (never zeros). Where a call can be captured it is timed as a
CUDA-graph replay (the GPU's own time) and the eager − graphed difference is recorded as host
overhead. Cache state for a prefix of p tokens is made with ``pool.fill_random`` (no compute),
each timed call is rolled back with ``pool.truncate`` so repeats see the same shape, and the
decode plan (``block.plan_decode``) is host work done in the untimed reset.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import numpy as np

from ..errors import UserError
from ..kernels.shapes import Kind, LayerShape
from ..models.profile import Dtypes
from ..models.spec import ModelSpec

if TYPE_CHECKING:
    from ..kernels.backend import KernelBackend

DETECT = {"H200": "h200", "H100": "h100", "H800": "h800", "B200": "b200", "GB200": "gb200"}


# the engine core's prefill steps up to this size are CUDA graphs: every step of the replays
# (whose prefill budget is 16,384 tokens) and of the calibration's timed engine steps
PREFILL_GRAPH_TOKENS = 16384
GRAPH_WORTH_S = 0.02  # calls longer than this are timed eagerly only


def _nothing() -> None:
    """What readies a graph's replay: nothing."""


def detect_hardware(device_name: str) -> str:
    for key, name in DETECT.items():
        if key in device_name.upper():
            return name
    raise UserError(f"cannot tell the hardware of {device_name!r}; pass --hardware")


def model_kinds(spec: ModelSpec) -> tuple[Kind, ...]:
    """The distinct attention kinds of ``spec``'s layers, in layer order."""
    out: list[Kind] = []
    for g in spec.layer_groups:
        kind = as_kind(g.attention)
        if kind not in out:
            out.append(kind)
    return tuple(out)


def stack_layers(stack: ModelSpec) -> list[tuple[Kind, bool]]:
    """The engine core's layer list for ``stack``: (kind, runs in prefill), group by group."""
    return [
        (as_kind(g.attention), g.in_prefill) for g in stack.layer_groups for _ in range(g.count)
    ]


def as_kind(name: str) -> Kind:
    """``name`` as a layer Kind (checked at run time, not a cast)."""
    for k in get_args(Kind):
        if k == name:
            return k
    raise ValueError(f"unknown attention kind {name!r}")


def load_backend(name: str) -> KernelBackend:
    from ..kernels.backend import BACKEND_NAMES, get_backend

    if name not in BACKEND_NAMES:
        raise UserError(f"unknown kernel backend {name!r} (choose from {', '.join(BACKEND_NAMES)})")
    try:
        return get_backend(name)
    except ImportError as exc:
        raise UserError(f"the {name} kernel backend cannot be imported: {exc}") from None


_DTYPE_NAMES = {
    "float8_e4m3fn": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2": "fp8",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
}


def dtype_name(dtype: Any) -> str:
    """A torch dtype (or a dtype name) as a profile dtype (``torch.bfloat16`` -> ``bf16``)."""
    text = str(dtype).removeprefix("torch.")
    return _DTYPE_NAMES.get(text, text)


class TorchBench:
    def __init__(
        self,
        device: str = "cuda",
        model: str | ModelSpec = "deepseek-v4.1-flash",
        hardware: str | None = None,
        backend: str = "reference",
        fp8: bool = True,
        repeats: int = 7,
        max_prefix: int = 262_144,
        max_chunk: int = 32_768,
        max_batch: int = 256,
        max_context: int = 65_536,
        local_experts: int = 8,
        attention: bool = True,
    ) -> None:
        """``attention=False``: only the routed experts will be timed, so the backend's
        attention kernels need not run here (a MoE-only measurement needs no FlashMLA)."""
        import torch

        from ..models.registry import load_hardware, load_model

        self.spec = model if isinstance(model, ModelSpec) else load_model(model)
        self.kinds: tuple[Kind, ...] = model_kinds(self.spec)
        self.backend = load_backend(backend)
        self.kernels = self.backend.name
        missing = [k for k in self.kinds if k not in self.backend.kinds]
        if missing and attention:
            raise UserError(
                f"the {self.kernels} kernel backend has no {', '.join(missing)} attention "
                f"kernels, which model {self.spec.name} needs (it has "
                f"{', '.join(self.backend.kinds)}); choose another --kernels"
            )
        self.torch = torch
        try:
            self.device = torch.device(device)
        except RuntimeError as exc:
            raise UserError(f"bad --device {device!r}: {exc}") from None
        self.cuda = self.device.type == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise UserError(f"--device {device}: no CUDA device is visible")
        reason = self.backend.unavailable(self.device) if attention else None
        if reason:
            raise UserError(f"the {self.kernels} kernel backend cannot run on {device}: {reason}")
        self.device_name = torch.cuda.get_device_name(self.device) if self.cuda else "cpu"
        self.hardware = load_hardware(hardware or detect_hardware(self.device_name)).name
        self.software = {"torch": torch.__version__, "cuda": str(torch.version.cuda or "none")}
        self.fp8 = fp8 and self.cuda and torch.cuda.get_device_capability(self.device) >= (8, 9)
        self.compute = dtype_name(torch.bfloat16 if self.cuda else torch.float32)
        self.repeats = repeats
        self.shape = LayerShape.from_model(
            self.spec, local_experts=min(local_experts, self.spec.moe.routed_experts)
        )
        self.limits = (max_prefix, max_chunk, max_batch, max_context)
        self._blocks: dict[str, Any] = {}
        self._prefill_pools: dict[str, Any] = {}
        self._decode_pools: dict[str, Any] = {}
        self._moe: dict[int, Any] = {}
        self._kv_dtype: str | None = None
        self._expert_dtype: str | None = None
        self._gen = torch.Generator(device=self.device).manual_seed(0)
        self.use_graphs = True
        self.graph_failures = 0
        self.host_overhead: dict[str, list[float]] = {"prefill": [], "decode": [], "moe": []}

    @property
    def engine_graphs(self) -> bool:
        """The engine core replays decode as CUDA graphs (deepseek backend on a GPU)."""
        return self.cuda and self.kernels == "deepseek"

    @property
    def engine_prefill_graph_tokens(self) -> int:
        """The engine core replays prefill-only steps of up to this many tokens as CUDA graphs
        (0: none): an eager step of several prompts is host-bound well past 4,096 tokens (11
        prompts, 9,723 tokens: 278 ms on the H200 at depth 4, 270 ms of it issuing launches)."""
        return PREFILL_GRAPH_TOKENS if self.engine_graphs else 0

    @property
    def kernel_versions(self) -> dict[str, str]:
        """What the backend ran (read after the sweep: it lists the kernels that did run)."""
        return self.backend.versions()

    @property
    def dtypes(self) -> Dtypes:
        """What the timed kernels ran in (the cache and expert dtypes as their blocks report)."""
        dense = "fp8" if self.fp8 else self.compute
        return Dtypes(
            dense=dense,
            experts=self._expert_dtype or dense,
            attention=self.compute,
            kv_cache=self._kv_dtype or self.compute,
        )

    def _note_pool(self, pool: Any) -> None:
        """The main cache's storage dtype: the pool's ``kv_dtype`` if it says, else the
        backend's ``versions()["kv_cache"]``, else the pool's tensor dtype (the reference)."""
        if self._kv_dtype is None:
            kv = (
                getattr(pool, "kv_dtype", None)
                or self.backend.versions().get("kv_cache")
                or getattr(pool, "dtype", None)
            )
            if kv is not None:
                self._kv_dtype = dtype_name(kv)

    # ---- timing --------------------------------------------------------------------------------
    def _time(self, fn: Callable[[], object], reset: Callable[[], None] | None = None) -> float:
        """Median of ``repeats`` timed calls after one warm-up (kernels, autotuning, caches)."""
        from ..kernels._util import median_time

        return median_time(fn, self.device, warmup=1, repeat=self.repeats, reset=reset)

    def _x(self, *shape: int):
        return self.torch.randn(
            shape, generator=self._gen, device=self.device, dtype=self.torch.float32
        ).to(self.torch.bfloat16 if self.cuda else self.torch.float32)

    def _block(self, kind: str) -> Any:
        if kind not in self._blocks:
            self._blocks[kind] = self.backend.attention_block(
                self.shape, as_kind(kind), self.device, self.fp8, seed=1
            )
        return self._blocks[kind]

    # ---- Bench ---------------------------------------------------------------------------------
    def prefill(self, kind: str, n: int, p: int) -> float:
        """One layer's prefill of an ``n``-token chunk after a ``p``-token cached prefix."""
        call, reset = self.prefill_call(kind, n, p)
        return self._measure("prefill", call, reset)

    def prefill_call(
        self, kind: str, n: int, p: int
    ) -> tuple[Callable[[], object], Callable[[], None]]:
        """:meth:`prefill`'s timed call and what readies it before each (the cache cut back to
        the prefix), for a caller that times it itself."""
        if p > self.spec.max_context_tokens:
            raise ValueError(f"prefix {p} beyond {self.spec.name}'s context")
        block = self._block(kind)
        if kind not in self._prefill_pools:
            max_prefix, max_chunk, _, _ = self.limits
            self._prefill_pools[kind] = block.new_pool(1, max_prefix + max_chunk + 8)
            self._note_pool(self._prefill_pools[kind])
        pool = self._prefill_pools[kind]
        seq = 0
        if not pool.in_use[seq]:
            pool.alloc(seq)
        x = self._x(n, self.shape.hidden)

        def reset() -> None:
            pool.fill_random(seq, p) if pool.length(seq) < p else pool.truncate(seq, p)

        return (lambda: block.prefill(x, pool, seq)), reset

    def decode(
        self, kind: str, batch: int, context: int, verify: int, spread: float = 0.0
    ) -> float:
        """One layer's decode of ``batch`` sequences of mean context ``context`` (``spread``: their
        lengths spread evenly over context · (1 ± spread), see ``spread_contexts``)."""
        call, reset_and_plan = self.decode_call(kind, batch, context, verify, spread)
        return self._measure("decode", call, reset_and_plan)

    def decode_call(
        self, kind: str, batch: int, context: int, verify: int, spread: float = 0.0
    ) -> tuple[Callable[[], object], Callable[[], None]]:
        """:meth:`decode`'s timed call and what readies it before each (the caches refilled to
        their lengths, the step planned), for a caller that times or profiles it itself."""
        block = self._block(kind)
        lengths = spread_contexts(batch, context, spread)
        if kind not in self._decode_pools:
            _, _, max_batch, max_context = self.limits
            self._decode_pools[kind] = block.new_pool(max_batch, max_context + 8)
            self._note_pool(self._decode_pools[kind])
        pool = self._decode_pools[kind]
        for s in range(batch):
            if not pool.in_use[s]:
                pool.alloc(s)
        seqs = np.arange(batch)
        x = self._x(batch, verify, self.shape.hidden)

        def reset() -> None:
            for s in range(batch):
                if pool.length(s) < lengths[s]:
                    pool.fill_random(s, int(lengths[s]))
                else:
                    pool.truncate(s, int(lengths[s]))

        holder: dict[str, Any] = {}

        def reset_and_plan() -> None:
            reset()
            plan = block.plan_decode(pool, seqs, verify)  # host work, not timed
            if hasattr(plan, "sched"):  # per-step scheduler state: once per step, not per layer
                plan.sched = holder.setdefault("sched", plan.sched)
            holder["plan"] = plan

        return (lambda: block.decode(x, pool, holder["plan"])), reset_and_plan

    def _measure(
        self,
        component: str | None,
        fn: Callable[[], object],
        reset: Callable[[], None] | None = None,
    ) -> float:
        """The graphed GPU time of ``fn`` where it can be captured (else eager), recording what
        eager launching adds for this component (None: a component no profile keeps it for)."""
        seconds, eager, call, _ = self.timed_call(fn, reset)
        if component is not None and call is not fn:
            self.host_overhead[component].append(max(0.0, eager - seconds))
        return seconds

    def timed_call(
        self, fn: Callable[[], object], reset: Callable[[], None] | None = None
    ) -> tuple[float, float, Callable[[], object], Callable[[], None]]:
        """(the calibration's time of ``fn``, its eager time, the call that time is of, what
        readies that call): the graphed GPU time and the graph's replay (readied by nothing)
        where ``fn`` is short and can be captured, else the eager time and ``fn`` itself."""
        ready = reset or _nothing
        eager = self._time(fn, reset)
        if eager > GRAPH_WORTH_S:  # launch gaps are noise at this size: spare the capture
            return eager, eager, fn, ready
        graph = self._capture(fn, ready)
        if graph is None:
            return eager, eager, fn, ready
        return self._time(graph.replay, _nothing), eager, graph.replay, _nothing

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

    def _capture(self, fn: Callable[[], object], reset: Callable[[], None]) -> Any:
        """``fn`` captured as a CUDA graph, or None where it cannot be (CPU, graphs off, or an
        op that syncs with the host)."""
        torch = self.torch
        if not self.cuda or not self.use_graphs:
            return None
        from ..kernels._util import capture_graph

        try:
            reset()
            return capture_graph(self.device, fn, reset)
        except Exception as exc:  # capture is best effort: fall back to eager timing
            self.graph_failures += 1
            if self.graph_failures <= 3:
                print(f"  cuda graph capture failed ({type(exc).__name__}: {str(exc)[:100]})")
            torch.cuda.synchronize(self.device)
            return None

    def moe_block(self, local_experts: int) -> Any:
        if local_experts not in self._moe:
            self._moe.clear()  # one expert set in memory at a time
            shape = self.shape.scaled(
                local_experts=local_experts, top_k=min(self.spec.moe.top_k, local_experts)
            )
            block = self.backend.moe_block(shape, self.device, self.fp8, seed=2)
            self._moe[local_experts] = block
            mode = getattr(block, "dtype_mode", None) or getattr(block, "weight_dtype", None)
            if self._expert_dtype is None and mode is not None:
                self._expert_dtype = "fp8" if mode == "fp8" else dtype_name(block.dtype)
        return self._moe[local_experts]

    def moe(self, local_experts: int, tokens: int) -> float:
        """One rank's routed experts, ``tokens`` tokens over ``local_experts``: routing sorted,
        rows gathered (quantized), grouped GEMMs, weighted combine."""
        return self._measure("moe", self.moe_call(local_experts, tokens))

    def moe_call(self, local_experts: int, tokens: int) -> Callable[[], object]:
        """:meth:`moe`'s timed call, for a caller that times it itself."""
        moe = self.moe_block(local_experts)
        x = self._x(tokens, self.shape.hidden)
        ids, w = moe.uniform_routing(tokens, seed=tokens)
        return lambda: moe.forward_routed(x, ids, w)

    def moe_experts(self, local_experts: int, tokens: int) -> float:
        """The experts' own work alone (rows already sorted by expert and quantized): what is
        left of :meth:`moe` where an EP exchange's kernels gather and combine."""
        return self._measure(None, self.moe_experts_call(local_experts, tokens))

    def moe_experts_call(self, local_experts: int, tokens: int) -> Callable[[], object]:
        """:meth:`moe_experts`'s timed call, for a caller that times it itself."""
        moe = self.moe_block(local_experts)
        x = self._x(tokens, self.shape.hidden)
        ids, _ = moe.uniform_routing(tokens, seed=tokens)
        rows, offs = moe.prepare_experts(x, ids)
        return lambda: moe.forward_experts(rows, offs)

    def release_kernels(self) -> None:
        """Drop the single-layer blocks, their pools (sized for the grid's longest prefixes and
        contexts) and the expert sets the kernel sweep kept, and return their device memory."""
        self._blocks.clear()
        self._prefill_pools.clear()
        self._decode_pools.clear()
        self._moe.clear()
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()

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

    def engine_steps(
        self,
        decode: Sequence[tuple[int, int]],
        prefill: Sequence[tuple[int, int]],
        spread: float = 0.0,
        depth: int = 1,
        with_loop_gaps: bool = True,
    ) -> list[tuple[str, int, int, int, float]]:
        """Wall time of whole engine-core steps of the model's reduced stack
        (``sweep.engine_stack``: ``depth`` layers per layer group, at most 48 experts) on this
        backend, at ``decode`` (sequences, context; one token each) and ``prefill`` (sequences,
        prompt tokens) shapes, as the engine's replay loop sees them (host work included,
        synced)."""
        from ..kernels.engine import EngineCore
        from .sweep import engine_stack

        torch = self.torch
        self.release_kernels()  # the engine stack's weights and graphs need the memory
        stack = engine_stack(self.spec, depth=depth)
        layers = stack_layers(stack)
        budget = max((b * n for b, n in prefill), default=1)
        eng = EngineCore(
            stack,
            layers,
            local_experts=stack.moe.routed_experts,
            device=self.device,
            fp8=self.fp8,
            max_seqs=max((b for b, _ in (*decode, *prefill)), default=1) + 8,
            max_tokens=int(max((x for _, x in (*decode, *prefill)), default=1) * (1 + spread)) + 16,
            prefill_token_budget=budget,
            max_decode_batch=max((b for b, _ in decode), default=1),
            mode="mixed",
            decoder_replay_tokens=0,
            decode_buckets="single",
            backend=self.kernels,
            graphs=self.engine_graphs,
            prefill_graphs=self.engine_prefill_graph_tokens > 0,
            prefill_graph_tokens=self.engine_prefill_graph_tokens,
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
        for b, ctx in decode:
            slots = [eng.alloc_slot() for _ in range(b)]

            def reset_dec(slots: list[int] = slots, ctx: int = ctx) -> None:
                for s, n in zip(slots, spread_contexts(len(slots), ctx, spread), strict=True):
                    eng.fill(s, int(n))

            def run_dec(slots: list[int] = slots) -> None:
                eng.execute([], slots, 1)

            rows.append(("decode", b, 1, ctx, wall(run_dec, reset_dec)))
            for s in slots:
                eng.free_slot(s)
        for b, n in prefill:
            rows.append(("prefill", b, n, 0, replayed_prefill_step(eng, b, n, self.repeats)))
        return rows + loop_gaps(eng, decode, prefill) if with_loop_gaps else rows

    def a2a_table(self) -> list[tuple[float, float]]:
        """(bytes each of two GPUs sends the other, seconds) over NCCL; [] with one GPU."""
        if not self.cuda or self.torch.cuda.device_count() < 2:
            return []
        return run_a2a_bench()


def spread_contexts(batch: int, mean: int, spread: float) -> np.ndarray:
    """``batch`` context lengths spread evenly over mean · (1 − spread … 1 + spread), summing to
    batch · mean (0: every sequence at ``mean``, as the calibration grid times decode)."""
    if not 0.0 <= spread < 1.0:
        raise ValueError(f"spread must be in [0, 1), got {spread}")
    if batch <= 1 or spread == 0.0:
        return np.full(batch, mean, dtype=np.int64)
    lengths = np.rint(mean * (1.0 + spread * np.linspace(-1.0, 1.0, batch))).astype(np.int64)
    lengths[-1] += batch * mean - int(lengths.sum())
    return np.maximum(lengths, 1)


def replayed_prefill_step(eng: Any, prompts: int, tokens: int, repeats: int) -> float:
    """Median wall time of a prefill step of ``prompts`` prompts of ``tokens`` tokens, timed by
    the replay loop itself: ``repeats + 1`` such steps back to back in a prefill-only replay (the
    token budget set to one step's worth), the first dropped. Timing steps the way the replays
    time them matters for these host-bound steps: a harness that resets slots between repeats
    measured 1×128-token steps at 10.0 ms on the H200 where the replay loop ran them in ~7 ms."""
    budget = eng.prefill_token_budget
    eng.prefill_token_budget = prompts * tokens
    try:
        reqs = [(0.0, tokens, 2)] * (prompts * (repeats + 1))
        res = eng.run(reqs, mode="prefill_only", warmup=False)
    finally:
        eng.prefill_token_budget = budget
    st = res.steps.sort_values("start_s")
    if not (st["prefill_seqs"] == prompts).all():
        raise RuntimeError(f"replayed prefill steps of {prompts} prompts came out uneven")
    return float(np.median((st["end_s"] - st["start_s"]).to_numpy()[1:]))


def loop_gaps(
    eng: Any, decode: Sequence[tuple[int, int]], prefill: Sequence[tuple[int, int]]
) -> list[tuple[str, int, int, int, float]]:
    """The replay loop's host time between steps (admission, acceptance draws, slot upkeep),
    from short synthetic decode-only and prefill-only replays: ``("decode_gap", sequences of the
    step before, 0, 0, s)`` and ``("prefill_gap", prompts, tokens, 0, s)`` rows."""
    rows: list[tuple[str, int, int, int, float]] = []
    runs = []
    if decode:
        b = max(bb for bb, _ in decode)
        ctx = min(c for _, c in decode)
        runs.append(("decode", eng.run([(0.0, ctx, 48)] * b, mode="decode_only")))
    if prefill:
        prompts = [(0.0, n, 2) for _, n in prefill for _ in range(2)]
        runs.append(("prefill", eng.run(prompts, mode="prefill_only")))
    for phase, res in runs:
        st = res.steps.sort_values("start_s")
        gaps = st["start_s"].to_numpy()[1:] - st["end_s"].to_numpy()[:-1]
        seqs = st[f"{phase}_seqs"].to_numpy()[:-1]
        tokens = st[f"{phase}_tokens"].to_numpy()[:-1]
        rows += [
            (f"{phase}_gap", int(s), int(t), 0, float(g))
            for s, t, g in zip(seqs, tokens, gaps, strict=True)
        ]
    return rows


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
