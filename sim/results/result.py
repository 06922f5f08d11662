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


_ROW_GROUP = 1 << 18
"""Rows converted and written at a time: a parquet file is written without an Arrow copy of the
whole frame."""


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """``frame`` as a parquet file (no index), a row group at a time, written atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(tmp: Path) -> None:
        first = pa.Table.from_pandas(frame.iloc[:_ROW_GROUP], preserve_index=False)
        with pq.ParquetWriter(tmp, first.schema) as out:
            out.write_table(first)
            for start in range(_ROW_GROUP, len(frame), _ROW_GROUP):
                part = frame.iloc[start : start + _ROW_GROUP]
                out.write_table(
                    pa.Table.from_pandas(part, schema=first.schema, preserve_index=False)
                )

    _atomic_write(path, write)


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
        write_parquet(self.requests, out / "requests.parquet")
        write_parquet(self.timeseries, out / "timeseries.parquet")
        write_text(out / "summary.json", self.summary_json())
        if plots:
            from .plots import write_plots

            write_plots(self, out / "plots")
        return out
