"""CI smoke matrix: every command of the CLI on every bundled scenario, in seconds.

Each bundled scenario (``default`` and ``configs/scenarios/*.yaml``) and a minimal sessions
workload (``workload: {sessions: {days: 2}}``, the scenario of issue 16) goes through every
command that takes a scenario; commands that take none run once. Runs are shrunk with the same
``--set`` overrides a user would type: ``workload.max_requests`` caps every workload, a sessions
generator is asked for a fraction of a day, and ``plan`` searches one shape with short probes.
Nothing is checked but that each command exits 0 without a traceback: what the commands compute
is the business of their own tests. ``test_every_command_is_in_the_matrix`` keeps the matrix in
step with the CLI, so a new command fails here until it is added (or skipped, with a reason).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner, Result

from deepinfer_sim.cli import main
from deepinfer_sim.planner.analysis.published import published_dir
from deepinfer_sim.scenario import bundled_scenarios, load_scenario

SESSIONS = "sessions"
"""The minimal sessions scenario, written to a file by the ``scenarios`` fixture."""

SCENARIOS = [*bundled_scenarios(), SESSIONS]

# Overrides that size a scenario's runs to about a second.
SHRINK = ["--set", "workload.max_requests=100"]
SHORT_SESSIONS = ["--set", "workload.sessions.days=0.02"]  # ~5 min of synthetic sessions
PLAN_ONE_SHAPE = [
    "--set", "planner.prefill_ep=[4]", "--set", "planner.prefill_instances=[4]",
    "--set", "planner.decode_ep=[64]", "--set", "planner.bisection_steps=2",
    "--set", "planner.probe_seconds=5", "--set", "planner.probe_min_requests=50",
]  # fmt: skip

# Commands that take no scenario, or need what CI does not have.
NOT_IN_MATRIX = {
    "calibrate": "times kernels with torch on a device; tests/unit and the device runs cover it",
    "derive-profile": "works on calibration profiles, not scenarios; see "
    "tests/integration/test_calibration_profiles.py",
    "merge-profiles": "works on calibration profiles, not scenarios",
}


def check(res: Result) -> None:
    """Exit status 0 and no traceback, with the output and the exception on failure."""
    error = ""
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        error = "".join(traceback.format_exception(res.exception))
    assert res.exit_code == 0 and not error and "Traceback" not in res.output, (
        f"exit {res.exit_code}\n{res.output}\n{error}"
    )


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, list[str]]]:
    """Scenario name -> (the CONFIG argument, its shrinking overrides)."""
    path = tmp_path_factory.mktemp("scenarios") / "sessions.yaml"
    path.write_text(yaml.safe_dump({"workload": {"sessions": {"days": 2}}}), encoding="utf-8")
    out: dict[str, tuple[str, list[str]]] = {}
    for name in SCENARIOS:
        config = str(path) if name == SESSIONS else name
        shrink = SHRINK + (SHORT_SESSIONS if name == SESSIONS or _has_sessions(name) else [])
        if name == SESSIONS:  # replayed in real time: 100 requests would take minutes of steps
            shrink += ["--set", "workload.rate_scale=20"]
        out[name] = (config, shrink)
    return out


def _has_sessions(name: str) -> bool:
    return load_scenario(name).workload.sessions is not None


@pytest.fixture(scope="module")
def invoke() -> Callable[..., Result]:
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(main, list(args))

    return run


class _Once:
    """Results of a command per scenario, computed on first use: ``report`` reads the folder
    ``run`` wrote, ``trace stats`` and ``convert`` read the file ``trace synth`` wrote."""

    def __init__(self, make: Callable[[str], tuple[Result, Path]]) -> None:
        self.make = make
        self.done: dict[str, tuple[Result, Path]] = {}

    def __call__(self, name: str) -> tuple[Result, Path]:
        if name not in self.done:
            self.done[name] = self.make(name)
        return self.done[name]


@pytest.fixture(scope="module")
def runs(invoke, scenarios, tmp_path_factory) -> Iterator[_Once]:
    def make(name: str) -> tuple[Result, Path]:
        config, shrink = scenarios[name]
        out = tmp_path_factory.mktemp(f"run-{name}")
        return invoke("run", config, "--out", str(out), *shrink), out

    yield _Once(make)


@pytest.fixture(scope="module")
def synths(invoke, scenarios, tmp_path_factory) -> Iterator[_Once]:
    def make(name: str) -> tuple[Result, Path]:
        config, shrink = scenarios[name]
        out = tmp_path_factory.mktemp(f"synth-{name}") / "workload.parquet"
        return invoke("trace", "synth", config, str(out), *shrink), out

    yield _Once(make)


# ---- the matrix -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCENARIOS)
def test_show(invoke, scenarios, name):
    config, shrink = scenarios[name]
    check(invoke("show", config, *shrink))


@pytest.mark.parametrize("name", SCENARIOS)
def test_run(runs, name):
    res, out = runs(name)
    check(res)
    assert (out / "summary.json").exists()


@pytest.mark.parametrize("name", SCENARIOS)
def test_report(invoke, runs, name, tmp_path):
    res, run_dir = runs(name)
    if res.exit_code:
        pytest.skip(f"`run` failed on {name}; test_run[{name}] reports it")
    check(invoke("report", str(run_dir), "--out", str(tmp_path / "report.html")))


@pytest.mark.parametrize("name", SCENARIOS)
def test_timeline(invoke, runs, name, tmp_path):
    res, run_dir = runs(name)
    if res.exit_code:
        pytest.skip(f"`run` failed on {name}; test_run[{name}] reports it")
    check(invoke("timeline", str(run_dir), "--out", str(tmp_path / "timeline.json")))


@pytest.mark.parametrize("pool", ["decode", "prefill"])
@pytest.mark.parametrize("name", SCENARIOS)
def test_eplb(invoke, scenarios, name, pool):
    config, shrink = scenarios[name]
    check(invoke("eplb", config, "--pool", pool, "--steps", "50", *shrink))


@pytest.mark.parametrize(
    "point",
    [
        ["--pool", "decode", "--batch", "32", "--context", "4096"],
        ["--pool", "decode", "--user-speed", "50", "--context", "4096"],
        ["--pool", "prefill", "--prompt", "4096"],
    ],
    ids=["decode", "decode-user-speed", "prefill"],
)
@pytest.mark.parametrize("name", SCENARIOS)
def test_cost(invoke, scenarios, name, point):
    config, shrink = scenarios[name]
    check(invoke("cost", config, *point, *shrink))


@pytest.mark.parametrize("name", SCENARIOS)
def test_sweep_ttl(invoke, scenarios, name, tmp_path):
    config, shrink = scenarios[name]
    check(invoke("sweep", "ttl", config, "--out", str(tmp_path), *shrink))


@pytest.mark.parametrize("name", SCENARIOS)
def test_sweep_grid(invoke, scenarios, name, tmp_path):
    config, shrink = scenarios[name]
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"axes": {"seed": [1]}}), encoding="utf-8")
    out = tmp_path / "sweep"
    check(invoke("sweep", "grid", config, "--grid", str(grid), "--out", str(out), *shrink))


@pytest.mark.parametrize("name", SCENARIOS)
def test_plan(invoke, scenarios, name, tmp_path):
    config, shrink = scenarios[name]
    check(invoke("plan", config, "--out", str(tmp_path), *shrink, *PLAN_ONE_SHAPE))


@pytest.mark.parametrize("name", SCENARIOS)
def test_compare_api(invoke, scenarios, name, tmp_path):
    """Every scenario but an aggregated one, which compare-api refuses in one line (it sizes
    disaggregated pools only: docs/planner.md)."""
    config, shrink = scenarios[name]
    res = invoke("compare-api", config, "--out", str(tmp_path), *shrink)
    if name in bundled_scenarios() and load_scenario(name).aggregated:
        assert res.exit_code == 2 and res.output.count("error:") == 1, res.output
        assert "serving: aggregated is not supported" in res.output
        return
    check(res)


@pytest.mark.parametrize("name", SCENARIOS)
def test_launch(invoke, scenarios, name, tmp_path):
    config, shrink = scenarios[name]
    check(invoke("launch", config, "--out", str(tmp_path), *shrink))
    assert {p.name for p in (tmp_path / "launch").iterdir()} == {
        "sglang.sh",
        "vllm.sh",
        "dynamo.yaml",
    }


@pytest.mark.parametrize("name", SCENARIOS)
def test_trace_synth(synths, name):
    res, out = synths(name)
    check(res)
    assert out.exists()


@pytest.mark.parametrize("name", SCENARIOS)
def test_trace_stats_and_convert(invoke, synths, name, tmp_path):
    res, trace = synths(name)
    if res.exit_code:
        pytest.skip(f"`trace synth` failed on {name}; test_trace_synth[{name}] reports it")
    stats = tmp_path / "stats.json"
    check(invoke("trace", "stats", str(trace), "--lru-blocks", "1000", "--json", str(stats)))
    check(invoke("trace", "convert", str(trace), str(tmp_path / "copy.parquet")))


SGLANG_CASES = published_dir() / "sglang-v3-h100-96gpu.yaml"


@pytest.mark.parametrize(
    "args",
    # the whole corpus and validate's refits leaving each source out are
    # tests/unit/test_published.py's; here one case file, both cost-model families
    [
        ["validate", "--no-loso", "--case-file", str(SGLANG_CASES)],
        ["list"],
        ["schema"],
    ],
    ids=lambda args: " ".join(args),
)
def test_commands_without_a_scenario(invoke, args):
    check(invoke(*args))


# ---- the matrix covers the CLI ----------------------------------------------------------------

IN_MATRIX = {
    "show", "run", "report", "timeline", "eplb", "cost", "sweep ttl", "sweep grid", "plan",
    "trace synth", "trace stats", "trace convert", "validate", "list", "schema", "compare-api",
    "launch",
}  # fmt: skip


def _commands(group: click.Group, prefix: str = "") -> Iterator[str]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}"


def test_every_command_is_in_the_matrix():
    """A command added to the CLI joins the matrix above (or ``NOT_IN_MATRIX``, with why)."""
    commands = set(_commands(main))
    assert commands - IN_MATRIX - set(NOT_IN_MATRIX) == set()
    assert IN_MATRIX | set(NOT_IN_MATRIX) <= commands


@pytest.mark.parametrize("command", sorted(IN_MATRIX | set(NOT_IN_MATRIX)))
def test_help(invoke, command):
    check(invoke(*command.split(), "--help"))
