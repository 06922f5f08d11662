"""Calibration maths: fits recover known models, derivation scales by the right resource, and a
profile composes into a StepCost over the model's layer counts.

The GPU measurements themselves are checked in the device run (calibration/README.md); here the
fitting and composition are tested on synthetic measurements drawn from known coefficients.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from deepinfer_sim.calibration.derive import derive
from deepinfer_sim.calibration.fit import (
    decode_model,
    fit_decode,
    fit_linear_latency,
    fit_moe,
    fit_prefill,
    moe_model,
    split,
)
from deepinfer_sim.calibration.profile import (
    A2aCoef,
    DecodeCoef,
    HardwareCoefs,
    MoeCoef,
    PrefillCoef,
    Profile,
    Provenance,
)
from deepinfer_sim.models.cost import PoolShape
from deepinfer_sim.models.profile_cost import ProfileStepCost
from deepinfer_sim.models.registry import load_hardware, load_model


def noisy(t: np.ndarray, rng: np.random.Generator, rel: float = 0.01) -> np.ndarray:
    return t * (1 + rng.normal(0, rel, t.shape))


def test_split_holds_out_a_fifth_deterministically():
    s = split(50, seed=3)
    assert s.heldout.size == 10 and s.train.size == 40
    assert np.intersect1d(s.train, s.heldout).size == 0
    assert np.array_equal(split(50, seed=3).heldout, s.heldout)


def test_prefill_fit_recovers_the_quadratic():
    """t = a + b n + c n p + d n² with 1 % noise: coefficients back within a few %, held-out
    MAPE near the noise level."""
    rng = np.random.default_rng(0)
    n = np.array([256, 512, 1024, 2048, 4096, 8192, 16384, 32768], dtype=float)
    p = np.array([0, 4096, 16384, 65536, 262144], dtype=float)
    X = np.array([(a, b) for a in n for b in p])
    a, b, c, d = 2e-4, 3e-8, 4e-14, 2e-13
    t = noisy(a + b * X[:, 0] + c * X[:, 0] * X[:, 1] + d * X[:, 0] ** 2, rng)
    coef, err = fit_prefill(X, t)
    assert coef.b == pytest.approx(b, rel=0.05)
    assert coef.c == pytest.approx(c, rel=0.05)
    assert err.heldout_mape < 0.02
    assert err.n_heldout == 8


def test_decode_fit_finds_the_weight_read_floor_and_the_gemm_slope():
    rng = np.random.default_rng(1)
    rows = []
    for B in (1, 4, 16, 64, 128, 256):
        for v in (1, 2, 4, 6):
            for L in (1024, 8192, 32768):
                rows.append((B, B * v, B * L))
    X = np.array(rows, dtype=float)
    truth = np.array([5e-5, 4e-5, 2e-7, 3e-11, 1e-7])
    t = noisy(decode_model(truth, X), rng)
    coef, err = fit_decode(X, t)
    assert coef.w == pytest.approx(truth[1], rel=0.15)
    assert coef.b == pytest.approx(truth[2], rel=0.1)
    assert coef.c == pytest.approx(truth[3], rel=0.15)
    assert err.heldout_mape < 0.03


def test_moe_fit():
    rng = np.random.default_rng(2)
    X = np.array([(E, R) for E in (8, 24, 48, 100) for R in (64, 512, 4096, 32768, 196608)], float)
    truth = np.array([2e-5, 3e-6, 4e-9])
    t = noisy(moe_model(truth, X), rng)
    coef, err = fit_moe(X, t)
    assert coef.e == pytest.approx(truth[1], rel=0.1)
    assert coef.f == pytest.approx(truth[2], rel=0.1)
    assert err.heldout_mape < 0.03


def test_latency_bandwidth_fit():
    nbytes = np.array([1e5, 1e6, 1e7, 1e8, 1e9])
    t = 2e-5 + nbytes / 3e11
    latency, bw = fit_linear_latency(nbytes, t)
    assert latency == pytest.approx(2e-5, rel=1e-3)
    assert bw == pytest.approx(3e11, rel=1e-3)


def make_profile() -> Profile:
    pre = PrefillCoef(a=1e-4, b=2e-8, c=3e-14, d=1e-13)
    dec = DecodeCoef(a=3e-5, w=4e-5, b=2e-7, c=2e-11, d=1e-7)
    coefs = HardwareCoefs(
        prefill={"csa": pre, "hca": pre.model_copy(update={"c": 1e-14})},
        decode={"csa": dec, "hca": dec},
        moe=MoeCoef(a=1e-5, e=4e-6, f=3e-9),
        a2a=A2aCoef(latency_s=1e-5, link_efficiency=0.8, measured=True),
        vision_seconds_per_image=0.01,
    )
    return Profile(
        name="test-measured",
        model_family="deepseek-v4.1-flash",
        provenance=Provenance(kind="measured", device="NVIDIA H200"),
        hardware={"h200": coefs},
    )


def test_profile_cost_composes_layers_of_the_model():
    """V4.1-Flash prefill runs its 5 CSA + 15 HCA encoder layers: the step is the sum of 20
    per-layer fits; decode adds the 20 decoder (CSA) layers."""
    prof = make_profile()
    model = load_model("deepseek-v4.1-flash")
    c = ProfileStepCost(model, load_hardware("h200"), PoolShape(4, 4), prof.hardware["h200"])
    n, p = 4096, 10_000
    csa, hca = prof.hardware["h200"].prefill["csa"], prof.hardware["h200"].prefill["hca"]
    per = [k.a + k.b * n + k.c * n * p + k.d * n * n for k in (csa, hca)]
    assert c.prefill_dense([(n, p)]) == pytest.approx(5 * per[0] + 15 * per[1])
    dec = prof.hardware["h200"].decode["csa"]
    B, v, K = 10.0, 2.0, 50_000.0
    one = dec.a + max(dec.w, dec.b * B * v) + dec.c * K + dec.d * B
    got = c.decode_dense(np.array([B]), np.array([K]), v)[0]
    assert got == pytest.approx(40 * one)
    m = prof.hardware["h200"].moe
    E = model.experts_per_gpu(4, 4)
    active = E * (1 - np.exp(-600 / E))  # 100 tokens × top-6 pairs over E local experts
    assert c.moe_s(100.0, "prefill") == pytest.approx(20 * (m.a + m.e * active + m.f * 600))


def test_derived_profile_scales_by_the_bounding_resource():
    """H200 -> GB200: dense GEMM time by the FP8 rate ratio, weights/KV reads by HBM bandwidth,
    expert GEMMs by H200-FP8 vs GB200-FP4, expert weight reads also by MXFP4/FP8 bytes."""
    prof = make_profile()
    d = derive(prof, "x-derived", ["gb200", "b200"])
    assert d.provenance.kind == "derived" and "derived, not measured" in str(d.provenance.method)
    h, g = load_hardware("h200"), load_hardware("gb200")
    src, dst = prof.hardware["h200"], d.hardware["gb200"]
    assert dst.prefill["csa"].b == pytest.approx(
        src.prefill["csa"].b * h.flops("fp8") / g.flops("fp8")
    )
    assert dst.decode["csa"].w == pytest.approx(
        src.decode["csa"].w * h.hbm_bytes_per_s / g.hbm_bytes_per_s
    )
    assert dst.moe.f == pytest.approx(src.moe.f * h.flops("fp8") / g.flops("fp4"))
    assert dst.moe.e == pytest.approx(
        src.moe.e * h.hbm_bytes_per_s / g.hbm_bytes_per_s * (0.5 + 1 / 32) / 1.0
    )
    assert dst.decode["csa"].a == src.decode["csa"].a  # launch overhead is not hardware-bound
    assert set(d.hardware) == {"gb200", "b200"}


def test_profile_must_cover_the_pool_hardware():
    from deepinfer_sim.errors import ConfigError

    with pytest.raises(ConfigError, match="no coefficients for hardware 'gb200'"):
        make_profile().for_hardware("gb200")


class SyntheticBench:
    """A Bench whose 'measurements' come from known per-layer models plus 1 % noise."""

    device_name = "synthetic"
    hardware = "h200"
    software: ClassVar[dict[str, str]] = {"torch": "n/a", "cuda": "n/a"}

    def __init__(self) -> None:
        from deepinfer_sim.calibration.profile import Dtypes

        self.dtypes = Dtypes()
        self.host_overhead: dict[str, list[float]] = {"decode": [2e-3]}

    def warmup(self) -> None:
        pass
        self.rng = np.random.default_rng(5)

    def _noise(self, t: float) -> float:
        return float(t * (1 + self.rng.normal(0, 0.01)))

    def prefill(self, kind: str, n: int, p: int) -> float:
        c = 3e-14 if kind == "csa" else 1e-14
        return self._noise(1e-4 + 2e-8 * n + c * n * p + 1e-13 * n * n)

    def decode(self, kind: str, batch: int, context: int, verify: int) -> float:
        x = np.array([3e-5, 4e-5, 2e-7, 2e-11, 1e-7])
        return self._noise(
            float(decode_model(x, np.array([[batch, batch * verify, batch * context]]))[0])
        )

    def moe(self, local_experts: int, tokens: int) -> float:
        return self._noise(
            float(
                moe_model(np.array([1e-5, 4e-6, 3e-9]), np.array([[local_experts, tokens * 6]]))[0]
            )
        )

    def a2a_table(self) -> list[tuple[float, float]]:
        return [(float(b), 1e-5 + b / 4e11) for b in (1 << 16, 1 << 20, 1 << 24, 1 << 26)]

    def copy_bandwidth(self) -> float:
        return 4.3e12

    def vision(self) -> float | None:
        return 0.02

    def engine_steps(self) -> list[tuple[str, int, int, int, float]]:
        return []


def test_sweep_builds_a_profile_that_meets_the_fit_target(tmp_path):
    """The whole pipeline — measure over the quick grid, fit, assemble, write, reload — yields a
    profile whose held-out errors are near the injected noise and that loads as a StepCost."""
    import yaml

    from deepinfer_sim.calibration.profile import load_profile
    from deepinfer_sim.calibration.sweep import Grid, build_profile, measure

    bench = SyntheticBench()
    m = measure(bench, Grid.quick(), log=lambda s: None)
    prof = build_profile(bench, m, "synthetic-measured", "deepseek-v4.1-flash", "test", top_k=6)
    assert all(f.heldout_mape < 0.05 for f in prof.fit.values()), prof.fit
    assert prof.hardware["h200"].a2a.measured
    assert prof.hardware["h200"].a2a.link_efficiency == pytest.approx(4e11 / 450e9, rel=1e-3)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof.model_dump(mode="json"), sort_keys=False))
    again = load_profile(str(path))
    assert again == prof
