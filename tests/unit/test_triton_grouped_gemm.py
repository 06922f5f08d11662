"""The Triton grouped GEMM's plumbing on the CPU (``kernels/triton_grouped_gemm.py``) and the
TP kernel benchmark's cases (``kernels/tp_kernel_bench.py``); the kernel itself on a GPU.

The program map must hand every row to exactly one program of its own expert, in order, with no
program reading past its expert's rows — whatever the split (empty experts, one row, many); the
reference is the function the kernel and ``torch._scaled_grouped_mm`` both compute.
"""

from __future__ import annotations

import json

import pytest
import torch

from deepinfer_sim.kernels import tp_kernel_bench
from deepinfer_sim.kernels.triton_grouped_gemm import (
    block_m_for,
    block_map,
    grouped_fp8_gemm,
    grouped_reference,
)


@pytest.mark.parametrize(
    "rows_per_expert",
    [[3, 0, 37, 1], [0, 0, 5], [16, 16], [1], [200, 0, 0, 33, 64], [0, 0, 0, 7]],
)
@pytest.mark.parametrize("block_m", [16, 64])
def test_every_row_belongs_to_one_program_of_its_expert(rows_per_expert, block_m):
    offs = torch.tensor(rows_per_expert).cumsum(0).to(torch.int32)
    m = int(offs[-1])
    expert, first = block_map(offs, m, block_m)
    seen = []
    for e, f in zip(expert.tolist(), first.tolist(), strict=True):
        if e < 0:
            continue
        start = int(offs[e - 1]) if e else 0
        end = int(offs[e])
        assert start <= f < end  # a program starts inside its expert's rows
        seen.extend(range(f, min(f + block_m, end)))
    assert seen == list(range(m))
    assert len(expert) >= sum(-(-r // block_m) for r in rows_per_expert)


def test_block_m_follows_rows_per_expert():
    assert [block_m_for(r, 8) for r in (8, 128, 256, 512, 1024, 100_000)] == [
        16, 16, 32, 64, 128, 128,
    ]  # fmt: skip


def test_the_reference_is_each_experts_scaled_matmul():
    gen = torch.Generator().manual_seed(0)
    aq = torch.randn((10, 32), generator=gen)
    a_s = torch.rand(10, generator=gen) + 0.5
    wq = torch.randn((3, 8, 32), generator=gen)
    ws = torch.rand((3, 8), generator=gen) + 0.5
    offs = torch.tensor([4, 4, 10], dtype=torch.int32)
    got = grouped_reference(aq, a_s, wq, ws, offs).float()
    a = aq * a_s[:, None]
    want = torch.cat([a[:4] @ (wq[0] * ws[0][:, None]).t(), a[4:] @ (wq[2] * ws[2][:, None]).t()])
    torch.testing.assert_close(got, want.to(torch.bfloat16).float())


def test_shapes_that_disagree_are_refused():
    with pytest.raises(ValueError, match="do not agree"):
        grouped_fp8_gemm(
            torch.zeros(4, 32), torch.zeros(4), torch.zeros(2, 8, 16), torch.zeros(2, 8),
            torch.tensor([2, 4], dtype=torch.int32),
        )  # fmt: skip


def test_the_tp_kernel_bench_lists_its_cases(capsys):
    """The GPU benchmark's plumbing on the CPU: every model's gate-up and down GEMMs at each
    expert-TP width, and V3's prefill attention and its split form's merge at each TP slice's
    heads."""
    assert tp_kernel_bench.main(["--dry-run"]) == 0
    cases = json.loads(capsys.readouterr().out)
    widths = {(c["model"], c["moe_tp"], c["gemm"]): (c["n"], c["k"]) for c in cases["moe"]}
    assert widths[("deepseek-v3", 8, "gate_up")] == (512, 7168)
    assert widths[("deepseek-v3", 8, "down")] == (7168, 256)
    assert widths[("deepseek-v4.1-flash", 2, "down")] == (5120, 1152)
    assert {c["heads"] for c in cases["attention"]} == {16, 32, 128}
    assert {(c["top_k"], c["hidden"]) for c in cases["combine"]} == {(8, 7168)}
    assert {(c["heads"], c["d_v"]) for c in cases["merge"]} == {(16, 128), (32, 128), (128, 128)}


@pytest.mark.gpu
def test_the_kernel_equals_the_reference_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device with FP8 (kernels/tp_kernel_bench.py runs it there)")
    case = {"experts": 8, "m": 48, "n": 512, "k": 1024, "model": "-", "moe_tp": 1, "gemm": "-"}
    row = tp_kernel_bench.time_moe(case)
    assert row["triton_err"] < 0.01, row


def test_the_tp_kernel_bench_scores_every_kernel_and_names_the_one_that_fails():
    """The benchmark's timing loop on the CPU (a stand-in timer): each kernel's relative error
    against the reference (of its output's view) and time in µs, and a kernel that cannot run
    the shape is said and the others go on."""
    ref = torch.ones(4)

    def broken() -> torch.Tensor:
        raise RuntimeError("no kernel for this shape")

    kernels = (("exact", lambda: torch.ones(6)), ("broken", broken), ("off", lambda: 2 * ref))
    row = tp_kernel_bench._time_kernels(
        {"case": 1}, kernels, ref, view=lambda out: out[:4], bench=lambda fn, **kw: 0.25
    )
    assert row["case"] == 1
    assert row["exact_err"] == 0.0 and row["exact_us"] == 250.0
    assert row["broken_error"] == "RuntimeError: no kernel for this shape"
    assert "broken_us" not in row
    assert row["off_err"] == pytest.approx(1.0)
