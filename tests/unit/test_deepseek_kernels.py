"""The ``deepseek`` kernel backend on the CPU: FlashMLA's layouts and index conventions, checked
through its torch emulation, and every block against an independent computation.

With ``fp8=False`` a deepseek block keeps its activations and caches unrounded (the caches keep
exact values beside their FP8 bytes), so it must compute the reference backend's function to
float precision: that checks every index the blocks build for FlashMLA — window positions in the
ring pages, compressed-entry pages, the indexer's selection, causal verify tokens, prefix
chunks. With ``fp8=True`` the same blocks run on FP8 caches and activations and stay within the
FP8 noise of the reference. On the GPU ``kernels/deepseek_check.py`` compares the emulation with
the real kernels.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from deepinfer_sim.kernels._util import rel_err  # noqa: E402
from deepinfer_sim.kernels.backend import get_backend  # noqa: E402
from deepinfer_sim.kernels.deepseek import fp8, layout  # noqa: E402
from deepinfer_sim.kernels.deepseek.v4 import DSDecodePlan  # noqa: E402
from deepinfer_sim.kernels.engine import EngineCore  # noqa: E402
from deepinfer_sim.kernels.shapes import LayerShape  # noqa: E402

SHAPE = LayerShape.toy()
MLA = LayerShape.toy(heads=4, head_dim=40, kv_lora=32, rope_dim=8, qk_nope=16, v_head=16)
F64 = torch.float64


def test_model1_layout_matches_flashmla_bytes():
    """FlashMLA's MODEL1 numbers: 448 FP8 + 64 bf16 values, 7 scale bytes + 1 pad = 584 bytes a
    token; a page's token data first, then its scales; pages padded to 576 bytes."""
    lay = layout.Model1Layout.flashmla()
    assert (lay.d_nope, lay.tiles, lay.bytes_per_token) == (448, 7, 584)
    cache = layout.Model1Cache(lay, 3, 64, torch.device("cpu"))
    assert cache.stride % 576 == 0 and cache.stride >= 64 * 584
    view = cache.kernel_view()
    assert view.shape == (3, 64, 1, 584) and view.stride()[:2] == (cache.stride, 584)
    x = torch.randn(1, 512)
    cache.write(torch.tensor([64 + 5]), x)  # page 1, token 5
    raw = cache.buf[1]
    data, scales = layout.quantize(x, lay)
    assert torch.equal(raw[5 * 576 : 6 * 576], data[0])
    assert torch.equal(raw[64 * 576 + 5 * 8 : 64 * 576 + 6 * 8], scales[0])
    back = cache.read(torch.tensor([69]), torch.float32)
    assert rel_err(back, x) < 0.04  # e4m3 with power-of-two tile scales
    assert torch.equal(back[0, 448:], x[0, 448:].to(torch.bfloat16).float())  # rope kept in bf16


def test_quantize_rows_fuses_norm_swiglu_groups_and_pads():
    x = torch.randn(5, 24)
    w = torch.rand(12) + 0.5
    q, s, out = fp8.quantize_rows(x[:, :12], norm_weight=w, want_bf16=True)
    assert q.shape == (1, 16, 12) and s.shape == (1, 16)
    ref = x[:, :12] * torch.rsqrt(x[:, :12].pow(2).mean(-1, keepdim=True) + 1e-6) * w
    assert rel_err(q[0, :5].float() * s[0, :5, None], ref) < 0.05
    assert out is not None and rel_err(out[0, :5].float(), ref) < 1e-2
    assert torch.all(q[0, 5:].float() == 0) and torch.all(s[0, 5:] == 1)
    q, s, _ = fp8.quantize_rows(x, silu=True)
    swi = torch.nn.functional.silu(x[:, :12]) * x[:, 12:]
    assert rel_err(q[0, :5].float() * s[0, :5, None], swi) < 0.05
    q, s, _ = fp8.quantize_rows(x, groups=3)
    assert q.shape == (3, 16, 8)
    for g in range(3):
        assert rel_err(q[g, :5].float() * s[g, :5, None], x[:, 8 * g : 8 * g + 8]) < 0.05


