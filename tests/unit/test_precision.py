"""Precision on the profile path: a measured fit moves to a model's dtypes only by a stated rule.

A calibration profile records the dtypes its kernels ran in (FP8 projections and experts on the
H200); a model file states its own (DeepSeek-V4's MXFP4 experts, NVIDIA's NVFP4 DeepSeek-R1).
``models/precision.py`` holds the one rule that moves the first to the second, class by class —
from the hardware file's rates where the hardware has units for the model's dtype, by bytes at
the next wider unit where it has not (a guess, and it says so) — or refuses. These tests pin the
rule's factors on the H200 and the B200, that a model in the profile's own dtypes gets exactly
the numbers it got before, that the commands print the rule, and the hardware files added with
it (GB300, B300, Ascend 910C).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from deepinfer_sim import load_scenario, simulate
from deepinfer_sim.cli import main
from deepinfer_sim.errors import ConfigError
from deepinfer_sim.models.cost import PoolShape
from deepinfer_sim.models.precision import (
    Ratios,
    dtype_rule,
    fitted_dtypes,
    profile_coefs,
    scale_coefs,
)
from deepinfer_sim.models.profile import Dtypes, load_profile
from deepinfer_sim.models.profile_cost import ProfileStepCost
from deepinfer_sim.models.registry import bundled_dir, load_hardware, load_model
from deepinfer_sim.scenario import Scenario
from deepinfer_sim.sim.core.assemble import dtype_rules, make_step_cost

V3, NVFP4 = "deepseek-v3", "deepseek-v3-nvfp4"
MEASURED = Dtypes(dense="fp8", experts="fp8", attention="bf16", kv_cache="bf16")  # V3 on the H200
CASE = "deepseek-v3-profile-h800"  # a V3 deployment (published case file) to cost on a profile


def v3_with(**precision: str):
    """DeepSeek-V3's precision with some classes changed."""
    return load_model(V3).precision.model_copy(update=precision)


def on_profile(model: str, hardware: str, profile: str, *extra: str) -> Scenario:
    """The V3 case's deployment with ``model`` on ``hardware``, both pools on ``profile``."""
    return load_scenario(
        CASE,
        [
            f"model={model}",
            f"pools.prefill.hardware={hardware}",
            f"pools.decode.hardware={hardware}",
            f"cost_model.prefill={profile}",
            f"cost_model.decode={profile}",
            *extra,
        ],
    )


# ---- the rule --------------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "bytes_"), [("mxfp4", 0.5 + 1 / 32), ("nvfp4", 0.5 + 1 / 16)])
def test_fp4_experts_on_the_h200_read_their_bytes_at_the_fp8_rate(dtype, bytes_):
    """The H200 has no FP4 units: FP4 experts measured as FP8 keep the FP8 rate on their GEMM rows
    and read their own bytes (0.53x for MXFP4, 0.56x for NVFP4: 4-bit values plus their scales).
    No SM90 kernel for it was measured, so the rule calls itself a guess — in its line."""
    rule = dtype_rule(MEASURED, v3_with(experts=dtype), load_hardware("h200"), profile="p")
    (experts,) = rule.classes
    assert (experts.what, experts.measured, experts.model) == ("experts", "fp8", dtype)
    assert experts.rate == 1.0 and experts.bytes == bytes_
    assert experts.source == "guess" and rule.guess
    r = rule.ratios
    assert (r.expert, r.expert_bytes, r.dense, r.dense_bytes, r.kv_bytes) == (1, bytes_, 1, 1, 1)
    assert rule.description == (
        f"profile p measured FP8 experts; {dtype.upper()} experts scaled by HBM bytes "
        f"({bytes_:.2f}x) and the FP8 rate (no FP4 units on h200; a guess, not measured: "
        f"{dtype.upper()} weights read packed, computed in FP8)"
    )


