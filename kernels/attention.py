"""One V4.1-style attention layer (+ shared expert): SWA, CSA and HCA, prefill and decode.

Design notes
------------
**Heads.** 64 query heads of width 512 share ONE cached vector per token that serves as both key
and value (MQA with K=V, as in MLA's latent attention). Every score matmul therefore folds the
heads into the M dimension: ``[tokens*heads, d] @ [d, keys]``, one GEMM for all heads. No SDPA:
its 512-wide-head path is slow on the H200 (SPEC.md §4).

**Projections.** ``x -> RMSNorm -> q_lora -> RMSNorm -> heads*d`` (low-rank q),
``x -> d -> RMSNorm`` (the cached KV vector), and the grouped low-rank output: the heads split into
``o_groups`` groups, each group's ``heads/o_groups*d`` columns map to ``o_lora``
(``GroupedLinear``), then ``o_groups*o_lora -> hidden``. Rotary embeddings, attention sinks and
per-head q norms of the real model are left out: they cost little and change no shapes.

**Sliding window** (every kind): token t attends to positions ``(t-W, t]``. Queries go in blocks
of W; block b attends to the 2W keys of its own block and the previous one (``unfold`` of the key
buffer, a view), with the band mask. Cost is linear in n.

**Compression** (CSA m=4, HCA m=128): every m consecutive KV vectors become one entry,
``sum_j softmax_j(c_j·g + b_j) c_j`` (a learned gate vector g and a per-position bias b). A query
at position t sees the entries strictly before its own group, ``e < t // m``. The partial group is
kept in the cache (``KVPool.ring``) until it completes.

**CSA**: the lightning indexer scores every visible entry,
``I(t, e) = sum_h w[t,h] * ReLU(qI[t,h] · kI[e])`` (``indexer_heads × indexer_dim`` queries and
head weights projected from the layer input, a ``indexer_dim``-wide key per entry compressed with
the same gates), keeps the ``index_topk`` best per query, and attends to those entries gathered
per query. **HCA**: dense attention over all visible entries. In both, the compressed scores and
the window scores share ONE softmax.

**Memory bound.** Prefill processes queries in chunks (a multiple of W) sized so that each
chunk's temporaries (scores, gathered entries, probabilities) stay within ``max_tmp_bytes``
(default 1 GiB); q is up-projected and the grouped output projection applied chunk by chunk, so
no ``[n, heads*d]`` tensor exists either. The indexer is additionally tiled over entries. A
32,768-token chunk over a 262,144-token prefix never materializes the 32K × 64K score matrix.

**Decode varlen.** ``DecodePlan`` (built once per step, shared by all layers) buckets the B
sequences by their number of visible compressed entries, in power-of-two buckets (smallest 64);
within a bucket, keys are padded to the bucket's longest sequence and masked. Total work is
therefore at most ~2× the sum of lengths, never B × the longest. Speculative verify of v tokens is
v causal query tokens per sequence. All host->device index transfers of a step happen when the
plan is built, through pinned memory, so layers launch without synchronizing.

Precision: projections are bf16 or FP8 (``Linear``); attention, the indexer and the caches run in
the compute dtype (bf16 on CUDA, float32 on the CPU), with score matmuls accumulated and
softmaxed in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import triton_indexer
from ._util import as_device, default_dtype, empty, generator, next_pow2, randn, rms_norm, to_device
from .block import LayerBlock
from .cache import KVPool
from .linear import GroupedLinear, Linear
from .shapes import Kind, LayerShape

NEG_INF = float("-inf")
# Indexer scores are ReLU sums, so many are exactly 0 and tie. Adding TIE_BREAK * entry index
# makes top-k prefer the more recent entry among exact ties, identically in the kernel and the
# reference (without it top-k picks an arbitrary one, differently per code path).
TIE_BREAK = 1e-9
_BMM_OUT_DTYPE: bool | None = None  # does this build have bmm(..., out_dtype=float32)?


def bmm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched matmul with a float32 result (accumulated in float32 in either case)."""
    global _BMM_OUT_DTYPE
    if a.dtype in (torch.float32, torch.float64):
        return torch.bmm(a, b)
    if a.is_cuda and _BMM_OUT_DTYPE is not False:
        try:
            out = torch.bmm(a, b, out_dtype=torch.float32)
            _BMM_OUT_DTYPE = True
            return out
        except (RuntimeError, TypeError, NotImplementedError):
            _BMM_OUT_DTYPE = False
    return torch.bmm(a, b).float()


