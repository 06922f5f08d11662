"""The ``deepinfer-sim`` command line: a thin shell over the Python API.

Each command parses its arguments, calls the API and prints. Every user mistake (bad config key,
bad ``--set``, malformed trace, unknown name) surfaces as one ``error:`` line on stderr and exit
status 2 — never a traceback.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import click

from .cli_common import (
    Progress,
    UserErrorGroup,
    console,
    default_out,
    overrides_option,
    writable_dir,
    writable_file,
    write_text,
)


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if unit == "ms":
            return f"{v * 1e3:,.1f} ms"
        if abs(v) >= 100:
            return f"{v:,.0f}{unit}"
        return f"{v:,.3g}{unit}"
    return f"{v:,}{unit}" if isinstance(v, int) else f"{v}{unit}"


def _pct(v: float | None) -> str:
    return "-" if v is None or v != v else f"{100 * v:.1f} %"


def _load_lines(load: dict[str, Any]) -> list[str]:
    """How full the pools are while busy: what a capacity planner reads next to busy time."""
    lines = []
    dec, pre = load.get("decode"), load.get("prefill")
    if dec:
        lines.append(
            f"occupancy  decode {dec['seqs_per_rank_mean']:,.1f} of {dec['max_seqs_per_rank']:,}"
            f" sequences per rank ({_pct(dec['batch_fill'])}),"
            f" KV {_pct(dec['kv_used_fraction_mean'])} of capacity,"
            f" queue mean {dec['queue']['mean']:,.1f} max {dec['queue']['max']:,.0f}"
        )
    if pre:
        lines.append(
            f"           prefill {pre['tokens_per_step_mean']:,.0f} of {pre['step_token_budget']:,}"
            f" tokens per step ({_pct(pre['step_token_fill'])}), queue mean"
            f" {pre['queue']['mean']:,.1f} max {pre['queue']['max']:,.0f}"
        )
    return lines


REJECTED_BECAUSE = {
    "context_too_long": "prompt + output longer than the model's context window",
    "kv_capacity": "needs more KV than one decode rank holds",
    "no_vision_encoder": "has images, and pools.vision has no instance",
    "no_decode_rank": "every decode rank was down, none to be repaired",
    "queue_time": "policies.admission: predicted wait before prefill over its limit",
    "queue_length": "policies.admission: max_queued prompts already waiting",
}
"""What each ``requests.rejected_by_reason`` key means (sim/core/requests.py RejectReason)."""


def _rejected_lines(req: dict[str, Any]) -> list[str]:
    """Why requests were rejected, one line per reason with its count: a run that rejects
    everything says so, and why, on the terminal."""
    reasons = req.get("rejected_by_reason") or {}
    lines = []
    for i, (reason, n) in enumerate(sorted(reasons.items(), key=lambda kv: -kv[1])):
        share = f"{100 * n / req['arrived']:.1f} %" if req.get("arrived") else "-"
        lines.append(
            f"{'rejected' if i == 0 else '':<10} {n:,} ({share} of arrived) {reason}: "
            + REJECTED_BECAUSE.get(reason, "")
        )
    return lines


def print_summary(summary: dict[str, Any], out_dir: Path | None) -> None:
    from rich.table import Table

    s = summary
    con = console()
    req = s["requests"]
    t = Table(title=f"deepinfer-sim: {s['scenario']}", show_header=True, header_style="bold")
    t.add_column("latency")
    for col in ("mean", "p50", "p90", "p99"):
        t.add_column(col, justify="right")
    rows = (
        ("ttft_s", "TTFT"),
        ("tpot_s", "TPOT"),
        ("itl_s", "ITL / step"),  # per decode step: vLLM's per-chunk ITL
        ("itl_per_token_s", "ITL / token"),
        ("e2e_s", "E2E"),
    )
    for key, label in rows:
        if key not in s["latency"]:
            continue
        row = s["latency"][key]
        t.add_row(label, *(_fmt(row[c], "ms") for c in ("mean", "p50", "p90", "p99")))
    con.print(t)
    thr, cost, util = s["throughput"], s["cost"], s["utilization"]
    lines = [
        f"requests   arrived {req['arrived']:,}  completed {req['completed']:,}  "
        f"rejected {req['rejected']:,}  in flight {req['in_flight']:,}",
        *_rejected_lines(req),
        f"throughput {_fmt(thr['request_per_s'])} req/s  input {_fmt(thr['input_tok_per_s'])} tok/s"
        f"  output {_fmt(thr['output_tok_per_s'])} tok/s  over {_fmt(thr['duration_s'])} s",
        f"goodput    {_fmt(s['goodput']['request_per_s'])} req/s "
        f"({_pct(s['goodput']['fraction_of_completed'])} of completed meet the SLOs)",
        f"busy       prefill {_pct(util['prefill'])}  decode {_pct(util['decode'])}  "
        f"vision {_pct(util['vision'])} of the time stepping",
        *_load_lines(s.get("load", {})),
        f"cost       {cost['gpus']['total']} GPUs  ${_fmt(cost['usd_per_hour'])}/h  "
        f"${_fmt(cost['usd_per_mtok_output'])}/M output tok  revenue "
        f"${_fmt(cost['revenue_per_gpu_hour_usd'])}/GPU-h",
        f"sim        {_fmt(s['sim']['simulated_s'])} simulated s in "
        f"{_fmt(s['sim']['wall_s'])} wall s  ({s['sim']['events']:,} events)",
    ]
    for line in lines:
        con.print(line)
    for pool, rule in s.get("precision", {}).items():  # the dtype rule, one line per pool
        con.print(f"precision  {pool}: {rule['rule']}", soft_wrap=True, markup=False)
    if out_dir is not None:
        con.print(f"results in {out_dir}")


@click.group(cls=UserErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="deepinfer-sim")
def main() -> None:
    """Simulator and capacity planner for disaggregated DeepSeek-V4.1-Flash serving."""


_overrides = overrides_option(
    "Override a config value by dotted key, e.g. --set pools.decode.ep=128 (repeatable)."
)


@main.command()
@click.argument("config", default="default")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Output folder.")
@_overrides
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
@click.option(
    "--progress/--no-progress",
    "progress_opt",
    default=None,
    help="Progress: a bar on a terminal, else a plain line to stderr every 30 s "
    "(default: sim.progress, off with --quiet).",
)
@click.option(
    "--timeline",
    "timeline_file",
    type=click.Path(dir_okay=False),
    help="Also write a Perfetto/Chrome trace JSON of the run (open at ui.perfetto.dev); "
    "`deepinfer-sim timeline RUN_DIR` re-exports a window.",
)
def run(
    config: str,
    out_dir: str | None,
    overrides: tuple[str, ...],
    no_plots: bool,
    quiet: bool,
    progress_opt: bool | None,
    timeline_file: str | None,
) -> None:
    """Simulate CONFIG (a scenario YAML path or a bundled name such as `default`)."""
    from .scenario import dump_scenario, load_scenario
    from .sim.results.files import OutputError
    from .sim.results.result import write_run_error, write_text
    from .sim.run import simulate

    sc = load_scenario(config, list(overrides))
    out = writable_dir(Path(out_dir) if out_dir else default_out(sc.name))
    if timeline_file:
        writable_file(timeline_file, "--timeline")
    enabled = sc.sim.progress and not quiet if progress_opt is None else progress_opt
    progress = Progress(enabled)
    trace = None
    write_text(out / "config.resolved.yaml", dump_scenario(sc))
    (out / "error.json").unlink(missing_ok=True)
    try:
        if timeline_file:
            from .sim.results.timeline import TimelineOptions, simulate_with_timeline

            result, trace = simulate_with_timeline(
                simulate, sc, options=TimelineOptions(), progress=progress if enabled else None
            )
        else:
            result = simulate(sc, progress=progress if enabled else None)
    except Exception as exc:  # the run's folder keeps what failed and with which config
        write_run_error(out, exc)
        raise
    finally:
        progress.stop()
    try:
        result.write(out, plots=not no_plots)
    except OutputError:  # a full disk, say: the run's numbers still reach the terminal
        if not quiet:
            print_summary(result.summary, None)
        raise
    if not quiet:
        print_summary(result.summary, out)
        from .cli_cost import band_lines

        for line in band_lines(sc):
            console().print(line, soft_wrap=True, markup=False)
    if trace is not None and timeline_file:
        from .cli_timeline import timeline_line
        from .sim.results.timeline import write_timeline

        write_timeline(trace, timeline_file)
        if not quiet:
            console().print(timeline_line(trace, timeline_file))


@main.command()
@click.option("--out", "out_file", type=click.Path(dir_okay=False), help="Write to a file.")
def schema(out_file: str | None) -> None:
    """Print the JSON Schema of scenario files."""
    from .scenario import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if out_file:
        write_text(writable_file(out_file), text)
    else:
        click.echo(text, nl=False)


@main.command("list")
def list_() -> None:
    """List bundled scenarios, models, hardware and traces."""
    from .models.registry import available
    from .scenario import bundled_scenarios
    from .traces import BUILTIN_TRACES

    click.echo("scenarios: " + ", ".join(bundled_scenarios()))
    click.echo("models:    " + ", ".join(available("models")))
    click.echo("hardware:  " + ", ".join(available("hardware")))
    click.echo("traces:    " + ", ".join(f"builtin:{n}" for n in BUILTIN_TRACES))


@main.command()
@click.argument("config", default="default")
@_overrides
def show(config: str, overrides: tuple[str, ...]) -> None:
    """Print CONFIG fully resolved (every default filled in), after overrides."""
    from .scenario import dump_scenario, load_scenario

    click.echo(dump_scenario(load_scenario(config, list(overrides))), nl=False)


@main.command()
@click.argument("config", default="default")
@click.option(
    "--pool", type=click.Choice(["prefill", "decode"]), default="decode", show_default=True
)
@click.option(
    "--ep",
    type=click.IntRange(1, 1024),
    help="GPUs of the EP group (default: the pool's); its experts spread over ep / moe_tp groups.",
)
@click.option(
    "--redundant", type=click.IntRange(0, 64), help="Redundant experts per GPU (default: pool's)."
)
@click.option(
    "--requests-per-rank",
    type=click.IntRange(1),
    help="Requests per rank per step (default: policies.eplb.benchmark, 4 prompts / 60 sequences).",
)
@click.option(
    "--tokens-per-request",
    type=click.FloatRange(min=1.0),
    help="Routed tokens per request per step (default: prefill policies.eplb.benchmark; "
    "decode: what the scenario's speculative policy verifies at this concurrency, measured "
    "offline).",
)
@click.option("--steps", type=click.IntRange(1), help="Steps (default: 3 re-assignment periods).")
@click.option("--step-s", type=click.FloatRange(min=0, min_open=True), help="Seconds per step.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Write the result.")
@_overrides
def eplb(
    config: str,
    pool: str,
    ep: int | None,
    redundant: int | None,
    requests_per_rank: int | None,
    tokens_per_request: float | None,
    steps: int | None,
    step_s: float | None,
    json_file: str | None,
    overrides: tuple[str, ...],
) -> None:
    """Expert imbalance of one EP group at a steady operating point: EPLB beside static.

    Uses CONFIG's expert-load model and the pool's EPLB window and period (change them with
    --set policies.eplb.decode.period_steps=... etc.); no cluster run.
    """
    from pydantic import ValidationError

    from .planner.analysis.eplb_analysis import benchmark_point, operating_point
    from .scenario import load_scenario
    from .sim.stages.expert_parallel import Pool

    sc = load_scenario(config, list(overrides))
    if json_file:
        writable_file(json_file, "--json")
    which: Pool = "prefill" if pool == "prefill" else "decode"
    cfg = sc.pools.prefill if which == "prefill" else sc.pools.decode
    ep = ep or cfg.ep
    try:  # the pool's own check that tp and moe_tp divide its GPUs
        type(cfg).model_validate({**cfg.model_dump(), "ep": ep})
    except ValidationError as exc:
        raise click.BadParameter(exc.errors()[0]["msg"], param_hint="--ep") from None
    redundant = cfg.redundant_experts_per_gpu if redundant is None else redundant
    requests, tokens = operating_point(sc, which, ep, requests_per_rank, tokens_per_request)
    res = benchmark_point(sc, which, ep, redundant, requests, tokens, steps, step_s)
    _print_eplb(res)
    if json_file:
        write_text(json_file, json.dumps(res, indent=1) + "\n", "--json")


def _groups_note(res: dict[str, Any]) -> str:
    """' (N expert groups)' where the experts are tensor parallel, so groups differ from GPUs."""
    groups = res["expert_groups"]
    return "" if groups == res["ep"] else f" ({groups} expert group{'s' * (groups != 1)})"


def _print_eplb(res: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(
        title=f"{res['pool']} EP{res['ep']}{_groups_note(res)}, "
        f"{res['redundant_experts_per_gpu']} redundant/GPU, "
        f"EPLB window {res['eplb']['window_steps']} / period {res['eplb']['period_steps']} steps"
        f"\n{res['requests_per_rank']} requests × {res['tokens_per_request']:,.4g} tokens per "
        f"rank per step, {res['step_s'] * 1e3:,.1f} ms steps",
        header_style="bold",
    )
    for col in ("placement", "mean", "p50", "p99", "rebalances", "moved GB", "stall s"):
        t.add_column(col, justify="left" if col == "placement" else "right")
    for key in ("eplb", "static"):
        r = res[key]
        imb = r["imbalance"]
        t.add_row(
            key,
            *(f"{imb[c]:.4f}" for c in ("mean", "p50", "p99")),
            str(r["rebalances"]),
            f"{r['moved_bytes'] / 1e9:,.1f}",
            f"{r['stall_s']:.3f}",
        )
    console().print(t)


@main.command()
@click.argument("config", default="default")
@click.option("--workers", type=click.IntRange(1), default=1, show_default=True,
              help="Shapes simulated in parallel processes.")  # fmt: skip
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Output folder.")
@click.option(
    "--what-if", "what_ifs", multiple=True, metavar="KEY=VALUE",
    help="Re-plan with this change too and report the delta (repeatable; e.g. "
    "planner.traffic_scale=2, pools.storage.ttl_s.chatbot=259200, network.placement=cross_dc).",
)  # fmt: skip
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              show_default=True, help="Worker processes here, or Ray tasks.")  # fmt: skip
@click.option("--address", "ray_address", default=None, help="Ray cluster address (ray only).")
@click.option("--gpus", type=click.IntRange(1), default=None,
              help="The best deployment within N GPUs: the highest rate meeting the SLOs "
              "(planner.gpus).")  # fmt: skip
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="The cheapest deployment serving R req/s (planner.target_rate_rps; "
              "the default mode, at the workload's rate).")  # fmt: skip
@click.option("--json", "json_file", type=click.Path(dir_okay=False), default=None,
              help="Write the plan (plan.json's content) here too.")  # fmt: skip
@_overrides
def plan(
    config: str,
    workers: int,
    out_dir: str | None,
    what_ifs: tuple[str, ...],
    executor: str,
    ray_address: str | None,
    gpus: int | None,
    rate: float | None,
    json_file: str | None,
    overrides: tuple[str, ...],
) -> None:
    """The cheapest deployment of CONFIG's model that serves its workload within the SLOs
    (--rate R), or the one within N GPUs that serves the highest rate (--gpus N).

    Searches the shapes in the scenario's `planner` section (pool kinds, prefill EP and
    instances per decode group, decode EP, aggregated EP, and the `planner.vary` axes); for
    each, bisection on load finds the rate one unit sustains, then replicas cover the target
    rate or fill the budget. Writes the throughput/interactivity front too. See docs/planner.md.
    """
    if gpus is not None and rate is not None:
        raise click.UsageError("give --gpus or --rate, not both")
    if gpus is not None:
        overrides = (*overrides, f"planner.gpus={gpus}")
    if rate is not None:
        overrides = (*overrides, f"planner.target_rate_rps={rate}", "planner.gpus=null")
    json_path = writable_file(json_file, "--json") if json_file else None
    from .planner.plan import Snapshot
    from .planner.plan import plan as run_plan
    from .planner.plan_report import print_plan, write_plan
    from .sim.results.files import copy_folder, write_text

    # the file is read once, here: every shape and probe, in every worker, is cut from this
    # snapshot, so editing the file while the plan runs changes nothing in it
    snap = Snapshot.of(config, overrides)
    changed_snap = snap.derive(what_ifs) if what_ifs else None  # a bad what-if fails here
    out = writable_dir(Path(out_dir) if out_dir else default_out(snap.scenario().name, "-plan"))
    con = console()
    from .cli_cost import band_lines, precision_lines

    for line in precision_lines(snap.scenario()):  # the dtype rule of each pool on a profile
        con.print(line, soft_wrap=True, markup=False)
    for line in band_lines(snap.scenario()):  # how far the cost models have been off
        con.print(line, soft_wrap=True, markup=False)

    def run(snapshot: Snapshot, folder: str):
        (out / folder).mkdir(parents=True, exist_ok=True)
        write_text(out / folder / "config.resolved.yaml", snapshot.text)  # what it planned
        runs_dir = str(out / folder / "runs")
        return run_plan(snapshot, (), workers, _plan_progress(con), runs_dir, executor, ray_address)

    plans = [("plan", run(snap, "plan"))]
    base = plans[0][1]
    print_plan(con, base, "plan")  # on the terminal before any file: a full disk loses no answer
    _say_resumed(con, base, out / "plan" / "probes")
    write_plan(base, out / "plan")
    if json_path is not None:
        from .cli_common import write_text as write_option_file

        write_option_file(json_path, (out / "plan" / "plan.json").read_text(), "--json")
    runs = []
    if base.best is not None:
        copy_folder(base.best.run_dir, out / "recommended")
        runs.append(str(out / "recommended"))
        _write_launch_files(con, snap, base.best, out)
    if changed_snap is not None:
        changed = run(changed_snap, "what_if")
        plans.append(("what if", changed))
        print_plan(con, changed, "what if " + ", ".join(what_ifs), base)
        _say_resumed(con, changed, out / "what_if" / "probes")
        write_plan(changed, out / "what_if", base)
        runs += [changed.best.run_dir] if changed.best else []
    con.print(f"results in {out}")
    if runs:
        con.print("report: deepinfer-sim report " + " ".join(runs))
    _exit_if_incomplete(plans)


def _write_launch_files(con: Any, snap: Any, best: Any, out: Path) -> None:
    """The recommended deployment's launch files in ``out/launch`` (planner/launch.py)."""
    from .planner.launch import write_launch_files

    sc = snap.scenario(best.shape.deployment(best.replicas))
    source = Path(snap.source)
    base_dir = source.parent if source.is_file() else None
    paths = write_launch_files(sc, out, base_dir=base_dir)
    con.print(f"launch files for {best.shape.label} × {best.replicas}: "
              + ", ".join(str(p) for p in paths), markup=False)  # fmt: skip


