"""Step by step: how far the engine core's measured replay steps are from the step model.

A replay's TTFT/TPOT error mixes queueing with step cost. The replay also records every engine
step (``replay_<trace>_<phase>_steps.csv``: start, end, sequences, tokens, KV tokens), so each
step can be set against the StepCost of the same profile the simulator uses — the residual of
the step model alone, binned by what the step held.

- **decode**: the batch is rebuilt from the request list (decode-only replays admit first come,
  first served up to the batch limit, and a request leaves after ``output_len − 1`` steps), which
  tells steps whose sequences all have one context length ("uniform", as the calibration grid
  times them) from mixed ones. The rebuild is checked against the recorded batch sizes.
- **prefill**: a prefill-only replay takes whole prompts first come, first served, so each
  step's prompts are the next ``prefill_seqs`` requests (checked against the step's recorded
  tokens); residuals binned by tokens and by prompts per step.

``python -m deepinfer_sim.calibration.step_residuals FOLDER [--json FILE]`` prints the tables.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import UserError
from ..models.profile import load_profile
from .validate import ReplayShape, validation_cost

DECODE_BINS = (0, 1, 2, 4, 8, 16, 32, 64)
PREFILL_BINS = (0, 256, 1024, 2048, 4096, 8192, 16384)
PROMPT_BINS = (0, 1, 2, 4, 8, 32)


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    rows = table.reset_index()
    rows["bin"] = rows["bin"].astype(str)
    return [{str(k): v for k, v in r.items()} for r in rows.to_dict(orient="records")]


def decode_batches(requests: pd.DataFrame, steps: pd.DataFrame, max_batch: int) -> pd.DataFrame:
    """Per recorded decode step: rebuilt batch size, summed and largest context."""
    arrival = requests["arrival_s"].to_numpy(float)
    prompt = requests["prompt_len"].to_numpy(np.int64)
    need = np.maximum(requests["output_len"].to_numpy(np.int64) - 1, 1)
    t0 = float(steps["start_s"].iloc[0])
    done = np.zeros(len(arrival), dtype=np.int64)
    active: list[int] = []
    nxt = 0
    rows = []
    for start in steps["start_s"].to_numpy(float):
        while nxt < len(arrival) and arrival[nxt] <= start - t0 + 1e-9 and len(active) < max_batch:
            active.append(nxt)
            nxt += 1
        ctx = prompt[active] + done[active]
        rows.append((len(active), int(ctx.sum()), int(ctx.max()) if active else 0))
        done[active] += 1
        active = [k for k in active if done[k] < need[k]]
    return pd.DataFrame(rows, columns=["batch", "kv_sum", "kv_max"], index=steps.index)


def decode_residuals(
    requests: pd.DataFrame, steps: pd.DataFrame, cost: Any, max_batch: int
) -> dict[str, Any]:
    rebuilt = decode_batches(requests, steps, max_batch)
    s = steps.assign(
        measured_s=steps["end_s"] - steps["start_s"],
        predicted_s=[
            cost.decode_step(np.array([b]), np.array([k]), 1.0)
            for b, k in zip(steps["decode_seqs"], steps["decode_kv_tokens"], strict=True)
        ],
        uniform=rebuilt["kv_max"] * rebuilt["batch"] == rebuilt["kv_sum"],
    )
    s["ratio"] = s["measured_s"] / s["predicted_s"]
    s["bin"] = pd.cut(s["decode_seqs"], DECODE_BINS)
    table = s.groupby(["bin", "uniform"], observed=True).agg(
        steps=("ratio", "size"),
        ratio_p50=("ratio", "median"),
        measured_p50_s=("measured_s", "median"),
    )
    return {
        "steps": len(s),
        "rebuilt_batch_matches": int((rebuilt["batch"] == steps["decode_seqs"]).sum()),
        "ratio_p50_uniform": float(s.loc[s["uniform"], "ratio"].median()),
        "ratio_p50_mixed": float(s.loc[~s["uniform"], "ratio"].median()),
        "by_batch": _records(table),
    }


def prefill_prompts(requests: pd.DataFrame, steps: pd.DataFrame) -> list[list[int] | None]:
    """Per recorded prefill step, the prompt lengths it held: a prefill-only replay takes whole
    prompts first come, first served, so step k holds the next ``prefill_seqs`` requests. None
    where their lengths do not sum to the step's recorded tokens (the rebuild lost track)."""
    lengths = requests["prompt_len"].to_numpy(np.int64)
    out: list[list[int] | None] = []
    nxt = 0
    for k, tokens in zip(steps["prefill_seqs"], steps["prefill_tokens"], strict=True):
        held = lengths[nxt : nxt + int(k)]
        nxt += int(k)
        out.append([int(n) for n in held] if int(held.sum()) == int(tokens) else None)
    return out


