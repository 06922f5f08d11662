"""``calibration.sustained``: a layer timed the calibration's way and back to back. The GPU run
is a device call; here its plumbing runs on the CPU with the reference kernels on the toy
model (workload parsing, the windows, the clock samples' parsing, the JSON it writes)."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from deepinfer_sim.calibration import sustained
from deepinfer_sim.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
TOY = str(ROOT / "tests" / "data" / "toy-model.yaml")


def test_workloads_parse_and_bad_ones_are_named():
    ws = sustained.parse_workloads("layer:8192, experts:9x4096,decode:128x4096")
    assert [(w.kind, w.sizes) for w in ws] == [
        ("layer", (8192,)),
        ("experts", (9, 4096)),
        ("decode", (128, 4096)),
    ]
    for bad, says in [
        ("prefil:64", "kind must be one of"),
        ("decode:128", "decode takes AxB"),
        ("layer:0", "layer takes N"),
        ("experts:9xa", "experts takes AxB"),
        ("", "none given"),
    ]:
        with pytest.raises(UserError, match=says):
            sustained.parse_workloads(bad)


def test_clock_rows_keep_what_parses():
    text = (
        "2026/12/07 01:02:03.250, 1980, 650.5, 61\n"
        "2026/12/07 01:02:03.350, [N/A], 650.5, 61\n"
        "timestamp, clocks.sm, power, temp\n"
        "2026/12/07 01:02:03.450, 1755, 700.1, 63\n"
        "2026/12/07 01:02:03.5"
    )
    rows = sustained.parse_clock_rows(text)
    assert [r[1:] for r in rows] == [(1980.0, 650.5, 61.0), (1755.0, 700.1, 63.0)]
    assert rows[1][0] - rows[0][0] == pytest.approx(0.2)


def test_a_cpu_run_writes_every_phase(tmp_path):
    out = tmp_path / "s.json"
    args = ["--model", TOY, "--kernels", "reference", "--device", "cpu", "--hardware", "h200"]
    args += ["--workloads", "layer:32,decode:2x32", "--seconds", "0.6", "--cool", "0"]
    assert sustained.main([*args, "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["model"] == "toy-v4" and res["seconds"] == 0.6
    assert res["layer_experts"] == 2  # the toy's 8 routed experts / EP32 + 1 redundant, rounded up
    assert [w["workload"] for w in res["workloads"]] == ["layer:32", "decode:2x32"]
    for w in res["workloads"]:
        assert w["burst_s"] > 0 and w["sustained_s"] > 0 and w["burst_hot_s"] > 0
        assert w["sustained_over_burst"] == pytest.approx(w["sustained_s"] / w["burst_s"])
        assert len(w["windows"]) >= 1 and all(n >= 1 for _, _, n in w["windows"])
        assert w["windows"][-1][0] >= 0.6
        assert set(w["clocks"]) == {"burst", "sustained", "hot"}


def test_bad_arguments_exit_2_with_one_line(capsys, tmp_path):
    args = ["--model", TOY, "--device", "cpu", "--hardware", "h200", "--out", str(tmp_path / "x")]
    assert sustained.main([*args, "--workloads", "warp:1"]) == 2
    assert sustained.main([*args, "--seconds", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: --workloads 'warp:1'") and "--seconds" in err[1]


@pytest.mark.parametrize("group", [1, 4])
def test_a_partial_duty_idles_after_each_group_of_calls(monkeypatch, group):
    """Every ``group`` calls, one idle gap of busy × (1 / duty − 1) (the sleeps are recorded,
    not slept: nothing here depends on this machine's speed)."""
    sleeps: list[float] = []
    monkeypatch.setattr(sustained.time, "sleep", sleeps.append)
    calls: list[float] = []

    def fn() -> None:
        t = time.perf_counter()
        sum(range(2000))  # a little work, so each call takes time
        calls.append(time.perf_counter() - t)

    windows = sustained.sustained_windows(fn, lambda: None, 0.3, False, duty=0.25, group=group)
    assert sum(n for _, _, n in windows) == len(calls)
    assert len(calls) % group == 0 and len(sleeps) == len(calls) // group
    # at duty 1/4 each gap is three times its group's busy time, which holds the calls' own time
    for i, gap in enumerate(sleeps):
        assert gap >= 3 * sum(calls[i * group : (i + 1) * group])


def test_the_duty_and_group_reach_the_json(tmp_path):
    out = tmp_path / "d.json"
    args = ["--model", TOY, "--kernels", "reference", "--device", "cpu", "--hardware", "h200"]
    args += ["--workloads", "prefill:32", "--seconds", "0.6", "--cool", "0", "--duty", "0.5"]
    assert sustained.main([*args, "--group", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["duty"] == 0.5 and res["group"] == 2
    assert res["workloads"][0]["sustained_s"] > 0


def test_a_duty_outside_0_1_is_refused(capsys, tmp_path):
    args = ["--model", TOY, "--device", "cpu", "--hardware", "h200", "--out", str(tmp_path / "x")]
    assert sustained.main([*args, "--duty", "1.5"]) == 2
    assert sustained.main([*args, "--duty", "0.5", "--group", "0"]) == 2
    err = capsys.readouterr().err
    assert "--duty 1.5" in err and "--group 0" in err


def test_windows_follow_the_window_length():
    """``window`` sets how long each window runs: 0.05 s windows over 0.3 s come to about six,
    where the default half second gives one."""

    def fn() -> None:
        sum(range(2000))

    short = sustained.sustained_windows(fn, lambda: None, 0.3, False, window=0.05)
    default = sustained.sustained_windows(fn, lambda: None, 0.3, False)
    assert len(short) >= 5 and len(default) == 1
    assert all(b[0] > a[0] for a, b in itertools.pairwise(short))
