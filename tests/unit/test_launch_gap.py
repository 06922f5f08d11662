"""``calibration.launch_gap``: graphed calls timed one replay after a sync (the calibration's
way) and back to back. The GPU run is a device call; its plumbing runs here on the CPU with the
reference kernels on the toy model (no graphs: the call itself timed both ways)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepinfer_sim.calibration import launch_gap

ROOT = Path(__file__).resolve().parents[2]
TOY = str(ROOT / "tests" / "data" / "toy-model.yaml")


def test_every_part_is_timed_both_ways_on_the_cpu():
    res = launch_gap.measure(
        [TOY], "cpu", "reference", 3, "h200", ((1, 32), (2, 64)), ((4, 16), (99, 8)), (32,), 2
    )
    model = res["models"]["toy-v4"]
    assert res["replays"] == 3 and res["device"] == "cpu"
    assert [(r["part"], r["shape"]) for r in model["rows"]] == [
        ("decode", [1, 32]),
        ("decode", [2, 64]),
        ("moe", [4, 16]),
        ("moe", [8, 8]),  # capped at the toy's 8 routed experts
        ("prefill", [32, 0]),
    ]
    for r in model["rows"]:
        assert r["single_s"] > 0 and r["amortized_s"] > 0
        assert r["gap_s"] == pytest.approx(r["single_s"] - r["amortized_s"])
    assert set(model["median_gap_s"]) == {"decode", "moe", "prefill"}


def test_the_command_line_refuses_bad_arguments(capsys, tmp_path):
    out = tmp_path / "g.json"
    assert launch_gap.main(["--replays", "1", "--out", str(out)]) == 2
    assert launch_gap.main(["--models", ",", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --replays must be at least 2", "error: --models: none given"]
    assert not out.exists()
