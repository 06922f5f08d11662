"""Model and hardware specs: the published numbers, and what is derived from them.

Every figure the simulator uses about a model or an accelerator lives in a YAML file under
``configs/`` and is turned into derived quantities (parameter counts, weight bytes per GPU, KV
bytes per token, the SWA slot) by ``deepinfer_sim.models.spec``. These tests check those derived
quantities against numbers computed *independently*, by hand, from the tables in SPEC.md §3 and
§4 — never against the same formula the code uses — so that a wrong layer count, dtype or
exponent in a YAML file, or a slip in a derivation, shows up as a mismatch with the spec.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from deepinfer_sim.errors import ConfigError
from deepinfer_sim.models.hardware import HardwareSpec
from deepinfer_sim.models.registry import available, bundled_dir, load_hardware, load_model
from deepinfer_sim.models.spec import ModelSpec

V41 = "deepseek-v4.1-flash"
V4F = "deepseek-v4-flash"
V4P = "deepseek-v4-pro"
V3 = "deepseek-v3"

# SPEC.md §3's four models, plus the 3-layer V4.1-Flash stack the engine core validates with and
# V3 with NVIDIA's NVFP4 experts (a precision variant, tests/unit/test_precision.py).
BUNDLED_MODELS = {
    V41,
    V4F,
    V4P,
    V3,
    "deepseek-v4.1-flash-mini",
    "deepseek-v3-nvfp4",
    "deepseek-v3-int8",
}
# SPEC.md §4 lists these six; h100 and l40s are extra bundled datasheets.
SPEC_HARDWARE = {"b200", "gb200", "h200", "h800", "ascend950dt", "ascend950pr"}

MXFP4_BYTES = 4.25 / 8  # 4-bit values + one 8-bit scale per 32 elements = 4.25 bits


def model(name: str) -> ModelSpec:
    return load_model(name)


def bundled_yaml(name: str) -> dict[str, Any]:
    with (bundled_dir("models") / f"{name}.yaml").open(encoding="utf-8") as fh:
        data: dict[str, Any] = yaml.safe_load(fh)
    return data


def write_yaml(path: Path, data: dict[str, Any]) -> str:
    with path.open("w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh)
    return str(path)


# ---- registry -----------------------------------------------------------------------------------


def test_bundled_names_cover_the_spec_tables() -> None:
    """The bundled configs include every model of SPEC.md §3 and every accelerator of §4.

    Scenarios refer to models and hardware by these short names, so a renamed or missing file
    would break every scenario that uses it.
    """
    assert set(available("models")) == BUNDLED_MODELS
    assert set(available("hardware")) >= SPEC_HARDWARE


@pytest.mark.parametrize("name", sorted(BUNDLED_MODELS))
def test_every_bundled_model_loads_under_its_own_name(name: str) -> None:
    """Each bundled model YAML validates and its ``name`` field matches its file name.

    A mismatch would make results and reports label a model differently from the name the user
    asked for.
    """
    spec = load_model(name)
    assert isinstance(spec, ModelSpec)
    assert spec.name == name


@pytest.mark.parametrize("name", sorted(SPEC_HARDWARE | {"h100", "l40s"}))
def test_every_bundled_hardware_loads_under_its_own_name(name: str) -> None:
    """Each bundled hardware YAML validates and its ``name`` field matches its file name."""
    hw = load_hardware(name)
    assert isinstance(hw, HardwareSpec)
    assert hw.name == name


def test_unknown_model_name_lists_the_bundled_ones() -> None:
    """A typo in a model name is a ConfigError that lists every bundled name.

    The user should see what they could have meant instead of a file-not-found traceback.
    """
    with pytest.raises(ConfigError) as exc:
        load_model("deepseek-v5-ultra")
    msg = str(exc.value)
    assert "deepseek-v5-ultra" in msg
    for name in BUNDLED_MODELS:
        assert name in msg


def test_unknown_hardware_name_lists_the_bundled_ones() -> None:
    """A typo in a hardware name is a ConfigError that lists every bundled accelerator."""
    with pytest.raises(ConfigError) as exc:
        load_hardware("b300x")
    msg = str(exc.value)
    assert "b300x" in msg
    for name in SPEC_HARDWARE:
        assert name in msg


def test_missing_model_file_is_a_config_error(tmp_path: Path) -> None:
    """A path to a YAML file that does not exist is reported as a ConfigError naming the path."""
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(ConfigError, match=r"nowhere\.yaml"):
        load_model(str(missing))


# ---- validation of user-written model files -----------------------------------------------------


def test_a_copy_of_a_bundled_model_loads_from_a_path(tmp_path: Path) -> None:
    """A user's own model file (here an unmodified copy) loads by path to the same spec.

    This is the baseline for the validation tests below: the only difference there is the one
    key they break.
    """
    path = write_yaml(tmp_path / "mine.yaml", bundled_yaml(V41))
    assert load_model(path) == load_model(V41)


def test_unknown_nested_key_names_its_dotted_path(tmp_path: Path) -> None:
    """A misspelt key inside a section is rejected, and the error names ``section.key``.

    Silently ignoring an unknown key would let a typo (``index_top_k`` for ``index_topk``) fall
    back to a default without the user noticing.
    """
    data = bundled_yaml(V41)
    data["attention"]["index_top_k"] = 1024
    with pytest.raises(ConfigError) as exc:
        load_model(write_yaml(tmp_path / "typo.yaml", data))
    assert exc.value.path == "attention.index_top_k"
    assert "unknown key" in str(exc.value)


def test_unknown_top_level_key_names_it(tmp_path: Path) -> None:
    """An unknown key at the top level is rejected with that key as the path."""
    data = bundled_yaml(V4F)
    data["hiden"] = 4096
    with pytest.raises(ConfigError) as exc:
        load_model(write_yaml(tmp_path / "typo.yaml", data))
    assert exc.value.path == "hiden"


def test_top_k_above_routed_experts_is_rejected(tmp_path: Path) -> None:
    """Routing each token to more experts than exist is a ConfigError in the ``moe`` section.

    The message names ``top_k`` so the user knows which of the section's values to fix.
    """
    data = bundled_yaml(V41)
    data["moe"]["top_k"] = data["moe"]["routed_experts"] + 1
    with pytest.raises(ConfigError) as exc:
        load_model(write_yaml(tmp_path / "topk.yaml", data))
    assert exc.value.path.split(".")[0] == "moe"
    assert "top_k" in str(exc.value)


def test_top_k_equal_to_routed_experts_is_allowed(tmp_path: Path) -> None:
    """The bound is inclusive: a (dense-like) model that routes to every expert is valid."""
    data = bundled_yaml(V41)
    data["moe"]["top_k"] = data["moe"]["routed_experts"]
    assert load_model(write_yaml(tmp_path / "all.yaml", data)).moe.top_k == 384


# ---- SWA slot and KV cache ----------------------------------------------------------------------


def test_v41_swa_slot_is_the_published_size() -> None:
    """V4.1-Flash's SWA slot is 20 layers × 134 tokens × 528 B = 1,415,040 B (SPEC.md §2.6).

    134 = 128-token window + 5 draft + 1 bonus tokens; 528 = 512 B of FP8 values + 16 B of MX
    scales. This slot is held per sequence in host memory and moved with every P→D transfer.
    """
    assert model(V41).swa_slot_bytes == 20 * 134 * 528 == 1_415_040


# Hand-computed from SPEC.md §3: CSA layer 256 B main + 64 B indexer per token (bf16: 512×2/4 and
# 128×2/4 at 4× compression); HCA layer 512×2/128 = 8 B; V3's MLA caches 576 bf16 values.
KV_BF16 = {
    V4F: 21 * (256 + 64) + 20 * 8,  # 6,880
    V4P: 30 * (256 + 64) + 31 * 8,  # 9,848
    V3: 61 * 576 * 2,  # 70,272
}


@pytest.mark.parametrize(("name", "expected"), [(V4F, 6_880), (V4P, 9_848), (V3, 70_272)])
def test_kv_bytes_per_token_in_bf16_accounting_match_the_spec(name: str, expected: int) -> None:
    """Block-cache bytes per token, counted in bf16, are the SPEC.md §3 figures.

    These set the prefix-cache size, the P→D transfer size and the decode HBM per sequence;
    the per-layer breakdown above reproduces each published total.
    """
    assert KV_BF16[name] == expected  # the per-layer breakdown reproduces the published figure
    assert model(name).kv_bytes_per_token("bf16") == expected


def test_v41_kv_is_a_quarter_of_v4_flash() -> None:
    """V4.1-Flash caches ~1/4 of V4-Flash's KV per token (SPEC.md §3): exactly 6,880 / 4.

    Only the 20 encoder layers store a block cache; the decoder layers' cache is projected from
    the last encoder layer and not stored.
    """
    assert model(V41).kv_bytes_per_token("bf16") == 6_880 / 4 == 1_720


@pytest.mark.parametrize("name", [V41, V4F, V4P])
def test_stored_fp8_fp4_kv_is_about_half_of_bf16(name: str) -> None:
    """With FP8 main KV and FP4 indexer keys the stored cache is "~half" of bf16 (SPEC.md §3).

    The exact ratio is 45%: the indexer keys shrink to a quarter, the main entries to a half.
    """
    m = model(name)
    stored, bf16 = m.kv_bytes_per_token("stored"), m.kv_bytes_per_token("bf16")
    assert stored < bf16
    assert 0.4 < stored / bf16 < 0.6


def test_v41_stored_kv_bytes_by_hand() -> None:
    """V4.1-Flash stores 780 B per context token with FP8 main and FP4 indexer entries.

    5 CSA layers × (512 B FP8 + 128 × 0.5 B FP4 indexer) / 4 + 15 HCA layers × 512 B / 128.
    """
    assert model(V41).kv_bytes_per_token() == 5 * (512 + 64) / 4 + 15 * 512 / 128 == 780


def test_v3_stores_its_kv_in_bf16() -> None:
    """V3 keeps a bf16 MLA cache, so stored and bf16 accounting agree (70,272 B per token)."""
    m = model(V3)
    assert m.kv_bytes_per_token() == m.kv_bytes_per_token("bf16") == 70_272


@pytest.mark.parametrize("context", [0, 1, 4_096, 131_072, 1_000_000])
def test_kv_transfer_is_block_cache_plus_one_slot(context: int) -> None:
    """P→D transfer of one V4.1-Flash request = 780 B × context tokens + the 1,415,040 B slot.

    The SWA slot is sent once per request regardless of length; for short prompts it dominates
    the transfer (at 4K tokens: 3.2 MB of blocks vs 1.4 MB of slot).
    """
    assert model(V41).kv_transfer_bytes(context) == pytest.approx(780 * context + 1_415_040)


# ---- parameters ---------------------------------------------------------------------------------


def test_v4_flash_expert_is_13_4_mb_in_mxfp4() -> None:
    """One V4-Flash expert: 3 × 4096 × 2048 params at 4.25 bits ≈ 13.4 MB (SPEC.md §3).

    Expert bytes drive the memory-bound part of every MoE step and the HBM needed per EP rank.
    """
    m = model(V4F)
    assert m.expert_params == 3 * 4096 * 2048
    assert m.expert_bytes == 3 * 4096 * 2048 * MXFP4_BYTES
    assert m.expert_bytes == pytest.approx(13.4e6, rel=0.005)


@pytest.mark.parametrize(("name", "stated_b"), [(V41, 552), (V4F, 284), (V4P, 1_600), (V3, 671)])
def test_total_parameters_from_the_architecture_match_the_stated_total(
    name: str, stated_b: float
) -> None:
    """The parameter count derived from layers, widths and experts is within 5% of SPEC.md §3.

    This cross-checks the architecture numbers in the YAML (which the cost model uses) against
    the one published total they must add up to; V4.1's 552B is the backbone without the
    n-gram memory.
    """
    m = model(name)
    assert m.stated_params.total_b == stated_b
    assert m.total_params == pytest.approx(stated_b * 1e9, rel=0.05)


def test_v41_ngram_memory_is_not_part_of_the_backbone() -> None:
    """The 197B n-gram memory is recorded apart from, and not counted in, the 552B backbone."""
    m = model(V41)
    assert m.ngram_memory.params_b == 197
    assert m.total_params < (552 + 197) * 1e9 * 0.9


@pytest.mark.parametrize(
    ("name", "phase", "stated_b"),
    [
        (V41, "prefill", 8),
        (V41, "decode", 16),
        (V4F, "prefill", 13),
        (V4F, "decode", 13),
        (V4P, "decode", 49),
        (V3, "prefill", 37),
        (V3, "decode", 37),
    ],
)
def test_active_parameters_per_token_match_the_stated_figures(
    name: str, phase: Literal["prefill", "decode"], stated_b: float
) -> None:
    """Parameters one token touches are within 15% of the stated active count (SPEC.md §3).

    V4.1-Flash's prompt tokens pass only the 20 encoder layers (8B active) while decoded tokens
    pass all 40 (16B): the prefill/decode split is what makes its prefill cheap.
    """
    assert model(name).active_params(phase) == pytest.approx(stated_b * 1e9, rel=0.15)


def test_v41_prefill_touches_about_half_the_decode_parameters() -> None:
    """V4.1's encoder-only prefill touches roughly half of what a decode token touches (8B/16B)."""
    m = model(V41)
    assert 0.4 < m.active_params("prefill") / m.active_params("decode") < 0.6
    assert m.moe_layer_count("prefill") == 20
    assert m.moe_layer_count("decode") == 40


