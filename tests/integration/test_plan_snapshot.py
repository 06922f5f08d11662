"""A plan searches one scenario, says when its search was incomplete, and says what it resumed.

``plan`` runs for a long time: dozens of shapes, each a bisection of full simulations, in
worker processes. Three promises make its answer trustworthy:

- **One scenario.** The scenario file is read once, at the start, into a snapshot; every shape,
  probe and operating point (in every worker) is cut from it. Editing or removing the file while
  the plan runs changes nothing in that plan.
- **An incomplete search says so.** A shape that failed (a crash, a dead worker) might have
  been the cheapest: the plan must not call its best survivor "the cheapest deployment meeting
  the SLOs" without saying so, and the command exits 1, as ``sweep grid`` does for a failed
  point. A plan whose every shape failed is not "no shape met the SLOs".
- **A resumed plan says what it found.** Probes already in the probe logs are not simulated
  again, and the plan says how many it found done.

The tiny scenario (60 requests) runs in about a second, so these are real simulations.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import tiny_dict

from deepinfer_sim.cli import main
from deepinfer_sim.planner import plan as plan_mod
from deepinfer_sim.planner.plan import Plan, Shape, ShapeResult, Snapshot

PLAN = [
    "planner.prefill_ep=[2]",
    "planner.decode_ep=[8]",
    "planner.bisection_steps=2",
    "planner.probe_seconds=5",
    "planner.probe_min_requests=50",
]
EDITED = {"cost_model": {"step": {"step_overhead_s": 0.05}}}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_dict(**{"workload.max_requests": 60})), encoding="utf-8")
    return path


def cli_args(config: Path, out: Path, instances: str = "[1, 2]") -> list[str]:
    sets = [*PLAN, f"planner.prefill_instances={instances}"]
    return ["plan", str(config), "--out", str(out), *(x for s in sets for x in ("--set", s))]


def test_editing_the_scenario_file_during_a_plan_changes_nothing_in_it(config, monkeypatch):
    """After the first probe the file is replaced by one with a 50 ms step overhead (what made
    a plan call a shape feasible while its own table showed TPOT over the SLO). Every later
    probe and the operating point still simulate the scenario as it was at the start, and the
    plan's answer is the one it gives on the untouched file."""
    over = [*PLAN, "planner.prefill_instances=[1]"]
    real_bound = plan_mod.unit_rate_bound  # 3x the bound: the first probe fails and bisection runs
    monkeypatch.setattr(plan_mod, "unit_rate_bound", lambda sc, st: 3 * real_bound(sc, st))
    untouched = plan_mod.plan(str(config), over)

    overheads: list[float] = []
    real = plan_mod.simulate

    def simulate_then_edit(sc, *args, **kwargs):
        overheads.append(sc.cost_model.step.step_overhead_s)
        if len(overheads) == 1:
            data = yaml.safe_load(config.read_text())
            config.write_text(yaml.safe_dump({**data, **EDITED}))
        return real(sc, *args, **kwargs)

    monkeypatch.setattr(plan_mod, "simulate", simulate_then_edit)
    edited = plan_mod.plan(str(config), over)
    assert len(overheads) >= 3 and set(overheads) == {overheads[0]} != {0.05}
    a, b = untouched.results[0], edited.results[0]
    assert (b.status, b.sustainable_rps, b.replicas, b.probes) == (
        a.status, a.sustainable_rps, a.replicas, a.probes,
    )  # fmt: skip
    assert b.tpot_p99_s == a.tpot_p99_s


def test_workers_never_read_the_scenario_file(config, monkeypatch):
    """The file is deleted once the plan has started (while it bounds the shapes, before any
    worker runs): the shapes, in two worker processes, are searched all the same, none fails."""
    real_bound = plan_mod.unit_rate_bound

    def bound_then_delete(sc, stats):
        config.unlink(missing_ok=True)
        return real_bound(sc, stats)

    monkeypatch.setattr(plan_mod, "unit_rate_bound", bound_then_delete)
    result = plan_mod.plan(str(config), [*PLAN, "planner.prefill_instances=[1, 2]"], workers=2)
    assert not config.exists()
    assert [r.status for r in result.results if r.status == "error"] == []
    assert result.complete and result.best is not None


def test_the_snapshot_is_the_scenario_the_file_gives():
    """Cutting a shape or a probe from the snapshot gives exactly the scenario that reading
    the file with the same overrides gives (the probe log's hashes depend on it: a plan resumed
    across this change finds its probes)."""
    from deepinfer_sim.scenario import bundled_scenarios, dump_scenario, load_scenario

    shape = Shape(2, 3, 16).overrides()
    cut = ["workload.max_requests=100", "workload.repeat=1", "workload.rate_scale=3.5"]
    for name in bundled_scenarios():
        snap = Snapshot.of(name, ["seed=7"])
        direct = load_scenario(name, ["seed=7", *shape, *cut])
        assert dump_scenario(snap.scenario([*shape, *cut])) == dump_scenario(direct), name


