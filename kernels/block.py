"""``LayerBlock``: the prefill / decode entry points every backend's attention block shares.

A block implements ``forward(x, pool, prefill=[(seq, n), ...], decode=plan, return_ffn_input=...)``
over a mixed batch and ``plan_decode(pool, seqs, v)``; this mixin derives from them the two
calls the calibration times: ``prefill(x, pool, seq)`` (n new tokens of one sequence) and
``decode(x [B, v, hidden], pool, plan or slots)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class LayerBlock:
    def forward(self, x: torch.Tensor, pool: Any, prefill: Any = (), decode: Any = None, *,
                return_ffn_input: bool = False) -> Any:  # fmt: skip
        raise NotImplementedError

    def plan_decode(self, pool: Any, seqs: Any, v: int, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError

    def prefill(
        self, x: torch.Tensor, pool: Any, seq: int, *, return_ffn_input: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x [n, hidden]``: n new tokens of sequence ``seq`` after its cached prefix."""
        return self.forward(x, pool, prefill=[(seq, x.shape[0])], return_ffn_input=return_ffn_input)

    def decode(
        self, x: torch.Tensor, pool: Any, plan: Any, *, return_ffn_input: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x [B, v, hidden]``: v new tokens for each of B sequences (a plan, or their slots)."""
        b, v, dmodel = x.shape
        if isinstance(plan, (np.ndarray, list, tuple)):
            plan = self.plan_decode(pool, np.asarray(plan), v)
        res = self.forward(
            x.reshape(b * v, dmodel), pool, decode=plan, return_ffn_input=return_ffn_input
        )
        if isinstance(res, tuple):
            return res[0].view(b, v, dmodel), res[1].view(b, v, dmodel)
        return res.view(b, v, dmodel)