# ---- weights per GPU ----------------------------------------------------------------------------

V41_EXPERT_BYTES = 3 * 5120 * 2304 * MXFP4_BYTES  # 18,800,640 B
V41_MOE_LAYERS = 40


def test_v41_weight_bytes_per_gpu_by_hand() -> None:
    """HBM for V4.1 weights on one rank = dense copy + (384/ep + redundant) × 40 layers × expert.

    The dense part is every non-routed parameter in FP8 (1 B each): the total minus the routed
    experts (384 × 40 × 3 × 5120 × 2304).
    """
    m = model(V41)
    routed_params = 384 * V41_MOE_LAYERS * 3 * 5120 * 2304
    dense_bytes = (m.total_params - routed_params) * 1.0
    assert m.dense_weight_bytes == pytest.approx(dense_bytes)
    for ep, red in [(1, 0), (4, 4), (8, 4), (64, 1), (128, 1)]:
        expected = dense_bytes + (384 / ep + red) * V41_MOE_LAYERS * V41_EXPERT_BYTES
        assert m.weight_bytes_per_gpu(ep, red) == pytest.approx(expected, rel=1e-12)


def test_weight_bytes_per_gpu_fall_with_ep_width() -> None:
    """Widening expert parallelism spreads the routed experts thinner: fewer bytes per rank.

    This is the reason decode runs Wide-EP (SPEC.md §2.2).
    """
    m = model(V41)
    per_gpu = [m.weight_bytes_per_gpu(ep, 1) for ep in (1, 2, 4, 8, 16, 32, 64, 128)]
    assert all(a > b for a, b in itertools.pairwise(per_gpu))


