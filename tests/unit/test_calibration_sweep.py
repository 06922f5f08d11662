"""``deepinfer-sim calibrate`` end to end on the CPU: the real sweep with the reference kernels on
a toy model (``tests/data/toy-model.yaml``), then fit, write, load, check and use the profile.

This is what keeps calibrate working between GPU runs (a NameError once made every shape
"skipped" and nobody saw it): the tiny grid times every kind of the toy model, the routed
experts, the off-grid shapes and engine-core steps of the toy stack in a few seconds. The vision
encoder is skipped (the tiny grid has ``vision=False``): at its real size it is far too slow for
a CPU test. Timings on a CPU are noisy, so fit quality is not asserted here — only that every
piece is measured, fitted and usable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from deepinfer_sim.calibration.sweep import Grid  # noqa: E402
from deepinfer_sim.cli import main  # noqa: E402
from deepinfer_sim.errors import ConfigError, UserError  # noqa: E402
from deepinfer_sim.models.cost import PoolShape  # noqa: E402
from deepinfer_sim.models.profile import Profile, load_profile, write_profile  # noqa: E402
from deepinfer_sim.models.profile_cost import ProfileStepCost  # noqa: E402
from deepinfer_sim.models.registry import load_hardware, load_model  # noqa: E402
from deepinfer_sim.scenario import check_profile  # noqa: E402

TOY = str(Path(__file__).parent.parent / "data" / "toy-model.yaml")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: on a busy 2-core CI machine two threads wait on each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory, one_thread) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("cal") / "toy-cpu.yaml"
    args = ["calibrate", "--device", "cpu", "--model", TOY, "--kernels", "reference"]
    args += ["--grid", "tiny", "--hardware", "h200", "--name", "toy-cpu", "--out", str(out)]
    res = CliRunner().invoke(main, args)
    return {"result": res, "path": out}


def test_calibrate_cli_runs_the_whole_sweep_on_the_cpu(calibrated):
    res = calibrated["result"]
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "skipped" not in res.output  # every shape was timed
    assert "off-grid MAPE" in res.output and "prefill.csa" in res.output
    assert calibrated["path"].is_file()


def test_the_profile_holds_fits_for_the_toy_model(calibrated):
    prof = load_profile(str(calibrated["path"]))
    assert prof.name == "toy-cpu" and list(prof.models) == ["toy-v4"]
    assert prof.provenance.kind == "measured" and prof.provenance.device == "cpu"
    assert prof.provenance.kernels == "reference" and prof.provenance.kernel_versions
    fits = prof.models["toy-v4"]
    kinds = {"prefill.csa", "prefill.hca", "decode.csa", "decode.hca", "moe", "moe_experts"}
    assert set(fits.fit) == kinds
    assert all(f.n_offgrid > 0 and f.offgrid_mape is not None for f in fits.fit.values())
    assert fits.dtypes.kv_cache == "fp32" and fits.dtypes.attention == "fp32"  # CPU compute
    assert fits.widths is not None and fits.widths.hidden == 64
    for key in ("prefill", "decode", "moe", "prefill_offgrid", "decode_offgrid", "moe_offgrid"):
        assert fits.raw[key], key
    # the experts alone (no routing sort, gather or combine), on the same shapes
    whole = {(e, t): s for e, t, s in fits.raw["moe"]}
    alone = {(e, t): s for e, t, s in fits.raw["moe_experts"]}
    assert alone.keys() == whole.keys()
    assert fits.hardware["h200"].moe_experts is not None
    assert all(float(r[-1]) > 0 for r in fits.raw["decode"])
    coefs = fits.hardware["h200"]
    assert coefs.vision_seconds_per_image is None  # skipped by the tiny grid
    assert fits.raw["engine"]  # engine-core steps of the toy stack, reference backend


def test_check_profile_accepts_the_toy_and_refuses_another_model(calibrated):
    ref = str(calibrated["path"])
    toy = load_model(TOY)
    check_profile(ref, toy, "h200", None)
    with pytest.raises(ConfigError) as exc:
        check_profile(ref, load_model("deepseek-v4.1-flash"), "h200", None)
    msg = str(exc.value)
    assert "no fits for model 'deepseek-v4.1-flash'" in msg and "toy-v4" in msg
    assert "calibrate" in msg and "roofline" in msg
    with pytest.raises(ConfigError, match="no coefficients for hardware 'gb200'"):
        check_profile(ref, toy, "gb200", None)


def test_the_profile_prices_prefill_and_decode_steps(calibrated):
    toy = load_model(TOY)
    prof = load_profile(str(calibrated["path"]))
    cost = ProfileStepCost(toy, load_hardware("h200"), PoolShape(1, 0), prof.coefs(toy, "h200"))
    prefill = cost.prefill_step([[(128, 512)]])
    decode = cost.decode_step(np.array([4.0]), np.array([4 * 300.0]), 2.0)
    assert 0 < prefill < 10 and np.isfinite(prefill)
    assert 0 < decode < 10 and np.isfinite(decode)
    eager = ProfileStepCost(
        toy, load_hardware("h200"), PoolShape(1, 0), prof.coefs(toy, "h200"), eager=True
    )
    assert eager.decode_step(np.array([4.0]), np.array([1200.0]), 1.0) >= cost.decode_step(
        np.array([4.0]), np.array([1200.0]), 1.0
    )


def test_merge_profiles_cli(calibrated, tmp_path):
    """Profiles of different models from the same device and kernels merge; the same model twice
    is one clean error line."""
    prof = load_profile(str(calibrated["path"]))
    (fits,) = prof.models.values()
    other = tmp_path / "other.yaml"
    write_profile(Profile(name="other", provenance=prof.provenance, models={"toy-b": fits}), other)
    out = tmp_path / "merged.yaml"
    res = CliRunner().invoke(
        main, ["merge-profiles", str(out), str(calibrated["path"]), str(other)]
    )
    assert res.exit_code == 0, res.output
    assert set(load_profile(str(out)).models) == {"toy-v4", "toy-b"}
    res = CliRunner().invoke(
        main, ["merge-profiles", str(out), str(calibrated["path"]), str(calibrated["path"])]
    )
    assert res.exit_code == 2
    assert res.output.startswith("error:") and "toy-v4" in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "deepseek-v3", "--hardware", "h200"], "no mla attention kernels"),
        (["--model", TOY], "cannot tell the hardware of 'cpu'; pass --hardware"),
        (["--model", TOY, "--hardware", "nope"], "unknown hardware 'nope'"),
        (["--model", TOY, "--hardware", "h200", "--quick", "--grid", "tiny"], "disagree"),
    ],
)
def test_calibrate_refuses_bad_input_before_timing(tmp_path, args, message):
    """A model whose kinds the backend lacks (V3's MLA on the reference kernels), a device whose
    hardware cannot be told, an unknown hardware: one ``error:`` line, exit status 2."""
    out = tmp_path / "p.yaml"
    res = CliRunner().invoke(
        main, ["calibrate", "--device", "cpu", "--kernels", "reference", "--out", str(out), *args]
    )
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error:") and message in res.output
    assert res.output.count("\n") == 1 and not out.exists()


def test_derive_from_a_derived_profile_is_a_clean_error(tmp_path):
    res = CliRunner().invoke(
        main,
        [
            "derive-profile",
            "sm100-derived",
            "--targets",
            "b200",
            "--name",
            "x",
            "--out",
            str(tmp_path / "x.yaml"),
        ],
    )
    assert res.exit_code == 2
    assert res.output.startswith("error:") and "derived" in res.output
    assert "Traceback" not in res.output


def test_bench_refuses_a_backend_that_cannot_run_there(monkeypatch):
    """``backend.unavailable(device)`` gives a reason: a UserError before any block is built."""
    from deepinfer_sim.calibration import torch_bench
    from deepinfer_sim.kernels.backend import get_backend

    real = get_backend("reference")
    blocked = type(real)(
        "reference", real.kinds, real.make_attention, real.make_moe, probe=lambda d: "no GPU"
    )
    monkeypatch.setattr(torch_bench, "load_backend", lambda name: blocked)
    with pytest.raises(UserError, match="cannot run on cpu: no GPU"):
        torch_bench.TorchBench("cpu", TOY, "h200")


def test_replay_writes_what_the_cpu_recheck_reads(calibrated, tmp_path):
    """The engine-core replay on the CPU at toy widths: every repeat's per-request seconds, the
    steps of the first, and a report whose numbers the simulator reproduces from the CSV."""
    import pandas as pd

    from deepinfer_sim.calibration.replay import replay
    from deepinfer_sim.calibration.validate import (
        ReplayShape,
        errors,
        simulate_decode,
        simulate_prefill,
    )

    profile = load_profile(str(calibrated["path"]))
    shape = ReplayShape(model=TOY, prefill_token_budget=256, max_decode_batch=4)
    report = replay(
        profile,
        tmp_path,
        "cpu",
        5,
        0.5,
        ("mooncake_conversation",),
        2,
        "reference",
        shape,
        max_prompt=48,
        max_output=5,
    )
    for phase, sim in (("prefill", simulate_prefill), ("decode", simulate_decode)):
        frame = pd.read_csv(tmp_path / f"replay_mooncake_conversation_{phase}.csv")
        assert {"measured_s_0", "measured_s_1"} <= set(frame.columns) and len(frame) == 5
        assert (tmp_path / f"replay_mooncake_conversation_{phase}_steps.csv").is_file()
        got = errors(frame["measured_s_1"].to_numpy(), sim(frame, profile, shape))
        run = report["traces"]["mooncake_conversation"][phase]["runs"][1]
        assert got["simulated_p50_s"] == pytest.approx(run["simulated_p50_s"])
        assert got["abs_rel_err_p90"] == pytest.approx(run["abs_rel_err_p90"])
        assert run["allocator"] == {}  # CUDA allocator counts: none on a CPU
        assert 0 < run["steps"]["issue_s_p50"] <= run["steps"]["wall_s_p50"]
    assert (tmp_path / "replay_report.json").is_file()


def test_spread_contexts_keep_the_total_and_the_span():
    from deepinfer_sim.calibration.torch_bench import spread_contexts

    assert spread_contexts(4, 100, 0.0).tolist() == [100] * 4
    lengths = spread_contexts(5, 1000, 0.5)
    assert lengths.sum() == 5000 and lengths.min() == 500 and lengths.max() == 1500
    assert spread_contexts(1, 7, 0.9).tolist() == [7]
    with pytest.raises(ValueError, match="spread"):
        spread_contexts(4, 100, 1.0)


def test_mixed_context_diagnostic_runs_on_the_cpu():
    from deepinfer_sim.calibration import mixed_contexts, torch_bench

    bench = torch_bench.TorchBench("cpu", TOY, "h200", repeats=1, max_context=512, max_batch=8)
    res = mixed_contexts.measure(bench, [(4, 256)], [(4, 256)], (0.0, 0.5))
    assert {r["kind"] for r in res["layers"]} == set(bench.kinds)
    assert [r["spread"] for r in res["engine"]] == [0.0, 0.5]
    assert all(r["vs_uniform"] == 1.0 for r in res["layers"] + res["engine"] if r["spread"] == 0)
    assert all(r["seconds"] > 0 for r in res["layers"] + res["engine"])


def test_decode_spread_reaches_every_decode_timing(monkeypatch, tmp_path):
    from deepinfer_sim.calibration import torch_bench

    seen: list[float] = []
    real_decode = torch_bench.TorchBench.decode
    real_engine = torch_bench.TorchBench.engine_steps

    def decode(self, kind, batch, context, verify, spread=0.0):
        seen.append(spread)
        return real_decode(self, kind, batch, context, verify, spread)

    def engine_steps(self, decode, prefill, spread=0.0, depth=1, with_loop_gaps=True):
        seen.append(spread)
        return real_engine(self, decode, prefill, spread, depth, with_loop_gaps)

    monkeypatch.setattr(torch_bench.TorchBench, "decode", decode)
    monkeypatch.setattr(torch_bench.TorchBench, "engine_steps", engine_steps)
    args = ["calibrate", "--device", "cpu", "--model", TOY, "--kernels", "reference"]
    args += ["--hardware", "h200", "--grid", "tiny", "--no-vision", "--decode-spread", "0.5"]
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "p.yaml")])
    assert res.exit_code == 0, res.output
    assert seen and set(seen) == {0.5}


def test_engine_stack_keeps_up_to_depth_layers_of_each_group():
    from deepinfer_sim.calibration.sweep import engine_stack
    from deepinfer_sim.calibration.torch_bench import stack_layers

    flash = load_model("deepseek-v4.1-flash")
    one, four = engine_stack(flash), engine_stack(flash, depth=4)
    assert [g.count for g in one.layer_groups] == [1] * len(flash.layer_groups)
    assert [g.count for g in four.layer_groups] == [min(g.count, 4) for g in flash.layer_groups]
    assert one.moe.routed_experts == four.moe.routed_experts == 48
    assert len(stack_layers(four)) == sum(g.count for g in four.layer_groups)
    assert [k for k, _ in stack_layers(one)] == [g.attention for g in flash.layer_groups]
    with pytest.raises(ValueError, match="depth"):
        engine_stack(flash, depth=0)


def test_a_deeper_engine_stack_is_timed_fitted_and_replayed_at_its_depth(tmp_path, one_thread):
    """``calibrate --engine-depth 2`` times the engine core on two layers per group, records the
    depth in the engine-core model, and the replay check runs (and costs) that same stack; a
    replay at another depth is refused with a message naming both."""
    from deepinfer_sim.calibration.replay import replay
    from deepinfer_sim.calibration.validate import ReplayShape, validation_cost

    deep = tmp_path / "toy-deep.yaml"
    deep.write_text(
        Path(TOY)
        .read_text()
        .replace("name: toy-v4", "name: toy-deep")
        .replace("count: 1", "count: 3")
    )
    out = tmp_path / "deep.yaml"
    args = ["calibrate", "--device", "cpu", "--model", str(deep), "--kernels", "reference"]
    args += ["--grid", "tiny", "--hardware", "h200", "--engine-depth", "2", "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output + repr(res.exception)
    profile = load_profile(str(out))
    coefs = profile.models["toy-deep"].hardware["h200"]
    assert coefs.engine_overhead.stack_depth == 2 and profile.models["toy-deep"].raw["engine"]
    shape = ReplayShape(model=str(deep), prefill_token_budget=256, max_decode_batch=4, depth=2)
    assert sum(g.count for g in shape.stack().layer_groups) == 6
    report = replay(
        profile, tmp_path / "r", "cpu", 4, 0.5, ("mooncake_conversation",), 1, "reference",
        shape, max_prompt=48, max_output=4,
    )  # fmt: skip
    assert report["shape"]["depth"] == 2
    assert report["traces"]["mooncake_conversation"]["decode"]["runs"][0]["simulated_p50_s"] > 0
    with pytest.raises(UserError, match=r"depth 2.*depth 1"):
        validation_cost(profile, ReplayShape(model=str(deep)))


def test_prefill_size_diagnostic_runs_on_the_cpu():
    """Its plumbing at toy widths: every (kind, n, p) timed once, and the profiled calls list
    the ops that ran, largest first."""
    from deepinfer_sim.calibration import prefill_sizes, torch_bench

    bench = torch_bench.TorchBench(
        "cpu", TOY, "h200", repeats=1, max_prefix=300, max_chunk=64, max_batch=1, max_context=64
    )
    res = prefill_sizes.measure(bench, (32, 48), (0, 300), (48,), 300)
    assert [(r["kind"], r["n"], r["p"]) for r in res["timed"]] == [
        (k, n, p) for k in bench.kinds for p in (0, 300) for n in (32, 48)
    ]
    assert all(r["seconds"] > 0 for r in res["timed"])
    for kind in bench.kinds:
        rows = res["profiled"][f"{kind}/48/300"]
        assert rows and [r["us"] for r in rows] == sorted((r["us"] for r in rows), reverse=True)


def test_a_calibration_cut_short_keeps_what_it_timed(calibrated, tmp_path, monkeypatch, capsys):
    """While a model is measured its kernel timings so far sit beside ``--out`` (gone once the
    profile is written); a run killed at the routed experts leaves its attention timings, which
    ``refit --partial`` fits and scores."""
    from deepinfer_sim.calibration import refit, run, torch_bench

    assert not list(calibrated["path"].parent.glob("*.partial.json"))

    def killed(self, local_experts, tokens):
        raise KeyboardInterrupt  # a device call's time limit, not a shape that fails

    monkeypatch.setattr(torch_bench.TorchBench, "moe", killed)
    out = tmp_path / "cut.yaml"
    with pytest.raises(KeyboardInterrupt):
        run.run_calibration("cpu", out, "tiny", "h200", models=(TOY,), engine=False)
    assert not out.exists()
    (partial,) = tmp_path.glob("cut.*.partial.json")
    saved = json.loads(partial.read_text())
    raw = saved["raw"]
    assert saved["hardware"] == "h200"  # the device's SMs give the prefill fit's waves
    kinds = {row[0] for row in raw["prefill"]}
    assert kinds == {row[0] for row in raw["decode"]} and kinds and raw["moe"] == []
    capsys.readouterr()
    table = tmp_path / "fits.json"
    assert refit.main(["--partial", str(partial), "--json", str(table)]) == 0
    printed = capsys.readouterr().out
    fits = json.loads(table.read_text())
    assert set(fits) == {f"{p}.{k}" for p in ("prefill", "decode") for k in kinds}
    assert all(f["offgrid_mape"] is not None for f in fits.values())
    assert all(f"prefill.{k}" in printed and f"decode.{k}" in printed for k in kinds)
    assert "moe" not in printed  # none timed
    partial.write_text("{}")
    assert refit.main(["--partial", str(partial)]) == 2


def test_refit_names_a_missing_or_derived_input_and_exits_2(tmp_path, capsys):
    """A profile that does not exist, or one refit cannot re-fit (a derived profile has no raw
    grid), is one `error:` line and exit status 2, never a traceback; nothing is written."""
    from deepinfer_sim.calibration import refit

    out = tmp_path / "out.yaml"
    assert refit.main([str(tmp_path / "missing.yaml"), str(out)]) == 2
    assert "no such cost profile file" in capsys.readouterr().err
    assert refit.main(["sm100-derived", str(out), "--kernels"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_moe_split_measures_the_experts_alone_and_merges_them(calibrated, tmp_path):
    """``moe_split measure`` times the routed experts whole and alone on the grid's MoE shapes
    (no attention kernels needed) and lists the kernels of one call of each; ``merge`` re-fits
    ``moe`` and fits ``moe_experts`` into the profile. A pool across ranks then charges its
    experts only their own work (the exchange's kernels gather and combine); one rank alone
    keeps the whole call."""
    from deepinfer_sim.calibration import moe_split

    measured = tmp_path / "moe.json"
    args = ["measure", "--out", str(measured), "--device", "cpu", "--models", TOY]
    args += ["--kernels", "reference", "--grid", "tiny", "--hardware", "h200"]
    assert moe_split.main(args) == 0
    data = json.loads(measured.read_text())
    res = data["models"]["toy-v4"]
    assert set(res["raw"]) == set(moe_split.RAW_KEYS) and all(res["raw"].values())
    names = " ".join(k["name"] for k in res["profiled"]["moe"])
    assert "sort" in names  # the routing sort: in the whole call, not the experts' own work
    assert "sort" not in " ".join(k["name"] for k in res["profiled"]["moe_experts"])
    out = tmp_path / "merged.yaml"
    assert moe_split.main(["merge", str(measured), str(calibrated["path"]), str(out)]) == 0
    prof = load_profile(str(out))
    fits = prof.models["toy-v4"]
    coefs = fits.hardware["h200"]
    assert coefs.moe_experts is not None and {"moe", "moe_experts"} <= set(fits.fit)
    assert fits.raw["moe_experts"] == res["raw"]["moe_experts"]
    assert "moe_split.py" in prof.provenance.note
    before = load_profile(str(calibrated["path"])).models["toy-v4"]
    kept = moe_split.merge(data, load_profile(str(calibrated["path"])), "m.json", keep_whole=True)
    kept_fits = kept.models["toy-v4"]
    assert kept_fits.hardware["h200"].moe == before.hardware["h200"].moe
    assert kept_fits.raw["moe"] == before.raw["moe"] and kept_fits.fit["moe"] == before.fit["moe"]
    assert kept_fits.hardware["h200"].moe_experts == coefs.moe_experts
    model, hw = load_model(TOY), load_hardware("h200")

    def cost(ep: int, moe: Any, alone: Any) -> ProfileStepCost:
        c = coefs.model_copy(update={"moe": moe, "moe_experts": alone})
        return ProfileStepCost(model, hw, PoolShape(ep=ep, redundant_experts_per_gpu=0), c)

    split, whole = cost(8, coefs.moe, coefs.moe_experts), cost(8, coefs.moe, None)
    alone = cost(8, coefs.moe_experts, None)
    for phase in ("decode", "prefill"):
        assert split.moe_s(300.0, phase) == pytest.approx(alone.moe_s(300.0, phase))
        assert split.moe_s(300.0, phase) != pytest.approx(whole.moe_s(300.0, phase))
    one, one_whole = cost(1, coefs.moe, coefs.moe_experts), cost(1, coefs.moe, None)
    assert one.moe_s(300.0, "decode") == pytest.approx(one_whole.moe_s(300.0, "decode"))


def test_moe_split_prefill_retimes_only_the_prefill_attention(calibrated, tmp_path):
    """``measure --prefill`` also times the prefill attention block on the grid's prefill
    shapes; ``merge`` replaces the prefill fits, their errors and raw points of that model with
    fits of the shipped forms, and keeps its decode fits and raw decode points untouched."""
    from deepinfer_sim.calibration import moe_split

    measured = tmp_path / "moe.json"
    args = ["measure", "--out", str(measured), "--device", "cpu", "--models", TOY]
    args += ["--parts", "moe,prefill"]
    args += ["--kernels", "reference", "--grid", "tiny", "--hardware", "h200"]
    assert moe_split.main(args) == 0
    res = json.loads(measured.read_text())["models"]["toy-v4"]
    assert set(res["raw"]) == set(moe_split.RAW_KEYS) | set(moe_split.PREFILL_KEYS)
    grid = Grid.tiny()
    kinds = {r[0] for r in res["raw"]["prefill"]}
    assert len(res["raw"]["prefill"]) == len(kinds) * len(grid.prefill_shapes())
    assert len(res["raw"]["prefill_offgrid"]) == len(kinds) * len(grid.off_prefill)
    out = tmp_path / "merged.yaml"
    assert moe_split.main(["merge", str(measured), str(calibrated["path"]), str(out)]) == 0
    before = load_profile(str(calibrated["path"])).models["toy-v4"]
    prof = load_profile(str(out))
    after = prof.models["toy-v4"]
    assert after.raw["prefill"] == res["raw"]["prefill"]
    assert after.raw["decode"] == before.raw["decode"]
    assert after.hardware["h200"].decode == before.hardware["h200"].decode
    assert set(after.hardware["h200"].prefill) == kinds
    assert after.hardware["h200"].prefill != before.hardware["h200"].prefill  # re-timed
    assert all(f"prefill.{k}" in after.fit for k in kinds)
    assert "prefill of toy-v4" in prof.provenance.note


def test_moe_split_rescale_carries_a_kernel_change_timed_on_another_gpu(tmp_path):
    """``rescale`` multiplies each time of the profiled GPU's file by new / base (the new and old
    kernels timed on one other GPU) at the same (experts, tokens), notes where the ratio was
    measured, and refuses files that time different shapes."""
    from deepinfer_sim.calibration import moe_split

    def measured(times: list[float], device: str) -> dict:
        rows = [[4.0, 16.0, times[0]], [8.0, 64.0, times[1]]]
        raw = {k: [list(r) for r in rows] for k in moe_split.RAW_KEYS}
        return {"grid": "tiny", "models": {"m@tp1-moetp4": {"raw": raw, "device": device}}}

    target, base = measured([2.0, 6.0], "H200"), measured([1.0, 3.0], "H100")
    new = measured([0.5, 3.0], "H100")
    paths = [tmp_path / f"{n}.json" for n in ("target", "base", "new")]
    for path, data in zip(paths, (target, base, new), strict=True):
        path.write_text(json.dumps(data))
    out = tmp_path / "out.json"
    assert moe_split.main(["rescale", *map(str, paths), "--out", str(out)]) == 0
    res = json.loads(out.read_text())["models"]["m@tp1-moetp4"]
    assert res["raw"]["moe_experts"] == [[4.0, 16.0, 1.0], [8.0, 64.0, 6.0]]
    assert res["device"] == "H200" and res["rescaled"]["device"] == "H100"
    new["models"]["m@tp1-moetp4"]["raw"]["moe"][1][1] = 128.0
    with pytest.raises(UserError, match=r"moe: \[8.0, 64.0\] is not timed in both other files"):
        moe_split.rescale(target, base, new)
    said: list[str] = []
    kept = moe_split.rescale(target, base, new, drop_missing=True, log=said.append)
    assert kept["models"]["m@tp1-moetp4"]["raw"]["moe"] == [[4.0, 16.0, 1.0]]
    assert said == ["m@tp1-moetp4: moe: 1 shapes not timed in both others left out: [[8.0, 64.0]]"]


def test_moe_split_rescale_carries_prefill_and_the_parts_all_three_timed():
    """Prefill rows (kind, tokens, prefix, seconds) rescale shape by shape like the experts';
    the others may time more shapes than the target; a part only the target timed is refused,
    and a part the target lacks is left out."""
    from deepinfer_sim.calibration import moe_split

    def measured(t: float, extra: bool = False, moe: bool = False) -> dict:
        pre = [["mla", 16.0, 0.0, t], ["mla", 16.0, 8192.0, 2 * t]]
        pre += [["mla", 64.0, 0.0, 9.0]] if extra else []
        raw = {"prefill": pre, "prefill_offgrid": [["mla", 20.0, 50.0, 3 * t]]}
        raw |= {"moe": [[4.0, 16.0, 1.0]]} if moe else {}
        return {"models": {"m@tp8": {"raw": raw}}}

    out = moe_split.rescale(measured(2.0), measured(1.0, True, True), measured(0.5, True))
    raw = out["models"]["m@tp8"]["raw"]
    assert raw == {
        "prefill": [["mla", 16.0, 0.0, 1.0], ["mla", 16.0, 8192.0, 2.0]],
        "prefill_offgrid": [["mla", 20.0, 50.0, 3.0]],
    }
    with pytest.raises(UserError, match="moe timed in the target only"):
        moe_split.rescale(measured(2.0, moe=True), measured(1.0), measured(0.5))


def test_moe_split_merge_names_a_bad_file(calibrated, tmp_path):
    from deepinfer_sim.calibration import moe_split

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"models": {"no-such-model": {"raw": {}}}}))
    out = tmp_path / "x.yaml"
    with pytest.raises(UserError, match="no-such-model"):
        moe_split.merge(json.loads(bad.read_text()), load_profile(str(calibrated["path"])), "b")
    assert moe_split.main(["merge", str(bad), str(calibrated["path"]), str(out)]) == 2
    assert not out.exists()


def test_a_tensor_parallel_slice_is_calibrated_merged_and_found_by_its_width(
    calibrated, tmp_path, one_thread
):
    """``calibrate --model MODEL@tp2`` times one GPU's slice (half the heads, half the shared
    expert) like a model of its own; merged beside the whole model's fits, a TP2 pool finds the
    slice's fits, and a slice not measured (experts split too) is refused with a message naming
    the widths that were."""
    out = tmp_path / "toy-tp2.yaml"
    args = ["calibrate", "--device", "cpu", "--model", f"{TOY}@tp2", "--kernels", "reference"]
    args += ["--grid", "tiny", "--hardware", "h200", "--name", "toy-cpu", "--out", str(out)]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "skipped" not in res.output
    merged = tmp_path / "merged.yaml"
    res = CliRunner().invoke(
        main, ["merge-profiles", str(merged), str(calibrated["path"]), str(out)]
    )
    assert res.exit_code == 0, res.output
    profile = load_profile(str(merged))
    assert set(profile.models) == {"toy-v4", "toy-v4@tp2"}
    toy = load_model(TOY)
    half = load_model(f"{TOY}@tp2")
    assert half.attention.heads == toy.attention.heads // 2
    coefs = profile.coefs(half, "h200")
    assert coefs != profile.coefs(toy, "h200")
    shape = PoolShape(ep=2, redundant_experts_per_gpu=0, tp=2)
    cost = ProfileStepCost(half, load_hardware("h200"), shape, coefs)
    assert cost.decode_step(np.array([4.0]), np.array([400.0]), 1.0) > 0
    assert cost.tp_comm_s(4, "decode") > 0
    with pytest.raises(ConfigError, match=r"at tp2-moetp2 .* measured at tp1, tp2"):
        profile.coefs(load_model(f"{TOY}@tp2-moetp2"), "h200")


def test_an_expert_tp_slice_gets_an_entry_of_its_own_and_joins_a_tp_slices_blocks(
    calibrated, tmp_path
):
    """``moe_split measure`` of ``MODEL@tp1-moetp2`` times the routed experts at half their
    width; ``merge`` gives it an entry with only those fits. A pool whose attention is one
    entry's slice and whose experts are the other's (expert TP) is costed from both; without
    the experts' entry it is refused."""
    from deepinfer_sim.calibration import moe_split

    measured = tmp_path / "moe.json"
    args = ["measure", "--out", str(measured), "--device", "cpu", "--models", f"{TOY}@tp1-moetp2"]
    args += ["--kernels", "reference", "--grid", "tiny", "--hardware", "h200"]
    assert moe_split.main(args) == 0
    out = tmp_path / "merged.yaml"
    assert moe_split.main(["merge", str(measured), str(calibrated["path"]), str(out)]) == 0
    prof = load_profile(str(out))
    entry = prof.models["toy-v4@tp1-moetp2"]
    assert entry.widths is not None and entry.widths.expert_width == 20
    assert not entry.hardware["h200"].decode and "moe" in entry.fit
    both = prof.coefs(load_model(f"{TOY}@tp1-moetp2"), "h200")
    assert both.decode == prof.models["toy-v4"].hardware["h200"].decode
    assert both.moe == entry.hardware["h200"].moe
    with pytest.raises(ConfigError, match="tp1-moetp2"):
        load_profile(str(calibrated["path"])).coefs(load_model(f"{TOY}@tp1-moetp2"), "h200")