def _say_resumed(con: Any, plan: Any, probes: Path) -> None:
    found, total = plan.from_log()
    if found:
        con.print(
            f"resumed: {found:,} of {total:,} simulations found done in {probes}, "
            f"{total - found:,} run now"
        )


def _exit_if_incomplete(plans: list[tuple[str, Any]]) -> None:
    """A search with a failed shape is incomplete: each failure on stderr, then exit 1 (as
    ``sweep grid`` does for a failed point), or 2 with one ``error:`` line when a shape could
    not write its results (a full disk: an environment problem, not the shape's)."""
    from .planner.plan import OUTPUT_ERROR

    failed = [(title, r) for title, p in plans for r in p.failed()]
    if not failed:
        return
    for title, r in failed:
        where = "" if title == "plan" else f" ({title})"
        click.echo(f"failed {r.shape.label}{where}: {r.error}", err=True)
    unwritten = [r for _, r in failed if r.error.startswith(OUTPUT_ERROR)]
    if unwritten:
        click.echo(f"error: {unwritten[0].error.removeprefix(OUTPUT_ERROR)}", err=True)
        raise click.exceptions.Exit(2)
    click.echo(f"the search is incomplete: {len(failed)} shapes failed", err=True)
    raise click.exceptions.Exit(1)


def _plan_progress(con: Any) -> Callable[[Any], None]:
    def show(r: Any) -> None:
        sims = r.from_log + r.simulated
        logged = f" ({r.from_log} of {sims} simulations from the log)" if r.from_log else ""
        if r.status == "pruned":
            con.print(f"  {r.shape.label}: pruned (bound {r.bound_rps:.1f} req/s)")
        elif r.status == "error":
            con.print(f"  {r.shape.label}: error{logged} — {r.error}")
        else:
            con.print(
                f"  {r.shape.label}: {r.status}, sustains {r.sustainable_rps:.1f} req/s{logged}"
            )

    return show


