"""The portable floating-point functions: accurate to about one unit in the last place, the same
bits from the scalar and the array path, and the special values a libm gives.

Their point — the same bits on every machine — is checked across CPU configurations in
tests/integration/test_portability.py; here is what a caller may rely on anywhere.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import nnls

from deepinfer_sim import fpmath


def ulps(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want) / np.spacing(np.abs(want))))


def test_exp_and_log_are_within_one_ulp_of_the_c_library() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(-700.0, 700.0, 200_000)
    assert ulps(fpmath.exp(x), np.exp(x)) <= 1.0
    y = np.exp(rng.uniform(-700.0, 700.0, 200_000))
    assert ulps(fpmath.log(y), np.log(y)) <= 1.0
    near_one = rng.uniform(0.5, 2.0, 100_000)
    assert np.max(np.abs(fpmath.log(near_one) - np.log(near_one))) <= 2.3e-16


def test_power_and_cos_are_accurate_enough_for_rates_and_shares() -> None:
    """power is exp(y·log x), so its error grows with |y·log x| (about that many ulp): a few
    ulp at the exponents the simulator uses (Zipf skews, 1/k of a smooth sum); cos is within an
    ulp of 1 on ±2π."""
    rng = np.random.default_rng(1)
    x = rng.uniform(1e-3, 400.0, 50_000)
    for y in (-1.1, 0.5, 3.0):
        assert ulps(fpmath.power(x, y), x**y) <= 2.0 + 2.0 * abs(y) * math.log(400.0)
    t = rng.uniform(-7.0, 7.0, 50_000)
    assert np.max(np.abs(fpmath.cos(t) - np.cos(t))) <= 2.3e-16


def test_the_scalar_and_the_array_path_give_the_same_bits() -> None:
    rng = np.random.default_rng(2)
    xs = rng.uniform(-40.0, 40.0, 5_000)
    assert [fpmath.exp(float(v)) for v in xs] == fpmath.exp(xs).tolist()
    ys = np.exp(rng.uniform(-700.0, 700.0, 5_000))
    assert [fpmath.log(float(v)) for v in ys] == fpmath.log(ys).tolist()
    assert [fpmath.power(float(v), 0.37) for v in ys[:500]] == fpmath.power(ys[:500], 0.37).tolist()
    assert [fpmath.cos(float(v)) for v in xs[:500]] == fpmath.cos(xs[:500]).tolist()


def test_special_values_are_those_of_a_libm() -> None:
    inf, nan = math.inf, math.nan
    assert fpmath.exp(inf) == inf and fpmath.exp(-inf) == 0.0 and math.isnan(fpmath.exp(nan))
    assert fpmath.exp(709.8) == inf and fpmath.exp(-746.0) == 0.0 and fpmath.exp(0.0) == 1.0
    assert fpmath.log(0.0) == -inf and fpmath.log(inf) == inf and math.isnan(fpmath.log(-1.0))
    assert fpmath.log(1.0) == 0.0 and fpmath.log(5e-324) == pytest.approx(-744.44007192138126)
    with np.errstate(all="raise"):  # no warnings from the array path either
        e = fpmath.exp(np.array([inf, -inf, nan, 709.8, -746.0]))
        lg = fpmath.log(np.array([0.0, -1.0, inf, nan, 5e-324]))
    assert e[0] == inf and e[1] == 0.0 and np.isnan(e[2]) and e[3] == inf and e[4] == 0.0
    assert lg[0] == -inf and np.isnan(lg[1]) and lg[2] == inf and np.isnan(lg[3])
    assert fpmath.power(0.0, 2.0) == 0.0 and fpmath.power(0.0, 0.0) == 1.0
    assert fpmath.power(0.0, -1.0) == inf
    with pytest.raises(ValueError, match="< 0"):
        fpmath.power(-1.0, 0.5)
    with pytest.raises(ValueError, match="beyond"):
        fpmath.cos(1e6)


def test_ipow_multiplies_out_whole_powers() -> None:
    assert fpmath.ipow(0.9, 0) == 1.0
    assert fpmath.ipow(0.9, 3) == 0.9 * 0.9 * 0.9
    assert fpmath.ipow(2.0, 10) == 1024.0


def test_matmul_without_blas_agrees_with_a_matrix_product() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.random((3, 4)), rng.random((4, 64))
    assert np.allclose(fpmath.matmul(a, b), a @ b, rtol=1e-15, atol=0)


def test_nonnegative_least_squares_finds_the_constrained_optimum() -> None:
    """Against scipy's NNLS on random problems, with and without active bounds."""
    rng = np.random.default_rng(4)
    for _ in range(100):
        a = rng.random((40, 4))
        b = rng.random(40) * 2.0 - 0.3
        want, _ = nnls(a, b)
        got = fpmath.nonnegative_least_squares(a.tolist(), b.tolist())
        assert np.allclose(got, want, atol=1e-9)
    exact = fpmath.nonnegative_least_squares([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [1, 2, 3])
    assert exact == pytest.approx([1.0, 2.0])
