"""``deepinfer-sim compare-api``: self-hosting CONFIG's workload on its deployment's pool shapes,
resized hour by hour, against calling the model through its provider's API
(``planner/analysis/api_compare.py``; prices under ``prices.api``, settings under
``compare_api``).

``cli.py`` registers the command on the main group. A mistake — a bad value, a config error, an
unwritable ``--out`` or ``--json`` — is one ``error:`` line on stderr and exit status 2, the
same whether invoked under ``main`` or on its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .cli_common import (
    OneLineErrorCommand,
    console,
    default_out,
    overrides_option,
    user_errors,
    writable_dir,
    writable_file,
    write_text,
)

if TYPE_CHECKING:
    from .planner.analysis.api_compare import ApiComparison, SelfHostedDay


@click.command("compare-api", cls=OneLineErrorCommand)
@click.argument("config", default="default")
@overrides_option(
    "Override a config value by dotted key, e.g. --set workload.sessions.days=14 or "
    "--set prices.api.output_per_mtok_usd=0.6 (repeatable)."
)
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False),
    help="Folder for compare_api.png and compare_api.json (default runs/<name>-compare-api).",
)  # fmt: skip
@click.option(
    "--json", "json_file", type=click.Path(dir_okay=False), help="Also write the numbers here."
)
@user_errors
def compare_api(
    config: str, overrides: tuple[str, ...], out_dir: str | None, json_file: str | None
) -> None:
    """Self-hosting CONFIG's workload against the API: the API bill per day (prices.api) and the
    deployment's cost per day with its pools resized hour by hour, the break-even daily token
    volume, and how the KV-cache TTL moves it (no simulation: the steady model and the one-pass
    TTL sweep). A multi-day workload.sessions gives the daily shape; a trace is bucketed by hour
    of its clock. See docs/planner.md."""
    from .planner.analysis.api_compare import compare_api as run_compare
    from .planner.analysis.api_compare import plot_compare_api
    from .scenario import load_scenario
    from .traces.workload import build_source

    sc = load_scenario(config, list(overrides))
    if json_file:
        writable_file(json_file, "--json")
    out = writable_dir(Path(out_dir) if out_dir else default_out(sc.name, "-compare-api"))
    res = run_compare(sc, build_source(sc.workload, sc.seed))
    _print(res)
    text = json.dumps(res.as_dict(), indent=1) + "\n"
    write_text(out / "compare_api.json", text)
    if json_file:
        write_text(json_file, text, "--json")
    plot_compare_api(res, out / "compare_api.png")
    console().print(f"results in {out} (compare_api.png, compare_api.json)")


def _tok(x: float) -> str:
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if x >= size:
            return f"{x / size:,.3g} {suffix}"
    return f"{x:,.3g}"


def _usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 100 else f"${x:,.3g}"


def _sizes(sizes: dict[str, Any], hourly: bool) -> str:
    """Each pool's instances: hour by hour, or the quietest and busiest hour."""
    if hourly:
        return "; ".join(f"{k} " + " ".join(str(int(n)) for n in v) for k, v in sizes.items())
    return ", ".join(f"{k} {int(min(v))}-{int(max(v))}" for k, v in sizes.items())


def _day_line(day: SelfHostedDay, volume: float, api_usd: float, hourly: bool) -> str:
    tokens = day.scale * volume
    share = day.gpu_hours_freed / (day.gpu_hours_paid + day.gpu_hours_freed)
    return (
        f"{_usd(day.usd_per_day)}/day ({day.usd_per_day / tokens * 1e6:,.3g} $/M tokens; API "
        f"{_usd(api_usd)}, {api_usd / tokens * 1e6:,.3g}); sized for the peak hour all day "
        f"{_usd(day.static_usd_per_day)}: resizing frees {day.gpu_hours_freed:,.0f} GPU-h/day "
        f"({share:.0%}); {day.storage_nodes} storage nodes; instances "
        f"{'by hour' if hourly else 'quietest-busiest hour'}: {_sizes(day.sizes, hourly)}"
    )


def _print(res: ApiComparison) -> None:
    from rich.table import Table

    from .planner.analysis.api_compare import prices_text

    d = res.as_dict()
    w = d["workload"]
    volume = res.shape.tokens_per_day
    api = res.api_at_workload
    t = Table(
        title=f"{res.scenario}: self-hosting against the API\n{_tok(volume)} tokens/day "
        f"({w['requests_per_day']:,.0f} requests/day, {w['days']:.3g} days counted from "
        f"{w['window_s'][0] / 86400:.3g} d)",
        header_style="bold",
    )
    for col in ("", "cache hits", "$/day here", "$/M tokens", "break-even tok/day", "x this"):
        t.add_column(col, justify="left" if not col else "right")
    t.add_row(
        f"API ({res.api_label})",
        f"{d['api']['hit_rate']['all']:.1%}",
        _usd(api.total),
        f"{api.total / volume * 1e6:,.3g}",
        "-",
        "-",
    )
    for r, v in zip(res.variants, d["variants"], strict=True):
        scale = r.break_even_scale
        t.add_row(
            f"self-hosted, {r.variant.label}",
            f"{v['hit_rate']['all']:.1%}",
            _usd(r.at_workload.usd_per_day),
            f"{r.at_workload.usd_per_day / volume * 1e6:,.3g}",
            "none" if scale is None else _tok(scale * volume),
            "-" if scale is None else f"{scale:,.3g}",
        )
    con = console()
    con.print(t)
    first = res.variants[0].capacity
    decode = f"decode group {_tok(first.decode_tok_s)} output tok/s"
    if first.decode_seqs_per_rank is not None:
        decode += (
            f" ({first.decode_seqs_per_rank:,.0f} sequences per rank at {first.decode_context:,} "
            f"tokens of context, limit {first.decode_limit})"
        )
    prefill = ", ".join(
        f"{_tok(r.capacity.prefill_tok_s)} new tok/s with {r.variant.label} "
        f"({r.capacity.mean_prompt:,}-token prompts after {r.capacity.mean_cached:,} cached)"
        for r in res.variants
    )
    sources = sorted({first.decode_source, *(r.capacity.prefill_source for r in res.variants)})
    lines = [
        f"API: {prices_text(res.prices)}, off-peak x{res.prices.off_peak_factor:g}; here "
        f"{_usd(api.input_cache_hit)} cache hits + {_usd(api.input_cache_miss)} misses + "
        f"{_usd(api.output)} output a day",
        f"self-hosted: {res.deployment}, resized hourly at planner.headroom "
        f"{res.settings['planner_headroom']:g} of capacity, spin-up "
        f"{res.settings['compare_api']['spin_up_s']:g} s",
        f"capacity ({'; '.join(sources)}): {decode}; prefill instance {prefill}",
    ]
    for r in res.variants:
        lines.append(f"{r.variant.label}:")
        if r.at_break_even is not None:
            be = r.at_break_even
            lines.append(
                f"  at break-even, {_tok(be.scale * volume)} tok/day: "
                + _day_line(be, volume, api.total * be.scale, hourly=True)
            )
        else:
            lines.append(f"  no break-even in the range compared: {r.break_even_note}")
        top = r.curve[-1]
        lines.append(
            f"  at {_tok(top.scale * volume)} tok/day, the most compared: "
            + _day_line(top, volume, api.total * top.scale, hourly=False)
        )
    lines += [f"note: {n}" for n in res.notes]
    for line in lines:
        con.print(line, soft_wrap=True, markup=False)
