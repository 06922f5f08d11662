"""``deepinfer-sim trace``: inspect, convert and synthesize request traces.

A thin layer over :mod:`deepinfer_sim.traces`: ``stats`` prints :func:`trace_stats` of any
readable trace, ``convert`` rewrites one as native parquet, ``synth`` writes a scenario's
workload as native parquet. ``cli.py`` registers the group with ``main.add_command(trace)``.

Like the rest of the CLI, a user mistake (missing or malformed trace, bad config, wrong output
extension) is one ``error:`` line on stderr and exit status 2. The group handles that itself,
so it behaves the same whether invoked under ``main`` or on its own (as the tests do).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from .cli_common import UserErrorGroup, overrides_option, writable_file, write_text
from .errors import UserError

# The formats of ``traces._files.FORMATS``, spelled out so that loading the CLI does not import
# the trace readers (pandas); a test checks that the two agree.
TRACE_FORMATS = ("mooncake", "azure", "burstgpt", "qwen", "vidur", "tracelab", "parquet")


def _parquet_path(out: str) -> Path:
    path = Path(out)
    if path.suffix.lower() != ".parquet":
        raise UserError(
            f"{out}: output must be a .parquet file (the native trace format); "
            f"got {path.suffix or 'no extension'!r}"
        )
    return writable_file(path, "OUT")


def _format_option(f: Any) -> Any:
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(TRACE_FORMATS),
        default=None,
        help="Trace format (default: from the file name and first line).",
    )(f)


@click.group(cls=UserErrorGroup)
def trace() -> None:
    """Inspect, convert and synthesize request traces."""


@trace.command()
@click.argument("file")
@_format_option
@click.option(
    "--lru-blocks",
    type=click.IntRange(0),
    default=None,
    help="Also replay an LRU prefix cache of N blocks (exact, sequential).",
)
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Write the stats.")
def stats(file: str, fmt: str | None, lru_blocks: int | None, json_file: str | None) -> None:
    """Lengths, rate, burstiness, prefix reuse and classes of FILE (a path or builtin:NAME)."""
    from .traces import read_trace
    from .traces.stats import trace_stats

    if json_file:
        writable_file(json_file, "--json")
    result = trace_stats(read_trace(file, format=fmt), lru_blocks=lru_blocks)
    _print_stats(result)
    if json_file:
        write_text(json_file, json.dumps(result, indent=1) + "\n", "--json")


@trace.command()
@click.argument("src", metavar="IN")
@click.argument("out")
@_format_option
def convert(src: str, out: str, fmt: str | None) -> None:
    """Read trace IN (any format) and write it to OUT as native parquet."""
    from .traces import read_trace
    from .traces.readers import write_parquet

    path = _parquet_path(out)
    source = read_trace(src, format=fmt)
    write_parquet(source, path)
    click.echo(f"wrote {path} ({len(source):,} requests)")


@trace.command()
@click.argument("config")
@click.argument("out")
@overrides_option("Override a config value by dotted key (repeatable).")
def synth(config: str, out: str, overrides: tuple[str, ...]) -> None:
    """Build CONFIG's workload (trace or generator, windowed and scaled) and write it to OUT
    as native parquet."""
    from .scenario import load_scenario
    from .traces.readers import write_parquet
    from .traces.workload import build_source

    path = _parquet_path(out)
    sc = load_scenario(config, list(overrides))
    source = build_source(sc.workload, sc.seed)
    write_parquet(source, path)
    click.echo(f"wrote {path} ({len(source):,} requests)")


def _num(v: Any, digits: str = ",.1f") -> str:
    if v is None:
        return "-"
    return format(v, digits)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _print_stats(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(highlight=False)
    rate, prefix = s["rate"], s["prefix"]
    lengths = Table(
        title=f"{s['name']}: {s['requests']:,} requests over {_num(rate['span_s'])} s",
        header_style="bold",
    )
    lengths.add_column("tokens")
    for col in ("mean", "p50", "p90", "p99", "max"):
        lengths.add_column(col, justify="right")
    for key, label in (("input_tokens", "input"), ("output_tokens", "output")):
        lengths.add_row(label, *(_num(s[key][c]) for c in ("mean", "p50", "p90", "p99", "max")))
    con.print(lengths)

    facts = Table(show_header=False, box=None, pad_edge=False)
    facts.add_column("what")
    facts.add_column("value", justify="right")
    facts.add_row("rate, mean", f"{_num(rate['mean_per_s'], ',.3g')} req/s")
    facts.add_row("inter-arrival CV", _num(rate["interarrival_cv"], ".3g"))
    facts.add_row(
        "per minute: mean / peak",
        f"{_num(rate['per_minute_mean'])} / {_num(rate['per_minute_peak'], ',.0f')}",
    )
    facts.add_row("peak / mean per minute", _num(rate["peak_to_mean_per_minute"], ".3g"))
    facts.add_row(
        "blocks: refs / unique",
        f"{prefix['block_refs']:,} / {prefix['unique_blocks']:,} ({s['block_tokens']} tok)",
    )
    facts.add_row("prefix hits, infinite cache", _pct(prefix["infinite_hit_fraction"]))
    if prefix["lru_blocks"] is not None:
        facts.add_row(
            f"prefix hits, LRU {prefix['lru_blocks']:,} blocks", _pct(prefix["lru_hit_fraction"])
        )
    facts.add_row("sessions", f"{s['sessions']:,}")
    facts.add_row("requests with images", f"{s['image_requests']:,}")
    con.print(facts)

    classes = Table(header_style="bold")
    for col in ("class", "requests", "share", "input mean", "output mean", "prefix hits"):
        classes.add_column(col, justify="left" if col == "class" else "right")
    for name, c in s["classes"].items():
        classes.add_row(
            name,
            f"{c['requests']:,}",
            _pct(c["share"]),
            _num(c["input_mean"]),
            _num(c["output_mean"]),
            _pct(c["infinite_hit_fraction"]),
        )
    con.print(classes)