def failing(slug: str, monkeypatch) -> None:
    """Shape ``slug``'s search fails (as a crash in its worker would); the others run."""
    real = plan_mod.evaluate_shape

    def evaluate(config, base, shape, *args):
        if shape.slug == slug:  # no unit cost either: the plan keeps the one it computed
            return ShapeResult(shape, args[0], 0, math.nan, status="error", error="boom")
        return real(config, base, shape, *args)

    monkeypatch.setattr(plan_mod, "evaluate_shape", evaluate)


def test_a_plan_whose_cheaper_shape_failed_says_it_is_incomplete_and_exits_1(
    tmp_path, config, monkeypatch
):
    """The cheaper shape (one prefill instance) fails; the other one meets the SLOs. The plan
    must not call it "the cheapest deployment meeting the SLOs": it says the search is
    incomplete and that the failed shape could have been cheaper, names the failure on stderr,
    still writes its files, and exits 1."""
    failing("p1x2-d8", monkeypatch)
    out = tmp_path / "plan"
    res = CliRunner().invoke(main, cli_args(config, out))
    assert res.exit_code == 1, res.output
    text = " ".join(res.output.split())
    assert "is the cheapest deployment meeting the SLOs" not in text
    assert "The search is incomplete: 1 of 2 shapes failed (1xEP2 + EP8)" in text
    assert "1 of them could have been cheaper than 2xEP2 + EP8" in text
    assert "failed 1xEP2 + EP8: boom" in res.output
    doc = yaml.safe_load((out / "plan" / "plan.json").read_text())
    assert doc["complete"] is False and doc["failed"] == {"1xEP2 + EP8": "boom"}
    assert (out / "recommended" / "summary.json").exists()


def test_a_plan_whose_every_shape_failed_does_not_say_no_shape_met_the_slos(
    tmp_path, config, monkeypatch
):
    """Every probe failing (a scenario that does not load, a crash) tells nothing about the
    SLOs: the plan says all shapes failed, with the first error, and exits 1."""
    failing("p1x2-d8", monkeypatch)
    res = CliRunner().invoke(main, cli_args(config, tmp_path / "plan", instances="[1]"))
    assert res.exit_code == 1, res.output
    text = " ".join(res.output.split())
    assert "no shape met the SLOs at any load" not in text
    assert "The search is incomplete: all 1 shapes failed" in text and "boom" in text


def test_a_failed_shape_that_could_not_have_won_leaves_the_answer_standing():
    """A failed shape whose cost-model bound already costs more than the recommendation could
    not have beaten it: the recommendation is still the cheapest, and the plan says why, but the
    search is still incomplete (and the command still exits 1)."""
    cheap = ShapeResult(Shape(2, 1, 8), 20.0, 10, 50.0, status="feasible")
    cheap.sustainable_rps, cheap.replicas, cheap.usd_h, cheap.limited_by = 15.0, 1, 50.0, "ttft"
    dear = ShapeResult(Shape(2, 8, 8), 20.0, 24, 200.0, status="error", error="boom")
    plan = Plan(10.0, 0, 0.0, 100.0, [cheap, dear])
    assert not plan.complete and plan.lower_usd_h(dear) == 200.0
    why = plan.why()
    assert why.startswith("The search is incomplete: 1 of 2 shapes failed (8xEP2 + EP8)")
    assert "none of them could have been cheaper" in why
    assert "1xEP2 + EP8 × 1 is still the cheapest deployment meeting the SLOs: $50/h" in why


def test_a_resumed_plan_says_how_many_probes_it_found_done(tmp_path, config):
    """The same plan again into the same folder simulates nothing: each shape's line and the
    summary say how many of its simulations came from the probe logs."""
    out = tmp_path / "plan"
    first = CliRunner().invoke(main, cli_args(config, out, instances="[1]"))
    assert first.exit_code == 0, first.output
    assert "resumed: " not in first.output
    again = CliRunner().invoke(main, cli_args(config, out, instances="[1]"))
    assert again.exit_code == 0, again.output
    text = " ".join(again.output.split())
    found = int(text.split("resumed: ")[1].split(" of ")[0])
    assert found >= 2  # at least a probe and the operating point
    assert f"resumed: {found} of {found} simulations found done in" in text
    assert f"({found} of {found} simulations from the log)" in text
    assert (out / "plan" / "config.resolved.yaml").read_text().startswith("name: tiny")
