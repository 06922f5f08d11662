"""Grid files: what a sweep runs, in what order, and how a mistake in one is reported.

A grid file names dotted scenario keys and the values to try. ``cartesian`` runs every
combination, the last axis varying fastest; ``one_at_a_time`` runs the base scenario once and
then moves one axis at a time away from the base scenario's own value. Every point gets a stable
id (a hash of its overrides) and is loaded against the scenario before anything runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import tiny_dict

from deepinfer_sim.errors import ConfigError
from deepinfer_sim.planner.grid import (
    GridPoint,
    GridSpec,
    expand,
    inline_yaml,
    load_grid,
    point_id,
    read_grid,
)
from deepinfer_sim.scenario import load_scenario


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_dict()), encoding="utf-8")
    return path


def write_grid(tmp_path: Path, data: object, name: str = "grid.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_cartesian_runs_every_combination_last_axis_fastest():
    spec = GridSpec(axes={"pools.decode.ep": [8, 16, 32], "workload.rate_scale": [1, 2]})
    points = expand(spec)
    assert len(points) == 6
    assert [p.overrides for p in points[:3]] == [
        {"pools.decode.ep": 8, "workload.rate_scale": 1},
        {"pools.decode.ep": 8, "workload.rate_scale": 2},
        {"pools.decode.ep": 16, "workload.rate_scale": 1},
    ]
    assert len({p.point_id for p in points}) == 6


def test_base_overrides_reach_every_point_and_an_axis_wins_over_the_base():
    spec = GridSpec(
        base={"workload.max_requests": 50, "pools.decode.ep": 4},
        axes={"pools.decode.ep": [8, 16]},
    )
    points = expand(spec)
    assert [p.overrides for p in points] == [
        {"workload.max_requests": 50, "pools.decode.ep": 8},
        {"workload.max_requests": 50, "pools.decode.ep": 16},
    ]
    assert points[0].as_set() == ["workload.max_requests=50", "pools.decode.ep=8"]


def test_one_at_a_time_runs_the_base_once_then_each_axis_alone(tmp_path, config):
    """The tiny scenario has decode EP 8 and rate scale 1: the EP axis value 8 *is* the base,
    so it is not run twice, and every point shows the value of both axes."""
    grid = write_grid(
        tmp_path,
        {
            "mode": "one_at_a_time",
            "base": {"workload.max_requests": 50},
            "axes": {"pools.decode.ep": [8, 16], "workload.rate_scale": [2.0, 4.0]},
        },
    )
    points = load_grid(grid, config)
    assert [p.overrides for p in points] == [
        {"workload.max_requests": 50},
        {"workload.max_requests": 50, "pools.decode.ep": 16},
        {"workload.max_requests": 50, "workload.rate_scale": 2.0},
        {"workload.max_requests": 50, "workload.rate_scale": 4.0},
    ]
    base_rate = load_scenario(config).workload.rate_scale
    assert points[0].params == {
        "workload.max_requests": 50,
        "pools.decode.ep": 8,
        "workload.rate_scale": base_rate,
    }
    assert points[1].params["workload.rate_scale"] == base_rate
    assert points[2].params["pools.decode.ep"] == 8


def test_point_ids_are_stable_and_ignore_key_order():
    a = GridPoint({"pools.decode.ep": 16, "seed": 3})
    b = GridPoint({"seed": 3, "pools.decode.ep": 16})
    assert a.point_id == b.point_id == point_id({"seed": 3, "pools.decode.ep": 16})
    assert len(a.point_id) == 12
    assert GridPoint({"pools.decode.ep": 32}).point_id != a.point_id
    assert GridPoint.of(["pools.decode.ep=16", "seed=3"]).point_id == a.point_id


@pytest.mark.parametrize(
    "value", [1e-5, 0.5, 3, "roofline", True, None, {"chatbot": 5.0}, [1, 2], "a: b", "1e-5"]
)
def test_override_values_survive_the_set_round_trip(value):
    assert yaml.safe_load(inline_yaml(value)) == value


def test_a_grid_file_loads_and_every_point_is_checked(tmp_path, config):
    grid = write_grid(tmp_path, {"axes": {"pools.decode.ep": [8, 16]}})
    points = load_grid(grid, config)
    assert [p.overrides for p in points] == [{"pools.decode.ep": 8}, {"pools.decode.ep": 16}]
    assert read_grid(grid).mode == "cartesian"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"axes": {}}, "axes: Dictionary should have at least 1 item"),
        ({"axes": {"pools.decode.ep": []}}, "axes.pools.decode.ep: List should have at least 1"),
        (
            {"axis": {"pools.decode.ep": [8]}},
            "axis: unknown key (a grid file has mode, base and axes)",
        ),
        ({"mode": "diagonal", "axes": {"seed": [1]}}, "mode: Input should be 'cartesian'"),
        ({"axes": {"seed": 1}}, "axes.seed: Input should be a valid list"),
        ({"axes": {"seed": [1, 1]}}, "axis 'seed' lists 1 twice"),
        ({"axes": {"pools..ep": [1]}}, "bad key segment"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_a_bad_grid_file_names_the_file_and_the_key(tmp_path, config, data, message):
    grid = write_grid(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_grid(grid, config)
    assert message in str(err.value)
    assert str(grid) in str(err.value)


def test_a_missing_or_unparsable_grid_file_is_a_config_error(tmp_path, config):
    with pytest.raises(ConfigError, match="no such config file"):
        load_grid(tmp_path / "nope.yaml", config)
    bad = tmp_path / "bad.yaml"
    bad.write_text("axes: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="YAML syntax error"):
        load_grid(bad, config)


def test_a_typo_in_an_axis_fails_before_any_run(tmp_path, config):
    grid = write_grid(tmp_path, {"axes": {"pools.decode.epp": [8, 16]}})
    with pytest.raises(ConfigError) as err:
        load_grid(grid, config)
    text = str(err.value)
    assert str(grid) in text and "point 1 (pools.decode.epp=8)" in text
    assert "pools.decode.epp: unknown key" in text


def test_a_bad_value_fails_with_the_scenario_key_path(tmp_path, config):
    grid = write_grid(tmp_path, {"axes": {"pools.decode.ep": [8, 0]}})
    with pytest.raises(ConfigError, match=r"point 2 .*pools\.decode\.ep: Input should be"):
        load_grid(grid, config)


def test_one_at_a_time_with_a_bad_base_names_the_base(tmp_path, config):
    grid = write_grid(
        tmp_path, {"mode": "one_at_a_time", "base": {"nope": 1}, "axes": {"seed": [1, 2]}}
    )
    with pytest.raises(ConfigError, match=r"base: .*nope: unknown key"):
        load_grid(grid, config)