def _pools(blocks, n_seqs=2, max_tokens=256):
    pools = [b.new_pool(4, max_tokens) for b in blocks]
    for p in pools:
        for s in range(n_seqs):
            p.alloc(s)
    return pools


STEPS = [
    ("prefill", 0, 37),
    ("prefill", 0, 21),
    ("prefill", 1, 50),
    ("prefill", 1, 3),
    ("decode", 1),
    ("decode", 3),
    ("decode", 2),
]


def _replay(block, pool, gen):
    """Prefill chunks (new and continued, crossing window and compression boundaries), then
    decode steps with 1–3 verify tokens; returns every output's contribution y − x."""
    outs = []
    for step in STEPS:
        if step[0] == "prefill":
            x = torch.randn((step[2], SHAPE.hidden), generator=gen)
            outs.append(block.prefill(x, pool, step[1]) - x)
        else:
            x = torch.randn((2, step[1], SHAPE.hidden), generator=gen)
            outs.append(block.decode(x, pool, [0, 1]) - x)
    return outs


@pytest.mark.parametrize("kind", ["swa", "csa", "hca"])
def test_v4_block_unrounded_equals_the_reference(kind):
    ds = get_backend("deepseek").attention_block(SHAPE, kind, "cpu", False, seed=1)
    ref = get_backend("reference").attention_block(SHAPE, kind, "cpu", False, seed=1)
    pd, pr = _pools([ds, ref])
    a = _replay(ds, pd, torch.Generator().manual_seed(0))
    b = _replay(ref, pr, torch.Generator().manual_seed(0))
    for x, y in zip(a, b, strict=True):
        assert rel_err(x, y) < 1e-5
    assert np.array_equal(pd.lengths, pr.lengths)


@pytest.mark.parametrize("kind", ["swa", "csa", "hca"])
def test_v4_block_fp8_stays_within_fp8_noise(kind):
    ds = get_backend("deepseek").attention_block(SHAPE, kind, "cpu", True, seed=1)
    ref = get_backend("reference").attention_block(SHAPE, kind, "cpu", True, seed=1)
    pd, pr = _pools([ds, ref])
    a = _replay(ds, pd, torch.Generator().manual_seed(0))
    b = _replay(ref, pr, torch.Generator().manual_seed(0))
    err = rel_err(torch.cat([x.reshape(-1) for x in a]), torch.cat([y.reshape(-1) for y in b]))
    assert 1e-3 < err < 0.12  # FP8 caches and activations: rounded, but the same function


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.to(F64)


def ref_mla(b, x):
    """MLA in its MHA form, float64, causal over the whole sequence, + the shared expert."""
    s = b.shape
    H, nope, rope, vh, lat = s.heads, s.qk_nope, s.rope_dim, s.v_head, s.kv_lora
    x = x.to(F64)
    n = x.shape[0]
    h = _rms(x, b.attn_norm)
    q = (_rms(h @ b.wq_a.to(F64).T, b.q_norm) @ b.wq_b.to(F64).T).view(n, H, nope + rope)
    kv = h @ b.wkv_a.to(F64).T
    kvb = (_rms(kv[:, :lat], b.kv_norm) @ b.wkv_b.to(F64).T).view(n, H, nope + vh)
    k = torch.cat([kvb[..., :nope], kv[:, lat:].view(n, 1, rope).expand(n, H, rope)], -1)
    sc = torch.einsum("thd,shd->hts", q, k) * b.scale
    sc = sc.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    o = torch.einsum("hts,shd->thd", sc.softmax(-1), kvb[..., nope:]).reshape(n, -1)
    y = x + o @ b.wo.to(F64).T
    gu = _rms(y, b.ffn_norm) @ b.w_gate_up.to(F64).T
    f = s.shared_width
    return y + (torch.nn.functional.silu(gu[:, :f]) * gu[:, f:]) @ b.w_dn.to(F64).T


