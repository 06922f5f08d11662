"""Replay request samples through the real engine core on a GPU, then through the simulator
with a measured profile, and compare request by request (see ``validate.py``).

    python -m deepinfer_sim.calibration.replay --profile P.yaml --out DIR \\
        [--traces mooncake_conversation,azure_conv] [--requests 200] [--repeats 3] \\
        [--kernels deepseek] [--load 0.5]

For each trace (a shipped ``builtin:`` trace; prompts capped at 8,192 tokens, outputs at 256), the
engine runs a prefill-only replay (TTFT) and a decode-only replay (TPOT) ``repeats`` times each,
after one unrecorded pass (graph captures, autotuning). With the deepseek kernels on a GPU its
decode steps are CUDA-graph replays, so what is measured is the GPU's work plus the engine's own
host time per step, not Python launch overhead; its prefill-only steps are graphs too when the
profile's engine model was timed with graphed prefill (``engine_prefill_graph_tokens``). Arrival
times are scaled so the predicted load is ``load``. The simulator replays the same request
lists once (it is deterministic).

Writes, per trace, ``replay_<trace>_<phase>.csv`` (the request list and the measured seconds of
every repeat: ``measured_s_0`` ...), ``replay_<trace>_<phase>_steps.csv`` (the engine's steps of
the first repeat) and one ``replay_report.json`` with the errors of every repeat and their
median. The CSVs and the report are what ``calibration/validation/`` keeps, so a CPU test can
re-check the simulator's prediction without a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..models.profile import Profile, load_profile
from ..models.profile_cost import ProfileStepCost
from ..rng import stream
from ..traces import read_trace, spread_buckets
from .torch_bench import stack_layers
from .validate import ReplayShape, errors, simulate_decode, simulate_prefill, validation_cost

TRACES = ("mooncake_conversation", "azure_conv")
PHASES = {"prefill": ("prefill_only", simulate_prefill), "decode": ("decode_only", simulate_decode)}


def sample_requests(
    trace: str, n: int, max_prompt: int, max_output: int, seed: int = 0
) -> pd.DataFrame:
    """The first ``n`` requests of a shipped trace, lengths capped, trace arrival times."""
    src = spread_buckets(read_trace(f"builtin:{trace}"), 3.0, "uniform", stream(seed, "replay"))
    src = src.head(n)
    return pd.DataFrame(
        {
            "arrival_s": src.arrival_s - src.arrival_s[0],
            "prompt_len": np.clip(src.input_len, 1, max_prompt),
            "output_len": np.clip(src.output_len, 2, max_output),
        }
    )


def retime(frame: pd.DataFrame, busy_s: float, load: float) -> pd.DataFrame:
    """Scale arrival times so that ``busy_s`` of work arrives at ``load`` utilization."""
    span = float(frame["arrival_s"].iloc[-1]) or 1.0
    out = frame.copy()
    out["arrival_s"] = frame["arrival_s"] * (busy_s / load) / span
    return out


def predicted_busy(
    frame: pd.DataFrame, cost: ProfileStepCost, shape: ReplayShape
) -> tuple[float, float]:
    """Predicted busy seconds to prefill every prompt alone, and to decode at a batch of 16."""
    pre = sum(cost.prefill_step([[(int(n), 0)]]) for n in frame["prompt_len"])
    steps = float((frame["output_len"] - 1).sum()) / 16
    kv = float(frame["prompt_len"].mean() + frame["output_len"].mean() / 2) * 16
    step = cost.decode_step(np.array([16.0]), np.array([kv]), 1.0)
    return pre, steps * step


def build_engine(
    frames: list[pd.DataFrame],
    mode: str,
    shape: ReplayShape,
    device: str,
    kernels: str,
    prefill_graph_tokens: int = 0,
) -> Any:
    """One engine core for every replay of a mode (graphs captured once are reused): decode
    steps as CUDA graphs with the deepseek kernels on a GPU, prefill steps too where the
    profile's engine model was timed that way (steps up to ``prefill_graph_tokens``)."""
    from ..kernels.engine import EngineCore

    spec = shape.stack()
    graphs = kernels == "deepseek" and device.startswith("cuda")
    longest = max(int((f["prompt_len"] + f["output_len"]).max()) for f in frames)
    return EngineCore(
        spec,
        stack_layers(spec),
        local_experts=spec.moe.routed_experts,
        device=device,
        fp8=True,
        max_seqs=shape.max_decode_batch + 8,
        max_tokens=longest + 16,
        prefill_token_budget=shape.prefill_token_budget,
        max_decode_batch=shape.max_decode_batch,
        mode=mode,  # type: ignore[arg-type]
        decoder_replay_tokens=0,
        decode_buckets="single",
        backend=kernels,
        graphs=graphs and mode == "decode_only",
        prefill_graphs=graphs and prefill_graph_tokens > 0 and mode == "prefill_only",
        prefill_graph_tokens=prefill_graph_tokens,
        seed=0,
    )


