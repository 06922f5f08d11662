"""Sweeps: many full simulations, one per grid point, in worker processes or on Ray.

Design notes
------------
- **One base scenario.** The scenario file is read once, at the start, into a
  :class:`~.snapshot.Snapshot` (the resolved scenario, the sweep's ``--set`` applied: the
  mechanism ``plan`` uses), written to ``config.resolved.yaml``; every point, in every worker, is
  cut from it, never from the file again. Editing or removing the file while a sweep runs
  changes nothing in it (a re-run reads the file again: the edited points then run again).
- **A point is a whole run.** Each point applies its own overrides to the snapshot, runs
  :func:`~deepinfer_sim.simulate`, and writes its full Result to
  ``runs/<point_id>/`` (config, summary, requests, timeseries; plots only when asked). A point
  that raises writes ``runs/<point_id>/error.txt`` (the traceback) instead and is recorded with
  ``status: error``; the sweep goes on.
- **A dead worker fails one point.** A worker process killed hard (the out-of-memory killer's
  SIGKILL) takes no other point with it (planner/executors.py): its point runs again in a fresh
  worker ``retries`` times (default 1), then is recorded ``status: error`` with
  ``worker died (exit -9, SIGKILL)...``; points running elsewhere or not yet started are
  untouched. Each record says how many ``attempts`` it took.
- **One file per finished point.** The driver writes each point's row to
  ``points/<point_id>.json`` (temporary file + rename, so a killed sweep never leaves half a
  row). The table ``sweep.parquet`` is rebuilt from those files at the end, in grid order: one
  row per point, the grid keys as columns, then ``status``, ``error``, ``wall_s`` and the run's
  summary flattened to dotted columns (``latency.ttft_s.p99``, ``cost.usd_per_mtok_output``...).
- **Resume.** A point whose ``points/<id>.json`` says ``ok`` *for the same resolved scenario*
  (a hash of its fully resolved config, so an edited config file or a different ``--set``
  re-runs it) is skipped. The snapshot gives the scenario reading the file gives, byte for byte,
  so a folder written by a sweep that read the file for every point resumes the same. Points
  that ended in an error are run again: errors are usually transient (a killed worker) or fixed
  between attempts, and a run is the only way to know.
- **Executors.** ``local`` uses :class:`~.executors.WorkerPool` (fork on Linux: workers start at
  once with the simulator imported, and a script needs no ``__main__`` guard; spawn elsewhere);
  ``workers=1`` runs in this process (a hard kill there ends the sweep: re-run it to resume).
  ``ray`` sends each point as a Ray task (one CPU each; Ray's ``max_retries`` is ``retries``)
  and needs the optional ``ray`` extra. The driver writes ``points/`` and the table; each task
  writes its own ``runs/<id>/``, so on a multi-machine Ray cluster ``out_dir`` must be on a
  shared filesystem.
- **Validation first.** Every point's scenario is loaded before any run, so a typo fails at once.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from hashlib import sha1
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from ..errors import UserError
from ..scenario import dump_scenario
from ..sim.results.files import atomic_write, write_text
from ..sim.run import simulate
from .executors import Failed, WorkerPool, import_ray, ray_context
from .grid import GridPoint, check_points
from .snapshot import Snapshot, snapshot_of

TABLE = "sweep.parquet"
POINTS = "points"
RUNS = "runs"
RESOLVED = "config.resolved.yaml"

# Summary sections flattened into the table except these (per-class / per-tier breakdowns and
# echoes of the config): they stay in each run's summary.json.
SKIP_METRICS = (
    "requests.rejected_by_reason",
    "prefill.by_tier",
    "cache.by_class",
    "cost.revenue_usd_per_hour_by_class",
    "eplb.by_pool",
    "storage.ttl_s",
    "goodput.slo",
)


def flatten(obj: Mapping[str, Any], prefix: str = "", skip: Iterable[str] = ()) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``. Lists and ``None`` leaves are dropped, as are the
    dotted prefixes in ``skip``."""
    skip = tuple(skip)
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if name in skip or value is None or isinstance(value, list | tuple):
            continue
        if isinstance(value, Mapping):
            out.update(flatten(value, name, skip))
        else:
            out[name] = value
    return out


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _fingerprint(scenario_yaml: str) -> str:
    return sha1(scenario_yaml.encode()).hexdigest()