@pytest.mark.parametrize(("dtype", "bytes_"), [("mxfp4", 0.5 + 1 / 32), ("nvfp4", 0.5 + 1 / 16)])
def test_fp4_experts_on_the_b200_run_at_the_fp4_rate_of_its_datasheet(dtype, bytes_):
    """The B200 has FP4 units: the expert GEMM rows take its FP4 rate over its FP8 rate (0.5x,
    the hardware file's ratio) and the weight reads the bytes ratio. Both are datasheet numbers,
    not measurements, and the line says so."""
    b200 = load_hardware("b200")
    rule = dtype_rule(MEASURED, v3_with(experts=dtype), b200, profile="p")
    (experts,) = rule.classes
    assert experts.rate == b200.flops("fp8") / b200.flops("fp4") == 0.5
    assert experts.bytes == bytes_ and experts.source == "datasheet" and not rule.guess
    assert "FP4 rate (0.50x, b200 datasheet FP8/FP4; no " in rule.description


def test_fp8_to_bf16_dense_layers_on_the_h200_take_the_datasheet_ratio():
    """The H200 runs BF16 as well as FP8, but the profile measured FP8 only: BF16 dense layers
    take the hardware file's FP8/BF16 rate ratio (2.0x) and twice the bytes, and say that there
    is no BF16 measurement behind it."""
    h200 = load_hardware("h200")
    rule = dtype_rule(MEASURED, v3_with(dense="bf16"), h200, profile="p")
    (dense,) = rule.classes
    assert dense.what == "dense layers" and dense.bytes == 2.0
    assert dense.rate == h200.flops("fp8") / h200.flops("bf16") == pytest.approx(2.0, rel=1e-3)
    assert dense.source == "datasheet"
    assert "BF16 rate (2.00x, h200 datasheet FP8/BF16; no BF16 measurement)" in rule.description
    assert (rule.ratios.dense, rule.ratios.dense_bytes) == (dense.rate, 2.0)


def test_on_one_hardware_the_rule_is_the_derivations_ratios():
    """One ratio logic: on hardware with units for the model's dtypes, the rule's factors are
    exactly what calibration/derive.py scales by deriving a profile for that same hardware."""
    b200 = load_hardware("b200")
    model = v3_with(experts="nvfp4", dense="bf16", kv_main="fp8")
    assert dtype_rule(MEASURED, model, b200).ratios == Ratios.of(b200, b200, MEASURED, model)


def test_the_rule_moves_each_coefficient_by_its_resource():
    """Applied to V3's H200 coefficients: expert weight reads (moe e) by the bytes ratio, expert
    GEMM rows (moe f) by the rate ratio, dense weight reads (decode w) and GEMM rows (decode b)
    likewise, cache reads (decode c) by the KV bytes; launches (a) and attention (e) kept."""
    h200 = load_hardware("h200")
    coefs = load_profile("h200-deepseek").coefs(load_model(V3), "h200")
    model = v3_with(experts="nvfp4", dense="bf16", kv_main="fp8")
    rule = dtype_rule(MEASURED, model, h200)
    got = rule.apply(coefs)
    assert got == scale_coefs(coefs, rule.ratios)
    dense_rate = h200.flops("fp8") / h200.flops("bf16")
    assert got.moe.e == coefs.moe.e * 0.5625 and got.moe.f == coefs.moe.f
    assert coefs.moe_experts is not None and got.moe_experts is not None
    assert got.moe_experts.e == coefs.moe_experts.e * 0.5625
    old, new = coefs.decode["mla"], got.decode["mla"]
    assert new.w == old.w * 2.0 and new.b == old.b * dense_rate and new.c == old.c * 0.5
    assert (new.a, new.e) == (old.a, old.e)
    assert got.prefill["mla"].a == coefs.prefill["mla"].a * 2.0


