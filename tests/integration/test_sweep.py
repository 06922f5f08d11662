"""Sweeps: every grid point is a full run, its row lands in a table, and a sweep survives both a
failing point and an interruption.

The tiny scenario (2 prefill instances, one EP8 decode group, 60 requests) runs in about a
second, so these tests run real simulations, in worker processes where the test says so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from conftest import tiny_dict

from deepinfer_sim.cli_plan import sweep_grid
from deepinfer_sim.errors import UserError
from deepinfer_sim.planner import sweep as sweep_mod
from deepinfer_sim.planner.grid import GridPoint, load_grid
from deepinfer_sim.planner.sweep import run_sweep

METRICS = (
    "latency.ttft_s.p99",
    "latency.tpot_s.p50",
    "throughput.output_tok_per_s",
    "goodput.fraction_of_completed",
    "cost.usd_per_mtok_output",
    "cost.usd_per_hour",
    "cache.hit_rate_tokens",
    "eplb.decode_imbalance_mean",
)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_dict(**{"workload.max_requests": 60})), encoding="utf-8")
    return path


def grid_file(tmp_path: Path, axes: dict, **extra: object) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({**extra, "axes": axes}, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def counted(monkeypatch):
    """Count the simulations that run in this process (workers=1 runs in-process)."""
    calls: list[int] = []
    real = sweep_mod.simulate

    def simulate(sc, *args, **kwargs):
        calls.append(sc.pools.decode.ep)
        return real(sc, *args, **kwargs)

    monkeypatch.setattr(sweep_mod, "simulate", simulate)
    return calls


def test_a_sweep_in_two_worker_processes_writes_one_row_per_point(tmp_path, config):
    points = load_grid(grid_file(tmp_path, {"pools.decode.ep": [8, 16], "seed": [1, 2]}), config)
    out = tmp_path / "sweep"
    table = run_sweep(config, points, out, workers=2, progress=False)

    assert list(table["point_id"]) == [p.point_id for p in points]
    assert (table["status"] == "ok").all() and table["error"].isna().all()
    assert list(table["pools.decode.ep"]) == [8, 8, 16, 16]
    assert list(table["seed"]) == [1, 2, 1, 2]
    for col in (*METRICS, "wall_s", "requests.completed"):
        assert col in table.columns, col
    assert (table["requests.completed"] == 60).all()
    assert (table["wall_s"] > 0).all()
    # the columns start with the id, then the grid keys, then status, error, wall_s
    head = ["point_id", "pools.decode.ep", "seed", "status", "error", "wall_s"]
    assert list(table.columns[:6]) == head
    # the table on disk is the one returned; each point has its record and its full run
    on_disk = pd.read_parquet(out / "sweep.parquet")
    pd.testing.assert_frame_equal(on_disk, table, check_dtype=False)
    for pid in table["point_id"]:
        record = json.loads((out / "points" / f"{pid}.json").read_text())
        assert record["status"] == "ok" and record["overrides"]
        run = out / "runs" / pid
        assert {"summary.json", "requests.parquet", "timeseries.parquet"} <= {
            p.name for p in run.iterdir()
        }
        assert not (run / "plots").exists()  # plots are off unless asked
    # each point ran its own deployment: the EP16 rows hold twice the decode GPUs
    by_ep = table.groupby("pools.decode.ep")["cost.gpus.decode"].unique()
    assert [list(by_ep[8]), list(by_ep[16])] == [[8], [16]]


def test_resume_runs_only_the_points_without_a_result(tmp_path, config, counted):
    points = load_grid(grid_file(tmp_path, {"pools.decode.ep": [8, 16, 32]}), config)
    out = tmp_path / "sweep"
    first = run_sweep(config, points, out, workers=1, progress=False)
    assert sorted(counted) == [8, 16, 32] and first.attrs["skipped"] == []
    kept = {p.point_id: (out / "points" / f"{p.point_id}.json").read_text() for p in points}

    (out / "points" / f"{points[1].point_id}.json").unlink()
    counted.clear()
    second = run_sweep(config, points, out, workers=1, progress=False)
    assert counted == [16]
    assert second.attrs["ran"] == [points[1].point_id]
    assert second.attrs["skipped"] == [points[0].point_id, points[2].point_id]
    for p in (points[0], points[2]):  # untouched records, same wall time
        assert (out / "points" / f"{p.point_id}.json").read_text() == kept[p.point_id]
    assert (second["status"] == "ok").all()
    cols = ["point_id", "pools.decode.ep", "latency.ttft_s.p99", "throughput.output_tok_per_s"]
    pd.testing.assert_frame_equal(second[cols], first[cols])


def test_a_changed_base_override_runs_every_point_again(tmp_path, config, counted):
    points = [GridPoint({"pools.decode.ep": 8})]
    out = tmp_path / "sweep"
    run_sweep(config, points, out, progress=False)
    run_sweep(config, points, out, progress=False)
    assert counted == [8]  # the second sweep found it done
    table = run_sweep(config, points, out, base_overrides=["seed=7"], progress=False)
    assert counted == [8, 8]  # same point id, different resolved scenario: runs again
    assert table["point_id"].tolist() == [points[0].point_id]


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path, config, monkeypatch):
    real = sweep_mod.simulate

    def simulate(sc, *args, **kwargs):
        if sc.pools.decode.ep == 16:
            raise RuntimeError("simulated crash\nsecond line")
        return real(sc, *args, **kwargs)

    monkeypatch.setattr(sweep_mod, "simulate", simulate)
    points = load_grid(grid_file(tmp_path, {"pools.decode.ep": [8, 16, 32]}), config)
    out = tmp_path / "sweep"
    table = run_sweep(config, points, out, workers=1, progress=False)
    assert table["status"].tolist() == ["ok", "error", "ok"]
    bad = table.iloc[1]
    assert bad["error"] == "RuntimeError: simulated crash second line"
    assert pd.isna(bad["latency.ttft_s.p99"]) and bad["wall_s"] >= 0
    trace = (out / "runs" / bad["point_id"] / "error.txt").read_text()
    assert "Traceback" in trace and "simulated crash" in trace

    # errors run again on resume; the points that finished do not
    monkeypatch.setattr(sweep_mod, "simulate", real)
    again = run_sweep(config, points, out, workers=1, progress=False)
    assert again.attrs["ran"] == [bad["point_id"]]
    assert (again["status"] == "ok").all()
    assert not (out / "runs" / bad["point_id"] / "error.txt").exists()


def test_a_point_that_fails_in_a_worker_process_is_recorded(tmp_path, config):
    """A trace path that does not exist passes the scenario check and fails in the run."""
    points = [
        GridPoint({"pools.decode.ep": 8}),
        GridPoint({"workload.trace": str(tmp_path / "missing.jsonl")}),
    ]
    table = run_sweep(config, points, tmp_path / "sweep", workers=2, progress=False)
    assert table["status"].tolist() == ["ok", "error"]
    assert "TraceError" in table["error"].iloc[1] and "no such file" in table["error"].iloc[1]


def test_plain_mappings_are_points_and_duplicates_are_refused(tmp_path, config):
    with pytest.raises(UserError, match="same point twice"):
        run_sweep(config, [{"seed": 1}, {"seed": 1}], tmp_path / "s", progress=False)
    with pytest.raises(UserError, match=r"pools\.decode\.epp: unknown key"):
        run_sweep(config, [{"pools.decode.epp": 1}], tmp_path / "s", progress=False)


def test_the_ray_executor_without_ray_says_how_to_install_it(tmp_path, config, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(UserError, match=r"pip install 'deepinfer-sim\[ray\]'"):
        run_sweep(config, [{"seed": 1}], tmp_path / "s", executor="ray", progress=False)


@pytest.mark.ray
def test_the_ray_executor_runs_points_as_ray_tasks(tmp_path, config):
    from deepinfer_sim.planner.executors import real_ray

    if real_ray() is None:
        pytest.skip("the optional `ray` extra is not installed")
    points = [GridPoint({"pools.decode.ep": 8}), GridPoint({"pools.decode.ep": 16})]
    out = tmp_path / "sweep"
    table = run_sweep(config, points, out, workers=2, executor="ray", progress=False)
    assert (table["status"] == "ok").all(), table["error"].tolist()
    assert sorted(table.attrs["ran"]) == sorted(p.point_id for p in points)
    local = run_sweep(config, points, tmp_path / "local", workers=1, progress=False)
    cols = ["point_id", "latency.ttft_s.p99", "throughput.output_tok_per_s"]
    pd.testing.assert_frame_equal(table[cols], local[cols])  # same seeds, same numbers
    assert all((out / "runs" / p.point_id / "summary.json").is_file() for p in points)


# ---- the command ------------------------------------------------------------------------------


def test_sweep_grid_command_runs_and_prints_the_table(tmp_path, config):
    grid = grid_file(tmp_path, {"pools.decode.ep": [8, 16]}, mode="one_at_a_time")
    out = tmp_path / "out"
    res = CliRunner().invoke(
        sweep_grid, [str(config), "--grid", str(grid), "--out", str(out), "--set", "seed=3"]
    )
    assert res.exit_code == 0, res.output
    assert "2 points: 2 run, 0 already done, 0 failed" in res.output
    table = pd.read_parquet(out / "sweep.parquet")
    assert table["pools.decode.ep"].tolist() == [8, 16]
    record = json.loads((out / "points" / f"{table['point_id'][0]}.json").read_text())
    assert record["base_overrides"] == ["seed=3"]
    assert (
        json.loads((out / "runs" / table["point_id"][0] / "summary.json").read_text())["sim"][
            "seed"
        ]
        == 3
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--grid", "{missing}"], "no such config file"),
        (["--grid", "{grid}", "--set", "pools.decode.epp=3"], "pools.decode.epp: unknown key"),
        (["--grid", "{grid}", "--address", "127.0.0.1:1"], "--address needs --executor ray"),
        (["--grid", "{badgrid}"], "axes.seed: Input should be a valid list"),
    ],
)
def test_sweep_grid_errors_are_one_line_and_exit_2(tmp_path, config, args, message):
    grid = grid_file(tmp_path, {"seed": [1]})
    badgrid = tmp_path / "bad.yaml"
    badgrid.write_text("axes:\n  seed: 1\n", encoding="utf-8")
    paths = {"missing": tmp_path / "nope.yaml", "grid": grid, "badgrid": badgrid}
    argv = [str(config), *(a.format(**paths) for a in args), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(sweep_grid, argv)
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert res.output.count("error:") == 1 and len(res.output.strip().splitlines()) == 1
    assert "Traceback" not in res.output