@pytest.mark.parametrize("name", sorted(BUNDLED_MODELS))
def test_each_redundant_expert_costs_one_expert_per_moe_layer(name: str) -> None:
    """One more redundant expert per GPU adds exactly one expert's bytes in every MoE layer.

    For V4.1-Flash that is 40 × 18.8 MB = 752 MB per redundant expert — the price of EPLB's
    replicas (4 per GPU in prefill, 1 in decode).
    """
    m = model(name)
    step = m.moe_layer_count("decode") * m.expert_bytes
    for red in range(4):
        delta = m.weight_bytes_per_gpu(8, red + 1) - m.weight_bytes_per_gpu(8, red)
        assert delta == pytest.approx(step, rel=1e-12)
    if name == V41:
        assert step == pytest.approx(V41_MOE_LAYERS * V41_EXPERT_BYTES) == 752_025_600


@pytest.mark.parametrize("hw", ["b200", "gb200"])
def test_v41_decode_shape_fits_sm100_hbm(hw: str) -> None:
    """V4.1-Flash at the decode shape (EP64, 1 redundant expert) needs ~13.7 GB of weights.

    Far below the 180/186 GB of a B200/GB200, leaving the rest for KV cache.
    """
    weights = model(V41).weight_bytes_per_gpu(64, 1)
    assert weights == pytest.approx(13.7e9, rel=0.01)
    assert weights < 0.1 * load_hardware(hw).hbm_bytes


