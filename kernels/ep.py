"""Expert-parallel dispatch and combine over ``torch.distributed.all_to_all_single``.

``dispatch(x, dest)`` sends each row of ``x`` to rank ``dest[row]``: rows are sorted by
destination, the per-destination counts exchanged first (one small all-to-all, then read on the
host: the payload's split sizes need them), then the payload — FP8 (e4m3 values + one float32
scale per row, packed into the same byte rows) or the raw dtype. ``combine(y, handle)`` sends the
processed rows back along the reversed splits and restores the original order. Payloads travel as
bytes (``uint8`` rows), so the same code runs on NCCL and on gloo (the CPU tests).

A token routed to experts on several ranks is sent once per rank: the caller repeats its row
(DeepEP-style deduplication per rank is the caller's choice of ``dest``).

``time_all_to_all(bytes_per_rank, iters)`` times one rank's all-to-all of the given byte counts
(CUDA events on NCCL, wall clock after a barrier on gloo); ``ep_bench.py`` runs it in two
processes.

NVLink multicast stays off: ``no_multicast_env()`` sets ``NCCL_NVLS_ENABLE=0`` (and PyTorch's and
NVSHMEM's switches) in this process's environment, and every spawner here calls it before a
process group exists. Never remove that: multicast on the shared hosts can take the GPUs out of
service.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ._util import time_once
from .linear import dequantize_rowwise, quantize_rowwise

NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def no_multicast_env() -> None:
    """Force NVLink multicast off for this process and everything it spawns."""
    os.environ.update(NO_MULTICAST)


@dataclass(slots=True)
class Dispatched:
    """What ``dispatch`` received, and what ``combine`` needs to send results back."""

    tokens: torch.Tensor  # [R, D] received rows, grouped by source rank
    order: torch.Tensor  # permutation that sorted the local rows by destination
    send_counts: list[int]
    recv_counts: list[int]
    dtype: torch.dtype
    bytes_sent: int


def _exchange_counts(counts: torch.Tensor, group: Any) -> list[int]:
    recv = torch.empty_like(counts)
    dist.all_to_all_single(recv, counts, group=group)
    return [int(c) for c in recv.tolist()]


def dispatch(
    x: torch.Tensor, dest: torch.Tensor, *, group: Any = None, fp8: bool = False
) -> Dispatched:
    """Send row i of ``x [T, D]`` to rank ``dest[i]``; returns the rows this rank received."""
    world = dist.get_world_size(group)
    t, d = x.shape
    order = torch.argsort(dest, stable=True)
    counts = torch.zeros(world, dtype=torch.int64, device=x.device)
    counts.scatter_add_(0, dest.to(torch.int64), torch.ones_like(dest, dtype=torch.int64))
    recv_counts = _exchange_counts(counts, group)
    send_counts = [int(c) for c in counts.tolist()]
    xs = x.index_select(0, order)
    if fp8:
        q, s = quantize_rowwise(xs)
        payload = torch.cat([q.view(torch.uint8), s.view(torch.uint8).view(t, 4)], dim=1)
    else:
        payload = xs.contiguous().view(torch.uint8)
    row = payload.shape[1]
    recv = torch.empty((sum(recv_counts), row), dtype=torch.uint8, device=x.device)
    dist.all_to_all_single(
        recv, payload, output_split_sizes=recv_counts, input_split_sizes=send_counts, group=group
    )
    if fp8:
        rq = recv[:, :d].contiguous().view(torch.float8_e4m3fn)
        rs = recv[:, d:].contiguous().view(torch.float32).view(-1)
        tokens = dequantize_rowwise(rq, rs, x.dtype)
    else:
        tokens = recv.view(x.dtype).view(-1, d)
    return Dispatched(tokens, order, send_counts, recv_counts, x.dtype, payload.numel())


def combine(y: torch.Tensor, handle: Dispatched, *, group: Any = None) -> torch.Tensor:
    """Send the processed rows ``y [R, D]`` back; returns ``[T, D]`` in the original row order."""
    d = y.shape[1]
    payload = y.to(handle.dtype).contiguous().view(torch.uint8)
    back = torch.empty(
        (sum(handle.send_counts), payload.shape[1]), dtype=torch.uint8, device=y.device
    )
    dist.all_to_all_single(
        back,
        payload,
        output_split_sizes=handle.send_counts,
        input_split_sizes=handle.recv_counts,
        group=group,
    )
    rows = back.view(handle.dtype).view(-1, d)
    out = torch.empty_like(rows)
    out.index_copy_(0, handle.order, rows)
    return out


def time_all_to_all(
    bytes_per_rank: list[int], iters: int = 20, *, group: Any = None, warmup: int = 3
) -> dict[str, float]:
    """Median time of this rank's all-to-all sending ``bytes_per_rank[j]`` bytes to rank j.

    Every rank calls it (with its own list); receive sizes are exchanged first. Returns seconds
    and the bytes this rank sent and received (bandwidth = bytes / seconds).
    """
    world = dist.get_world_size(group)
    if len(bytes_per_rank) != world:
        raise ValueError("need one byte count per rank")
    backend = dist.get_backend(group)
    dev = (
        torch.device("cuda", torch.cuda.current_device())
        if backend == "nccl"
        else torch.device("cpu")
    )
    send = torch.tensor(bytes_per_rank, dtype=torch.int64, device=dev)
    recv_counts = _exchange_counts(send, group)
    src = torch.randint(0, 255, (sum(bytes_per_rank),), dtype=torch.uint8, device=dev)
    dst = torch.empty((sum(recv_counts),), dtype=torch.uint8, device=dev)

    def once() -> None:
        dist.all_to_all_single(
            dst,
            src,
            output_split_sizes=recv_counts,
            input_split_sizes=list(bytes_per_rank),
            group=group,
        )

    for _ in range(warmup):
        once()
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        times.append(time_once(once, dev))
    med = float(np.median(times))
    return {
        "median_s": med,
        "min_s": float(np.min(times)),
        "sent_bytes": float(sum(bytes_per_rank)),
        "recv_bytes": float(sum(recv_counts)),
        "send_GBps": float(sum(bytes_per_rank)) / med / 1e9 if med > 0 else 0.0,
    }


def selftest_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """One rank of the gloo test (``tests/unit/test_kernels.py``): dispatch + combine round trip.

    Writes ``rank{r}.pt`` with what it sent and received, which the test checks.
    """
    no_multicast_env()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(100 + rank)
        t, d = 11 + 3 * rank, 16
        x = torch.randn(t, d, generator=g, dtype=torch.float32)
        dest = torch.randint(0, world, (t,), generator=g)
        res = {}
        for fp8 in (False, True):
            h = dispatch(x, dest, fp8=fp8)
            back = combine(h.tokens * 2.0, h)  # "expert": doubles its input
            res[f"fp8={fp8}"] = {
                "recv": h.tokens.clone(),
                "back": back.clone(),
                "recv_counts": h.recv_counts,
            }
        timing = time_all_to_all([64 * (j + 1) for j in range(world)], iters=3)
        torch.save(
            {"x": x, "dest": dest, "res": res, "timing": timing},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()
