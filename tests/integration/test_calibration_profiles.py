"""The shipped calibration profiles, and the simulator re-checked against the GPU replays.

``calibration/validation/<profile>/`` keeps what the engine core measured on the H200 (per-request
TTFT in prefill-only replays, TPOT in decode-only replays). Re-simulating those request lists with
the shipped profile must reproduce the recorded comparison: this is the CPU check that the
simulator still predicts the real engine as documented in calibration/README.md.

* ``h200-deepseek``: DeepSeek's kernels (FlashMLA, fused FP8 projections), decode replayed as
  CUDA graphs; two traces (Mooncake conversation, Azure conv), three repeats each.
* ``h200-reference``: the reference kernels, eager; one trace, one run (kept for comparison).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest

from deepinfer_sim.calibration.conditioning import conditioning, spread
from deepinfer_sim.calibration.derive import derive
from deepinfer_sim.calibration.replay import recheck
from deepinfer_sim.calibration.step_residuals import residuals
from deepinfer_sim.calibration.validate import (
    ReplayShape,
    errors,
    simulate_decode,
    simulate_prefill,
)
from deepinfer_sim.errors import ConfigError
from deepinfer_sim.models.profile import available_profiles, load_profile
from deepinfer_sim.models.registry import load_model

VALIDATION = Path(str(resources.files("deepinfer_sim.calibration"))) / "validation"
FLASH = "deepseek-v4.1-flash"
MEASURED_MODELS = {"deepseek-v4.1-flash", "deepseek-v3", "deepseek-v4-flash", "deepseek-v4-pro"}
# one GPU's slice under tensor parallelism (calls 30-31) and the routed experts narrowed under
# expert tensor parallelism (call 32), for V3 and V4.1-Flash
SLICES = {
    f"{model}@{width}"
    for model in ("deepseek-v3", "deepseek-v4.1-flash")
    for width in ("tp2", "tp4", "tp8", "tp1-moetp2", "tp1-moetp4", "tp1-moetp8")
}
# the shipped h200-deepseek of calls 5 and 6, which the replays of calls 4, 6 and 8 ran against
CALLS_5_6 = str(VALIDATION / "h200-deepseek" / "shipped-calls5-6.yaml")


def rechecked(profile, folder: Path, report: dict) -> dict:
    """``recheck`` of a stored replay, asserting that every recorded repeat's errors come back."""
    got = recheck(profile, folder, report)
    for trace, phases in report["traces"].items():
        for phase, stored in phases.items():
            for g, w in zip(got[trace][phase]["runs"], stored["runs"], strict=True):
                for key in ("abs_rel_err_p90", "p50_rel_err"):
                    assert g[key] == pytest.approx(w[key], rel=1e-6), (trace, phase, key)
    return got


def test_profiles_ship_and_cover_their_hardware_and_models():
    names = {"h200-deepseek", "h200-reference", "sm100-derived", "ascend950-derived"}
    assert names <= set(available_profiles())
    assert "h200-measured" not in available_profiles()  # renamed h200-reference
    covers = {
        "h200-deepseek": {"h200"},
        "h200-reference": {"h200"},
        "sm100-derived": {"b200", "gb200", "b300", "gb300"},
        "ascend950-derived": {"ascend950dt", "ascend950pr"},
    }
    for name, hardware in covers.items():
        prof = load_profile(name)
        assert prof.name == name and prof.hardware_names() == sorted(hardware)
    assert set(load_profile("h200-deepseek").models) == MEASURED_MODELS | SLICES
    assert list(load_profile("h200-reference").models) == [FLASH]
    assert load_profile("h200-deepseek").provenance.kernels == "deepseek"
    assert load_profile("h200-reference").provenance.kernels == "reference"
    for name in ("sm100-derived", "ascend950-derived"):
        prof = load_profile(name)
        assert prof.provenance.kind == "derived"
        assert "derived, not measured" in str(prof.provenance.method)
        assert prof.provenance.derived_from == "h200-deepseek"
        assert set(prof.models) == MEASURED_MODELS | SLICES


