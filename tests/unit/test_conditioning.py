"""conditioning.py: a replay re-simulated with every step cost scaled."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from deepinfer_sim.calibration import validate
from deepinfer_sim.calibration.conditioning import conditioning, spread
from deepinfer_sim.calibration.replay import recheck
from deepinfer_sim.models.profile import load_profile

STORED = Path(__file__).resolve().parents[2] / "calibration" / "validation" / "h200-deepseek"


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_step_scale_is_the_simulation_with_every_step_cost_scaled(phase, monkeypatch):
    """Dividing arrivals by f and multiplying the latencies by f is the same simulation as every
    step costing f times as much (the simulator has no other clock)."""
    folder = STORED / "call28" / "replay"
    report = json.loads((folder / "replay_report.json").read_text())
    shape = validate.ReplayShape(**report["shape"])
    profile = load_profile("h200-deepseek")
    frame = pd.read_csv(folder / f"replay_azure_conv_{phase}.csv").head(60)
    simulate = validate.simulate_prefill if phase == "prefill" else validate.simulate_decode
    f = 1.013
    stretched = simulate(frame.assign(arrival_s=frame["arrival_s"] / f), profile, shape) * f
    cost = validate.validation_cost(profile, shape)
    plain_prefill, plain_decode = cost.prefill_step, cost.decode_step_packed
    monkeypatch.setattr(cost, "prefill_step", lambda *a, **k: f * plain_prefill(*a, **k))
    monkeypatch.setattr(cost, "decode_step_packed", lambda *a, **k: f * plain_decode(*a, **k))
    monkeypatch.setattr(validate, "validation_cost", lambda p, s: cost)
    scaled = simulate(frame, profile, shape)
    np.testing.assert_allclose(stretched, scaled, rtol=1e-9)


def test_conditioning_rows_and_their_spread():
    """One row per trace, phase, scale and repeat; at scale 1 they are recheck's errors; the
    spread is the largest move of any repeat over the scales, in points."""
    folder = STORED / "call25" / "replay"
    report = json.loads((folder / "replay_report.json").read_text())
    profile = load_profile("h200-deepseek")
    rows = conditioning(profile, folder, report, scales=(0.99, 1.0))
    assert len(rows) == 2 * 2 * 3  # two traces (prefill only), two scales, three repeats
    base = recheck(profile, folder, report)
    for r in rows:
        if r["scale"] == 1.0:
            want = base[r["trace"]][r["phase"]]["runs"][r["repeat"]]
            assert r["p50_rel_err"] == want["p50_rel_err"]
    moved = spread(rows, lo=0.99, hi=1.0)
    for (trace, phase), row in moved.iterrows():
        mine = [r for r in rows if r["trace"] == trace and r["phase"] == phase]
        by = {}
        for r in mine:
            by.setdefault(r["repeat"], []).append(r["abs_rel_err_p90"])
        assert row["p90_moves"] == pytest.approx(100 * max(max(v) - min(v) for v in by.values()))


@pytest.mark.parametrize("module", ["conditioning", "step_residuals"])
def test_the_replay_tools_name_a_bad_folder_or_profile(module, tmp_path, monkeypatch, capsys):
    """A folder without a replay report, or an unknown profile: one error line, exit status 2."""
    import importlib

    main = importlib.import_module(f"deepinfer_sim.calibration.{module}").main
    for argv in ([str(tmp_path)], [str(STORED / "call28" / "replay"), "--profile", "nope"]):
        monkeypatch.setattr("sys.argv", [module, *argv])
        with pytest.raises(SystemExit) as exc:
            main()
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "no replay_report.json" in err or "unknown cost profile 'nope'" in err
