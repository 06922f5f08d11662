"""Fuzzed scenarios: every generated one either runs to completion or fails with one clean
error — never a traceback, a hang or a silent nonsense result (issue 16's 832-case fuzz found
25 hangs and 8 tracebacks from non-finite and unbounded values; issue 29's found CPU hangs on
tiny accepted values: a rate scale, a router round, an expert-walk step, a storage bandwidth of
1e-9, a trace timestamp of 1e300).

Each case applies one to three ``--set`` overrides to the default scenario, drawn by a seeded
generator (the same cases every CI run) from keys that once hung or crashed, with values from
the hostile edges (non-finite, zero, negative, tiny, huge, booleans, wrong type, an EP that does
not split the experts, a trace file with a far timestamp) and from the ordinary middle. Runs are
cut to a few dozen requests, so an accepted case simulates in well under a second.

Every case runs in a forked child under a CPU-time limit (``RLIMIT_CPU``): a case that spins is
killed by the kernel and fails, naming its overrides, instead of hanging CI. Wall time is not
limited (a loaded machine is slow, not wrong); CPU seconds are what a hang burns.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import signal
import traceback
import warnings
from pathlib import Path
from typing import Any

import pytest

from deepinfer_sim import load_scenario, simulate
from deepinfer_sim.errors import ConfigWarning, UserError

CASES = 400
CPU_SECONDS = 5  # per case: an accepted case takes at most 0.4 CPU s here, a refused one 0.01

# Hostile values, each for any key. 1e-9 is the issue-29 value that made four keys spin.
HOSTILE: list[Any] = [
    ".inf", "-.inf", ".nan", 0, 0.0, -1, -1e-9, 1e-9, 1e-300, 1e300, 1e12, 10**12,
    "true", "false", "x", "''", "[1, 2]", "{a: 1}",
]  # fmt: skip

# key -> ordinary values (small enough to run in about a second)
ORDINARY: dict[str, list[Any]] = {
    "network.pd_gbps_per_8_gpus": [10, 100, 400, 3200],
    "workload.rate_scale": [0.5, 2, 25, 200],
    "workload.repeat": [1, 2, 3],
    "workload.spread.window_s": [0.1, 3, 30],
    "pools.prefill.instances": [1, 2, 8, 16],
    "pools.prefill.ep": [1, 2, 4, 8, 7, 5],  # 7 and 5 do not split 384 experts
    "pools.prefill.max_tokens_per_step": [1024, 8192, 65536],
    "pools.decode.ep": [8, 16, 32, 64, 96, 7, 100],
    "pools.decode.max_seqs_per_rank": [1, 16, 512],
    "pools.storage.read_gbytes_per_s": [0.1, 4, 100],
    "pools.storage.write_gbytes_per_s": [0.1, 5, 50],
    "pools.storage.disk_tb": [0.001, 1, 30.73],
    "pools.storage.mtbf_h": [0.01, 1, 1000],
    "sim.timeseries_interval_s": [0.05, 1, 10],
    "sim.horizon_s": [0.5, 2, 30, 1000],
    "sim.drain_limit_s": [60, 3600, 1e6],
    "policies.tiers.round_s": [0.1, 60, 600],
    "policies.eplb.load.drift_update_s": [0.1, 1, 60],
    "policies.eplb.imbalance": ["live", "constant"],
    "policies.prefill_router": ["tiered", "least_outstanding", "cache_affinity"],
    "cache.swa.vlan_gbps": [1, 400, 3200],
    "cache.prefix.load_gbps_per_8_gpus": [1, 400],
    "slo.ttft_s": [0.01, 5, 60],
    "slo.tpot_s": [0.001, 0.05, 1],
    "workload.trace": ["{far_trace}", "builtin:azure_conv_2023"],
}

# The values issues 16 and 29 found hanging or crashing, each a case of its own before the drawn
# ones (and drawn again among them, combined with other keys).
FOUND = [
    ["workload.rate_scale=1e-9"],
    ["policies.tiers.round_s=1e-9"],
    ["policies.eplb.load.drift_update_s=1e-9"],
    ["pools.storage.read_gbytes_per_s=1e-9"],
    ["pools.storage.disk_tb=1e-9"],
    ["workload.trace={far_trace}"],
    ["sim.horizon_s=1e-9"],
    ["pools.prefill.instances=true"],
    ["pools.decode.ep=7"],
    ["network.pd_gbps_per_8_gpus=1e-9"],
    ["sim.timeseries_interval_s=1e-9"],
    ["workload.rate_scale=.inf"],
]

SHRINK = ["workload.max_requests=40", "sim.progress=false", "workload.repeat=1"]


def _cases() -> list[list[str]]:
    rng = random.Random(29)
    keys = sorted(ORDINARY)
    out = [list(case) for case in FOUND]
    while len(out) < CASES:
        case = []
        for key in rng.sample(keys, rng.randint(1, 3)):
            pool = HOSTILE if rng.random() < 0.45 else ORDINARY[key]
            case.append(f"{key}={rng.choice(pool)}")
        out.append(case)
    return out


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Trace files a case may name, by placeholder: ``far_trace``, whose last timestamp is
    1e300 ms (it made ``run`` spin and ``trace stats`` raise)."""
    rows = [
        {"timestamp": t, "input_length": 600, "output_length": 8, "hash_ids": [h, h + 10]}
        for t, h in ((0, 1), (500, 2), (1e300, 3))
    ]
    path = tmp_path_factory.mktemp("fuzz-traces") / "far_trace.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"far_trace": str(path)}