@pytest.mark.parametrize(("fp8_mode", "tol"), [(False, 1e-5), (True, 0.12)])
def test_mla_block_absorbed_decode_and_mha_prefill_equal_mla(fp8_mode, tol):
    """Prefill chunks (MHA form, end-aligned causal) then decode steps (absorbed form over the
    paged latent cache, causal over the verify tokens) give the MLA of the whole sequence."""
    b = get_backend("deepseek").attention_block(MLA, "mla", "cpu", fp8_mode, seed=2)
    pool = b.new_pool(3, 200)
    pool.alloc(0)
    g = torch.Generator().manual_seed(1)
    xs, outs = [], []
    for n in (37, 21):
        x = torch.randn((n, MLA.hidden), generator=g)
        xs.append(x)
        outs.append(b.prefill(x, pool, 0))
    for v in (1, 3, 2):
        x = torch.randn((1, v, MLA.hidden), generator=g)
        xs.append(x[0])
        outs.append(b.decode(x, pool, [0])[0])
    X, Y = torch.cat(xs), torch.cat(outs)
    assert rel_err(Y - X, ref_mla(b, X) - X.to(F64)) < tol
    assert pool.lengths[0] == 64


def test_decode_plans_of_one_step_share_their_device_tensors():
    blocks = [
        get_backend("deepseek").attention_block(SHAPE, k, "cpu", True, seed=i)
        for i, k in enumerate(("csa", "hca"))
    ]
    pools = _pools(blocks)
    for p in pools:
        p.fill_random(0, 100)
        p.fill_random(1, 30)
    first = blocks[0].plan_decode(pools[0], [0, 1], 2)
    second = blocks[1].plan_decode(pools[1], [0, 1], 2, share=first)
    assert second.slots_t is first.slots_t and second.lengths_t is first.lengths_t
    assert first.entry_cap == {SHAPE.csa_compression: 64}
    assert second.graph_key == (SHAPE.hca_compression, 64)
    pools[0].fill_random(1, 77)
    first.update(pools[0], np.array([1, 0]))
    assert first.lengths_t.tolist() == [77, 100] and second.lengths_t.tolist() == [77, 100]
    with pytest.raises(ValueError):
        first.update(pools[0], np.array([0]))
    assert isinstance(first, DSDecodePlan)


def test_mla_plans_of_one_step_share_flashmlas_scheduler_metadata(monkeypatch):
    """V3's layers of one decode step share FlashMLA's scheduler metadata, as the V4 blocks'
    do: the step's first layer makes it, the others reuse it (engines compute it once per
    step); a plan of another step starts afresh. FlashMLA stands in, counting what it makes."""
    from deepinfer_sim.kernels.deepseek import flashmla

    made = []

    class FakeFlashMLA:
        @staticmethod
        def get_mla_metadata():
            made.append(object())
            return made[-1], None

        @staticmethod
        def flash_mla_with_kvcache(q, kcache, table, seqlens, d_v, meta, *_, **__):
            assert meta is made[-1]
            return q.new_zeros((*q.shape[:3], d_v)), None

    monkeypatch.setattr(flashmla, "_use_kernel", lambda *a: True)
    monkeypatch.setattr(flashmla, "_module", lambda: FakeFlashMLA)
    blocks = [
        get_backend("deepseek").attention_block(MLA, "mla", "cpu", False, seed=i) for i in range(3)
    ]
    pools = [b.new_pool(2, 200) for b in blocks]
    for p in pools:
        p.alloc(0)
        p.fill_random(0, 70)
    x = torch.randn((1, 1, MLA.hidden), generator=torch.Generator().manual_seed(3))
    first = blocks[0].plan_decode(pools[0], [0], 1)
    rest = zip(blocks[1:], pools[1:], strict=True)
    plans = [first] + [b.plan_decode(p, [0], 1, share=first) for b, p in rest]
    assert all(p.sched is first.sched for p in plans)
    for b, p, plan in zip(blocks, pools, plans, strict=True):
        b.decode(x, p, plan)
    step_state = [("mla_indices", pools[0].pages_per_seq, first.page_cap), ("mla", first.page_cap)]
    assert len(made) == 1 and list(first.sched) == step_state  # the cache rows, pages, lengths too
    blocks[0].decode(x, pools[0], blocks[0].plan_decode(pools[0], [0], 1))  # the next step
    assert len(made) == 2


