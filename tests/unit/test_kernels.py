"""The torch kernels of one V4.1-style layer, checked against float64 references on the CPU.

Every kernel in ``deepinfer_sim.kernels`` computes a function that ``kernels/reference.py`` spells
out densely in float64 (an ``[N, N]`` masked attention over the whole sequence, a per-expert loop
for the MoE, ``einsum`` for the indexer). These tests draw fresh random inputs at toy widths
(hidden 64, 4 heads × 32, window 8, compression 2 and 8, top-4 of the indexer, 8 local experts),
run the fast form — blocked window attention, chunked prefill with caches, bucketed varlen
decode, grouped GEMMs — and compare by ‖out − ref‖ / ‖ref‖ (METHOD.md). Outputs are poisoned:
``_util.POISON`` makes every kernel output start as NaN, so an element a kernel forgot to write
fails instead of passing on stale memory. GPU-only fast paths are covered by ``gpu_check.py`` and
the ``gpu``-marked test at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

from deepinfer_sim.kernels import _util
from deepinfer_sim.kernels._util import rel_err
from deepinfer_sim.kernels.attention import (
    AttentionBlock,
    DecodePlan,
    compress_groups,
    indexer_scores,
    prefill_query_chunk,
    sliding_window_attention,
)
from deepinfer_sim.kernels.linear import GroupedLinear, Linear
from deepinfer_sim.kernels.moe import MoEBlock
from deepinfer_sim.kernels.reference import (
    ref_attention_block,
    ref_compress_groups,
    ref_indexer_scores,
    ref_linear,
    ref_moe_routed,
    ref_route,
    ref_vision_encoder,
    ref_window_attention,
)
from deepinfer_sim.kernels.shapes import Kind, LayerShape
from deepinfer_sim.kernels.vision import VisionEncoder
from deepinfer_sim.models.registry import load_model

CPU = torch.device("cpu")
F32_TOL = 1e-5  # float32 kernels against float64 references
KINDS: tuple[Kind, ...] = ("swa", "csa", "hca")


@pytest.fixture(autouse=True)
def poison(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_util, "POISON", True)
    torch.manual_seed(1234)
    yield


def toy(**over: Any) -> LayerShape:
    # 4 indexer heads: with fewer, exact-zero ReLU sums are common (they tie-break, but the test
    # should exercise real selections)
    return LayerShape.toy(indexer_heads=4, **over)


def close(out: torch.Tensor, ref: torch.Tensor, tol: float = F32_TOL) -> None:
    assert torch.isfinite(out).all(), "kernel left unwritten (NaN) or non-finite outputs"
    err = rel_err(out, ref)
    assert err < tol, f"rel err {err:.3g} >= {tol}"


def prefill_all(block: AttentionBlock, x: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    pool = block.new_pool(2, x.shape[0] + 8)
    seq = pool.alloc()
    outs, start = [], 0
    for n in chunks:
        out = block.prefill(x[start : start + n], pool, seq)
        assert isinstance(out, torch.Tensor)
        outs.append(out)
        start += n
    assert start == x.shape[0]
    return torch.cat(outs)


# ---- shapes -------------------------------------------------------------------------------------


def test_layer_shape_reads_the_model_yaml() -> None:
    """``LayerShape.from_model`` takes every width from the V4.1-Flash config (SPEC.md §3).

    The router of one EP rank only sees its local experts, so top-k is capped by them.
    """
    sh = LayerShape.from_model(load_model("deepseek-v4.1-flash"), local_experts=48)
    assert (sh.hidden, sh.heads, sh.head_dim) == (5120, 64, 512)
    assert (sh.q_lora, sh.o_lora, sh.o_groups, sh.window) == (1280, 1024, 8, 128)
    assert (sh.indexer_heads, sh.indexer_dim, sh.index_topk) == (32, 128, 512)
    assert (sh.csa_compression, sh.hca_compression) == (4, 128)
    assert (sh.local_experts, sh.top_k, sh.expert_width, sh.shared_experts) == (48, 6, 2304, 1)
    assert sh.compression("swa") == 0 and sh.compression("csa") == 4
    assert LayerShape.from_model(load_model("deepseek-v4.1-flash"), 4).top_k == 4
    with pytest.raises(ValueError):
        LayerShape.toy(heads=6, o_groups=4)


# ---- linear -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, tol", [(torch.float32, F32_TOL), (torch.bfloat16, 1e-2)])
def test_linear_matches_reference(dtype: torch.dtype, tol: float) -> None:
    """A plain Linear is ``x @ W.T`` to the precision of its dtype."""
    lin = Linear(96, 80, device=CPU, dtype=dtype, seed=1)
    x = torch.randn(33, 96).to(dtype)
    assert lin.path == "matmul"
    close(lin(x), ref_linear(x, lin.weight), tol)


def test_fp8_linear_emulates_e4m3_rowwise() -> None:
    """Without FP8 tensor cores the FP8 layer multiplies the dequantized e4m3 numbers.

    e4m3 keeps 3 mantissa bits, so each operand carries a few percent of error; the product
    stays within 10% of the float64 reference, and is NOT the exact product (it really
    quantized).
    """
    lin = Linear(128, 64, device=CPU, fp8=True, seed=2)
    assert lin.path == "fp8_emulated"
    x = torch.randn(40, 128)
    err = rel_err(lin(x), ref_linear(x, lin.weight))
    assert 1e-3 < err < 1e-1


@pytest.mark.parametrize("fp8", [False, True])
def test_grouped_linear_is_independent_maps_per_group(fp8: bool) -> None:
    """Each of the G column slices goes through its own ``[k_in -> k_out]`` map."""
    gl = GroupedLinear(3, 16, 8, device=CPU, fp8=fp8, seed=3)
    x = torch.randn(10, 48)
    ref = torch.cat([ref_linear(x[:, 16 * g : 16 * (g + 1)], gl.weight[g]) for g in range(3)], 1)
    close(gl(x), ref, 1e-1 if fp8 else F32_TOL)


# ---- attention primitives ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 8, 9, 30])
def test_window_attention_equals_masked_full_attention(n: int) -> None:
    """Blocked window attention (blocks of W attend to their block and the previous one) is
    exactly causal attention restricted to the last W positions, for any n (full blocks,
    a partial last block, n < W)."""
    q, kv = torch.randn(n, 4, 32), torch.randn(n, 32)
    close(sliding_window_attention(q, kv, 8), ref_window_attention(q, kv, 8))


def test_compressor_and_indexer_match_reference() -> None:
    """The softmax-gated group sum and the ReLU-weighted indexer scores are what they say."""
    g = torch.randn(5, 4, 32)
    gate, bias, extra = torch.randn(32), torch.randn(4), torch.randn(5, 4, 16)
    out, out_x = compress_groups(g, gate, bias, extra)
    ref, ref_x = ref_compress_groups(g, gate, bias, extra)
    assert out_x is not None and ref_x is not None
    close(out, ref)
    close(out_x, ref_x)
    iq, iw, keys = torch.randn(2, 6, 3, 16), torch.randn(2, 6, 3), torch.randn(2, 300, 16)
    # a budget this small forces several tiles over the entries
    close(indexer_scores(iq, iw, keys, max_tmp_bytes=1000), ref_indexer_scores(iq, iw, keys))


# ---- the layer: prefill -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_matches_whole_sequence_reference(kind: Kind) -> None:
    """One prompt in one chunk equals the dense float64 layer (attention + shared expert),
    for window-only, CSA (top-4 of up to 18 entries: a real selection) and HCA layers."""
    blk = AttentionBlock(toy(), kind, CPU, seed=11)
    x = torch.randn(37, 64)
    close(prefill_all(blk, x, [37]), ref_attention_block(blk, x))


def test_csa_with_topk_covering_everything_is_dense_attention() -> None:
    """When top-k >= the number of compressed entries, CSA selects all visible entries: it must
    equal dense attention over the compressed entries plus the window (one softmax)."""
    blk = AttentionBlock(toy(index_topk=64), "csa", CPU, seed=12)
    x = torch.randn(50, 64)
    close(prefill_all(blk, x, [50]), ref_attention_block(blk, x, dense_compressed=True))
    # and with a small top-k the selection matters: the dense answer is then wrong
    small = AttentionBlock(toy(index_topk=2), "csa", CPU, seed=12)
    y = prefill_all(small, x, [50])
    assert rel_err(y, ref_attention_block(small, x, dense_compressed=True)) > 1e-4
    close(y, ref_attention_block(small, x))


def test_hca_attends_to_complete_groups_only() -> None:
    """HCA (compression 8): a query sees entry e only once its group is complete and strictly
    before the query's own group; 8-token groups and the 8-token window interleave."""
    blk = AttentionBlock(toy(hca_compression=8), "hca", CPU, seed=13)
    x = torch.randn(41, 64)
    close(prefill_all(blk, x, [41]), ref_attention_block(blk, x))


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_prefill_equals_one_chunk(kind: Kind) -> None:
    """Cache correctness: a prompt prefilled in several chunks (ragged sizes, chunk boundaries
    inside window blocks and compression groups) gives the same outputs as in one chunk, and
    so does a tiny temporary budget that forces many query chunks and indexer tiles."""
    blk = AttentionBlock(toy(), kind, CPU, seed=14)
    x = torch.randn(45, 64)
    one = prefill_all(blk, x, [45])
    close(prefill_all(blk, x, [5, 12, 1, 22, 5]), one)
    blk.max_tmp_bytes = 2000
    close(prefill_all(blk, x, [45]), one)
    close(one, ref_attention_block(blk, x))


