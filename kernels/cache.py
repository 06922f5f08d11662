"""KVPool: one layer's cache state for many sequences.

Layout (S = max_seqs slots, one per sequence; d = head_dim, m = compression, W = window):

==================  ===================  ====================================================
``window``          ``[S, W, d]``        ring of the last W KV vectors: position t at ``t % W``
``ring``            ``[S, m, d]``        the partial compression group: position t at ``t % m``
``ring_idx``        ``[S, m, di]``       the same for the indexer keys (CSA only)
``comp``            ``[S, E, d]``        compressed entries, E = ceil(max_tokens / m)
``comp_idx``        ``[S, E, di]``       compressed indexer keys (CSA only)
``lengths``         ``[S]`` (numpy)      tokens held per slot, kept on the host
==================  ===================  ====================================================

Window-only layers (``compression == 0``) have ``window`` alone. Everything is held in the compute
dtype (bf16 on CUDA); the production formats (FP8 window and main KV, FP4 indexer) would halve or
quarter these bytes but not change the arithmetic the kernels time.

The pool is filled with random unit-RMS values when it is made, so ``fill_random(seq, n)`` only
has to set a length: the sequence then "holds" n tokens of random cache state, which costs no
compute (used to time a step at a given prefix length). Lengths live on the host because the
kernels need them to plan their work (buckets, chunk sizes) without a device round trip.

``truncate`` rolls a sequence back after a speculative verify rejected some tokens. It resets the
length only: window and partial-group slots that the rejected tokens overwrote keep those values.
The numbers then differ from an exact rollback, the amount of work does not.
"""

from __future__ import annotations

import numpy as np
import torch

from ._util import default_dtype, generator, randn


class SlotBook:
    """Host-side bookkeeping of a cache pool's sequence slots: which are in use and how many
    tokens each holds. A pool sets ``max_seqs``, ``max_tokens``, ``lengths`` (int64) and
    ``in_use`` (bool) and inherits the rest (every backend's pool shares it)."""

    max_seqs: int
    max_tokens: int
    lengths: np.ndarray
    in_use: np.ndarray

    # ---- slots ----------------------------------------------------------------------------------
    def alloc(self, seq: int | None = None) -> int:
        """Claim slot ``seq`` (or the lowest free one) for a new, empty sequence."""
        if seq is None:
            free = np.flatnonzero(~self.in_use)
            if free.size == 0:
                raise RuntimeError("KV pool full")
            seq = int(free[0])
        if not 0 <= seq < self.max_seqs:
            raise IndexError(f"slot {seq} outside pool of {self.max_seqs}")
        if self.in_use[seq]:
            raise RuntimeError(f"slot {seq} already in use")
        self.in_use[seq] = True
        self.lengths[seq] = 0
        return seq

    def free(self, seq: int) -> None:
        self._check(seq)
        self.in_use[seq] = False
        self.lengths[seq] = 0

    def fill_random(self, seq: int, n_tokens: int) -> None:
        """Make ``seq`` hold ``n_tokens`` tokens of (random) cache state, computing nothing."""
        self._check(seq)
        self._check_capacity(n_tokens)
        self.lengths[seq] = n_tokens

    def truncate(self, seq: int, n_tokens: int) -> None:
        self._check(seq)
        if not 0 <= n_tokens <= self.lengths[seq]:
            raise ValueError("truncate can only shorten a sequence")
        self.lengths[seq] = n_tokens

    def length(self, seq: int) -> int:
        return int(self.lengths[seq])

    # ---- checks ---------------------------------------------------------------------------------
    def _check(self, seq: int) -> None:
        if not (0 <= seq < self.max_seqs and self.in_use[seq]):
            raise KeyError(f"slot {seq} is not allocated")

    def _check_capacity(self, n_tokens: int) -> None:
        if n_tokens > self.max_tokens:
            raise ValueError(f"{n_tokens} tokens exceed the pool's max_tokens {self.max_tokens}")


class KVPool(SlotBook):
    def __init__(
        self,
        *,
        kind: str,
        window: int,
        head_dim: int,
        compression: int,
        indexer_dim: int,
        max_seqs: int,
        max_tokens: int,
        device: torch.device,
        dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        if max_seqs <= 0 or max_tokens <= 0:
            raise ValueError("max_seqs and max_tokens must be positive")
        self.kind = kind
        self.window = window
        self.head_dim = head_dim
        self.compression = compression
        self.indexer_dim = indexer_dim if kind == "csa" else 0
        self.max_seqs = max_seqs
        self.max_tokens = max_tokens
        self.device = device
        self.dtype = dtype or default_dtype(device)
        gen = generator(device, seed)

        def rnd(*shape: int) -> torch.Tensor:
            return randn(shape, std=1.0, gen=gen, device=device, dtype=self.dtype)

        self.window_kv = rnd(max_seqs, window, head_dim)
        self.max_entries = -(-max_tokens // compression) if compression else 0
        self.ring: torch.Tensor | None = None
        self.comp: torch.Tensor | None = None
        self.ring_idx: torch.Tensor | None = None
        self.comp_idx: torch.Tensor | None = None
        if compression:
            self.ring = rnd(max_seqs, compression, head_dim)
            self.comp = rnd(max_seqs, self.max_entries, head_dim)
            if self.indexer_dim:
                self.ring_idx = rnd(max_seqs, compression, self.indexer_dim)
                self.comp_idx = rnd(max_seqs, self.max_entries, self.indexer_dim)
        self.lengths = np.zeros(max_seqs, dtype=np.int64)
        self.in_use = np.zeros(max_seqs, dtype=bool)

    @property
    def nbytes(self) -> int:
        ts = [self.window_kv, self.ring, self.comp, self.ring_idx, self.comp_idx]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)