def test_an_unsupported_combination_is_refused_with_one_clear_error(tmp_path):
    """FP32 weights (no hardware file rates FP32 GEMMs) and a dtype the simulator does not know
    have no rule: one ConfigError naming the model, the dtype and the profile — from the rule
    itself, and from a scenario at the pool's cost model (``cost`` prints it as one line)."""
    h200 = load_hardware("h200")
    with pytest.raises(ConfigError) as exc:
        dtype_rule(MEASURED, v3_with(dense="fp32"), h200, profile="h200-deepseek", model_name="m")
    msg = str(exc.value)
    for part in ("model m", "FP32 dense layers", "'h200-deepseek'", "FP32 GEMM rate", "roofline"):
        assert part in msg
    with pytest.raises(ConfigError, match=r"'int4' is no dtype the simulator knows"):
        dtype_rule(MEASURED.model_copy(update={"experts": "int4"}), v3_with(), h200)

    data = yaml.safe_load((bundled_dir("models") / f"{V3}.yaml").read_text())
    data["name"] = "v3-fp32-dense"
    data["precision"]["dense"] = "fp32"
    path = tmp_path / "v3-fp32-dense.yaml"
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(
        main,
        [*COST, "--set", f"model={path}", "--set", "pools.decode.hardware=h200"],
    )
    assert res.exit_code == 2
    (line,) = res.output.strip().splitlines()
    assert line.startswith("error: cost_model.decode: model v3-fp32-dense has FP32 dense layers")
    assert "'h200-deepseek'" in line and "Traceback" not in res.output


# ---- the profile path ------------------------------------------------------------------------

COST = ["cost", CASE, "--cost-model", "h200-deepseek", "--batch", "64", "--context", "4096"]


@pytest.mark.parametrize(
    ("hardware", "profile"), [("h200", "h200-deepseek"), ("b200", "sm100-derived")]
)
def test_the_nvfp4_variant_costs_its_experts_below_fp8_v3_on_the_profile_path(hardware, profile):
    """NVIDIA's NVFP4 DeepSeek-R1 (configs/models/deepseek-v3-nvfp4.yaml) matches V3's fits by
    its layer widths; its experts then cost less than V3's on the same profile (fewer bytes on
    the H200; fewer bytes and the FP4 rate on the B200) — not V3's FP8 numbers."""
    hw = load_hardware(hardware)
    costs = {}
    for name in (V3, NVFP4):
        sc = on_profile(name, hardware, profile)
        costs[name] = make_step_cost(sc, "decode", load_model(name), hw, 128, 0.25)
    for tokens in (8.0, 64.0, 512.0):
        assert costs[NVFP4].moe_s(tokens, "decode") < costs[V3].moe_s(tokens, "decode")
    assert set(dtype_rules(on_profile(NVFP4, hardware, profile))) == {"prefill", "decode"}
    assert dtype_rules(on_profile(V3, hardware, profile)) == {}


def test_cost_prints_the_rule_and_writes_it_to_json(tmp_path):
    """``cost`` names the rule in one line when the model's dtypes differ from the profile's,
    and its --json carries it; V3 itself, in the profile's dtypes, prints no such line."""
    out = tmp_path / "p.json"
    res = CliRunner().invoke(
        main,
        [
            *COST,
            "--set",
            f"model={NVFP4}",
            "--set",
            "pools.decode.hardware=h200",
            "--json",
            str(out),
        ],
        terminal_width=400,
    )
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.output.splitlines() if x.startswith("precision:")]
    assert line.startswith(
        "precision: decode: profile h200-deepseek measured FP8 dense layers, FP8 experts and BF16 "
        "KV cache; BF16 dense layers scaled by HBM bytes (2.00x) and the BF16 rate"
    )
    assert (
        "NVFP4 experts scaled by HBM bytes (0.56x) and the FP8 rate (no FP4 units on h200" in line
    )
    rule = json.loads(out.read_text())["precision"]
    assert rule["profile"] == "h200-deepseek" and rule["hardware"] == "h200" and rule["guess"]
    assert [c["class"] for c in rule["classes"]] == ["dense layers", "experts", "KV cache"]
    same = CliRunner().invoke(main, [*COST, "--set", "pools.decode.hardware=h200"])
    assert same.exit_code == 0 and "precision:" not in same.output


