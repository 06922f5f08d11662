"""``deepinfer-sim cost``: one pool's step time, where it goes, and its throughput at a steady
load — straight from the pool's cost model (``planner/analysis/steady.py``), no simulation.

``cli.py`` registers the command on the main group. Like the rest of the CLI, every mistake —
an option out of range, an option that does not apply to the pool, a config error — is one
``error:`` line on stderr naming the option or key, and exit status 2; the command turns click's
own usage errors into that line too, so it reads the same whether invoked under ``main`` or on
its own.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from .cli_common import (
    OneLineErrorCommand,
    console,
    figure,
    overrides_option,
    user_errors,
    writable_file,
    write_text,
)
from .errors import UserError

if TYPE_CHECKING:
    from .planner.analysis.steady import SteadyPoint
    from .scenario import Scenario


_POSITIVE = click.FloatRange(min=0, min_open=True)

_DECODE_ONLY = ("batch", "context", "verify", "accept", "user_speed", "max_batch")
_PREFILL_ONLY = ("tokens", "prompt", "prefix")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _given_on_command_line(param: str) -> bool:
    """Whether the user passed ``param`` (rather than it taking its default)."""
    source = click.get_current_context().get_parameter_source(param)
    return source is click.core.ParameterSource.COMMANDLINE


@click.command("cost", cls=OneLineErrorCommand)
@click.argument("config", default="default")
@click.option(
    "--pool",
    type=click.Choice(["decode", "prefill"]),
    help="The pool to cost (default: decode, or the --case's pool).",
)
@click.option("--batch", type=_POSITIVE, help="decode: sequences per GPU.")
@click.option("--context", type=click.IntRange(0), help="decode: context tokens per sequence.")
@click.option(
    "--verify",
    type=click.FloatRange(min=1),
    help="decode: tokens computed per sequence-step, 1 + drafts verified (default: the "
    "scenario's speculative policy; dspark: its full draft length).",
)
@click.option(
    "--accept",
    type=click.FloatRange(min=1),
    help="decode: tokens emitted per sequence-step (default: expected under the scenario's "
    "acceptance model at this verify length).",
)
@click.option(
    "--user-speed",
    type=_POSITIVE,
    metavar="TOK_S",
    help="decode, instead of --batch: the largest batch per GPU giving each user TOK_S tokens/s.",
)
@click.option(
    "--max-batch",
    type=click.IntRange(1),
    default=1024,
    show_default=True,
    help="decode with --user-speed: the largest batch per GPU searched.",
)
@click.option(
    "--tokens",
    type=click.IntRange(1),
    help="prefill: new tokens per GPU per step (default: pools.prefill.max_tokens_per_step).",
)
@click.option("--prompt", type=click.IntRange(1), help="prefill: new tokens per prompt.")
@click.option(
    "--prefix",
    type=click.IntRange(0),
    help="prefill: cached prefix tokens before each prompt's new tokens (default 0).",
)
@click.option(
    "--case",
    "case_ref",
    metavar="N|NAME",
    help="CONFIG is a published case file (configs/published/, or its name): cost that case's "
    "pool at its point (its number in the file, from 1, or its name) and compare with the "
    "published figure.",
)
@click.option(
    "--cost-model",
    metavar="roofline|PROFILE",
    help="Cost model of the pool (overrides cost_model.<pool>).",
)
@click.option(
    "--curve",
    is_flag=True,
    help="decode: the throughput/interactivity curve, tokens/s per GPU and per user from one "
    "sequence per rank up to the KV or batch limit, and the fastest per-user speed.",
)
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Write the point.")
@overrides_option("Override a config value by dotted key, e.g. --set pools.decode.ep=32.")
@user_errors
def cost(
    config: str,
    pool: str,
    batch: float | None,
    context: int | None,
    verify: float | None,
    accept: float | None,
    user_speed: float | None,
    max_batch: int,
    tokens: int | None,
    prompt: int | None,
    prefix: int | None,
    case_ref: str | None,
    cost_model: str | None,
    curve: bool,
    json_file: str | None,
    overrides: tuple[str, ...],
) -> None:
    """Step time, its breakdown and tokens/s per GPU, node and user of one pool of CONFIG at a
    steady load, from the pool's cost model (no simulation).

    \b
    decode:  every GPU holds --batch sequences of --context tokens (or, with --user-speed,
             the largest batch that still gives each user that speed)
    prefill: every GPU computes --tokens new tokens a step as whole --prompt-token prompts
             (each after --prefix cached tokens)
    case:    --case N takes the pool and point from case N of a published case file
    curve:   --curve --context N: decode at every batch from one sequence per rank to the
             limit, with the fastest per-user speed
    """
    from .planner.analysis import steady

    if json_file:
        writable_file(json_file, "--json")
    given = {
        "batch": batch,
        "context": context,
        "verify": verify,
        "accept": accept,
        "user_speed": user_speed,
        "tokens": tokens,
        "prompt": prompt,
        "prefix": prefix,
        "max_batch": max_batch if _given_on_command_line("max_batch") else None,
    }
    if case_ref is not None:
        _cost_case(config, case_ref, pool, given, cost_model, overrides, json_file)
        return
    pool = pool or "decode"
    foreign = _PREFILL_ONLY if pool == "decode" else _DECODE_ONLY
    for name in foreign:
        if given[name] is not None:
            raise UserError(f"{_flag(name)} does not apply to --pool {pool}")
    if curve:
        if pool != "decode":
            raise UserError("--curve applies to --pool decode")
        for name in ("batch", "user_speed", "max_batch"):
            if given[name] is not None:
                raise UserError(f"{_flag(name)}: --curve runs every batch; give one or the other")
        if context is None:
            raise UserError("--context is required with --curve")
        _cost_curve(
            _load(config, overrides, cost_model, (pool,)), context, verify, accept, json_file
        )
        return
    if pool == "decode":
        if context is None:
            raise UserError("--context is required with --pool decode")
        if batch is None and user_speed is None:
            raise UserError("--batch (or --user-speed) is required with --pool decode")
        if batch is not None and user_speed is not None:
            raise UserError("give --batch or --user-speed, not both")
        if user_speed is None and given["max_batch"] is not None:
            raise UserError("--max-batch applies only with --user-speed")
    elif prompt is None:
        raise UserError("--prompt is required with --pool prefill")

    sc = _load(config, overrides, cost_model, (pool,))
    notes: list[str] = []
    if pool == "decode":
        assert context is not None
        _check_speculative(sc, verify, accept, notes)
        if user_speed is not None:
            point = steady.decode_at_user_speed(sc, context, user_speed, verify, accept, max_batch)
        else:
            assert batch is not None
            point = steady.decode_point(sc, batch, context, verify, accept)
        notes += _decode_notes(sc, point, max_batch)
    else:
        assert prompt is not None
        tokens = sc.pools.prefill.max_tokens_per_step if tokens is None else tokens
        if prompt > tokens:
            raise UserError(
                f"--prompt ({prompt:,}) must not exceed --tokens ({tokens:,}): a prefill point "
                "computes whole prompts in one step"
            )
        point = steady.prefill_point(sc, tokens, prompt, prefix or 0)
        if tokens % prompt:
            notes.append(
                f"{tokens:,} is not a multiple of {prompt:,}: the last chunk is a partial prompt "
                f"of {tokens % prompt:,} tokens"
            )
    _print_point(point, notes)
    rule = _print_precision(sc, pool)
    rule.update(_print_band(sc, pool))
    if json_file:
        out = {**point.as_dict(), **rule}
        write_text(json_file, json.dumps(out, indent=1) + "\n", "--json")


def precision_lines(sc: Scenario, pools: tuple[str, ...] = ("prefill", "decode")) -> list[str]:
    """One line per pool of ``pools`` whose model dtypes differ from its profile's: the rule
    that moved the profile's fits (models/precision.py)."""
    from .sim.core.assemble import dtype_rules

    return [f"precision: {p}: {r.description}" for p, r in dtype_rules(sc).items() if p in pools]