def prefill_residuals(requests: pd.DataFrame, steps: pd.DataFrame, cost: Any) -> dict[str, Any]:
    rebuilt = [(i, p) for i, p in enumerate(prefill_prompts(requests, steps)) if p is not None]
    s = steps.iloc[[i for i, _ in rebuilt]].assign(
        measured_s=lambda f: f["end_s"] - f["start_s"],
        predicted_s=[cost.prefill_step([[(n, 0) for n in p]]) for _, p in rebuilt],
    )
    s["ratio"] = s["measured_s"] / s["predicted_s"]
    s["bin"] = pd.cut(s["prefill_tokens"], PREFILL_BINS)
    s["prompts"] = pd.cut(s["prefill_seqs"], PROMPT_BINS)

    def table(by: str) -> list[dict[str, Any]]:
        t = s.groupby(by, observed=True).agg(
            steps=("ratio", "size"),
            ratio_p50=("ratio", "median"),
            measured_p50_s=("measured_s", "median"),
        )
        return _records(t.rename_axis("bin"))

    one = s[s["prefill_seqs"] == 1]
    return {
        "steps": len(steps),
        "rebuilt_steps": len(s),
        "one_prompt_steps": len(one),
        "ratio_p50": float(s["ratio"].median()),
        "ratio_mape": float((s["ratio"] - 1).abs().mean()),
        "by_tokens": table("bin"),
        "by_prompts": table("prompts"),
    }


def residuals(folder: Path, profile_name: str | None = None) -> dict[str, Any]:
    """Step residuals of every replay stored in ``folder`` (with its ``replay_report.json``)."""
    report = json.loads((folder / "replay_report.json").read_text())
    shape = ReplayShape(**report["shape"])
    cost = validation_cost(load_profile(profile_name or report["profile"]), shape)
    out: dict[str, Any] = {}
    for trace, phases in report["traces"].items():
        for phase in phases:
            steps_file = folder / f"replay_{trace}_{phase}_steps.csv"
            if not steps_file.exists():
                continue
            steps = pd.read_csv(steps_file)
            reqs = pd.read_csv(folder / f"replay_{trace}_{phase}.csv")
            if phase == "decode":
                res = decode_residuals(reqs, steps, cost, shape.max_decode_batch)
            else:
                res = prefill_residuals(reqs, steps, cost)
            out.setdefault(trace, {})[phase] = res
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument(
        "--profile", default=None, help="profile to predict with (default: the report's own)"
    )
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if not (a.folder / "replay_report.json").is_file():
        ap.error(f"{a.folder}: no replay_report.json (a replay.py output folder?)")
    try:
        res = residuals(a.folder, a.profile)
    except UserError as exc:
        ap.error(str(exc))
    for trace, phases in res.items():
        for phase, r in phases.items():
            for key in ("by_batch", "by_tokens", "by_prompts"):
                if key not in r:
                    continue
                rows = pd.DataFrame(r[key])
                print(f"\n{trace} {phase}: measured / predicted step time, {key.replace('_', ' ')}")
                print(rows.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
