"""FlashMLA's FP8 ``MODEL1`` KV-cache layout (V4 attention), written and read with torch ops.

One cached vector of width d = d_nope + d_rope is stored as d_nope e4m3 values in tiles of
``tile`` values, one power-of-two (UE8M0) scale byte per tile, and d_rope bf16 values. FlashMLA's
``MODEL1`` numbers are d = 512 = 448 + 64, tile 64, so 7 scale bytes (+1 pad) per token. A page
block of ``block`` tokens holds, in this order (``tests/quant.py`` of FlashMLA):

* ``block × (d_nope + 2·d_rope)`` bytes: per token its e4m3 values then its bf16 rope values;
* ``block × (tiles + 1)`` bytes: per token its scale exponents (``2**(byte − 127)``) and a pad;

and the block is padded to a multiple of 576 bytes. The kernel receives the cache as a
``[blocks, block, 1, bytes_per_token]`` view whose block stride is the padded size; a token is
addressed by ``block_index * block + offset``.

``Model1Layout(d, d_rope, tile)`` generalizes the numbers so CPU tests can run toy widths through
the same code; ``Model1Layout.flashmla()`` is the one the real kernel reads. Writes are index
scatters (no host sync), so a decode step that writes its new tokens can be captured in a CUDA
graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
PAD_TO = 576


@dataclass(frozen=True, slots=True)
class Model1Layout:
    d: int
    d_rope: int
    tile: int

    @classmethod
    def flashmla(cls) -> Model1Layout:
        return cls(512, 64, 64)

    @classmethod
    def for_head_dim(cls, d: int) -> Model1Layout:
        """FlashMLA's layout at d = 512; a proportional one at toy widths (d/8 rope, d/8 tiles)."""
        if d == 512:
            return cls.flashmla()
        rope = max(1, d // 8)
        nope = d - rope
        return cls(d, rope, nope // 7 if nope % 7 == 0 else nope)

    def __post_init__(self) -> None:
        if self.d_nope <= 0 or self.d_nope % self.tile:
            raise ValueError("the no-rope width must be a positive multiple of the tile")

    @property
    def d_nope(self) -> int:
        return self.d - self.d_rope

    @property
    def tiles(self) -> int:
        return self.d_nope // self.tile

    @property
    def data_bytes(self) -> int:
        return self.d_nope + 2 * self.d_rope

    @property
    def scale_bytes(self) -> int:
        return self.tiles + 1

    @property
    def bytes_per_token(self) -> int:
        return self.data_bytes + self.scale_bytes

    def block_bytes(self, block: int) -> int:
        raw = block * self.bytes_per_token
        return -(-raw // PAD_TO) * PAD_TO


class Model1Cache:
    """``n_blocks`` page blocks of ``block`` tokens in the MODEL1 layout, on one device.

    ``exact=True`` (tests) keeps float32 values beside the bytes and reads those: the same
    indexing with no FP8 rounding, so index logic can be checked to float precision.
    """

    def __init__(
        self,
        layout: Model1Layout,
        n_blocks: int,
        block: int,
        device: torch.device,
        exact: bool = False,
    ) -> None:
        self.layout, self.n_blocks, self.block, self.device = layout, n_blocks, block, device
        self.exact = (
            torch.zeros((n_blocks, block, layout.d), dtype=torch.float32, device=device)
            if exact
            else None
        )
        self.stride = layout.block_bytes(block)
        self.buf = torch.zeros((n_blocks, self.stride), dtype=torch.uint8, device=device)
        lay = layout
        # [blocks, block, bytes] views of each block's token data and scale bytes
        self.data = self.buf[:, : block * lay.data_bytes].unflatten(1, (block, lay.data_bytes))
        self.scales = self.buf[:, block * lay.data_bytes : block * lay.bytes_per_token].unflatten(
            1, (block, lay.scale_bytes)
        )

    @property
    def tokens(self) -> int:
        return self.n_blocks * self.block

    def kernel_view(self) -> torch.Tensor:
        """``[blocks, block, 1, bytes_per_token]`` (float8 bytes, block stride padded)."""
        bpt = self.layout.bytes_per_token
        return self.buf.view(FP8).as_strided(
            (self.n_blocks, self.block, 1, bpt), (self.stride, bpt, bpt, 1)
        )

    def write(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        """Quantize ``values [n, d]`` into token rows ``rows [n]`` (int64, no host sync)."""
        data, scale = quantize(values, self.layout)
        at = (rows // self.block, rows % self.block)
        self.data.index_put_(at, data)
        self.scales.index_put_(at, scale)
        if self.exact is not None:
            self.exact.index_put_(at, values.float())

    def read(self, rows: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Dequantized ``[n, d]`` of token rows ``rows``."""
        at = (rows // self.block, rows % self.block)
        if self.exact is not None:
            return self.exact[at].to(dtype)
        return dequantize(self.data[at], self.scales[at], self.layout, dtype)

    def fill_random(self, generator: torch.Generator | None = None) -> None:
        """Every token row a random vector of unit RMS (timing states; no compute)."""
        lay, n = self.layout, self.tokens
        step = max(1, (1 << 26) // max(lay.d, 1))
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            x = torch.randn((r1 - r0, lay.d), generator=generator, device=self.device)
            rows = torch.arange(r0, r1, device=self.device)
            self.write(rows, x.to(torch.bfloat16))


def quantize(x: torch.Tensor, lay: Model1Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """(data bytes ``[n, data_bytes]``, scale bytes ``[n, scale_bytes]``) of ``x [n, d]``."""
    n = x.shape[0]
    nope = x[:, : lay.d_nope].float().view(n, lay.tiles, lay.tile)
    inv = (nope.abs().amax(-1) / FP8_MAX).clamp_min(1e-4)
    exp = torch.ceil(torch.log2(inv))  # UE8M0: the scale is a power of two
    q = (nope / torch.exp2(exp).unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    rope = x[:, lay.d_nope :].to(torch.bfloat16).contiguous()
    data = torch.cat([q.view(n, lay.d_nope).view(torch.uint8), rope.view(torch.uint8)], dim=1)
    sc = torch.zeros((n, lay.scale_bytes), dtype=torch.uint8, device=x.device)
    sc[:, : lay.tiles] = (exp + 127).clamp_(0, 254).to(torch.uint8)
    return data, sc


def dequantize(
    data: torch.Tensor, scales: torch.Tensor, lay: Model1Layout, dtype: torch.dtype
) -> torch.Tensor:
    n = data.shape[0]
    q = data[:, : lay.d_nope].contiguous().view(FP8).float().view(n, lay.tiles, lay.tile)
    s = torch.exp2(scales[:, : lay.tiles].float() - 127.0).unsqueeze(-1)
    rope = data[:, lay.d_nope :].contiguous().view(torch.bfloat16).float()
    return torch.cat([(q * s).view(n, lay.d_nope), rope], dim=1).to(dtype)