@pytest.mark.parametrize("hw", ["b200", "gb200"])
def test_v41_prefill_shape_ep4_fits_sm100_hbm(hw: str) -> None:
    """V4.1-Flash at EP4 with 4 redundant experts per GPU fits in one SM100 GPU's HBM.

    ~83.6 GB: (96 + 4) experts × 40 layers × 18.8 MB + ~8.4 GB dense copy, which is consistent
    with an independent estimate from the stated 552B total (nearly all of it routed experts, at
    4.25 bits over 4 GPUs ≈ 73 GB + redundancy + dense). This is what lets the published prefill
    benchmark run on 4 SM100 GPUs (SPEC.md §2.1), with ~95 GB left for KV and activations.
    """
    weights = model(V41).weight_bytes_per_gpu(4, 4)
    assert weights == pytest.approx(552e9 * MXFP4_BYTES / 4, rel=0.15)
    assert weights < load_hardware(hw).hbm_bytes
    assert load_hardware(hw).hbm_bytes - weights > 90e9


# ---- FLOPs per token ----------------------------------------------------------------------------


def test_v41_prefill_runs_fewer_linear_flops_than_decode() -> None:
    """V4.1-Flash's prompt tokens skip the decoder layers: fewer dense and routed FLOPs.

    Routed-expert FLOPs halve exactly (20 of 40 MoE layers, top-6 of 3 × 5120 × 2304 each).
    """
    m = model(V41)
    pre_dense, pre_routed = m.linear_flops_per_token("prefill")
    dec_dense, dec_routed = m.linear_flops_per_token("decode")
    assert pre_dense < dec_dense
    assert pre_routed == 2 * 6 * 3 * 5120 * 2304 * 20
    assert dec_routed == 2 * 6 * 3 * 5120 * 2304 * 40