def _cost_curve(
    sc: Scenario, context: int, verify: float | None, accept: float | None, json_file: str | None
) -> None:
    """``--curve``: the decode pool's throughput/interactivity curve, as a table (and JSON)."""
    from rich.table import Table

    from .planner.analysis import steady

    points = steady.decode_curve(sc, context, verify, accept)
    d = sc.pools.decode
    shape = (
        f"EP{d.ep}"
        + (f" TP{d.tp}" if d.tp > 1 else "")
        + (f" expert-TP{d.moe_tp}" if d.moe_tp > 1 else "")
    )
    t = Table(
        title=f"decode {shape} on {d.hardware}, {points[0].cost_model}, {context:,}-token "
        "context: throughput against interactivity",
        header_style="bold",
    )
    for col in ("sequences/rank", "step ms", "tok/s per user", "tok/s per GPU", "KV fits"):
        t.add_column(col, justify="right")
    for p in points:
        per_rank = (p.batch_per_gpu or 0.0) * p.tp
        t.add_row(
            f"{per_rank:,.0f}",
            f"{p.step_s * 1e3:,.2f}",
            figure(p.tokens_per_s_per_user),
            figure(p.tokens_per_s_per_gpu),
            "yes" if p.kv_fits else "no",
        )
    con = console()
    con.print(t)
    fastest = points[0]
    con.print(
        f"fastest per user: {figure(fastest.tokens_per_s_per_user)} tok/s at one sequence per "
        f"rank ({figure(fastest.tokens_per_s_per_gpu)} tok/s per GPU); most per GPU: "
        f"{figure(points[-1].tokens_per_s_per_gpu)} tok/s at "
        f"{(points[-1].batch_per_gpu or 0) * points[-1].tp:,.0f} sequences per rank "
        f"({figure(points[-1].tokens_per_s_per_user)} tok/s per user)"
    )
    extra = _print_precision(sc, "decode")
    extra.update(_print_band(sc, "decode"))
    if json_file:
        body = {"curve": [p.as_dict() for p in points], **extra}
        write_text(json_file, json.dumps(body, indent=1) + "\n", "--json")