class _Duration(click.ParamType):
    """Seconds, or a number with a unit: 90s, 15m, 4h, 3d."""

    name = "duration"
    units: ClassVar[dict[str, float]] = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, int | float):
            return float(value)
        text = str(value).strip().lower()
        scale = self.units.get(text[-1:], None)
        try:
            seconds = float(text[:-1] if scale else text) * (scale or 1.0)
        except ValueError:
            self.fail(f"{value!r} is not a duration (e.g. 600, 90s, 15m, 4h, 3d)", param, ctx)
        if not seconds > 0:
            self.fail(f"{value!r}: a duration must be > 0", param, ctx)
        return seconds


@main.group()
def sweep() -> None:
    """Sweeps: `grid` runs a grid of full simulations; `ttl` sweeps KV TTLs in one pass."""


@sweep.command("ttl")
@click.argument("config", default="default")
@click.option(
    "--ttl", "ttls", multiple=True, type=_Duration(), help="TTL grid point (repeatable; "
    "default 1m … 14d)."
)  # fmt: skip
@click.option(
    "--capacity-tb", "capacities", multiple=True, type=click.FloatRange(min=0, min_open=True),
    help="Also sweep an LRU capacity in logical TB (repeatable; Che's approximation).",
)  # fmt: skip
@click.option("--gpus", type=click.IntRange(1), help="Size storage for this many GPUs.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Output folder.")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@_overrides
def sweep_ttl(
    config: str,
    ttls: tuple[float, ...],
    capacities: tuple[float, ...],
    gpus: int | None,
    out_dir: str | None,
    no_plots: bool,
    overrides: tuple[str, ...],
) -> None:
    """Token hit rate per traffic class, prefill tokens saved and storage needed, for a grid of
    TTLs, in one pass over CONFIG's workload (no simulation per point)."""
    from .planner.analysis.storage_sizing import DEFAULT_TTLS_S, block_bytes, ttl_report
    from .planner.analysis.ttl_sweep import plot_ttl_sweep
    from .scenario import load_scenario
    from .traces.workload import build_source

    sc = load_scenario(config, list(overrides))
    out = Path(out_dir) if out_dir else default_out(sc.name, "-ttl")
    source = build_source(sc.workload, sc.seed)
    if not len(source):
        raise click.UsageError(f"{config}: the workload has no requests")
    caps = [tb * 1e12 / block_bytes(sc, source) for tb in capacities] or None
    _, frame = ttl_report(sc, source, ttls or DEFAULT_TTLS_S, caps, gpus)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "ttl_sweep.csv", index=False)
    if not no_plots:
        plot_ttl_sweep(frame, out)
    _print_ttl(frame, len(source), out)


