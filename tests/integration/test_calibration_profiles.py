"""The shipped calibration profiles, and the simulator re-checked against the GPU replay.

``calibration/validation/`` keeps what the engine core measured on the H200 (per-request TTFT
in a prefill-only replay, TPOT in a decode-only replay). Re-simulating those request lists with
the shipped ``h200-reference`` profile (measured with the reference kernels, formerly
``h200-measured``) must reproduce the recorded comparison: this is the CPU
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


FLASH = "deepseek-v4.1-flash"


def test_three_profiles_ship_and_cover_their_hardware():
    assert {"h200-reference", "sm100-derived", "ascend950-derived"} <= set(available_profiles())
    assert "h200-measured" not in available_profiles()  # renamed h200-reference
    covers = {
        "h200-reference": {"h200"},
        "sm100-derived": {"b200", "gb200"},
        "ascend950-derived": {"ascend950dt", "ascend950pr"},
    }
    for name, hardware in covers.items():
        prof = load_profile(name)
        assert prof.name == name and list(prof.models) == [FLASH]
        assert prof.hardware_names() == sorted(hardware)
        assert prof.provenance.kernels == "reference"
    for name in ("sm100-derived", "ascend950-derived"):
        prov = load_profile(name).provenance
        assert prov.kind == "derived" and "derived, not measured" in str(prov.method)
        assert prov.derived_from == "h200-reference"


def test_measured_profile_meets_its_fit_target():
    """h200-reference predates off-grid validation: its held-out MAPE (a random fifth of the
    grid) is at most 5 % for every fitted component, and its raw data is kept."""
    prof = load_profile("h200-reference")
    assert prof.provenance.kind == "measured" and prof.provenance.device == "NVIDIA H200"
    fits = prof.models[FLASH]
    assert set(fits.fit) >= {"prefill.csa", "prefill.hca", "decode.csa", "decode.hca", "moe"}
    for key, fit in fits.fit.items():
        assert fit.heldout_mape is not None and fit.heldout_mape <= 0.05, (key, fit)
    assert fits.raw["prefill"] and fits.raw["decode"] and fits.raw["moe"]


def test_shipped_derived_profiles_are_reproducible():
    """Re-deriving from the shipped measurement gives the shipped derived coefficients."""
    measured = load_profile("h200-reference")
    for name, targets in (
        ("sm100-derived", ["b200", "gb200"]),
        ("ascend950-derived", ["ascend950dt", "ascend950pr"]),
    ):
        shipped = load_profile(name)
        again = derive(measured, name, targets)
        assert again.models == shipped.models


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_simulator_reproduces_the_recorded_replay_comparison(phase):
    report = json.loads((VALIDATION / "replay_report.json").read_text())
    frame = pd.read_csv(VALIDATION / f"replay_{phase}.csv")
    shape = ReplayShape(**report["shape"])
    sim = simulate_prefill if phase == "prefill" else simulate_decode
    got = errors(frame["measured_s"].to_numpy(), sim(frame, load_profile("h200-reference"), shape))
    want = report[phase]
    for key in ("abs_rel_err_p50", "abs_rel_err_p90", "p50_rel_err", "simulated_p50_s"):
        assert got[key] == pytest.approx(want[key], rel=1e-6), key
    # the documented accuracy: the median of the simulated distribution within ~10 %
    assert abs(got["p50_rel_err"]) < 0.11
