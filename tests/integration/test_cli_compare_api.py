"""``deepinfer-sim compare-api``: prints the comparison, writes its plot and every number as
JSON, and turns bad input into one ``error:`` line and exit status 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from deepinfer_sim.cli import main

SMALL_SESSIONS = [
    "--set", "workload.sessions.days=2",
    "--set", "workload.sessions.sessions_per_day=300",
    "--set", "compare_api.warmup_s=86400",
    "--set", "compare_api.volume_points=41",
]  # fmt: skip


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(main, list(args))

    return invoke


def test_compare_api_prints_a_break_even_and_writes_the_plot_and_json(cli, tmp_path):
    out, extra = tmp_path / "cmp", tmp_path / "numbers.json"
    res = cli("compare-api", "default", *SMALL_SESSIONS, "--out", str(out), "--json", str(extra))
    assert res.exit_code == 0, res.output
    assert "self-hosting against the API" in res.output and "break-even" in res.output
    png = (out / "compare_api.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    numbers = json.loads(extra.read_text())
    assert numbers == json.loads((out / "compare_api.json").read_text())
    first = numbers["variants"][0]
    assert first["break_even"]["tokens_per_day"] > numbers["workload"]["tokens_per_day"]
    assert len(first["curve_usd_per_day"]) == len(numbers["curve"]["api_usd_per_day"]) == 41
    assert numbers["api"]["prices"]["output_per_mtok_usd"] == 1.2
    assert first["capacity"]["decode_source"].startswith("steady model")
    assert len(first["at_workload"]["instances_by_hour"]["prefill"]) == 24


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "prices.api.output_per_mtok_usd=-1"], "prices.api.output_per_mtok_usd"),
        (["--set", "prices.api.input_cache_hit_per_mtok_usd=1"], "must not exceed"),
        (["--set", "compare_api.spin_up_s=nope"], "compare_api.spin_up_s"),
        (["--set", "compare_api.warmup_s=1e7"], "leaves no arrivals to count"),
        (["--no-such-option"], "No such option"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(cli, tmp_path, args, message):
    res = cli("compare-api", "default", *SMALL_SESSIONS, "--out", str(tmp_path), *args)
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert res.output.count("error:") == 1 and "Traceback" not in res.output


def test_an_unwritable_json_path_fails_before_any_work(cli, tmp_path):
    res = cli("compare-api", "default", "--json", str(tmp_path))  # a folder, not a file
    assert res.exit_code == 2
    assert "is a directory" in res.output and res.output.count("error:") == 1
