"""``deepinfer-sim validate``: bundled published deployments predicted by the cost models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from deepinfer_sim.cli import main
from deepinfer_sim.planner.analysis.published import case_files, run_cases

CASES = {
    "deepseek-v3-profile-h800": 2,
    "sglang-v3-h100-96gpu": 5,
    "deepseek-v3-production-h800": 2,
}


def test_the_three_published_deployments_ship_with_sources() -> None:
    files = {cf.name: cf for _, cf in case_files()}
    assert {k: len(v.cases) for k, v in files.items()} == CASES
    for cf in files.values():
        assert cf.source and all(0 < c.tolerance <= 0.15 for c in cf.cases)


@pytest.fixture(scope="module")
def results():
    return run_cases(("roofline", "hopper-derived"))


def test_every_case_runs_on_both_cost_models(results) -> None:
    assert len(results) == 2 * sum(CASES.values())
    for r in results:
        assert r.simulated > 0 and r.ratio == pytest.approx(r.simulated / r.published)
        assert r.step_s > 0


def test_cases_within_tolerance_as_measured(results) -> None:
    """What docs/validation.md reports (2026-12-02): the roofline predicts both V3 prefill
    deployments and DeepSeek's profiled decode within 15 %, the H200-derived profile every SGLang
    case and the production prefill. A change that moves one of these outside is a regression to
    look at, not a number to re-tune. (The production decode at user speed was within 15 % on the
    profile of device call 21 and is at 0.83 on call 26's: the two V3 decode fits agree on the
    H200 within 3 % but split their time differently between the weight-read floor and the
    compute terms, and the H800 derivation scales only the first; docs/validation.md.)"""
    within = {(r.file, r.name, r.cost_model) for r in results if r.within}
    for name in (
        "prefill, 1K prompts, EP32",
        "prefill, 2K prompts, EP32",
        "prefill, 4K prompts, EP32",
        "decode, batch 256 per GPU, 2K context, EP72",
    ):
        assert ("sglang-v3-h100-96gpu", name, "hopper-derived") in within
    assert (
        "deepseek-v3-profile-h800",
        "decode, batch 128 per GPU, 4K context, EP128",
        "roofline",
    ) in within
    assert len(within) >= 11


def test_validate_command_prints_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "cases.json"
    res = CliRunner().invoke(main, ["validate", "--cost-model", "roofline", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "within tolerance" in res.output
    cases = json.loads(out.read_text())
    assert len(cases) == sum(CASES.values())
    assert set(cases[0]) >= {
        "name",
        "quantity",
        "published",
        "cost_model",
        "simulated",
        "ratio",
        "tolerance",
    }
    strict = CliRunner().invoke(main, ["validate", "--cost-model", "roofline", "--strict"])
    assert strict.exit_code == 1  # some roofline cases are outside their tolerance


def test_a_bad_case_file_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nsource: y\nscenario: {model: deepseek-v3}\n"
        "cases:\n  - {name: c, quantity: decode_tok_s_per_node, point: {batch_per_gpu: 8},"
        " published: 100}\n"
    )
    res = CliRunner().invoke(main, ["validate", "--case-file", str(bad)])
    assert res.exit_code == 2
    assert "error:" in res.output and "cases[0].point" in res.output and "context" in res.output
    assert "Traceback" not in res.output
    unknown = tmp_path / "model.yaml"
    unknown.write_text(
        "name: x\nsource: y\nscenario: {model: no-such-model}\n"
        "cases:\n  - {name: c, quantity: decode_tok_s_per_node,"
        " point: {batch_per_gpu: 8, context: 100}, published: 100}\n"
    )
    res = CliRunner().invoke(main, ["validate", "--case-file", str(unknown)])
    assert res.exit_code == 2 and "error:" in res.output and "Traceback" not in res.output
