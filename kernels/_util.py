"""Small device helpers shared by the kernels (private).

* ``default_dtype(device)``: the compute dtype a kernel uses when none is given — bf16 on CUDA,
  float32 on the CPU (where bf16 matmuls are slow and the tests want tight references).
* ``empty(...)``: every kernel allocates its outputs through this. With ``POISON`` set (the
  tests set it), the buffer starts as NaN, so an element the kernel forgot to write fails the
  comparison with the reference instead of passing on whatever memory held (METHOD.md).
* ``to_device(array)``: host index arrays go to the device through pinned memory with
  ``non_blocking=True``: a plain ``torch.as_tensor(..., device="cuda")`` synchronizes the stream
  and would stall the host once per layer.
* ``fp8_supported(device)``: ``torch._scaled_mm`` needs compute capability >= 8.9.
* ``gemm_rates(device)``: the measured FP8 and bf16 GEMM rates (the compute ceilings).
* ``decided_once(cache, key, decide)``: a kernel choice made once per key (a timing or a
  correctness check) and never inside a CUDA graph capture, which it would break.
* ``time_cases(cases, time_one, out)``: a benchmark's shapes timed one by one, each printed as
  it comes, a failing shape recorded with its error, all written as one JSON file.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

K = TypeVar("K")
V = TypeVar("V")

POISON = False  # tests switch this on: outputs start as NaN instead of uninitialized memory

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def as_device(device: str | torch.device | None) -> torch.device:
    """A concrete device (CUDA with its index: ``set_device`` and generators want one)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def empty(shape: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if POISON and (dtype.is_floating_point and dtype.itemsize >= 2):
        return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def to_device(array: Any, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    t = torch.as_tensor(np.ascontiguousarray(array)).to(dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def fp8_supported(device: torch.device) -> bool:
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    major, minor = torch.cuda.get_device_capability(device)
    return (major, minor) >= (8, 9)


def grouped_mm_supported(device: torch.device) -> bool:
    """``torch._grouped_mm`` has a CUTLASS kernel on sm90+; elsewhere we loop (same function)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (9, 0)
    return True  # the CPU build of torch >= 2.9 carries a reference implementation


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def capture_graph(
    device: torch.device,
    body: Callable[[], object],
    reset: Callable[[], object],
    pool: Any = None,
    before_capture: Callable[[], object] | None = None,
) -> torch.cuda.CUDAGraph:
    """``body`` captured into a CUDA graph after one warm-up run on a side stream (handles,
    autotuning, lazy allocations); ``reset`` restores the host state ``body`` changes, after the
    warm-up and after the capture; ``pool``: a memory pool shared with other graphs."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream(device).wait_stream(side)
    reset()
    if before_capture is not None:
        before_capture()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        body()
    reset()
    return g


class EagerGraph:
    """Where there are no CUDA graphs (a CPU): a 'graph' whose replay runs its body again."""

    def __init__(self, body: Callable[[], object]) -> None:
        self.replay = body


def capture_eagerly(
    device: torch.device,
    body: Callable[[], object],
    reset: Callable[[], object],
    pool: Any = None,
    before_capture: Callable[[], object] | None = None,
) -> EagerGraph:
    """``capture_graph``'s stand-in off the GPU: the warm-up run and the resets, no capture."""
    body()
    reset()
    return EagerGraph(body)


def generator(device: torch.device, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def randn(
    shape: Sequence[int],
    *,
    std: float,
    gen: torch.Generator,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Normal(0, std²) drawn in float32 on the device, then cast (bf16 has no randn of its own)."""
    t = torch.randn(tuple(shape), generator=gen, device=device, dtype=torch.float32)
    return t.mul_(std).to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm computed in float32, returned in the input's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN anywhere gives NaN, which never passes a bound)."""
    o = out.detach().double().cpu()
    r = ref.detach().double().cpu()
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r).clamp_min(1e-300))


def decided_once(cache: dict[K, V], key: K, decide: Callable[[], V]) -> V | None:
    """``cache[key]``, from ``decide()`` the first time it is asked for — or None while a CUDA
    graph is being captured and ``key`` is not decided yet (the caller's fallback then runs)."""
    if key not in cache:
        if torch.cuda.is_current_stream_capturing():
            return None
        cache[key] = decide()
    return cache[key]


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cuda_event_seconds(fn: Callable[[], Any]) -> float:
    """Seconds ``fn``'s work takes on the current CUDA stream: events recorded around it, then
    waited for."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end) / 1e3)


def spawn_ranks(worker: Callable[..., Any], world: int, args: Any) -> None:
    """Run ``worker(rank, world, init_method, args)`` in ``world`` local processes that meet at
    a file in a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/init"
        torch.multiprocessing.spawn(worker, args=(world, init, args), nprocs=world, join=True)


def time_once(fn: Any, device: torch.device) -> float:
    """Seconds one call of ``fn`` takes: CUDA events on CUDA (device synchronized first),
    perf_counter elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return cuda_event_seconds(fn)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_time(
    fn: Any, device: torch.device, *, warmup: int = 2, repeat: int = 5, reset: Any = None
) -> float:
    """Median of ``repeat`` timed calls after ``warmup`` untimed ones; ``reset()`` (untimed)
    runs before every call."""
    times: list[float] = []
    for i in range(warmup + repeat):
        if reset is not None:
            reset()
        t = time_once(fn, device)
        if i >= warmup:
            times.append(t)
    return float(np.median(times))


class Timer:
    """Median device time of a callable: CUDA events on CUDA, perf_counter elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, fn: Any, *, warmup: int = 2, repeat: int = 5) -> float:
        return median_time(fn, self.device, warmup=warmup, repeat=repeat)


def gemm_rates(
    device: torch.device, n: int = 8192, *, warmup: int = 3, repeat: int = 10
) -> tuple[float | None, float]:
    """Measured (FP8 ``torch._scaled_mm`` or None where there is none, bf16) FLOP/s of an n³
    GEMM on random data: the compute ceilings rooflines and checks compare against."""
    dt = default_dtype(device)
    a = torch.randn(n, n, device=device).to(dt)
    b = torch.randn(n, n, device=device).to(dt)
    t16 = median_time(lambda: a @ b, device, warmup=warmup, repeat=repeat)
    if not fp8_supported(device):
        return None, 2 * n**3 / t16
    aq, bq = a.to(FP8), b.to(FP8)
    one = torch.tensor(1.0, device=device)
    t8 = median_time(
        lambda: torch._scaled_mm(aq, bq.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
        device,
        warmup=warmup,
        repeat=repeat,
    )
    return 2 * n**3 / t8, 2 * n**3 / t16


def time_cases(
    cases: Sequence[dict[str, Any]], time_one: Callable[[dict[str, Any]], dict[str, Any]], out: Path
) -> int:
    """``time_one`` on every case (a failing one must not lose the others: it is recorded with
    its error), each result printed as it comes and all written to ``out`` (JSON); 0 when every
    case ran, else 1."""
    results = []
    for case in cases:
        try:
            result = time_one(case)
        except Exception as exc:
            result = {**case, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        results.append(result)
        print(json.dumps(result), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all("error" not in r for r in results) else 1
