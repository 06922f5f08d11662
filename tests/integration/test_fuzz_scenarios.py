"""Fuzzed scenarios: every generated one either runs to completion or fails with one clean
error — never a traceback, a hang or a silent nonsense result (issue 16's 832-case fuzz found
25 hangs and 8 tracebacks from non-finite and unbounded values).

Hypothesis draws one to three `--set` overrides on the default scenario from keys that once hung
or crashed, with values from the hostile edges (non-finite, zero, negative, tiny, huge, wrong
type) and from the ordinary middle. Runs are shrunk to a few dozen requests, and sizes in the
ordinary range stay small, so an accepted scenario finishes in about a second; huge-but-legal
sizes are left to the validation bounds' own tests (tests/unit/test_input_hardening.py).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepinfer_sim import load_scenario, simulate
from deepinfer_sim.errors import UserError

HOSTILE_FLOATS = st.sampled_from(
    [math.inf, -math.inf, math.nan, 0.0, -1.0, 1e-300, 1e300, 1e12, -1e-9]
)
HOSTILE = st.one_of(HOSTILE_FLOATS, st.sampled_from([0, -1, 10**12, "x", "", "[1, 2]", "{a: 1}"]))

# key -> strategy of ordinary values (small enough to run in about a second)
ORDINARY = {
    "network.pd_gbps_per_8_gpus": st.floats(10, 3200),
    "workload.rate_scale": st.floats(0.5, 200),
    "workload.repeat": st.integers(1, 3),
    "pools.prefill.instances": st.integers(1, 16),
    "pools.prefill.max_tokens_per_step": st.integers(1024, 65536),
    "pools.decode.max_seqs_per_rank": st.integers(1, 512),
    "sim.timeseries_interval_s": st.floats(0.05, 10),
    "slo.ttft_s": st.floats(0.01, 60),
    "slo.tpot_s": st.floats(0.001, 1),
    "cache.swa.vlan_gbps": st.floats(1, 3200),
    "pools.storage.read_gbytes_per_s": st.floats(0.1, 100),
    "workload.spread.window_s": st.floats(0.1, 30),
}


@st.composite
def overrides(draw: st.DrawFn) -> list[str]:
    keys = draw(st.lists(st.sampled_from(sorted(ORDINARY)), min_size=1, max_size=3, unique=True))
    out = []
    for key in keys:
        value = draw(st.one_of(HOSTILE, ORDINARY[key]))
        out.append(f"{key}={value}")
    return out


SHRINK = ["workload.max_requests=40", "sim.progress=false", "workload.repeat=1"]


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,  # same examples every CI run
    suppress_health_check=[HealthCheck.too_slow],
)
@given(overrides())
def test_a_fuzzed_scenario_runs_or_fails_cleanly(sets: list[str]) -> None:
    # the drawn overrides come last, so a drawn workload.repeat wins over the shrink
    try:
        sc = load_scenario("default", SHRINK + sets)
    except UserError as exc:
        assert str(exc) and "Traceback" not in str(exc)
        return
    try:
        result = simulate(sc)
    except UserError:
        return  # a clean refusal found at build time (e.g. nothing fits) is fine
    req = result.summary["requests"]
    assert req["arrived"] == req["completed"] + req["rejected"] + req["in_flight"]
    for key in ("ttft_s", "e2e_s"):
        value = result.summary["latency"][key]["p50"]
        assert value is None or math.isfinite(value)


@pytest.mark.parametrize(
    "bad",
    [
        "network.pd_gbps_per_8_gpus=.inf",
        "workload.rate_scale=.inf",
        "workload.rate_scale=.nan",
        "pools.prefill.instances=1000000000",
        "sim.timeseries_interval_s=1e-9",
    ],
)
def test_the_cases_that_once_hung_or_crashed_are_refused(bad: str) -> None:
    with pytest.raises(UserError):
        load_scenario("default", [*SHRINK, bad])


def test_a_load_the_deployment_cannot_drain_stops_with_an_error_and_leaves_it(tmp_path) -> None:
    """A link a billion times too slow used to simulate for ever; now the run stops
    ``sim.drain_limit_s`` after the last arrival with one error, and its folder keeps the
    resolved config and error.json."""
    from click.testing import CliRunner

    from deepinfer_sim.cli import main

    out = tmp_path / "run"
    sets = [*SHRINK, "network.pd_gbps_per_8_gpus=1e-9", "sim.drain_limit_s=600"]
    args = ["run", "default", "--out", str(out), "--no-plots", "-q"]
    for s in sets:
        args += ["--set", s]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "still in flight 600 simulated s" in res.output
    assert "Traceback" not in res.output
    assert (out / "config.resolved.yaml").exists()
    record = (out / "error.json").read_text()
    assert '"user_error": true' in record and "drain_limit_s" in record
