"""Calibration maths: fits recover known models (tiles and all), derivation scales by the right
resource in the model's own dtypes, a profile holds fits per model and composes into a StepCost
over the model's layer counts.

The GPU measurements themselves are checked in the device run (calibration/README.md); here the
fitting and composition are tested on synthetic measurements drawn from known coefficients, and
``test_calibration_sweep.py`` runs the real sweep on the CPU with a toy model.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from deepinfer_sim.calibration.derive import Ratios, derive, target_dtype
from deepinfer_sim.calibration.fit import (
    decode_coef_model,
    decode_model,
    fit_decode,
    fit_linear_latency,
    fit_moe,
    fit_prefill,
    kfold,
    moe_coef_model,
    moe_model,
    prefill_model,
    prefill_terms,
)
from deepinfer_sim.errors import ConfigError, UserError
from deepinfer_sim.models.cost import PoolShape
from deepinfer_sim.models.profile import (
    A2aCoef,
    DecodeCoef,
    Dtypes,
    HardwareCoefs,
    ModelFits,
    MoeCoef,
    PrefillCoef,
    Profile,
    Provenance,
    load_profile,
    merge_profiles,
    wave_rows,
)
from deepinfer_sim.models.profile_cost import ProfileStepCost
from deepinfer_sim.models.registry import load_hardware, load_model
from deepinfer_sim.scenario import check_profile

DATA = Path(__file__).parent.parent / "data"
FLASH = "deepseek-v4.1-flash"


def noisy(t: np.ndarray, rng: np.random.Generator, rel: float = 0.01) -> np.ndarray:
    return t * (1 + rng.normal(0, rel, t.shape))


# ---- fits ---------------------------------------------------------------------------------------


def test_kfold_partitions_deterministically():
    parts = kfold(23, 5, seed=3)
    assert len(parts) == 5
    assert sorted(np.concatenate(parts).tolist()) == list(range(23))
    assert all(np.array_equal(a, b) for a, b in zip(parts, kfold(23, 5, seed=3), strict=True))


def prefill_truth(X: np.ndarray) -> np.ndarray:
    a, b, c, d, e = 2e-4, 3e-8, 4e-14, 2e-13, 5e-10
    n, p = X[:, 0], X[:, 1]
    return a + b * n + c * n * p + d * n * n + e * p


def test_prefill_fit_recovers_the_prefix_term_and_scores_off_grid_only():
    """t = a + b n + c n p + d n² + e p with 1 % noise: coefficients back within a few %, and the
    off-grid error is computed on the off-grid points alone — make those 50 % slower and only
    the off-grid numbers move."""
    rng = np.random.default_rng(0)
    n = np.array([256, 512, 1024, 2048, 4096, 8192, 16384, 32768], dtype=float)
    p = np.array([0, 4096, 16384, 65536, 262144], dtype=float)
    X = np.array([(a, b) for a in n for b in p])
    Xo = np.array([(768, 2000), (3000, 50000), (12000, 180000), (24000, 400000)], dtype=float)
    t, to = noisy(prefill_truth(X), rng), noisy(prefill_truth(Xo), rng)
    coef, err = fit_prefill(X, t, Xo, to)
    assert coef.b == pytest.approx(3e-8, rel=0.05)
    assert coef.c == pytest.approx(4e-14, rel=0.05)
    assert coef.e == pytest.approx(5e-10, rel=0.15)
    assert err.n_train == 40 and err.n_offgrid == 4
    assert err.train_mape < 0.02 and err.offgrid_mape is not None and err.offgrid_mape < 0.03
    _, slow = fit_prefill(X, t, Xo, to * 1.5)
    assert slow.train_mape == pytest.approx(err.train_mape)
    assert slow.offgrid_mape == pytest.approx(1 / 3, abs=0.02)
    assert slow.offgrid_max_ape is not None and slow.offgrid_max_ape > 0.3


def test_prefill_fit_takes_the_prefix_cost_only_where_cross_validation_wants_it():
    """With the prefix form among the candidates, a fixed cost of chunks that have a prefix (f)
    is fitted when the data carry one — its size recovered, and ProfileStepCost charging it per
    such chunk — and left at 0 when they do not (the cross-validated choice of form); the
    default forms (smooth only) never fit it."""
    rng = np.random.default_rng(1)
    n = np.array([256, 512, 1024, 2048, 4096, 8192, 16384, 32768], dtype=float)
    p = np.array([0, 8192, 32768, 131072, 262144], dtype=float)
    X = np.array([(a, b) for a in n for b in p])
    jump = 1.5e-4 * (X[:, 1] > 0)
    both = ("smooth", "prefix")
    t_jump = noisy(prefill_truth(X) + jump, rng)
    with_f, _ = fit_prefill(X, t_jump, forms=both)
    assert with_f.f == pytest.approx(1.5e-4, rel=0.15)
    without, _ = fit_prefill(X, noisy(prefill_truth(X), rng), forms=both)
    assert without.f == 0.0
    assert fit_prefill(X, t_jump)[0].f == 0.0
    with pytest.raises(ValueError, match="prefill forms"):
        fit_prefill(X, t_jump, forms=("cubic",))
    model = load_model(FLASH)
    coefs = make_coefs()
    pre = {k: c.model_copy(update={"f": 1e-4}) for k, c in coefs.prefill.items()}
    c0 = ProfileStepCost(model, load_hardware("h200"), PoolShape(1, 0), coefs)
    c1 = ProfileStepCost(
        model, load_hardware("h200"), PoolShape(1, 0), coefs.model_copy(update={"prefill": pre})
    )
    chunks = [(512, 0), (512, 4096), (256, 100)]
    assert c1.prefill_dense(chunks) - c0.prefill_dense(chunks) == pytest.approx(
        2 * model.prefill_layers * 1e-4
    )


def test_wave_rows_counts_whole_waves_of_query_tiles():
    """V3's TP8 slice on an H200: 16 heads, 132 SMs, 8.25 tiles of 128 rows at once — 1,024 new
    tokens (8 tiles per head) fill one wave of 1,056 rows, 1,100 (9 tiles) take two; without
    waves n is as it is."""
    assert wave_rows(1024, 128, 132 / 16) == pytest.approx(1056)
    assert wave_rows(1100, 128, 132 / 16) == pytest.approx(2112)
    assert wave_rows(16, 128, 132 / 16) == pytest.approx(1056)
    assert np.allclose(wave_rows(np.array([2048.0, 2304.0]), 128, 132 / 16), [2112, 3168])
    assert wave_rows(1100, 1, 0.0) == 1100


WAVES = 132 / 16  # V3's TP8 slice on an H200
EVERY_FORM = ("smooth", "prefix", "merge", "waves")


def wave_truth(X: np.ndarray) -> np.ndarray:
    """A prefill layer whose prefix attention runs in waves of 128-row tiles, 8.25 at once, and
    whose chunks with a prefix pay per new token for merging the two attention calls."""
    n, p = X[:, 0], X[:, 1]
    merge = 5e-8 * n * (p > 0)
    return 1.3e-4 + 1.3e-7 * n + 1.7e-11 * wave_rows(n, 128, WAVES) * p + 9e-12 * n * n + merge


def wave_grid() -> np.ndarray:
    n = [16, 128, 512, 896, 1024, 1100, 1536, 2048, 2304, 3072, 4096, 8192, 16384, 32768]
    p = [0, 8192, 32768, 131072]
    return np.array([(a, b) for a in n for b in p], dtype=float)


def test_prefill_fit_counts_the_prefix_attention_in_waves_where_the_data_step():
    """Data timed from a kernel that runs whole waves: the fit chooses the wave form (128-row
    tiles, the given tiles per wave) and the merge term, recovers their coefficients and
    predicts off-grid chunks on either side of a wave's edge within the noise — where the smooth
    n·p form misses them by far more; given no SM count (wave_tiles 0) it cannot."""
    rng = np.random.default_rng(2)
    X = wave_grid()
    Xo = np.array([(768, 24000), (1100, 24000), (2500, 24000), (12000, 2000)], dtype=float)
    t, to = noisy(wave_truth(X), rng), noisy(wave_truth(Xo), rng)
    coef, err = fit_prefill(X, t, Xo, to, forms=EVERY_FORM, wave_tiles=WAVES)
    assert (coef.wave_tile, coef.wave_tiles) == (128, WAVES)
    assert coef.c == pytest.approx(1.7e-11, rel=0.05)
    assert coef.g == pytest.approx(5e-8, rel=0.25)
    assert err.offgrid_mape is not None and err.offgrid_mape < 0.02
    smooth, smooth_err = fit_prefill(X, t, Xo, to, forms=EVERY_FORM)  # no SM count
    assert smooth.wave_tiles == 0 and smooth.wave_tile == 1
    assert smooth_err.offgrid_mape is not None and smooth_err.offgrid_mape > 0.05
    assert np.allclose(prefill_model(coef, Xo), wave_truth(Xo), rtol=0.03)


def test_prefill_fit_keeps_the_plain_forms_where_waves_and_merge_buy_nothing():
    """Data without waves or a merge: the extended forms do not lower the cross-validated
    error by PREFILL_EXTENSION_GAIN, so the fit is the plain form's, coefficient for coefficient.
    The extended forms are offered only when asked for (``merge``, ``waves``), and waves only
    where the grid's chunks span more than one."""
    rng = np.random.default_rng(3)
    X = wave_grid()
    t = noisy(prefill_truth(X), rng)
    both = ("smooth", "prefix")
    plain, _ = fit_prefill(X, t, forms=both)
    offered, _ = fit_prefill(X, t, forms=EVERY_FORM, wave_tiles=WAVES)
    assert offered == plain
    assert plain.g == 0.0 and plain.wave_tiles == 0.0
    assert {(f.f, f.g, f.wave_tile) for f in prefill_terms(EVERY_FORM, WAVES)} == {
        (f, g, tile) for f in (False, True) for g in (False, True) for tile in (1, 64, 128)
    }
    assert {(f.f, f.g, f.wave_tile) for f in prefill_terms(both, WAVES)} == {
        (False, False, 1),
        (True, False, 1),
    }
    one_wave = np.array([16.0, 256.0, 512.0])  # inside the first wave (528 rows of 64-row tiles)
    assert all(f.wave_tiles == 0 for f in prefill_terms(EVERY_FORM, WAVES, one_wave))
    with pytest.raises(ValueError, match="smooth and/or prefix"):
        prefill_terms(("merge", "waves"), WAVES)


