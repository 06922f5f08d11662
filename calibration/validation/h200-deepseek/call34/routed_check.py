"""Device call 34 (run as kernels/routed_gemm_check.py): DSMoEBlock's routed experts on the
per-bucket faster kernel against torch's alone (relative norm of the difference)."""

import json
import os
import sys

import torch

from deepinfer_sim.kernels.backend import get_backend
from deepinfer_sim.kernels.deepseek.moe import ROUTED_TIMINGS
from deepinfer_sim.kernels.shapes import LayerShape
from deepinfer_sim.models.registry import load_model

out: dict[str, object] = {}
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
for name in ("deepseek-v3", "deepseek-v4.1-flash"):
    spec = load_model(name)
    for tp in (1, 4, 8):
        shape = LayerShape.from_model(spec, 8).scaled(expert_width=spec.moe.expert_width // tp)
        block = get_backend("deepseek").moe_block(shape, DEV, True, seed=3)
        x = torch.randn(1024, shape.hidden, device=DEV).to(block.dtype)
        ids, _ = block.route(x)
        rows, offs = block.prepare_experts(x, ids)
        os.environ["DEEPINFER_ROUTED_GEMM"] = "torch"
        a = block.forward_experts(rows, offs).float()
        del os.environ["DEEPINFER_ROUTED_GEMM"]
        b = block.forward_experts(rows, offs).float()
        out[f"{name}@moetp{tp}"] = float((a - b).norm() / a.norm())
out["timings"] = {str(k): v for k, v in ROUTED_TIMINGS.items()}
json.dump(out, sys.stdout, indent=1)
