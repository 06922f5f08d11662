"""``plan --gpus N``: the deployment within N GPUs serving the highest rate that meets the SLOs,
over disaggregated and aggregated shapes and the ``planner.vary`` axes, with the search
space's throughput/interactivity front (issue 31, items 1-2)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from conftest import tiny_dict

from deepinfer_sim.cli import main
from deepinfer_sim.planner.front import FRONT_COLUMNS
from deepinfer_sim.planner.plan import Shape, candidate_shapes, plan
from deepinfer_sim.scenario import load_scenario

SEARCH = [
    "planner.kinds=[disaggregated, aggregated]",
    "planner.prefill_ep=[2]", "planner.prefill_instances=[1, 2]", "planner.decode_ep=[8]",
    "planner.aggregated_ep=[8]",
    "planner.vary={pools.decode.two_batch_overlap: [true, false], pools.aggregated.tp: [1, 2]}",
    "planner.bisection_steps=2", "planner.probe_seconds=20", "planner.probe_min_requests=100",
]  # fmt: skip
BUDGET = 24


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cfg") / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_dict()))
    return str(path)


@pytest.fixture(scope="module")
def planned(config, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    extra = out / "numbers.json"
    sets = [a for s in SEARCH for a in ("--set", s)]
    res = CliRunner().invoke(
        main,
        ["plan", config, "--gpus", str(BUDGET), "--out", str(out), "--json", str(extra), *sets],
    )
    return res, out, extra


def test_the_search_space_holds_both_kinds_and_every_combination_of_vary(config):
    """Each vary key applies to the kind whose pool it names: two-batch overlap to the
    disaggregated shapes, the aggregated pool's TP to the aggregated one."""
    sc = load_scenario(config, SEARCH)
    shapes = candidate_shapes(sc)
    labels = [s.label for s in shapes]
    assert len(shapes) == 2 * 2 + 2 and len(set(s.slug for s in shapes)) == len(shapes)
    assert "1xEP2 + EP8 decode.two_batch_overlap=false" in labels
    assert "agg EP8 aggregated.tp=2" in labels
    agg = next(s for s in shapes if s.kind == "aggregated" and "tp=2" in s.label)
    assert agg.overrides() == [
        "serving=aggregated", "pools.aggregated.ep=8", "pools.aggregated.instances=1",
        "pools.aggregated.tp=2",
    ]  # fmt: skip
    load_scenario(config, [*SEARCH, *agg.overrides()])  # a valid scenario


def test_plan_gpus_names_the_best_deployment_within_the_budget(planned):
    res, out, extra = planned
    assert res.exit_code == 0, res.output
    assert f"within {BUDGET} GPUs" in res.output and "front:" in res.output
    doc = json.loads((out / "plan" / "plan.json").read_text())
    assert json.loads(extra.read_text()) == doc
    assert doc["mode"] == "gpus" and doc["gpu_budget"] == BUDGET and doc["target_rps"] is None
    best = doc["recommended"]
    assert best["replicas"] * best["unit_gpus"] <= BUDGET
    assert best["replicas"] == BUDGET // best["unit_gpus"]
    feasible = [s for s in doc["shapes"] if s["status"] == "feasible"]
    assert best["rate_rps"] == max(s["rate_rps"] for s in feasible)
    assert {s["kind"] for s in doc["shapes"]} == {"disaggregated", "aggregated"}
    launch = out / "launch"  # the winner's launch files (planner/launch.py)
    assert {p.name for p in launch.iterdir()} == {"sglang.sh", "vllm.sh", "dynamo.yaml"}
    assert f"launch files for {best['shape']} × {best['replicas']}" in res.output.replace("\n", "")


def test_the_winner_meets_the_slos_at_the_rate_it_claims(planned, config):
    """The operating point is simulated at the claimed rate per replica; its p99 TTFT and
    TPOT are within the SLOs (a shape whose operating point missed would not be feasible)."""
    _, out, _ = planned
    best = json.loads((out / "plan" / "plan.json").read_text())["recommended"]
    slo = load_scenario(config).slo
    assert best["ttft_p99_s"] <= slo.ttft_s and best["tpot_p99_s"] <= slo.tpot_s
    summary = json.loads((out / "recommended" / "summary.json").read_text())
    per_replica = best["rate_rps"] / best["replicas"]
    assert per_replica == pytest.approx(best["sustainable_rps"] * 0.85)
    assert summary["requests"]["rejected"] == 0


