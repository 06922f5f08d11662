"""The DeepEP exchange bench (``kernels/deepep_bench.py``) and its fit (``calibration/ep_fit.py``),
on the CPU: shapes, byte counting, the bench loop on the stand-in exchange, the fit recovering
known constants, the overlap arithmetic, and the command lines' error paths. DeepEP itself and
the GPUs are not needed (the real run is a multi-GPU device call)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from deepinfer_sim.calibration import ep_fit
from deepinfer_sim.kernels import deepep_bench as db

SMALL = ["--ll-tokens", "1", "8", "64", "--normal-tokens", "1024", "2048", "4096"]
FAST = ["--iters", "3", "--warmup", "1"]

ROW_FIELDS = {
    "model",
    "mode",
    "tokens_per_rank",
    "world",
    "hidden",
    "top_k",
    "experts",
    "routing",
    "dispatch_s",
    "combine_s",
    "dispatch_bytes_sent",
    "combine_bytes_sent",
    "dispatch_busiest_bytes",
    "combine_busiest_bytes",
    "local_copies",
    "remote_copies",
    "copies_matrix",
    "num_sms",
}
OVERLAP_FIELDS = {
    "gemm_alone_s",
    "exchange_alone_s",
    "both_s",
    "gemm_in_both_s",
    "hidden_share",
    "gemm_slowdown",
    "sm_share",
}


def _stand_in(tmp: Path, *extra: str) -> dict:
    rc = db.main(["--stand-in", "--out", str(tmp), *SMALL, *FAST, *extra])
    assert rc == 0
    return json.loads((tmp / db.JSON_NAME).read_text())


# --- shapes -------------------------------------------------------------------------------------


def test_model_shapes_from_the_registry():
    v3 = db.model_shape("deepseek-v3")
    v41 = db.model_shape("deepseek-v4.1-flash")
    assert (v3.hidden, v3.top_k, v3.experts, v3.expert_width) == (7168, 8, 256, 2048)
    assert (v41.hidden, v41.top_k, v41.experts) == (5120, 6, 384)
    # the fallback for a GPU image without pydantic must say the same
    for name in ("deepseek-v3", "deepseek-v4.1-flash"):
        assert db._yaml_shape(name) == db.model_shape(name)


@pytest.mark.parametrize(
    ("world", "kept"),
    [
        (2, {"deepseek-v3", "deepseek-v4.1-flash"}),
        (3, {"deepseek-v4.1-flash"}),  # 256 experts over 3 ranks: no
        (5, set()),
        (6, {"deepseek-v4.1-flash"}),
        (8, {"deepseek-v3", "deepseek-v4.1-flash"}),
    ],
)
def test_models_whose_experts_do_not_divide_are_skipped_and_said(world, kept):
    shapes = [db.model_shape(m) for m in db.DEFAULT_MODELS]
    got, skipped = db.shapes_for_world(shapes, world)
    assert {s.name for s in got} == kept
    assert len(skipped) == 2 - len(kept)
    for line in skipped:
        assert f"over {world} ranks" in line and "skipped" in line


def test_gemm_stand_in_is_the_rows_a_rank_receives_over_its_local_experts():
    v3 = db.model_shape("deepseek-v3")
    g = db.gemm_shape(v3, 1024, 8, None)
    assert (g.experts, g.rows, g.k, g.n) == (32, 256, 7168, 4096)  # 1024 · 8 / 32 rows each
    assert db.gemm_shape(v3, 1, 2, 512).rows == 1  # at least one row
    assert g.flops == 2 * 32 * 256 * 7168 * 4096


# --- routing and bytes --------------------------------------------------------------------------


def test_routing_is_seeded_distinct_per_token_and_skew_concentrates():
    a = db.route(512, 64, 6, seed=7)
    assert torch.equal(a, db.route(512, 64, 6, seed=7))
    assert not torch.equal(a, db.route(512, 64, 6, seed=8))
    assert a.shape == (512, 6) and a.dtype == torch.int64
    assert all(len(set(r)) == 6 for r in a.tolist())
    uni = torch.bincount(a.flatten(), minlength=64).float()
    skew = torch.bincount(db.route(512, 64, 6, seed=7, skew=1.5).flatten(), minlength=64).float()
    assert uni.max() / uni.mean() < 1.6  # near-uniform
    assert skew[:8].sum() > 3 * uni[:8].sum()  # the low experts draw most


def test_byte_counting_against_a_hand_computed_case():
    """2 ranks, 4 experts (2 per rank), top-2, hidden 256."""
    r0 = torch.tensor([[0, 1], [1, 2], [2, 3]])  # -> ranks {0}, {0, 1}, {1}
    r1 = torch.tensor([[0, 3], [3, 2]])  # -> ranks {0, 1}, {1}
    per_copy = db.copies_matrix([r0, r1], 4, 2, dedup=False)
    per_rank = db.copies_matrix([r0, r1], 4, 2, dedup=True)
    assert per_copy.tolist() == [[3, 3], [1, 3]]
    assert per_rank.tolist() == [[2, 2], [1, 2]]
    assert db.fp8_row_bytes(256) == 256 + 2 * 4 and db.bf16_row_bytes(256) == 512
    d = db.exchange_bytes(per_copy, 264)
    assert d.sent == [3 * 264, 1 * 264] and d.received == [1 * 264, 3 * 264]
    assert d.busiest == 792
    c = db.exchange_bytes(per_copy, 512, reverse=True)  # the combine sends back what came in
    assert c.sent == [512, 3 * 512] and c.busiest == 1536
    shape = db.ModelShape("toy", 256, 2, 4, 64)
    case = db.Case("low_latency", shape, 3, r0, per_copy, None)
    row = db.make_row(case, [{"dispatch_s": 1e-5, "combine_s": 2e-5}, {"dispatch_s": 3e-5}], 2, 20)
    assert row["local_copies"] == 3.0 and row["remote_copies"] == 2.0
    assert row["dispatch_bytes_sent"] == (792 + 264) / 2
    assert row["dispatch_busiest_bytes"] == 792 and row["combine_busiest_bytes"] == 1536
    assert row["dispatch_s"] == 3e-5  # the slowest rank's
    assert row["dispatch_s_ranks"] == [1e-5, 3e-5]


# --- overlap arithmetic -------------------------------------------------------------------------


def test_overlap_arithmetic_both_regimes_and_clipping():
    # the GEMM (10) outlasts the exchange (4); at share 0.25 it ends at 10 + 0.25 · 4 = 11
    d = db.overlap_derived(10.0, 4.0, 11.0, 11.0)
    assert d["hidden_share"] == pytest.approx(0.75)
    assert d["gemm_slowdown"] == pytest.approx(1.1)
    assert d["sm_share"] == pytest.approx(0.25)
    # the GEMM (2) ends inside the exchange (10): at share 0.5 it takes 4
    d = db.overlap_derived(2.0, 10.0, 10.0, 4.0)
    assert d["hidden_share"] == pytest.approx(0.2)
    assert d["sm_share"] == pytest.approx(0.5)
    # slower together than in turn: nothing hidden (clipped at 0); faster than the longer: 1
    assert db.overlap_derived(2.0, 10.0, 13.0, 13.0)["hidden_share"] == 0.0
    assert db.overlap_derived(10.0, 4.0, 9.0, 9.0)["hidden_share"] == 1.0


def test_stand_in_concurrency_inverts_to_its_own_sm_share():
    params = db.StandInParams(noise=0.0, sm_share={"low_latency": 0.0, "normal": 0.2})
    ex = db.StandInExchange(2, params)
    ex.begin_mode("normal", [], 1)
    for g_t, x_t in ((10.0, 4.0), (1.0, 10.0)):
        both, x_end, g_end = ex.concurrent(lambda x=x_t: _adv(ex, x), lambda g=g_t: _adv(ex, g))
        d = db.overlap_derived(g_t, x_t, both, g_end)
        assert x_end == x_t
        assert d["sm_share"] == pytest.approx(0.2)


def _adv(ex: db.StandInExchange, dt: float) -> None:
    ex.now += dt


# --- the bench loop on the stand-in -------------------------------------------------------------


def test_stand_in_bench_writes_every_required_field(tmp_path):
    data = _stand_in(tmp_path, "--world", "2", "--skew", "1")
    for key in ("device", "world", "deep_ep", "torch", "nccl", "date", "rows", "skipped"):
        assert key in data
    assert data["world"] == 2 and data["errors"] == []
    rows = data["rows"]
    # 2 models × 2 routings × (3 normal + 3 low-latency sizes)
    assert len(rows) == 2 * 2 * 6
    assert {r["routing"] for r in rows} == {"uniform", "skew1"}
    for r in rows:
        assert set(r) >= ROW_FIELDS | OVERLAP_FIELDS, sorted(ROW_FIELDS | OVERLAP_FIELDS - set(r))
        assert r["dispatch_s"] > 0 and r["combine_s"] > 0
        assert 0 <= r["hidden_share"] <= 1
        assert (r["num_sms"] == 20) == (r["mode"] == "normal")
        m = np.array(r["copies_matrix"])
        assert m.shape == (2, 2)
        # per (token, expert) copy in low-latency mode, per (token, rank) in normal mode
        per_rank_tokens = m.sum(axis=1)
        if r["mode"] == "low_latency":
            assert (per_rank_tokens == r["tokens_per_rank"] * r["top_k"]).all()
        else:
            assert (per_rank_tokens <= 2 * r["tokens_per_rank"]).all()
            assert (per_rank_tokens >= r["tokens_per_rank"]).all()
        b = db.exchange_bytes(m, db.fp8_row_bytes(r["hidden"]))
        assert r["dispatch_busiest_bytes"] == b.busiest
    assert "deepseek-v3" in db.table(data)[2]


def test_stand_in_skips_models_that_do_not_divide(tmp_path):
    data = _stand_in(tmp_path, "--world", "3", "--no-overlap", "--modes", "low_latency")
    assert {r["model"] for r in data["rows"]} == {"deepseek-v4.1-flash"}
    assert any("deepseek-v3" in s and "3 ranks" in s for s in data["skipped"])
    assert not any("both_s" in r for r in data["rows"])


# --- the fit ------------------------------------------------------------------------------------


def test_fit_recovers_known_latency_and_bandwidth(tmp_path, capsys):
    lat, bw = (6e-6, 30e-6), (1.8e11, 3.6e11)
    _stand_in(
        tmp_path,
        "--world",
        "4",
        "--stand-in-latency",
        str(lat[0]),
        str(lat[1]),
        "--stand-in-bandwidth",
        str(bw[0]),
        str(bw[1]),
        "--stand-in-noise",
        "0.01",
        "--ll-tokens",
        "1",
        "4",
        "16",
        "64",
        "256",
    )
    capsys.readouterr()
    res = ep_fit.fit_files([tmp_path / db.JSON_NAME], "h200")
    for mode, lat_true, bw_true in (("low_latency", lat[0], bw[0]), ("normal", lat[1], bw[1])):
        m = res["modes"][mode]
        for name in ("dispatch", "combine", "joint"):
            assert m[name]["latency_s"] == pytest.approx(lat_true, rel=0.1), (mode, name)
            assert m[name]["bandwidth_bytes_per_s"] == pytest.approx(bw_true, rel=0.03)
            assert m[name]["efficiency"] == pytest.approx(bw_true / 4.5e11, rel=0.03)
            h = m["held_out"][name]
            assert h is not None and h["within_bar"] and h["max_abs_pct"] < 3
        assert m["overlap"]["sm_share_median"] == pytest.approx(
            {"low_latency": 0.05, "normal": 0.15}[mode], abs=0.05
        )
    p = res["all_to_all_params"]
    assert p["low_latency_scaleup_efficiency"] == pytest.approx(bw[0] / 4.5e11, rel=0.03)
    assert p["normal_scaleup_efficiency"] == pytest.approx(bw[1] / 4.5e11, rel=0.03)
    assert p["latency_s"] == pytest.approx(lat[0], rel=0.1)
    assert res["sources"][0]["stand_in"] is True


def test_held_out_check_fails_data_that_is_not_a_line():
    x = np.geomspace(1e4, 1e8, 9)
    t = 1e-5 * np.sqrt(x / 1e4)  # time ∝ √bytes: no latency + bytes / bandwidth fits it
    pts = [
        ep_fit.Point("dispatch", int(2**i), float(b), float(s))
        for i, (b, s) in enumerate(zip(x, t, strict=True))
    ]
    h = ep_fit.held_out(pts)
    assert h is not None and not h["within_bar"] and h["max_abs_pct"] > 10
    assert h["train_tokens"] == [1, 4, 16, 64, 256] and h["test_tokens"] == [2, 8, 32, 128]
    # and an exact line passes with no error
    line = ep_fit.fit_line(x, 5e-6 + x / 2e11)
    assert line.latency_s == pytest.approx(5e-6) and line.bandwidth == pytest.approx(2e11)
    assert line.max_rel_err_pct < 1e-6


def test_fit_cli_prints_and_writes_json(tmp_path, capsys):
    _stand_in(tmp_path, "--world", "2")
    out = tmp_path / "fit.json"
    assert ep_fit.main([str(tmp_path / db.JSON_NAME), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "AllToAllParams:" in text and "STAND-IN" in text
    res = json.loads(out.read_text())
    assert set(res["modes"]) == {"low_latency", "normal"}
    assert res["sources"][0]["file"] == str(tmp_path / db.JSON_NAME)


# --- error paths --------------------------------------------------------------------------------


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err
    return lines[0]


def test_bench_without_deep_ep_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(db, "_deep_ep_import_error", lambda: "ModuleNotFoundError: no deep_ep")
    monkeypatch.setattr(db, "_gpu_count", lambda: 8)
    assert db.main(["--out", str(tmp_path), "--world", "2"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "deep_ep is not importable" in line and "--stand-in" in line
    assert not (tmp_path / db.JSON_NAME).exists()


def test_bench_without_gpus_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(db, "_deep_ep_import_error", lambda: None)
    monkeypatch.setattr(db, "_gpu_count", lambda: 1)
    assert db.main(["--out", str(tmp_path), "--world", "2"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "1 CUDA device(s)" in line and "2 GPUs" in line


def test_bench_cli_here_refuses_without_stand_in(tmp_path):
    """The real command on this machine (no DeepEP, no GPU): exit 2, one line, no traceback."""
    res = subprocess.run(
        [sys.executable, "-m", "deepinfer_sim.kernels.deepep_bench", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    _one_error_line(res.stderr)


def test_fit_on_a_missing_file(tmp_path, capsys):
    assert ep_fit.main([str(tmp_path / "nope.json")]) == 2
    assert "no file" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"device": "x", "rows": []}', "no low_latency rows"),
        ('{"device": "x"}', "no 'rows' list"),
        ('{"rows": [', "not JSON"),
        ('{"rows": [{"mode": "normal"}]}', "row 0 lacks"),
    ],
)
def test_fit_on_bad_files(tmp_path, capsys, content, says):
    f = tmp_path / "b.json"
    f.write_text(content)
    assert ep_fit.main([str(f)]) == 2
    assert says in _one_error_line(capsys.readouterr().err)


def test_fit_of_one_mode_needs_only_its_rows(tmp_path, capsys):
    _stand_in(tmp_path, "--world", "2", "--modes", "normal", "--no-overlap")
    path = str(tmp_path / db.JSON_NAME)
    assert ep_fit.main([path]) == 2
    assert "no low_latency rows" in _one_error_line(capsys.readouterr().err)
    assert ep_fit.main([path, "--modes", "normal"]) == 0
    assert "normal_scaleup_efficiency" in capsys.readouterr().out


class _Refusing(db.StandInExchange):
    """A stand-in that refuses like DeepEP does: one model's dispatch, normal mode at 3 ranks,
    and its buffer teardown."""

    def supports(self, mode):
        return "not at 3 ranks" if mode == "normal" else None

    def prepare(self, case):
        if case.shape.name == "deepseek-v4.1-flash":
            raise AssertionError("Unsupported number of EP ranks: 1")
        super().prepare(case)

    def end_mode(self):
        raise RuntimeError("teardown\nfailed")


def test_refusals_are_recorded_and_the_rest_runs(tmp_path):
    shapes = [db.model_shape(m) for m in db.DEFAULT_MODELS]
    cfg = db.BenchConfig(ll_tokens=(1, 8), iters=2, warmup=0, overlap=False)
    res = db.run_bench(_Refusing(2), cfg, tmp_path, shapes=shapes, log=lambda _: None)
    assert {r["model"] for r in res["rows"]} == {"deepseek-v3"}
    assert {r["mode"] for r in res["rows"]} == {"low_latency"}
    assert "normal: not at 3 ranks" in res["skipped"]
    errs = {(e["mode"], e.get("model"), e["step"]): e["error"] for e in res["errors"]}
    assert errs[("low_latency", "deepseek-v4.1-flash", "uniform T=1")] == (
        "AssertionError: Unsupported number of EP ranks: 1"
    )
    assert errs[("low_latency", None, "end")] == "RuntimeError: teardown failed"
    on_disk = json.loads((tmp_path / db.JSON_NAME).read_text())
    assert on_disk["errors"] == res["errors"] and len(on_disk["rows"]) == 2
    cfg.keep_going = False
    with pytest.raises(AssertionError):
        db.run_bench(_Refusing(2), cfg, None, shapes=shapes[::-1], log=lambda _: None)


def test_the_model_files_stand_in_for_a_registry_that_does_not_import(monkeypatch):
    want = db.model_shape("deepseek-v3")
    monkeypatch.setitem(sys.modules, "deepinfer_sim.models.registry", None)  # import fails
    assert db.model_shape("deepseek-v3") == want
    with pytest.raises(ImportError):
        db.model_shape("no-such-model")