def _print_ttl(frame: Any, requests: int, out: Path) -> None:
    from rich.table import Table

    rows = frame[frame["capacity_blocks"] == float("inf")]
    classes = [c for c in rows["traffic_class"].unique() if c != "all"]
    t = Table(title=f"TTL sweep: {requests:,} requests, {rows['gpus'].iloc[0]} GPUs")
    t.add_column("TTL")
    for c in [*classes, "all"]:
        t.add_column(f"hit {c}", justify="right")
    t.add_column("saved Mtok", justify="right")
    t.add_column("storage TB", justify="right")
    t.add_column("nodes", justify="right")
    # one table row per sweep point: a uniform TTL, or the per-class point, whose class rows
    # carry different TTLs (and its "all" row none), so it is keyed by the policy alone
    point = rows["ttl_s"].where(rows["policy"] == "ttl")
    for (policy, ttl), grp in rows.groupby([rows["policy"], point], dropna=False, sort=False):
        by = grp.set_index("traffic_class")
        label = "per class" if policy == "class_ttl" else _duration_label(float(ttl))
        t.add_row(
            label,
            *(_percent(by.loc[c, "hit_rate"]) for c in [*classes, "all"]),
            f"{by.loc['all', 'hit_tokens'] / 1e6:,.1f}",
            f"{by.loc['all', 'needed_tb']:,.1f}",
            f"{by.loc['all', 'nodes_needed']}",
        )
    con = console()
    con.print(t)
    con.print(f"results in {out}")


def _percent(rate: float) -> str:
    """A hit rate; "-" for a class without requests (NaN)."""
    return "-" if math.isnan(rate) else f"{rate:.2%}"


def _duration_label(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _register() -> None:
    from .cli_calibrate import calibrate, derive_profile, merge_profiles
    from .cli_compare_api import compare_api
    from .cli_cost import cost
    from .cli_launch import launch
    from .cli_plan import report, sweep_grid
    from .cli_timeline import timeline
    from .cli_trace import trace
    from .cli_validate import validate

    for command in (calibrate, derive_profile, merge_profiles):
        main.add_command(command)
    main.add_command(cost)
    main.add_command(compare_api)
    main.add_command(launch)
    main.add_command(validate)
    main.add_command(trace)
    main.add_command(report)
    main.add_command(timeline)
    sweep.add_command(sweep_grid, "grid")


_register()

if __name__ == "__main__":  # pragma: no cover
    main()