def test_a_model_in_the_profiles_own_dtypes_is_unchanged():
    """Measured V3 on the H200, and every model of the derived profiles on their hardware (their
    coefficients were derived to the model's own dtypes where the target has units for them): the
    rule is the identity, the coefficients are the very objects the profile holds and the step
    costs are the same to the last bit as a StepCost built from them directly."""
    cases = [
        ("h200-deepseek", V3, "h200"),
        ("h200-deepseek", "deepseek-v4.1-flash-mini", "h200"),
        ("sm100-derived", "deepseek-v4.1-flash", "gb200"),
        ("sm100-derived", "deepseek-v4-pro", "b200"),
        ("sm100-derived", V3, "b300"),
        ("hopper-derived", V3, "h800"),
        ("ascend950-derived", "deepseek-v4-flash", "ascend950dt"),
    ]
    batch, kv = np.array([1.0, 16.0, 64.0]), np.array([4096.0, 65536.0, 262144.0])
    for profile_name, model_name, hw_name in cases:
        profile, spec, hw = (
            load_profile(profile_name),
            load_model(model_name),
            load_hardware(hw_name),
        )
        coefs, rule = profile_coefs(profile, spec, hw)
        assert rule.identity and coefs is profile.coefs(spec, hw_name), (profile_name, model_name)
        shape = PoolShape(8, 0)
        a, b = (
            ProfileStepCost(spec, hw, shape, coefs),
            ProfileStepCost(spec, hw, shape, rule.apply(coefs)),
        )
        assert np.array_equal(a.decode_dense(batch, kv, 2.0), b.decode_dense(batch, kv, 2.0))
        assert a.moe_s(100.0, "prefill") == b.moe_s(100.0, "prefill")
    assert dtype_rules(load_scenario("default")) == {}  # so no summary or header changes


def test_derived_entries_are_read_in_the_dtypes_derive_left_them():
    """A derived profile's MXFP4 experts on SM100 are MXFP4 coefficients already; on an H800,
    which has no FP4 units, derive.py kept them FP8 — and the rule then reads them as MXFP4
    bytes at the FP8 rate, as it does on the H200 itself."""
    flash = load_model("deepseek-v4-flash")
    assert fitted_dtypes(load_profile("sm100-derived"), flash, load_hardware("gb200")).experts == (
        "mxfp4"
    )
    h800 = load_hardware("h800")
    assert fitted_dtypes(load_profile("hopper-derived"), flash, h800).experts == "fp8"
    _, rule = profile_coefs(load_profile("hopper-derived"), flash, h800)
    assert rule.description.startswith("profile hopper-derived (derived) holds FP8 experts; MXFP4")
    assert (rule.ratios.expert, rule.ratios.expert_bytes) == (1.0, 0.5 + 1 / 32)


def test_a_run_reports_the_rule_in_its_summary():
    """A run whose pools move their fits carries the rule per pool in summary.json
    (``precision``); one in the profile's dtypes has no such section."""
    over = ["workload.max_requests=20"]
    summary = simulate(on_profile(NVFP4, "h200", "h200-deepseek", *over)).summary
    assert set(summary["precision"]) == {"prefill", "decode"}
    assert "NVFP4 experts scaled by HBM bytes" in summary["precision"]["decode"]["rule"]
    assert "precision" not in simulate(on_profile(V3, "h200", "h200-deepseek", *over)).summary


