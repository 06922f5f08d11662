"""``moe_split``'s ``decode`` part: a change to the decode attention block alone (V3's block
making FlashMLA's scheduler metadata once per step instead of in every layer) re-timed and
carried into a profile without re-timing prefill, the routed experts or the engine.

The round trip runs on the shipped H200 profile's V3 TP8 slice with synthetic new and base
timings (new = base × 0.9 at every shape): ``export`` its raw decode points, ``rescale`` them
by new / base, ``merge`` them back; the measure plumbing runs on the CPU with the reference
kernels on the toy model's tiny grid (FlashMLA needs a GPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deepinfer_sim.calibration import moe_split
from deepinfer_sim.calibration.sweep import Grid, fit_attention, measurements_of
from deepinfer_sim.errors import UserError
from deepinfer_sim.models.profile import DecodeCoef, ModelFits, load_profile

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "calibration" / "profiles" / "h200-deepseek.yaml"
TOY = str(ROOT / "tests" / "data" / "toy-model.yaml")
TP8 = "deepseek-v3@tp8"


def _predict(coef: DecodeCoef, rows: list[list[Any]]) -> np.ndarray:
    """``coef``'s seconds at the (kind, batch, context, verify, s) rows' shapes."""
    B, ctx, v = np.array([r[1:4] for r in rows], dtype=float).T
    return np.asarray(coef.seconds(B, B * ctx, v))


def _retimed(exported: dict[str, Any], per_row: Any) -> dict[str, Any]:
    """``exported`` (a ``measure`` file) with every row's time replaced by ``per_row(row)``."""
    out = json.loads(json.dumps(exported))
    for res in out["models"].values():
        for rows in res["raw"].values():
            for r in rows:
                r[-1] = per_row(r)
    return out


def _decode_of(fits: ModelFits) -> DecodeCoef:
    return fits.hardware["h200"].decode["mla"]


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory) -> dict[str, Any]:
    """The shipped profile, its TP8 slice's decode exported, rescaled by new / base = 0.9 and
    merged back, all through the command line."""
    tmp = tmp_path_factory.mktemp("decode")
    target, base, new = (tmp / f"{n}.json" for n in ("target", "base", "new"))
    args = ["export", str(SHIPPED), "--models", TP8, "--parts", "decode", "--out", str(target)]
    assert moe_split.main(args) == 0
    exported = json.loads(target.read_text())

    def base_time(r: list[Any]) -> float:  # another GPU's old block: any time per shape
        return 1e-4 * (1.0 + r[1] / 64 + r[2] / 65536 + r[3] / 8)

    base.write_text(json.dumps(_retimed(exported, base_time)))
    new.write_text(json.dumps(_retimed(exported, lambda r: 0.9 * base_time(r))))
    rescaled, merged = tmp / "rescaled.json", tmp / "merged.yaml"
    args = ["rescale", str(target), str(base), str(new), "--out", str(rescaled)]
    assert moe_split.main(args) == 0
    assert moe_split.main(["merge", str(rescaled), str(SHIPPED), str(merged)]) == 0
    return {
        "exported": exported,
        "rescaled": json.loads(rescaled.read_text()),
        "before": load_profile(str(SHIPPED)),
        "after": load_profile(str(merged)),
    }


def test_parts_take_decode():
    assert moe_split.PART_KEYS["decode"] == ("decode", "decode_offgrid")
    assert moe_split._parts("decode") == ("decode",)
    assert moe_split._parts("prefill,decode") == ("prefill", "decode")
    with pytest.raises(UserError, match="choose from moe, moe_whole, prefill, decode"):
        moe_split._parts("decode,attention")


def test_export_writes_the_profiles_own_raw_decode_points(round_trip):
    raw = round_trip["before"].models[TP8].raw
    got = round_trip["exported"]["models"][TP8]["raw"]
    assert set(got) == {"decode", "decode_offgrid"}
    assert got["decode"] == raw["decode"] and got["decode_offgrid"] == raw["decode_offgrid"]
    assert len(got["decode"]) == 132 and all(len(r) == 5 for r in got["decode"])


