"""Plain-PyTorch float64 references for every kernel (used by the tests and ``gpu_check``).

Each reference is the obvious dense formulation: whole-sequence masked attention with an
``[N, N]`` mask, a per-expert Python loop for the MoE, ``einsum`` for the indexer. They take the
kernels' own (unquantized) weights and recompute everything from scratch, so a kernel's caches,
chunking, bucketing, blocking and fast paths are all checked against something that has none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .attention import AttentionBlock
    from .moe import MoEBlock
    from .vision import VisionEncoder

F64 = torch.float64
TIE_BREAK = 1e-9  # as in attention.py


def _d(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(F64)


def ref_rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x = _d(x)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * _d(w)


def ref_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return _d(x) @ _d(weight).t()


def ref_compress_groups(
    groups: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, extra: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    w = torch.softmax(_d(groups) @ _d(gate) + _d(bias), dim=-1)
    out = torch.einsum("gm,gmd->gd", w, _d(groups))
    return out, (torch.einsum("gm,gmd->gd", w, _d(extra)) if extra is not None else None)


def ref_indexer_scores(iq: torch.Tensor, iw: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    logits = torch.einsum("bqhi,bni->bqhn", _d(iq), _d(keys)).clamp_min(0)
    return torch.einsum("bqh,bqhn->bqn", _d(iw), logits)


def ref_window_attention(
    q: torch.Tensor, kv: torch.Tensor, window: int, scale: float | None = None
) -> torch.Tensor:
    """Masked full attention: token t attends to positions (t-W, t]."""
    n, _, d = q.shape
    scale = d**-0.5 if scale is None else scale
    t = torch.arange(n, device=q.device)
    mask = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - window)
    s = torch.einsum("thd,jd->thj", _d(q) * scale, _d(kv))
    s = s.masked_fill(~mask[:, None, :], float("-inf"))
    return torch.einsum("thj,jd->thd", torch.softmax(s, -1), _d(kv))


def ref_attention_block(
    block: AttentionBlock, x: torch.Tensor, *, dense_compressed: bool = False
) -> torch.Tensor:
    """The whole layer (attention + shared expert) over a sequence from position 0.

    ``x [N, hidden]`` -> ``[N, hidden]`` float64. ``dense_compressed`` makes CSA attend to every
    visible entry (what CSA must equal when ``index_topk`` covers them all).
    """
    s = block.shape
    H, d, w, m = s.heads, s.head_dim, s.window, block.m
    x = _d(x)
    n = x.shape[0]
    h = ref_rms(x, block.attn_norm)
    ql = ref_rms(ref_linear(h, block.wq_a.weight), block.q_norm)
    q = ref_linear(ql, block.wq_b.weight).view(n, H, d) * block.scale
    c = ref_rms(ref_linear(h, block.wkv.weight), block.kv_norm)
    t = torch.arange(n, device=x.device)
    win = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - w)
    logits = [torch.einsum("thd,jd->thj", q, c).masked_fill(~win[:, None, :], float("-inf"))]
    values = [c]
    g = n // m if m else 0
    if g:
        grp = c[: g * m].view(g, m, d)
        ik_grp = None
        if block.kind == "csa":
            assert block.wik is not None
            ik_grp = ref_linear(h, block.wik.weight)[: g * m].view(g, m, -1)
        ent, kidx = ref_compress_groups(grp, block.gate, block.gate_bias, ik_grp)
        e = torch.arange(g, device=x.device)
        visible = e[None, :] < (t // m)[:, None]  # [N, G]
        if block.kind == "csa" and not dense_compressed:
            assert block.wiq is not None and block.wiw is not None and kidx is not None
            iq = ref_linear(h, block.wiq.weight).view(n, s.indexer_heads, s.indexer_dim)
            iw = ref_linear(h, block.wiw.weight)
            sc = ref_indexer_scores(iq[None], iw[None], kidx[None])[0]
            sc = (sc + e[None, :] * TIE_BREAK).masked_fill(~visible, float("-inf"))
            k = min(s.index_topk, g)
            top_v, top_i = sc.topk(k, dim=-1)
            chosen = torch.zeros_like(visible)
            chosen.scatter_(1, top_i, torch.isfinite(top_v))
            visible = chosen
        logits.append(
            torch.einsum("thd,ed->the", q, ent).masked_fill(~visible[:, None, :], float("-inf"))
        )
        values.append(ent)
    p = torch.softmax(torch.cat(logits, -1), -1)
    o = torch.einsum("thj,jd->thd", p, torch.cat(values, 0))
    og = o.reshape(n, s.o_groups, s.heads_per_group * d)
    lo = torch.einsum("tgi,goi->tgo", og, _d(block.wo_a.weight)).reshape(n, -1)
    y = x + ref_linear(lo, block.wo_b.weight)
    if block.w_gate_up is not None and block.w_down is not None:
        z = ref_rms(y, block.ffn_norm)
        gu = ref_linear(z, block.w_gate_up.weight)
        f = s.shared_width
        y = y + ref_linear(torch.nn.functional.silu(gu[:, :f]) * gu[:, f:], block.w_down.weight)
    return y


def ref_route(moe: MoEBlock, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax router, top-k without replacement, weights renormalized to sum 1."""
    probs = torch.softmax(_d(x) @ _d(moe.router).t(), dim=-1)
    w, ids = probs.topk(moe.shape.top_k, dim=-1)
    return ids, w / w.sum(-1, keepdim=True)


def ref_moe_routed(
    moe: MoEBlock, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """Per-expert loop: ``sum_j w[t,j] * Expert_{ids[t,j]}(x[t])``."""
    x = _d(x)
    f = moe.shape.expert_width
    out = torch.zeros_like(x)
    ids, wts = topk_ids.cpu(), _d(topk_weights).cpu()
    for e in range(moe.shape.local_experts):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        tok_d = tok.to(x.device)
        gu = x[tok_d] @ _d(moe.w13[e]).t()
        a = torch.nn.functional.silu(gu[:, :f]) * gu[:, f:]
        y = a @ _d(moe.w2[e]).t()
        out.index_add_(0, tok_d, y * wts[tok, slot].to(x.device)[:, None])
    return out


def ref_vision_encoder(enc: VisionEncoder, pixels: torch.Tensor) -> torch.Tensor:
    """The ViT stack with explicit softmax attention, in float64."""
    b = pixels.shape[0]
    n, w, h = enc.tokens, enc.width, enc.heads
    x = ref_linear(enc.patchify(_d(pixels)), enc.patch_embed.weight) + _d(enc.pos)
    for blk in enc.blocks:
        y = torch.nn.functional.layer_norm(x, (w,), _d(blk.ln1[0]), _d(blk.ln1[1]))
        qkv = ref_linear(y, blk.qkv.weight).view(b, n, 3, h, w // h).permute(2, 0, 3, 1, 4)
        s = torch.einsum("bhqd,bhkd->bhqk", qkv[0], qkv[1]) * (w // h) ** -0.5
        a = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1), qkv[2])
        x = x + ref_linear(a.transpose(1, 2).reshape(b, n, w), blk.proj.weight)
        y = torch.nn.functional.layer_norm(x, (w,), _d(blk.ln2[0]), _d(blk.ln2[1]))
        hid = torch.nn.functional.gelu(ref_linear(y, blk.fc1.weight), approximate="tanh")
        x = x + ref_linear(hid, blk.fc2.weight)
    return x
