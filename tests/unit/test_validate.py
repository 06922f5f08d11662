"""The simulator side of the engine-core validation: the same request lists replayed through a
one-rank prefill instance and decode group reproduce hand-computable timings."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from deepinfer_sim.calibration.validate import (
    ReplayShape,
    errors,
    simulate_decode,
    simulate_prefill,
)
from deepinfer_sim.models.profile import (
    A2aCoef,
    DecodeCoef,
    HardwareCoefs,
    MoeCoef,
    PrefillCoef,
    Profile,
    Provenance,
)


def flat_profile() -> Profile:
    """Prefill costs 1 µs per token per layer; decode 1 ms per layer per step; no experts."""
    pre = PrefillCoef(a=0.0, b=1e-6, c=0.0, d=0.0)
    dec = DecodeCoef(a=1e-3, w=0.0, b=0.0, c=0.0, d=0.0)
    return Profile.model_validate(
        dict(
            name="flat",
            model_family="deepseek-v4.1-flash",
            provenance=Provenance(kind="measured"),
            hardware={
                "h200": HardwareCoefs(
                    prefill={"csa": pre, "hca": pre},
                    decode={"csa": dec, "hca": dec},
                    moe=MoeCoef(a=0.0, e=0.0, f=0.0),
                    a2a=A2aCoef(latency_s=0.0, link_efficiency=1.0, measured=False),
                )
            },
        )
    )


def test_prefill_replay_ttft_is_queueing_plus_service():
    """The mini model prefills through 2 layers: 1,000 tokens take 2 ms. Two prompts arriving
    together run in one step (budget permitting): both finish at 4 ms."""
    frame = pd.DataFrame(
        {"arrival_s": [0.0, 0.0, 1.0], "prompt_len": [1000, 1000, 500], "output_len": [2, 2, 2]}
    )
    ttft = simulate_prefill(frame, flat_profile(), ReplayShape())
    assert ttft == pytest.approx([4e-3, 4e-3, 1e-3])


def test_decode_replay_tpot_counts_admission_waits():
    """3 layers × 1 ms per step. With a batch limit of 1 the second request waits for the first."""
    frame = pd.DataFrame(
        {"arrival_s": [0.0, 0.0], "prompt_len": [100, 100], "output_len": [11, 11]}
    )
    tpot = simulate_decode(frame, flat_profile(), ReplayShape(max_decode_batch=1))
    assert tpot[0] == pytest.approx(3e-3)
    assert tpot[1] == pytest.approx(6e-3)


def test_errors_summary():
    e = errors(np.array([1.0, 2.0, 4.0]), np.array([1.1, 2.0, 3.0]))
    assert e["abs_rel_err_p50"] == pytest.approx(0.1)
    assert e["requests"] == 3
