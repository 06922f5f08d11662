"""The shipped calibration profiles, and the simulator re-checked against the GPU replay.

``calibration/validation/`` keeps what the engine core measured on the H200 (per-request TTFT
in a prefill-only replay, TPOT in a decode-only replay). Re-simulating those request lists with
the shipped ``h200-measured`` profile must reproduce the recorded comparison: this is the CPU
check that the simulator still predicts the real engine as documented in calibration/README.md.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest

from deepinfer_sim.calibration.derive import derive
from deepinfer_sim.calibration.profile import available_profiles, load_profile
from deepinfer_sim.calibration.validate import (
    ReplayShape,
    errors,
    simulate_decode,
    simulate_prefill,
)

VALIDATION = Path(str(resources.files("deepinfer_sim.calibration"))) / "validation"


def test_three_profiles_ship_and_cover_their_hardware():
    assert {"h200-measured", "sm100-derived", "ascend950-derived"} <= set(available_profiles())
    assert set(load_profile("h200-measured").hardware) == {"h200"}
    assert set(load_profile("sm100-derived").hardware) == {"b200", "gb200"}
    assert set(load_profile("ascend950-derived").hardware) == {"ascend950dt", "ascend950pr"}
    for name in ("sm100-derived", "ascend950-derived"):
        prov = load_profile(name).provenance
        assert prov.kind == "derived" and "derived, not measured" in str(prov.method)
        assert prov.derived_from == "h200-measured"


def test_measured_profile_meets_the_fit_target():
    """Held-out MAPE of every fitted component is at most 5 % (the calibration target)."""
    prof = load_profile("h200-measured")
    assert prof.provenance.kind == "measured" and prof.provenance.device == "NVIDIA H200"
    assert set(prof.fit) >= {"prefill.csa", "prefill.hca", "decode.csa", "decode.hca", "moe"}
    for key, fit in prof.fit.items():
        assert fit.heldout_mape <= 0.05, (key, fit)
    assert prof.raw["prefill"] and prof.raw["decode"] and prof.raw["moe"]


def test_shipped_derived_profiles_are_reproducible():
    """Re-deriving from the shipped measurement gives the shipped derived coefficients."""
    measured = load_profile("h200-measured")
    for name, targets in (
        ("sm100-derived", ["b200", "gb200"]),
        ("ascend950-derived", ["ascend950dt", "ascend950pr"]),
    ):
        shipped = load_profile(name)
        again = derive(measured, name, targets)
        assert again.hardware == shipped.hardware


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_simulator_reproduces_the_recorded_replay_comparison(phase):
    report = json.loads((VALIDATION / "replay_report.json").read_text())
    frame = pd.read_csv(VALIDATION / f"replay_{phase}.csv")
    shape = ReplayShape(**report["shape"])
    sim = simulate_prefill if phase == "prefill" else simulate_decode
    got = errors(frame["measured_s"].to_numpy(), sim(frame, load_profile("h200-measured"), shape))
    want = report[phase]
    for key in ("abs_rel_err_p50", "abs_rel_err_p90", "p50_rel_err", "simulated_p50_s"):
        assert got[key] == pytest.approx(want[key], rel=1e-6), key
    # the documented accuracy: the median of the simulated distribution within ~10 %
    assert abs(got["p50_rel_err"]) < 0.11
