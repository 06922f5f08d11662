"""HardwareSpec: one accelerator kind, read from ``configs/hardware/*.yaml``.

Datasheet leads only (dense rates, HBM, links). The roofline cost model scales them by efficiency
factors; calibrated profiles replace them with measurements.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..validation import FrozenModel
from .power_limit import SustainedClock


class FlopRates(FrozenModel):
    bf16: float = Field(gt=0)
    fp8: float | None = Field(None, gt=0)
    fp4: float | None = Field(None, gt=0)
    int8: float | None = Field(
        None, gt=0, description="INT8 tensor rate (W8A8); None: INT8 runs at the FP8 rate"
    )


class ScaleUp(FrozenModel):
    bytes_per_s_per_dir: float = Field(gt=0)
    domain_gpus: int = Field(ge=1)
    latency_s: float = Field(ge=0)


class ScaleOut(FrozenModel):
    gbps_per_gpu: float = Field(gt=0)
    latency_s: float = Field(ge=0)

    @property
    def bytes_per_s(self) -> float:
        return self.gbps_per_gpu * 1e9 / 8


class HardwareSpec(FrozenModel):
    name: str
    display_name: str
    vendor: Literal["nvidia", "huawei", "amd", "other"]
    arch: str
    flops_per_s: FlopRates
    hbm_bytes: float = Field(gt=0)
    hbm_bytes_per_s: float = Field(gt=0)
    gpus_per_node: int = Field(ge=1)
    host_memory_bytes_per_gpu: float = Field(ge=0)
    scaleup: ScaleUp
    scaleout: ScaleOut
    sm_count: int | None = Field(
        None,
        ge=1,
        description="streaming multiprocessors, where the datasheet states them: how many query "
        "tiles an attention kernel runs at once (PrefillCoef.wave_tiles moves with them when a "
        "profile is derived); None: not stated, a derived profile keeps the measured GPU's",
    )
    sustained_clock: SustainedClock | None = Field(
        None,
        description="compute-bound work's slowdown at the power limit, where measured "
        "(models/power_limit.py); None: not measured, no slowdown",
    )

    def flops(self, compute_class: str) -> float:
        """Dense FLOP/s of a compute class; a missing low-precision unit runs at the next wider
        (INT8: at the FP8 rate, else BF16)."""
        if compute_class == "int8":
            rate8 = self.flops_per_s.int8
            return float(rate8) if rate8 is not None else self.flops("fp8")
        order = ["fp4", "fp8", "bf16"]
        start = order.index(compute_class) if compute_class in order else 2
        for cls in order[start:]:
            rate = getattr(self.flops_per_s, cls)
            if rate is not None:
                return float(rate)
        raise AssertionError("bf16 rate is required")  # pragma: no cover - schema guarantees it