def test_prefill_chunk_memory_is_bounded() -> None:
    """At full widths a 32,768-token chunk over a 262,144-token prefix is split into query
    chunks whose score matrices stay far below the 32K × 64K entries of the whole chunk: the
    indexer scores of one query chunk (float32) take under 2 GB."""
    sh = LayerShape.from_model(load_model("deepseek-v4.1-flash"), 48)
    n, p = 32768, 262144
    for kind in KINDS:
        ents = (n + p) // sh.compression(kind) if sh.compression(kind) else 0
        qc = prefill_query_chunk(sh, kind, n, ents, 1 << 30)
        assert qc % sh.window == 0 and sh.window <= qc < n
        assert qc * max(ents, 1) * 4 < 2e9
        assert qc * sh.heads * (2 * sh.window + min(ents, sh.index_topk)) * 4 < 2e9


# ---- the layer: decode --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("v", [1, 3])
def test_decode_equals_prefill_of_the_same_tokens(kind: Kind, v: int) -> None:
    """Decoding v tokens (speculative verify: v causal query tokens) gives the same outputs and
    leaves the same cache as prefilling those v tokens, after the same prefix."""
    blk = AttentionBlock(toy(), kind, CPU, seed=15)
    x = torch.randn(23 + v, 64)
    pa, pb = blk.new_pool(3, 64), blk.new_pool(3, 64)
    sa, sb = pa.alloc(1), pb.alloc(1)
    blk.prefill(x[:23], pa, sa)
    blk.prefill(x[:23], pb, sb)
    ya = blk.prefill(x[23:], pa, sa)
    yb = blk.decode(x[23:].unsqueeze(0), pb, [sb])
    assert isinstance(yb, torch.Tensor) and isinstance(ya, torch.Tensor)
    close(yb[0], ya)
    assert pa.length(sa) == pb.length(sb) == 23 + v
    close(pb.window_kv[sb], pa.window_kv[sa])
    if pa.comp is not None and pb.comp is not None:
        ne = (23 + v) // blk.m
        close(pb.comp[sb, :ne], pa.comp[sa, :ne])


