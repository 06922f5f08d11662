"""Random draws whose values are the same bits on every machine (deepinfer_sim.rng).

numpy computes some draws' values with the C library (the ziggurat tails, gamma, beta,
Dirichlet, Weibull), whose FMA and non-FMA code paths round differently; these draws finish
those values with deepinfer_sim.fpmath instead. Each must still be the distribution it names.
Moments are checked on fixed seeds (deterministic), with tolerances of about four standard
errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from deepinfer_sim import rng as draws

NORMAL_TAIL = 3.6541528853610087963519472518
EXPONENTIAL_TAIL = 7.69711747013104971368


def tail_mass(r: float) -> float:
    """P(|Z| >= r) for a standard normal."""
    return math.erfc(r / math.sqrt(2.0))


def test_normal_keeps_numpys_draws_and_redraws_only_the_tail() -> None:
    """Away from the tail the draws are numpy's own, bit for bit; tail values are redrawn from
    the same tail (|Z| given |Z| >= r), so the distribution is exact."""
    ours = draws.normal(np.random.default_rng(7), 400_000)
    numpys = np.random.default_rng(7).standard_normal(400_000)
    body = np.abs(numpys) < NORMAL_TAIL
    assert np.array_equal(ours[body], numpys[body])
    tail = ~body
    assert tail.sum() > 50  # the tail was exercised
    assert (np.abs(ours[tail]) >= NORMAL_TAIL).all()
    assert np.array_equal(np.sign(ours[tail]), np.sign(numpys[tail]))


def test_normal_tail_has_the_tail_distribution() -> None:
    z = draws.normal(np.random.default_rng(8), 4_000_000)
    assert z.mean() == pytest.approx(0.0, abs=4 / math.sqrt(4e6))
    assert z.var() == pytest.approx(1.0, abs=4 * math.sqrt(2 / 4e6))
    r = NORMAL_TAIL
    tail = np.abs(z[np.abs(z) >= r])
    assert tail.size / z.size == pytest.approx(tail_mass(r), rel=0.1)
    # E[|Z| | |Z| >= r] = φ(r) / Q(r)
    phi = math.exp(-r * r / 2) / math.sqrt(2 * math.pi)
    assert tail.mean() == pytest.approx(phi / (tail_mass(r) / 2), rel=0.01)
    assert (np.abs(z) >= 4.5).mean() == pytest.approx(tail_mass(4.5), rel=0.5)


def test_one_normal_at_a_time_is_the_same_distribution() -> None:
    rng = np.random.default_rng(9)
    z = np.array([draws.standard_normal(rng) for _ in range(200_000)])
    assert z.var() == pytest.approx(1.0, abs=0.015)
    assert (np.abs(z) >= NORMAL_TAIL).mean() == pytest.approx(tail_mass(NORMAL_TAIL), rel=0.3)


def test_exponential_keeps_numpys_body_and_redraws_the_tail() -> None:
    ours = draws.exponential(np.random.default_rng(10), 2.0, 2_000_000)
    numpys = np.random.default_rng(10).standard_exponential(2_000_000) * 2.0
    body = numpys < 2.0 * EXPONENTIAL_TAIL
    assert np.array_equal(ours[body], numpys[body])
    assert ours.mean() == pytest.approx(2.0, rel=0.005)
    assert (ours > 2.0 * 9.0).mean() == pytest.approx(math.exp(-9.0), rel=0.2)


@pytest.mark.parametrize("shape", [0.05, 0.3, 1.0, 3.0, 40.0])
def test_gamma_has_mean_and_variance_shape(shape: float) -> None:
    x = draws.gamma(np.random.default_rng(11), shape, 2.0, 200_000)
    assert x.mean() == pytest.approx(2.0 * shape, rel=4 / math.sqrt(2e5 * shape))
    assert x.var() == pytest.approx(4.0 * shape, rel=0.05 if shape >= 0.3 else 0.2)
    assert (x >= 0).all()


@pytest.mark.parametrize(("a", "b"), [(16.0, 4.0), (2.0, 5.0), (0.3, 0.5)])
def test_beta_has_its_mean_and_variance(a: float, b: float) -> None:
    rng = np.random.default_rng(12)
    x = np.array([draws.beta(rng, a, b) for _ in range(40_000)])
    mean = a / (a + b)
    var = a * b / ((a + b) ** 2 * (a + b + 1))
    assert x.mean() == pytest.approx(mean, abs=4 * math.sqrt(var / 4e4))
    assert x.var() == pytest.approx(var, rel=0.05)
    assert ((x >= 0) & (x <= 1)).all()


def test_log_dirichlet_rows_are_dirichlet_even_for_tiny_concentrations() -> None:
    """exp(rows) sum to 1 with mean 1/k and the Dirichlet's variance; a concentration of 1e-3
    (most components far below the smallest float) still gives finite logs and no empty row."""
    k, alpha = 8, 0.4
    logs = draws.log_dirichlet(np.random.default_rng(13), np.full(k, alpha), 40_000)
    p = np.exp(logs)
    assert np.allclose(p.sum(axis=1), 1.0)
    assert p.mean(axis=0) == pytest.approx(np.full(k, 1 / k), abs=0.005)
    assert p[:, 0].var() == pytest.approx((1 / k) * (1 - 1 / k) / (k * alpha + 1), rel=0.05)
    tiny = draws.log_dirichlet(np.random.default_rng(14), np.full(256, 1e-3), 10)
    assert np.isfinite(tiny).all() and np.allclose(np.exp(tiny).sum(axis=1), 1.0)
    mixed = draws.log_dirichlet(np.random.default_rng(15), np.array([0.5, 2.0, 2.0]), 40_000)
    assert np.exp(mixed).mean(axis=0) == pytest.approx([1 / 9, 4 / 9, 4 / 9], abs=0.005)


def test_weibull_has_its_mean() -> None:
    x = draws.weibull(np.random.default_rng(16), 1.5, 200_000)
    assert x.mean() == pytest.approx(math.gamma(1 + 1 / 1.5), rel=0.01)