def band_lines(sc: Scenario) -> list[str]:
    """One line per pool of the run: how far its cost model's answers have been off on the
    published cases most like it (planner/analysis/corpus_fit.py)."""
    from .planner.analysis.corpus_fit import band_for

    out = []
    for pool in sc.serving_pools:
        band = band_for(sc, pool)
        if band is not None:
            out.append(f"error band: {pool} ({sc.cost_model.for_pool(pool)}): {band.text()}")
    return out


def _print_band(sc: Scenario, pool: str) -> dict[str, Any]:
    """Print the pool's error band; ``{"error_band": ...}`` for --json (else empty)."""
    from .planner.analysis.corpus_fit import band_for

    band = band_for(sc, pool)
    if band is None:
        return {}
    pool = sc.serving_pool(pool)
    model = sc.cost_model.for_pool(pool)
    console().print(f"error band: {pool} ({model}): {band.text()}", soft_wrap=True, markup=False)
    return {"error_band": {"band": band.band, "cases": band.cases, "alike": band.alike}}


def _print_precision(sc: Scenario, pool: str) -> dict[str, Any]:
    """Print the pool's dtype rule, if any; ``{"precision": ...}`` for --json (else empty)."""
    from .sim.core.assemble import dtype_rules

    rule = dtype_rules(sc).get(pool)
    if rule is None:
        return {}
    console().print(f"precision: {pool}: {rule.description}", soft_wrap=True, markup=False)
    return {"precision": rule.as_dict()}


def _load(
    config: Any, overrides: tuple[str, ...], cost_model: str | None, pools: tuple[str, ...]
) -> Scenario:
    """The scenario with its --set overrides, and --cost-model on ``pools`` — on the aggregated
    pool where the scenario serves aggregated (its steps are that pool's, whichever phase is
    asked for)."""
    from .scenario import load_scenario

    sc = load_scenario(config, list(overrides))
    if cost_model is None:
        return sc
    if not cost_model.strip():
        raise UserError("--cost-model: empty; give roofline or a profile name or path")
    targets = {sc.serving_pool(p) for p in pools}
    return load_scenario(
        config, [*overrides, *(f"cost_model.{p}={cost_model}" for p in sorted(targets))]
    )


