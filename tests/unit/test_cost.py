"""Attention closed forms and the roofline step-cost model.

``AttentionCost`` turns each layer group's attention into a few ``weight · min(slope · L, cap)``
terms so that a whole prefill chunk's cost has a closed form; ``RooflineStepCost`` combines those
with the linear layers, expert weights and the all-to-all into step times. The simulator calls
these millions of times, so they are written as O(1) closed forms — and these tests pin them to
what they approximate: brute-force sums over query positions, per-layer formulas written out by
hand from SPEC.md §3, and the lockstep "slowest rank sets the step" semantics of Wide-EP decode
(SPEC.md §2.2).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from deepinfer_sim.models.attention import AttentionCost, TermSum
from deepinfer_sim.models.comm import AllToAllParams
from deepinfer_sim.models.cost import PoolShape, RooflineParams, RooflineStepCost, StepParams
from deepinfer_sim.models.registry import bundled_dir, load_hardware, load_model
from deepinfer_sim.models.spec import ModelSpec

V41 = "deepseek-v4.1-flash"
V4F = "deepseek-v4-flash"
V4P = "deepseek-v4-pro"
V3 = "deepseek-v3"
MODELS = [V41, V4F, V4P, V3]

# SPEC.md §3, V4.1-Flash attention: 64 heads × 512, window 128, indexer 32 heads × 128,
# top-512 over a 4×-compressed cache; HCA layers compress 128×.
H, D, W = 64, 512, 128
HD4 = 4 * H * D  # QK^T + PV, 2 FLOPs per multiply-add each, per attended key


def csa_layer(L: np.ndarray, indexer_heads: int = 32, indexer_dim: int = 128) -> np.ndarray:
    """One CSA layer, one query at context L: window + indexer over L/4 + sparse top-512."""
    return (
        HD4 * np.minimum(L, W)
        + 2 * indexer_heads * indexer_dim * L / 4
        + HD4 * np.minimum(L / 4, 512)
    )


def hca_layer(L: np.ndarray) -> np.ndarray:
    """One HCA layer, one query at context L: window + dense attention over L/128 entries."""
    return HD4 * np.minimum(L, W) + HD4 * L / 128


def cost(
    name: str = V41,
    hw: str = "b200",
    ep: int = 4,
    redundant: int = 4,
    params: RooflineParams | None = None,
    step: StepParams | None = None,
) -> RooflineStepCost:
    return RooflineStepCost(
        load_model(name),
        load_hardware(hw),
        PoolShape(ep, redundant),
        params or RooflineParams(),
        step or StepParams(),
    )


def brute_sum(ts: TermSum, n: int, p: int) -> float:
    """The exact sum of the per-query cost over positions p+1 .. p+n."""
    return float(np.sum(ts.at(np.arange(p + 1, p + n + 1, dtype=float))))


# ---- AttentionCost: per-query cost --------------------------------------------------------------

LS = np.array([1.0, 64, 128, 129, 1_000, 2_048, 2_049, 5_000, 65_536, 1_000_000])


def test_v41_prefill_attention_per_query_by_hand() -> None:
    """A V4.1-Flash prompt token's attention FLOPs = 5 CSA + 15 HCA encoder layers, by hand.

    Each term written out from SPEC.md §3: window 4·H·D·min(L, 128); CSA indexer
    2·32·128·L/4; CSA sparse 4·H·D·min(L/4, 512); HCA 4·H·D·L/128. The decoder layers are not
    in this sum: prompt tokens only pass the encoder.
    """
    att = AttentionCost.of(load_model(V41))
    expected = 5 * csa_layer(LS) + 15 * hca_layer(LS)
    np.testing.assert_allclose(att.prefill_flops.at(LS), expected, rtol=1e-12)


def test_v41_decoder_and_decode_attention_per_query_by_hand() -> None:
    """The 20 decoder layers are CSA layers run on the replay segment; decode runs all 40.

    So decode = prefill (encoder) + replay (decoder), each checked against the hand formula.
    """
    att = AttentionCost.of(load_model(V41))
    np.testing.assert_allclose(att.replay_flops.at(LS), 20 * csa_layer(LS), rtol=1e-12)
    expected = 25 * csa_layer(LS) + 15 * hca_layer(LS)
    np.testing.assert_allclose(att.decode_flops.at(LS), expected, rtol=1e-12)


def test_v4_flash_attention_per_query_by_hand() -> None:
    """V4-Flash: 2 window-only + 21 CSA (64-head indexer) + 20 HCA layers, prefill = decode.

    Every V4-Flash layer runs on every token, so there is no replay-only part.
    """
    att = AttentionCost.of(load_model(V4F))
    HD4_F = 4 * 64 * 512  # same head shape as V4.1 (64 × 512)
    expected = (
        2 * HD4_F * np.minimum(LS, W) + 21 * csa_layer(LS, indexer_heads=64) + 20 * hca_layer(LS)
    )
    np.testing.assert_allclose(att.prefill_flops.at(LS), expected, rtol=1e-12)
    np.testing.assert_allclose(att.decode_flops.at(LS), expected, rtol=1e-12)
    np.testing.assert_array_equal(att.replay_flops.at(LS), np.zeros_like(LS))


def test_v3_mla_attention_is_linear_in_context() -> None:
    """V3's absorbed MLA scores every key over 576 dims and sums values over 512: no cap.

    Per query: 61 layers × 2 × 128 heads × (576 + 512) × L.
    """
    att = AttentionCost.of(load_model(V3))
    np.testing.assert_allclose(att.decode_flops.at(LS), 61 * 2 * 128 * (576 + 512) * LS, rtol=1e-12)
    assert att.decode_flops.linear() == (0.0, pytest.approx(61 * 2 * 128 * 1088))


def test_v4_flash_decode_reads_the_indexer_fully_but_the_main_kv_only_to_top_k() -> None:
    """Per decode step a long V4-Flash sequence reads 336 + 80 B per context token, plus a cap.

    Bytes per context token: the CSA indexer keys (21 × 128 × 0.5 B / 4 = 336) and the HCA
    entries (20 × 512 B / 128 = 80) are read in full; the CSA main entries only for the top-512
    selected, and the window for the last 128 tokens. So decode reads far less than the
    3,104 B/token it stores once the context is long.
    """
    m = load_model(V4F)
    const, slope = AttentionCost.of(m).decode_bytes.linear()
    assert slope == pytest.approx(21 * 64 / 4 + 20 * 512 / 128) == 416
    assert const == pytest.approx(43 * 128 * 512 + 21 * 512 * 512)
    assert slope < m.kv_bytes_per_token()


def test_at_of_a_scalar_context_is_a_float() -> None:
    """Asking one context length gives one number back (the scalar branch of ``at``).

    ``at`` is typed ``float | ndarray -> float | ndarray`` and has an explicit scalar branch;
    a caller writing ``float(ts.at(L))`` must not crash.
    """
    value = AttentionCost.of(load_model(V41)).prefill_flops.at(1_000.0)
    assert np.ndim(value) == 0
    one_k = np.array(1_000.0)
    assert float(value) == pytest.approx(float(5 * csa_layer(one_k) + 15 * hca_layer(one_k)))


# ---- AttentionCost: chunk closed form -----------------------------------------------------------

CHUNKS = [
    (256, 0),  # a short prompt from scratch
    (4_096, 0),  # a long first chunk, crossing the window and the top-k knee (L = 2,048)
    (128, 128),  # window-sized, starting right at the window
    (512, 1_800),  # straddling the top-k knee
    (8_192, 65_536),  # beyond every cap
    (32_768, 262_144),  # the per-step budget at a long prefix
]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(("n", "p"), CHUNKS)
def test_chunk_closed_form_matches_the_brute_force_sum(name: str, n: int, p: int) -> None:
    """``chunk(n, p)`` — the cost of n new tokens after a computed prefix p — is the sum of the
    per-query cost over positions p+1..p+n, within 1%.

    The closed form integrates the piecewise-linear per-query cost instead of summing it, so it
    is O(1) per chunk; the integral misses about half a token's cost at each end, which is well
    below 1% for chunks of >= 128 tokens. Checked for the prompt layers and the decoder-replay
    layers of every model.
    """
    att = AttentionCost.of(load_model(name))
    for ts in (att.prefill_flops, att.replay_flops, att.decode_flops):
        assert ts.chunk(n, p) == pytest.approx(brute_sum(ts, n, p), rel=0.01)


def test_chunks_add_up() -> None:
    """Computing a prompt in two chunks costs the same attention as computing it in one.

    Chunking changes how the work is split over steps, not how much there is.
    """
    ts = AttentionCost.of(load_model(V41)).prefill_flops
    for total, split in [(10_000, 100), (10_000, 2_048), (300_000, 131_072)]:
        one = ts.chunk(total, 0)
        assert ts.chunk(split, 0) + ts.chunk(total - split, split) == pytest.approx(one, rel=1e-12)


def test_chunk_of_nothing_is_free() -> None:
    """Zero new tokens cost no attention, whatever the prefix."""
    ts = AttentionCost.of(load_model(V41)).prefill_flops
    assert ts.chunk(0, 0) == 0
    assert ts.chunk(0, 100_000) == 0


# ---- TermSum.linear -----------------------------------------------------------------------------


def test_linear_form_of_v41_prefill_by_hand() -> None:
    """Past every cap, a V4.1 prompt token's attention is a constant plus a slope × L.

    Constant: 5 CSA × 4·H·D·(128 window + 512 top-k) + 15 HCA × 4·H·D·128 window
    = 671,088,640 FLOPs. Slope: 5 × 2·32·128/4 (indexer) + 15 × 4·H·D/128 (HCA) = 25,600 FLOPs
    per context token — the term that makes long-context prefill quadratic.
    """
    const, slope = AttentionCost.of(load_model(V41)).prefill_flops.linear()
    assert const == 5 * HD4 * (128 + 512) + 15 * HD4 * 128 == 671_088_640
    assert slope == 5 * 2 * 32 * 128 / 4 + 15 * HD4 / 128 == 25_600


@pytest.mark.parametrize("name", MODELS)
def test_linear_form_is_exact_once_every_cap_is_reached(name: str) -> None:
    """``linear()`` gives at(L) exactly for L past the top-k knee (L/4 >= top-k), and an upper
    bound below it.

    The decode cost model uses this linear form for every sequence, so for short sequences it
    overestimates (the caps are not yet reached); past the knee it must be exact.
    """
    att = AttentionCost.of(load_model(name))
    knee = 4 * load_model(name).attention.index_topk
    long = np.array([knee, knee + 1, 10 * knee + 7, 1e6, 1e7], dtype=float)
    short = np.array([1.0, 50, 127, knee / 2], dtype=float)
    for ts in (att.prefill_flops, att.replay_flops, att.decode_flops, att.decode_bytes):
        const, slope = ts.linear()
        np.testing.assert_allclose(ts.at(long), const + slope * long, rtol=1e-12)
        assert np.all(ts.at(short) <= const + slope * short)


# ---- RooflineStepCost: prefill ------------------------------------------------------------------

NS = [256, 512, 1_024, 2_048, 4_096, 8_192, 16_384, 32_768]
PS = [0, 1_024, 4_096, 16_384, 65_536, 131_072, 262_144]


@pytest.mark.parametrize("hw", ["b200", "h200"])
def test_prefill_step_is_monotone_in_new_tokens_and_prefix(hw: str) -> None:
    """More new tokens, or a longer computed prefix, never makes a prefill step cheaper.

    The chunk scheduler solves for the largest chunk that fits the remaining time, which only
    has a unique answer if the step time increases with the chunk size (SPEC.md §2.4).
    """
    c = cost(V41, hw)
    for p in PS:
        times = [c.prefill_step([[(n, p)]]) for n in NS]
        assert all(a < b for a, b in itertools.pairwise(times)), (p, times)
    for n in NS:
        times = [c.prefill_step([[(n, p)]]) for p in PS]
        assert all(a < b for a, b in itertools.pairwise(times)), (n, times)


def test_prefill_of_a_whole_context_is_super_linear_in_its_length() -> None:
    """Prefilling a context twice as long takes more than twice as long.

    For a fixed chunk size the step time is affine in the prefix (each new token's indexer and
    HCA attention scan the whole prefix), so summed over a whole context the cost is quadratic:
    T(2L) > 2·T(L), and the excess grows with L.
    """
    c = cost(V41, "b200")
    chunk = 8_192

    def whole(L: int) -> float:
        return sum(c.prefill_step([[(chunk, p)]]) for p in range(0, L, chunk))

    ratios = [whole(2 * L) / whole(L) for L in (65_536, 262_144, 1_048_576 // 2)]
    assert all(r > 2 for r in ratios)
    assert ratios == sorted(ratios)


@pytest.mark.parametrize("hw", ["b200", "gb200", "h200"])
def test_prefill_step_has_the_quadratic_shape_of_the_fitted_model(hw: str) -> None:
    """Step time fits t(n, p) ≈ a + b·n + c·n·p + d·n² with R² > 0.99 (SPEC.md §2.4).

    DeepInfer's scheduler uses exactly this fitted quadratic; the roofline model must be
    well described by it over the range it is used (n 256..32,768, p 0..262,144). The cross
    term c is the per-(new token × prefix token) attention cost, which must come out close to
    the hand-computed 25,600 FLOPs at the FP8 attention rate (datasheet × 0.3 efficiency).
    """
    c = cost(V41, hw)
    rows, y = [], []
    for n in NS:
        for p in PS:
            rows.append([1.0, n, n * p, n * n])
            y.append(c.prefill_step([[(n, p)]]))
    X, t = np.array(rows, dtype=float), np.array(y)
    coef, *_ = np.linalg.lstsq(X, t, rcond=None)
    r2 = 1 - np.sum((t - X @ coef) ** 2) / np.sum((t - t.mean()) ** 2)
    assert r2 > 0.99
    assert coef[2] > 0
    attn_rate = load_hardware(hw).flops("fp8") * RooflineParams().attention_efficiency
    assert coef[2] == pytest.approx(25_600 / attn_rate, rel=0.05)


def _without_decoder(tmp_path: Path) -> ModelSpec:
    with (bundled_dir("models") / f"{V41}.yaml").open(encoding="utf-8") as fh:
        data: dict[str, Any] = yaml.safe_load(fh)
    data["layer_groups"] = [g for g in data["layer_groups"] if g["in_prefill"]]
    path = tmp_path / "v41-no-decoder.yaml"
    with path.open("w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh)
    return load_model(str(path))


def test_v41_prefill_pays_for_the_decoder_replay(tmp_path: Path) -> None:
    """A V4.1 prefill step that carries an SWA replay segment pays for the decoder layers.

    SPEC.md §2.6: the decoder SWA cache is rebuilt on every prefill by running a replay segment
    (128 tokens bounded, 2,560 exact) through the 20 decoder layers. The scheduler passes that
    segment as ``replay`` chunks: a whole 4K prompt plus a 128-token replay must cost at least
    128 tokens' worth of decoder-layer dense FLOPs more than the prompt alone, and a model
    without decoder layers charges nothing for it.
    """
    full = load_model(V41)
    hw, shape, params = load_hardware("b200"), PoolShape(4, 4), RooflineParams()
    c = RooflineStepCost(full, hw, shape, params)
    without = RooflineStepCost(_without_decoder(tmp_path), hw, shape, params)
    head = 2 * full.vocab * full.hidden
    dec_dense_flops = (
        full.linear_flops_per_token("decode")[0] - full.linear_flops_per_token("prefill")[0] - head
    )
    assert dec_dense_flops == pytest.approx(full.linear_flops_per_token("replay")[0])
    min_extra = 128 * dec_dense_flops / (hw.flops("fp8") * params.gemm_efficiency)
    assert min_extra > 0
    ranks = [[(4_096, 0)]]
    replay = [[(128, 3_968)]]
    assert c.replay_dense(replay[0]) >= min_extra
    assert c.prefill_step(ranks, replay=replay) > c.prefill_step(ranks) + min_extra
    assert without.replay_dense(replay[0]) == 0.0
    exact = [[(2_560, 1_536)]]
    assert c.prefill_step(ranks, replay=exact) > c.prefill_step(ranks, replay=replay)


# ---- RooflineStepCost: decode -------------------------------------------------------------------


def decode_group(
    hw: str = "gb200", ep: int = 64, batch: float = 60, context: float = 8_000
) -> tuple[RooflineStepCost, np.ndarray, np.ndarray]:
    # the default scenario's stated exchange overlap (configs/default.yaml)
    c = cost(V41, hw, ep=ep, redundant=1, step=StepParams(comm_overlap=0.7))
    b = np.full(ep, float(batch))
    return c, b, b * context


def test_decode_step_is_set_by_the_slowest_rank() -> None:
    """Wide-EP ranks step in lockstep: the step is the slowest rank's time (SPEC.md §2.2).

    Giving the slowest rank more sequences makes the step slower; giving a *non*-slowest rank
    a shorter context leaves it exactly unchanged; giving a non-slowest rank fewer sequences
    changes it only through the group-mean expert load (and not at all when the experts are
    memory-bound).
    """
    c, b, kv = decode_group()
    b[0], kv[0] = 70, 70 * 20_000  # rank 0 is the slowest (most sequences, longest context)
    base = c.decode_step(b, kv, 4.0)

    up_b, up_kv = b.copy(), kv.copy()
    up_b[0], up_kv[0] = 71, 71 * 20_000
    assert c.decode_step(up_b, up_kv, 4.0) > base

    shorter = kv.copy()
    shorter[5] /= 2
    assert c.decode_step(b, shorter, 4.0) == base

    fewer = b.copy()
    fewer[5] = 30
    moe = c.moe_s(float(fewer.sum()) * 4.0 / 64, "decode")
    dense_max = float(c.decode_dense(b, kv, 4.0)[0])
    assert c.decode_step(fewer, kv, 4.0) == pytest.approx(
        c.compose(dense_max, moe, c.a2a_s(70 * 4.0, "decode"), "decode"), rel=1e-12
    )

    # Few sequences per rank: the experts are weight-bound, and with ~60 token-expert pairs per
    # local expert every one of them is reached, so the mean load barely matters (it moves only
    # the e^(-R/E) share of experts no token reaches).
    small_b, small_kv = np.full(64, 8.0), np.full(64, 8.0 * 4_000)
    small_b[0] = 10
    small_base = c.decode_step(small_b, small_kv, 2.0)
    small_fewer = small_b.copy()
    small_fewer[7] = 2
    assert c.decode_step(small_fewer, small_kv, 2.0) == pytest.approx(small_base, rel=1e-6)


def test_more_verify_tokens_never_make_decode_faster() -> None:
    """Verifying more draft tokens per sequence costs at least as much per step.

    DSpark schedules the verify length to maximise tokens × steps/s (SPEC.md §2.7); that trade
    only exists if the step time is non-decreasing in the verify length.
    """
    rng = np.random.default_rng(7)
    for hw in ("gb200", "b200"):
        c = cost(V41, hw, ep=64, redundant=1)
        for _ in range(5):
            b = rng.integers(0, 90, size=64).astype(float)
            kv = b * rng.uniform(500, 50_000, size=64)
            times = [c.decode_step(b, kv, v) for v in (1.0, 2.0, 3.0, 3.2, 4.4, 5.0, 6.0)]
            assert all(a <= t for a, t in itertools.pairwise(times))
            assert times[-1] > times[0]


def test_expert_imbalance_stretches_the_moe_part_and_the_busiest_receivers_exchange() -> None:
    """Imbalance 1.09 (the measured decode figure, SPEC.md §2.3) adds 0.09 × the MoE time, and
    the rank whose experts receive 1.09 × the mean tokens takes 1.09 × as long to exchange them.

    With the all-to-all fully hidden (GB200, EP64 inside one NVL72 domain) the step is
    overhead + dense + imbalance × moe, so the difference is exactly 0.09 × moe_s. When the
    all-to-all is exposed (B200, EP64 over scale-out) the longer exchange shows, less what the
    extra compute hides.
    """
    c, b, kv = decode_group("gb200")
    moe = c.moe_s(float(b.sum()) * 4.0 / 64, "decode")
    dense = float(c.decode_dense(b, kv, 4.0).max())
    assert c.a2a_s(1.09 * 60 * 4.0, "decode") <= c.comm_overlap * (dense + moe)  # hidden
    diff = c.decode_step(b, kv, 4.0, imbalance=1.09) - c.decode_step(b, kv, 4.0, imbalance=1.0)
    assert diff == pytest.approx(0.09 * moe, rel=1e-9)

    c, b, kv = decode_group("b200")
    moe = c.moe_s(float(b.sum()) * 4.0 / 64, "decode")
    dense = float(c.decode_dense(b, kv, 4.0).max())
    sent, received = c.a2a_s(60 * 4.0, "decode"), c.a2a_s(1.09 * 60 * 4.0, "decode")
    assert received > sent > c.comm_overlap * (dense + 1.09 * moe)  # exposed
    diff = c.decode_step(b, kv, 4.0, imbalance=1.09) - c.decode_step(b, kv, 4.0, imbalance=1.0)
    assert diff == pytest.approx(received - sent + 0.09 * moe * (1 - c.comm_overlap), rel=1e-9)
    assert c.experts_and_exchange(240.0, 64 * 240.0, 1.09, "decode") == pytest.approx(
        (c.moe_s(1.09 * 240, "decode"), received)
    )
    busy_sender = c.experts_and_exchange(500.0, 64 * 240.0, 1.09, "decode")[1]
    assert busy_sender == pytest.approx(c.a2a_s(500.0, "decode"))


@pytest.mark.parametrize("hw", ["gb200", "b200", "h200"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_decode_step_is_max_over_ranks_of_decode_dense(hw: str, seed: int) -> None:
    """The vectorized hot path gives the lockstep semantics for arbitrary per-rank loads.

    decode_step = compose(max over ranks of decode_dense, moe_s(imbalance · group-mean tokens),
    a2a_s(the busiest rank's tokens)); and decode_dense of the whole group equals decode_dense
    of each rank on its own (no cross-rank leakage in the vectorized form).
    """
    rng = np.random.default_rng(seed)
    ep = 64
    c = cost(V41, hw, ep=ep, redundant=1)
    b = rng.integers(0, 120, size=ep).astype(float)
    kv = b * rng.uniform(100, 200_000, size=ep)
    verify = float(rng.uniform(1, 5))
    imbalance = float(rng.uniform(1.0, 1.2))
    dense = c.decode_dense(b, kv, verify)
    singles = [float(c.decode_dense(b[i : i + 1], kv[i : i + 1], verify)[0]) for i in range(ep)]
    np.testing.assert_allclose(dense, singles, rtol=1e-12)
    expected = c.compose(
        max(singles),
        c.moe_s(imbalance * float(b.mean()) * verify, "decode"),
        c.a2a_s(float(b.max()) * verify, "decode"),
        "decode",
    )
    assert c.decode_step(b, kv, verify, imbalance) == pytest.approx(expected, rel=1e-12)


def test_an_idle_rank_shows_only_its_weight_floor() -> None:
    """A rank with no sequences still streams its dense weights each step, never more than a
    busy rank — so the max over ranks needs no mask for idle ones."""
    c, b, kv = decode_group()
    b[3], kv[3] = 0, 0
    dense = c.decode_dense(b, kv, 4.0)
    assert dense[3] < dense[0]
    assert dense[3] == pytest.approx(float(c.decode_dense(np.zeros(1), np.zeros(1), 4.0)[0]))


# ---- all-to-all ---------------------------------------------------------------------------------


def test_no_all_to_all_without_expert_parallelism() -> None:
    """At EP1 every expert is local: dispatch/combine cost nothing however many tokens."""
    c = cost(V41, "b200", ep=1, redundant=0)
    for tokens in (0, 1, 1_000, 32_768):
        assert c.a2a_s(tokens, "prefill") == 0
        assert c.a2a_s(tokens, "decode") == 0


@pytest.mark.parametrize(("hw", "ep"), [("b200", 8), ("b200", 64), ("gb200", 64)])
def test_all_to_all_grows_with_tokens(hw: str, ep: int) -> None:
    """More tokens per rank move more bytes through dispatch and combine."""
    c = cost(V41, hw, ep=ep, redundant=1)
    times = [c.a2a_s(t, "decode") for t in (1, 16, 64, 256, 1_024, 8_192)]
    assert all(a < b for a, b in itertools.pairwise(times))


@pytest.mark.parametrize("tokens", [1, 16, 240, 4_096])
def test_ep64_all_to_all_is_cheaper_inside_an_nvl72_domain(tokens: int) -> None:
    """EP64 fits inside GB200's 72-GPU NVLink domain but spans 8 HGX B200 nodes.

    On B200, 56 of each rank's 63 peers are off-node, so most of the traffic crosses the
    400 Gb/s scale-out links; on GB200 it all stays on 900 GB/s NVLink.
    """
    gb200 = cost(V41, "gb200", ep=64, redundant=1)
    b200 = cost(V41, "b200", ep=64, redundant=1)
    assert gb200.a2a_s(tokens, "decode") < b200.a2a_s(tokens, "decode")


def test_v4_flash_all_to_all_payload_is_the_published_per_token_traffic() -> None:
    """V4-Flash moves 6 × 4096 B FP8 (dispatch) + 6 × 8192 B BF16 (combine) per token per MoE
    layer (SPEC.md §3: ≈ 24.6 KB + 49 KB).

    At EP64 inside an NVL72 domain decode's low-latency exchange writes every copy but the
    rank's own share (1/64) over NVLink at the low-latency kernels' achieved share (DeepEP EP8:
    0.57 of the link), 43 MoE layers, plus a latency per exchange.
    """
    c = cost(V4F, "gb200", ep=64, redundant=1)
    per_token = 6 * 4096 * 1 + 6 * 8192
    assert per_token == pytest.approx(24.6e3 + 49e3, rel=0.01)
    tokens = 100_000
    expected = 43 * tokens * per_token * 63 / 64 / (900e9 * 0.57)
    assert c.a2a_s(tokens, "decode") == pytest.approx(expected, rel=0.01)


def test_b200_ep64_all_to_all_is_scale_out_bound() -> None:
    """On B200 at EP64 (8 nodes), decode's low-latency exchange sends the 7/8 of a token's
    expert copies that live off-node over the 400 Gb/s NIC at DeepEP's achieved 0.78 of it;
    V4.1-Flash: 6 × 5120 × (1 + 2) B per copy, 40 MoE layers."""
    c = cost(V41, "b200", ep=64, redundant=1)
    tokens = 10_000
    expected = 40 * tokens * 6 * 5120 * 3 * (7 / 8) / (50e9 * 0.78)
    assert c.a2a_s(tokens, "decode") == pytest.approx(expected, rel=0.01)


# ---- compose ------------------------------------------------------------------------------------


def test_compose_hides_communication_behind_compute() -> None:
    """All-to-all up to comm_overlap × compute is hidden; only the excess adds to the step.

    With overlap 0.7 and 10 ms of compute, up to 7 ms of communication hides. Decode's
    low-latency exchange holds no SM, so what hides is free.
    """
    c = cost(step=StepParams(comm_overlap=0.7, step_overhead_s=2e-4))
    overhead = 2e-4
    assert c.compose(6e-3, 4e-3, 0.0, "decode") == pytest.approx(overhead + 10e-3)
    assert c.compose(6e-3, 4e-3, 5e-3, "decode") == pytest.approx(overhead + 10e-3)
    assert c.compose(6e-3, 4e-3, 7e-3, "decode") == pytest.approx(overhead + 10e-3)
    assert c.compose(6e-3, 4e-3, 10e-3, "decode") == pytest.approx(overhead + 10e-3 + 3e-3)
    assert c.compose(6e-3, 6e-3, 10e-3, "decode") == pytest.approx(overhead + 12e-3 + 1.6e-3)


def test_a_normal_mode_exchange_takes_its_sm_share_from_the_compute_beside_it() -> None:
    """Prefill's normal-mode kernels hold normal_sm_share of the SMs while they run (DeepEP's
    default 20 of 132): the hidden part of the exchange slows the compute under it by that
    share of its length; the exposed part runs alone and costs only itself."""
    params = AllToAllParams(normal_sm_share=0.2)
    c = cost(step=StepParams(comm_overlap=0.7, step_overhead_s=0.0, all_to_all=params))
    assert c.compose(6e-3, 4e-3, 5e-3, "prefill") == pytest.approx(10e-3 + 0.2 * 5e-3)
    assert c.compose(6e-3, 4e-3, 10e-3, "prefill") == pytest.approx(10e-3 + 3e-3 + 0.2 * 7e-3)
    assert c.compose(6e-3, 4e-3, 0.0, "prefill") == pytest.approx(10e-3)
    assert c.compose(6e-3, 4e-3, 5e-3, "decode") == pytest.approx(10e-3)
    assert AllToAllParams().normal_sm_share == pytest.approx(20 / 132, abs=0.005)
    assert AllToAllParams().low_latency_sm_share == 0.0


def test_compose_without_overlap_serialises_communication() -> None:
    """With comm_overlap 0 nothing hides: step = overhead + compute + communication, and no
    compute runs beside the exchange to lose SMs."""
    c = cost(step=StepParams(comm_overlap=0.0, step_overhead_s=0.0))
    assert c.compose(6e-3, 4e-3, 1e-3, "decode") == pytest.approx(11e-3)
    assert c.compose(6e-3, 4e-3, 1e-3, "prefill") == pytest.approx(11e-3)


@pytest.mark.parametrize("verify", [1.0, 3.2, 6.0])
def test_packed_decode_step_equals_the_plain_one(verify: float) -> None:
    """The hot-path form (per-rank rows packed in one array) computes the very same step time."""
    c = cost(V41, "gb200", ep=64)
    rng = np.random.default_rng(3)
    b = rng.integers(0, 80, 64).astype(float)
    kv = b * rng.uniform(500, 40_000, 64)
    packed = c.decode_step_packed(np.vstack([b, kv, b * verify, kv * verify]), 1.09)
    assert packed == pytest.approx(c.decode_step(b, kv, verify, 1.09), rel=1e-12)
