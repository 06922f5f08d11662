"""The plot worker: started only for runs that draw plots, its PNGs the bytes the run's own
process draws, and a worker that fails leaves the plots to the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from deepinfer_sim.cli import main
from deepinfer_sim.sim.results import plot_worker, plots


def _figures() -> list[dict]:
    x = np.sort(np.random.default_rng(3).lognormal(size=40))
    cdf = {
        "lines": [("all", x, np.arange(1, 41) / 40)],
        "vline": (1.0, "SLO 1.0 s"),
        "xlog": True,
        "xlabel": "TTFT (s)",
        "ylabel": "fraction of requests",
    }
    series = {"lines": [("busy", np.arange(8.0), np.linspace(0, 1, 8))], "xlabel": "t (s)"}
    return [
        {"name": "a.png", "title": "latency", "top": 0.88, "panels": [cdf, cdf]},
        {"name": "b.png", "title": None, "top": 0.91, "panels": [series]},
    ]


@pytest.mark.parametrize(
    ("argv", "starts"),
    [
        (["run", "default"], True),
        (["run", "x.yaml", "--set", "seed=2"], True),
        (["run", "default", "--no-plots"], False),
        (["run", "--help"], False),
        (["cost", "default"], False),
        ([], False),
    ],
)
def test_only_a_run_that_draws_plots_starts_a_worker(monkeypatch, argv, starts) -> None:
    started = []
    monkeypatch.setattr(plot_worker, "start", lambda: started.append(True))
    plot_worker.prestart_for(argv)
    assert bool(started) == starts


def test_the_worker_draws_the_bytes_this_process_draws() -> None:
    figures = _figures()
    worker = plot_worker.PlotWorker()
    worker.submit(figures)
    got = worker.result()
    assert got is not None
    assert got == plots.render_here(figures)
    assert [name for name, _ in got] == ["a.png", "b.png"]
    assert all(data.startswith(b"\x89PNG") for _, data in got)


def test_a_worker_that_dies_answers_nothing_and_the_run_draws_itself(tmp_path, monkeypatch):
    worker = plot_worker.PlotWorker()
    worker.stop()  # killed before it got anything
    worker.submit(_figures())
    assert worker.result() is None
    dead = plot_worker.PlotWorker()
    dead.stop()
    monkeypatch.setattr(plot_worker, "_worker", dead)
    out = tmp_path / "run"
    args = ["run", "default", "--set", "workload.max_requests=10", "--quiet", "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert plot_worker.take() is None  # the run took it
    assert sorted(p.name for p in (out / "plots").iterdir()) == [
        "latency_cdf.png",
        "timeseries.png",
    ]


def test_the_console_script_writes_the_plots_a_run_in_process_writes(tmp_path: Path) -> None:
    """``deepinfer-sim run`` (the entry that starts the worker) and the same run through the
    CLI in this process leave the same PNG bytes."""
    small = ["--set", "workload.max_requests=10", "--quiet", "--no-progress"]
    code = (
        "import sys\n"
        "from deepinfer_sim.entry import main\n"
        f"sys.argv = ['deepinfer-sim', 'run', 'default', *{small!r}, '--out', "
        f"{str(tmp_path / 'script')!r}]\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    res = CliRunner().invoke(main, ["run", "default", *small, "--out", str(tmp_path / "here")])
    assert res.exit_code == 0, res.output
    for name in ("latency_cdf.png", "timeseries.png"):
        script = (tmp_path / "script" / "plots" / name).read_bytes()
        assert script == (tmp_path / "here" / "plots" / name).read_bytes(), name


def test_a_worker_that_hangs_is_killed_and_answers_nothing(monkeypatch):
    """A worker past the wait (here: one that never reads its input) is stopped; the run then
    draws the plots itself."""
    monkeypatch.setattr(plot_worker, "_WAIT_S", 0.5)
    worker = plot_worker.PlotWorker.__new__(plot_worker.PlotWorker)
    worker._proc = subprocess.Popen(  # a process that holds stdin open and says nothing
        [sys.executable, "-c", "import time; time.sleep(60)"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    worker._thread = None
    worker._pngs = None
    worker.submit(_figures())
    assert worker.result() is None
    assert worker._proc.poll() is not None  # killed