def test_the_simulator_charges_a_wave_fit_as_the_fit_predicts():
    """ProfileStepCost composes a fit with waves and a merge term over the model's layers:
    one rank's chunks cost what the fit's own model gives per chunk, times the layers (the
    constant once per step), the chunk without a prefix paying neither."""
    model = load_model(FLASH)
    coef = PrefillCoef(
        a=1e-4, b=2e-8, c=3e-12, d=1e-13, e=2e-10, f=5e-5, g=4e-8, wave_tile=128, wave_tiles=WAVES
    )
    coefs = make_coefs().model_copy(update={"prefill": {"csa": coef, "hca": coef}})
    cost = ProfileStepCost(model, load_hardware("h200"), PoolShape(1, 0), coefs)
    chunks = [(1100, 24000), (512, 0), (2048, 8192)]
    per_chunk = prefill_model(coef, np.array(chunks, dtype=float)) - coef.a
    layers = model.prefill_layers
    assert cost.prefill_dense(chunks) == pytest.approx(layers * (coef.a + per_chunk.sum()))
    one = cost.prefill_dense([(1100, 24000)]) - cost.prefill_dense([(1024, 24000)])
    assert one > layers * coef.c * 24000 * 1000  # the second wave: ~1,056 rows more


def decode_rows(bs, vs, ls) -> np.ndarray:
    return np.array([(B, B * v, B * L) for B in bs for v in vs for L in ls], dtype=float)


DECODE_TRUTH = np.array([3e-5, 2e-5, 2e-11, 1e-7, 1e-11, 0.0, 0.0, 5e-7])  # a w c d e h q b


