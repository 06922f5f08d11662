"""Result of one run, and how it is written to an output folder.

A run folder always holds ``config.resolved.yaml`` (the scenario with every default filled in),
``summary.json``, ``requests.parquet``, ``timeseries.parquet`` and ``plots/*.png``. Files are
written to a temporary name and renamed, so a folder never holds a half-written file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ...scenario import Scenario, dump_scenario
from .metrics import round_floats


def _atomic_write(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def write_text(path: Path, text: str) -> None:
    _atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_run_error(out: Path, exc: BaseException) -> None:
    """``error.json`` in a run's folder: what stopped it (next to its ``config.resolved.yaml``)."""
    import traceback

    from ...errors import UserError

    record = {
        "error": type(exc).__name__,
        "message": " ".join(str(exc).split()),
        "user_error": isinstance(exc, UserError),
        "traceback": None if isinstance(exc, UserError) else traceback.format_exc(),
    }
    write_text(out / "error.json", json.dumps(record, indent=2) + "\n")


@dataclass
class Result:
    scenario: Scenario
    requests: pd.DataFrame
    timeseries: pd.DataFrame
    summary: dict[str, Any]

    def summary_json(self) -> str:
        return json.dumps(round_floats(self.summary), indent=2, sort_keys=False) + "\n"

    def write(self, out_dir: str | Path, plots: bool = True) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / "config.resolved.yaml", dump_scenario(self.scenario))
        _atomic_write(out / "requests.parquet", lambda p: self.requests.to_parquet(p, index=False))
        _atomic_write(
            out / "timeseries.parquet", lambda p: self.timeseries.to_parquet(p, index=False)
        )
        write_text(out / "summary.json", self.summary_json())
        if plots:
            from .plots import write_plots

            write_plots(self, out / "plots")
        return out