def test_mla_fused_decode_step_equals_the_unfused_block(monkeypatch):
    """V3's decode-only step as engines run it (the new latents normalized and written in one
    kernel, the step's indices made once, W_UV writing the rows in place) gives the block's old
    path's outputs and cache bit for bit (DEEPINFER_MLA_FUSED=0 is that path)."""
    from deepinfer_sim.kernels.deepseek import fused

    def step(fused_env: str):
        monkeypatch.setenv("DEEPINFER_MLA_FUSED", fused_env)
        b = get_backend("deepseek").attention_block(MLA, "mla", "cpu", False, seed=4)
        pool = b.new_pool(3, 200)
        for slot, n in ((0, 70), (1, 33)):
            pool.alloc(slot)
            pool.fill_random(slot, n)
        g = torch.Generator().manual_seed(5)
        outs = [
            b.decode(torch.randn((2, v, MLA.hidden), generator=g), pool, [0, 1]) for v in (1, 3)
        ]
        return outs, pool.rows.clone()

    fused.used.clear()
    new_out, new_rows = step("1")
    assert "torch.mla_latent_write" in fused.used
    old_out, old_rows = step("0")
    assert all(torch.equal(a, b) for a, b in zip(new_out, old_out, strict=True))
    assert torch.equal(new_rows, old_rows)


def test_engine_core_runs_on_the_deepseek_backend():
    eng = EngineCore(
        SHAPE,
        [("csa", True), ("hca", True), ("csa", False)],
        device="cpu",
        fp8=True,
        max_seqs=4,
        max_tokens=128,
        prefill_token_budget=32,
        max_decode_batch=3,
        backend="deepseek",
        seed=3,
    )
    res = eng.run([(0.0, 30, 5), (0.0, 7, 2), (0.0, 50, 4), (0.0, 12, 3)])
    assert res.requests["done_s"].notna().all()
    assert int(res.requests["generated"].sum()) == 5 + 2 + 4 + 3
    with pytest.raises(ValueError, match="CUDA-graph"):
        EngineCore(SHAPE, device="cpu", backend="deepseek", graphs=True)


def test_the_gpu_check_runs_its_plumbing_on_the_cpu(tmp_path):
    """``deepseek_check --toy --device cpu``: every check runs (kernels emulated, GPU-only ones
    skipped with a reason) and the JSON report is written."""
    import json

    from deepinfer_sim.kernels import deepseek_check

    assert deepseek_check.main(["--out", str(tmp_path), "--toy", "--device", "cpu"]) == 0
    report = json.loads((tmp_path / "deepseek_check.json").read_text())
    names = {r["name"] for r in report["results"]}
    assert {"block csa", "block mla", "fused decode kernels (Triton vs torch)"} <= names
    assert all(r["ok"] for r in report["results"])