def test_decode_fit_finds_the_row_tile_and_the_query_context_term():
    """GEMM rows padded to 64-row tiles and attention work growing with v·K: the fit picks
    τ = 64 from {1, 16, 32, 64, 128} and recovers the slope and e; v = 5 and 2 off the grid
    (where an untiled form misses the padding jump) are predicted within the noise."""
    rng = np.random.default_rng(1)
    X = decode_rows((1, 8, 32, 64, 128, 256), (1, 3, 6), (2048, 8192, 32768))
    Xo = decode_rows((24, 48, 96, 200), (2, 5), (6000, 20000))
    t = noisy(decode_model(DECODE_TRUTH, X, tile=64), rng, 0.005)
    to = noisy(decode_model(DECODE_TRUTH, Xo, tile=64), rng, 0.005)
    coef, err = fit_decode(X, t, Xo, to)
    assert coef.tile == 64
    assert coef.b == pytest.approx(5e-7, rel=0.1)
    assert coef.e == pytest.approx(1e-11, rel=0.15)
    assert err.offgrid_mape is not None and err.offgrid_mape < 0.02
    untiled, err1 = fit_decode(X, t, Xo, to, tiles=(1,))
    assert untiled.tile == 1 and err1.train_mape > err.train_mape
    np.testing.assert_allclose(decode_coef_model(coef, X), decode_model(
        np.array([coef.a, coef.w, coef.c, coef.d, coef.e, coef.h, coef.q, coef.b]), X, coef.tile
    ))  # fmt: skip


# A staircase that no b·τ·k follows: per-tile cost falling then rising (wave quantization)
STAIRS = np.array([0.0, 9e-5, 2.1e-4, 2.6e-4, 3.1e-4, 3.7e-4, 4.6e-4, 5.5e-4, 6.3e-4, 7.0e-4])


def stair_truth(X: np.ndarray) -> np.ndarray:
    B, T, K = X[:, 0], X[:, 1], X[:, 2]
    k = np.ceil(T / 128).astype(int)
    scans = 1e-11 * (T / B) * K + 9e-10 * K / B + 2.5e-7 * T
    return 1.6e-4 + STAIRS[k - 1] + 2e-11 * K + 1e-7 * B + scans


def test_decode_fit_learns_a_measured_staircase_and_the_per_sequence_scan():
    """A GEMM staircase over 128-row tiles sampled one point per tile (the grid's staircase
    line), plus a scan per sequence (h·K/B) and attention per query token (q·T), which the
    staircase's flat first tile cannot absorb: cross-validation picks the staircase form at
    τ = 128 and predicts off-grid shapes (between tile counts' sample points) within the noise,
    where the b·τ·k form cannot."""
    rng = np.random.default_rng(3)
    grid = decode_rows((1, 8, 32, 64, 128, 256), (1, 3, 6), (2048, 8192, 32768))
    line = np.array([(32 * k, 128 * k, 32 * k * 4096) for k in range(1, 11)], dtype=float)
    X = np.concatenate([grid[grid[:, 1] <= 1280], line])
    Xo = decode_rows((24, 48, 96, 200), (2, 5), (6000, 20000))
    Xo = Xo[Xo[:, 1] <= 1280]
    t, to = noisy(stair_truth(X), rng, 0.005), noisy(stair_truth(Xo), rng, 0.005)
    coef, err = fit_decode(X, t, Xo, to)
    assert coef.tile == 128 and len(coef.steps) == 10
    assert coef.h == pytest.approx(9e-10, rel=0.25)
    assert coef.q == pytest.approx(2.5e-7, rel=0.25)
    assert err.offgrid_mape is not None and err.offgrid_mape < 0.01
    _, linear = fit_decode(X, t, Xo, to, tiles=(128,), staircase=False)
    assert linear.offgrid_mape is not None and linear.offgrid_mape > 2 * err.offgrid_mape
    # beyond the table the cost goes on at the top's rate per row; below it, the table itself
    big = coef.gemm_s(np.array([128.0 * 20, 100.0, 0.0]))
    assert big[0] == pytest.approx(coef.steps[-1] * 2)
    assert big[1] == coef.steps[0] and big[2] == 0.0


def test_tile_one_is_the_version_1_decode_form():
    """τ = 1 does not round T up (T may be fractional: mean verify tokens), e defaults to 0."""
    X = np.array([[3.0, 7.5, 30000.0], [10.0, 23.3, 5e5]])
    a, w, c, d, _, _, _, b = DECODE_TRUTH
    x = np.array([a, w, c, d, 0.0, 0.0, 0.0, b])
    old = a + np.maximum(w, b * X[:, 1]) + c * X[:, 2] + d * X[:, 0]
    np.testing.assert_array_equal(decode_model(x, X), old)
    coef = DecodeCoef(a=a, w=w, b=b, c=c, d=d)
    np.testing.assert_allclose(decode_coef_model(coef, X), old, rtol=1e-15)


def test_a_staircase_must_not_descend():
    with pytest.raises(ValueError, match="non-decreasing"):
        DecodeCoef(a=0, w=0, b=1e-7, c=0, d=0, tile=64, steps=(2e-5, 1e-5))
    with pytest.raises(ValueError, match="row tile"):
        DecodeCoef(a=0, w=0, b=1e-7, c=0, d=0, steps=(1e-5,))


MOE_X = np.array(
    [(E, R) for E in (8, 24, 48, 100) for R in (96, 768, 6144, 24576, 98304)], dtype=float
)


@pytest.mark.parametrize("tile", [1, 128])
def test_moe_fit_chooses_the_form_by_cross_validation(tile):
    """Measurements from the exp form (tile 1) or the 128-row tile form: k-fold CV on the
    training grid picks that form, and the coefficients come back."""
    rng = np.random.default_rng(2)
    truth = np.array([2e-5, 3e-6, 4e-9])
    t = noisy(moe_model(truth, MOE_X, tile), rng, 0.005)
    coef, err = fit_moe(MOE_X, t)
    assert (coef.form, coef.tile) == (("exp", 1) if tile == 1 else ("tile", 128))
    assert coef.e == pytest.approx(truth[1], rel=0.1)
    assert coef.f == pytest.approx(truth[2], rel=0.1)
    assert err.train_mape < 0.01 and err.offgrid_mape is None