def _cost_case(
    config: str,
    case_ref: str,
    pool: str | None,
    given: dict[str, Any],
    cost_model: str | None,
    overrides: tuple[str, ...],
    json_file: str | None,
) -> None:
    """``--case``: one case of a published case file, costed at its point and compared."""
    from .planner.analysis import published
    from .scenario import is_case_file, scenario_path
    from .validation import read_yaml

    for name, value in given.items():
        if value is not None:
            raise UserError(f"{_flag(name)}: --case sets the point; give one or the other")
    path = scenario_path(config)
    data = read_yaml(path)
    if not is_case_file(data):
        raise UserError(
            f"--case: {path} is a scenario, not a published case file (configs/published/: "
            "`deepinfer-sim validate` lists them)"
        )
    cf = published.case_file_of(data, path)
    case = _pick_case(cf, case_ref, path)
    case_pool = "decode" if case.quantity.startswith("decode") else "prefill"
    if pool is not None and pool != case_pool:
        raise UserError(f"--pool {pool}: case {case.name!r} is a {case_pool} case")
    # the case's own overrides, then both pools on one cost model as validate does (the case's
    # scenario names one for the two), then the command line's
    sc = _load(path, (*case.set, *overrides), cost_model, ("prefill", "decode"))
    value, point = published.case_point(case, sc)
    res = published.result(cf, case, point.cost_model, value, point.step_s)
    if case.quantity in published.SIMULATED:
        _print_burst(case, point, _case_notes(res))
    else:
        _print_point(point, _case_notes(res))
    rule = _print_precision(sc, point.pool)
    if json_file:
        out = {**point.as_dict(), "case": res.as_dict(), **rule}
        write_text(json_file, json.dumps(out, indent=1) + "\n", "--json")


def _pick_case(cf: Any, ref: str, path: Any) -> Any:
    names = [c.name for c in cf.cases]
    if ref.isdigit() and 1 <= int(ref) <= len(cf.cases):
        return cf.cases[int(ref) - 1]
    if ref in names:
        return cf.cases[names.index(ref)]
    listing = "; ".join(f"{i}: {n}" for i, n in enumerate(names, 1))
    raise UserError(f"--case {ref!r}: {path} has no such case ({listing})")


def _print_burst(case: Any, p: SteadyPoint, notes: list[str]) -> None:
    """A case a whole simulation answers: its run's figures (no steady step to break down)."""
    from rich.table import Table

    pt = case.point
    t = Table(
        title=f"a burst of {pt['requests']:,.0f} requests of {pt['input']:,.0f} prompt / "
        f"{pt['output']:,.0f} output tokens, simulated on {p.ep} GPUs, {p.cost_model}",
        header_style="bold",
    )
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("mean inter-token latency (ms)", f"{p.step_s * 1e3:,.3f}")
    t.add_row("output tok/s per GPU", f"{p.tokens_per_s_per_gpu:,.0f}")
    _show([t], notes)


def _show(tables: list[Any], notes: list[str]) -> None:
    con = console()
    for table in tables:
        con.print(table)
    for note in notes:
        con.print(f"note: {note}")


def _case_notes(res: Any) -> list[str]:
    verdict = "within" if res.within else "outside"
    return [
        f"case {res.name!r} ({res.quantity}): simulated {figure(res.simulated)}, published "
        f"{figure(res.published)}, ratio {res.ratio:.2f} ({verdict} ±{res.tolerance:.0%})"
    ]


def _check_speculative(
    sc: Scenario, verify: float | None, accept: float | None, notes: list[str]
) -> None:
    """Resolve the verify length up front, so that a bad --accept names the option."""
    from .planner.analysis.steady import default_verify

    spec = sc.policies.speculative
    v = default_verify(sc) if verify is None else verify
    if accept is not None and accept > v:
        raise UserError(
            f"--accept ({accept:g}) must not exceed the tokens verified per sequence-step "
            f"({v:g}; set --verify)"
        )
    if verify is None and spec.policy == "dspark":
        notes.append(
            "verify: dspark's full draft length (its mean verify length is set at run time by "
            "its confidence cut-off and is not known offline; pass --verify)"
        )


