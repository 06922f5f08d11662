"""All-to-all timing for EP dispatch/combine sizes, in several processes (one GPU each).

Run either way (NVLink multicast is forced off in every process, see ``ep.no_multicast_env``)::

    python -m deepinfer_sim.kernels.ep_bench --out DIR            # spawns WORLD_SIZE (default:
                                                                  # GPU count, at least 2) ranks
    torchrun --nproc-per-node 2 -m deepinfer_sim.kernels.ep_bench --out DIR

For each tokens-per-rank T it times the dispatch payload (T × top_k rows of ``hidden`` FP8 bytes
+ a 4-byte scale) and the combine payload (the same rows in bf16), spread evenly over the ranks,
plus a round trip through ``dispatch``/``combine`` with real tensors. Rank 0 writes
``ep_bench.json`` and prints a table. On a machine without GPUs it falls back to gloo on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ._util import spawn_ranks
from .ep import combine, dispatch, no_multicast_env, time_all_to_all

no_multicast_env()  # before anything can create a communicator


def _bench(rank: int, world: int, args: argparse.Namespace) -> dict[str, Any]:
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    dev = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    rows: list[dict[str, Any]] = []
    for t in args.tokens:
        n = t * args.top_k
        for name, row_bytes in (
            ("dispatch_fp8", args.hidden + 4),
            ("combine_bf16", 2 * args.hidden),
        ):
            total = n * row_bytes
            per = [total // world] * world
            r = time_all_to_all(per, iters=args.iters)
            rows.append({"tokens_per_rank": t, "payload": name, "world": world, **r})
        # a real round trip at this size (sort, count exchange, pack, unpack)
        x = torch.randn(
            n, args.hidden, device=dev, dtype=torch.bfloat16 if use_cuda else torch.float32
        )
        dest = torch.randint(0, world, (n,), device=dev)
        dispatch(x, dest, fp8=True)  # warm-up
        dist.barrier()
        t0 = time.perf_counter()
        h = dispatch(x, dest, fp8=True)
        back = combine(h.tokens, h)
        if use_cuda:
            torch.cuda.synchronize(dev)
        rows.append(
            {
                "tokens_per_rank": t,
                "payload": "roundtrip_fp8_bf16",
                "world": world,
                "median_s": time.perf_counter() - t0,
                "rel_err": float((back.float() - x.float()).norm() / x.float().norm()),
            }
        )
    return {
        "backend": dist.get_backend(),
        "device": torch.cuda.get_device_name(dev) if use_cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
        "rows": rows,
    }


def _worker(rank: int, world: int, init: str, args: argparse.Namespace) -> None:
    no_multicast_env()
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    if use_cuda:
        torch.cuda.set_device(rank)
    if init:
        dist.init_process_group(
            "nccl" if use_cuda else "gloo", init_method=init, rank=rank, world_size=world
        )
    else:  # torchrun: env:// rendezvous
        dist.init_process_group("nccl" if use_cuda else "gloo")
    try:
        result = _bench(rank, world, args)
        if rank == 0:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "ep_bench.json").write_text(json.dumps(result, indent=2))
            print(f"backend={result['backend']} device={result['device']} world={world}")
            print(f"{'tokens/rank':>11} {'payload':>20} {'ms':>9} {'GB/s sent':>10}")
            for r in result["rows"]:
                gbps = r.get("send_GBps", float("nan"))
                print(
                    f"{r['tokens_per_rank']:>11} {r['payload']:>20} "
                    f"{r['median_s'] * 1e3:>9.3f} {gbps:>10.1f}"
                )
    finally:
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="out/ep_bench")
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 2048, 8192])
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--top-k", type=int, default=6)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun
        _worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "", args)
        return 0
    world = int(os.environ.get("WORLD_SIZE", 0)) or max(2, torch.cuda.device_count())
    spawn_ranks(_worker, world, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