def test_moe_fit_recovers_a_smooth_combination():
    """Measurements where the weight reads and the GEMMs overlap, t = a + ((e·E_act)^3 +
    (f·R)^3)^(1/3): cross-validation picks the smooth form and the fit recovers k = 3 (and e, f)
    within 10 %, where the additive form misses the middle by several per cent."""
    rng = np.random.default_rng(3)
    truth = np.array([2e-5, 3e-6, 4e-9])
    t = noisy(moe_model(truth, MOE_X, 1, 3.0), rng, 0.005)
    coef, err = fit_moe(MOE_X, t)
    assert (coef.form, coef.tile) == ("exp", 1)
    assert coef.k == pytest.approx(3.0, rel=0.1)
    assert coef.e == pytest.approx(truth[1], rel=0.1)
    assert coef.f == pytest.approx(truth[2], rel=0.1)
    assert err.train_mape < 0.01
    _, additive = fit_moe(MOE_X, t, smooth=False)
    assert additive.train_mape > 3 * err.train_mape


def test_moe_fit_of_additive_measurements_stays_additive():
    """Measurements of the additive form: the smooth candidate's k comes out at 1 (it nests the
    additive form), so whichever wins predicts what the additive fit does."""
    rng = np.random.default_rng(2)
    truth = np.array([2e-5, 3e-6, 4e-9])
    t = noisy(moe_model(truth, MOE_X), rng, 0.005)
    coef, err = fit_moe(MOE_X, t)
    additive, add_err = fit_moe(MOE_X, t, smooth=False)
    assert additive.k == 1.0 and coef.k == pytest.approx(1.0, abs=0.02)
    assert (coef.form, coef.tile) == ("exp", 1)
    np.testing.assert_allclose(
        moe_coef_model(coef, MOE_X), moe_coef_model(additive, MOE_X), rtol=5e-3
    )
    assert err.train_mape == pytest.approx(add_err.train_mape, abs=5e-4)


def test_moe_smooth_combination_between_sum_and_max():
    """k = 1 is exactly the sum a + e·E_act + f·rows; k grows toward the max; powers are
    taken of ratios, so tiny terms (w^8 ~ 1e-48) neither underflow nor lose the sum."""
    x = np.array([1e-5, 2e-6, 3e-9])
    X = np.array([[8.0, 600.0], [100.0, 0.0], [48.0, 1e5]])
    E, R = X[:, 0], X[:, 1]
    w, g = x[1] * E * (1 - np.exp(-R / E)), x[2] * R
    np.testing.assert_array_equal(moe_model(x, X, 1, 1.0), x[0] + w + g)
    big = moe_model(x, X, 1, 50.0)
    np.testing.assert_allclose(big, x[0] + np.maximum(w, g), rtol=0.02)
    mid = moe_model(x, X, 1, 3.0)
    assert np.all(mid <= x[0] + w + g) and np.all(mid >= big)
    np.testing.assert_allclose(mid, x[0] + (w**3 + g**3) ** (1 / 3), rtol=1e-12)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        MoeCoef(a=0, e=1e-6, f=1e-9, k=0.5)


def test_latency_bandwidth_fit():
    nbytes = np.array([1e5, 1e6, 1e7, 1e8, 1e9])
    t = 2e-5 + nbytes / 3e11
    latency, bw = fit_linear_latency(nbytes, t)
    assert latency == pytest.approx(2e-5, rel=1e-3)
    assert bw == pytest.approx(3e11, rel=1e-3)


# ---- profiles and the StepCost ------------------------------------------------------------------


def make_coefs() -> HardwareCoefs:
    pre = PrefillCoef(a=1e-4, b=2e-8, c=3e-14, d=1e-13, e=2e-10)
    dec = DecodeCoef(
        a=3e-5,
        w=4e-5,
        b=2e-7,
        c=2e-11,
        d=1e-7,
        e=3e-12,
        h=5e-10,
        q=1e-7,
        tile=64,
        steps=(1e-5, 3e-5),
    )
    return HardwareCoefs(
        prefill={"csa": pre, "hca": pre.model_copy(update={"c": 1e-14})},
        decode={"csa": dec, "hca": dec.model_copy(update={"tile": 1, "steps": ()})},
        moe=MoeCoef(a=1e-5, e=4e-6, f=3e-9, form="tile", tile=128),
        a2a=A2aCoef(latency_s=1e-5, link_efficiency=0.8, measured=True),
        vision_seconds_per_image=0.01,
    )


def make_profile(dtypes: Dtypes | None = None, name: str = "test-measured") -> Profile:
    return Profile(
        name=name,
        provenance=Provenance(kind="measured", device="NVIDIA H200", kernels="reference"),
        models={FLASH: ModelFits(dtypes=dtypes or Dtypes(), hardware={"h200": make_coefs()})},
    )


def test_graphed_engine_prefill_is_the_gpu_model_plus_fitted_step_prompt_and_token_terms():
    """A profile whose engine core replayed prefill steps of up to 4,096 tokens as CUDA graphs:
    the engine's StepCost prices such a step as the graphed kernel models plus the fitted
    constant (here negative: fixed costs a graph overlaps), cost per prompt and cost per token
    (no launch gaps), and a longer step with the eager model; the fit recovers all three from
    timed graphed steps and fits the eager form on the others."""
    from deepinfer_sim.calibration.sweep import fit_engine_overhead
    from deepinfer_sim.models.cost import StepParams
    from deepinfer_sim.models.profile import HostOverhead

    model = load_model(FLASH)
    hw = load_hardware("h200")
    step = StepParams(comm_overlap=0.0, step_overhead_s=0.0)
    coefs = make_coefs().model_copy(
        update={"host_overhead_s": HostOverhead(prefill=3e-4), "engine_prefill_graph_tokens": 4096}
    )
    gpu = ProfileStepCost(model, hw, PoolShape(1, 0), coefs, step)
    rows = []
    for b, n in ((1, 128), (2, 512), (4, 1024), (1, 4096), (2, 4096), (1, 8192), (2, 8192)):
        t = gpu.prefill_step([[(n, 0)] * b])
        if b * n <= 4096:
            t += -1.5e-3 + 1e-3 * b + 2e-7 * b * n  # constant (overlap) + per prompt + token
        else:
            t += model.prefill_layers * 3e-4 + 2e-3 + 1e-3 * b  # eager: launch gaps + host
        rows.append(("prefill", b, n, 0, t))
    eng = fit_engine_overhead(coefs, "h200", rows, model)
    assert eng.prefill_graph_step_s == pytest.approx(-1.5e-3, rel=1e-6)
    assert eng.prefill_graph_per_seq_s == pytest.approx(1e-3, rel=1e-6)
    assert eng.prefill_graph_per_token_s == pytest.approx(2e-7, rel=1e-6)
    fitted = coefs.model_copy(update={"engine_overhead": eng})
    engine = ProfileStepCost(model, hw, PoolShape(1, 0), fitted, step, eager=True)
    small = [[(1024, 0)] * 2]
    extra = -1.5e-3 + 2e-3 + 2e-7 * 2048
    assert engine.prefill_step(small) == pytest.approx(gpu.prefill_step(small) + extra)
    for _, b, n, _, t in rows[-3:]:  # the eager steps: within the eager model's fit
        assert engine.prefill_step([[(n, 0)] * b]) == pytest.approx(t, rel=0.05)
    eager_only = coefs.model_copy(update={"engine_prefill_graph_tokens": 0})
    plain = ProfileStepCost(model, hw, PoolShape(1, 0), eager_only, step, eager=True)
    gaps = model.prefill_layers * 3e-4
    assert plain.prefill_step(small) == pytest.approx(gpu.prefill_step(small) + gaps)


