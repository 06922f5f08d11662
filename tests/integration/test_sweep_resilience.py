"""A sweep or a plan survives a worker process killed hard, and a plan resumes from its probes.

The out-of-memory killer ends a worker with SIGKILL: no exception, no traceback, just a process
gone. ``DEEPINFER_SIM_TEST_KILL=<key>[@N]`` (planner/executors.py) makes the worker that picks
up task ``<key>`` do exactly that to itself, on its first N attempts (every attempt without
``@N``). Only the point (or plan shape) it names is hit; the others must finish as if nothing
happened, and the points not yet started must never be counted failed.

The tiny scenario (60 requests) runs in about a second, so these are real simulations.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import tiny_dict

from deepinfer_sim.cli_plan import sweep_grid
from deepinfer_sim.planner import plan as plan_mod
from deepinfer_sim.planner.executors import KILL_ENV, Failed, WorkerPool
from deepinfer_sim.planner.grid import GridPoint
from deepinfer_sim.planner.sweep import run_sweep

PLAN = [
    "planner.prefill_ep=[2]",
    "planner.decode_ep=[8]",
    "planner.bisection_steps=2",
    "planner.probe_seconds=5",
    "planner.probe_min_requests=50",
]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_dict(**{"workload.max_requests": 60})), encoding="utf-8")
    return path


def five_points() -> list[GridPoint]:
    return [GridPoint({"pools.decode.ep": ep}) for ep in (8, 16, 32)] + [
        GridPoint({"seed": s}) for s in (1, 2)
    ]


def record(out: Path, pid: str) -> dict:
    return json.loads((out / "points" / f"{pid}.json").read_text())


def test_a_killed_worker_fails_only_its_own_point_and_the_sweep_goes_on(
    tmp_path, config, monkeypatch
):
    """Two workers, five points, the second point's worker SIGKILLed on every attempt: it is
    run twice (one retry), then recorded failed with the exit status; the point running beside
    it and the three not yet started finish ok. A re-run resumes with that point alone."""
    points = five_points()
    killed = points[1].point_id
    monkeypatch.setenv(KILL_ENV, killed)
    out = tmp_path / "sweep"
    table = run_sweep(config, points, out, workers=2, progress=False)

    status = dict(zip(table["point_id"], table["status"], strict=True))
    assert status == {p.point_id: "error" if p.point_id == killed else "ok" for p in points}
    error = table.set_index("point_id").loc[killed, "error"]
    assert error == "worker died (exit -9, SIGKILL), on each of 2 attempts"
    assert record(out, killed)["attempts"] == 2
    assert "SIGKILL" in (out / "runs" / killed / "error.txt").read_text()
    for p in points:
        if p.point_id != killed:
            assert record(out, p.point_id)["attempts"] == 1
            assert (out / "runs" / p.point_id / "summary.json").is_file()
    assert (table.loc[table["status"] == "ok", "requests.completed"] == 60).all()

    # resume: the finished points are skipped, the killed one runs (and now succeeds)
    monkeypatch.delenv(KILL_ENV)
    again = run_sweep(config, points, out, workers=2, progress=False)
    assert again.attrs["ran"] == [killed]
    assert (again["status"] == "ok").all()
    assert not (out / "runs" / killed / "error.txt").exists()


@pytest.mark.parametrize(("retries", "status", "attempts"), [(1, "ok", 2), (0, "error", 1)])
def test_a_point_killed_once_is_done_after_its_retry(
    tmp_path, config, monkeypatch, retries, status, attempts
):
    """Killed on its first attempt only: the retry in a fresh worker succeeds and the point is
    recorded ok, two attempts. With no retries it fails at once."""
    points = five_points()[:3]
    killed = points[0].point_id
    monkeypatch.setenv(KILL_ENV, f"{killed}@1")
    out = tmp_path / "sweep"
    table = run_sweep(config, points, out, workers=2, progress=False, retries=retries)
    assert table["status"].tolist() == [status, "ok", "ok"]
    assert record(out, killed)["attempts"] == attempts
    if status == "ok":
        assert table["error"].isna().all() and table["requests.completed"].iloc[0] == 60


def test_the_sweep_command_reports_the_killed_point_and_exits_1(tmp_path, config, monkeypatch):
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"axes": {"pools.decode.ep": [8, 16, 32]}}), encoding="utf-8")
    points = [GridPoint({"pools.decode.ep": ep}) for ep in (8, 16, 32)]
    monkeypatch.setenv(KILL_ENV, points[2].point_id)
    out = tmp_path / "out"
    argv = [str(config), "--grid", str(grid), "--out", str(out), "--workers", "2"]
    res = CliRunner().invoke(sweep_grid, [*argv, "--retries", "0"])
    assert res.exit_code == 1, res.output
    assert "3 points: 3 run, 0 already done, 1 failed" in res.output
    assert f"failed {points[2].point_id}: worker died (exit -9, SIGKILL)" in res.output


def _square(x: int) -> int:
    if x < 0:
        raise ValueError("negative")
    return x * x


def test_the_worker_pool_runs_the_rest_when_a_worker_dies_or_a_task_raises(monkeypatch):
    monkeypatch.setenv(KILL_ENV, "k2")
    with WorkerPool(2) as pool:
        got = {
            i: (out, n)
            for i, out, n in pool.imap(
                _square, [(0,), (1,), (2,), (-3,), (4,), (5,)], [f"k{i}" for i in range(6)], 2
            )
        }
    assert {i: got[i] for i in (0, 1, 4, 5)} == {0: (0, 1), 1: (1, 1), 4: (16, 1), 5: (25, 1)}
    died, raised = got[2][0], got[3][0]
    assert isinstance(died, Failed) and got[2][1] == 3  # killed three times: two retries
    assert str(died) == "worker died (exit -9, SIGKILL), on each of 3 attempts"
    assert isinstance(raised, Failed) and raised.reason.startswith("ValueError: negative")
    assert got[3][1] == 1  # an exception is not retried


# ---- plan: probes on disk as they finish, and resume ------------------------------------------


@pytest.fixture
def counted(monkeypatch):
    """Count the plan's simulations in this process (workers=1 runs in-process)."""
    calls: list[float] = []
    real = plan_mod.simulate

    def simulate(sc, *args, **kwargs):
        calls.append(sc.workload.rate_scale)
        return real(sc, *args, **kwargs)

    monkeypatch.setattr(plan_mod, "simulate", simulate)
    return calls


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_plan_writes_each_probe_as_it_finishes_and_a_rerun_resumes(
    tmp_path, config, counted, monkeypatch
):
    """Each probe is a line in plan/probes/<shape>.jsonl the moment it ends; a re-run with the
    same config simulates nothing; a line cut short by a kill costs only its own simulation."""
    real_bound = plan_mod.unit_rate_bound  # 3x the bound: the first probe fails and bisection runs
    monkeypatch.setattr(plan_mod, "unit_rate_bound", lambda sc, st: 3 * real_bound(sc, st))
    over = [*PLAN, "planner.prefill_instances=[1]"]
    runs = tmp_path / "plan" / "runs"
    log = tmp_path / "plan" / "probes" / "p1x2-d8.jsonl"
    seen: list[int] = []  # lines on disk when each simulation starts
    real = plan_mod.simulate

    def watching(sc, *args, **kwargs):
        seen.append(len(lines(log)))
        return real(sc, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan_mod, "simulate", watching)
        first = plan_mod.plan(str(config), over, runs_dir=str(runs))
    n = len(seen)
    assert n == len(counted) == 4  # the bound, two bisection probes, the operating point
    counted.clear()
    assert seen == list(range(n))  # every earlier probe was on disk before the next one began
    written = lines(log)
    assert len(written) == n and written[-1]["kind"] == "operating_point"
    assert [w["rate_rps"] for w in written[:-1]] == [p["rate_rps"] for p in first.results[0].probes]

    # same config again: nothing simulated, the same answer, the log untouched
    before = log.read_bytes()
    second = plan_mod.plan(str(config), over, runs_dir=str(runs))
    assert counted == []
    assert log.read_bytes() == before
    a, b = first.results[0], second.results[0]
    assert (b.status, b.sustainable_rps, b.replicas, b.probes) == (
        a.status, a.sustainable_rps, a.replicas, a.probes,
    )  # fmt: skip
    assert (b.ttft_p99_s, b.usd_h, b.run_dir) == (a.ttft_p99_s, a.usd_h, a.run_dir)

    # a kill mid-write leaves a cut last line: it is skipped, and only that simulation runs again
    text = before.decode().splitlines(keepends=True)
    log.write_text("".join(text[:-1]) + text[-1][: len(text[-1]) // 2])
    third = plan_mod.plan(str(config), over, runs_dir=str(runs))
    assert len(counted) == 1
    assert third.results[0].probes == a.probes and third.results[0].ttft_p99_s == a.ttft_p99_s


def test_a_plan_shape_whose_worker_dies_is_an_error_and_the_others_go_on(
    tmp_path, config, monkeypatch
):
    over = [*PLAN, "planner.prefill_instances=[1, 2]"]
    monkeypatch.setenv(KILL_ENV, "p2x2-d8")
    result = plan_mod.plan(str(config), over, workers=2, runs_dir=str(tmp_path / "plan" / "runs"))
    by = {r.shape.slug: r for r in result.results}
    assert by["p2x2-d8"].status == "error"
    assert by["p2x2-d8"].error == "worker died (exit -9, SIGKILL), on each of 2 attempts"
    assert by["p1x2-d8"].status in ("feasible", "infeasible", "pruned")
    assert by["p1x2-d8"].status != "error"
