"""Result of one run, and how it is written to an output folder.

A run folder always holds ``config.resolved.yaml`` (the scenario with every default filled in),
``summary.json``, ``timeseries.parquet``, ``requests.parquet`` and ``plots/*.png``, written in
that order, the small ones first, so a disk that fills takes the least (sim/results/files.py:
each file is written to a temporary name and renamed, so a folder never holds a half-written
file, and a failure is one :class:`~.files.OutputError` saying what was written, what was not,
and the space that needs).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ...scenario import Scenario, dump_scenario
from .files import Output, atomic_write, text_output, write_outputs, write_text
from .metrics import round_floats

__all__ = ["Result", "write_parquet", "write_run_error", "write_text"]

_ROW_GROUP = 1 << 18
"""Rows converted and written at a time: a parquet file is written without an Arrow copy of the
whole frame."""


def _write_parquet_to(frame: pd.DataFrame, where: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    first = pa.Table.from_pandas(frame.iloc[:_ROW_GROUP], preserve_index=False)
    with pq.ParquetWriter(where, first.schema) as out:
        out.write_table(first)
        for start in range(_ROW_GROUP, len(frame), _ROW_GROUP):
            part = frame.iloc[start : start + _ROW_GROUP]
            out.write_table(pa.Table.from_pandas(part, schema=first.schema, preserve_index=False))


def parquet_bytes(frame: pd.DataFrame) -> int:
    """The size of ``frame``'s parquet file, measured by writing it to a sink that keeps
    nothing."""
    import pyarrow as pa

    sink = pa.MockOutputStream()
    _write_parquet_to(frame, sink)
    return int(sink.size())


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """``frame`` as a parquet file (no index), a row group at a time, written atomically; a
    failure is an :class:`~.files.OutputError` naming ``path``."""
    atomic_write(path, lambda tmp: _write_parquet_to(frame, tmp), lambda: parquet_bytes(frame))


def parquet_output(name: str, frame: pd.DataFrame) -> Output:
    return Output(name, lambda p: write_parquet(frame, p), lambda: parquet_bytes(frame))


def write_run_error(out: Path, exc: BaseException) -> None:
    """``error.json`` in a run's folder: what stopped it (next to its ``config.resolved.yaml``).
    Best effort: a disk too full for it must not hide the error being recorded."""
    import traceback

    from ...errors import UserError

    record = {
        "error": type(exc).__name__,
        "message": " ".join(str(exc).split()),
        "user_error": isinstance(exc, UserError),
        "traceback": None if isinstance(exc, UserError) else traceback.format_exc(),
    }
    with contextlib.suppress(UserError):  # OutputError: the disk is full, say, or gone
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
        """Write the run's files into ``out_dir``, the small ones first; a file that cannot be
        written stops the rest with one :class:`~.files.OutputError` saying what was written,
        what was not and (disk full) the space those need."""
        out = Path(out_dir)
        outputs = [
            text_output("config.resolved.yaml", dump_scenario(self.scenario)),
            text_output("summary.json", self.summary_json()),
            parquet_output("timeseries.parquet", self.timeseries),
            parquet_output("requests.parquet", self.requests),
        ]
        if plots:
            from .plots import plots_output

            outputs.append(plots_output(self))
        write_outputs(out, outputs)
        return out
