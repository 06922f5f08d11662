"""``deepinfer-sim validate``: bundled published deployments predicted by the cost models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from deepinfer_sim.cli import main
from deepinfer_sim.planner.analysis.published import case_files, published_dir, run_cases

CASES = {
    "deepseek-v3-profile-h800": 2,
    "sglang-v3-h100-96gpu": 6,
    "deepseek-v3-production-h800": 2,
    "trtllm-r1-h200-min-latency": 1,
    "trtllm-r1-b200-min-latency": 2,
    "trtllm-r1-h200-max-throughput": 1,
    "trtllm-r1-b200-max-throughput": 1,
    "gpustack-r1-h200": 3,
    "dstack-r1-h200": 1,
    "dstack-r1-h200-aggregated": 3,
    "rtp-llm-v3-h800": 2,
    "cloudmatrix384-r1-910c": 7,
}


def test_the_corpus_ships_with_sources() -> None:
    """At least 15 cases from at least 6 organizations, each file with its source."""
    files = {cf.name: cf for _, cf in case_files()}
    assert {k: len(v.cases) for k, v in files.items()} == CASES
    for cf in files.values():
        assert cf.source and cf.organization and all(0 < c.tolerance <= 0.15 for c in cf.cases)
    assert sum(CASES.values()) >= 15
    assert len({cf.organization for cf in files.values()}) >= 6


@pytest.fixture(scope="module")
def results():
    return run_cases(("roofline", "profile"))


def test_every_case_runs_on_both_cost_model_families(results) -> None:
    """``profile`` takes each case's hardware's shipped profile: measured on the H200, derived
    elsewhere."""
    assert len(results) == 2 * sum(CASES.values())
    for r in results:
        assert r.simulated > 0 and r.ratio == pytest.approx(r.simulated / r.published)
        assert r.step_s > 0 and r.source
    models = {r.cost_model for r in results if r.family == "profile"}
    assert models == {"h200-deepseek", "hopper-derived", "sm100-derived", "ascend910c-derived"}


def test_cases_within_tolerance_as_measured(results) -> None:
    """What docs/validation.md reports (2026-12-06, after device call 35 moved V3's prefill
    attention to cuDNN's split form and its routed combine to Triton, and two-batch overlap
    split prefill batches by whole sequences as SGLang does; and on 2026-12-06, seventh session,
    after SGLang's overlapped prefill ran its GEMMs on the SMs DeepEP leaves and DeepSeek's
    profile ran with perfectly balanced experts, as each source says): the profiles predict
    SGLang's 96-GPU decode and its prefill with simulated perfect EPLB, DeepSeek's production
    decode, RTP-LLM's decode,
    CloudMatrix384's perfect-EPLB prefill and large-batch decode, GPUStack's 32K prefills (TP8 and
    DP attention) and TP8 decode on the H200 within tolerance. A change that moves one of these
    outside is a regression to look at, not a number to re-tune. Those two changes moved SGLang's
    three prefills, DeepSeek's production day average, CloudMatrix384's default-EPLB prefill and
    SGLang's two-batch-overlap speed-up outside, and the balanced experts DeepSeek's profiled
    prefill (1.11 -> 1.15); docs/validation.md says why. On 2026-12-07 (ninth session) a pool
    whose experts are tensor parallel over all its GPUs (one expert group) stopped paying the
    constant expert imbalance, a slowest-group / mean ratio that one group does not have:
    GPUStack's SGLang prefill with experts TP8 went out (1.112 -> 1.159); and TensorRT-LLM's two
    maximum-throughput runs, which configure no expert load balancer, came in once their burst
    simulations drew the imbalance of a static placement from the expert-load model (H200 1.163
    -> 1.148, B200 1.150 -> 1.133). On 2026-12-07 (tenth session) V3's decode step began to run
    as engines run it (the latent written by one fused kernel, the step's indices once per step:
    device call 50): TensorRT-LLM's H200 batch-1 run came in (0.897 -> 1.001) and its two
    maximum-throughput runs went out (H200 1.148 -> 1.194, B200 1.133 -> 1.184); looked at in
    docs/validation.md, and kept out.

    dstack and GPUStack publish vLLM TP8 TPOTs of R1 on the H200 at concurrency 4 33 % apart
    (25.7 and 19.4 ms): no model holds both within ±15 %. Until call 34 the prediction sat
    within dstack's; with the expert-TP slices on the faster routed GEMM (the Triton kernel
    class vLLM runs) it sits within GPUStack's, and since the fused decode step just below it
    (0.92). What must hold is that it stays within GPUStack's and faster than dstack's."""
    within = {(r.file, r.name) for r in results if r.within and r.family == "profile"}
    sglang, production, gpustack, cm = (
        "sglang-v3-h100-96gpu",
        "deepseek-v3-production-h800",
        "gpustack-r1-h200",
        "cloudmatrix384-r1-910c",
    )
    expected = [
        (sglang, "decode, batch 256 per GPU, 2K context, EP72"),
        (sglang, "prefill, 4K prompts, EP32, simulated perfect EPLB"),
        (production, "decode at 20-22 tok/s per user, 4,989 context, EP144, MTP"),
        ("rtp-llm-v3-h800", "decode at 20 tok/s per user, 5,000 context, EP144, MTP"),
        (cm, "decode, batch 96 per NPU, TPOT 49.4 ms"),
        (cm, "prefill, 4K prompts, 16,384 tokens per NPU, EP32 (16 NPUs), perfect EPLB"),
        (gpustack, "vLLM TP8 decode TPOT at concurrency 4, ShareGPT"),
        (gpustack, "vLLM TP8 prefill of 32K prompts in 8K chunks"),
        (
            "trtllm-r1-h200-min-latency",
            "batch 1, MTP-3 (2.82 tokens per step), TP8 attention, experts EP4 x TP2",
        ),
    ]
    for case in expected:
        assert case in within, case
    assert len(within) >= len(expected) == 9
    tpot = {
        r.file: r
        for r in results
        if r.family == "profile" and r.name.startswith("vLLM TP8 decode TPOT at concurrency 4")
    }
    assert tpot["dstack-r1-h200"].simulated < tpot["dstack-r1-h200"].published


def test_validate_command_prints_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "cases.json"
    res = CliRunner().invoke(
        main, ["validate", "--cost-model", "roofline", "--no-loso", "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    cases = json.loads(out.read_text())
    assert len(cases) == sum(CASES.values())
    n_ok = sum(c["within"] for c in cases)
    assert f"{n_ok} of {len(cases)} within tolerance (roofline {n_ok} of {len(cases)})" in (
        res.output
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
    production = str(published_dir() / "deepseek-v3-production-h800.yaml")
    args = ["validate", "--cost-model", "roofline", "--no-loso", "--strict", "--case-file"]
    strict = CliRunner().invoke(main, [*args, production])
    assert strict.exit_code == 1  # its roofline prefill is outside its tolerance (1.46)


def test_a_bad_case_file_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nsource: y\norganization: z\nscenario: {model: deepseek-v3}\n"
        "cases:\n  - {name: c, quantity: decode_tok_s_per_node, point: {batch_per_gpu: 8},"
        " published: 100}\n"
    )
    res = CliRunner().invoke(main, ["validate", "--case-file", str(bad)])
    assert res.exit_code == 2
    assert "error:" in res.output and "cases[0].point" in res.output and "context" in res.output
    assert "Traceback" not in res.output
    unknown = tmp_path / "model.yaml"
    unknown.write_text(
        "name: x\nsource: y\norganization: z\nscenario: {model: no-such-model}\n"
        "cases:\n  - {name: c, quantity: decode_tok_s_per_node,"
        " point: {batch_per_gpu: 8, context: 100}, published: 100}\n"
    )
    res = CliRunner().invoke(main, ["validate", "--case-file", str(unknown)])
    assert res.exit_code == 2 and "error:" in res.output and "Traceback" not in res.output


def test_validate_refits_leaving_each_source_out_and_writes_the_fit(tmp_path: Path) -> None:
    """The corpus parameters refitted without a case's source give its ``ratio_loso``; the JSON
    carries each case's source beside both ratios, and ``--write-fit`` the fitted parameters."""
    out, fit = tmp_path / "cases.json", tmp_path / "fit.json"
    args = ["validate", "--cost-model", "profile", "--json", str(out), "--write-fit", str(fit)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    cases = json.loads(out.read_text())
    assert len(cases) == sum(CASES.values())
    for c in cases:
        assert c["source"] and c["ratio_loso"] > 0 and isinstance(c["within_loso"], bool)
    assert "leaving the source out" in res.output
    shipped = json.loads(fit.read_text())["shipped"]["profile"]
    assert set(shipped) == {"cost_model.step.tensor_parallel.allreduce_latency_s"}


def test_an_error_band_is_the_worst_leave_one_source_out_error_of_the_cases_alike() -> None:
    from deepinfer_sim.planner.analysis.corpus_fit import error_band

    rows = [
        {"family": "profile", "pool": "decode", "parallel": "tp", "hardware": "hopper",
         "ratio_loso": 0.9},
        {"family": "profile", "pool": "decode", "parallel": "tp", "hardware": "blackwell",
         "ratio_loso": 0.5},
        {"family": "profile", "pool": "prefill", "parallel": "dp", "hardware": "hopper",
         "ratio_loso": 1.2},
        {"family": "roofline", "pool": "decode", "parallel": "tp", "hardware": "hopper",
         "ratio_loso": 3.0},
    ]  # fmt: skip
    band = error_band("decode", "tp", "hopper", "profile", rows)
    assert band is not None and band.cases == 1 and band.band == pytest.approx(0.1)
    wider = error_band("decode", "tp", "ascend", "profile", rows)
    assert wider is not None and wider.cases == 2 and wider.band == pytest.approx(0.5)
    assert "2 published cases alike: pool decode, parallel tp" in wider.text()
    assert error_band("decode", "tp", "hopper", "other", rows) is None
    shipped = error_band("decode", "dp", "hopper", "profile")  # the shipped fit file
    assert shipped is not None and shipped.cases >= 3
