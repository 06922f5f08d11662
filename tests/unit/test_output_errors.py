"""A disk that fills while results are written: one clear error, nothing half-written.

A run can take hours; writing its results is the last thing it does. When the output disk fills
then (ENOSPC), the user must get one ``error:`` line that names the file and the space the
missing outputs need (exit status 2, no traceback), the run's numbers must still reach the
terminal, the small files (config, summary) must already be on disk, and no temporary file may
be left behind. A ``plan.json`` is never left empty.

CI has no tiny disk to fill, so the disk is filled by hand: the tests make the writers raise what
the libraries raise on a full disk. pyarrow raises ``OSError(28, ...)`` *without a file name*
(which is why the writers must name the file themselves); Python's own files accept some bytes,
then raise ``OSError(28, ...)``.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from deepinfer_sim.cli import main
from deepinfer_sim.sim.results import files

SMALL_RUN = ["--set", "workload.max_requests=40", "--set", "workload.repeat=1"]
NO_SPACE = os.strerror(errno.ENOSPC)


def leftovers(folder: Path) -> list[str]:
    """Temporary files a writer left behind."""
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))


@pytest.fixture
def parquet_disk_full(monkeypatch):
    """pyarrow's full disk: a parquet file named in ``full`` is created, then its first row
    group fails with ``OSError(28)`` and no file name, exactly as pyarrow reports it."""
    import pyarrow.parquet as pq

    full: set[str] = set()
    real = pq.ParquetWriter.write_table

    def write_table(self, table, *args, **kwargs):
        if any(name in Path(str(self.where)).name for name in full):
            raise OSError(
                errno.ENOSPC, f"Error writing bytes to file. Detail: [errno 28] {NO_SPACE}"
            )
        return real(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    return full


@pytest.fixture
def file_disk_full(monkeypatch):
    """Python's full disk: a file named in ``full`` (or its temporary name) accepts
    ``room`` bytes, then every write raises ``OSError(28)``."""
    full: dict[str, int] = {}
    real_open = Path.open

    class Filling:
        def __init__(self, f, room: int) -> None:
            self._f, self._room = f, room

        def write(self, data):
            if len(data) > self._room:
                self._f.write(data[: self._room])
                self._room = 0
                raise OSError(errno.ENOSPC, NO_SPACE)
            self._room -= len(data)
            return self._f.write(data)

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    def open_(self, mode="r", *args, **kwargs):
        f = real_open(self, mode, *args, **kwargs)
        hit = next((n for n in full if self.name == n or self.name.startswith(f".{n}.")), None)
        if hit is not None and any(m in mode for m in "wa"):
            return Filling(f, full[hit])
        return f

    monkeypatch.setattr(Path, "open", open_)
    return full


def test_a_run_whose_disk_fills_says_what_was_written_and_what_it_needs(
    tmp_path, parquet_disk_full
):
    """The disk fills at requests.parquet: one error line names it, says no space is left and
    how much the files not written need; the summary was printed and written first; no
    temporary file stays; exit status 2."""
    parquet_disk_full.add("requests.parquet")
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", "default", "--out", str(out), *SMALL_RUN])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.output.count("error:") == 1
    error = next(line for line in res.output.splitlines() if line.startswith("error:"))
    assert str(out / "requests.parquet") in error and NO_SPACE in error
    assert "need" in error and "free there" in error
    assert "written: config.resolved.yaml, summary.json, timeseries.parquet" in error
    assert "not written: requests.parquet, plots" in error
    assert "TTFT" in res.output  # the run's numbers reached the terminal anyway
    assert json.loads((out / "summary.json").read_text())["requests"]["arrived"] == 40
    assert not (out / "requests.parquet").exists()
    assert leftovers(out) == []


def test_a_timeline_on_a_full_disk_is_one_error_and_no_temporary_file(tmp_path, monkeypatch):
    """``run --timeline``: the trace JSON cannot be written; the error names it and the space
    it needs, and its temporary file is gone."""
    import deepinfer_sim.sim.results.timeline as timeline

    real_json = timeline.json

    class FillingJson:
        """json.dump into a real file writes a little, then the disk is full."""

        @staticmethod
        def dump(obj, f, **kwargs):
            if not hasattr(f, "fileno"):  # a sink that only counts: the real thing
                return real_json.dump(obj, f, **kwargs)
            f.write('{"traceEvents":[')
            raise OSError(errno.ENOSPC, NO_SPACE)

    monkeypatch.setattr(timeline, "json", FillingJson)
    trace = tmp_path / "trace" / "t.json"
    args = ["run", "default", "--out", str(tmp_path / "run"), "--no-plots", *SMALL_RUN]
    res = CliRunner().invoke(main, [*args, "--timeline", str(trace)])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.output.count("error:") == 1
    assert f"{trace}: cannot write ({NO_SPACE}); it needs" in res.output
    assert not trace.exists() and leftovers(trace.parent) == []
    assert (tmp_path / "run" / "requests.parquet").exists()  # the run's own files were written


def test_a_plan_json_is_replaced_whole_or_not_at_all(tmp_path, file_disk_full):
    """Re-writing a plan on a disk with 100 bytes left: the error names plan.json, the previous
    plan.json is still there, whole (it used to be truncated to 0 bytes), and no temporary file
    is left."""
    from deepinfer_sim.planner.plan import Plan, Shape, ShapeResult
    from deepinfer_sim.planner.plan_report import write_plan

    shape = ShapeResult(Shape(2, 1, 8), 10.0, 10, 50.0, status="infeasible")
    plan = Plan(2.7, 0, 0.0, 100.0, [shape])
    write_plan(plan, tmp_path)
    before = (tmp_path / "plan.json").read_bytes()
    file_disk_full["plan.json"] = 100
    with pytest.raises(files.OutputError) as caught:
        write_plan(plan, tmp_path)
    assert str(tmp_path / "plan.json") in str(caught.value) and NO_SPACE in str(caught.value)
    assert "not written: plan.json, shapes.csv, front.csv, frontier.png, front.png" in str(
        caught.value
    )
    assert (tmp_path / "plan.json").read_bytes() == before
    assert leftovers(tmp_path) == []


def test_a_plan_whose_disk_fills_is_one_error_and_exit_2(tmp_path, parquet_disk_full):
    """A plan's worker cannot write its operating point's run: that is the disk's fault, not
    the shape's. The plan prints its table, then one error line naming the file, exit 2 (it
    used to call the failed shape "no shape met the SLOs at any load" and exit 0)."""
    import yaml
    from conftest import tiny_dict

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(**{"workload.max_requests": 60})))
    parquet_disk_full.add("requests.parquet")
    out = tmp_path / "plan"
    res = CliRunner().invoke(
        main,
        ["plan", str(config), "--out", str(out), "--set", "planner.prefill_ep=[2]",
         "--set", "planner.prefill_instances=[1]", "--set", "planner.decode_ep=[8]",
         "--set", "planner.bisection_steps=2", "--set", "planner.probe_seconds=5",
         "--set", "planner.probe_min_requests=50"],
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert "Traceback" not in res.output and len(errors) == 1
    error = errors[0]
    assert "p1x2-d8/requests.parquet" in error and NO_SPACE in error
    assert "no shape met the SLOs at any load" not in res.output
    assert json.loads((out / "plan" / "plan.json").read_text())["complete"] is False
    assert leftovers(out) == []


def test_a_probe_log_line_that_does_not_fit_leaves_no_half_line(tmp_path, file_disk_full):
    """A plan appends each probe to its log. When the disk fills mid-line the half line is cut
    off again (a later line would be glued to it and both lost to a resume), and the error
    names the log."""
    from deepinfer_sim.planner.plan import ProbeLog

    path = tmp_path / "p1x2-d8.jsonl"
    ProbeLog(path).add("probe", "a", {"rate_rps": 1.0})
    before = path.read_bytes()
    file_disk_full[path.name] = 10
    with pytest.raises(files.OutputError, match=r"p1x2-d8\.jsonl: cannot write"):
        ProbeLog(path).add("probe", "b", {"rate_rps": 2.0})
    assert path.read_bytes() == before
    assert ProbeLog(path).done.keys() == {("probe", "a")}


def test_outputs_are_written_small_first_and_the_error_adds_up_what_is_missing(tmp_path):
    """write_outputs writes in order and stops at the first failure; on a full disk the error
    sums the sizes of that output and every one after it (measured without writing them)."""

    def fails(path: Path) -> None:
        raise files.output_error(path, OSError(errno.ENOSPC, NO_SPACE), None)

    outputs = [
        files.text_output("a.json", "x" * 10),
        files.Output("b.parquet", fails, lambda: 2_000),
        files.text_output("c.txt", "y" * 500),
    ]
    with pytest.raises(files.OutputError) as caught:
        files.write_outputs(tmp_path, outputs)
    err = caught.value
    assert (err.written, err.missing, err.needed) == (("a.json",), ("b.parquet", "c.txt"), 2_500)
    assert "need 2.5 kB" in str(err) and (tmp_path / "a.json").read_text() == "x" * 10
    assert not (tmp_path / "c.txt").exists()


def test_a_failed_folder_copy_leaves_neither_a_partial_copy_nor_a_temporary_one(
    tmp_path, monkeypatch
):
    """The plan copies its recommended run: through a temporary folder, so a full disk leaves
    the old copy as it was and no partial one."""
    import shutil

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "summary.json").write_text("{}")
    dst.mkdir()
    (dst / "old.json").write_text("old")

    def copyfile(*args, **kwargs):
        raise OSError(errno.ENOSPC, NO_SPACE)

    monkeypatch.setattr(shutil, "copyfile", copyfile)
    with pytest.raises(files.OutputError, match=f"dst: cannot write \\({NO_SPACE}\\); it needs"):
        files.copy_folder(src, dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]
    assert (dst / "old.json").read_text() == "old"


def test_a_library_error_about_a_full_disk_is_one_line_even_unnamed() -> None:
    """The CLI's last line of defence: an OSError about a full disk that reached it without a
    file name (a writer this module does not wrap) is one error line, exit 2, not a bug's
    traceback."""
    import click

    from deepinfer_sim.cli_common import UserErrorGroup

    @click.group(cls=UserErrorGroup)
    def cli() -> None: ...

    @cli.command()
    def write() -> None:
        raise OSError(errno.ENOSPC, "Error writing bytes to file")

    res = CliRunner().invoke(cli, ["write"])
    assert res.exit_code == 2 and res.output.count("error:") == 1
    assert NO_SPACE in res.output