def test_the_front_is_written_with_steady_and_simulated_points(planned):
    _, out, _ = planned
    front = pd.read_csv(out / "plan" / "front.csv")
    assert tuple(front.columns) == FRONT_COLUMNS
    assert set(front["kind"]) == {"disaggregated", "aggregated"}  # pruned shapes too: every one
    steady, sims = front[~front["simulated"]], front[front["simulated"]]
    assert len(sims) >= 1 and sims["p99_ttft_s"].notna().all() and steady["p99_ttft_s"].isna().all()
    on = steady[steady["pareto"]].sort_values("tok_s_per_user")
    assert len(on) >= 2 and on["tok_s_per_gpu"].is_monotonic_decreasing
    for _, p in on.iterrows():  # no steady point beats a front point on both axes
        assert not ((steady.tok_s_per_user > p.tok_s_per_user)
                    & (steady.tok_s_per_gpu > p.tok_s_per_gpu)).any()  # fmt: skip
    for _, p in steady[~steady["pareto"]].iterrows():  # and a front point beats each other one
        assert ((on.tok_s_per_user >= p.tok_s_per_user)
                & (on.tok_s_per_gpu >= p.tok_s_per_gpu)).any()  # fmt: skip
    png = (out / "plan" / "front.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_no_pruned_shape_could_have_served_more(planned, config):
    """Every shape pruned by its bound, simulated on its own as the plan would have, serves no
    more within the budget than the winner."""
    _, out, _ = planned
    doc = json.loads((out / "plan" / "plan.json").read_text())
    best = doc["recommended"]["rate_rps"]
    pruned = [s for s in doc["shapes"] if s["status"] == "pruned"]
    shapes = {s.label: s for s in candidate_shapes(load_scenario(config, SEARCH))}
    for row in pruned:
        shape = shapes[row["shape"]]
        alone = plan(config, [*SEARCH, f"planner.gpus={BUDGET}", *_only(shape)])
        r = next(x for x in alone.results if x.shape.label == row["shape"])
        assert r.status in ("feasible", "infeasible", "pruned")
        if r.status == "feasible":
            assert r.rate_rps <= best * (1 + 1e-9)


def _only(shape: Shape) -> list[str]:
    """Overrides that leave ``shape`` the only one searched."""
    if shape.kind == "aggregated":
        kinds = ["planner.kinds=[aggregated]", f"planner.aggregated_ep=[{shape.prefill_ep}]"]
    else:
        kinds = [
            "planner.kinds=[disaggregated]",
            f"planner.prefill_ep=[{shape.prefill_ep}]",
            f"planner.prefill_instances=[{shape.prefill_instances}]",
            f"planner.decode_ep=[{shape.decode_ep}]",
        ]
    vary = {k.split("=")[0]: [yaml.safe_load(k.split("=", 1)[1])] for k in shape.extra}
    return [*kinds, f"planner.vary={json.dumps(vary)}"]


def test_gpus_and_rate_together_are_refused(config):
    res = CliRunner().invoke(main, ["plan", config, "--gpus", "8", "--rate", "2"])
    assert res.exit_code == 2 and "not both" in res.output


def test_a_budget_smaller_than_every_shape_says_so(config, tmp_path):
    sets = [a for s in SEARCH for a in ("--set", s)]
    res = CliRunner().invoke(main, ["plan", config, "--gpus", "2", "--out", str(tmp_path), *sets])
    assert res.exit_code == 0, res.output
    assert "every shape needs more GPUs than the budget of 2" in res.output


@pytest.mark.parametrize(
    ("vary", "message"),
    [
        ("{pools.decode.epp: [1]}", "pools.decode.epp: unknown key"),
        ("{pools.decode.ep: []}", "planner.vary.pools.decode.ep: Tuple should have at least 1"),
        ("{pools.decode.ep: [eight]}", "pools.decode.ep: Input should be a valid integer"),
    ],
)
def test_a_bad_vary_axis_is_one_error_line_before_any_simulation(config, tmp_path, vary, message):
    res = CliRunner().invoke(
        main, ["plan", config, "--gpus", "16", "--out", str(tmp_path), "--set",
               f"planner.vary={vary}"],
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    assert message in res.output and res.output.count("error:") == 1
    assert "Traceback" not in res.output and not (tmp_path / "plan" / "runs").exists()