def test_rescale_carries_each_decode_shape_by_new_over_base(round_trip):
    before = round_trip["before"].models[TP8].raw
    got = round_trip["rescaled"]["models"][TP8]["raw"]
    for key in ("decode", "decode_offgrid"):
        assert [r[:-1] for r in got[key]] == [r[:-1] for r in before[key]]
        np.testing.assert_allclose([r[-1] for r in got[key]], [0.9 * r[-1] for r in before[key]])


def test_merge_refits_the_decode_fits_from_the_new_points(round_trip):
    """The merged raw decode points are 0.9 × the old, the decode fit is the calibration's fit
    of them (``fit_attention``, TP8's verify tile 4), and its predictions at every grid and
    off-grid shape move by 0.9 — within the fit's own error, not exactly: the decode form is
    chosen by cross-validation, and for this slice two forms (64-row tiles; a staircase of
    16-row tiles) score within 0.01 % of each other, so rounding in new / base can swap them."""
    old, new = round_trip["before"].models[TP8], round_trip["after"].models[TP8]
    for key in ("decode", "decode_offgrid"):
        assert [r[:-1] for r in new.raw[key]] == [r[:-1] for r in old.raw[key]]
        got, want = ([r[-1] for r in f.raw[key]] for f in (new, old))
        np.testing.assert_allclose(got, 0.9 * np.array(want), rtol=1e-12)
        ratio = _predict(_decode_of(new), old.raw[key]) / _predict(_decode_of(old), old.raw[key])
        assert ratio.mean() == pytest.approx(0.9, rel=0.005)
        np.testing.assert_allclose(ratio, 0.9, rtol=0.05)
    points = measurements_of({k: new.raw[k] for k in moe_split.DECODE_KEYS})
    _, fitted, errors = fit_attention(points, tiles_of_verify={"mla": 4})
    assert _decode_of(new) == fitted["mla"] and new.fit["decode.mla"] == errors["decode.mla"]
    assert _decode_of(old).verify_tile == _decode_of(new).verify_tile == 4  # 16 heads
    assert new.fit["decode.mla"].offgrid_mape < 0.03 and new.fit["decode.mla"].n_offgrid == 12
    note = round_trip["after"].provenance.note
    assert f"decode of {TP8} from rescaled.json (moe_split.py)" in note


def test_merge_leaves_prefill_moe_and_other_models_alone(round_trip):
    before, after = round_trip["before"], round_trip["after"]
    old, new = before.models[TP8], after.models[TP8]
    old_hw, new_hw = old.hardware["h200"], new.hardware["h200"]
    assert new_hw.model_copy(update={"decode": old_hw.decode}) == old_hw
    assert {k: v for k, v in new.raw.items() if not k.startswith("decode")} == {
        k: v for k, v in old.raw.items() if not k.startswith("decode")
    }
    assert {k: v for k, v in new.fit.items() if k != "decode.mla"} == {
        k: v for k, v in old.fit.items() if k != "decode.mla"
    }
    assert all(after.models[name] == fits for name, fits in before.models.items() if name != TP8)


def test_merging_the_profiles_own_points_gives_its_decode_fit_back(round_trip):
    """Re-fitted from its own raw points (new = base), the slice's decode fit is the shipped
    one: ``merge`` fits decode as the calibration did (``fit_attention``, the verify tile)."""
    before = round_trip["before"]
    again = moe_split.merge(round_trip["exported"], before, "own.json").models[TP8]
    for key in ("decode", "decode_offgrid"):
        rows = before.models[TP8].raw[key]
        want = _predict(_decode_of(before.models[TP8]), rows)
        np.testing.assert_allclose(_predict(_decode_of(again), rows), want, rtol=1e-6)


