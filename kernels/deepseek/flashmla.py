"""FlashMLA's three attention entry points, with a torch emulation of each.

============================  ====================================================================
``sparse_decode``             ``flash_mla_with_kvcache`` in sparse FP8 mode: every query attends
                              to the tokens its ``indices`` name in a MODEL1 cache, plus those its
                              ``extra_indices`` name in a second one (V4: the sliding window and
                              the compressed entries); ``-1`` is an empty index
``sparse_prefill``            ``flash_mla_sparse_fwd``: queries ``[s_q, H, d]`` attend to the rows
                              of one bf16 ``kv [s_kv, d]`` their indices name (V4 prefill)
``dense_decode``              ``flash_mla_with_kvcache`` dense: a paged bf16 latent cache, page
                              block 64, d 576 (V3 absorbed MLA decode), causal over the ``s_q``
                              new tokens
============================  ====================================================================

In every one K = V (MQA over a shared latent): the value is the key's first ``d_v`` values.

The real kernels run where ``flash_mla`` imports, the device is SM90 (the build here) and the
shape is one they support (d 512 or 576; the sparse kernels 64 or 128 heads: fewer — one GPU's
slice under tensor parallelism — are padded with zero heads up to 64 or 128 and the padding's
output dropped, as serving engines do; the dense kernel takes any head count). Everywhere
else — the CPU, toy widths in tests — the emulation computes the same function in float32
from the same inputs, so the index and layout logic of the callers is tested without a GPU,
and ``gpu_check`` compares the emulation with the kernel on the device. ``MODE`` forces one
or the other ("auto", "emulate", "kernel"). ``used`` records which ran.
"""

from __future__ import annotations

from typing import Any

import torch

from .layout import Model1Cache

MODE = "auto"
used: set[str] = set()
_FLASH_MLA: Any = None
_IMPORT_ERROR = ""


def _module() -> Any:
    global _FLASH_MLA, _IMPORT_ERROR
    if _FLASH_MLA is None and not _IMPORT_ERROR:
        try:
            import flash_mla

            _FLASH_MLA = flash_mla
        except Exception as exc:  # not installed, or built for another torch/CUDA
            _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"[:300]
    return _FLASH_MLA


def import_error() -> str:
    _module()
    return _IMPORT_ERROR


def kernels_available(device: torch.device) -> bool:
    return (
        device.type == "cuda"
        and torch.cuda.get_device_capability(device) == (9, 0)
        and _module() is not None
    )


def _use_kernel(device: torch.device, d: int, heads: int) -> bool:
    if MODE == "emulate":
        return False
    ok = kernels_available(device) and d in (512, 576) and 0 < heads <= 128
    if MODE == "kernel" and not ok:
        raise RuntimeError(f"FlashMLA cannot run here (d={d}, heads={heads}): {import_error()}")
    return ok


def kernel_heads(heads: int) -> int:
    """The head count a sparse FlashMLA kernel runs ``heads`` query heads at (64 or 128)."""
    return 64 if heads <= 64 else 128


