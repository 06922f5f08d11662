"""The GPU prefill paths' plumbing on the CPU: MLA prefill attention split into the chunk over
itself (causal) and over its prefix (unmasked), merged by log-sum-exps
(``kernels/deepseek/mla.py``), and the routed experts' combine by sorted positions
(``kernels/triton_combine.py``). The kernels themselves (cuDNN's attention, the Triton combine)
run on a GPU, where ``deepseek_check`` and their own first-use checks compare them with these."""

from __future__ import annotations

import pytest
import torch

from deepinfer_sim.kernels.deepseek import mla
from deepinfer_sim.kernels.moe import MoEBlock
from deepinfer_sim.kernels.shapes import LayerShape
from deepinfer_sim.kernels.triton_combine import combine_reference, sorted_positions
from deepinfer_sim.kernels.triton_merge import merge_reference, merge_states, random_states


def _math_kernel(q, k, v, scale, causal):
    """Attention of ``[1, H, m, d]`` inputs with its natural-log LSE, in float64."""
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    if causal:
        n, kv = s.shape[-2:]
        keep = torch.arange(kv)[None, :] <= torch.arange(n)[:, None] + (kv - n)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.einsum("bhqk,bhkd->bhqd", torch.exp(s - lse.unsqueeze(-1)), v.double()), lse


