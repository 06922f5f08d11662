"""What the command line tells a user at the terminal, and where it writes by default.

- A command without ``--out`` writes under ``runs/``, in a folder named after the scenario; a
  scenario ``name`` that would put that folder anywhere else (``--set name=../x``) is refused
  before anything runs, with the key named.
- A run that rejects requests says why on the terminal, reason by reason, with the counts: a
  run that rejects every request must not look like a quiet success.
- ``sweep grid``'s table is as wide as it needs when piped, like every other table.
- A long run in a pipe or a batch job shows a progress line early, not only after 30 s.
"""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from conftest import tiny_dict

from deepinfer_sim.cli import main
from deepinfer_sim.cli_common import Progress

SMALL = ["--set", "workload.max_requests=40", "--set", "workload.repeat=1"]


@pytest.mark.parametrize(
    "args",
    [
        ["run", "default", *SMALL, "--no-plots"],
        ["plan", "default"],
        ["sweep", "ttl", "default", *SMALL, "--no-plots"],
    ],
    ids=["run", "plan", "sweep-ttl"],
)
@pytest.mark.parametrize("name", ["../x", "/tmp/elsewhere", "x/../../y", "../.."])
def test_a_scenario_name_that_escapes_runs_is_refused(tmp_path, monkeypatch, args, name):
    """``--set name=../x`` used to write the run to ``../x``, beside ``runs/``. Now it is one
    error naming the key, exit 2, and nothing is written anywhere."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    res = CliRunner().invoke(main, [*args, "--set", f"name={name}"])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: name: ") and "outside runs/" in res.output
    assert "Traceback" not in res.output
    assert [p.name for p in tmp_path.iterdir()] == ["work"] and list(cwd.iterdir()) == []


def test_sweep_grid_refuses_an_escaping_name_too(tmp_path, monkeypatch):
    config, grid = tmp_path / "c.yaml", tmp_path / "g.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(name="../../x")))
    grid.write_text(yaml.safe_dump({"axes": {"pools.decode.ep": [8]}}))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["sweep", "grid", str(config), "--grid", str(grid)])
    assert res.exit_code == 2 and "error: name: '../../x' would put" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "g.yaml"]


def test_a_name_that_stays_under_runs_is_fine(tmp_path, monkeypatch):
    """A name with a folder in it that stays under runs/ is a folder there."""
    monkeypatch.chdir(tmp_path)
    args = ["run", "default", *SMALL, "--no-plots", "-q", "--set", "name=team/a"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "runs" / "team" / "a" / "summary.json").exists()


def test_a_run_that_rejects_requests_says_why_on_the_terminal(tmp_path):
    """policies.admission turns away most prompts of a burst: the terminal lists
    ``queue_length`` with its count and what it means, under the requests line."""
    res = CliRunner().invoke(
        main,
        ["run", "default", *SMALL, "--no-plots", "--out", str(tmp_path / "r"),
         "--set", "workload.rate_scale=10000",
         "--set", "policies.admission={policy: queue_length, max_queued: 1}"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = yaml.safe_load((tmp_path / "r" / "summary.json").read_text())
    by_reason = summary["requests"]["rejected_by_reason"]
    assert by_reason.get("queue_length", 0) > 0
    n = by_reason["queue_length"]
    line = next(x for x in res.output.splitlines() if "queue_length:" in x)
    assert line.startswith("rejected") and f"{n:,} (" in line
    assert "max_queued prompts already waiting" in line


def test_sweep_grid_tables_are_not_cut_to_80_columns_when_piped(monkeypatch, capsys):
    """The sweep's table used to build its own rich Console: 80 columns in a pipe, so a few
    grid keys squeezed every number into an ellipsis. It uses the shared console now."""
    from deepinfer_sim.cli_plan import _print_sweep

    monkeypatch.delenv("COLUMNS", raising=False)
    keys = [f"policies.some_long_axis_name_{i}.value" for i in range(4)]
    row = {"point_id": "0123456789ab", "status": "ok"}
    table = pd.DataFrame(
        [{**row, **{k: 1000 + j for k in keys}, "latency.ttft_s.p99": 0.123456} for j in range(2)]
    )
    _print_sweep(table, keys)
    out = capsys.readouterr().out
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) > 80
    assert "TTFT p99 ms" in out and "123.5" in out


def test_the_first_progress_line_comes_within_seconds(monkeypatch, capsys):
    """Off a terminal the progress line is rate-limited to one per 30 s, but the first one
    comes 5 s in: a long run never leaves a batch log silent for its first half-minute."""
    import time

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    p = Progress(True)
    for wall, sim in ((1.0, 10.0), (6.0, 60.0), (20.0, 200.0), (37.0, 370.0)):
        now[0] = 1000.0 + wall
        p(sim, int(sim), 1000)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "progress: 60 simulated s",  # 6 s in: the first line
        "progress: 370 simulated s",  # 30 s after it
    ]
