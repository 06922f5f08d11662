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
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...scenario import Scenario, dump_scenario
from .columns import Columns
from .files import Output, atomic_write, text_output, write_outputs, write_text
from .metrics import round_floats

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa


__all__ = ["Result", "write_parquet", "write_run_error", "write_text"]

_ROW_GROUP = 1 << 18
"""Rows converted and written at a time: a parquet file is written without an Arrow copy of the
whole frame."""


def _arrow_parts(table: pd.DataFrame | Columns) -> Iterator[pa.Table]:
    """``table`` as Arrow tables of :data:`_ROW_GROUP` rows (a DataFrame through
    ``from_pandas``, without its index)."""
    if isinstance(table, Columns):
        yield from table.arrow_parts(_ROW_GROUP)
        return
    import pyarrow as pa

    first = pa.Table.from_pandas(table.iloc[:_ROW_GROUP], preserve_index=False)
    yield first
    for start in range(_ROW_GROUP, len(table), _ROW_GROUP):
        part = table.iloc[start : start + _ROW_GROUP]
        yield pa.Table.from_pandas(part, schema=first.schema, preserve_index=False)


def _write_parquet_to(table: pd.DataFrame | Columns, where: Any) -> None:
    import pyarrow.parquet as pq

    parts = _arrow_parts(table)
    first = next(parts)
    with pq.ParquetWriter(where, first.schema) as out:
        out.write_table(first)
        for part in parts:
            out.write_table(part)


def parquet_bytes(table: pd.DataFrame | Columns) -> int:
    """The size of ``table``'s parquet file, measured by writing it to a sink that keeps
    nothing."""
    import pyarrow as pa

    sink = pa.MockOutputStream()
    _write_parquet_to(table, sink)
    return int(sink.size())


def write_parquet(table: pd.DataFrame | Columns, path: Path) -> None:
    """``table`` as a parquet file (no index), a row group at a time, written atomically; a
    failure is an :class:`~.files.OutputError` naming ``path``."""
    atomic_write(path, lambda tmp: _write_parquet_to(table, tmp), lambda: parquet_bytes(table))


def parquet_output(name: str, table: pd.DataFrame | Columns) -> Output:
    return Output(name, lambda p: write_parquet(table, p), lambda: parquet_bytes(table))


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
    """A run: its scenario, its tables as columns (``request_table``, ``timeseries_table``;
    ``requests`` and ``timeseries`` give them as DataFrames) and its summary."""

    scenario: Scenario
    request_table: Columns
    timeseries_table: Columns
    summary: dict[str, Any]

    @cached_property
    def requests(self) -> pd.DataFrame:
        """One row per request (``requests.parquet``), built on first use."""
        return self.request_table.to_pandas()

    @cached_property
    def timeseries(self) -> pd.DataFrame:
        """One row per time-series sample (``timeseries.parquet``), built on first use."""
        return self.timeseries_table.to_pandas()

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
            parquet_output("timeseries.parquet", self.timeseries_table),
            parquet_output("requests.parquet", self.request_table),
        ]
        if plots:
            from .plots import plots_output

            outputs.append(plots_output(self))
        write_outputs(out, outputs)
        return out