@pytest.fixture(scope="module")
def warm() -> None:
    """One small run in the parent first, so every forked case starts with the modules imported
    and the caches filled, and spends its CPU budget on its own work."""
    simulate(load_scenario("default", SHRINK))


def _run_case(sets: list[str]) -> dict[str, Any]:
    """What one case did: ``refused`` (one UserError, its message), ``ran`` (with its checks
    held) or ``failed`` (anything else: a traceback, a broken invariant, a NaN latency)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a numpy RuntimeWarning is a failure...
            warnings.simplefilter("always", ConfigWarning)  # ...a config warning is an answer
            try:
                sc = load_scenario("default", SHRINK + sets)
                result = simulate(sc)
            except UserError as exc:
                message = str(exc)
                if not message or "Traceback" in message or "\n" in message.strip():
                    return {"outcome": "failed", "detail": f"unclear error: {message!r}"}
                return {"outcome": "refused", "detail": message}
        req = result.summary["requests"]
        if req["arrived"] != req["completed"] + req["rejected"] + req["in_flight"]:
            return {"outcome": "failed", "detail": f"requests do not add up: {req}"}
        for key in ("ttft_s", "e2e_s"):
            value = result.summary["latency"][key]["p50"]
            if not (value is None or math.isfinite(value)):
                return {"outcome": "failed", "detail": f"latency {key} p50 is {value}"}
        return {"outcome": "ran", "detail": f"{req['completed']} completed"}
    except BaseException:
        return {"outcome": "failed", "detail": traceback.format_exc()}


def run_under_cpu_limit(sets: list[str], cpu_seconds: int) -> dict[str, Any]:
    """Run one case in a forked child that the kernel stops after ``cpu_seconds`` of CPU
    (SIGXCPU, then SIGKILL a second later); a stopped case is ``failed`` with ``hang``."""
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():  # Python 3.12+ warns about fork in a threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read_fd)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
            with os.fdopen(write_fd, "w") as out:
                json.dump(_run_case(sets), out)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        text = pipe.read()
    _, status, usage = os.wait4(pid, 0)
    cpu = usage.ru_utime + usage.ru_stime
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        detail = f"hang: killed by {sig} after {cpu_seconds} CPU s"
        return {"outcome": "failed", "detail": detail, "cpu_s": cpu}
    if not text:
        detail = f"the child exited {os.WEXITSTATUS(status)}"
        return {"outcome": "failed", "detail": detail, "cpu_s": cpu}
    result: dict[str, Any] = json.loads(text)
    result["cpu_s"] = cpu
    return result


def test_the_cpu_limit_stops_a_spinning_case_and_names_it() -> None:
    """The harness itself: a case that spins is stopped by its CPU limit and reported as a
    hang, not waited for (the limit is what makes the fuzz below catch the hang class)."""
    from unittest import mock

    def spin(_sets: list[str]) -> dict[str, Any]:
        while True:
            pass

    with mock.patch(f"{__name__}._run_case", spin):
        result = run_under_cpu_limit(["policies.tiers.round_s=1e-9"], cpu_seconds=1)
    assert result["outcome"] == "failed"
    assert result["detail"] == "hang: killed by SIGXCPU after 1 CPU s"


def test_fuzzed_scenarios_run_or_fail_cleanly_within_a_cpu_budget(
    traces: dict[str, str], warm: None
) -> None:
    """Every case ends in one clean refusal or a run whose checks hold, each within
    ``CPU_SECONDS`` of CPU; a failure lists every case that broke, with its overrides."""
    cases = _cases()
    assert len(cases) >= 300
    outcomes: dict[str, int] = {}
    failures = []
    for sets in cases:
        for name, path in traces.items():
            sets = [s.replace(f"{{{name}}}", path) for s in sets]
        result = run_under_cpu_limit(sets, CPU_SECONDS)
        outcomes[result["outcome"]] = outcomes.get(result["outcome"], 0) + 1
        if result["outcome"] == "failed":
            failures.append(f"--set {' --set '.join(sets)}\n    {result['detail']}")
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)
    # the fuzz reaches both sides: refusals and runs
    assert outcomes.get("refused", 0) > 50 and outcomes.get("ran", 0) > 50, outcomes


@pytest.mark.parametrize(
    "bad",
    [
        "network.pd_gbps_per_8_gpus=.inf",
        "workload.rate_scale=.inf",
        "workload.rate_scale=.nan",
        "pools.prefill.instances=1000000000",
        "sim.timeseries_interval_s=1e-9",
        "pools.prefill.instances=true",
        "pools.decode.ep=7",
        "pools.storage.read_gbytes_per_s=1e-9",
    ],
)
def test_the_cases_that_once_hung_or_crashed_are_refused(bad: str) -> None:
    with pytest.raises(UserError):
        load_scenario("default", [*SHRINK, bad])


@pytest.mark.parametrize(
    "bad",
    [
        "workload.rate_scale=1e-9",
        "policies.tiers.round_s=1e-9",
        "policies.eplb.load.drift_update_s=1e-9",
        "sim.horizon_s=1e-9",
        "pools.storage.disk_tb=1e-9",
    ],
)
def test_the_values_that_once_spun_are_refused_before_the_run(bad: str, warm: None) -> None:
    """These load (the scenario alone cannot tell), and the run refuses them up front: when its
    workload's arrivals tell how long its clocks would tick, or (a disk) when the store it
    builds would hold no KV block. (Under the CPU limit: before the fix, each spun.)"""
    load_scenario("default", [*SHRINK, bad])
    result = run_under_cpu_limit([bad], CPU_SECONDS)
    assert result["outcome"] == "refused", result
    assert bad.split("=")[0].split(".")[0] in result["detail"]


def test_a_load_the_deployment_cannot_drain_stops_with_an_error_and_leaves_it(
    tmp_path: Path,
) -> None:
    """A link a billion times too slow used to simulate for ever; the bandwidth floor now
    refuses one that cannot move a KV block within the drain limit, and a link merely too slow
    for the load stops the run ``sim.drain_limit_s`` after the last arrival with one error,
    its folder keeping the resolved config and error.json."""
    from click.testing import CliRunner

    from deepinfer_sim.cli import main

    out = tmp_path / "run"
    sets = [*SHRINK, "network.pd_gbps_per_8_gpus=0.001", "sim.drain_limit_s=600"]
    args = ["run", "default", "--out", str(out), "--no-plots", "-q"]
    for s in sets:
        args += ["--set", s]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "still in flight 600 simulated s" in res.output, res.output
    assert "Traceback" not in res.output
    assert (out / "config.resolved.yaml").exists()
    record = (out / "error.json").read_text()
    assert '"user_error": true' in record and "drain_limit_s" in record
