"""Multimodal requests from the ServeGen mm-image distributions, and the VE stage they feed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from deepinfer_sim import simulate
from deepinfer_sim.traces.synth.multimodal import (
    MultimodalWorkload,
    generate_multimodal,
    pool_servegen,
    shipped_pmfs,
)

SERVEGEN = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "servegen_mm_image"


def pmf_mean(pmf: dict) -> float:
    return float(np.dot(pmf["values"], pmf["probs"]))


@pytest.mark.skipif(not SERVEGEN.exists(), reason="needs ../shared/traces/servegen_mm_image")
def test_shipped_pmfs_are_the_rate_weighted_pool_of_the_servegen_files() -> None:
    pooled = pool_servegen(SERVEGEN)
    shipped = shipped_pmfs()
    for field, pmf in pooled.items():
        assert shipped[field]["values"] == pmf["values"]
        assert np.allclose(shipped[field]["probs"], pmf["probs"])


def test_requests_follow_the_distributions_and_are_deterministic() -> None:
    cfg = MultimodalWorkload(requests_per_s=20.0)
    a = generate_multimodal(cfg, 3600.0, seed=3)
    b = generate_multimodal(cfg, 3600.0, seed=3)
    assert np.array_equal(a.input_len, b.input_len) and np.array_equal(a.arrival_s, b.arrival_s)
    assert len(a) == pytest.approx(72_000, rel=0.02)
    pmfs = shipped_pmfs()
    assert a.image_count.mean() == pytest.approx(pmf_mean(pmfs["image_count"]), rel=0.03)
    assert a.output_len.mean() == pytest.approx(pmf_mean(pmfs["output_tokens"]), rel=0.03)
    assert a.class_names == ("multimodal",)
    assert a.prefix_hit_tokens().sum() == 0  # no two requests share an image
    assert not np.array_equal(a.input_len, generate_multimodal(cfg, 3600.0, seed=4).input_len)


def test_mixed_workload_runs_through_the_vision_encoders(tiny) -> None:
    sc = tiny(**{"pools.vision.instances": 2, "workload.multimodal": {"requests_per_s": 2.0}})
    result = simulate(sc)
    vision = result.summary["vision"]
    frame = result.requests
    with_images = frame[frame["images"] > 0]
    assert vision["requests"] == len(with_images) > 0
    assert vision["images"] == int(with_images["images"].sum())
    assert 0 < vision["ve_utilization"] < 1
    assert vision["stage_s"]["p99"] >= vision["encode_s"]["p50"]
    assert result.summary["requests"]["completed"] == len(frame)
    assert "multimodal" in result.summary["cache"]["by_class"]