def test_a_profile_refuses_a_model_it_has_no_fits_for():
    """The reference profile was measured for V4.1-Flash only: V3 gets one clear message."""
    with pytest.raises(ConfigError, match=r"no fits for model 'deepseek-v3'.*calibrate"):
        load_profile("h200-reference").coefs(load_model("deepseek-v3"), "h200")
    # and the 3-layer engine stack at V4.1-Flash widths uses the V4.1-Flash fits
    mini = load_model("deepseek-v4.1-flash-mini")
    assert (
        load_profile("h200-deepseek").for_model(mini) is load_profile("h200-deepseek").models[FLASH]
    )


def test_deepseek_fits_are_judged_off_the_grid():
    """Every fit of the DeepSeek-kernel profile carries its error on off-grid shapes (between and
    beyond the grid points), the number calibration/README.md reports. V4.1-Flash's prefill and
    decode fits and V3's decode fits (device call 26) meet the 3 % target; the routed-expert fits
    (call 29) do not — the whole call 3.9–4.6 %, the experts alone 6.8–9.3 % — nor does V3's
    whole routed call since call 35 carried it to the Triton combine (7.8 %, on three off-grid
    shapes: the other three were not re-timed; docs/validation.md); each is bounded here by what
    was measured, and V3's prefill: 5.5 % once call 35 carried it to cuDNN's split attention,
    3.7 % since its fit counts the prefix attention's query tiles in whole waves and call 47
    merged the two attention calls in one kernel."""
    prof = load_profile("h200-deepseek")
    fits = prof.models[FLASH]
    assert set(fits.fit) == {
        "prefill.csa", "prefill.hca", "decode.csa", "decode.hca", "moe", "moe_experts"
    }  # fmt: skip
    bounds = {"moe": 0.047, "moe_experts": 0.094}
    v3_call35 = {"prefill.mla": 0.038, "moe": 0.079}
    for model in (FLASH, "deepseek-v3"):
        for key, fit in prof.models[model].fit.items():
            bound = v3_call35.get(key) if model == "deepseek-v3" else None
            least = 3 if bound and key == "moe" else 6
            assert fit.n_offgrid >= least and fit.offgrid_mape is not None, (model, key)
            assert fit.offgrid_mape <= (bound or bounds.get(key, 0.03)), (model, key, fit)
    # the decode fits found the GEMMs' 128-row staircase (one grid point per tile count)
    for kind, coef in prof.models[FLASH].hardware["h200"].decode.items():
        assert coef.tile == 128 and len(coef.steps) == 12, kind
    for model in MEASURED_MODELS:
        assert prof.models[model].raw["prefill"] and prof.models[model].raw["decode"]


