"""What a short run's start leaves out: pandas (the run's tables go to parquet straight from
their numpy columns) and the parse of a large YAML file read before (the user's cache)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deepinfer_sim import validation
from deepinfer_sim.cache import ParsedFiles, cache_folder
from deepinfer_sim.errors import ConfigError
from deepinfer_sim.sim.results import result as result_mod
from deepinfer_sim.sim.results.columns import Categorical, Columns


def _table(n: int) -> Columns:
    rng = np.random.default_rng(5)
    x = rng.random(n)
    x[::3] = np.nan
    codes = (np.arange(n) % 4 - 1).astype(np.int8)  # -1: no label
    return Columns(
        {
            "x": x,
            "k": np.arange(n, dtype=np.int32) * 7,
            "flag": np.arange(n) % 2 == 0,
            "label": Categorical(codes, ("a", "bé", "c")),
            "big": np.arange(n, dtype=np.int64) << 40,
        }
    )


def test_arrow_parts_are_what_from_pandas_makes_of_the_frame() -> None:
    table = _table(23)
    frame = table.to_pandas()
    want = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None)
    parts = list(table.arrow_parts(10))
    assert [len(p) for p in parts] == [10, 10, 3]
    got = pa.concat_tables(parts)
    assert got.cast(want.schema).equals(want)  # pandas 3 makes its labels large_string
    assert frame["label"].isna().sum() == 6  # the negative codes
    assert table["label"].tolist()[:4] == [None, "a", "bé", "c"]


def test_columns_written_to_parquet_read_back_as_their_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(result_mod, "_ROW_GROUP", 7)
    table = _table(30)
    result_mod.write_parquet(table, tmp_path / "t.parquet")
    assert pq.ParquetFile(tmp_path / "t.parquet").num_row_groups == 5
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "t.parquet"), table.to_pandas())
    assert result_mod.parquet_bytes(table) == (tmp_path / "t.parquet").stat().st_size


def test_an_empty_table_is_empty_everywhere(tmp_path: Path) -> None:
    empty = Columns()
    assert empty.empty and len(empty) == 0
    assert empty.to_pandas().equals(pd.DataFrame())
    result_mod.write_parquet(empty, tmp_path / "e.parquet")
    assert pd.read_parquet(tmp_path / "e.parquet").empty
    with pytest.raises(ValueError, match="different lengths"):
        Columns({"a": np.zeros(2), "b": np.zeros(3)})


def _small_run(
    tmp_path: Path, options: list[str], watched: tuple[str, ...]
) -> tuple[list[str], str]:
    """(standard output's lines, standard error) of a 3-request ``run`` with ``options`` in a
    fresh interpreter, the last line the ``watched`` modules it imported."""
    args = ["run", "default", "--set", "workload.max_requests=3", "--set", "workload.repeat=1"]
    args += ["--no-progress", *options, "--out", str(tmp_path / "run")]
    code = (
        "import sys\n"
        "from deepinfer_sim.cli import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        f"print(sorted(m for m in {watched!r} if m in sys.modules))\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip().splitlines(), done.stderr


def test_a_run_without_plots_never_imports_pandas(tmp_path: Path) -> None:
    out, err = _small_run(tmp_path, ["--quiet", "--no-plots"], ("pandas", "matplotlib"))
    assert out[-1] == "[]", (out, err)
    frame = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert len(frame) == 3 and str(frame["state"].dtype) == "category"


def test_a_run_that_plots_and_prints_its_error_bands_imports_neither_pandas_nor_scipy(
    tmp_path: Path,
) -> None:
    """The plots are drawn from the result's columns and the error bands read from the fit
    file: neither needs pandas (~0.3 s to import) or scipy.optimize (~0.25 s)."""
    out, err = _small_run(tmp_path, [], ("pandas", "scipy"))
    assert any(line.startswith("error band: decode") for line in out)
    assert out[-1] == "[]", (out, err)
    assert sorted(p.name for p in (tmp_path / "run" / "plots").iterdir()) == [
        "latency_cdf.png",
        "timeseries.png",
    ]


def test_a_large_yaml_file_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "big.yaml"
    rows = "".join(f"  - [{i}, {i / 7!r}, name{i}]\n" for i in range(3000))
    path.write_text(f"rows:\n{rows}flag: true\nnone: null\n")
    assert path.stat().st_size >= validation._PARSED_MIN_BYTES
    first = validation.read_yaml(path)
    parses = []
    monkeypatch.setattr(validation, "_parse", lambda *a: parses.append(a))
    again = validation.read_yaml(path)
    assert again == first and not parses
    assert again["rows"][5] == [5, 5 / 7, "name5"] and again["none"] is None
    path.write_text(path.read_text() + "more: 1\n")  # other bytes: parsed again
    validation.read_yaml(path)
    assert len(parses) == 1


def test_a_large_yaml_file_with_a_repeated_key_fails_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "dup.yaml"
    path.write_text("a: 1\n" + "# padding\n" * 4000 + "a: 2\n")
    for _ in range(2):
        with pytest.raises(ConfigError, match="duplicate key"):
            validation.read_yaml(path)


def test_a_damaged_or_unwritable_cache_is_a_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    files = ParsedFiles("t", "parser 1")
    raw = b"some bytes"
    assert files.load(raw) == (False, None)
    files.store(raw, {"a": [1, 2.5, "x"]})
    assert files.load(raw) == (True, {"a": [1, 2.5, "x"]})
    assert ParsedFiles("t", "parser 2").load(raw) == (False, None)  # another parser's entry
    (entry,) = Path(cache_folder("t")).iterdir()
    entry.write_bytes(entry.read_bytes()[:-1] + b"\x00")
    assert files.load(raw) == (False, None)
    files.store(raw, {1, 2} | {object()})  # not marshal data: nothing kept
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file where the folder would be
    assert cache_folder("t") == ""
    files.store(raw, 1)
    assert files.load(raw) == (False, None)