@pytest.mark.parametrize("kind", KINDS)
def test_varlen_decode_over_buckets_matches_reference(
    kind: Kind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B sequences of different lengths decode together over several steps (v=2 verify); the
    plan puts them in different power-of-two buckets. Each sequence's outputs equal the dense
    reference of its own whole sequence."""
    monkeypatch.setattr(DecodePlan, "MIN_BUCKET", 2)
    blk = AttentionBlock(toy(), kind, CPU, seed=16)
    lens, v, steps = [3, 17, 40, 9, 1], 2, 3
    xs = [torch.randn(n + v * steps, 64) for n in lens]
    pool = blk.new_pool(8, 64)
    slots = [pool.alloc(7 - i) for i in range(len(lens))]  # slots not in order
    for s, x, n in zip(slots, xs, lens, strict=True):
        blk.prefill(x[:n], pool, s)
    outs: list[list[torch.Tensor]] = [[] for _ in lens]
    for st in range(steps):
        xb = torch.stack([x[n + st * v : n + (st + 1) * v] for x, n in zip(xs, lens, strict=True)])
        plan = DecodePlan.from_pool(pool, slots, v)
        if kind != "swa":
            assert len(plan.buckets(blk.m)) >= 2
        y = blk.decode(xb, pool, plan)
        for i in range(len(lens)):
            outs[i].append(y[i])
    for o, x, n in zip(outs, xs, lens, strict=True):
        close(torch.cat(o), ref_attention_block(blk, x)[n:])


def test_decode_plan_work_is_proportional_to_total_length() -> None:
    """Bucketing pads each sequence to at most twice its entry count (or the smallest bucket),
    so padded work grows with the sum of lengths, not with B × the longest sequence."""
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(1, 200, 60), [100_000]])
    plan = DecodePlan(np.arange(lengths.size), lengths, 1, CPU)
    buckets = plan.buckets(4)
    n_vis = lengths // 4
    padded = sum(int(b.rows.numel()) * b.n_entries for b in buckets)
    assert sum(int(b.rows.numel()) for b in buckets) == lengths.size
    assert padded <= 2 * n_vis.sum() + lengths.size * DecodePlan.MIN_BUCKET
    assert padded < 0.1 * lengths.size * n_vis.max()


def test_pool_slots_and_random_fill() -> None:
    """The pool hands out slots, refuses double use and overflow, and ``fill_random`` gives a
    sequence a cache of any length without computing it — a decode on top then runs normally."""
    blk = AttentionBlock(toy(), "csa", CPU, seed=17)
    pool = blk.new_pool(2, 100)
    a = pool.alloc()
    b = pool.alloc()
    with pytest.raises(RuntimeError):
        pool.alloc()
    with pytest.raises(RuntimeError):
        pool.alloc(a)
    pool.fill_random(a, 90)
    pool.fill_random(b, 11)
    assert pool.length(a) == 90
    with pytest.raises(ValueError):
        pool.fill_random(a, 101)
    y = blk.decode(torch.randn(2, 3, 64), pool, [a, b])
    assert isinstance(y, torch.Tensor) and torch.isfinite(y).all()
    assert (pool.length(a), pool.length(b)) == (93, 14)
    with pytest.raises(ValueError):
        blk.decode(torch.randn(1, 8, 64), pool, [a])  # 93 + 8 > 100
    pool.truncate(a, 50)
    pool.free(a)
    with pytest.raises(KeyError):
        pool.fill_random(a, 5)
    assert pool.alloc() == a


def test_fp8_block_stays_close_to_reference() -> None:
    """With FP8 projections (emulated on the CPU) the layer stays within FP8 tolerance."""
    blk = AttentionBlock(toy(), "hca", CPU, fp8=True, seed=18)
    x = torch.randn(30, 64)
    err = rel_err(prefill_all(blk, x, [30]), ref_attention_block(blk, x))
    assert err < 1e-1


# ---- MoE ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, tol", [("bf16", F32_TOL), ("fp8", 1e-1)])
def test_moe_grouped_equals_per_expert_loop(mode: Literal["bf16", "fp8"], tol: float) -> None:
    """Sorting (token, expert) pairs by expert and running one grouped GEMM per projection
    gives the per-expert loop's answer; so does the loop fallback. The router picks top-k
    distinct experts with weights summing to 1, the same as the float64 router."""
    moe = MoEBlock(LayerShape.toy(top_k=3), CPU, mode, seed=19)
    assert moe.path == "grouped_mm"  # the CPU build of torch has a _grouped_mm
    x = torch.randn(29, 64)
    ids, w = moe.route(x)
    rids, _ = ref_route(moe, x)
    assert torch.equal(ids.sort(-1).values, rids.sort(-1).values)
    assert all(len(set(row)) == 3 for row in ids.tolist())
    close(w.sum(-1), torch.ones(29, dtype=torch.float64))
    ref = ref_moe_routed(moe, x, ids, w)
    close(moe(x), ref, tol)
    moe.path = "loop"
    close(moe.forward_routed(x, ids, w), ref, tol)


def test_moe_with_empty_experts_and_given_routing() -> None:
    """``forward_routed`` takes any routing, including experts that receive no token and
    weights that do not sum to 1; ``uniform_routing`` spreads tokens over all experts."""
    moe = MoEBlock(LayerShape.toy(), CPU, "bf16", seed=20)
    x = torch.randn(9, 64)
    ids = torch.tensor([[5, 2]] * 9)
    w = torch.rand(9, 2)
    close(moe.forward_routed(x, ids, w), ref_moe_routed(moe, x, ids, w))
    uids, _ = moe.uniform_routing(400, seed=1)
    counts = torch.bincount(uids.reshape(-1), minlength=8)
    assert counts.min() > 0 and torch.all(uids[:, 0] != uids[:, 1])
    assert moe.forward_routed(x[:0], ids[:0], w[:0]).shape == (0, 64)


@pytest.mark.parametrize("backend", ["reference", "deepseek"])
def test_the_experts_alone_are_the_moe_less_its_gather_and_combine(backend: str) -> None:
    """``prepare_experts`` (sort by expert, gather; FP8 on the deepseek backend: quantize once
    per token) then ``forward_experts`` (GEMM, SwiGLU, GEMM) then the weighted combine is
    ``forward_routed`` exactly: the calibration times the middle part alone as what a rank
    computes under expert parallelism, where the exchange's kernels do the rest."""
    from deepinfer_sim.kernels.backend import get_backend

    moe = get_backend(backend).moe_block(LayerShape.toy(top_k=3), CPU, True, seed=21)
    x = torch.randn(23, 64)
    ids, w = moe.route(x)
    rows, offs = moe.prepare_experts(x, ids)
    y = moe.forward_experts(rows, offs)
    assert y.shape == (23 * 3, 64) and int(offs[-1]) == 23 * 3
    order, tok, _ = moe.sort_by_expert(ids)
    assert torch.equal(moe.combine(y, order, tok, w, 23), moe.forward_routed(x, ids, w))


# ---- vision -------------------------------------------------------------------------------------


def test_vision_encoder_matches_reference() -> None:
    """The ViT stack (patchify with SigLIP's cropping, pre-LN blocks, SDPA) equals explicit
    float64 attention; the default widths are SigLIP-SO400M/14 at 384 px (729 tokens)."""
    enc = VisionEncoder(CPU, width=32, layers=2, heads=4, mlp=48, patch=4, image_size=18)
    assert enc.tokens == 16
    px = enc.random_images(2)
    close(enc.forward(px), ref_vision_encoder(enc, px))
    assert enc.encode(1).shape == (1, 16, 32)
    assert VisionEncoder.__init__.__kwdefaults__ is not None
    d = VisionEncoder.__init__.__kwdefaults__
    assert (d["width"], d["layers"], d["heads"], d["mlp"], d["patch"]) == (1152, 27, 16, 4304, 14)
    assert (d["image_size"] // d["patch"]) ** 2 == 729


# ---- expert parallel -----------------------------------------------------------------------------


def test_ep_dispatch_combine_round_trip_over_gloo(tmp_path: Path) -> None:
    """Two CPU processes (gloo) exchange rows by destination rank: each rank receives exactly
    the rows addressed to it, in source-rank order, and ``combine`` returns the processed
    rows (here doubled) to their owners in the original order; the FP8 payload round-trips
    within e4m3 precision."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this build")
    import torch.multiprocessing as mp

    from deepinfer_sim.kernels.ep import NO_MULTICAST, selftest_worker

    os.environ.update(NO_MULTICAST)
    mp.spawn(selftest_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for r, data in enumerate(ranks):
        exact = data["res"]["fp8=False"]
        expect = torch.cat([o["x"][o["dest"] == r] for o in ranks])
        assert torch.equal(exact["recv"], expect)
        assert exact["recv_counts"] == [int((o["dest"] == r).sum()) for o in ranks]
        assert torch.equal(exact["back"], 2 * data["x"])
        fp8 = data["res"]["fp8=True"]
        assert rel_err(fp8["back"], 2 * data["x"]) < 0.1
        assert data["timing"]["median_s"] > 0


# ---- Triton --------------------------------------------------------------------------------------

TRITON_SCRIPT = """
import json, torch
from deepinfer_sim.kernels import attention as A
from deepinfer_sim.kernels.reference import ref_attention_block, ref_indexer_scores
from deepinfer_sim.kernels.shapes import Kind, LayerShape
from deepinfer_sim.kernels._util import rel_err
torch.manual_seed(0)
iq, iw, k = torch.randn(2, 70, 4, 16), torch.randn(2, 70, 4), torch.randn(2, 300, 16)
fused = A.indexer_scores(iq, iw, k, impl="triton")
blk = A.AttentionBlock(LayerShape.toy(indexer_heads=4), "csa", "cpu", seed=3)
x = torch.randn(36, 64)
pool = blk.new_pool(1, 64)
s = pool.alloc()
y = torch.cat([blk.prefill(x[:30], pool, s), blk.decode(x[30:].view(1, 6, 64), pool, [s])[0]])
print(json.dumps({"scores": rel_err(fused, ref_indexer_scores(iq, iw, k)),
                  "layer": rel_err(y, ref_attention_block(blk, x)),
                  "paths": sorted(A.indexer_path_used), "fallback": A.indexer_fallback_reason}))
"""


def test_triton_indexer_under_the_interpreter() -> None:
    """The fused Triton indexer (the CUDA path) computes the reference scores, and a CSA layer
    using it (prefill and decode) still matches the float64 layer. Runs the kernel in Triton's
    CPU interpreter, in a subprocess (the interpreter is chosen when Triton is imported)."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (it is on the GPU image; optional here)")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", TRITON_SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["fallback"] == ""
    assert res["paths"] == ["triton"]
    assert res["scores"] < F32_TOL and res["layer"] < F32_TOL


# ---- GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_fast_paths_on_cuda() -> None:
    """On a CUDA device: FP8 ``_scaled_mm`` (capability >= 8.9) and the grouped-GEMM MoE
    compute the reference function (bf16 / FP8 tolerances)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    dev = torch.device("cuda")
    lin = Linear(256, 512, device=dev, fp8=True, seed=1)
    x = torch.randn(64, 256, device=dev).to(lin.dtype)
    assert rel_err(lin(x), ref_linear(x, lin.weight)) < 1e-1
    moe = MoEBlock(LayerShape.toy(hidden=128, expert_width=64), dev, "bf16", seed=2)
    xm = torch.randn(64, 128, device=dev).to(moe.dtype)
    ids, w = moe.route(xm)
    assert rel_err(moe.forward_routed(xm, ids, w), ref_moe_routed(moe, xm, ids, w)) < 2e-2