def test_the_tensor_parallel_slices_attention_fits_are_within_five_percent_off_the_grid():
    """Issue 30's bar for the TP-sliced fits: every prefill and decode fit of V3's and
    V4.1-Flash's TP2/4/8 slices is within 5 % on its off-grid shapes. V3's prefill slices
    (5.0 / 5.1 / 6.5 % once call 35 carried them to cuDNN's split attention) meet it since their
    fits count the prefix attention's query tiles in whole waves of the 132 SMs (16 heads at TP8
    run 8.25 tiles of 128 rows at once) and call 47 merged the two attention calls in one kernel
    (4.2 / 3.9 / 3.9 %)."""
    prof = load_profile("h200-deepseek")
    for model in ("deepseek-v3", FLASH):
        for tp in (2, 4, 8):
            fits = prof.models[f"{model}@tp{tp}"]
            keys = [k for k in fits.fit if k.startswith(("prefill.", "decode."))]
            assert len(keys) >= 2
            for key in keys:
                err = fits.fit[key]
                assert err.n_offgrid >= 6 and err.offgrid_mape is not None, (model, tp, key)
                assert err.offgrid_mape <= 0.05, (model, tp, key, err.offgrid_mape)
        v3 = prof.models[f"deepseek-v3@tp{tp}"].hardware["h200"].prefill["mla"]
        assert (v3.wave_tile, v3.wave_tiles) == (128, 132 / (128 // tp))


def test_reference_profile_keeps_its_held_out_error():
    """h200-reference predates off-grid validation: its held-out MAPE (a random fifth of the
    grid) is at most 5 % for every fitted component, and its raw data is kept."""
    prof = load_profile("h200-reference")
    assert prof.provenance.kind == "measured" and prof.provenance.device == "NVIDIA H200"
    fits = prof.models[FLASH]
    for key, fit in fits.fit.items():
        assert fit.heldout_mape is not None and fit.heldout_mape <= 0.05, (key, fit)
    assert fits.raw["prefill"] and fits.raw["decode"] and fits.raw["moe"]


def test_shipped_derived_profiles_are_reproducible():
    """Re-deriving from the shipped measurement gives the shipped derived coefficients."""
    measured = load_profile("h200-deepseek")
    for name, targets in (
        ("sm100-derived", ["b200", "gb200", "b300", "gb300"]),
        ("ascend950-derived", ["ascend950dt", "ascend950pr"]),
    ):
        assert derive(measured, name, targets).models == load_profile(name).models


@pytest.mark.parametrize("folder", ["h200-deepseek", "h200-deepseek/call4"])
def test_simulator_reproduces_the_recorded_deepseek_replays(folder):
    """Every repeat of both traces, both phases, re-simulated with the profile shipped from calls
    5 and 6 (kept beside the data) gives the
    recorded errors; the medians over repeats are the documented accuracy. ``h200-deepseek``:
    replays on the machine whose engine steps the profile was fitted to; ``call4``: an earlier
    H200 machine. The bounds are the measured errors (calibration/README.md), not the targets
    (5 % at p50, 15 % at p90), which most of them miss: the engine's eager prefill is host-bound,
    and host speed differed by up to 1.6× between the two machines."""
    path = VALIDATION / folder
    report = json.loads((path / "replay_report.json").read_text())
    assert report["profile"] == "h200-deepseek" and report["repeats"] == 3
    got = recheck(load_profile(CALLS_5_6), path, report)
    for trace, phases in report["traces"].items():
        for phase, want in phases.items():
            for g, w in zip(got[trace][phase]["runs"], want["runs"], strict=True):
                for key in ("abs_rel_err_p50", "abs_rel_err_p90", "p50_rel_err"):
                    assert g[key] == pytest.approx(w[key], rel=1e-6), (trace, phase, key)
    med = {(t, p): v["median"] for t, ph in got.items() for p, v in ph.items()}
    for phase in ("prefill", "decode"):  # Mooncake: GPU-bound prompts
        assert abs(med[("mooncake_conversation", phase)]["p50_rel_err"]) <= 0.10
    assert abs(med[("azure_conv", "decode")]["p50_rel_err"]) <= 0.06
    assert med[("mooncake_conversation", "decode")]["abs_rel_err_p90"] <= 0.16


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_simulator_reproduces_the_recorded_reference_replay(phase):
    folder = VALIDATION / "h200-reference"
    report = json.loads((folder / "replay_report.json").read_text())
    frame = pd.read_csv(folder / f"replay_{phase}.csv")
    shape = ReplayShape(**report["shape"])
    sim = simulate_prefill if phase == "prefill" else simulate_decode
    got = errors(frame["measured_s"].to_numpy(), sim(frame, load_profile("h200-reference"), shape))
    want = report[phase]
    for key in ("abs_rel_err_p50", "abs_rel_err_p90", "p50_rel_err", "simulated_p50_s"):
        assert got[key] == pytest.approx(want[key], rel=1e-6), key
    assert abs(got["p50_rel_err"]) < 0.11


def test_call8_replays_reproduce_with_their_profile_and_bound_the_shipped_one():
    """Call 8 replayed with a profile timed at mixed decode context lengths (kept beside the
    data, not shipped): re-simulated with it, every recorded error comes back; the errors of the
    profile then shipped (calls 5 and 6) on the same replays are the ones calibration/README.md
    states."""
    path = VALIDATION / "h200-deepseek" / "call8"
    report = json.loads((path / "replay_report.json").read_text())
    got = recheck(load_profile(str(path / "v41-spread.yaml")), path, report)
    for trace, phases in report["traces"].items():
        for phase, want in phases.items():
            for g, w in zip(got[trace][phase]["runs"], want["runs"], strict=True):
                assert g["p50_rel_err"] == pytest.approx(w["p50_rel_err"], rel=1e-6)
    shipped = recheck(load_profile(CALLS_5_6), path, report)
    med = {(t, p): v["median"] for t, ph in shipped.items() for p, v in ph.items()}
    assert abs(med[("mooncake_conversation", "prefill")]["p50_rel_err"]) <= 0.01
    assert med[("mooncake_conversation", "prefill")]["abs_rel_err_p90"] <= 0.15
    assert abs(med[("azure_conv", "decode")]["p50_rel_err"]) <= 0.05
    assert -0.11 <= med[("mooncake_conversation", "decode")]["p50_rel_err"] <= -0.09


def test_call9_deep_engine_replays_reproduce_and_meet_the_decode_targets():
    """Call 9 timed and replayed the engine core at depth 4 (12 layers; the profile beside the
    data, fitted on that stack). Re-simulated with it, every recorded error comes back. Decode
    (graphed) meets the targets on both traces: p50 within 5 %, p90 per-request error ≤ 15 %
    (median of 3 repeats). Prefill (eager) does not on Azure: calibration/README.md says why."""
    path = VALIDATION / "h200-deepseek" / "call9"
    profile = load_profile(str(path / "v41.yaml"))
    assert profile.coefs(load_model(FLASH), "h200").engine_overhead.stack_depth == 4
    med = {}
    for phase in ("prefill", "decode"):
        report = json.loads((path / phase / "replay_report.json").read_text())
        assert report["shape"]["depth"] == 4 and report["repeats"] == 3
        got = recheck(profile, path / phase, report)
        for trace, phases in report["traces"].items():
            for g, w in zip(got[trace][phase]["runs"], phases[phase]["runs"], strict=True):
                for key in ("abs_rel_err_p90", "p50_rel_err"):
                    assert g[key] == pytest.approx(w[key], rel=1e-6), (trace, phase, key)
            med[(trace, phase)] = got[trace][phase]["median"]
    for trace in ("mooncake_conversation", "azure_conv"):
        assert abs(med[(trace, "decode")]["p50_rel_err"]) <= 0.05
        assert med[(trace, "decode")]["abs_rel_err_p90"] <= 0.15
        assert med[(trace, "decode")]["measured_p50_spread"] <= 0.03
    assert abs(med[("mooncake_conversation", "prefill")]["p50_rel_err"]) <= 0.05
    assert med[("azure_conv", "prefill")]["p50_rel_err"] < -0.3  # eager host steps: see README


def test_call14_graphed_engine_meets_every_replay_target():
    """Call 14 calibrated V4.1-Flash at depth 4 with the engine core's prefill steps replayed as
    CUDA graphs (``engine_prefill_graph_tokens``) and replayed prefill with that profile.
    Re-simulated with it, every recorded prefill error comes back, and TTFT meets the targets
    on both traces (p50 within 5 %, p90 per-request error ≤ 15 %, median of 3 repeats); call
    10's decode replays (same graphed decode engine, another machine), re-simulated with the
    same profile, meet them for TPOT. Every recorded prefill step ran as a graph."""
    path = VALIDATION / "h200-deepseek" / "graphs" / "call14"
    profile = load_profile(str(path / "v41.yaml"))
    coefs = profile.coefs(load_model(FLASH), "h200")
    assert coefs.engine_overhead.stack_depth == 4 and coefs.engine_prefill_graph_tokens == 16384
    med = {}
    for phase, folder in (
        ("prefill", path / "prefill"),
        ("decode", path.parent.parent / "call9" / "decode"),
    ):
        report = json.loads((folder / "replay_report.json").read_text())
        assert report["shape"]["depth"] == 4 and report["repeats"] == 3
        got = recheck(profile, folder, report)
        for trace, phases in report["traces"].items():
            if phase == "prefill":
                for g, w in zip(got[trace][phase]["runs"], phases[phase]["runs"], strict=True):
                    for key in ("abs_rel_err_p90", "p50_rel_err"):
                        assert g[key] == pytest.approx(w[key], rel=1e-6), (trace, key)
                    assert w["steps"]["captured_steps"] <= 1
                steps = pd.read_csv(folder / f"replay_{trace}_prefill_steps.csv")
                assert (steps["graph"] == 1).all() and (steps["issue_s"] < 0.002).all()
            med[(trace, phase)] = got[trace][phase]["median"]
    for trace in ("mooncake_conversation", "azure_conv"):
        for phase in ("prefill", "decode"):
            assert abs(med[(trace, phase)]["p50_rel_err"]) <= 0.05, (trace, phase)
            assert med[(trace, phase)]["abs_rel_err_p90"] <= 0.15, (trace, phase)
            assert med[(trace, phase)]["measured_p50_spread"] <= 0.03, (trace, phase)


@pytest.mark.parametrize(
    ("replays", "profile", "on_clock_captures"),
    [("call17/replay", "call16/v41.yaml", 20), ("call18/replay", "call18/v41.yaml", 0)],
)
def test_calls_17_and_18_replays_recheck_and_show_what_the_decode_capture_fix_removed(
    replays: str, profile: str, on_clock_captures: int
) -> None:
    """Calls 16–18 (extended grid, depth 4, graphed prefill): every recorded repeat's errors come
    back when the stored replay is re-simulated with the profile it ran against. In call 17 the
    Azure decode replay captured 20 new decode graphs on the clock (steps whose host issue took
    ~50 ms); from call 18 on, decode captures run off the clock and none is left."""
    root = VALIDATION / "h200-deepseek"
    folder = root / replays
    report = json.loads((folder / "replay_report.json").read_text())
    assert report["shape"]["depth"] == 4 and report["repeats"] == 3
    rechecked(load_profile(str(root / profile)), folder, report)
    steps = pd.read_csv(folder / "replay_azure_conv_decode_steps.csv")
    assert int((steps["issue_s"] > 0.01).sum()) == on_clock_captures


def test_call22_replays_with_the_shipped_profile_of_call_21():
    """Call 21 calibrated V4.1-Flash (depth 4, graphed prefill, the grouped projection timed as
    graphs) and call 22 replayed both traces with that profile. Re-simulated with it, every
    recorded error comes back. With the shipped h200-deepseek (call 26, measured on another
    machine) TTFT and TPOT meet the targets on Mooncake, TPOT on Azure, and Azure's TTFT p90;
    Azure's TTFT p50 misses at −5.5 % (a burst of arrivals queues, below)."""
    root = VALIDATION / "h200-deepseek"
    folder = root / "call22" / "replay"
    report = json.loads((folder / "replay_report.json").read_text())
    assert report["shape"]["depth"] == 4 and report["repeats"] == 3
    rechecked(load_profile(str(root / "call21" / "v41.yaml")), folder, report)
    shipped = recheck(load_profile("h200-deepseek"), folder, report)
    med = {(t, p): v["median"] for t, ph in shipped.items() for p, v in ph.items()}
    for trace, phase in med:
        assert med[(trace, phase)]["abs_rel_err_p90"] <= 0.15, (trace, phase)
        if (trace, phase) != ("azure_conv", "prefill"):
            assert abs(med[(trace, phase)]["p50_rel_err"]) <= 0.05, (trace, phase)
    assert -0.07 < med[("azure_conv", "prefill")]["p50_rel_err"] < -0.05


def test_call25_prefill_replays_on_another_machine_with_the_shipped_profile():
    """Call 25 replayed prefill with the profile then shipped (calls 21 and 24) on another H200
    machine: every recorded error comes back on the CPU. With today's shipped h200-deepseek
    (call 26) Mooncake's TTFT meets both targets (+1.4 % at p50, 4.1 % at p90), Azure's p50 does
    (+0.5 %) and its p90 does not (19.4 %; the measured p50 moved 10.6 % between repeats)."""
    folder = VALIDATION / "h200-deepseek" / "call25" / "replay"
    report = json.loads((folder / "replay_report.json").read_text())
    assert report["shape"]["depth"] == 4 and report["repeats"] == 3
    rechecked(
        load_profile(str(VALIDATION / "h200-deepseek" / "shipped-calls21-24.yaml")), folder, report
    )
    got = recheck(load_profile("h200-deepseek"), folder, report)
    med = {t: ph["prefill"]["median"] for t, ph in got.items()}
    assert abs(med["mooncake_conversation"]["p50_rel_err"]) <= 0.05
    assert med["mooncake_conversation"]["abs_rel_err_p90"] <= 0.15
    assert abs(med["azure_conv"]["p50_rel_err"]) <= 0.05
    assert 0.15 < med["azure_conv"]["abs_rel_err_p90"] < 0.25


def _medians(got: dict) -> dict:
    return {(t, p): v["median"] for t, ph in got.items() for p, v in ph.items()}


def test_calls_26_to_28_the_shipped_profile_meets_every_replay_target_on_another_machine():
    """Call 26 calibrated V4.1-Flash and V3 (the shipped h200-deepseek is that measurement,
    re-fitted); call 27 replayed both traces on the same machine against the profile as
    calibrated, call 28 on a fresh machine against the shipped one. Every recorded error comes
    back. On call 28's machine all eight targets hold (5 % at p50, 15 % per request at p90,
    median of three repeats); on call 27's, six: Azure's TTFT p90 (16.5 %) and its TPOT p50
    (+5.4 %: the calibration's engine steps ran ~5 % slower than the same machine's replays)."""
    root = VALIDATION / "h200-deepseek"
    shipped = load_profile("h200-deepseek")
    stored = {}
    for call in ("call27", "call28"):
        folder = root / call / "replay"
        report = json.loads((folder / "replay_report.json").read_text())
        assert report["shape"]["depth"] == 4 and report["repeats"] == 3
        stored[call] = (folder, report)
    rechecked(load_profile(str(root / "call26" / "v41.yaml")), *stored["call27"])
    med28 = _medians(rechecked(shipped, *stored["call28"]))
    assert len(med28) == 4
    for key, m in med28.items():
        assert abs(m["p50_rel_err"]) <= 0.05 and m["abs_rel_err_p90"] <= 0.15, key
    med27 = _medians(recheck(shipped, *stored["call27"]))
    missed = {
        (t, p, k)
        for (t, p), m in med27.items()
        for k, bound in (("p50_rel_err", 0.05), ("abs_rel_err_p90", 0.15))
        if abs(m[k]) > bound
    }
    assert missed == {
        ("azure_conv", "prefill", "abs_rel_err_p90"),
        ("azure_conv", "decode", "p50_rel_err"),
    }


def test_the_azure_ttft_check_is_ill_conditioned_and_the_others_are_not():
    """Every simulated step cost × 0.995 … 1.005 (conditioning.py): on call 28's replays with the
    shipped profile Mooncake's TTFT and both TPOTs move by under 2 points, Azure's TTFT p90 by
    over 10: at load 0.5 its bursts queue, and which prompts share a step turns on sub-millisecond
    timing. The step model itself is within 2.5 % there (median measured / predicted step time,
    steps of 1, 2 and 3–4 prompts: 0.98–1.01)."""
    folder = VALIDATION / "h200-deepseek" / "call28" / "replay"
    report = json.loads((folder / "replay_report.json").read_text())
    shipped = load_profile("h200-deepseek")
    moved = spread(conditioning(shipped, folder, report, scales=(0.995, 1.0, 1.005)))
    for (trace, phase), row in moved.iterrows():
        if (trace, phase) == ("azure_conv", "prefill"):
            assert row["p90_moves"] > 10, row
        else:
            assert row["p50_moves"] < 2 and row["p90_moves"] < 2, (trace, phase, row)
    res = residuals(folder, "h200-deepseek")
    for trace in ("azure_conv", "mooncake_conversation"):
        pre = res[trace]["prefill"]
        assert pre["rebuilt_steps"] == pre["steps"]
        for row in pre["by_prompts"]:
            assert abs(row["ratio_p50"] - 1) < 0.025, (trace, row)
