"""Validate the simulator against the real engine core: same requests, same shape, same policy.

The engine core (``kernels/engine.py``) replays a small trace on the GPU in two disaggregated
halves, as the simulator models them:

- **prefill only**: prompts arrive in real time; the engine takes queued prompts first come,
  first served, whole, up to a token budget per step. TTFT = prefill completion − arrival.
- **decode only**: requests arrive with their prompt already in cache and decode
  ``output_len − 1`` tokens, admitted first come, first served up to a batch limit.
  TPOT = (completion − arrival) / (output_len − 1).

Here the simulator replays the very same request lists through a one-rank ``PrefillInstance`` and
a one-rank ``DecodeGroup`` whose StepCost is built from a calibration profile, and the two are
compared request by request. The engine's measured results are kept in the repository
(``calibration/validation/``) so CPU tests can re-check the simulator's prediction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import simpy

from ..errors import UserError
from ..models.cost import PoolShape, StepParams
from ..models.profile import Profile
from ..models.profile_cost import ProfileStepCost
from ..models.registry import load_hardware, load_model
from ..models.spec import ModelSpec
from ..sim.core.requests import RequestTable
from ..sim.policies.chunking import WholePrompts
from ..sim.policies.kv_admission import ReserveWholeContext
from ..sim.stages.decode import DecodeGroup
from ..sim.stages.prefill import PrefillInstance
from ..traces import RequestSource
from .sweep import engine_stack


@dataclass(frozen=True)
class ReplayShape:
    model: str = "deepseek-v4.1-flash-mini"
    hardware: str = "h200"
    prefill_token_budget: int = 16384
    max_decode_batch: int = 64
    step_overhead_s: float = 0.0
    # None: ``model`` is the engine's stack as it stands; N: the engine stack of ``model`` with
    # N layers per layer group (``sweep.engine_stack``), as ``calibrate --engine-depth N`` timed
    depth: int | None = None

    def stack(self) -> ModelSpec:
        """The model the engine core runs and the simulator costs."""
        spec = load_model(self.model)
        return spec if self.depth is None else engine_stack(spec, depth=self.depth)


def _source(frame: pd.DataFrame) -> RequestSource:
    n = len(frame)
    inp = frame["prompt_len"].to_numpy(np.int64)
    blocks = -(-inp // 512)
    offsets = np.concatenate([[0], np.cumsum(blocks)])
    return (
        RequestSource.from_columns(
            arrival_s=frame["arrival_s"].to_numpy(float),
            input_len=inp,
            output_len=frame["output_len"].to_numpy(np.int64),
            block_offsets=offsets,
            block_hashes=np.arange(offsets[-1]),
            block_tokens=512,
            name="replay",
            sort=False,
        )
        if n
        else RequestSource.from_columns(
            arrival_s=[],
            input_len=[],
            output_len=[],
            block_offsets=[0],
            block_hashes=[],
            block_tokens=512,
        )
    )


def validation_cost(profile: Profile, shape: ReplayShape) -> ProfileStepCost:
    """The StepCost of the engine core: kernel fits + eager launch gaps + its own host time."""
    model = shape.stack()
    hw = load_hardware(shape.hardware)
    step = StepParams(comm_overlap=0.0, step_overhead_s=shape.step_overhead_s)
    coefs = profile.coefs(model, hw.name)
    fitted_depth = coefs.engine_overhead.stack_depth
    if (shape.depth or 1) != fitted_depth:
        raise UserError(
            f"profile {profile.name!r} fitted its engine-core model on a stack of depth "
            f"{fitted_depth}; this replay runs depth {shape.depth or 1} (pass --depth "
            f"{fitted_depth})"
        )
    return ProfileStepCost(
        model,
        hw,
        PoolShape(1, 0),
        coefs,
        step,
        profile.name,
        eager=True,
    )


def simulate_prefill(frame: pd.DataFrame, profile: Profile, shape: ReplayShape) -> np.ndarray:
    """Simulated TTFT per request for a prefill-only replay of ``frame``."""
    src = _source(frame)
    env = simpy.Environment()
    table = RequestTable(src)
    inst = PrefillInstance(
        env=env,
        idx=0,
        machine=0,
        cost=validation_cost(profile, shape),
        dp=1,
        max_tokens_per_step=shape.prefill_token_budget,
        step_time_budget_s=1e9,
        imbalance=1.0,
        table=table,
        flops=lambda n, p, replay: 0.0,
        on_done=lambda rid, i: None,
        chunking=WholePrompts(),
    )

    def arrivals():
        for rid in range(len(src)):
            if src.arrival_s[rid] > env.now:
                yield env.timeout(src.arrival_s[rid] - env.now)
            inst.submit(rid, 0, 0, 0)

    env.process(arrivals())
    env.run()
    return table.t_prefill_end - src.arrival_s


def simulate_decode(frame: pd.DataFrame, profile: Profile, shape: ReplayShape) -> np.ndarray:
    """Simulated TPOT per request for a decode-only replay of ``frame``."""
    src = _source(frame)
    env = simpy.Environment()
    table = RequestTable(src)
    group = DecodeGroup(
        env=env,
        idx=0,
        ep=1,
        cost=validation_cost(profile, shape),
        max_seqs_per_rank=shape.max_decode_batch,
        kv_capacity_tokens=float("inf"),
        kv_admission=ReserveWholeContext(),
        imbalance=1.0,
        table=table,
        on_done=lambda rid: None,
    )

    def arrivals():
        for rid in range(len(src)):
            if src.arrival_s[rid] > env.now:
                yield env.timeout(src.arrival_s[rid] - env.now)
            table.t_transfer_end[rid] = env.now
            group.assign(rid, 0)
            group.arrive(rid)

    env.process(arrivals())
    env.run()
    return (table.t_done - src.arrival_s) / np.maximum(src.output_len - 1, 1)


def errors(measured: np.ndarray, simulated: np.ndarray) -> dict[str, Any]:
    """Per-request relative error |sim − real| / real: p50, p90 and the signed median."""
    rel = (simulated - measured) / measured
    ok = np.isfinite(rel)
    a = np.abs(rel[ok])
    return {
        "requests": int(ok.sum()),
        "abs_rel_err_p50": float(np.percentile(a, 50)),
        "abs_rel_err_p90": float(np.percentile(a, 90)),
        "signed_rel_err_median": float(np.median(rel[ok])),
        "measured_p50_s": float(np.median(measured[ok])),
        "simulated_p50_s": float(np.median(simulated[ok])),
        "p50_rel_err": float(np.median(simulated[ok]) / np.median(measured[ok]) - 1),
    }