def test_v4_flash_prefill_and_decode_pass_the_same_layers() -> None:
    """V4-Flash runs every layer on every token, so prefill and decode FLOPs per token agree.

    The only difference is the output head (2 × vocab × hidden), charged to decoded tokens.
    """
    m = model(V4F)
    pre_dense, pre_routed = m.linear_flops_per_token("prefill")
    dec_dense, dec_routed = m.linear_flops_per_token("decode")
    assert pre_routed == dec_routed == 2 * 6 * 3 * 4096 * 2048 * 43
    assert dec_dense - pre_dense == 2 * 129_280 * 4096


# ---- hardware -----------------------------------------------------------------------------------

# SPEC.md §4, dense rates. None = not published ("—").
HW_TABLE: dict[str, dict[str, float | None]] = {
    "b200": dict(bf16=2.25e15, fp8=4.5e15, fp4=9e15, hbm=180e9, bw=8e12, up=900e9, out=400),
    "gb200": dict(bf16=2.5e15, fp8=5e15, fp4=10e15, hbm=186e9, bw=8e12, up=None, out=400),
    "ascend950dt": dict(bf16=None, fp8=1e15, fp4=2e15, hbm=144e9, bw=4e12, up=2e12, out=None),
    "ascend950pr": dict(bf16=None, fp8=1e15, fp4=2e15, hbm=128e9, bw=1.6e12, up=2e12, out=None),
    "h200": dict(bf16=989e12, fp8=1979e12, fp4=None, hbm=141e9, bw=4.8e12, up=450e9, out=400),
    "h800": dict(bf16=989e12, fp8=1979e12, fp4=None, hbm=80e9, bw=3.35e12, up=200e9, out=400),
}


