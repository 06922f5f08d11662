"""Planner commands: ``deepinfer-sim sweep grid`` and ``deepinfer-sim report``.

Thin shells over :mod:`deepinfer_sim.planner`. They are registered on the main group in
``cli.py``; they also stand alone (tests invoke them directly), so they turn a UserError into the
same one ``error:`` line and exit status 2 themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .cli_common import (
    console,
    default_out,
    overrides_option,
    user_errors,
    writable_dir,
    writable_file,
)
from .errors import UserError

_sweep_overrides = overrides_option(
    "Override a config value for every point, e.g. --set workload.max_requests=2000 (repeatable)."
)


@click.command("grid")
@click.argument("config")
@click.option(
    "--grid",
    "grid_file",
    required=True,
    metavar="GRID.yaml",
    help="Grid file: {mode: cartesian|one_at_a_time, base: {...}, axes: {dotted.key: [...]}}.",
)
@click.option(
    "--workers", type=click.IntRange(1), default=1, show_default=True, help="Points at a time."
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: worker processes; ray: Ray tasks (needs the `ray` extra).",
)
@click.option(
    "--address",
    default=None,
    metavar="ADDR",
    help="Ray cluster address (default: start a local Ray with --workers CPUs).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    help="Output folder (default runs/<scenario>-<grid name>).",
)
@_sweep_overrides
@click.option("--plots", is_flag=True, help="Write each point's PNG plots (off for speed).")
@click.option(
    "--retries",
    type=click.IntRange(0),
    default=1,
    show_default=True,
    help="Runs again a point whose worker process died (killed, out of memory) this many times.",
)
@user_errors
def sweep_grid(
    config: str,
    grid_file: str,
    workers: int,
    executor: str,
    address: str | None,
    out_dir: str | None,
    overrides: tuple[str, ...],
    plots: bool,
    retries: int,
) -> None:
    """Run CONFIG once per point of a grid of overrides and tabulate the results.

    Writes DIR/sweep.parquet (one row per point: the grid keys, status, error, wall_s and the
    flattened summary), DIR/points/<id>.json, each point's run in DIR/runs/<id>/ and
    DIR/config.resolved.yaml: CONFIG as read at the start, which every point is cut from
    (editing CONFIG during the sweep changes nothing in it). Re-running into the same DIR skips
    points already finished ok for the same resolved scenario (failed points run again). A
    point whose worker process dies runs again (--retries), then fails alone. Exit status 1
    when a point failed.
    """
    from .planner.grid import load_grid
    from .planner.snapshot import Snapshot
    from .planner.sweep import TABLE, run_sweep

    if address is not None and executor != "ray":
        raise UserError("--address needs --executor ray")
    # the file is read once, here: the grid is expanded against this snapshot and every point,
    # in every worker, is cut from it, so editing the file while the sweep runs changes nothing
    snap = Snapshot.of(config, overrides)
    points = load_grid(grid_file, snap)
    if out_dir is None:
        out_dir = str(default_out(snap.scenario().name, f"-{Path(grid_file).stem}"))
    writable_dir(out_dir)
    table = run_sweep(
        snap,
        points,
        out_dir,
        workers=workers,
        executor="ray" if executor == "ray" else "local",
        ray_address=address,
        progress=True,
        plots=plots,
        retries=retries,
    )
    keys = list(dict.fromkeys(k for p in points for k in p.params))
    _print_sweep(table, keys)
    ran, skipped = len(table.attrs.get("ran", [])), len(table.attrs.get("skipped", []))
    failed = int((table["status"] != "ok").sum()) if len(table) else 0
    click.echo(
        f"{len(table)} points: {ran} run, {skipped} already done, {failed} failed; "
        f"table in {Path(out_dir) / TABLE}"
    )
    if failed:
        for _, row in table[table["status"] != "ok"].iterrows():
            click.echo(f"failed {row['point_id']}: {row['error']}", err=True)
        raise click.exceptions.Exit(1)


_SHOWN = (
    ("latency.ttft_s.p99", "TTFT p99 ms", "ms"),
    ("latency.tpot_s.p99", "TPOT p99 ms", "ms"),
    ("throughput.output_tok_per_s", "out tok/s", ""),
    ("goodput.fraction_of_completed", "good", "%"),
    ("cost.usd_per_mtok_output", "$/M out", "$"),
)


def _cell(v: Any, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        if unit == "ms":
            return f"{v * 1e3:,.1f}"
        if unit == "%":
            return f"{v * 100:.3g}%"
        if unit == "$":
            return f"{v:,.3g}"
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _print_sweep(table: Any, keys: list[str], limit: int = 60) -> None:
    from rich.table import Table

    if table.empty:
        return
    # only the grid keys that change between points; a key shows its last two segments
    keys = [k for k in keys if k in table.columns and table[k].astype(str).nunique() > 1]
    t = Table(title="sweep", header_style="bold")
    t.add_column("point", no_wrap=True)
    for k in keys:
        t.add_column(".".join(k.split(".")[-2:]), justify="right")
    t.add_column("status")
    shown = [(c, label, unit) for c, label, unit in _SHOWN if c in table.columns]
    for _, label, _ in shown:
        t.add_column(label, justify="right")
    for _, row in table.head(limit).iterrows():
        t.add_row(
            str(row["point_id"]),
            *(_cell(row.get(k)) for k in keys),
            str(row["status"]),
            *(_cell(row[c], unit) for c, _, unit in shown),
        )
    con = console()  # piped: as wide as $COLUMNS or 240, never cut to rich's default 80
    con.print(t)
    if len(table) > limit:
        con.print(f"... {len(table) - limit} more rows in the table")


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN_DIR [RUN_DIR ...]")
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False),
    help="HTML file (default RUN_DIR/report.html for one run, ./report.html for several).",
)
@user_errors
def report(run_dirs: tuple[str, ...], out_file: str | None) -> None:
    """One self-contained HTML page for one run, or several compared with the first."""
    from .sim.results.report import render_report

    if out_file is not None:  # a file the user named; the default is checked as it is written
        writable_file(out_file)
    else:
        out_file = str(Path(run_dirs[0]) / "report.html") if len(run_dirs) == 1 else "report.html"
    out = render_report([Path(d) for d in run_dirs], Path(out_file))
    click.echo(f"wrote {out}")