@pytest.mark.parametrize("n,p", [(5, 0), (7, 13), (1, 40), (16, 1)])
def test_split_attention_equals_end_aligned_causal(n, p):
    g = torch.Generator().manual_seed(n * 100 + p)
    q = torch.randn((n, 3, 24), generator=g, dtype=torch.float64)
    k = torch.randn((n + p, 3, 24), generator=g, dtype=torch.float64)
    v = torch.randn((n + p, 3, 16), generator=g, dtype=torch.float64)
    got = mla._split_attention(q, k, v, 0.2, _math_kernel)
    want = mla._sdpa_causal(q, k, v, 0.2)
    assert got.shape == (n, 3, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # merged in float32


def test_cpu_prefill_attention_takes_the_masked_path():
    q, k, v = torch.ones((2, 1, 8)), torch.ones((5, 1, 8)), torch.arange(20.0).view(5, 1, 4)
    out = mla.prefill_attention(q, k, v, 1.0)
    assert out.shape == (2, 1, 4)
    # equal scores: the first new token sees 4 keys, the second all 5
    torch.testing.assert_close(out[:, 0], torch.stack([v[:4, 0].mean(0), v[:, 0].mean(0)]))


def test_sorted_positions_invert_the_sort():
    ids = torch.tensor([[3, 0], [1, 3], [0, 2], [3, 1]])
    order = torch.argsort(ids.reshape(-1), stable=True)
    pos = sorted_positions(order, 2)
    assert pos.dtype == torch.int32 and pos.shape == (4, 2)
    assert torch.equal(order[pos.reshape(-1).long()], torch.arange(8))


@pytest.mark.parametrize("tokens,experts,top_k", [(9, 4, 2), (1, 3, 3), (40, 8, 4)])
def test_combine_by_positions_equals_the_reference_combine(tokens, experts, top_k):
    shape = LayerShape.toy(hidden=16, expert_width=8, local_experts=experts, top_k=top_k)
    block = MoEBlock(shape, "cpu", "bf16", dtype=torch.float32)
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn((tokens, 16), generator=g)
    ids, w = block.route(x)
    order, tok, _ = block.sort_by_expert(ids)
    y = torch.randn((tokens * top_k, 16), generator=g)
    want = block.combine(y, order, tok, w, tokens)
    got = combine_reference(y, sorted_positions(order, top_k), w)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_the_gpu_kernels_are_declined_where_they_cannot_run(monkeypatch):
    """Without a GPU (or when told to) the block keeps the reference paths: the split form's
    cuDNN kernel and the Triton combine are each decided once, and say no here."""
    from deepinfer_sim.kernels.deepseek.moe import triton_combine_ok

    cpu = torch.device("cpu")
    assert not triton_combine_ok(cpu)
    assert not mla.cudnn_split_ok(cpu, torch.bfloat16, 24, 16)  # no cuDNN attention on a CPU
    decided = {("cuda:0", torch.bfloat16, 24, 16): True}  # as a GPU that passed its check
    monkeypatch.setattr(mla, "_CUDNN_SPLIT", decided)
    gpu = torch.device("cuda:0")
    assert mla.cudnn_split_ok(gpu, torch.bfloat16, 24, 16)  # decided once, not re-checked
    monkeypatch.setenv("DEEPINFER_PREFILL_ATTENTION", "flash")
    assert not mla.cudnn_split_ok(gpu, torch.bfloat16, 24, 16)
    assert not mla.triton_merge_ok(cpu)
    monkeypatch.setattr(mla, "_MERGE_OK", {"cuda:0": True})
    assert mla.triton_merge_ok(gpu)
    monkeypatch.setenv("DEEPINFER_MERGE", "torch")  # the reference, to time the kernel against
    assert not mla.triton_merge_ok(gpu)


def test_the_merge_inputs_are_seeded_bf16_rows_and_float32_lses():
    """What the merge is checked on at first use and timed on: the same seed, the same inputs;
    the reference merges them into the block's [n, H, d_v] layout."""
    o_new, l_new, o_pre, l_pre = random_states(4, 10, 16, "cpu", seed=13)
    assert o_new.shape == o_pre.shape == (1, 4, 10, 16) and o_new.dtype == torch.bfloat16
    assert l_new.shape == l_pre.shape == (1, 4, 10) and l_new.dtype == torch.float32
    again = random_states(4, 10, 16, "cpu", seed=13)
    assert all(torch.equal(a, b) for a, b in zip(again, (o_new, l_new, o_pre, l_pre), strict=True))
    assert not torch.equal(random_states(4, 10, 16, "cpu", seed=14)[0], o_new)
    assert merge_reference(o_new, l_new, o_pre, l_pre).shape == (10, 4, 16)


def test_the_merge_kernel_refuses_outputs_that_do_not_agree():
    o = torch.zeros((1, 2, 5, 8))
    with pytest.raises(ValueError, match="do not agree"):
        merge_states(o, torch.zeros((1, 2, 5)), torch.zeros((1, 2, 4, 8)), torch.zeros((1, 2, 5)))


@pytest.mark.gpu
def test_the_triton_merge_equals_its_reference_on_cuda():
    """On a CUDA GPU with Triton: the fused merge of two bf16 partial outputs (cuDNN's
    head-major layout, one of them strided) equals the float32 reference within bf16 rounding,
    including rows where one side's log-sum-exp is far below the other's."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    g = torch.Generator(device="cuda").manual_seed(3)
    o_new = torch.randn((1, 16, 777, 128), generator=g, device="cuda").to(torch.bfloat16)
    o_pre = torch.randn((1, 777, 16, 128), generator=g, device="cuda").to(torch.bfloat16)
    o_pre = o_pre.transpose(1, 2)  # [1, H, n, d] with the tokens outermost, as cuDNN's may be
    l_new = 8 * torch.randn((1, 16, 777), generator=g, device="cuda")
    l_pre = l_new - 60 * (torch.arange(777, device="cuda") % 2)
    got = merge_states(o_new, l_new, o_pre, l_pre).float()
    want = merge_reference(o_new, l_new, o_pre, l_pre).float()
    assert got.shape == (777, 16, 128)
    assert (got - want).norm() <= 1e-2 * want.norm()


def test_a_kernel_choice_is_decided_once_per_key_and_never_inside_a_capture(monkeypatch):
    from deepinfer_sim.kernels._util import decided_once

    asked: list[str] = []

    def decide(key: str) -> bool:
        asked.append(key)
        return key == "a"

    cache: dict[str, bool] = {}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert decided_once(cache, "a", lambda: decide("a")) is None  # the caller's fallback
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert decided_once(cache, "a", lambda: decide("a")) is True
    assert decided_once(cache, "b", lambda: decide("b")) is False
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert decided_once(cache, "a", lambda: decide("a")) is True  # decided: kept in a capture
    assert asked == ["a", "b"] and cache == {"a": True, "b": False}
