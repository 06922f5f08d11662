"""Start-up time of the simulator (a benchmark, not a test).

Each repeat runs in a fresh Python process, so module imports are cold in-process; the operating
system's file cache is warm (the repeats read the same files), which is what a user sees from the
second run on. Timed, as min and median over the repeats:

* ``import``  — ``import deepinfer_sim.cli``;
* ``load``    — ``load_scenario("default")`` (read and validate the bundled scenario);
* ``trace``   — ``build_source(sc.workload, sc.seed)`` (read and prepare its trace), as
  :func:`deepinfer_sim.simulate` does;
* ``total``   — the three above, in one process;
* ``process`` — wall time of that whole process, interpreter start-up included;
* ``help``    — wall time of ``deepinfer-sim --help``;
* ``first_event`` — wall time of ``deepinfer-sim run configs/default.yaml`` up to the first call
  to the event loop (a hook on ``simpy.Environment.run`` ends the process there);
* ``run_10`` / ``run_10_no_plots`` — wall time of a whole ``deepinfer-sim run`` of the default
  scenario's first 10 requests (``--set workload.max_requests=10``), every output written, with
  and without ``--no-plots``, through the console script's entry (``deepinfer_sim.entry``: with
  plots it starts the plot worker first, ``sim/results/plot_worker.py``).

Children run without ``PYTHONDONTWRITEBYTECODE`` (a user's Python caches compiled modules; with
it set every start compiles the package's modules again, ~0.1 s).

Writes ``benchmarks/results/startup.json`` with the machine's description and prints a table.

    python benchmarks/startup.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from _cli_run import machine, write_report  # benchmarks/ is the script's folder

ROOT = Path(__file__).resolve().parent.parent

PARTS_CODE = """
import json, time
t0 = time.perf_counter()
import deepinfer_sim.cli
t1 = time.perf_counter()
from deepinfer_sim import load_scenario
sc = load_scenario("default")
t2 = time.perf_counter()
from deepinfer_sim.traces.workload import build_source
source = build_source(sc.workload, sc.seed)
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "trace": t3 - t2, "total": t3 - t0}))
"""

FIRST_EVENT_CODE = """
import os, sys, simpy
def first_event(*args, **kwargs):
    print("first event", flush=True)
    os._exit(0)
simpy.Environment.run = first_event
from deepinfer_sim.cli import main
main(["run", "configs/default.yaml", "--quiet", "--no-progress", "--out", sys.argv[1]])
"""


CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _python(code: str, *args: str) -> tuple[float, str]:
    """Run ``code`` in a fresh interpreter; its wall time and stdout."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=CHILD_ENV,
    )
    return time.perf_counter() - t0, done.stdout


RUN_10_CODE = """
import sys
from deepinfer_sim.entry import main  # what the deepinfer-sim script runs (the plot worker too)
flags = ["--no-plots"] if sys.argv[2] == "no-plots" else []
sys.argv = ["deepinfer-sim", "run", "configs/default.yaml", "--set", "workload.max_requests=10",
            "--quiet", "--no-progress", "--out", sys.argv[1], *flags]
main()
"""


def run_10_wall(plots: bool) -> float:
    with tempfile.TemporaryDirectory() as out:
        return _python(RUN_10_CODE, out, "plots" if plots else "no-plots")[0]


def parts() -> dict[str, float]:
    wall, out = _python(PARTS_CODE)
    return {**json.loads(out), "process": wall}


def help_wall() -> float:
    return _python("from deepinfer_sim.cli import main; main(['--help'])")[0]


def first_event_wall() -> float:
    with tempfile.TemporaryDirectory() as out:
        wall, stdout = _python(FIRST_EVENT_CODE, out)
    assert stdout.strip() == "first event", stdout
    return wall


def measure(repeats: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    for _ in range(repeats):
        row = {
            **parts(),
            "help": help_wall(),
            "first_event": first_event_wall(),
            "run_10": run_10_wall(plots=True),
            "run_10_no_plots": run_10_wall(plots=False),
        }
        for key, value in row.items():
            samples.setdefault(key, []).append(value)
    return samples


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "startup.json"))
    args = ap.parse_args()
    _python(PARTS_CODE)  # warm the OS file cache and the bytecode cache
    load_before = os.getloadavg()[0]
    samples = measure(args.repeats)
    stats = {
        key: {"min_s": round(min(v), 3), "median_s": round(statistics.median(v), 3)}
        for key, v in samples.items()
    }
    report = {
        "scenario": "default",
        "date": date.today().isoformat(),
        "machine": machine(),
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "repeats": args.repeats,
        "note": "fresh process per repeat (cold imports); OS file cache warm; "
        "load_average_1min is the machine's load before and after the repeats",
        "seconds": stats,
        "samples": {key: [round(x, 4) for x in v] for key, v in samples.items()},
    }
    write_report(args.out, report)
    print(f"{'part':<12} {'min s':>7} {'median s':>9}")
    for key, s in stats.items():
        print(f"{key:<12} {s['min_s']:>7.3f} {s['median_s']:>9.3f}")


if __name__ == "__main__":
    main()
