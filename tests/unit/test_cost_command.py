"""Steady operating points of one pool (``planner/analysis/steady.py``) and ``deepinfer-sim cost``.

A steady point asks the pool's StepCost one question — how long is a step when every rank carries
this load — and reads throughput off the answer, with no simulation. These tests pin what a
reader of ``deepinfer-sim cost`` relies on: the breakdown accounts for the whole step; throughput
is tokens emitted over step time; the cost responds to load the way a GPU does (more context, more
attention; a bigger batch, more tokens per GPU but fewer per user); the user-speed search returns
the edge of what meets the speed; the default acceptance is the expectation of the simulator's
own draft-acceptance process. The command prints the point, writes it as JSON, and reports a bad
option as one ``error:`` line, never a traceback.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from deepinfer_sim.cli import main
from deepinfer_sim.planner.analysis.steady import (
    SteadyPoint,
    decode_at_user_speed,
    decode_point,
    default_accept,
    default_verify,
    expected_accepted,
    prefill_point,
)
from deepinfer_sim.scenario import Acceptance, Scenario, load_scenario
from deepinfer_sim.sim.policies.speculative import ClassAcceptance, FixedK, SpecDecoder


@pytest.fixture(scope="module")
def sc() -> Scenario:
    return load_scenario("default")


def step_parts(p: SteadyPoint) -> float:
    """Every component that is part of the step: all but the all-to-all hidden by compute."""
    return sum(v for k, v in p.breakdown.items() if k != "a2a_hidden")


def test_the_breakdown_adds_up_to_the_step(sc):
    """Dense, attention, experts, the engine's permutes, exposed all-to-all, overhead (and
    dspark's own overhead) are the whole step; the hidden all-to-all is reported beside them,
    not inside."""
    points = [
        decode_point(sc, 60, 8192),
        decode_point(sc, 4, 131072, verify=2, accept=1.5),
        prefill_point(sc, 16384, 4096),
        prefill_point(sc, 10000, 4096),
    ]
    dspark = load_scenario("default", ["policies.speculative.overhead_s=0.001"])
    points.append(decode_point(dspark, 60, 8192))
    assert points[-1].breakdown["speculative"] == 0.001
    for p in points:
        assert step_parts(p) == pytest.approx(p.step_s, rel=1e-12)
        assert all(v >= 0 for v in p.breakdown.values())
        # the engine permutes around the normal kernels (prefill), not the low-latency ones
        assert (p.breakdown["permutes"] > 0) == (p.pool == "prefill")


def test_decode_throughput_is_tokens_emitted_over_step_time(sc):
    p = decode_point(sc, 48, 8192, verify=3, accept=2.2)
    assert p.tokens_per_s_per_gpu == pytest.approx(48 * 2.2 / p.step_s)
    assert p.tokens_per_s_per_user == pytest.approx(2.2 / p.step_s)
    assert p.tokens_per_s_per_node == pytest.approx(p.tokens_per_s_per_gpu * p.gpus_per_node)
    assert (p.ep, p.pool) == (sc.pools.decode.ep, "decode")


def test_more_context_costs_more_attention(sc):
    short, long = decode_point(sc, 32, 4096), decode_point(sc, 32, 65536)
    assert long.breakdown["attention"] > short.breakdown["attention"]
    assert long.step_s > short.step_s
    assert decode_point(sc, 32, 0).breakdown["attention"] == 0.0


def test_a_bigger_batch_trades_per_user_speed_for_per_gpu_throughput(sc):
    small, big = decode_point(sc, 8, 8192), decode_point(sc, 128, 8192)
    assert big.tokens_per_s_per_gpu > small.tokens_per_s_per_gpu
    assert big.tokens_per_s_per_user < small.tokens_per_s_per_user


def test_user_speed_search_returns_the_largest_batch_that_meets_it(sc):
    """Aim at the speed one sequence gets at batch 37: the search lands on 37 or (if the step
    time is flat there) a little above, and one more sequence per GPU misses the speed."""
    target = decode_point(sc, 37, 8192).tokens_per_s_per_user
    p = decode_at_user_speed(sc, 8192, target)
    assert p.meets_speed is True and p.user_tok_s == target
    assert p.batch_per_gpu is not None and p.batch_per_gpu >= 37
    assert p.batch_per_gpu == int(p.batch_per_gpu)
    assert p.tokens_per_s_per_user >= target
    assert decode_point(sc, p.batch_per_gpu + 1, 8192).tokens_per_s_per_user < target


def test_user_speed_search_edges(sc):
    too_fast = decode_at_user_speed(sc, 8192, 1e9)
    assert (too_fast.batch_per_gpu, too_fast.meets_speed) == (1.0, False)
    assert too_fast.batch_limit == "speed"
    slow = decode_at_user_speed(sc, 8192, 1e-3, max_batch=50)
    assert (slow.batch_per_gpu, slow.meets_speed, slow.batch_limit) == (50.0, True, "max_batch")


V3_ON_H200 = [
    "model=deepseek-v3",
    "pools.prefill.hardware=h200",
    "pools.decode.hardware=h200",
    "pools.decode.ep=16",
    "policies.speculative.policy=none",
    "cost_model.decode=h200-deepseek",
    "cost_model.prefill=h200-deepseek",
]


def test_user_speed_never_returns_a_batch_whose_kv_does_not_fit():
    """Issue 31 (a): V3 on 16 H200s at 10 tok/s per user and 4,500 tokens of context was given
    361 sequences per GPU whose KV did not fit; the search now stops at the KV capacity and says
    so, and the next sequence would not fit."""
    sc = load_scenario("default", [*V3_ON_H200, "pools.decode.max_seqs_per_rank=1024"])
    p = decode_at_user_speed(sc, 4500, 10)
    assert p.kv_fits is True and p.batch_limit == "kv" and p.meets_speed is True
    assert p.batch_per_gpu is not None and p.kv_capacity_tokens_per_gpu is not None
    assert decode_point(sc, p.batch_per_gpu + 1, 4500).kv_tokens_per_gpu > (
        p.kv_capacity_tokens_per_gpu
    )
    assert p.tokens_per_s_per_user >= 10


def test_user_speed_never_exceeds_max_seqs_per_rank():
    sc = load_scenario("default", [*V3_ON_H200, "pools.decode.max_seqs_per_rank=64"])
    p = decode_at_user_speed(sc, 450, 5)
    assert (p.batch_per_gpu, p.batch_limit, p.kv_fits) == (64.0, "max_seqs_per_rank", True)
    tp2 = load_scenario(
        "default", [*V3_ON_H200, "pools.decode.max_seqs_per_rank=64", "pools.decode.tp=2"]
    )
    q = decode_at_user_speed(tp2, 450, 5)  # a TP2 rank's 64 sequences are 32 per GPU
    assert (q.batch_per_gpu, q.batch_limit) == (32.0, "max_seqs_per_rank")


def test_prefill_point_on_the_default_scenario(sc):
    """Four 4K prompts per rank, no prefix: attention is a prompt's tokens over its own earlier
    tokens, more of the step in longer prompts, and a prompt's rate is its length over the
    step."""
    p = prefill_point(sc, 16384, 4096)
    assert (p.pool, p.ep, p.tokens_per_gpu, p.prompt) == (
        "prefill",
        sc.pools.prefill.ep,
        16384,
        4096,
    )
    assert 0.0 < p.breakdown["attention"] < p.breakdown["dense"]
    longer = prefill_point(sc, 16384, 16384)
    assert longer.breakdown["attention"] > 2 * p.breakdown["attention"]
    assert longer.breakdown["dense"] == pytest.approx(p.breakdown["dense"])
    assert p.tokens_per_s_per_gpu == pytest.approx(16384 / p.step_s)
    assert p.tokens_per_s_per_user == pytest.approx(4096 / p.step_s)
    assert p.tokens_per_s_per_node == pytest.approx(p.tokens_per_s_per_gpu * p.gpus_per_node)
    # the same tokens in longer prompts cost more (attention is quadratic within a prompt)
    assert longer.step_s > p.step_s
    assert "batch_per_gpu" not in p.as_dict() and "tokens_per_gpu" in p.as_dict()


def test_a_static_placement_draws_its_imbalance_at_each_point(sc):
    """Under a live imbalance with the experts where EP puts them, a steady point is costed
    with the expert-load model's mean imbalance at its own load (no rebalances to wait out):
    larger than EPLB's constant, falling as the batch grows, the same on every ask, and the
    step longer for it. Under EPLB, or a constant imbalance, the point keeps the constant."""
    static = load_scenario(
        "default", ["policies.eplb.decode.policy=static", "policies.eplb.prefill.policy=static"]
    )
    constant = load_scenario(
        "default",
        [
            "policies.eplb.imbalance=constant",
            "policies.eplb.decode.policy=static",
            "policies.eplb.prefill.policy=static",
        ],
    )
    small, large = decode_point(static, 4, 8192), decode_point(static, 64, 8192)
    assert small.imbalance > large.imbalance > sc.policies.expert_imbalance.decode
    assert decode_point(static, 4, 8192).imbalance == small.imbalance
    assert decode_point(sc, 4, 8192).imbalance == sc.policies.expert_imbalance.decode
    assert decode_point(constant, 4, 8192).imbalance == sc.policies.expert_imbalance.decode
    assert small.step_s > decode_point(constant, 4, 8192).step_s
    p = prefill_point(static, 16384, 4096)
    assert p.imbalance > sc.policies.expert_imbalance.prefill
    assert p.step_s > prefill_point(constant, 16384, 4096).step_s


def test_default_verify_follows_the_speculative_policy():
    def verify(policy: str, *extra: str) -> float:
        return default_verify(
            load_scenario("default", [f"policies.speculative.policy={policy}", *extra])
        )

    assert verify("none") == 1
    assert verify("mtp1") == 2
    assert verify("fixed", "policies.speculative.fixed_k=3") == 4
    assert verify("dspark", "policies.speculative.max_draft_tokens=4") == 5
    assert default_accept(load_scenario("default", ["policies.speculative.policy=none"]), 1) == 1


def test_expected_acceptance_matches_the_simulators_sampling():
    """The closed form against the simulator's own acceptance draw (fixed verify length,
    fixed seed): easiness from the Beta, the draft chain cut at the first rejection."""
    acc = Acceptance(mean=0.6, concentration=2.0, position_decay=0.9)
    n, drafts = 200_000, 4
    rng = np.random.default_rng(7)
    dec = SpecDecoder(
        policy=FixedK(k=drafts),
        classes=[ClassAcceptance(acc.mean, acc.concentration, acc.position_decay)],
        capacity=n,
        rng=rng,
    )
    for slot in range(n):
        dec.admit(slot, 0)
    live = np.ones(n, dtype=bool)
    dec.choose(n, live, lambda extra: 1.0)
    emitted = dec.accept(n, live, np.full(n, 1000))
    assert emitted.mean() == pytest.approx(expected_accepted(acc, drafts), abs=0.01)
    assert expected_accepted(acc, 0) == 1.0
    # a fractional draft count interpolates between its neighbours
    mid = expected_accepted(acc, 2.5)
    assert mid == pytest.approx((expected_accepted(acc, 2) + expected_accepted(acc, 3)) / 2)


# ---- the command -------------------------------------------------------------------------


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(main, ["cost", *args], catch_exceptions=False)

    return invoke


def test_cost_decode_prints_the_breakdown_and_writes_json(cli, tmp_path):
    out = tmp_path / "decode.json"
    res = cli("default", "--pool", "decode", "--batch", "60", "--context", "8192",
              "--verify", "3", "--accept", "2", "--json", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    for text in ("routed experts", "attention over context", "step", "per GPU", "per user"):
        assert text in res.output
    data = json.loads(out.read_text())
    assert {"pool", "cost_model", "step_s", "breakdown", "tokens_per_s_per_gpu",
            "tokens_per_s_per_user", "tokens_per_s_per_node", "batch_per_gpu", "context",
            "verify", "accept"} <= set(data)  # fmt: skip
    assert (data["pool"], data["batch_per_gpu"], data["verify"], data["accept"]) == (
        "decode",
        60,
        3,
        2,
    )
    assert sum(v for k, v in data["breakdown"].items() if k != "a2a_hidden") == pytest.approx(
        data["step_s"]
    )
    assert data["tokens_per_s_per_gpu"] == pytest.approx(60 * 2 / data["step_s"])


def test_cost_prefill_and_cost_model_override(cli, tmp_path):
    out = tmp_path / "prefill.json"
    res = cli("default", "--pool", "prefill", "--tokens", "16384", "--prompt", "4096",
              "--cost-model", "roofline", "--json", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "prompt tok/s" in res.output
    data = json.loads(out.read_text())
    assert (data["pool"], data["cost_model"], data["tokens_per_gpu"], data["prompt"]) == (
        "prefill",
        "roofline",
        16384,
        4096,
    )
    assert data["tokens_per_s_per_user"] == pytest.approx(4096 / data["step_s"])


def test_cost_user_speed(cli, tmp_path):
    out = tmp_path / "speed.json"
    res = cli("default", "--context", "8192", "--user-speed", "100", "--json", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["meets_speed"] is True and data["tokens_per_s_per_user"] >= 100


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pool", "decode", "--context", "8192"], "--batch"),
        (["--pool", "decode", "--batch", "60"], "--context"),
        (["--pool", "decode", "--batch", "-4", "--context", "8192"], "--batch"),
        (["--pool", "decode", "--batch", "4", "--context", "-1"], "--context"),
        (["--pool", "storage"], "--pool"),
        (["--pool", "prefill", "--tokens", "4096"], "--prompt"),
        (["--pool", "prefill", "--prompt", "8192", "--tokens", "4096"], "--prompt"),
        (["--pool", "prefill", "--prompt", "4096", "--batch", "8"], "--batch"),
        (["--batch", "4", "--context", "8", "--verify", "2", "--accept", "3"], "--accept"),
        (["--batch", "4", "--context", "8", "--user-speed", "50"], "--user-speed"),
        (["--batch", "4", "--context", "8", "--max-batch", "64"], "only with --user-speed"),
        (["--pool", "prefill", "--prompt", "4096", "--max-batch", "64"], "--max-batch does"),
        (["--batch", "4", "--context", "8", "--cost-model", "no-such"], "cost_model.decode"),
        (["--batch", "4", "--context", "8", "--set", "pools.decode.epp=3"], "pools.decode.epp"),
    ],
)
def test_cost_bad_input_is_one_error_line(cli, args, message):
    res = cli("default", *args)
    assert res.exit_code == 2
    assert res.output.startswith("error:") and res.output.count("error:") == 1
    assert message in res.output
    assert "Traceback" not in res.output and "Usage:" not in res.output


def test_cost_unknown_scenario(cli):
    res = cli("no-such-scenario", "--batch", "4", "--context", "8")
    assert res.exit_code == 2 and res.output.startswith("error:")
    assert "no scenario file or bundled scenario" in res.output


def test_a_prefix_costs_attention_not_throughput_accounting(sc):
    """--prefix: the same new tokens after a cached prefix cost more attention; throughput
    still counts new tokens only."""
    bare = prefill_point(sc, 8192, 1024)
    after = prefill_point(sc, 8192, 1024, 3072)
    assert after.prefix == 3072 and bare.prefix == 0
    assert after.breakdown["attention"] > bare.breakdown["attention"]
    assert after.tokens_per_s_per_gpu == pytest.approx(8192 / after.step_s)


@pytest.mark.parametrize(
    ("file", "case", "pool"),
    [
        ("sglang-v3-h100-96gpu", "1", "prefill"),
        ("sglang-v3-h100-96gpu", "2", "prefill"),
        ("sglang-v3-h100-96gpu", "6", "decode"),
        ("sglang-v3-h100-96gpu", "decode, batch 256 per GPU, 2K context, EP72", "decode"),
        # a case with its own `set` (DP attention: pools.prefill.tp=1), once ignored by --case
        ("gpustack-r1-h200", "2", "prefill"),
    ],
)
def test_cost_case_is_the_validate_case(cli, tmp_path, file, case, pool):
    """--case costs a published case at its point: the same number `validate` reports (and
    the same step), with the case's pool, published figure and ratio in the JSON."""
    from deepinfer_sim.planner.analysis.published import run_cases

    out = tmp_path / "case.json"
    res = cli(file, "--case", case, "--json", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["pool"] == pool and "ratio" in res.output
    expected = {r.name: r for r in run_cases(("roofline",))}[data["case"]["name"]]
    assert data["case"]["simulated"] == pytest.approx(expected.simulated, rel=1e-12)
    assert data["case"]["ratio"] == pytest.approx(expected.ratio, rel=1e-12)
    assert data["step_s"] == pytest.approx(expected.step_s, rel=1e-12)


def test_cost_case_with_a_cached_prefix_and_another_cost_model(cli, tmp_path):
    out = tmp_path / "case.json"
    res = cli("deepseek-v3-production-h800", "--case", "1", "--cost-model", "hopper-derived",
              "--json", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    # 4,989-token prompts, 56.3 % cached: 2,180 new tokens after 2,809 cached
    assert (data["prompt"], data["prefix"], data["cost_model"]) == (2180, 2809, "hopper-derived")
    assert data["case"]["simulated"] == pytest.approx(
        data["tokens_per_s_per_node"] * 4989 / 2180, rel=1e-12
    )


def test_a_published_case_file_is_a_scenario_everywhere(cli):
    """A case file's deployment is usable as CONFIG (cost without --case costs its scenario);
    a bad override names the key inside the file's `scenario:`."""
    res = cli("deepseek-v3-profile-h800", "--batch", "128", "--context", "4096")
    assert res.exit_code == 0 and "EP128 on h800" in res.output
    res = cli("deepseek-v3-profile-h800", "--batch", "1", "--context", "1",
              "--set", "pools.decode.ep=x")  # fmt: skip
    assert res.exit_code == 2 and "scenario.pools.decode.ep" in res.output


@pytest.mark.parametrize(
    ("config", "args", "message"),
    [
        ("sglang-v3-h100-96gpu", ["--case", "9"], "no such case (1: prefill, 1K prompts"),
        ("sglang-v3-h100-96gpu", ["--case", "decode"], "no such case"),
        ("default", ["--case", "1"], "not a published case file"),
        ("sglang-v3-h100-96gpu", ["--case", "1", "--prompt", "8"], "--prompt: --case sets"),
        ("sglang-v3-h100-96gpu", ["--case", "6", "--pool", "prefill"], "is a decode case"),
        ("sglang-v3-h100-96gpu", ["--case", "6", "--max-batch", "64"], "--max-batch: --case"),
        ("default", ["--prefix", "8", "--batch", "4", "--context", "8"], "--prefix does not"),
    ],
)
def test_cost_case_bad_input(cli, config, args, message):
    res = cli(config, *args)
    assert res.exit_code == 2 and res.output.startswith("error:"), res.output
    assert message in res.output and "Traceback" not in res.output


def test_curve_spans_batch_one_to_the_limit_and_names_the_fastest_user_speed(tmp_path):
    """``cost --curve``: V3 FP8 on 8 H200 as one TP8 rank — tokens/s per user fall and per GPU
    rise from one sequence to the rank's limit; the first point is the fastest a user gets."""
    from deepinfer_sim.cli import main

    out = tmp_path / "curve.json"
    args = ["cost", "default", "--curve", "--context", "4096", "--json", str(out)]
    args += ["--set", "model=deepseek-v3", "--set", "pools.decode.hardware=h200"]
    args += ["--set", "pools.decode.ep=8", "--set", "pools.decode.tp=8"]
    args += ["--set", "pools.decode.redundant_experts_per_gpu=0"]
    args += ["--set", "pools.prefill.hardware=h200", "--set", "pools.prefill.ep=8"]
    args += ["--set", "pools.prefill.redundant_experts_per_gpu=0"]
    args += ["--set", "cost_model.decode=h200-deepseek", "--set", "cost_model.prefill=roofline"]
    args += ["--set", "policies.speculative.policy=none"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "fastest per user" in res.output and "error band: decode" in res.output
    curve = json.loads(out.read_text())["curve"]
    user = [p["tokens_per_s_per_user"] for p in curve]
    gpu = [p["tokens_per_s_per_gpu"] for p in curve]
    assert user == sorted(user, reverse=True) and gpu == sorted(gpu)
    assert curve[0]["batch_per_gpu"] * curve[0]["tp"] == 1 and curve[0]["tp"] == 8
    bad = CliRunner().invoke(
        main, ["cost", "default", "--curve", "--context", "1000", "--batch", "4"]
    )
    assert bad.exit_code == 2 and "--curve runs every batch" in bad.output


# ---- aggregated serving: its steps are the aggregated pool's ---------------------------------

AGGREGATED_CASE = "configs/published/trtllm-r1-h200-max-throughput.yaml"  # DP8 + EP8 on h200


def test_cost_of_an_aggregated_scenario_is_its_aggregated_pools(cli, tmp_path):
    """An aggregated scenario's decode and prefill points are costed on ``pools.aggregated``
    (its hardware, EP and cost model), not on the disaggregated pools' defaults it never runs;
    ``--cost-model`` moves that pool, and the error band is the aggregated cases'."""
    from pathlib import Path

    import deepinfer_sim

    path = str(Path(deepinfer_sim.__file__).parent / AGGREGATED_CASE)
    sc = load_scenario(path)
    assert sc.aggregated and sc.pools.decode.hardware != "h200"  # the default pool differs
    p = decode_point(sc, 64, 2000)
    assert (p.ep, p.hardware, p.cost_model) == (8, "h200", sc.cost_model.aggregated)
    q = prefill_point(sc, 1024, 1024)
    assert (q.ep, q.hardware) == (8, "h200")
    out = tmp_path / "agg.json"
    res = cli(path, "--batch", "64", "--context", "2000", "--cost-model", "h200-deepseek",
              "--json", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert (data["cost_model"], data["hardware"], data["ep"]) == ("h200-deepseek", "h200", 8)
    assert data["step_s"] != pytest.approx(p.step_s)  # the profile, not the roofline
    assert data["error_band"]["alike"]["pool"] == "aggregated"
    assert "error band: aggregated (h200-deepseek)" in res.output


def test_cost_case_of_a_simulated_quantity_prints_the_runs_figures(cli, tmp_path):
    """``--case`` on a burst case (a whole simulation, no steady step) prints the run's figures
    and the comparison, on the cost model asked for."""
    from pathlib import Path

    import deepinfer_sim

    path = str(Path(deepinfer_sim.__file__).parent / AGGREGATED_CASE)
    ratios = {}
    for model in ("roofline", "h200-deepseek"):
        out = tmp_path / f"{model}.json"
        res = cli(path, "--case", "1", "--cost-model", model, "--json", str(out))
        assert res.exit_code == 0, res.output
        assert "output tok/s per GPU" in res.output and "ratio" in res.output
        data = json.loads(out.read_text())
        assert data["cost_model"] == model
        ratios[model] = data["case"]["ratio"]
    assert ratios["roofline"] != pytest.approx(ratios["h200-deepseek"])