# ---- the hardware files added with it --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "bf16", "fp8", "fp4", "hbm", "domain", "out"),
    [
        ("gb300", 2.5e15, 5e15, 1.5e16, 288e9, 72, 800),
        ("b300", 2.25e15, 4.5e15, 1.35e16, 288e9, 8, 800),
        ("ascend910c", 752e12, None, None, 128e9, 384, 400),
    ],
)
def test_the_new_hardware_files_load_and_validate(name, bf16, fp8, fp4, hbm, domain, out):
    """GB300 (NVL72) and B300 (HGX) from NVIDIA's spec sheets, dense rates (half the sparse
    figures), 288 GB of HBM3e; the Ascend 910C of Huawei's CloudMatrix384 paper, 384 NPUs on one
    UB network, no FP8 or FP4 units (an FP8 model computes at its BF16 rate); each has a default
    price, so a scenario on it runs without one."""
    hw = load_hardware(name)
    assert hw.name == name and hw.display_name
    r = hw.flops_per_s
    assert (r.bf16, r.fp8, r.fp4) == (bf16, fp8, fp4)
    assert hw.hbm_bytes == hbm and hw.scaleup.domain_gpus == domain
    assert hw.scaleout.gbps_per_gpu == out
    assert hw.flops("fp4") == (fp4 or fp8 or bf16) and hw.flops("fp8") == (fp8 or bf16)
    assert name in Scenario.model_validate({}).prices.gpu_hour_usd
    text = (bundled_dir("hardware") / f"{name}.yaml").read_text()
    assert text.startswith("# ") and "Source" in text.splitlines()[0]


def test_sm100_derived_covers_blackwell_ultra():
    """The SM100 derived profile covers B300 and GB300 as well, derived like B200 and GB200: the
    routed-expert GEMM rows of V4.1-Flash (MXFP4) by the FP4 rates, GB300's 15 against GB200's
    10 PFLOPS; weight reads by HBM bandwidth (the same 8 TB/s)."""
    profile, flash = load_profile("sm100-derived"), load_model("deepseek-v4.1-flash")
    assert set(profile.hardware_names()) == {"b200", "gb200", "b300", "gb300"}
    gb200, gb300 = profile.coefs(flash, "gb200"), profile.coefs(flash, "gb300")
    assert gb300.moe.f == pytest.approx(gb200.moe.f * 10 / 15, rel=1e-12)
    assert gb300.moe.e == gb200.moe.e and gb300.decode["csa"].w == gb200.decode["csa"].w


def test_the_nvfp4_variant_is_v3_at_the_same_widths(tmp_path: Path):
    """The variant differs from V3 in its precision only (and its name), so the profile's V3 fits
    are the ones it gets: NVFP4 experts, BF16 dense layers, an FP8 KV cache."""
    v3, v = load_model(V3), load_model(NVFP4)
    assert v.precision.experts == "nvfp4" and v.precision.dense == "bf16"
    assert v.precision.kv_main == "fp8"
    keep = {"name", "display_name", "precision"}
    assert v.model_dump(exclude=keep) == v3.model_dump(exclude=keep)
    profile = load_profile("h200-deepseek")
    assert profile.for_model(v) is profile.models[V3]


def test_plan_prints_one_line_per_pool_that_moves_its_fits():
    """``plan`` prints, before it searches, the rule of each pool whose model dtypes differ from
    its profile's (``cli_cost.precision_lines``); none for a model in the profile's dtypes."""
    from deepinfer_sim.cli_cost import precision_lines

    lines = precision_lines(on_profile(NVFP4, "b200", "sm100-derived"))
    assert [x.split(":")[1].strip() for x in lines] == ["prefill", "decode"]
    assert all(x.startswith("precision: ") and "NVFP4 experts" in x for x in lines)
    assert precision_lines(on_profile(V3, "b200", "sm100-derived")) == []


def test_int8_runs_at_the_hardwares_int8_rate_or_the_fp8_one():
    """W8A8 INT8 (CloudMatrix-Infer's DeepSeek-R1 on Ascend 910C) is a dtype of its own: one byte
    per weight, the hardware's INT8 tensor rate where the file states one (910C: twice its BF16
    rate), else the FP8 rate; a profile measured in FP8 moves to it by the rate ratio alone."""
    ascend, h200 = load_hardware("ascend910c"), load_hardware("h200")
    assert ascend.flops("int8") == 2 * ascend.flops("bf16")
    assert h200.flops("int8") == h200.flops("fp8")
    rule = dtype_rule(MEASURED, load_model("deepseek-v3-int8").precision, ascend)
    experts = next(c for c in rule.classes if c.what == "experts")
    assert experts.bytes == 1.0 and experts.rate == pytest.approx(
        ascend.flops("bf16") / ascend.flops("int8")
    )
