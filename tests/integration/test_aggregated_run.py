"""Aggregated serving end to end, through the command line: the bundled example
(``configs/scenarios/v3-h200-aggregated.yaml``: V3 on 8 x H200, TP8 attention + EP8 experts,
prefill chunks and decode in the same steps) runs, reports and exports like any scenario, and
its mistakes are one ``error:`` line naming the key, exit status 2."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from deepinfer_sim.cli import main

EXAMPLE = "v3-h200-aggregated"
SMALL = ["--set", "workload.max_requests=400"]


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(main, list(args), catch_exceptions=False)

    return invoke


def test_the_bundled_example_runs_reports_and_exports(cli, tmp_path):
    """``run`` prints the latencies, the pool's busy split (prefill chunks / decode) and its 8
    GPUs, and writes a summary with the aggregated pool's load; ``report`` and ``timeline``
    read the folder back."""
    out = tmp_path / "run"
    res = cli("run", EXAMPLE, "--out", str(out), "--no-plots", *SMALL)
    assert res.exit_code == 0, res.output
    assert "TTFT" in res.output and "TPOT" in res.output
    assert "cost       8 GPUs" in res.output
    s = json.loads((out / "summary.json").read_text())
    assert s["requests"]["completed"] == 400
    assert s["cost"]["gpus"] == {"vision": 0, "aggregated": 8, "total": 8}
    load = s["load"]["aggregated"]
    assert load["mixed_steps"] > 0 and load["prefill_stall_s_mean"] > 0
    assert 0 < s["utilization"]["prefill"] < s["utilization"]["aggregated"] <= 1
    assert s["transfer"]["bytes"] == 0
    assert "serving: aggregated" in (out / "config.resolved.yaml").read_text()
    frame = pd.read_parquet(out / "requests.parquet")
    assert (frame["t_first_token_s"] == frame["t_prefill_end_s"]).all()
    ts = pd.read_parquet(out / "timeseries.parquet")
    assert {"prefill_util", "decode_util", "aggregated_util"} <= set(ts.columns)
    assert (ts["aggregated_util"] >= ts["prefill_util"]).all()

    html = tmp_path / "report.html"
    res = cli("report", str(out), "--out", str(html))
    assert res.exit_code == 0, res.output
    page = html.read_text()
    assert "aggregated busy" in page and "prefill stall (mean)" in page

    res = cli("timeline", str(out), "--out", str(tmp_path / "timeline.json"))
    assert res.exit_code == 0, res.output


def test_a_disaggregated_run_reports_no_aggregated_pool(cli, tmp_path):
    """The default stays disaggregated, and its summary has none of the aggregated keys."""
    out = tmp_path / "run"
    res = cli("run", "azure-conv-b200", "--out", str(out), "--no-plots", *SMALL)
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    assert "aggregated" not in s["utilization"] and "aggregated" not in s["load"]
    assert "aggregated" not in s["cost"]["gpus"]
    assert "aggregated_util" not in pd.read_parquet(out / "timeseries.parquet").columns


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--set", "pools.aggregated.max_tokens_per_step=64"],
            "pools.aggregated.max_tokens_per_step: 64 tokens cannot hold the decode tokens",
        ),
        (["--set", "pools.aggregated.tp=3"], "pools.aggregated: Value error, tp (3) must divide"),
        (["--set", "pools.aggregated.batch=3"], "pools.aggregated.batch: unknown key"),
        (["--set", "serving=both"], "serving: Input should be 'disaggregated' or 'aggregated'"),
        (
            ["--set", "pools.aggregated.ep=6", "--set", "pools.aggregated.tp=2"],
            "pools.aggregated.ep: EP6 does not split the model's 256 routed experts",
        ),
    ],
)
def test_a_bad_aggregated_config_is_one_error_line(cli, args, message):
    res = cli("run", EXAMPLE, *args)
    assert res.exit_code == 2
    assert message in res.output
    assert res.output.count("error:") == 1 and "Traceback" not in res.output


def test_pools_aggregated_without_serving_aggregated_is_an_error(cli):
    res = cli("run", "default", "--set", "pools.aggregated.ep=8")
    assert res.exit_code == 2
    assert "pools.aggregated: set, but serving is disaggregated" in res.output
    assert res.output.count("error:") == 1