def test_profile_cost_composes_layers_of_the_model():
    """V4.1-Flash prefill runs its 5 CSA + 15 HCA encoder layers: the step is the sum of 20
    per-layer fits; decode adds the 20 decoder (CSA) layers, each with its own row tile."""
    model = load_model(FLASH)
    coefs = make_profile().coefs(model, "h200")
    c = ProfileStepCost(model, load_hardware("h200"), PoolShape(4, 4), coefs)
    n, p = 4096, 10_000
    per = [k.a + k.b * n + k.c * n * p + k.d * n * n + k.e * p for k in coefs.prefill.values()]
    assert c.prefill_dense([(n, p)]) == pytest.approx(5 * per[0] + 15 * per[1])
    B, v, K = np.array([10.0, 50.0, 300.0]), 2.0, np.array([50_000.0, 3e5, 2_400_000.0])

    def layer(k: DecodeCoef) -> np.ndarray:
        rows = B * v if k.tile == 1 else k.tile * np.ceil(B * v / k.tile)
        gemm = k.b * rows
        if k.steps:  # a measured staircase of len(steps) tiles, b·τ·k beyond it
            tiles = (rows / k.tile).astype(int)
            inside = tiles <= len(k.steps)
            gemm[inside] = np.array(k.steps)[tiles[inside] - 1]
        linear = k.c * K + k.d * B + k.e * v * K + k.h * K / B + k.q * B * v
        return k.a + np.maximum(k.w, gemm) + linear

    want = 25 * layer(coefs.decode["csa"]) + 15 * layer(coefs.decode["hca"])
    np.testing.assert_allclose(c.decode_dense(B, K, v), want, rtol=1e-12)
    m = coefs.moe
    E = model.experts_per_gpu(4, 4)
    active = E * (1 - np.exp(-600 / E))  # 100 tokens × top-6 pairs over E local experts
    rows = 128 * active * math.ceil(600 / (active * 128))
    assert c.moe_s(100.0, "prefill") == pytest.approx(20 * (m.a + m.e * active + m.f * rows))


@pytest.mark.parametrize("form, tile", [("exp", 1), ("tile", 128)])
@pytest.mark.parametrize("k", [1.0, 1.4, 3.0])
def test_profile_cost_moe_is_the_fitted_moe_model(form, tile, k):
    """moe_s (plain float maths, the hot path) is what the fit predicts, moe_coef_model, for
    the smooth combination too, at every phase's MoE layer count; at k = 1 bit for bit."""
    model = load_model(FLASH)
    moe = MoeCoef(a=1e-5, e=4e-6, f=3e-9, form=form, tile=tile, k=k)
    coefs = make_coefs().model_copy(update={"moe": moe})
    shape = PoolShape(4, 4)
    c = ProfileStepCost(model, load_hardware("h200"), shape, coefs)
    E = model.experts_per_gpu(4, 4)
    for tokens in (1.0, 17.0, 100.0, 3000.0, 50_000.0):
        X = np.array([[E, tokens * model.moe.top_k]])
        per_layer = float(moe_coef_model(moe, X)[0])
        for phase in ("prefill", "decode"):
            want = per_layer * model.moe_layer_count(phase)
            got = c.moe_s(tokens, phase)
            if k == 1.0:
                assert got == want
            else:
                assert got == pytest.approx(want, rel=1e-13)
    assert c.moe_s(0.0, "decode") == 0.0


def test_shipped_profiles_cost_their_moe_fits_form_exactly():
    """Every shipped profile's MoE fits cost exactly their form per MoE layer: the additive
    a + e·E_act + f·rows (k = 1), or the smooth a + ((e·E_act)^k + (f·rows)^k)^(1/k) — the
    experts alone (``moe_experts``) on EP8, the whole call (``moe``) on one GPU."""
    from deepinfer_sim.models.profile import available_profiles

    model = load_model(FLASH)
    hw = load_hardware("h200")
    for name in available_profiles():
        prof = load_profile(name)
        if FLASH not in prof.models:
            continue
        for hw_name, ep in itertools.product(prof.models[FLASH].hardware, (8, 1)):
            coefs = prof.coefs(model, hw_name)
            m = coefs.moe_experts or coefs.moe if ep > 1 else coefs.moe
            E = model.experts_per_gpu(ep, 0)
            c = ProfileStepCost(model, hw, PoolShape(ep, 0), coefs)
            for tokens in (3.0, 100.0, 8192.0):
                R = tokens * model.moe.top_k
                active = E * (1.0 - math.exp(-R / E))
                rows = R if m.form == "exp" else m.tile * active * math.ceil(R / (active * m.tile))
                per_layer = m.a + ((m.e * active) ** m.k + (m.f * rows) ** m.k) ** (1 / m.k)
                want = per_layer * model.moe_layer_count("decode")
                assert c.moe_s(tokens, "decode") == pytest.approx(want, rel=1e-12), name