@pytest.mark.parametrize("name", sorted(HW_TABLE))
def test_hardware_matches_the_spec_table(name: str) -> None:
    """Each accelerator's datasheet leads equal SPEC.md §4: FLOP rates, HBM, links.

    Values not published there (Ascend BF16 and scale-out) are assumptions in the YAML and are
    not checked; a published FP4 rate of "—" must be absent, not invented.
    """
    row, hw = HW_TABLE[name], load_hardware(name)
    for cls in ("bf16", "fp8", "fp4"):
        if row[cls] is not None:
            assert getattr(hw.flops_per_s, cls) == pytest.approx(row[cls])
            assert hw.flops(cls) == pytest.approx(row[cls])
    if row["fp4"] is None:
        assert hw.flops_per_s.fp4 is None
    assert hw.hbm_bytes == pytest.approx(row["hbm"])
    assert hw.hbm_bytes_per_s == pytest.approx(row["bw"])
    if row["up"] is not None:
        assert hw.scaleup.bytes_per_s_per_dir == pytest.approx(row["up"])
    if row["out"] is not None:
        assert hw.scaleout.gbps_per_gpu == row["out"]


def test_nvlink_domains() -> None:
    """GB200 sits in a 72-GPU NVL72 scale-up domain; HGX B200/H200/H800 in 8-GPU nodes.

    The domain size decides whether a Wide-EP all-to-all stays on NVLink or crosses the
    400 Gb/s scale-out network, which is the main difference between the two SM100 systems.
    """
    assert load_hardware("gb200").scaleup.domain_gpus == 72
    for name in ("b200", "h200", "h800"):
        assert load_hardware(name).scaleup.domain_gpus == 8


@pytest.mark.parametrize("name", ["h200", "h800", "h100"])
def test_fp4_on_hopper_runs_at_the_fp8_rate(name: str) -> None:
    """Hopper has no FP4 tensor cores: FP4 (and MXFP4) experts compute at the FP8 rate."""
    hw = load_hardware(name)
    assert hw.flops("fp4") == hw.flops("fp8") == pytest.approx(1979e12)


def test_wider_classes_do_not_fall_back_downwards() -> None:
    """A class with its own unit uses it: B200 FP4 is 4× its BF16 rate, not a fallback."""
    hw = load_hardware("b200")
    assert hw.flops("fp4") == 4 * hw.flops("bf16") == pytest.approx(9e15)
    assert hw.flops("fp16") == hw.flops("bf16")  # unknown classes compute at bf16


@pytest.mark.parametrize(("name", "bytes_per_s"), [("b200", 50e9), ("h200", 50e9), ("l40s", 25e9)])
def test_scaleout_gbps_converts_to_bytes(name: str, bytes_per_s: float) -> None:
    """Scale-out links are quoted in Gb/s; the byte rate is Gb/s × 1e9 / 8 (400 Gb/s = 50 GB/s)."""
    assert load_hardware(name).scaleout.bytes_per_s == pytest.approx(bytes_per_s)


def test_v41_decode_hbm_holds_the_projected_decoder_caches() -> None:
    """V4.1-Flash stores/transfers only the encoder caches (5 CSA x 144 B + 15 HCA x 4 B = 780 B
    per token in FP8/FP4), but a decode rank also holds the 20 decoder layers' caches projected
    from the encoder (20 x (512 x 1 B + 128 x 0.5 B) / 4 = 2,880 B), 3,660 B per token in all."""
    spec = load_model("deepseek-v4.1-flash")
    assert spec.kv_bytes_per_token() == pytest.approx(780.0)
    assert spec.kv_hbm_bytes_per_token() == pytest.approx(3660.0)
    v4 = load_model("deepseek-v4-flash")
    assert v4.kv_hbm_bytes_per_token() == pytest.approx(v4.kv_bytes_per_token())