def _pad_heads(q: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``q`` with zero heads appended along ``head_dim`` up to :func:`kernel_heads`."""
    h = q.shape[head_dim]
    pad = kernel_heads(h) - h
    if not pad:
        return q
    shape = list(q.shape)
    shape[head_dim] = pad
    return torch.cat([q, q.new_zeros(shape)], dim=head_dim)


def _attend(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, scale: float, d_v: int):
    """``q [N, H, d]`` over ``keys [N, K, d]`` where ``valid [N, K]`` -> float32 ``[N, H, d_v]``."""
    s = torch.einsum("nhd,nkd->nhk", q.float(), keys.float()) * scale
    s = s.masked_fill(~valid.unsqueeze(1), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a query with nothing to see gives 0
    return torch.einsum("nhk,nkd->nhd", p, keys[..., :d_v].float())


def _gather(cache: Model1Cache, idx: torch.Tensor, limit: torch.Tensor | None):
    """Dequantized rows named by ``idx [N, K]`` and their validity (index in range, and within
    the first ``limit[N]`` indices when given)."""
    valid = (idx >= 0) & (idx < cache.tokens)
    if limit is not None:
        pos = torch.arange(idx.shape[-1], device=idx.device)
        valid &= pos.view(1, -1) < limit.view(-1, 1)
    rows = torch.where(valid, idx, torch.zeros_like(idx)).long()
    vals = cache.read(rows.reshape(-1), torch.float32).view(*idx.shape, -1)
    return vals, valid


def _scheduler_metadata(fm: Any, sched: dict[Any, Any] | None, key: Any) -> Any:
    """FlashMLA's tile-scheduler metadata for a decode call: ``sched``'s under ``key`` when a
    layer of this step made it (it depends on shapes and lengths only), else a new one, kept
    there for the next layer (engines compute it once per step)."""
    if sched is not None and key in sched:
        return sched[key]
    meta, _ = fm.get_mla_metadata()
    if sched is not None:
        sched[key] = meta
    return meta


def sparse_decode(
    q: torch.Tensor,
    cache: Model1Cache,
    indices: torch.Tensor,
    sm_scale: float,
    extra: Model1Cache | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    sched: dict[Any, Any] | None = None,
    sched_key: Any = None,
) -> torch.Tensor:
    """``q [B, s_q, H, d]`` bf16; ``indices [B, s_q, topk]`` int32 into ``cache``; optional
    ``extra_indices [B, s_q, extra_topk]`` into ``extra`` with ``extra_topk_length [B]``.
    Returns ``[B, s_q, H, d]`` bf16 (d_v = d). ``sched`` keeps FlashMLA's tile-scheduler
    metadata under ``sched_key`` for the next call with the same shapes and lengths (the other
    layers of a decode step), as engines compute it once per step."""
    b, s_q, h, d = q.shape
    if _use_kernel(q.device, d, h):
        fm = _module()
        meta = _scheduler_metadata(fm, sched, sched_key)
        out, _ = fm.flash_mla_with_kvcache(
            _pad_heads(q, 2),
            cache.kernel_view(),
            None,
            None,
            d,
            meta,
            None,
            softmax_scale=sm_scale,
            causal=False,
            is_fp8_kvcache=True,
            indices=indices,
            extra_k_cache=extra.kernel_view() if extra is not None else None,
            extra_indices_in_kvcache=extra_indices,
            extra_topk_length=extra_topk_length,
        )
        used.add("flash_mla.sparse_decode")
        return out[:, :, :h] if out.shape[2] != h else out
    used.add("emulated.sparse_decode")
    n = b * s_q
    keys, valid = _gather(cache, indices.reshape(n, -1), None)
    if extra is not None and extra_indices is not None:
        lim = None
        if extra_topk_length is not None:
            lim = extra_topk_length.view(b, 1).expand(b, s_q).reshape(n)
        k2, v2 = _gather(extra, extra_indices.reshape(n, -1), lim)
        keys, valid = torch.cat([keys, k2], 1), torch.cat([valid, v2], 1)
    out = _attend(q.reshape(n, h, d), keys, valid, sm_scale, d)
    return out.view(b, s_q, h, d).to(q.dtype)


def sparse_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    topk_length: torch.Tensor | None = None,
    d_v: int = 512,
    query_chunk: int = 2048,
) -> torch.Tensor:
    """``q [s_q, H, d]`` bf16 over ``kv [s_kv, d]`` bf16 at ``indices [s_q, topk]`` int32 (``-1``
    or ``>= s_kv`` empty; only the first ``topk_length[s_q]`` used). Returns ``[s_q, H, d_v]``."""
    s_q, h, d = q.shape
    d_v = min(d_v, d)
    if _use_kernel(q.device, d, h) and d_v == 512:
        fm = _module()
        out = fm.flash_mla_sparse_fwd(
            _pad_heads(q, 1),
            kv.view(kv.shape[0], 1, d),
            indices.view(s_q, 1, -1),
            sm_scale,
            d_v,
            None,
            topk_length,
        )[0]
        used.add("flash_mla.sparse_prefill")
        return out[:, :h] if out.shape[1] != h else out
    used.add("emulated.sparse_prefill")
    out = torch.empty((s_q, h, d_v), dtype=q.dtype, device=q.device)
    pos = torch.arange(indices.shape[-1], device=q.device)
    for c0 in range(0, s_q, query_chunk):
        c1 = min(s_q, c0 + query_chunk)
        idx = indices[c0:c1]
        valid = (idx >= 0) & (idx < kv.shape[0])
        if topk_length is not None:
            valid &= pos.view(1, -1) < topk_length[c0:c1].view(-1, 1)
        rows = torch.where(valid, idx, torch.zeros_like(idx)).long()
        keys = kv.index_select(0, rows.reshape(-1)).view(c1 - c0, -1, d)
        out[c0:c1] = _attend(q[c0:c1], keys, valid, sm_scale, d_v).to(q.dtype)
    return out


def dense_decode(
    q: torch.Tensor,
    kcache: torch.Tensor,
    block_table: torch.Tensor,
    seqlens: torch.Tensor,
    sm_scale: float,
    causal: bool,
    d_v: int = 512,
    sched: dict[Any, Any] | None = None,
    sched_key: Any = None,
) -> torch.Tensor:
    """``q [B, s_q, H, d]`` over a paged bf16 cache ``kcache [blocks, 64, 1, d]``; sequence b holds
    ``seqlens[b]`` tokens in the blocks ``block_table[b]`` names, its last ``s_q`` being the
    queries' own (causal among them). Returns ``[B, s_q, H, d_v]`` bf16. ``sched``: as
    :func:`sparse_decode`'s, FlashMLA's scheduler metadata kept for the step's other layers."""
    b, s_q, h, d = q.shape
    if _use_kernel(q.device, d, h):
        fm = _module()
        meta = _scheduler_metadata(fm, sched, sched_key)
        out, _ = fm.flash_mla_with_kvcache(
            q,
            kcache,
            block_table,
            seqlens,
            d_v,
            meta,
            None,
            softmax_scale=sm_scale,
            causal=causal,
        )
        used.add("flash_mla.dense_decode")
        return out
    used.add("emulated.dense_decode")
    bs = kcache.shape[1]
    kmax = block_table.shape[1] * bs
    tok = torch.arange(kmax, device=q.device)
    rows = block_table.long()[:, tok // bs] * bs + tok % bs  # [B, kmax]
    keys = kcache.reshape(-1, d).index_select(0, rows.reshape(-1)).view(b, kmax, d)
    qpos = seqlens.view(b, 1).long() - s_q + torch.arange(s_q, device=q.device).view(1, s_q)
    lim = qpos if causal else seqlens.view(b, 1).long().expand(b, s_q) - 1
    valid = tok.view(1, 1, kmax) <= lim.unsqueeze(-1)  # [B, s_q, kmax]
    out = _attend(
        q.reshape(b * s_q, h, d),
        keys.unsqueeze(1).expand(b, s_q, kmax, d).reshape(b * s_q, kmax, d),
        valid.reshape(b * s_q, kmax),
        sm_scale,
        d_v,
    )
    return out.view(b, s_q, h, d_v).to(q.dtype)
