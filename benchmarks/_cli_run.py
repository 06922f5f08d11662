"""What the end-to-end benchmarks share: one ``deepinfer-sim run`` in a child process, timed with
its peak RSS, the machine's one-line description, and writing a report."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_report(path: str | Path, report: dict[str, Any]) -> None:
    """``report`` as indented JSON at ``path`` (its folder made if missing)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def run_default(overrides: list[str], plots: bool = False) -> dict[str, Any]:
    """``deepinfer-sim run default --quiet`` with ``overrides`` in a fresh process: its wall
    seconds (start-up and output writing included), peak RSS and what it simulated."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "deepinfer_sim.cli", "run", "default", "--quiet"]
        cmd += ["--out", out]
        for kv in overrides:
            cmd += ["--set", kv]
        if not plots:
            cmd.append("--no-plots")
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        wall = time.perf_counter() - t0
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        summary = json.loads((Path(out) / "summary.json").read_text())
    return {
        "wall_s": wall,
        # ru_maxrss of children is the largest child so far: only a new maximum is this run's
        "peak_rss_mib": peak_kib / 1024 if peak_kib > before else float("nan"),
        "simulated_s": summary["sim"]["simulated_s"],
        "requests": summary["requests"]["arrived"],
        "sim_wall_s": summary["sim"]["wall_s"],
        "events": summary["sim"]["events"],
    }
