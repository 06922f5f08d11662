"""The command line: a thin shell whose errors are one line and exit status 2, never a traceback."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from deepinfer_sim.cli import main


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(main, list(args), catch_exceptions=False)

    return invoke


def test_run_writes_outputs_and_prints_a_summary(cli, tmp_path):
    out = tmp_path / "run"
    res = cli(
        "run",
        "default",
        "--out",
        str(out),
        "--no-plots",
        "--set",
        "workload.max_requests=200",
        "--set",
        "workload.repeat=1",
    )
    assert res.exit_code == 0, res.output
    assert "TTFT" in res.output and "results in" in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["completed"] == 200
    assert "pools:" in (out / "config.resolved.yaml").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "default", "--set", "pools.decode.epp=3"], "pools.decode.epp: unknown key"),
        (["run", "default", "--set", "nokeyvalue"], "expected KEY=VALUE"),
        (["run", "no-such-scenario"], "no scenario file or bundled scenario"),
        (["run", "default", "--set", "workload.trace=/no/such.jsonl"], "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, args, message):
    res = cli(*args)
    assert res.exit_code == 2
    assert message in res.output
    assert "Traceback" not in res.output
    assert res.output.count("error:") == 1


def test_malformed_trace_names_file_and_line(cli, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
        '{"timestamp": 1, "input_length": "x", "output_length": 5, "hash_ids": [2]}\n'
    )
    res = cli(
        "run",
        "default",
        "--set",
        f"workload.trace={trace}",
        "--no-plots",
        "--out",
        str(tmp_path / "o"),
    )
    assert res.exit_code == 2
    assert "t.jsonl:2" in res.output and "input_length" in res.output


def test_schema_and_show(cli):
    res = cli("schema")
    assert res.exit_code == 0
    assert "properties" in json.loads(res.output)
    res = cli("show", "default", "--set", "pools.decode.ep=128")
    assert res.exit_code == 0 and "ep: 128" in res.output


def test_eplb_answers_an_ep_what_if_without_a_cluster_run(cli, tmp_path):
    out = tmp_path / "eplb.json"
    res = cli(
        "eplb", "default", "--pool", "decode", "--ep", "16", "--redundant", "2",
        "--steps", "200", "--tokens-per-request", "5", "--json", str(out),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "decode EP16, 2 redundant/GPU" in res.output
    data = json.loads(out.read_text())
    assert 1.0 < data["eplb"]["imbalance"]["mean"] < data["static"]["imbalance"]["mean"]


def test_eplb_spreads_expert_tensor_parallel_experts_over_their_groups(cli, tmp_path):
    """Experts sliced over 2 GPUs (moe_tp 2): 16 GPUs hold 8 expert groups, which see the
    routed tokens of all 16 ranks; their imbalance is not that of 16 groups."""
    base = (
        "eplb", "default", "--pool", "decode", "--ep", "16", "--steps", "200",
        "--tokens-per-request", "5", "--set", "policies.eplb.decode.policy=static",
    )  # fmt: skip
    out_ep, out_tp = tmp_path / "ep.json", tmp_path / "tp.json"
    assert cli(*base, "--json", str(out_ep)).exit_code == 0
    res = cli(*base, "--set", "pools.decode.moe_tp=2", "--json", str(out_tp))
    assert res.exit_code == 0, res.output
    assert "decode EP16 (8 expert groups)" in res.output
    ep, tp = json.loads(out_ep.read_text()), json.loads(out_tp.read_text())
    assert (ep["expert_groups"], tp["expert_groups"]) == (16, 8)
    assert tp["static"]["imbalance"]["mean"] < ep["static"]["imbalance"]["mean"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eplb", "default", "--ep", "0"], "--ep"),
        (["eplb", "default", "--ep", "9", "--set", "pools.decode.moe_tp=2"], "moe_tp (2)"),
        (["eplb", "default", "--pool", "vision"], "--pool"),
        (["eplb", "default", "--set", "policies.eplb.load.skew=-1"], "policies.eplb.load.skew"),
    ],
)
def test_eplb_bad_input_is_one_clear_error(cli, args, message):
    res = cli(*args)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output


def test_sweep_ttl_writes_a_table_and_plots(cli, tmp_path):
    out = tmp_path / "ttl"
    res = cli(
        "sweep", "ttl", "default", "--ttl", "30s", "--ttl", "10m", "--ttl", "3d",
        "--capacity-tb", "0.05", "--gpus", "1024", "--out", str(out),
        "--set", "workload.max_requests=2000", "--set", "workload.repeat=1",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "per class" in res.output and "1024 GPUs" in res.output
    frame = pd.read_csv(out / "ttl_sweep.csv")
    uniform = frame[(frame["policy"] == "ttl") & (frame["traffic_class"] == "all")]
    unbounded = uniform[np.isinf(uniform["capacity_blocks"])].sort_values("ttl_s")
    assert list(unbounded["ttl_s"]) == [30.0, 600.0, 3 * 86400.0]
    assert unbounded["hit_rate"].is_monotonic_increasing
    assert (unbounded["nodes_needed"] % 12 == 0).all()
    assert (out / "ttl_hit_rate.png").exists()


@pytest.mark.parametrize(
    ("config", "classes"),
    [
        ("mixed", ["chatbot", "agent", "multimodal"]),
        ({"workload": {"sessions": {"days": 0.05}}}, ["chatbot", "agent"]),
    ],
    ids=["mixed", "sessions"],
)
def test_sweep_ttl_tables_every_class_under_per_class_ttls(cli, tmp_path, config, classes):
    """Issue 16: the per-class point carries a different TTL on each class row (chatbot 7 d,
    agent 3 d by default) and must still be one table row; a class that reuses no block
    (image requests) sweeps to zero hits instead of failing numpy's casting rules."""
    import yaml

    if isinstance(config, dict):
        path = tmp_path / "sessions.yaml"
        path.write_text(yaml.safe_dump(config))
        config = str(path)
    out = tmp_path / "ttl"
    res = cli("sweep", "ttl", config, "--ttl", "1m", "--ttl", "1d", "--no-plots", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert all(f"hit {c}" in res.output for c in classes)
    (row,) = [line for line in res.output.splitlines() if "per class" in line]
    assert row.count("%") == len(classes) + 1  # every class and "all"
    frame = pd.read_csv(out / "ttl_sweep.csv")
    point = frame[frame["policy"] == "class_ttl"].set_index("traffic_class")
    assert point.loc["chatbot", "ttl_s"] != point.loc["agent", "ttl_s"]


@pytest.mark.parametrize("bad", ["3x", "-1h", "soon"])
def test_sweep_ttl_rejects_a_bad_duration(cli, bad):
    res = cli("sweep", "ttl", "default", "--ttl", bad)
    assert res.exit_code == 2 and "duration" in res.output and "Traceback" not in res.output


def test_plan_recommends_a_deployment_and_writes_its_files(cli, tmp_path):
    import yaml
    from conftest import tiny_dict

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_dict()))
    out = tmp_path / "plan"
    res = cli(
        "plan", str(config), "--out", str(out),
        "--set", "planner.prefill_ep=[2]", "--set", "planner.prefill_instances=[1, 2]",
        "--set", "planner.decode_ep=[8]", "--set", "planner.bisection_steps=2",
        "--set", "planner.probe_seconds=20", "--set", "planner.probe_min_requests=100",
        "--what-if", "planner.traffic_scale=2",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "recommended:" in res.output and "delta vs base" in res.output
    doc = json.loads((out / "plan" / "plan.json").read_text())
    assert doc["recommended"]["replicas"] >= 1 and doc["why"]
    assert (out / "recommended" / "summary.json").exists()  # the input of `report`
    assert (out / "plan" / "frontier.png").exists() and (out / "plan" / "shapes.csv").exists()
    what_if = json.loads((out / "what_if" / "plan.json").read_text())
    assert what_if["target_rps"] == pytest.approx(2 * doc["target_rps"])
    assert what_if["delta"]["usd_h"] >= 0


def test_plan_rejects_a_bad_what_if_before_running(cli):
    res = cli("plan", "default", "--what-if", "pools.decode.epp=3")
    assert res.exit_code == 2 and "pools.decode.epp" in res.output


@pytest.mark.ray
def test_plan_on_ray_matches_the_local_executor(tmp_path):
    from deepinfer_sim.planner.executors import real_ray

    if real_ray() is None:
        pytest.skip("the optional `ray` extra is not installed")
    import yaml
    from conftest import tiny_dict

    from deepinfer_sim.planner.plan import plan

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_dict()))
    over = [
        "planner.prefill_ep=[2]", "planner.prefill_instances=[1]", "planner.decode_ep=[8]",
        "planner.bisection_steps=2", "planner.probe_seconds=20", "planner.probe_min_requests=100",
    ]  # fmt: skip
    local = plan(str(config), over)
    remote = plan(str(config), over, workers=1, executor="ray")
    assert local.best is not None and remote.best is not None
    assert remote.best.sustainable_rps == local.best.sustainable_rps
    assert remote.best.replicas == local.best.replicas