@pytest.mark.gpu
def test_the_gpu_check_passes_on_a_gpu(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip(
            "needs a CUDA device (kernels/deepseek_check.py runs in calibration/device_run.sh)"
        )
    from deepinfer_sim.kernels import deepseek_check

    assert deepseek_check.main(["--out", str(tmp_path)]) == 0


def test_deepgemm_moe_bench_lists_its_decode_shapes(capsys):
    """The GPU benchmark's plumbing on the CPU: the gate-up and down GEMMs of each model's
    experts at every (experts, rows) point, with the model's own widths."""
    from deepinfer_sim.kernels import deepgemm_moe_bench as bench

    cases = bench.shapes(("deepseek-v3",))
    assert len(cases) == 2 * len(bench.EXPERTS) * len(bench.ROWS)
    gate_up = next(c for c in cases if c["gemm"] == "gate_up")
    assert (gate_up["n"], gate_up["k"]) == (2 * 2048, 7168)
    down = next(c for c in cases if c["gemm"] == "down")
    assert (down["n"], down["k"]) == (7168, 2048)
    assert bench.main(["--dry-run", "--models", "deepseek-v3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(cases)


def test_deepgemm_sms_bench_lists_v3_prefill_shapes_and_its_rule(capsys):
    """The SM-count benchmark's plumbing on the CPU: V3's prefill projections at DeepGEMM's own
    V3 shapes (its README's table), the experts' two grouped GEMMs, the slow-down beside the
    reserved-SMs rule 1 / (1 - held / SMs), and --held refused unless it starts at 0."""
    from deepinfer_sim.kernels import deepgemm_sms_bench as bench

    dense = {(n, k) for _, n, k in bench.dense_shapes("deepseek-v3")}
    assert dense == {
        (2112, 7168),
        (24576, 1536),
        (32768, 512),
        (7168, 16384),
        (4096, 7168),
        (7168, 2048),
    }
    cases = bench.shapes(("deepseek-v3",))
    assert len(cases) == 6 * len(bench.TOKENS) + 2 * len(bench.EXPERT_ROWS)
    grouped = [c for c in cases if c["kind"] == "grouped"]
    assert {(c["n"], c["k"]) for c in grouped} == {(4096, 7168), (7168, 2048)}
    assert all(c["experts"] == bench.LOCAL_EXPERTS for c in grouped)
    rows = bench.slowdowns({0: 1.0, 20: 1.15, 24: 1.25}, 132)
    assert rows["20"] == {"measured": 1.15, "rule": pytest.approx(132 / 112)}
    assert rows["24"]["rule"] == pytest.approx(132 / 108) and "0" not in rows
    assert bench.main(["--dry-run"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(cases)
    with pytest.raises(SystemExit):
        bench.main(["--dry-run", "--held", "20,24"])
    # the cuBLAS path's FP8 product, one GEMM per expert, on the CPU
    import torch

    a = torch.randn(2, 32, 128, dtype=torch.bfloat16)
    b = torch.randn(2, 64, 128, dtype=torch.bfloat16) / 128**0.5
    d = torch.empty(2, 32, 64, dtype=torch.bfloat16)
    bench._cublas_call({"kind": "grouped", "m": 32, "n": 64, "k": 128}, a, b, d)()
    assert rel_err(d, torch.einsum("gmk,gnk->gmn", a, b)) < 0.06


def test_benchmarks_time_every_case_and_keep_the_failing_ones(tmp_path, capsys):
    """``time_cases``: one failing shape is recorded with its error and the exit code says so,
    the others still timed, printed as they come and written as one JSON list."""
    from deepinfer_sim.kernels._util import time_cases

    def time_one(case: dict) -> dict:
        if case["m"] == 2:
            raise RuntimeError("no kernel for m=2")
        return {**case, "seconds": 1e-3 * case["m"]}

    out = tmp_path / "sub" / "bench.json"
    assert time_cases([{"m": 1}, {"m": 2}, {"m": 3}], time_one, out) == 1
    rows = json.loads(out.read_text())
    assert [r.get("seconds") for r in rows] == [1e-3, None, 3e-3]
    assert rows[1]["error"] == "RuntimeError: no kernel for m=2"
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert time_cases([{"m": 1}], time_one, out) == 0


def test_grouped_projection_takes_the_path_timed_faster_per_row_bucket(monkeypatch):
    """Where both paths exist (a GPU), the grouped output projection times the batched grouped
    GEMM and the per-group GEMMs (as CUDA graphs) once per (shape, rows to the next power of
    two), at both ends of that bucket (just above half of it, and all of it), and takes the
    faster over the two; inside a graph capture, with no timing possible, an unseen size takes
    the batched GEMM from 2,048 rows. Both paths give the same numbers."""
    import torch

    lin = fp8.GroupedFP8Linear(torch.randn(3, 8, 16), fp8=False)
    xq, xs = torch.randn(3, 48, 16), torch.ones(3, 48)
    per_group = lin._per_group(xq, xs, 48)

    def batched(q, s):  # what torch._scaled_grouped_mm computes, [G, M_pad, N]
        m = int(q.shape[1])
        return lin._per_group(q, s, m).view(m, 3, 8).transpose(0, 1)

    monkeypatch.setattr(lin, "_batched", batched)
    lin.batched = True
    times = {"batched": 2.0, "per_group": 1.0}
    timed: list[str] = []

    rows_timed: list[int] = []

    def fake_seconds(fn, device, repeats=5):  # called for the batched path, then per group
        out = fn()
        rows_timed.append(int(out.shape[-2] if out.dim() == 3 else out.shape[0]))
        timed.append(("batched", "per_group")[len(timed) % 2])
        return times[timed[-1]]

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(fp8, "GROUPED_TIMINGS", {})
    monkeypatch.setattr(fp8, "_graphed_seconds", fake_seconds)
    assert torch.equal(lin(xq, xs, 48), per_group)
    assert fp8.GROUPED_TIMINGS == {(3, 8, 16, 64): (4.0, 2.0)}  # rows 48 and 64, summed
    assert rows_timed == [48, 48, 64, 64]
    assert not lin._use_batched(xq[:, :40]) and len(timed) == 4  # same bucket
    times["batched"] = 0.5
    assert lin._use_batched(xq[:, :16]) and len(timed) == 6  # a new bucket: 16 only
    assert torch.equal(lin(xq[:, :16], xs[:, :16], 16), per_group[:16])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    big = torch.zeros(3, 2048, 16)
    assert lin._use_batched(big) and not lin._use_batched(xq[:, :5])
    assert len(fp8.GROUPED_TIMINGS) == 2 and len(timed) == 6


def test_sparse_kernels_run_a_slice_of_heads_padded_to_64(monkeypatch):
    """One GPU of a TP8 V4.1-Flash has 8 heads; FlashMLA's sparse kernels take 64 or 128, so
    the call pads the query with zero heads (as engines do) and drops their output: its cost is
    that of 64 heads, which is what calibrating a TP slice must time."""
    from deepinfer_sim.kernels.deepseek import flashmla

    seen = []

    class FakeFlashMLA:
        def flash_mla_sparse_fwd(self, q, kv, idx, scale, d_v, sink, topk_length):
            seen.append(tuple(q.shape))
            return (q[..., :d_v] * 2.0,)

    monkeypatch.setattr(flashmla, "_use_kernel", lambda device, d, heads: True)
    monkeypatch.setattr(flashmla, "_module", lambda: FakeFlashMLA())
    q = torch.randn(5, 8, 512, dtype=torch.bfloat16)
    kv = torch.randn(7, 512, dtype=torch.bfloat16)
    out = flashmla.sparse_prefill(q, kv, torch.zeros(5, 4, dtype=torch.int32), 0.1)
    assert seen == [(5, 64, 512)]
    assert out.shape == (5, 8, 512) and torch.equal(out, q * 2.0)
    assert [flashmla.kernel_heads(h) for h in (8, 16, 64, 65, 128)] == [64, 64, 64, 128, 128]


def test_routed_experts_take_the_grouped_gemm_timed_faster_per_row_bucket(monkeypatch):
    """On a GPU each routed-expert GEMM (gate/up, down) times torch._scaled_grouped_mm against
    the Triton grouped GEMM once per (N, K, experts, rows to the next power of two), at both ends
    of the bucket, and runs the faster; an untimed bucket inside a graph capture takes torch's,
    and DEEPINFER_ROUTED_GEMM=torch always does. Both give the block's numbers."""
    import torch

    from deepinfer_sim.kernels.backend import get_backend
    from deepinfer_sim.kernels.deepseek import moe as ds_moe

    block = get_backend("deepseek").moe_block(LayerShape.toy(top_k=2), torch.device("cpu"), True)
    x = torch.randn(20, block.shape.hidden)
    ids, _ = block.route(x)
    rows, offs = block.prepare_experts(x, ids)
    want = block.forward_experts(rows, offs)  # the CPU's emulated path

    def emulated(aq, a_s, which, o):  # what both GPU kernels compute
        a = (aq.float() * a_s.reshape(-1, 1)).to(block.dtype)
        return block._gmm(a, which, o, "loop")

    calls: list[str] = []  # the kernels run, timing runs left out
    timing: list[str] = []

    def kernel(name):
        def run(*a):
            (timing if timing and timing[-1] == "?" else calls).append(name)
            return emulated(*a)

        return run

    monkeypatch.setattr(block, "path", "scaled_grouped_mm")
    monkeypatch.setattr(block, "_scaled_gmm", kernel("torch"))
    monkeypatch.setattr(block, "_triton_gmm", kernel("triton"))
    seconds = {"torch": 2.0, "triton": 1.0}
    rows_timed: list[int] = []

    def fake_seconds(fn, device, repeats=5):
        timing.append("?")
        out = fn()
        rows_timed.append(int(out.shape[0]))
        name, _ = timing.pop(), timing.pop()
        return seconds[name]

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(ds_moe, "ROUTED_TIMINGS", {})
    monkeypatch.setattr(ds_moe.fp8, "_graphed_seconds", fake_seconds)
    monkeypatch.delenv("DEEPINFER_ROUTED_GEMM", raising=False)
    torch.testing.assert_close(block.forward_experts(rows, offs), want)
    e, f, d = block.shape.local_experts, block.shape.expert_width, block.shape.hidden
    assert set(ds_moe.ROUTED_TIMINGS) == {(2 * f, d, e, 64), (d, f, e, 64)}  # 40 rows: bucket 64
    assert set(ds_moe.ROUTED_TIMINGS.values()) == {(4.0, 2.0)}  # 33 and 64 rows, summed
    assert sorted(set(rows_timed)) == [33, 64]
    assert calls == ["triton"] * 6  # per GEMM: autotune at 33 and 64 rows untimed, then the run
    seconds["triton"] = 3.0  # a new bucket: torch's is faster there
    few_rows, few_offs = block.prepare_experts(x[:3], ids[:3])
    calls.clear()
    block.forward_experts(few_rows, few_offs)
    assert calls == ["triton", "triton", "torch"] * 2 and len(ds_moe.ROUTED_TIMINGS) == 4
    monkeypatch.setenv("DEEPINFER_ROUTED_GEMM", "torch")
    calls.clear()
    torch.testing.assert_close(block.forward_experts(rows, offs), want)
    assert calls == ["torch", "torch"]
    monkeypatch.delenv("DEEPINFER_ROUTED_GEMM")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    many_rows, many_offs = block.prepare_experts(torch.cat([x] * 4), torch.cat([ids] * 4))
    calls.clear()
    block.forward_experts(many_rows, many_offs)  # 160 rows: bucket 256, untimed, in a capture
    assert calls == ["torch", "torch"] and len(ds_moe.ROUTED_TIMINGS) == 4
