"""Issue 29, item 3: a value that sets how much work a run does cannot make it spin.

A run's clocks (the time-series sampler, the tiered router's rounds, the expert-popularity walk,
random storage failures) tick over its whole simulated span, whether or not a request moves. A
tiny period, a tiny rate scale (a span of centuries), a trace timestamp of 1e300 or a bandwidth
that never lets a request finish made ``deepinfer-sim run`` spin for minutes without a line of
output. Now each is refused before the run with one ``error:`` line naming the key: a period by
the count of clock ticks the run states up front (``check_run_size``), a bandwidth by the floor
of one KV block within the drain limit, a disk by its size, a trace by its own bound.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from deepinfer_sim import simulate
from deepinfer_sim.cli import main
from deepinfer_sim.errors import ConfigError, ConfigWarning
from deepinfer_sim.models.registry import bundled_dir
from deepinfer_sim.rng import stream
from deepinfer_sim.scenario import (
    MAX_CLOCK_TICKS,
    StoragePool,
    bundled_scenarios,
    check_run_size,
    load_scenario,
)
from deepinfer_sim.sim.stages.kvstore import KvStore
from deepinfer_sim.traces.workload import build_source

SMALL = ["workload.max_requests=40", "workload.repeat=1", "sim.progress=false"]


def run_cli(tmp_path: Path, *sets: str, config: str = "default") -> tuple[int, str]:
    args = ["run", config, "--out", str(tmp_path / "run"), "--no-plots", "-q"]
    for s in [*SMALL, *sets]:
        args += ["--set", s]
    res = CliRunner().invoke(main, args)
    return res.exit_code, res.output


def assert_one_error_line(code: int, output: str, *needles: str) -> None:
    assert code == 2, output
    assert output.startswith("error:") and "Traceback" not in output, output
    assert len(output.strip().splitlines()) == 1, output
    for needle in needles:
        assert needle in output, output


@pytest.mark.parametrize(
    ("override", "key", "why"),
    [
        # the four: each spun for over 110 s without a line of output
        ("workload.rate_scale=1e-9", "workload", "past the year a run may simulate"),
        ("policies.tiers.round_s=1e-9", "policies.tiers.round_s", "clocks would tick 8.64e+13"),
        ("policies.eplb.load.drift_update_s=1e-9", "policies.eplb.load.drift_update_s", "8.64e+13"),
        ("pools.storage.read_gbytes_per_s=1e-9", "pools.storage.read_gbytes_per_s", "too slow"),
        # the same class: the other bandwidths a request's KV crosses, the failure clock, the
        # sample grid over a long drain
        ("pools.storage.write_gbytes_per_s=1e-9", "pools.storage.write_gbytes_per_s", "too slow"),
        ("network.pd_gbps_per_8_gpus=1e-9", "network.pd_gbps_per_8_gpus", "too slow"),
        ("cache.prefix.load_gbps_per_8_gpus=1e-9", "cache.prefix.load_gbps_per_8_gpus", "too slow"),
        ("cache.swa.vlan_gbps=1e-9", "cache.swa.vlan_gbps", "too slow"),
        ("pools.storage.mtbf_h=1e-9", "pools.storage.mtbf_h", "clocks would tick"),
        ("sim.drain_limit_s=3e7", "sim.timeseries_interval_s", "sim.drain_limit_s 3e+07 s"),
        ("pools.storage.disk_tb=1e-9", "pools.storage.disk_tb", "hold no 0.399 MB KV block"),
    ],
)
def test_a_value_that_would_make_a_run_spin_is_one_error_line(
    override: str, key: str, why: str, tmp_path: Path
) -> None:
    """As a user would try it: ``deepinfer-sim run default --set KEY=1e-9``."""
    extra = ["pools.storage.mttr_h=1e-9"] if "mtbf_h" in override else []
    code, out = run_cli(tmp_path, override, *extra)
    assert_one_error_line(code, out, f"{key}:", why)


def test_the_clock_count_names_every_clock_and_the_key_to_raise() -> None:
    """The refusal says how many ticks, over which span, and how they split by setting, and
    names the setting with the most of them."""
    sc = load_scenario("default", [*SMALL, "policies.tiers.round_s=0.001"])
    source = build_source(sc.workload, sc.seed)
    with pytest.raises(ConfigError) as exc:
        check_run_size(sc, source.arrival_s)
    assert exc.value.path == "policies.tiers.round_s"
    text = str(exc.value)
    assert "sim.drain_limit_s 86400 s" in text and f"{MAX_CLOCK_TICKS:,}" in text
    for clock in ("sim.timeseries_interval_s", "policies.eplb.load.drift_update_s"):
        assert clock in text
    assert text.endswith("Raise policies.tiers.round_s, or shorten the run")


def test_a_run_states_its_clock_ticks_before_it_starts() -> None:
    """``check_run_size`` returns the ticks of each clock over the run's longest span (the last
    arrival plus the drain limit, or the horizon): the default scenario's sampler and expert
    walk tick once a second, its router once a minute."""
    sc = load_scenario("default", SMALL)
    source = build_source(sc.workload, sc.seed)
    ticks = check_run_size(sc, source.arrival_s)
    span = float(source.arrival_s[-1]) + 86400.0
    assert ticks == pytest.approx(
        {
            "sim.timeseries_interval_s": span,
            "policies.eplb.load.drift_update_s": span,
            "policies.tiers.round_s": span / 60,
        }
    )
    cut = load_scenario("default", [*SMALL, "sim.horizon_s=100"])
    assert check_run_size(cut, source.arrival_s)["sim.timeseries_interval_s"] == 100


def test_every_bundled_scenario_is_within_the_bounds() -> None:
    """The bounds refuse only what no deployment needs: every bundled and published scenario
    loads, and its run is well inside the clock budget."""
    refs: list[str | Path] = [*bundled_scenarios()]
    refs += sorted(bundled_dir("published").glob("*.yaml"))
    for ref in refs:
        sc = load_scenario(ref)
        source = build_source(sc.workload, sc.seed)
        assert sum(check_run_size(sc, source.arrival_s).values()) < MAX_CLOCK_TICKS / 10, ref


def test_a_trace_timestamp_of_1e300_is_one_error_line_in_run_and_trace_stats(
    tmp_path: Path,
) -> None:
    """``trace stats`` raised a ValueError on it, and ``run`` spun; both now name the line."""
    trace = tmp_path / "far.jsonl"
    rows = [(0, [1]), (1000, [2]), (1e300, [3])]
    trace.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 100, "output_length": 10, "hash_ids": h})
            + "\n"
            for t, h in rows
        )
    )
    res = CliRunner().invoke(main, ["trace", "stats", str(trace)])
    assert_one_error_line(res.exit_code, res.output, f"{trace}:3:", "'timestamp'", "31.7 years")
    scenario = tmp_path / "far.yaml"
    scenario.write_text(f"name: far\nworkload: {{trace: {trace}}}\n")
    code, out = run_cli(tmp_path, config=str(scenario))
    assert_one_error_line(code, out, f"{trace}:3:", "'timestamp'")


def test_a_store_that_holds_no_block_is_a_config_error_not_a_division_by_zero() -> None:
    """``pools.storage.disk_tb: 1e-9`` used to end a run with ``ZeroDivisionError`` in
    ``used_fraction``. A store whose coding group holds no KV block is now refused where it is
    built, naming the key (tests size disks in MB to exercise GC, so the key has no floor)."""
    with pytest.raises(ConfigError) as exc:
        KvStore(StoragePool(nodes=12), ["chatbot"], 1e16, stream(0, "test"))
    assert exc.value.path == "pools.storage.disk_tb" and "hold no" in str(exc.value)


def test_a_horizon_before_the_first_arrival_is_refused_and_one_that_completes_nothing_warns(
    tmp_path: Path,
) -> None:
    """``sim.horizon_s: 1e-9`` exited 0 with empty latencies. A horizon that ends the run before
    any request arrives is now an error; one that lets requests arrive but none complete runs,
    and says so in one ``warning:`` line."""
    code, out = run_cli(tmp_path, "sim.horizon_s=1e-9")
    assert_one_error_line(code, out, "sim.horizon_s:", "before the first request arrives")
    sc = load_scenario("default", [*SMALL, "sim.horizon_s=0.01"])
    with pytest.warns(ConfigWarning, match="no request completed within the 0.01 simulated s"):
        result = simulate(sc)
    assert result.summary["requests"]["completed"] == 0
    with warnings.catch_warnings():  # a horizon that completes something says nothing
        warnings.simplefilter("error")
        result = simulate(load_scenario("default", [*SMALL, "sim.horizon_s=2"]))
    assert result.summary["requests"]["completed"] > 0
    assert np.isfinite(result.summary["latency"]["ttft_s"]["p50"])
