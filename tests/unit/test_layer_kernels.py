"""``calibration/layer_kernels.py``: the kernels of one attention block's decode step, listed
with their calls and time — its plumbing on the CPU (the operators the emulated block runs)."""

from __future__ import annotations

import json
from pathlib import Path

from deepinfer_sim.calibration import layer_kernels


def test_the_cpu_lists_the_blocks_operators_per_batch(tmp_path: Path) -> None:
    out = tmp_path / "kernels.json"
    args = ["--model", "deepseek-v3@tp8", "--device", "cpu", "--hardware", "h200"]
    args += ["--batch", "1,3", "--context", "128", "--out", str(out)]
    assert layer_kernels.main(args) == 0
    res = json.loads(out.read_text())
    assert res["model"] == "deepseek-v3@tp8" and res["kind"] == "mla" and res["device"] == "cpu"
    assert [s["batch"] for s in res["steps"]] == [1, 3]
    for step in res["steps"]:
        rows = step["kernels"]
        assert rows and step["launches"] == sum(r["calls"] for r in rows)
        assert step["timed_us"] > 0
        assert step["us"] > 0 and [r["us"] for r in rows] == sorted(
            (r["us"] for r in rows), reverse=True
        )
        assert any("mm" in r["name"] for r in rows)  # the projections ran


def test_bad_batches_and_kinds_are_one_clear_error(tmp_path: Path, capsys) -> None:
    out = str(tmp_path / "k.json")
    assert layer_kernels.main(["--device", "cpu", "--batch", "0", "--out", out]) == 2
    assert "--batch '0'" in capsys.readouterr().err
    args = ["--device", "cpu", "--hardware", "h200", "--kind", "csa", "--out", out]
    assert layer_kernels.main(args) == 2
    assert "--kind csa: deepseek-v3 has mla" in capsys.readouterr().err
