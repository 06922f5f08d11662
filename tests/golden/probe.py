"""What one process computes, as digests: the stock numeric stack's own functions (numpy's SIMD
transcendentals, glibc's libm, BLAS), this project's portable ones (fpmath, rng, the compiled
steps' helpers in jit) and the golden hashes of the given cases.
tests/integration/test_portability.py runs it under several CPU configurations and compares.
``python tests/golden/probe.py [CASE ...]`` prints one JSON object.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from deepinfer_sim import fpmath, jit
from deepinfer_sim import rng as draws


def digest(values: Any) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, dtype=np.float64).tobytes()).hexdigest()


def inputs() -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(20261203)  # built exactly (np.exp itself differs per CPU)
    wide = np.ldexp(g.uniform(0.5, 1.0, 200_000), g.integers(-900, 900, 200_000))
    return g.uniform(-30.0, 30.0, 200_000), wide


def stack() -> dict[str, str]:
    """The stock functions: these may differ between CPU configurations."""
    x, y = inputs()
    a = np.random.default_rng(1).random((64, 64))
    return {
        "numpy exp": digest(np.exp(x)),
        "numpy log": digest(np.log(y)),
        "numpy power": digest(np.power(y, 0.37)),
        "libm exp": digest([math.exp(v) for v in x[:50_000].tolist()]),
        "libm log": digest([math.log(v) for v in y[:50_000].tolist()]),
        "blas matmul": digest(a @ a @ a),
        "numpy gamma(0.3)": digest(np.random.default_rng(2).gamma(0.3, 1.0, 100_000)),
    }


def ours() -> dict[str, str]:
    """This project's functions: these must not differ."""
    x, y = inputs()
    a = np.random.default_rng(1).random((64, 64))
    g = np.random.default_rng(3)
    return {
        "fpmath exp": digest(fpmath.exp(x)),
        "fpmath log": digest(fpmath.log(y)),
        "fpmath power": digest(fpmath.power(y, 0.37)),
        "fpmath cos": digest(fpmath.cos(x)),
        "fpmath exp scalar": digest([fpmath.exp(v) for v in x[:20_000].tolist()]),
        "fpmath matmul": digest(fpmath.matmul(fpmath.matmul(a, a), a)),
        "rng normal": digest(draws.normal(g, 1_000_000)),
        "rng exponential": digest(draws.exponential(g, 1.0, 1_000_000)),
        "rng gamma(0.3)": digest(draws.gamma(g, 0.3, 1.0, 100_000)),
        "rng beta": digest([draws.beta(g, 0.4, 2.0) for _ in range(5_000)]),
        "rng dirichlet": digest(draws.log_dirichlet(g, np.full(64, 0.2), 200)),
        "rng weibull": digest(draws.weibull(g, 1.5, 100_000)),
        "jit exp": digest([jit.exp(v) for v in x[:20_000].tolist()]),
        "jit pairwise sum": digest(
            [jit.pairwise_sum(x[: 97 * n], jit.sum_block()) for n in range(1, 200)]
        ),
    }


def golden(names: list[str]) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location(
        "golden_cases", Path(__file__).with_name("cases.py")
    )
    assert spec and spec.loader
    cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases)
    out = {}
    for name in names:
        got = cases.run_case(name)
        out[name] = {k: got[k] for k in ("requests_sha256", "timeseries_sha256")}
    return out


if __name__ == "__main__":
    print(json.dumps({"stack": stack(), "ours": ours(), "golden": golden(sys.argv[1:])}))
