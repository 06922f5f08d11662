"""A ViT encoder at DeepSeek-VL2's vision-encoder scale (the VE stage's compute).

Defaults are SigLIP-SO400M/14 at 384 px, the encoder DeepSeek-VL2 uses: width 1152, 27 layers,
16 heads of 72, MLP 4304 (GELU-tanh), patch 14, 384×384 images -> 27×27 = 729 tokens (the conv
patch embedding has no padding, so the last 6 pixel rows/columns are dropped, as in SigLIP).
Pre-LayerNorm blocks, learned position embeddings, no class token, no pooling head (the VL
adaptor/projector that follows is small and not modelled). Every width is a constructor argument.

72-wide heads are fine for SDPA (flash/efficient kernels take head dims up to 256), so attention
is ``scaled_dot_product_attention``; the linears are ``Linear`` (bf16, or FP8 with ``fp8=True``).

``encode(images)`` runs ``images`` random images through the stack and returns
``[images, tokens, width]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._util import as_device, default_dtype, generator, randn
from .linear import Linear


@dataclass(slots=True)
class ViTBlock:
    ln1: tuple[torch.Tensor, torch.Tensor]  # LayerNorm weight, bias
    qkv: Linear
    proj: Linear
    ln2: tuple[torch.Tensor, torch.Tensor]
    fc1: Linear
    fc2: Linear


class VisionEncoder:
    def __init__(
        self,
        device: torch.device | str | None = None,
        *,
        width: int = 1152,
        layers: int = 27,
        heads: int = 16,
        mlp: int = 4304,
        patch: int = 14,
        image_size: int = 384,
        fp8: bool = False,
        dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        if width % heads:
            raise ValueError("width must divide into heads")
        self.device = as_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.width, self.heads, self.mlp, self.patch = width, heads, mlp, patch
        self.image_size = image_size
        self.grid = image_size // patch
        self.tokens = self.grid * self.grid
        dev, dt = self.device, self.dtype
        seeds = iter(range(seed * 1000 + 1, seed * 1000 + 10 + 8 * layers))

        def lin(i: int, o: int) -> Linear:
            return Linear(i, o, device=dev, fp8=fp8, dtype=dt, seed=next(seeds))

        self.patch_embed = lin(3 * patch * patch, width)
        gen = generator(dev, seed * 1000 + 999)
        self.pos = randn((self.tokens, width), std=0.02, gen=gen, device=dev, dtype=dt)
        self.blocks: list[ViTBlock] = []
        for _ in range(layers):

            def ln() -> tuple[torch.Tensor, torch.Tensor]:
                return torch.ones(width, device=dev, dtype=dt), torch.zeros(
                    width, device=dev, dtype=dt
                )

            self.blocks.append(
                ViTBlock(
                    ln1=ln(),
                    qkv=lin(width, 3 * width),
                    proj=lin(width, width),
                    ln2=ln(),
                    fc1=lin(width, mlp),
                    fc2=lin(mlp, width),
                )
            )
        self._gen = generator(dev, seed * 1000 + 998)

    def patchify(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[B, 3, S, S]`` -> ``[B, grid², 3·patch²]`` (the conv's receptive fields, cropped)."""
        b = pixels.shape[0]
        g, p = self.grid, self.patch
        x = pixels[:, :, : g * p, : g * p].reshape(b, 3, g, p, g, p)
        return x.permute(0, 2, 4, 1, 3, 5).reshape(b, g * g, 3 * p * p)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        b = pixels.shape[0]
        n, w, h = self.tokens, self.width, self.heads
        x = self.patch_embed(self.patchify(pixels.to(self.dtype))) + self.pos
        for blk in self.blocks:
            y = F.layer_norm(x, (w,), *blk.ln1)
            qkv = blk.qkv(y).view(b, n, 3, h, w // h).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
            x = x + blk.proj(a.transpose(1, 2).reshape(b, n, w))
            y = F.layer_norm(x, (w,), *blk.ln2)
            x = x + blk.fc2(F.gelu(blk.fc1(y), approximate="tanh"))
        return x

    __call__ = forward

    def random_images(self, images: int) -> torch.Tensor:
        s = self.image_size
        return (
            torch.rand(
                (images, 3, s, s), generator=self._gen, device=self.device, dtype=torch.float32
            )
            .mul_(2)
            .sub_(1)
        )

    def encode(self, images: int) -> torch.Tensor:
        """Encode ``images`` random images: ``[images, tokens, width]``."""
        return self.forward(self.random_images(images))