def old_step_cost(coefs: HardwareCoefs, model, n: int, p: int, B: float, K: float, v: float):
    """The version 1 composition (before e terms and tiles), written out by hand."""
    groups = [g for g in model.layer_groups if g.in_prefill]
    pre = sum(
        g.count * (c.a + c.b * n + c.c * n * p + c.d * n * n)
        for g in groups
        for c in [coefs.prefill[g.attention]]
    )
    dec = sum(
        g.count * (c.a + max(c.w, c.b * B * v) + c.c * K + c.d * B)
        for g in model.layer_groups
        for c in [coefs.decode[g.attention]]
    )
    E = model.experts_per_gpu(8, 0)
    R = 100 * model.moe.top_k
    m = coefs.moe
    moe = m.a + m.e * E * (1 - math.exp(-R / E)) + m.f * R
    return pre, dec, moe * model.moe_layer_count("decode")


def test_version_1_profile_loads_and_gives_the_same_step_cost():
    """A version 1 file (one model: ``model_family`` + top-level hardware/fit/raw) loads as
    fits for that model, keeps its held-out errors and raw data, equals the shipped
    ``h200-reference`` coefficients and composes exactly the version 1 step times."""
    v1 = load_profile(str(DATA / "v1-profile.yaml"))
    assert list(v1.models) == [FLASH] and v1.version == 2
    fits = v1.models[FLASH]
    assert fits.dtypes.kv_cache == "bf16"  # version 1 kernels cached in the attention dtype
    assert fits.fit["moe"].heldout_mape is not None and fits.fit["moe"].offgrid_mape is None
    assert fits.raw["prefill"]
    assert fits.hardware == load_profile("h200-reference").models[FLASH].hardware
    model = load_model(FLASH)
    coefs = v1.coefs(model, "h200")
    assert coefs.moe.form == "exp" and all(d.tile == 1 for d in coefs.decode.values())
    c = ProfileStepCost(model, load_hardware("h200"), PoolShape(8, 0), coefs)
    pre, dec, moe = old_step_cost(coefs, model, 3000, 20_000, 37.0, 37 * 9000.0, 2.4)
    assert c.prefill_dense([(3000, 20_000)]) == pytest.approx(pre, rel=1e-12)
    assert float(c.decode_dense(np.array([37.0]), np.array([37 * 9000.0]), 2.4)[0]) == (
        pytest.approx(dec, rel=1e-12)
    )
    assert c.moe_s(100.0, "decode") == pytest.approx(moe, rel=1e-12)


def test_fits_are_found_for_the_model_or_a_model_at_the_same_widths():
    """The 3-layer engine stack (deepseek-v4.1-flash-mini) uses the V4.1-Flash fits: fits are
    per layer, widths decide. A model at other widths is refused, naming it, the models the
    profile has fits for, and what to do."""
    prof = make_profile()
    assert prof.for_model(load_model(FLASH)) is prof.models[FLASH]
    assert prof.for_model(load_model("deepseek-v4.1-flash-mini")) is prof.models[FLASH]
    with pytest.raises(ConfigError) as exc:
        prof.for_model(load_model("deepseek-v3"))
    msg = str(exc.value)
    for part in ("no fits for model 'deepseek-v3'", FLASH, "calibrate", "roofline"):
        assert part in msg


def test_missing_hardware_is_named():
    with pytest.raises(ConfigError, match=r"fits for model 'deepseek-v4\.1-flash' but no coeff"):
        make_profile().coefs(load_model(FLASH), "gb200")
    with pytest.raises(ConfigError, match="no coefficients for hardware 'gb200'"):
        make_profile().for_hardware("gb200")


def test_check_profile_accepts_the_models_fits_and_names_what_is_missing(tmp_path):
    from deepinfer_sim.models.profile import write_profile

    path = tmp_path / "p.yaml"
    write_profile(make_profile(), path)
    check_profile(str(path), load_model(FLASH), "h200", None)
    check_profile(str(path), load_model("deepseek-v4.1-flash-mini"), "h200", None)
    with pytest.raises(ConfigError, match="no fits for model 'deepseek-v4-pro'"):
        check_profile(str(path), load_model("deepseek-v4-pro"), "h200", None)
    with pytest.raises(ConfigError, match="no coefficients for hardware 'b200'"):
        check_profile(str(path), load_model(FLASH), "b200", None)
    # V4-Flash at V4.1-Flash widths would still need an SWA fit: named, not a crash later
    flash = load_model(FLASH)
    swa = flash.model_copy(
        update={"name": "with-swa", "layer_groups": load_model("deepseek-v4-flash").layer_groups}
    )
    with pytest.raises(ConfigError, match="no prefill swa, decode swa fit on h200"):
        check_profile(str(path), swa, "h200", None)


def test_a_scenario_names_the_pool_whose_profile_lacks_the_model():
    """The default scenario on a model the shipped profiles were not measured for (a toy): one
    error located at the pool's cost model. V3 has fits (h200-deepseek and what is derived from
    it), so it loads, as does the 3-layer V4.1-Flash stack (same widths)."""
    from pathlib import Path

    from deepinfer_sim.scenario import load_scenario

    toy = str(Path(__file__).parent.parent / "data" / "toy-model.yaml")
    with pytest.raises(ConfigError) as exc:
        load_scenario("default", [f"model={toy}"])
    assert "cost_model.prefill: profile 'sm100-derived' has no fits for model 'toy-v4'" in (
        str(exc.value)
    )
    load_scenario("default", ["model=deepseek-v3"])
    # the stack has 48 experts: EP48 splits them evenly (the default EP64 does not)
    load_scenario("default", ["model=deepseek-v4.1-flash-mini", "pools.decode.ep=48"])


def test_a_profile_with_several_models_needs_the_model_named():
    prof = merge_profiles([make_profile(), rename(make_profile(), "other")], "both")
    assert set(prof.models) == {FLASH, "other"}
    with pytest.raises(ConfigError, match="name the model"):
        prof.for_hardware("h200")


def rename(prof: Profile, model: str) -> Profile:
    (fits,) = prof.models.values()
    return prof.model_copy(update={"models": {model: fits}})


