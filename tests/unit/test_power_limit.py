"""The GPU's clock at its power limit (models/power_limit.py): the slowdown by busy share, the
busy share an engine keeps step by step, the cost models' slowed prefill compute, the simulator's
prefill instances and steady points using it, and the fit of a hardware file's values
(calibration/sustained_fit.py)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_source, tiny_dict

from deepinfer_sim.calibration import sustained_fit
from deepinfer_sim.models.cost import PoolShape, RooflineParams, RooflineStepCost, StepParams
from deepinfer_sim.models.power_limit import BusyShare, SustainedClock
from deepinfer_sim.models.registry import load_hardware, load_model
from deepinfer_sim.planner.analysis.steady import prefill_point
from deepinfer_sim.scenario import scenario_from_dict
from deepinfer_sim.sim.run import simulate

CLOCK = SustainedClock(slowdown=1.08, window_s=0.1, onset_share=0.9, source="test")


def test_the_slowdown_rises_linearly_from_the_onset_to_a_gpu_never_idle() -> None:
    assert CLOCK.factor(0.0) == CLOCK.factor(0.9) == 1.0
    assert CLOCK.factor(0.95) == pytest.approx(1.04)
    assert CLOCK.factor(1.0) == pytest.approx(1.08)


def run_pattern(busy: BusyShare, step_s: float, gap_s: float, steps: int) -> list[float]:
    now, factors = 0.0, []
    for _ in range(steps):
        f = busy.factor(now)
        factors.append(f)
        now += step_s * f
        busy.ended(now, step_s * f)
        now += gap_s
    return factors


def test_steps_back_to_back_reach_the_full_slowdown_and_an_idle_gap_restores_the_clock() -> None:
    busy = BusyShare(CLOCK)
    factors = run_pattern(busy, 0.2, 0.0, 20)
    assert factors[0] == 1.0  # a GPU idle before its first step
    assert factors[-1] == pytest.approx(1.08, abs=1e-3)
    assert all(b >= a for a, b in itertools.pairwise(factors))
    assert busy.factor(100.0) == 1.0  # after a long idle the share is gone


def test_a_half_busy_engine_keeps_its_clock() -> None:
    factors = run_pattern(BusyShare(CLOCK), 0.1, 0.1, 100)
    assert max(factors) == 1.0


H100 = load_hardware("h100")
V3 = load_model("deepseek-v3")


def test_the_slowdown_multiplies_prefill_compute_and_not_the_exchange() -> None:
    """EP1: a step is overhead + compute, so the slowdown scales all but the overhead; EP8: the
    exchange is not slowed, so the step grows by less."""
    chunks = [[(4096, 0)]]
    one = RooflineStepCost(V3, H100, PoolShape(1, 0, False), RooflineParams(), StepParams())
    base, slow = one.prefill_step(chunks), one.prefill_step(chunks, slowdown=1.1)
    assert slow - one.step_overhead_s == pytest.approx(1.1 * (base - one.step_overhead_s))
    ep8 = RooflineStepCost(V3, H100, PoolShape(8, 0, False), RooflineParams(), StepParams())
    bd, bd_slow = ep8.prefill_breakdown(chunks * 8), ep8.prefill_breakdown(chunks * 8, 1.0, 1.1)
    assert bd_slow.a2a_s == bd.a2a_s
    assert bd_slow.experts_s == pytest.approx(1.1 * bd.experts_s)
    assert bd_slow.dense_s == pytest.approx(1.1 * bd.dense_s)


def test_a_cost_model_takes_the_hardware_clock_unless_the_scenario_switches_it_off() -> None:
    shape = PoolShape(8, 0, False)
    on = RooflineStepCost(V3, H100, shape, RooflineParams(), StepParams())
    off = RooflineStepCost(V3, H100, shape, RooflineParams(), StepParams(sustained_clock=False))
    assert H100.sustained_clock is not None
    assert on.sustained_slowdown == H100.sustained_clock.slowdown > 1.0
    assert off.sustained_clock is None and off.sustained_slowdown == 1.0
    b200 = RooflineStepCost(V3, load_hardware("b200"), shape, RooflineParams(), StepParams())
    assert b200.sustained_slowdown == 1.0  # not measured: no slowdown


def h100_prefill(**over: object) -> dict:
    return tiny_dict(**{"pools.prefill.hardware": "h100", "pools.prefill.ep": 8, **over})


def test_a_saturated_prefill_pool_runs_slowed_and_a_light_one_does_not() -> None:
    n = 120
    heavy = make_source(np.zeros(n), 8192, 4)  # every prompt at once: steps back to back
    light = make_source(np.arange(n) * 2.0, 1024, 4)  # one short prompt every 2 s
    sc = scenario_from_dict(h100_prefill())
    off = scenario_from_dict(h100_prefill(**{"cost_model.step.sustained_clock": False}))
    slowed = simulate(sc, heavy).summary["prefill"]["clock_slowdown_mean"]
    assert H100.sustained_clock is not None
    assert 1.0 < slowed <= H100.sustained_clock.slowdown
    assert simulate(off, heavy).summary["prefill"]["clock_slowdown_mean"] == 1.0
    assert simulate(sc, light).summary["prefill"]["clock_slowdown_mean"] == 1.0
    ttft = [simulate(s, heavy).requests["ttft_s"].max() for s in (sc, off)]
    assert ttft[0] > ttft[1]


def test_a_steady_prefill_point_runs_at_the_sustained_clock() -> None:
    on = prefill_point(scenario_from_dict(h100_prefill()), 8192, 4096)
    off = prefill_point(
        scenario_from_dict(h100_prefill(**{"cost_model.step.sustained_clock": False})), 8192, 4096
    )
    assert on.tokens_per_s_per_gpu < off.tokens_per_s_per_gpu
    assert H100.sustained_clock is not None
    assert off.tokens_per_s_per_gpu / on.tokens_per_s_per_gpu < H100.sustained_clock.slowdown


def write_run(path: Path, duty: float, group: int, ratio: float, call_s: float = 0.015) -> Path:
    res = {
        "duty": duty,
        "group": group,
        "workloads": [{"workload": "layer:8192", "burst_s": call_s / ratio, "sustained_s": call_s}],
    }
    path.write_text(json.dumps(res))
    return path


def test_the_fit_recovers_a_known_clock_from_its_own_patterns(tmp_path: Path) -> None:
    truth = SustainedClock(slowdown=1.06, window_s=0.2, onset_share=0.9, source="truth")
    files = []
    for i, (duty, group) in enumerate([(1.0, 1), (0.95, 1), (0.75, 60), (0.9, 200), (0.5, 1)]):
        p = sustained_fit.Pattern(duty, group, 0.015, 1.0, "x")
        ratio = sustained_fit.predicted_ratio(truth, p) if duty < 1 else truth.slowdown
        files.append(write_run(tmp_path / f"{i}.json", duty, group, ratio))
    res = sustained_fit.fit(sustained_fit.load_patterns(files, "layer:8192"), "test")
    for row in res["patterns"]:
        assert row["model"] == pytest.approx(row["measured"], abs=2e-3)
    assert res["sustained_clock"]["slowdown"] == pytest.approx(1.06)


def test_the_fit_needs_a_back_to_back_run_and_names_a_bad_file(tmp_path: Path, capsys) -> None:
    part = write_run(tmp_path / "p.json", 0.75, 1, 0.95)
    assert sustained_fit.main([str(part)]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert sustained_fit.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "back-to-back" in err[0] and err[1].startswith(f"error: {bad}")


def test_a_step_whose_gpus_wait_on_the_host_counts_only_its_compute() -> None:
    """Back to back, steps whose GPUs compute half the time keep the share at a half: no
    slowdown, where fully busy steps reach the full one."""
    half, full = BusyShare(CLOCK), BusyShare(CLOCK)
    now = 0.0
    for _ in range(50):
        f_half, f_full = half.factor(now), full.factor(now)
        now += 0.2
        half.ended(now, 0.2, busy=0.5)
        full.ended(now, 0.2)
    assert f_half == 1.0 and f_full == pytest.approx(1.08, abs=1e-3)
