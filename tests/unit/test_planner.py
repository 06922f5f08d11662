"""The capacity planner: bisection on load, SLO checks and the bound-pruned shape search."""

from __future__ import annotations

import math
from typing import Any

import pytest

from deepinfer_sim.planner import plan as planner
from deepinfer_sim.planner.plan import (
    ShapeResult,
    candidate_shapes,
    max_sustainable_rate,
    slo_failure,
)
from deepinfer_sim.scenario import load_scenario


@pytest.mark.parametrize("answer", [0.7, 37.3, 99.0])
def test_bisection_finds_the_largest_rate_that_meets_the_slo(answer: float) -> None:
    probes: list[float] = []

    def meets(rate: float) -> bool:
        probes.append(rate)
        return rate <= answer

    hi = 100.0
    found = max_sustainable_rate(meets, hi, steps=12)
    assert found <= answer < found + hi / 2**12
    assert len(probes) == 13  # the bound, then one probe per step


def test_bisection_returns_the_bound_when_it_passes_and_zero_when_nothing_does() -> None:
    assert max_sustainable_rate(lambda r: True, 50.0, steps=5) == 50.0
    assert max_sustainable_rate(lambda r: False, 50.0, steps=5) == 0.0


def summary(ttft: float, tpot: float, rejected: int = 0) -> dict[str, Any]:
    return {
        "requests": {"rejected": rejected, "in_flight": 0},
        "latency": {"ttft_s": {"p99": ttft}, "tpot_s": {"p99": tpot}},
    }


def test_slo_failure_names_the_missed_slo() -> None:
    sc = load_scenario("default", ["slo.ttft_s=2", "slo.tpot_s=0.05"])
    assert slo_failure(summary(1.0, 0.04), sc) == ""
    assert slo_failure(summary(3.0, 0.04), sc) == "ttft"
    assert slo_failure(summary(1.0, 0.06), sc) == "tpot"
    assert slo_failure(summary(1.0, 0.04, rejected=1), sc) == "rejections"
    strict = load_scenario("default", ["slo.min_user_tok_s=40"])  # 1 / 40 = 25 ms
    assert slo_failure(summary(1.0, 0.03), strict) == "tpot"
    e2e = load_scenario("default", ["slo.e2e_s=10"])
    slow = summary(1.0, 0.04)
    slow["latency"]["e2e_s"] = {"p99": 12.0}
    assert slo_failure(slow, e2e) == "e2e"
    slow["latency"]["e2e_s"] = {"p99": 8.0}
    assert slo_failure(slow, e2e) == ""
    assert slo_failure(summary(1.0, 0.04), e2e) == ""  # a summary without E2E: not judged


TRUE_RATE = {(4, 8, 64): 50.0, (4, 16, 64): 95.0, (8, 8, 64): 60.0, (8, 16, 64): 110.0}


