"""Replay a small Mooncake sample through the real engine core on a GPU, then through the
simulator with a measured profile, and compare request by request (see ``validate.py``).

    python -m deepinfer_sim.calibration.replay --profile P.yaml --out DIR [--requests 300]

Writes ``DIR/replay_prefill.csv`` and ``DIR/replay_decode.csv`` (the engine's per-request and
per-step measurements) and ``DIR/replay_report.json`` (errors). The CSVs are what
``calibration/validation/`` keeps so a CPU test can re-check the simulator without a GPU.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from ..models.profile_cost import ProfileStepCost
from ..models.registry import load_model
from ..rng import stream
from ..traces import read_trace, spread_buckets
from .profile import Profile, load_profile
from .validate import ReplayShape, errors, simulate_decode, simulate_prefill, validation_cost

MINI_LAYERS: tuple[tuple[Literal["csa", "hca", "swa"], bool], ...] = (
    ("csa", True),
    ("hca", True),
    ("csa", False),
)


def sample_requests(n: int, max_prompt: int, max_output: int, seed: int = 0) -> pd.DataFrame:
    """The first ``n`` Mooncake conversation requests, lengths capped, trace arrival times."""
    src = spread_buckets(
        read_trace("builtin:mooncake_conversation"), 3.0, "uniform", stream(seed, "replay")
    )
    src = src.head(n)
    return pd.DataFrame(
        {
            "arrival_s": src.arrival_s - src.arrival_s[0],
            "prompt_len": np.minimum(src.input_len, max_prompt),
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


def run_engine(frame: pd.DataFrame, mode: str, shape: ReplayShape, device: str) -> pd.DataFrame:
    from ..kernels.engine import EngineCore

    spec = load_model(shape.model)
    engine = EngineCore(
        spec,
        MINI_LAYERS,
        local_experts=spec.moe.routed_experts,
        device=device,
        fp8=True,
        max_seqs=shape.max_decode_batch + 8,
        max_tokens=int((frame["prompt_len"] + frame["output_len"]).max()) + 16,
        prefill_token_budget=shape.prefill_token_budget,
        max_decode_batch=shape.max_decode_batch,
        mode=mode,  # type: ignore[arg-type]
        decoder_replay_tokens=0,
        decode_buckets="single",
        seed=0,
    )
    res = engine.run(frame[["arrival_s", "prompt_len", "output_len"]].to_numpy())
    return res.requests, res.steps


def replay(profile: Profile, out: Path, device: str, n: int, load: float) -> dict[str, Any]:
    shape = ReplayShape()
    cost = validation_cost(profile, shape)
    base = sample_requests(n, max_prompt=8192, max_output=256)
    pre_busy, dec_busy = predicted_busy(base, cost, shape)
    report: dict[str, Any] = {"requests": n, "target_load": load, "shape": shape.__dict__}
    out.mkdir(parents=True, exist_ok=True)
    for mode, busy, sim in (
        ("prefill_only", pre_busy, simulate_prefill),
        ("decode_only", dec_busy, simulate_decode),
    ):
        frame = retime(base, busy, load)
        t0 = time.perf_counter()
        reqs, steps = run_engine(frame, mode, shape, device)
        wall = time.perf_counter() - t0
        reqs = reqs.sort_values("request").reset_index(drop=True)  # = the frame's row order
        key = "prefill" if mode == "prefill_only" else "decode"
        if key == "prefill":
            measured = (reqs["first_token_s"] - reqs["arrival_s"]).to_numpy()
        else:
            measured = ((reqs["done_s"] - reqs["arrival_s"]) / (frame["output_len"] - 1)).to_numpy()
        table = frame.assign(measured_s=measured)
        table.to_csv(out / f"replay_{key}.csv", index=False)
        steps.to_csv(out / f"replay_{key}_steps.csv", index=False)
        simulated = sim(frame, profile, shape)
        report[key] = {"engine_wall_s": wall, **errors(measured, simulated)}
        print(key, json.dumps(report[key]), flush=True)
    (out / "replay_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--load", type=float, default=0.5)
    a = ap.parse_args()
    replay(load_profile(a.profile), Path(a.out), a.device, a.requests, a.load)


if __name__ == "__main__":
    main()
