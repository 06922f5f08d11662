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
    """What docs/validation.md reports (2026-12-02, after device call 29 and the normal-mode
    permutes): the roofline predicts SGLang's prefill at 1K-4K prompts, its two-batch-overlap
    speed-up and DeepSeek's profiled decode within tolerance; the H200-derived profile
    DeepSeek's prefill profile, SGLang's prefill, speed-up and decode, and both production
    cases. A change that moves one of
    these outside is a regression to look at, not a number to re-tune."""
    within = {(r.file, r.name, r.cost_model) for r in results if r.within}
    sglang, profile, production = (
        "sglang-v3-h100-96gpu",
        "deepseek-v3-profile-h800",
        "deepseek-v3-production-h800",
    )
    speedup = "prefill speed-up from two-batch overlap, 2K prompts"
    expected = [
        *((sglang, f"prefill, {n} prompts, EP32", "roofline") for n in ("1K", "2K", "4K")),
        (sglang, speedup, "roofline"),
        (profile, "decode, batch 128 per GPU, 4K context, EP128", "roofline"),
        (profile, "prefill, 4K prompts, 16,384 tokens per GPU, EP32", "hopper-derived"),
        *((sglang, f"prefill, {n} prompts, EP32", "hopper-derived") for n in ("1K", "2K", "4K")),
        (sglang, speedup, "hopper-derived"),
        (sglang, "decode, batch 256 per GPU, 2K context, EP72", "hopper-derived"),
        (production, "prefill, day average incl. 56.3 % cache hits, EP32", "hopper-derived"),
        (production, "decode at 20-22 tok/s per user, 4,989 context, EP144, MTP", "hopper-derived"),
    ]
    for case in expected:
        assert case in within
    assert len(within) >= len(expected) == 13


def test_validate_command_prints_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "cases.json"
    res = CliRunner().invoke(main, ["validate", "--cost-model", "roofline", "--json", str(out)])
    assert res.exit_code == 0, res.output
    cases = json.loads(out.read_text())
    assert len(cases) == sum(CASES.values())
    n_ok = sum(c["within"] for c in cases)
    assert (
        f"{n_ok} of {len(cases)} within tolerance (roofline {n_ok} of {len(cases)})" in res.output
    )
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