_LIMIT_NOTES = {
    "speed": "the speed binds: one more sequence per rank would be slower than asked",
    "kv": "the KV cache binds: one more sequence per rank would not fit its HBM",
    "max_seqs_per_rank": (
        "pools.decode.max_seqs_per_rank ({cap}) binds: a larger batch is not allowed"
    ),
    "max_batch": "the search stopped at --max-batch {max_batch}",
}


def _decode_notes(sc: Scenario, p: SteadyPoint, max_batch: int) -> list[str]:
    notes = []
    if p.meets_speed is False:
        notes.append(
            f"even 1 sequence per GPU gives only {p.tokens_per_s_per_user:,.1f} tok/s per user "
            f"(< {p.user_tok_s:g})"
        )
    elif p.meets_speed:
        notes.append(
            _LIMIT_NOTES[p.batch_limit or "speed"].format(
                max_batch=max_batch, cap=sc.pools.decode.max_seqs_per_rank
            )
        )
    if p.kv_fits is False:
        notes.append(
            f"KV does not fit: {p.kv_tokens_per_gpu:,.0f} tokens per GPU needed, "
            f"{p.kv_capacity_tokens_per_gpu:,.0f} fit"
        )
    cap = sc.pools.decode.max_seqs_per_rank
    if p.batch_per_gpu is not None and p.batch_per_gpu > cap:
        notes.append(f"batch exceeds pools.decode.max_seqs_per_rank ({cap})")
    return notes


_LABELS = {
    "dense": "dense, context-free",
    "attention": "attention over context",
    "experts": "routed experts",
    "permutes": "engine permutes around the exchange",
    "a2a_exposed": "all-to-all, exposed",
    "overhead": "step overhead",
    "speculative": "speculative overhead",
    "draft": "draft model",
}


_SHOWN_IF_CHARGED = ("permutes", "speculative", "draft")  # parts most pools do not have


def _print_point(p: SteadyPoint, notes: list[str]) -> None:
    from rich.table import Table

    if p.pool == "decode":
        assert p.batch_per_gpu is not None and p.verify is not None and p.accept is not None
        load = (
            f"{p.batch_per_gpu:,.4g} sequences/GPU at {p.context:,} tokens, "
            f"verify {p.verify:.3g}, accept {p.accept:.3g}"
        )
        if p.meets_speed is not None:
            load += (
                f"\nthe largest batch giving each user ≥ {p.user_tok_s:g} tok/s"
                if p.meets_speed
                else f"\nno batch gives each user {p.user_tok_s:g} tok/s"
            )
        unit = "output tok/s"
    else:
        load = f"{p.tokens_per_gpu:,} tokens/GPU as {p.prompt:,}-token prompts"
        if p.prefix:
            load += f" after {p.prefix:,} cached tokens each"
        unit = "prompt tok/s"
    t = Table(
        title=f"{p.pool} EP{p.ep} on {p.hardware}, {p.cost_model}, imbalance {p.imbalance:g}"
        f"\n{load}",
        header_style="bold",
    )
    t.add_column("component")
    t.add_column("ms", justify="right")
    t.add_column("% of step", justify="right")
    for key, seconds in p.breakdown.items():
        if key == "a2a_hidden" or (key in _SHOWN_IF_CHARGED and not seconds):
            continue
        t.add_row(_LABELS.get(key, key), f"{seconds * 1e3:,.3f}", f"{seconds / p.step_s:.1%}")
    t.add_section()
    t.add_row("step", f"{p.step_s * 1e3:,.3f}", "100.0%", style="bold")
    hidden = p.breakdown.get("a2a_hidden", 0.0)
    t.add_row("all-to-all hidden behind compute", f"{hidden * 1e3:,.3f}", "-", style="dim")
    rates = Table(header_style="bold")
    rates.add_column("throughput")
    rates.add_column(unit, justify="right")
    rates.add_row("per GPU", f"{p.tokens_per_s_per_gpu:,.0f}")
    rates.add_row(f"per node ({p.gpus_per_node} GPUs)", f"{p.tokens_per_s_per_node:,.0f}")
    rates.add_row("per user", f"{p.tokens_per_s_per_user:,.1f}")
    _show([t, rates], notes)
