"""A sweep runs every point from one scenario: the file as it was when the sweep started.

``sweep grid`` runs for a long time, one full simulation per point, in worker processes. Its
table compares the points with each other, so every point must be a variant of the *same* base
scenario: the scenario file is read once, at the start, into a snapshot (the resolved scenario,
``--set`` applied: the mechanism ``plan`` uses, planner/snapshot.py), and every point, in every
worker, is cut from it. Editing or removing the file while the sweep runs changes nothing in it.

A sweep resumes by a hash of each point's resolved scenario. The snapshot gives exactly the
scenario that reading the file gives, so points finished by a sweep that read the file (before
the snapshot) are still found done.

The tiny scenario (60 requests) runs in about a second, so these are real simulations.
"""

from __future__ import annotations

import json
from hashlib import sha1
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from conftest import tiny_dict

from deepinfer_sim.cli_plan import sweep_grid
from deepinfer_sim.planner import sweep as sweep_mod
from deepinfer_sim.planner.grid import GridPoint
from deepinfer_sim.planner.snapshot import Snapshot
from deepinfer_sim.planner.sweep import run_sweep
from deepinfer_sim.scenario import bundled_scenarios, dump_scenario, load_scenario

EDITED = {"cost_model": {"step": {"step_overhead_s": 0.05}}}
COLUMNS = ["point_id", "status", "latency.ttft_s.p99", "latency.tpot_s.p99", "wall_s"]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_dict(**{"workload.max_requests": 60})), encoding="utf-8")
    return path


def three_points() -> list[GridPoint]:
    return [GridPoint({"pools.decode.ep": ep}) for ep in (8, 16, 32)]


def hashes(out: Path) -> dict[str, str]:
    return {
        p.stem: json.loads(p.read_text())["scenario_hash"] for p in (out / "points").glob("*.json")
    }


def test_editing_the_scenario_file_during_a_sweep_changes_nothing_in_it(
    tmp_path, config, monkeypatch
):
    """After the first point the file is replaced by one with a 50 ms step overhead. Every
    later point still simulates the scenario as it was at the start: the same step overhead in
    every run, the same numbers and the same resolved-scenario hashes as a sweep of the
    untouched file."""
    untouched = run_sweep(config, three_points(), tmp_path / "untouched", progress=False)

    overheads: list[float] = []
    real = sweep_mod.simulate

    def simulate_then_edit(sc, *args, **kwargs):
        overheads.append(sc.cost_model.step.step_overhead_s)
        if len(overheads) == 1:
            data = yaml.safe_load(config.read_text())
            config.write_text(yaml.safe_dump({**data, **EDITED}))
        return real(sc, *args, **kwargs)

    monkeypatch.setattr(sweep_mod, "simulate", simulate_then_edit)
    edited = run_sweep(config, three_points(), tmp_path / "edited", progress=False)
    assert len(overheads) == 3 and set(overheads) == {overheads[0]} != {0.05}
    assert (edited["status"] == "ok").all(), edited["error"].tolist()
    cols = [c for c in COLUMNS if c != "wall_s"]
    pd.testing.assert_frame_equal(edited[cols], untouched[cols])
    assert hashes(tmp_path / "edited") == hashes(tmp_path / "untouched")
    snapshot = (tmp_path / "edited" / "config.resolved.yaml").read_text()
    assert "step_overhead_s: 0.05" not in snapshot and snapshot.startswith("name: tiny")


def test_workers_never_read_the_scenario_file(tmp_path, config, monkeypatch):
    """Each simulation deletes the file as it starts, in two worker processes: the points run
    after the first deletion (at least two of the four: a worker takes a new point only when
    its last one is done) are simulated all the same, and none fails."""
    real = sweep_mod.simulate

    def delete_then_simulate(sc, *args, **kwargs):
        config.unlink(missing_ok=True)
        return real(sc, *args, **kwargs)

    monkeypatch.setattr(sweep_mod, "simulate", delete_then_simulate)
    points = [*three_points(), GridPoint({"seed": 2})]
    table = run_sweep(config, points, tmp_path / "sweep", workers=2, progress=False)
    assert not config.exists()
    assert table["status"].tolist() == ["ok"] * 4, table["error"].tolist()
    assert (table["requests.completed"] == 60).all()


def test_points_finished_by_a_sweep_that_read_the_file_are_found_done(tmp_path, config):
    """Each point's hash is the one a sweep that read the file for every point recorded (the
    sha1 of the resolved scenario ``load_scenario`` gives), so such a sweep's folder resumes:
    nothing runs again."""
    points = three_points()
    out = tmp_path / "sweep"
    run_sweep(config, points, out, base_overrides=["seed=3"], progress=False)
    for p in points:
        read = load_scenario(config, ["seed=3", *p.as_set()])
        assert hashes(out)[p.point_id] == sha1(dump_scenario(read).encode()).hexdigest()
    again = run_sweep(config, points, out, base_overrides=["seed=3"], progress=False)
    assert again.attrs["ran"] == [] and len(again.attrs["skipped"]) == 3


GRID_POINTS = [
    {"pools.decode.ep": 16, "seed": 7},
    {"workload.sessions": {"days": 1}},  # a trace scenario switched to sessions
    {"workload.sessions.days": 1, "workload.rate_scale": 2},
    {"policies.admission": {"policy": "queue_length", "max_queued": 5}},
    {"prices.gpu_hour_usd.b200": 7},
    {"policies.eplb.decode": {"period_steps": 5}},
]


@pytest.mark.parametrize("base", [[], ["workload.rate_scale=3"], ["workload.sessions.days=2"]])
def test_the_snapshot_gives_each_point_the_scenario_the_file_gives(base):
    """Cutting a point from the snapshot gives, byte for byte, the scenario that reading the
    file with the sweep's ``--set`` and the point's overrides gives, for every bundled
    scenario. That includes a point that switches a trace scenario to generated sessions: the
    trace's replay speed (``repeat``, ``rate_scale``) is dropped unless a ``--set`` (the
    sweep's or the point's) gave it, as when the file is read."""
    for name in bundled_scenarios():
        snap = Snapshot.of(name, base)
        for over in GRID_POINTS:
            point = GridPoint(over).as_set()
            direct = dump_scenario(load_scenario(name, [*base, *point]))
            assert dump_scenario(snap.scenario(point)) == direct, (name, over)
            assert snap.derive(point).text == direct, (name, over)


def test_sweep_grid_reads_the_file_once_and_keeps_the_snapshot(tmp_path, config, monkeypatch):
    """The command takes the snapshot before anything else and hands it to the grid check and
    the sweep: the scenario file is read once, and the folder keeps what was swept in
    ``config.resolved.yaml``."""
    from deepinfer_sim import scenario as scenario_mod

    reads: list[str] = []
    real = scenario_mod.read_yaml

    def counted(path, *args, **kwargs):
        reads.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(scenario_mod, "read_yaml", counted)
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"mode": "one_at_a_time", "axes": {"pools.decode.ep": [16]}}))
    out = tmp_path / "out"
    argv = [str(config), "--grid", str(grid), "--out", str(out), "--set", "seed=3"]
    res = CliRunner().invoke(sweep_grid, argv)
    assert res.exit_code == 0, res.output
    assert reads == [str(config)]
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["name"] == "tiny" and resolved["seed"] == 3