def measured_seconds(reqs: pd.DataFrame, frame: pd.DataFrame, phase: str) -> np.ndarray:
    """TTFT (prefill) or TPOT (decode) per request, in the frame's row order."""
    reqs = reqs.sort_values("request").reset_index(drop=True)
    if phase == "prefill":
        return (reqs["first_token_s"] - reqs["arrival_s"]).to_numpy()
    return ((reqs["done_s"] - reqs["arrival_s"]) / (frame["output_len"] - 1)).to_numpy()


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over repeats of each error, and the spread of the measured p50."""
    keys = ("abs_rel_err_p50", "abs_rel_err_p90", "p50_rel_err", "measured_p50_s")
    med = {k: float(np.median([r[k] for r in runs])) for k in keys}
    p50 = [r["measured_p50_s"] for r in runs]
    med["measured_p50_spread"] = float((max(p50) - min(p50)) / np.median(p50))
    med["simulated_p50_s"] = runs[0]["simulated_p50_s"]
    return med


def replay(
    profile: Profile,
    out: Path,
    device: str,
    n: int,
    load: float,
    traces: tuple[str, ...] = TRACES,
    repeats: int = 3,
    kernels: str = "deepseek",
    shape: ReplayShape | None = None,
    max_prompt: int = 8192,
    max_output: int = 256,
    phases: tuple[str, ...] = tuple(PHASES),
) -> dict[str, Any]:
    shape = shape or ReplayShape()
    cost = validation_cost(profile, shape)
    report: dict[str, Any] = {
        "requests": n,
        "target_load": load,
        "repeats": repeats,
        "kernels": kernels,
        "profile": profile.name,
        "shape": shape.__dict__,
        "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "traces": {},
    }
    out.mkdir(parents=True, exist_ok=True)
    frames = {}
    for trace in traces:
        base = sample_requests(trace, n, max_prompt, max_output)
        pre_busy, dec_busy = predicted_busy(base, cost, shape)
        frames[trace] = {
            "prefill": retime(base, pre_busy, load),
            "decode": retime(base, dec_busy, load),
        }
    for phase in phases:
        mode, sim = PHASES[phase]
        engine = build_engine(
            [f[phase] for f in frames.values()],
            mode,
            shape,
            device,
            kernels,
            prefill_graph_tokens=cost.coefs.engine_prefill_graph_tokens,
        )
        for trace in traces:
            frame = frames[trace][phase]
            simulated = sim(frame, profile, shape)
            table = frame.copy()
            runs = []
            # an unrecorded first pass: CUDA graphs, autotuning and allocator growth happen there
            engine.run(frame[["arrival_s", "prompt_len", "output_len"]].to_numpy())
            for r in range(repeats):
                before = allocator_counts(device)
                t0 = time.perf_counter()
                res = engine.run(frame[["arrival_s", "prompt_len", "output_len"]].to_numpy())
                wall = time.perf_counter() - t0
                measured = measured_seconds(res.requests, frame, phase)
                table[f"measured_s_{r}"] = measured
                if r == 0:
                    res.steps.to_csv(out / f"replay_{trace}_{phase}_steps.csv", index=False)
                runs.append(
                    {
                        "engine_wall_s": wall,
                        **errors(measured, simulated),
                        "steps": step_times(res.steps),
                        "allocator": counts_since(before, allocator_counts(device)),
                    }
                )
                print(trace, phase, r, json.dumps(runs[-1]), flush=True)
            table.to_csv(out / f"replay_{trace}_{phase}.csv", index=False)
            report["traces"].setdefault(trace, {})[phase] = {
                "median": summarize(runs),
                "runs": runs,
            }
            (out / "replay_report.json").write_text(json.dumps(report, indent=2) + "\n")
        del engine  # the next phase's engine needs the memory (weights of a deep stack: ~75 GB)
        gc.collect()
        free_device_cache(device)
    return report


ALLOCATOR_COUNTS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms")


def allocator_counts(device: str) -> dict[str, int]:
    """The caching allocator's cumulative device mallocs, frees and retries (empty off CUDA):
    a replay whose steps call cudaMalloc or cudaFree serializes host and GPU."""
    if not device.startswith("cuda"):
        return {}
    import torch

    stats = torch.cuda.memory_stats(device)
    return {k: int(stats.get(k, 0)) for k in ALLOCATOR_COUNTS}


def counts_since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def step_times(steps: pd.DataFrame) -> dict[str, float]:
    """Medians over a replay's steps: wall, host issue and GPU seconds (NaN off CUDA); how many
    steps ran as CUDA graphs, and how many of those were captured first (off the clock)."""
    if steps.empty:
        return {}
    wall = steps["end_s"] - steps["start_s"]
    return {
        "wall_s_p50": float(wall.median()),
        "issue_s_p50": float(steps["issue_s"].median()),
        "gpu_s_p50": float(steps["gpu_s"].median()),
        "graph_steps": int(steps["graph"].sum()),
        "captured_steps": int(steps["captured"].sum()),
    }


def free_device_cache(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def recheck(
    profile: Profile,
    folder: Path,
    report: dict[str, Any],
    shape: ReplayShape | None = None,
    step_scale: float = 1.0,
) -> dict[str, Any]:
    """The errors of every stored repeat (``replay_<trace>_<phase>.csv``) re-simulated with
    ``profile``, in the report's layout: what a CPU test compares with the stored report.
    ``step_scale``: every simulated step cost times this factor (simulated exactly, as the
    replay with arrivals divided by it, its latencies multiplied by it)."""
    shape = shape or ReplayShape(**report["shape"])
    out: dict[str, Any] = {}
    for trace, phases in report["traces"].items():
        for phase in phases:
            frame = pd.read_csv(folder / f"replay_{trace}_{phase}.csv")
            stretched = frame.assign(arrival_s=frame["arrival_s"] / step_scale)
            simulated = PHASES[phase][1](stretched, profile, shape) * step_scale
            cols = sorted(c for c in frame.columns if c.startswith("measured_s_"))
            runs = [errors(frame[c].to_numpy(), simulated) for c in cols]
            out.setdefault(trace, {})[phase] = {"median": summarize(runs), "runs": runs}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load", type=float, default=0.5)
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--phases", default=",".join(PHASES), help="prefill,decode or one of them")
    ap.add_argument("--kernels", default="deepseek", choices=["deepseek", "reference"])
    ap.add_argument(
        "--depth",
        type=int,
        default=None,
        help="run the engine stack of deepseek-v4.1-flash at this many layers per group (as "
        "calibrate --engine-depth timed it); default: deepseek-v4.1-flash-mini",
    )
    a = ap.parse_args()
    unknown = set(a.phases.split(",")) - set(PHASES)
    if unknown:
        ap.error(f"--phases: unknown {', '.join(sorted(unknown))} (choose from prefill, decode)")
    shape = ReplayShape() if a.depth is None else ReplayShape("deepseek-v4.1-flash", depth=a.depth)
    replay(
        load_profile(a.profile),
        Path(a.out),
        a.device,
        a.requests,
        a.load,
        tuple(a.traces.split(",")),
        a.repeats,
        a.kernels,
        shape,
        phases=tuple(a.phases.split(",")),
    )


if __name__ == "__main__":
    main()