def run_point(task: dict[str, Any]) -> dict[str, Any]:
    """Run one point (in a worker process or a Ray task) and return its record.

    Never raises for a failing run: the exception becomes ``status: error`` and its traceback
    goes to ``runs/<id>/error.txt``.
    """
    t0 = time.perf_counter()
    run_dir = Path(task["run_dir"])
    record: dict[str, Any] = {"point_id": task["point_id"], "status": "ok", "error": None}
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").unlink(missing_ok=True)
        sc = task["snapshot"].scenario(task["overrides"])
        result = simulate(sc)
        result.write(run_dir, plots=task["plots"])
        record["metrics"] = flatten(json.loads(result.summary_json()), skip=SKIP_METRICS)
    except Exception as exc:
        record.update(status="error", error=_one_line(f"{type(exc).__name__}: {exc}"))
        record["metrics"] = {}
        with contextlib.suppress(OSError):
            (run_dir / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
    record["wall_s"] = round(time.perf_counter() - t0, 3)
    return record


# ---- executors ----------------------------------------------------------------------------------


def _local(
    tasks: list[dict[str, Any]],
    workers: int,
    done: Callable[[dict[str, Any]], None],
    started: Callable[[], None],
    retries: int = 1,
    pause: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
) -> None:
    """Run the tasks in ``workers`` processes (:class:`~.executors.WorkerPool`): a point whose
    worker dies is run again ``retries`` times, then recorded failed with the exit status; the
    other points go on. ``workers=1`` runs the points in this process."""
    if workers <= 1 or len(tasks) <= 1:
        started()
        for task in tasks:
            done(run_point(task))
        return
    # every worker is forked here, before `started` starts the progress bar's thread: no fork
    # with a second thread running (a replacement for a dead worker forks under `pause`)
    with WorkerPool(min(workers, len(tasks)), pause=pause) as pool:
        started()
        keys = [t["point_id"] for t in tasks]
        for i, out, attempts in pool.imap(run_point, [(t,) for t in tasks], keys, retries):
            if isinstance(out, Failed):
                record = _failed(tasks[i], str(out))
                with contextlib.suppress(OSError):
                    Path(tasks[i]["run_dir"]).mkdir(parents=True, exist_ok=True)
                    (Path(tasks[i]["run_dir"]) / "error.txt").write_text(
                        f"{out}\nNo traceback: the worker process was killed (SIGKILL is what the "
                        "out-of-memory killer sends) or crashed in native code.\n",
                        encoding="utf-8",
                    )
            else:
                record = out
            done({**record, "attempts": attempts})


def _ray(
    tasks: list[dict[str, Any]],
    workers: int,
    address: str | None,
    done: Callable[[dict[str, Any]], None],
    retries: int = 1,
) -> None:
    if not tasks:
        return
    with ray_context(workers, address) as ray:
        # Ray re-runs a task whose worker died (not one that raised) `max_retries` times
        remote = ray.remote(num_cpus=1, max_retries=retries)(run_point)
        pending = {remote.remote(t): t for t in tasks}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                task = pending.pop(ref)
                try:
                    record = ray.get(ref)
                except Exception as exc:  # the task's worker died
                    record = _failed(task, f"ray task failed: {type(exc).__name__}: {exc}")
                done(record)


def _failed(task: Mapping[str, Any], message: str) -> dict[str, Any]:
    return {
        "point_id": task["point_id"],
        "status": "error",
        "error": _one_line(message),
        "metrics": {},
        "wall_s": None,
    }


# ---- the sweep ----------------------------------------------------------------------------------


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _row(point: GridPoint, record: Mapping[str, Any] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"point_id": point.point_id, **point.params}
    if record is None:
        row.update(status="missing", error="no result", wall_s=None)
        return row
    row.update(status=record.get("status"), error=record.get("error"), wall_s=record.get("wall_s"))
    for key, value in (record.get("metrics") or {}).items():
        row[f"summary.{key}" if key in row else key] = value
    return row


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def build_table(points: Sequence[GridPoint], out_dir: str | Path) -> pd.DataFrame:
    """The sweep table from ``out_dir/points/*.json``: one row per point, in grid order."""
    folder = Path(out_dir) / POINTS
    rows = [_row(p, _read_record(folder / f"{p.point_id}.json")) for p in points]
    rows = [{k: _cell(v) for k, v in r.items()} for r in rows]
    frame = pd.DataFrame(rows)
    for col in frame.columns:  # parquet columns hold one type: mixed ones become text
        if frame[col].dtype == object:
            kinds = {type(v) for v in frame[col] if v is not None and v == v}
            if len(kinds) > 1:
                frame[col] = frame[col].map(lambda v: v if v is None else str(v))
    return frame


def run_sweep(
    config: str | Path | Snapshot,
    points: Sequence[GridPoint | Mapping[str, Any]],
    out_dir: str | Path,
    workers: int = 1,
    executor: Literal["local", "ray"] = "local",
    ray_address: str | None = None,
    base_overrides: Sequence[str] = (),
    progress: bool = True,
    plots: bool = False,
    retries: int = 1,
) -> pd.DataFrame:
    """Run every point of a sweep and return its table (also written to ``out_dir/sweep.parquet``).

    ``config`` is a scenario file or bundled name, read once here (with ``base_overrides``)
    into a :class:`~.snapshot.Snapshot`, or a Snapshot already taken (``base_overrides``
    applied on top of it); every point is cut from it, and it is written to
    ``out_dir/config.resolved.yaml``.
    ``points`` are :class:`GridPoint`\\ s (from :func:`~deepinfer_sim.planner.load_grid`) or
    plain mappings of dotted overrides. Points already finished ``ok`` in ``out_dir`` for the
    same resolved scenario are skipped; ``table.attrs["ran"]`` and ``["skipped"]`` list the ids.
    ``progress`` shows a bar when stderr is a terminal. A point whose worker process dies (killed
    by the out-of-memory killer, say) runs again up to ``retries`` times, then is recorded
    failed with the exit status; the other points go on.
    """
    if executor not in ("local", "ray"):
        raise UserError(f"executor {executor!r}: expected 'local' or 'ray'")
    if workers < 1:
        raise UserError(f"workers {workers}: expected at least 1")
    if retries < 0:
        raise UserError(f"retries {retries}: expected at least 0")
    if executor == "ray":
        import_ray()
    grid = [GridPoint.of(p) for p in points]
    ids = [p.point_id for p in grid]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise UserError(f"the sweep lists the same point twice (point {dup})")
    # the file is read once, here (or was, by the caller): every point, in every worker, is cut
    # from this snapshot, so editing the file while the sweep runs changes nothing in it
    snap = snapshot_of(config, [str(s) for s in base_overrides])
    scenarios = check_points(snap, grid)
    prints = [_fingerprint(dump_scenario(sc)) for sc in scenarios]

    out = Path(out_dir)
    (out / POINTS).mkdir(parents=True, exist_ok=True)
    (out / RUNS).mkdir(parents=True, exist_ok=True)
    write_text(out / RESOLVED, snap.text)  # what this sweep ran its points from
    tasks: list[dict[str, Any]] = []
    skipped: list[str] = []
    meta: dict[str, dict[str, Any]] = {}
    for p, fp in zip(grid, prints, strict=True):
        old = _read_record(out / POINTS / f"{p.point_id}.json")
        if old is not None and old.get("status") == "ok" and old.get("scenario_hash") == fp:
            skipped.append(p.point_id)
            continue
        meta[p.point_id] = {
            "overrides": p.overrides,
            "params": p.params,
            "config": snap.source,
            "base_overrides": list(snap.overrides),
            "scenario_hash": fp,
        }
        tasks.append(
            {
                "point_id": p.point_id,
                "snapshot": snap,
                "overrides": p.as_set(),
                "run_dir": str((out / RUNS / p.point_id).resolve()),
                "plots": plots,
            }
        )

    show = progress and bool(tasks) and sys.stderr.isatty()
    counts = {"ok": 0, "error": 0}
    bar: Any = None
    if show:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        bar_task = bar.add_task("sweep", total=len(tasks))

    live: list[Any] = []

    def started() -> None:
        if bar is not None:
            bar.start()
            live.append(bar)

    @contextlib.contextmanager
    def pause() -> Iterator[None]:
        """The bar's refresh thread stops while a replacement worker forks."""
        for b in live:
            thread = getattr(b.live, "_refresh_thread", None)  # rich's stop() does not join it
            b.stop()
            if thread is not None:
                thread.join(1.0)
        try:
            yield
        finally:
            for b in live:
                b.start()

    ran: list[str] = []

    def done(record: dict[str, Any]) -> None:
        pid = record["point_id"]
        record = {**record, **meta[pid], "finished_at": datetime.now(UTC).isoformat()}
        text = json.dumps(record, indent=1, sort_keys=False, default=str) + "\n"
        write_text(out / POINTS / f"{pid}.json", text)
        ran.append(pid)
        counts["ok" if record["status"] == "ok" else "error"] += 1
        if bar is not None:
            bar.update(
                bar_task,
                advance=1,
                description=f"sweep: {counts['ok']} ok, {counts['error']} error",
            )

    try:
        if executor == "ray":
            started()
            _ray(tasks, workers, ray_address, done, retries)
        else:
            _local(tasks, workers, done, started, retries, pause)
    finally:
        for b in live:
            b.stop()
        table = build_table(grid, out)
        atomic_write(out / TABLE, lambda p: table.to_parquet(p, index=False))
    table.attrs["ran"] = ran
    table.attrs["skipped"] = skipped
    return table