# ---- small public primitives (each has a float64 reference in ``reference.py``) ------------------


def compress_groups(
    groups: torch.Tensor,
    gate: torch.Tensor,
    bias: torch.Tensor,
    extra: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Softmax-gated sum over the m members of each group.

    ``groups [G, m, d]`` -> ``[G, d]``; the gate logits are ``groups @ gate + bias[j]``; ``extra
    [G, m, di]`` (indexer keys) is reduced with the same weights.
    """
    logits = groups.float() @ gate.float() + bias.float()  # [G, m]
    w = torch.softmax(logits, dim=-1).to(groups.dtype).unsqueeze(1)  # [G, 1, m]
    out = torch.bmm(w, groups).squeeze(1)
    out_extra = torch.bmm(w, extra).squeeze(1) if extra is not None else None
    return out, out_extra


INDEXER_IMPL = "auto"  # "auto": Triton where it runs (CUDA), else torch; or force "torch"/"triton"
indexer_path_used: set[str] = set()  # which implementations ran (gpu_check reports it)
indexer_fallback_reason = ""  # why "auto" gave up on Triton, if it did


def indexer_scores(
    iq: torch.Tensor,
    iw: torch.Tensor,
    keys: torch.Tensor,
    *,
    vis: torch.Tensor | None = None,
    max_tmp_bytes: int = 1 << 29,
    impl: str | None = None,
) -> torch.Tensor:
    """Lightning-indexer scores ``[B, Q, N]`` (float32).

    ``iq [B, Q, Hi, di]`` queries, ``iw [B, Q, Hi]`` head weights, ``keys [B, N, di]``:
    ``out[b, q, e] = sum_h iw[b,q,h] * relu(iq[b,q,h] · keys[b,e])``. With ``vis [B, Q]``
    (entries visible to each query) ``TIE_BREAK * e`` is added and entries ``e >= vis`` are
    set to -inf, ready for top-k. On CUDA a fused Triton kernel computes it
    (``triton_indexer.py``); the torch form tiles the ``[B, Q*Hi, N]`` logits over N so each
    tile stays under ``max_tmp_bytes``.
    """
    global indexer_fallback_reason
    b, q, hi, di = iq.shape
    n = keys.shape[1]
    out = empty((b, q, n), dtype=torch.float32, device=iq.device)
    if n == 0 or q == 0:
        return out
    impl = impl or INDEXER_IMPL
    pow2 = di >= 16 and di & (di - 1) == 0
    if impl == "triton" or (
        impl == "auto"
        and not indexer_fallback_reason
        and pow2
        and triton_indexer.available(iq.device)
    ):
        try:
            triton_indexer.indexer_scores_triton(iq, iw, keys, vis, TIE_BREAK, out)
            indexer_path_used.add("triton")
            return out
        except Exception as exc:  # compile/launch failure: fall back for the rest of the run
            if impl == "triton":
                raise
            indexer_fallback_reason = f"{type(exc).__name__}: {exc}"[:500]
    indexer_path_used.add("torch")
    per_col = b * q * hi * iq.element_size() * 2
    tile = max(128, (max_tmp_bytes // max(per_col, 1)) // 128 * 128)
    qf = iq.reshape(b, q * hi, di)
    wf = iw.reshape(b * q, 1, hi).to(iq.dtype)
    for n0 in range(0, n, tile):
        n1 = min(n, n0 + tile)
        logits = torch.bmm(qf, keys[:, n0:n1].transpose(1, 2))  # [B, Q*Hi, nt]
        logits.relu_()
        sc = bmm_f32(wf, logits.view(b * q, hi, n1 - n0))  # [B*Q, 1, nt]
        out[:, :, n0:n1] = sc.view(b, q, n1 - n0)
    if vis is not None:
        ar = torch.arange(n, device=iq.device)
        out.add_(ar * TIE_BREAK)
        out.masked_fill_(ar.view(1, 1, n) >= vis.view(b, q, 1), NEG_INF)
    return out


def _window_scores(
    q: torch.Tensor, kb: torch.Tensor, window: int, kpos0: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocked sliding-window scores.

    ``q [nb*W, H, d]`` (already scaled) are queries at positions ``kpos0 + W + i``; ``kb
    [(nb+1)*W, d]`` are keys at positions ``kpos0 + r`` (rows at negative positions are ignored).
    Returns masked float32 scores ``[nb*W, H, 2W]`` and the key blocks ``[nb, d, 2W]`` (a view).
    """
    w = window
    nq, h, d = q.shape
    nb = nq // w
    kunf = kb.unfold(0, 2 * w, w)  # [nb, d, 2W]: block b holds rows b*W .. b*W+2W-1
    s = bmm_f32(q.reshape(nb, w * h, d), kunf).view(nq, h, 2 * w)
    dev = q.device
    ii = torch.arange(w, device=dev).view(w, 1)
    jj = torch.arange(2 * w, device=dev).view(1, 2 * w)
    band = (jj > ii) & (jj <= ii + w)  # [W, 2W]: key pos in (qpos-W, qpos]
    kpos = kpos0 + torch.arange(nb, device=dev).view(nb, 1) * w + jj  # [nb, 2W]
    allowed = band.unsqueeze(0) & (kpos >= 0).unsqueeze(1)  # [nb, W, 2W]
    s.masked_fill_(~allowed.view(nq, 1, 2 * w), NEG_INF)
    return s, kunf


def sliding_window_attention(
    q: torch.Tensor, kv: torch.Tensor, window: int, scale: float | None = None
) -> torch.Tensor:
    """Causal sliding-window MQA with K=V: ``q [n, H, d]``, ``kv [n, d]`` -> ``[n, H, d]``.

    The blocked form the layer uses (no ``n × n`` matrix); ``reference.ref_window_attention`` is
    the masked full attention it must equal.
    """
    n, h, d = q.shape
    w = window
    scale = d**-0.5 if scale is None else scale
    nb = -(-n // w)
    qp = torch.zeros((nb * w, h, d), dtype=q.dtype, device=q.device)
    qp[:n] = q * scale
    kb = torch.zeros(((nb + 1) * w, d), dtype=kv.dtype, device=kv.device)
    kb[w : w + n] = kv
    s, kunf = _window_scores(qp, kb, w, -w)
    p = torch.softmax(s, dim=-1).to(q.dtype)
    out = torch.bmm(p.view(nb, w * h, 2 * w), kunf.transpose(1, 2)).view(nb * w, h, d)
    return out[:n]


def prefill_query_chunk(
    shape: LayerShape, kind: str, n: int, n_entries: int, max_tmp_bytes: int, elem_bytes: int = 2
) -> int:
    """Queries per prefill chunk (a multiple of the window) so that the chunk's temporaries —
    q and its output, window scores and probabilities, compressed-entry scores (HCA), indexer
    scores, gathered entries and their scores (CSA) — fit in ``max_tmp_bytes``."""
    s, w = shape, shape.window
    per_q = s.heads * 2 * w * 10 + s.heads * s.head_dim * (elem_bytes + 4) * 2
    if kind == "hca":
        per_q += s.heads * n_entries * 10
    elif kind == "csa":
        k = min(s.index_topk, n_entries)
        per_q += n_entries * 12 + k * s.head_dim * elem_bytes + s.heads * k * 10
    n_pad = -(-n // w) * w
    qc = max(w, (max_tmp_bytes // per_q) // w * w)
    return min(qc, n_pad)


def _joint_softmax(s_w: torch.Tensor, s_c: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    s = s_w if s_c is None else torch.cat([s_w, s_c], dim=-1)
    return torch.softmax(s, dim=-1).to(dtype)


# ---- decode plan ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Bucket:
    rows: torch.Tensor  # indices into the B decode sequences
    slots: torch.Tensor  # their pool slots
    n_entries: int  # keys padded to this many compressed entries (0: none visible)
    vis: torch.Tensor | None  # [nb, v] entries visible to each query


@dataclass(slots=True)
class _CompEvent:
    ring_idx: torch.Tensor  # [B] where token i of each sequence lands in the partial group
    done_rows: torch.Tensor | None  # sequences whose group completes with token i
    done_slots: torch.Tensor | None
    done_entry: torch.Tensor | None  # the entry index that completes


class DecodePlan:
    """Everything a decode step needs to know about its B sequences, computed once on the host.

    ``slots`` are pool slots, ``lengths`` the tokens they hold before the step, ``v`` the tokens
    each one adds (1, or the verify length). All layers of the step share the plan; per
    compression factor it caches the buckets and the compressor's events, with their index
    tensors already on the device.
    """

    MIN_BUCKET = 64
    SINGLE = 1 << 62  # min_bucket that puts every sequence in one padded bucket

    def __init__(
        self,
        slots: np.ndarray,
        lengths: np.ndarray,
        v: int,
        device: torch.device | str,
        min_bucket: int | None = None,
    ) -> None:
        self.min_bucket = self.MIN_BUCKET if min_bucket is None else min_bucket
        self.slots = np.asarray(slots, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.slots.shape != self.lengths.shape or self.slots.ndim != 1:
            raise ValueError("slots and lengths must be 1-D and of equal length")
        if v < 1:
            raise ValueError("v must be >= 1")
        self.v = int(v)
        self.device = torch.device(device)
        self.B = int(self.slots.size)
        self.slots_t = to_device(self.slots, self.device)
        self._window: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._comp: dict[int, tuple[list[_CompEvent], list[_Bucket]]] = {}
        self._buckets_cache: dict[int, list[_Bucket]] = {}

    @classmethod
    def from_pool(
        cls, pool: KVPool, seqs: np.ndarray | list[int], v: int, min_bucket: int | None = None
    ) -> DecodePlan:
        seqs = np.asarray(seqs, dtype=np.int64)
        return cls(seqs, pool.lengths[seqs].copy(), v, pool.device, min_bucket)

    @property
    def total_kv(self) -> int:
        return int(self.lengths.sum())

    def window(self, w: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(allowed mask ``[B, v, W+v]``, ring write slots and ring write index ``[B*v]``)."""
        if w not in self._window:
            if self.v > w:
                raise ValueError("cannot verify more tokens than the window holds")
            L = self.lengths[:, None]
            s = np.arange(w)[None, :]
            ring_pos = (L - 1) - np.mod(L - 1 - s, w)  # [B, W]; negative: empty slot
            new_pos = L + np.arange(self.v)[None, :]  # [B, v]
            kpos = np.concatenate([ring_pos, new_pos], axis=1)[:, None, :]
            qpos = new_pos[:, :, None]
            allowed = (kpos <= qpos) & (kpos > qpos - w) & (kpos >= 0)
            wslots = np.repeat(self.slots, self.v)
            widx = (new_pos % w).reshape(-1)
            self._window[w] = (
                to_device(allowed, self.device, torch.bool),
                to_device(wslots, self.device),
                to_device(widx, self.device),
            )
        return self._window[w]

    def compression(self, m: int, max_entries: int) -> tuple[list[_CompEvent], list[_Bucket]]:
        """(compressor events per verify position, varlen buckets) for compression ``m``."""
        if m not in self._comp:
            dev, v, L = self.device, self.v, self.lengths
            if np.any((L + v) // m > max_entries):
                raise ValueError("decode would exceed the pool's max_tokens")
            events: list[_CompEvent] = []
            for i in range(v):
                pos = L + i
                done = np.flatnonzero((pos + 1) % m == 0)
                ev = _CompEvent(to_device(pos % m, dev), None, None, None)
                if done.size:
                    ev.done_rows = to_device(done, dev)
                    ev.done_slots = to_device(self.slots[done], dev)
                    ev.done_entry = to_device((pos[done] + 1) // m - 1, dev)
                events.append(ev)
            self._comp[m] = (events, self.buckets(m))
        return self._comp[m]

    def buckets(self, m: int) -> list[_Bucket]:
        """The varlen buckets for compression ``m`` (0: one bucket, window only)."""
        if m not in self._buckets_cache:
            if m == 0:
                rows = to_device(np.arange(self.B), self.device)
                self._buckets_cache[0] = [_Bucket(rows, self.slots_t, 0, None)]
            else:
                self._buckets_cache[m] = self._buckets(m)
        return self._buckets_cache[m]

    def _buckets(self, m: int) -> list[_Bucket]:
        v = self.v
        n_vis = (self.lengths + v - 1) // m  # entries visible to each sequence's last query
        keys = np.array(
            [0 if n == 0 else max(next_pow2(int(n)), self.min_bucket) for n in n_vis],
            dtype=np.int64,
        )
        out: list[_Bucket] = []
        for key in np.unique(keys):
            rows = np.flatnonzero(keys == key)
            n_ent = int(n_vis[rows].max())
            vis = (self.lengths[rows][:, None] + np.arange(v)[None, :]) // m
            out.append(
                _Bucket(
                    to_device(rows, self.device),
                    to_device(self.slots[rows], self.device),
                    n_ent,
                    to_device(vis, self.device) if n_ent else None,
                )
            )
        return out


# ---- the layer -----------------------------------------------------------------------------------


class AttentionBlock(LayerBlock):
    """Everything of one layer except the routed experts.

    ``y = x + O(attn(RMSNorm(x)))``, then ``y + SharedExpert(RMSNorm(y))`` (SwiGLU, width
    ``shared_experts * expert_width``). ``forward(..., return_ffn_input=True)`` also returns
    ``RMSNorm(y)``, the input of the routed experts.
    """

    def __init__(
        self,
        shape: LayerShape,
        kind: Kind,
        device: torch.device | str | None = None,
        fp8: bool = False,
        seed: int = 0,
        *,
        dtype: torch.dtype | None = None,
        max_tmp_bytes: int = 1 << 30,
    ) -> None:
        if kind not in ("swa", "csa", "hca"):
            raise ValueError(f"unknown attention kind {kind!r}")
        self.shape, self.kind, self.fp8 = shape, kind, fp8
        self.device = as_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.max_tmp_bytes = max_tmp_bytes
        self.m = shape.compression(kind)
        s, dev, dt = shape, self.device, self.dtype
        hd = s.heads * s.head_dim
        seeds = iter(range(seed * 1000 + 1, seed * 1000 + 100))

        def lin(i: int, o: int) -> Linear:
            return Linear(i, o, device=dev, fp8=fp8, dtype=dt, seed=next(seeds))

        self.attn_norm = torch.ones(s.hidden, device=dev, dtype=dt)
        self.q_norm = torch.ones(s.q_lora, device=dev, dtype=dt)
        self.kv_norm = torch.ones(s.head_dim, device=dev, dtype=dt)
        self.ffn_norm = torch.ones(s.hidden, device=dev, dtype=dt)
        self.wq_a = lin(s.hidden, s.q_lora)
        self.wq_b = lin(s.q_lora, hd)
        self.wkv = lin(s.hidden, s.head_dim)
        self.wo_a = GroupedLinear(
            s.o_groups,
            s.heads_per_group * s.head_dim,
            s.o_lora,
            device=dev,
            fp8=fp8,
            dtype=dt,
            seed=next(seeds),
        )
        self.wo_b = lin(s.o_groups * s.o_lora, s.hidden)
        self.w_gate_up = lin(s.hidden, 2 * s.shared_width) if s.shared_width else None
        self.w_down = lin(s.shared_width, s.hidden) if s.shared_width else None
        gen = generator(dev, seed * 1000 + 999)
        if self.m:
            self.gate = randn((s.head_dim,), std=s.head_dim**-0.5, gen=gen, device=dev, dtype=dt)
            self.gate_bias = randn((self.m,), std=0.5, gen=gen, device=dev, dtype=dt)
        self.wiq = self.wik = self.wiw = None
        if kind == "csa":
            self.wiq = lin(s.hidden, s.indexer_heads * s.indexer_dim)
            self.wik = lin(s.hidden, s.indexer_dim)
            self.wiw = lin(s.hidden, s.indexer_heads)
        self.scale = s.head_dim**-0.5

    # ---- cache ----------------------------------------------------------------------------------
    def new_pool(self, max_seqs: int, max_tokens: int, seed: int = 0) -> KVPool:
        s = self.shape
        return KVPool(
            kind=self.kind,
            window=s.window,
            head_dim=s.head_dim,
            compression=self.m,
            indexer_dim=s.indexer_dim,
            max_seqs=max_seqs,
            max_tokens=max_tokens,
            device=self.device,
            dtype=self.dtype,
            seed=seed,
        )

    # ---- public entry points --------------------------------------------------------------------
    def plan_decode(
        self,
        pool: KVPool,
        seqs: np.ndarray | list[int],
        v: int,
        min_bucket: int | None = None,
        share: object = None,
    ) -> DecodePlan:
        """The host-side plan of a decode step of ``seqs`` with ``v`` tokens each (untimed).
        Layers of one step share one plan (``share``: another layer's)."""
        if isinstance(share, DecodePlan):
            return share
        return DecodePlan.from_pool(pool, seqs, v, min_bucket)

    def forward(
        self,
        x: torch.Tensor,
        pool: KVPool,
        prefill: list[tuple[int, int]] | tuple[tuple[int, int], ...] = (),
        decode: DecodePlan | None = None,
        *,
        return_ffn_input: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """A mixed batch: the rows of ``x`` are the prefill segments ``(seq, n)`` in order, then
        the decode rows (``plan.B * plan.v``, sequence-major). Projections, the shared expert and
        the caller's MoE see all rows at once; only attention is per segment / per bucket."""
        s = self.shape
        t = x.shape[0]
        n_dec = decode.B * decode.v if decode is not None else 0
        if sum(n for _, n in prefill) + n_dec != t:
            raise ValueError("rows of x do not match the prefill segments + decode rows")
        h = rms_norm(x, self.attn_norm)
        ql = rms_norm(self.wq_a(h), self.q_norm)
        c = rms_norm(self.wkv(h), self.kv_norm)
        ik = self.wik(h) if self.wik is not None else None
        att = empty((t, s.o_groups * s.o_lora), dtype=self.dtype, device=self.device)
        row = 0
        for seq, n in prefill:
            sl = slice(row, row + n)
            att[sl] = self._prefill_segment(
                pool, seq, h[sl], ql[sl], c[sl], ik[sl] if ik is not None else None
            )
            row += n
        if decode is not None and n_dec:
            sl = slice(row, row + n_dec)
            att[sl] = self._decode_rows(
                pool, decode, h[sl], ql[sl], c[sl], ik[sl] if ik is not None else None
            )
        y = x + self.wo_b(att)
        z = rms_norm(y, self.ffn_norm)
        if self.w_gate_up is not None and self.w_down is not None:
            gu = self.w_gate_up(z)
            f = s.shared_width
            y = y + self.w_down(torch.nn.functional.silu(gu[:, :f]) * gu[:, f:])
        return (y, z) if return_ffn_input else y

    # ---- prefill ---------------------------------------------------------------------------------
    def _prefill_segment(
        self,
        pool: KVPool,
        seq: int,
        h: torch.Tensor,
        ql: torch.Tensor,
        c: torch.Tensor,
        ik: torch.Tensor | None,
    ) -> torch.Tensor:
        s, w, m = self.shape, self.shape.window, self.m
        H, d = s.heads, s.head_dim
        dev, dt = self.device, self.dtype
        pool._check(seq)
        p, n = int(pool.lengths[seq]), c.shape[0]
        pool._check_capacity(p + n)
        out = empty((n, s.o_groups * s.o_lora), dtype=dt, device=dev)
        if n == 0:
            return out

        # window keys: row r of kb holds position p - W + r
        n_pad = -(-n // w) * w
        w0 = min(p, w)
        kb = torch.zeros((w + n_pad, d), dtype=dt, device=dev)
        if w0:
            ring_idx = torch.arange(p - w0, p, device=dev) % w
            kb[w - w0 : w] = pool.window_kv[seq].index_select(0, ring_idx)
        kb[w : w + n] = c

        n_ent = 0
        if m:
            n_ent = self._compress_prefill(pool, seq, p, c, ik)

        qc = prefill_query_chunk(s, self.kind, n, n_ent, self.max_tmp_bytes, dt.itemsize)
        for c0 in range(0, n, qc):
            c1 = min(n, c0 + qc)
            nq = -(-(c1 - c0) // w) * w
            qlc, hc = ql[c0:c1], h[c0:c1]
            if nq != c1 - c0:
                qlc = torch.nn.functional.pad(qlc, (0, 0, 0, nq - (c1 - c0)))
                hc = torch.nn.functional.pad(hc, (0, 0, 0, nq - (c1 - c0)))
            q = (self.wq_b(qlc) * self.scale).view(nq, H, d)
            s_w, kunf = _window_scores(q, kb[c0 : c0 + nq + w], w, p + c0 - w)
            s_c, vals, mode = None, None, ""
            # entries visible to this chunk's last real query
            v_max = min(n_ent, (p + c1 - 1) // m) if m else 0
            if v_max > 0:
                vis = torch.clamp((p + c0 + torch.arange(nq, device=dev)) // m, max=n_ent)
                s_c, vals, mode = self._compressed_scores_prefill(pool, seq, q, hc, vis, v_max)
            prob = _joint_softmax(s_w, s_c, dt)
            o = torch.bmm(
                prob[..., : 2 * w].reshape(nq // w, w * H, 2 * w), kunf.transpose(1, 2)
            ).view(nq, H, d)
            if vals is not None:
                pc = prob[..., 2 * w :]
                if mode == "dense":  # vals: [v_max, d] shared by all queries
                    o += (pc.reshape(nq * H, -1) @ vals).view(nq, H, d)
                else:  # vals: [nq, k, d] gathered per query
                    o += torch.bmm(pc, vals)
            out[c0:c1] = self.wo_a(o.reshape(nq, H * d))[: c1 - c0]

        # append the new tokens to the window ring
        keep = min(n, w)
        pos = torch.arange(p + n - keep, p + n, device=dev)
        pool.window_kv[seq].index_copy_(0, pos % w, c[n - keep :])
        pool.lengths[seq] = p + n
        return out

    def _compress_prefill(
        self, pool: KVPool, seq: int, p: int, c: torch.Tensor, ik: torch.Tensor | None
    ) -> int:
        """Fold the new KV vectors into complete groups; returns the entries now held."""
        m = self.m
        assert pool.ring is not None and pool.comp is not None
        r = p % m
        n = c.shape[0]
        arr = torch.cat([pool.ring[seq, :r], c]) if r else c
        arr_i = None
        if ik is not None:
            assert pool.ring_idx is not None
            arr_i = torch.cat([pool.ring_idx[seq, :r], ik]) if r else ik
        g = (r + n) // m
        e0 = p // m
        if g:
            d = arr.shape[1]
            ent, ent_i = compress_groups(
                arr[: g * m].view(g, m, d),
                self.gate,
                self.gate_bias,
                arr_i[: g * m].view(g, m, -1) if arr_i is not None else None,
            )
            pool.comp[seq, e0 : e0 + g] = ent
            if ent_i is not None:
                assert pool.comp_idx is not None
                pool.comp_idx[seq, e0 : e0 + g] = ent_i
        rest = r + n - g * m
        if rest:
            pool.ring[seq, :rest] = arr[g * m :]
            if arr_i is not None:
                assert pool.ring_idx is not None
                pool.ring_idx[seq, :rest] = arr_i[g * m :]
        return e0 + g

    def _compressed_scores_prefill(
        self,
        pool: KVPool,
        seq: int,
        q: torch.Tensor,
        hc: torch.Tensor,
        vis: torch.Tensor,
        v_max: int,
    ) -> tuple[torch.Tensor, torch.Tensor, str]:
        """Scores ``[nq, H, K]`` over the compressed entries, and the values to weight."""
        s = self.shape
        nq, H, d = q.shape
        assert pool.comp is not None
        ents = pool.comp[seq, :v_max]
        ar = torch.arange(v_max, device=q.device)
        if self.kind == "hca":
            sc = bmm_f32(q.reshape(1, nq * H, d), ents.t().unsqueeze(0)).view(nq, H, v_max)
            sc.masked_fill_((ar.view(1, v_max) >= vis.view(nq, 1)).view(nq, 1, v_max), NEG_INF)
            return sc, ents, "dense"
        assert self.wiq is not None and self.wiw is not None and pool.comp_idx is not None
        iq = self.wiq(hc).view(1, nq, s.indexer_heads, s.indexer_dim)
        iw = self.wiw(hc).view(1, nq, s.indexer_heads)
        isc = indexer_scores(
            iq,
            iw,
            pool.comp_idx[seq, :v_max].unsqueeze(0),
            vis=vis.view(1, nq),
            max_tmp_bytes=self.max_tmp_bytes // 2,
        )[0]
        k = min(s.index_topk, v_max)
        top_v, top_i = isc.topk(k, dim=-1, sorted=False)
        sel = ents.index_select(0, top_i.reshape(-1)).view(nq, k, d)
        sc = bmm_f32(q, sel.transpose(1, 2))  # [nq, H, k]
        sc.masked_fill_(torch.isneginf(top_v).unsqueeze(1), NEG_INF)
        return sc, sel, "gathered"

    # ---- decode ----------------------------------------------------------------------------------
    def _decode_rows(
        self,
        pool: KVPool,
        plan: DecodePlan,
        h: torch.Tensor,
        ql: torch.Tensor,
        c: torch.Tensor,
        ik: torch.Tensor | None,
    ) -> torch.Tensor:
        s, w, m = self.shape, self.shape.window, self.m
        H, d, v, B = s.heads, s.head_dim, plan.v, plan.B
        dev, dt = self.device, self.dtype
        if not np.array_equal(pool.lengths[plan.slots], plan.lengths):
            raise RuntimeError("DecodePlan lengths do not match the pool (stale plan?)")
        if not np.all(pool.in_use[plan.slots]):
            raise KeyError("DecodePlan names a slot that is not allocated")
        if np.any(plan.lengths + v > pool.max_tokens):
            raise ValueError("decode would exceed the pool's max_tokens")
        q = (self.wq_b(ql) * self.scale).view(B, v, H, d)
        c3 = c.view(B, v, d)
        allowed, wslots, widx = plan.window(w)

        buckets = plan.buckets(0)
        if m:
            events, buckets = plan.compression(m, pool.max_entries)
            self._compress_decode(pool, plan, events, c3, ik)
        iq = iw = None
        if self.kind == "csa":
            assert self.wiq is not None and self.wiw is not None
            iq = self.wiq(h).view(B, v, s.indexer_heads, s.indexer_dim)
            iw = self.wiw(h).view(B, v, s.indexer_heads)

        out = empty((B, v, H, d), dtype=dt, device=dev)
        for bk in buckets:
            nb = int(bk.rows.shape[0])
            qb = q.index_select(0, bk.rows)  # [nb, v, H, d]
            kw = torch.cat(
                [pool.window_kv.index_select(0, bk.slots), c3.index_select(0, bk.rows)], 1
            )
            s_w = bmm_f32(qb.view(nb, v * H, d), kw.transpose(1, 2)).view(nb, v, H, w + v)
            s_w.masked_fill_(~allowed.index_select(0, bk.rows).unsqueeze(2), NEG_INF)
            s_c = vals = None
            n_e = bk.n_entries
            if n_e and bk.vis is not None:
                assert pool.comp is not None
                if self.kind == "hca":
                    ar = torch.arange(n_e, device=dev)
                    invis = ar.view(1, 1, n_e) >= bk.vis.unsqueeze(-1)  # [nb, v, n_e]
                    vals = pool.comp[:, :n_e].index_select(0, bk.slots)  # [nb, n_e, d]
                    s_c = bmm_f32(qb.view(nb, v * H, d), vals.transpose(1, 2))
                    s_c = s_c.view(nb, v, H, n_e).masked_fill_(invis.unsqueeze(2), NEG_INF)
                else:
                    assert pool.comp_idx is not None and iq is not None and iw is not None
                    keys = pool.comp_idx[:, :n_e].index_select(0, bk.slots)
                    isc = indexer_scores(
                        iq.index_select(0, bk.rows),
                        iw.index_select(0, bk.rows),
                        keys,
                        vis=bk.vis,
                        max_tmp_bytes=self.max_tmp_bytes // 2,
                    )  # [nb, v, n_e], masked
                    k = min(s.index_topk, n_e)
                    top_v, top_i = isc.topk(k, dim=-1, sorted=False)  # [nb, v, k]
                    flat = bk.slots.view(nb, 1, 1) * pool.max_entries + top_i
                    vals = pool.comp.view(-1, d).index_select(0, flat.reshape(-1))
                    vals = vals.view(nb * v, k, d)
                    s_c = bmm_f32(qb.reshape(nb * v, H, d), vals.transpose(1, 2))
                    s_c = s_c.view(nb, v, H, k).masked_fill_(
                        torch.isneginf(top_v).unsqueeze(2), NEG_INF
                    )
            prob = _joint_softmax(s_w, s_c, dt)  # [nb, v, H, W+v (+K)]
            o = torch.bmm(prob[..., : w + v].reshape(nb, v * H, w + v), kw).view(nb, v, H, d)
            if vals is not None:
                pc = prob[..., w + v :]
                if self.kind == "hca":
                    o += torch.bmm(pc.reshape(nb, v * H, -1), vals).view(nb, v, H, d)
                else:
                    o += torch.bmm(pc.reshape(nb * v, H, -1), vals).view(nb, v, H, d)
            out.index_copy_(0, bk.rows, o)

        # append the new tokens to the window rings
        pool.window_kv.index_put_((wslots, widx), c)
        pool.lengths[plan.slots] += v
        return self.wo_a(out.view(B * v, H * d))

    def _compress_decode(
        self,
        pool: KVPool,
        plan: DecodePlan,
        events: list[_CompEvent],
        c3: torch.Tensor,
        ik: torch.Tensor | None,
    ) -> None:
        assert pool.ring is not None and pool.comp is not None
        ik3 = ik.view(plan.B, plan.v, -1) if ik is not None else None
        for i, ev in enumerate(events):
            pool.ring.index_put_((plan.slots_t, ev.ring_idx), c3[:, i])
            if ik3 is not None:
                assert pool.ring_idx is not None
                pool.ring_idx.index_put_((plan.slots_t, ev.ring_idx), ik3[:, i])
            if ev.done_slots is None or ev.done_entry is None:
                continue
            grp = pool.ring.index_select(0, ev.done_slots)
            grp_i = None
            if ik3 is not None:
                assert pool.ring_idx is not None
                grp_i = pool.ring_idx.index_select(0, ev.done_slots)
            ent, ent_i = compress_groups(grp, self.gate, self.gate_bias, grp_i)
            pool.comp.index_put_((ev.done_slots, ev.done_entry), ent)
            if ent_i is not None:
                assert pool.comp_idx is not None
                pool.comp_idx.index_put_((ev.done_slots, ev.done_entry), ent_i)