def test_merge_needs_the_same_device_and_kernels_and_disjoint_models():
    a = make_profile(name="a")
    b = rename(make_profile(name="b"), "other")
    merged = merge_profiles([a, b], "ab")
    assert merged.name == "ab" and "merged from a, b" in merged.provenance.note
    with pytest.raises(UserError, match=r"model 'deepseek-v4\.1-flash' has fits in more than one"):
        merge_profiles([a, make_profile(name="c")], "x")
    other_kernels = b.model_copy(
        update={"provenance": b.provenance.model_copy(update={"kernels": "deepseek"})}
    )
    with pytest.raises(UserError, match="kernels differs"):
        merge_profiles([a, other_kernels], "x")


# ---- derivation ---------------------------------------------------------------------------------


def test_a_derived_profile_moves_the_prefill_waves_with_the_sm_count():
    """The waves of a prefill fit (tiles run at once = SMs / heads) scale by the target's SM
    count over the source's (132 -> 148 on a B200), the merge term by HBM bandwidth; a target
    whose file states no SM count (Ascend 910C) keeps the measured GPU's waves."""
    coef = PrefillCoef(a=1e-4, b=2e-8, c=3e-12, d=1e-13, g=4e-8, wave_tile=128, wave_tiles=8.25)
    prof = make_profile()
    fits = prof.models[FLASH]
    coefs = fits.hardware["h200"].model_copy(update={"prefill": {"csa": coef, "hca": coef}})
    measured = prof.model_copy(
        update={"models": {FLASH: fits.model_copy(update={"hardware": {"h200": coefs}})}}
    )
    d = derive(measured, "x-derived", ["b200", "ascend910c"])
    h, b = load_hardware("h200"), load_hardware("b200")
    assert (h.sm_count, b.sm_count, load_hardware("ascend910c").sm_count) == (132, 148, None)
    on_b200 = d.models[FLASH].hardware["b200"].prefill["csa"]
    assert on_b200.wave_tiles == pytest.approx(8.25 * 148 / 132) and on_b200.wave_tile == 128
    assert on_b200.g == pytest.approx(4e-8 * h.hbm_bytes_per_s / b.hbm_bytes_per_s)
    assert d.models[FLASH].hardware["ascend910c"].prefill["csa"].wave_tiles == 8.25


def test_the_models_dtype_counts_only_where_the_target_has_units_for_it():
    h200, gb200 = load_hardware("h200"), load_hardware("gb200")
    assert target_dtype("mxfp4", "fp8", gb200) == "mxfp4"
    assert target_dtype("mxfp4", "fp8", h200) == "fp8"  # no FP4 units: stays as measured
    assert target_dtype("fp8", "bf16", h200) == "fp8"


def test_derived_profile_scales_by_the_bounding_resource():
    """H200 -> GB200 for V4.1-Flash (FP8 dense, MXFP4 experts, FP8 KV) measured with FP8 dense
    and experts over a bf16 cache: dense GEMMs by the FP8 rate ratio, weight reads by HBM
    bandwidth, expert GEMMs by H200-FP8 vs GB200-FP4 and expert reads also by MXFP4/FP8 bytes,
    cache reads by HBM × FP8/bf16 bytes, attention by the bf16 rate; launches kept."""
    prof = make_profile()
    d = derive(prof, "x-derived", ["gb200", "b200"])
    assert d.provenance.kind == "derived" and "derived, not measured" in str(d.provenance.method)
    assert d.provenance.kernels == "reference"
    h, g = load_hardware("h200"), load_hardware("gb200")
    mem = h.hbm_bytes_per_s / g.hbm_bytes_per_s
    src, dst = prof.models[FLASH].hardware["h200"], d.models[FLASH].hardware["gb200"]
    assert dst.prefill["csa"].b == pytest.approx(
        src.prefill["csa"].b * h.flops("fp8") / g.flops("fp8")
    )
    assert dst.prefill["csa"].c == pytest.approx(
        src.prefill["csa"].c * h.flops("bf16") / g.flops("bf16")
    )
    assert dst.prefill["csa"].e == pytest.approx(src.prefill["csa"].e * mem * 0.5)
    assert dst.decode["csa"].w == pytest.approx(src.decode["csa"].w * mem)
    assert dst.decode["csa"].c == pytest.approx(src.decode["csa"].c * mem * 0.5)
    assert dst.decode["csa"].d == pytest.approx(src.decode["csa"].d * mem)
    assert dst.decode["csa"].e == pytest.approx(
        src.decode["csa"].e * h.flops("bf16") / g.flops("bf16")
    )
    assert dst.decode["csa"].tile == 64 and dst.moe.tile == 128 and dst.moe.form == "tile"
    assert dst.moe.f == pytest.approx(src.moe.f * h.flops("fp8") / g.flops("fp4"))
    assert dst.moe.e == pytest.approx(src.moe.e * mem * (0.5 + 1 / 32) / 1.0)
    smooth = make_coefs().moe.model_copy(update={"k": 1.7})
    prof_k = make_profile()
    fits = prof_k.models[FLASH]
    hw_k = {"h200": fits.hardware["h200"].model_copy(update={"moe": smooth})}
    prof_k = prof_k.model_copy(
        update={"models": {FLASH: fits.model_copy(update={"hardware": hw_k})}}
    )
    dst_k = derive(prof_k, "x-derived", ["gb200"]).models[FLASH].hardware["gb200"].moe
    assert dst_k.k == 1.7 and (dst_k.e, dst_k.f) == (dst.moe.e, dst.moe.f)  # k carries over
    assert dst.decode["csa"].a == src.decode["csa"].a  # launch overhead is not hardware-bound
    assert set(d.models[FLASH].hardware) == {"gb200", "b200"}


def test_deriving_for_the_measured_hardware_changes_nothing():
    """Measured in the model's own dtypes on an H200 (MXFP4 experts run as FP8 there: no FP4
    units), deriving H200 -> H200 returns the measured coefficients exactly."""
    prof = make_profile(Dtypes(dense="fp8", experts="fp8", attention="bf16", kv_cache="fp8"))
    same = derive(prof, "again", ["h200"])
    assert same.models[FLASH].hardware["h200"] == prof.models[FLASH].hardware["h200"]
    r = Ratios.of(
        load_hardware("h200"), load_hardware("h200"), Dtypes(), load_model(FLASH).precision
    )
    assert (r.expert, r.expert_bytes) == (1.0, 1.0)  # was × 0.53 on the expert weight reads
    ref = load_profile("h200-reference")
    again = derive(ref, "again", ["h200"]).models[FLASH].hardware["h200"]
    assert again.moe == ref.models[FLASH].hardware["h200"].moe