def test_search_prunes_only_shapes_that_cannot_win(monkeypatch: pytest.MonkeyPatch) -> None:
    """Known answer: each shape sustains TRUE_RATE; its cost-model bound is 1.5× that. The
    search must find the exhaustive optimum and skip shapes whose bound cannot beat it."""
    evaluated: list[tuple[int, int, int]] = []

    def key(shape: Any) -> tuple[int, int, int]:
        return (shape.prefill_ep, shape.prefill_instances, shape.decode_ep)

    def fake_bound(sc: Any, stats: Any) -> float:
        p = sc.pools
        return 1.5 * TRUE_RATE[(p.prefill.ep, p.prefill.instances, p.decode.ep)]

    def fake_evaluate(
        config: str, base: Any, shape: Any, hi: float, target: float, runs: Any = None
    ) -> Any:
        evaluated.append(key(shape))
        sc = load_scenario(config, [*base.overrides, *shape.overrides()])
        gpus, usd_h = planner.unit_cost(sc)
        res = ShapeResult(shape, hi, gpus, usd_h, status="feasible")
        res.sustainable_rps = TRUE_RATE[key(shape)]
        res.replicas = math.ceil(target / (res.sustainable_rps * sc.planner.headroom))
        res.ttft_p99_s = 1.0 / res.replicas
        return res

    monkeypatch.setattr(planner, "unit_rate_bound", fake_bound)
    monkeypatch.setattr(planner, "evaluate_shape", fake_evaluate)
    over = [
        "planner.prefill_ep=[4, 8]",
        "planner.prefill_instances=[8, 16]",
        "planner.decode_ep=[64]",
        "planner.target_rate_rps=400",
        "pools.storage.nodes=0",
        "workload.repeat=1",
    ]
    result = planner.plan("default", over)
    sc = load_scenario("default", over)
    # exhaustive optimum
    costs = {}
    for shape in candidate_shapes(sc):
        _, usd_h = planner.unit_cost(load_scenario("default", [*over, *shape.overrides()]))
        replicas = math.ceil(400 / (TRUE_RATE[key(shape)] * sc.planner.headroom))
        costs[key(shape)] = replicas * usd_h
    best = min(costs, key=costs.__getitem__)
    assert result.best is not None and key(result.best.shape) == best
    assert result.best.usd_h == pytest.approx(costs[best])
    pruned = [key(r.shape) for r in result.results if r.status == "pruned"]
    assert pruned and set(pruned).isdisjoint(evaluated)
    assert len(evaluated) + len(pruned) == len(TRUE_RATE)
    assert "cheapest" in result.why()


def test_the_report_shows_the_planners_slo_rule() -> None:
    """The report's SLO checks and the planner's verdict are one rule: on every summary below
    the report misses exactly what the planner names first, and a latency no request has (TPOT
    when every output is one token) is judged by neither."""
    from deepinfer_sim.sim.results.report_numbers import MISS_ORDER, slo_checks

    sc = load_scenario("default", ["slo.ttft_s=2", "slo.tpot_s=0.05", "slo.e2e_s=10"])
    one_token = summary(1.0, 0.04)
    one_token["latency"]["tpot_s"]["p99"] = None
    cases = [summary(1.0, 0.04), summary(3.0, 0.06), summary(1.0, 0.06), one_token]
    cases.append(summary(3.0, 0.04, rejected=2))
    for s in cases:
        missed = {c.key for c in slo_checks(s, sc.slo.model_dump()) if not c.met}
        assert slo_failure(s, sc) == next((k for k in MISS_ORDER if k in missed), ""), s
    assert slo_failure(one_token, sc) == ""
    assert slo_failure(summary(3.0, 0.04, rejected=2), sc) == "rejections"


def test_a_shape_whose_ray_task_died_every_time_is_an_error_and_the_plan_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On Ray, a shape whose task raised on every retry (its node died) is recorded ``error``
    and the others are still evaluated: the plan is incomplete, not a traceback."""
    import contextlib

    def fake_evaluate(config: Any, base: Any, shape: Any, hi: float, target: float, *_: Any):
        res = ShapeResult(shape, hi, 8, 10.0, status="feasible")
        res.sustainable_rps, res.replicas, res.ttft_p99_s = 50.0, 1, 1.0
        return res

    class FakeRay:
        def remote(self, **_: Any):
            return lambda fn: type("Task", (), {"remote": staticmethod(lambda *a: a)})

        def get(self, args: tuple[Any, ...]):
            if args[2].prefill_instances == 8:
                raise RuntimeError("the node died")
            return fake_evaluate(*args)

    monkeypatch.setattr(planner, "evaluate_shape", fake_evaluate)
    monkeypatch.setattr(planner, "ray_context", lambda *_: contextlib.nullcontext(FakeRay()))
    over = ["planner.prefill_ep=[4]", "planner.prefill_instances=[8, 16]",
            "planner.decode_ep=[64]", "pools.storage.nodes=0", "workload.repeat=1"]  # fmt: skip
    result = planner.plan("default", over, workers=2, executor="ray")
    status = {r.shape.prefill_instances: (r.status, r.error) for r in result.results}
    assert status[8] == ("error", "ray task failed: RuntimeError: the node died")
    assert status[16][0] == "feasible"
    assert not result.complete and "incomplete" in result.why()
