"""``deepinfer-sim timeline RUN_DIR``: a finished run as Perfetto/Chrome trace-event JSON
(sim/results/timeline.py says what the tracks are built from)."""

from __future__ import annotations

from typing import Any

import click

from .cli_common import console, user_errors, writable_file


@click.command()
@click.argument("run_dir", metavar="RUN_DIR")
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False),
    help="Trace JSON to write (default RUN_DIR/timeline.json).",
)
@click.option("--from", "t_from", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Window start, simulated seconds.")  # fmt: skip
@click.option("--to", "t_to", type=click.FloatRange(min=0), default=None,
              help="Window end, simulated seconds (default: the end of the run).")  # fmt: skip
@click.option("--max-requests", type=click.IntRange(0), default=None,
              help="Requests drawn with their stages and flows (default 2,000).")  # fmt: skip
@click.option("--max-events", type=click.IntRange(1), default=None,
              help="Hard cap on trace events (default 500,000).")  # fmt: skip
@click.option("--ranks", is_flag=True, help="One track per decode rank as well.")
@user_errors
def timeline(
    run_dir: str,
    out_file: str | None,
    t_from: float,
    t_to: float | None,
    max_requests: int | None,
    max_events: int | None,
    ranks: bool,
) -> None:
    """Export RUN_DIR (a `deepinfer-sim run` folder) as a timeline for ui.perfetto.dev.

    Built from requests.parquet: prefill, decode and P→D link tracks show busy periods. For the
    decode groups' engine steps and the storage nodes, export while running: `deepinfer-sim run
    CONFIG --timeline FILE`.
    """
    from pathlib import Path

    from .sim.results.timeline import (
        DEFAULT_MAX_EVENTS,
        DEFAULT_MAX_REQUESTS,
        TimelineOptions,
        build_timeline,
        sources_from_run_dir,
        write_timeline,
    )

    options = TimelineOptions(
        t_from=t_from,
        t_to=float("inf") if t_to is None else t_to,
        max_requests=DEFAULT_MAX_REQUESTS if max_requests is None else max_requests,
        max_events=DEFAULT_MAX_EVENTS if max_events is None else max_events,
        ranks=ranks,
    )
    src = sources_from_run_dir(run_dir)
    out = writable_file(out_file or Path(run_dir) / "timeline.json")
    trace = build_timeline(src, options)
    write_timeline(trace, out)
    console().print(timeline_line(trace, out))


def timeline_line(trace: dict[str, Any], out: object) -> str:
    from pathlib import Path

    other = trace["otherData"]
    size = Path(str(out)).stat().st_size / 1e6
    note = " (capped: see otherData.truncated)" if "truncated" in other else ""
    return (
        f"timeline {out}: {other['events']:,} events, {size:.1f} MB, "
        f"{other['requests_sampled']:,} requests drawn{note}; open it at ui.perfetto.dev"
    )
