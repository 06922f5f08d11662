"""The simulated clock is a Python float, whatever numbers the stages compute their delays from
(an ``np.float64`` clock makes every time sum and event-heap comparison numpy scalar work)."""

from __future__ import annotations

import numpy as np

from deepinfer_sim import load_scenario, simulate
from deepinfer_sim.sim.core.cluster import Cluster, CountingEnvironment


def test_a_numpy_delay_leaves_the_clock_a_float() -> None:
    env = CountingEnvironment()
    env.timeout(np.float64(1.5))
    env.timeout(np.float64(0.25))
    env.run()
    assert type(env.now) is float
    assert env.now == 1.5
    assert env.events == 2


def test_a_run_ends_on_a_float_clock() -> None:
    """A run's stages hand SimPy delays taken from numpy arrays (arrivals, step costs, reads)."""
    clusters: list[Cluster] = []
    sc = load_scenario("default", ["workload.max_requests=200"])
    simulate(sc, on_build=clusters.append)
    assert clusters[0].env.events > 200
    assert type(clusters[0].env.now) is float