def test_derivation_needs_one_measured_hardware_entry():
    derived = derive(make_profile(), "d", ["gb200", "b200"])
    with pytest.raises(UserError, match=r"is derived .* not measured"):
        derive(derived, "dd", ["h200"])
    two = derived.model_copy(
        update={"provenance": derived.provenance.model_copy(update={"kind": "measured"})}
    )
    with pytest.raises(UserError, match="2 hardware entries for model"):
        derive(two, "dd", ["h200"])


# ---- the sweep with a synthetic clock -----------------------------------------------------------


class SyntheticBench:
    """A Bench whose 'measurements' come from known per-layer models plus 1 % noise."""

    device_name = "synthetic"
    hardware = "h200"
    kinds = ("csa", "hca")
    kernels = "synthetic"
    engine_graphs = False
    engine_prefill_graph_tokens = 0
    kernel_versions: ClassVar[dict[str, str]] = {"clock": "numpy"}
    software: ClassVar[dict[str, str]] = {"torch": "n/a", "cuda": "n/a"}

    def __init__(self) -> None:
        self.spec = load_model(FLASH)
        self.dtypes = Dtypes()
        self.host_overhead: dict[str, list[float]] = {"decode": [2e-3]}
        self.rng = np.random.default_rng(5)

    def warmup(self) -> None:
        pass

    def _noise(self, t: float) -> float:
        return float(t * (1 + self.rng.normal(0, 0.01)))

    def prefill(self, kind: str, n: int, p: int) -> float:
        c = 3e-14 if kind == "csa" else 1e-14
        return self._noise(1e-4 + 2e-8 * n + c * n * p + 1e-13 * n * n + 1e-10 * p)

    def decode(self, kind: str, batch: int, context: int, verify: int, spread=0.0) -> float:
        X = np.array([[batch, batch * verify, batch * context]], dtype=float)
        return self._noise(float(decode_model(DECODE_TRUTH, X, 64)[0]))

    def moe(self, local_experts: int, tokens: int) -> float:
        X = np.array([[local_experts, tokens * 6]], dtype=float)
        return self._noise(float(moe_model(np.array([1e-5, 4e-6, 3e-9]), X)[0]))

    def moe_experts(self, local_experts: int, tokens: int) -> float:  # no gather or combine
        X = np.array([[local_experts, tokens * 6]], dtype=float)
        return self._noise(float(moe_model(np.array([4e-6, 4e-6, 2e-9]), X)[0]))

    def a2a_table(self) -> list[tuple[float, float]]:
        return [(float(b), 1e-5 + b / 4e11) for b in (1 << 16, 1 << 20, 1 << 24, 1 << 26)]

    def copy_bandwidth(self) -> float:
        return 4.3e12

    def vision(self) -> float | None:
        return 0.02

    def engine_steps(
        self, decode, prefill, spread=0.0, depth=1
    ) -> list[tuple[str, int, int, int, float]]:
        return []


def test_sweep_builds_a_profile_judged_off_the_grid(tmp_path):
    """The whole pipeline — measure the quick grid and its off-grid shapes, fit on the grid,
    score off it, assemble, write, reload — yields per-model fits whose off-grid errors are near
    the injected noise, with the off-grid raw points kept."""
    from deepinfer_sim.calibration.sweep import Grid, build_profile, measure
    from deepinfer_sim.models.profile import write_profile

    bench = SyntheticBench()
    grid = Grid.quick()
    m = measure(bench, grid, log=lambda s: None)
    prof = build_profile(bench, m, "synthetic-measured", "test")
    fits = prof.models[FLASH]
    assert set(fits.fit) == {
        "prefill.csa", "prefill.hca", "decode.csa", "decode.hca", "moe", "moe_experts"
    }  # fmt: skip
    for key, f in fits.fit.items():
        assert f.offgrid_mape is not None and f.offgrid_mape < 0.03, (key, f)
        assert f.n_offgrid > 0 and f.heldout_mape is None
    assert fits.fit["prefill.csa"].n_train == len(grid.prefill_shapes())
    assert fits.fit["decode.csa"].n_offgrid == len(grid.offgrid_decode_shapes())
    assert fits.hardware["h200"].decode["csa"].tile == 64
    assert len(fits.raw["decode_offgrid"]) == 2 * len(grid.offgrid_decode_shapes())
    assert len(fits.raw["moe_offgrid"]) == len(grid.off_moe)
    # the experts alone: fitted apart (their synthetic constant and per-row cost are lower)
    alone, whole = fits.hardware["h200"].moe_experts, fits.hardware["h200"].moe
    assert alone is not None and alone.a < whole.a and alone.f < whole.f
    assert len(fits.raw["moe_experts_offgrid"]) == len(grid.off_moe)
    assert prof.provenance.kernels == "synthetic" and prof.provenance.kernel_versions
    assert fits.hardware["h200"].a2a.measured
    assert fits.hardware["h200"].a2a.link_efficiency == pytest.approx(4e11 / 450e9, rel=1e-3)
    path = tmp_path / "p.yaml"
    write_profile(prof, path)
    assert load_profile(str(path)) == prof


def test_quick_grid_off_grid_shapes_are_new_and_within_budget():
    """Off-grid shapes lie between or beyond the grid points (never on them) and add at most
    30 % to the quick grid's shape count (it has a ~5 minute GPU budget per model)."""
    from deepinfer_sim.calibration.sweep import Grid

    for grid in (Grid.quick(), Grid()):
        assert not set(grid.off_prefill) & set(grid.prefill_shapes())
        assert not {v for _, _, v in grid.off_decode} & set(grid.decode_v)
        assert not {e for e, _ in grid.off_moe} & set(grid.moe_e)
        assert max(p for _, p in grid.off_prefill) > max(grid.prefill_p)
    counts = Grid.quick().count(kinds=3)
    assert counts["offgrid"] <= 0.3 * counts["grid"], counts