def test_rescale_matches_decode_rows_on_batch_context_and_verify() -> None:
    """A decode row's shape is (kind, batch, context, verify): a target shape at another verify
    count than the others timed is refused, or left out with ``drop_missing``."""

    def measured(t: float, verify: float = 2.0) -> dict[str, Any]:
        rows = [["mla", 8.0, 4096.0, 1.0, t], ["mla", 8.0, 4096.0, verify, 2 * t]]
        return {"models": {TP8: {"raw": {"decode": rows}}}}

    out = moe_split.rescale(measured(2.0), measured(1.0), measured(0.5))
    assert out["models"][TP8]["raw"] == {
        "decode": [["mla", 8.0, 4096.0, 1.0, 1.0], ["mla", 8.0, 4096.0, 2.0, 2.0]]
    }
    with pytest.raises(UserError, match=r"decode: \['mla', 8.0, 4096.0, 3.0\] is not timed"):
        moe_split.rescale(measured(2.0, verify=3.0), measured(1.0), measured(0.5))
    said: list[str] = []
    kept = moe_split.rescale(measured(2.0, 3.0), measured(1.0), measured(0.5), True, said.append)
    assert kept["models"][TP8]["raw"]["decode"] == [["mla", 8.0, 4096.0, 1.0, 1.0]]
    assert len(said) == 1


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: on a busy 2-core CI machine two threads wait on each other."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def toy_profile(tmp_path_factory, one_thread) -> Path:
    """The toy model calibrated on the CPU (tiny grid, no engine steps)."""
    from click.testing import CliRunner

    from deepinfer_sim.cli import main

    out = tmp_path_factory.mktemp("toy") / "toy-cpu.yaml"
    args = ["calibrate", "--device", "cpu", "--model", TOY, "--kernels", "reference"]
    args += ["--grid", "tiny", "--hardware", "h200", "--no-engine", "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    return out


def test_measure_times_the_decode_grid_and_merge_replaces_only_decode(toy_profile, tmp_path):
    """``measure --parts decode`` times each attention kind's decode block on the grid's decode
    shapes and off-grid shapes, in the profile's raw row format (kind, batch, context, verify,
    s), and records the verify tiles its fit takes; ``merge`` re-fits the decode fits and keeps
    the prefill and MoE fits and points."""
    measured = tmp_path / "decode.json"
    args = ["measure", "--out", str(measured), "--device", "cpu", "--models", TOY]
    args += ["--parts", "decode", "--kernels", "reference", "--grid", "tiny", "--hardware", "h200"]
    assert moe_split.main(args) == 0
    res = json.loads(measured.read_text())["models"]["toy-v4"]
    assert set(res["raw"]) == {"decode", "decode_offgrid"} and res["verify_tiles"] == {}
    grid = Grid.tiny()
    kinds = sorted({r[0] for r in res["raw"]["decode"]})
    assert kinds == ["csa", "hca"]
    for key, shapes in (("decode", grid.decode_shapes()), ("decode_offgrid", grid.off_decode)):
        want = sorted((k, *map(float, s)) for k in kinds for s in shapes)
        assert sorted(tuple(r[:-1]) for r in res["raw"][key]) == want
        assert all(r[-1] > 0 for r in res["raw"][key])
    out = tmp_path / "merged.yaml"
    assert moe_split.main(["merge", str(measured), str(toy_profile), str(out)]) == 0
    before = load_profile(str(toy_profile)).models["toy-v4"]
    after = load_profile(str(out)).models["toy-v4"]
    assert after.raw["decode"] == res["raw"]["decode"]
    assert after.raw["decode_offgrid"] == res["raw"]["decode_offgrid"]
    assert after.hardware["h200"].decode != before.hardware["h200"].decode  # re-timed
    assert set(after.hardware["h200"].decode) == set(kinds)
    assert after.hardware["h200"].prefill == before.hardware["h200"].prefill
    assert after.hardware["h200"].moe == before.hardware["h200"].moe
    for key in ("prefill", "prefill_offgrid", "moe", "moe_experts"):
        assert after.raw[key] == before.raw[key]
    assert {k for k in after.fit if after.fit[k] != before.fit[k]} <= {"decode.csa", "decode.hca"}


def test_merge_refuses_a_kind_with_too_few_decode_shapes(toy_profile):
    rows = [["csa", 1.0, 64.0, 1.0, 1e-4], ["csa", 4.0, 64.0, 1.0, 2e-4]]
    measured = {"models": {"toy-v4": {"raw": {"decode": rows}, "verify_tiles": {}}}}
    with pytest.raises(UserError, match="too few decode shapes of csa"):
        moe_split.merge(measured, load_profile(str(toy_profile)), "few.json")
