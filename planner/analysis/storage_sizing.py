"""Sizing the KV-cache cluster: logical capacity per GPU and storage nodes for a TTL.

``ttl_report`` runs the one-pass TTL sweep (planner/analysis/ttl_sweep.py) over a scenario's
workload and adds, for every TTL, the storage the workload needs (peak resident logical bytes)
and the nodes that holds below the GC high watermark — for the scenario's GPUs, or scaled to
``gpus`` GPUs on the assumption that traffic (and so the resident cache) grows in proportion to
the GPUs serving it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from ...models.registry import load_model
from ...scenario import Scenario, StoragePool
from ...traces import RequestSource
from .ttl_sweep import TtlSweep, ttl_sweep

DEFAULT_TTLS_S = (
    60.0, 300.0, 900.0, 1800.0, 3600.0, 2 * 3600.0, 4 * 3600.0, 8 * 3600.0, 12 * 3600.0,
    86400.0, 2 * 86400.0, 3 * 86400.0, 5 * 86400.0, 7 * 86400.0, 14 * 86400.0,
)  # fmt: skip


def node_logical_bytes(cfg: StoragePool) -> float:
    """Logical KV bytes one node holds below the GC high watermark."""
    return cfg.node_physical_bytes * cfg.data_chunks / cfg.width * cfg.high_watermark


def nodes_for(cfg: StoragePool, logical_bytes: float) -> int:
    """Storage nodes (whole coding groups) that hold ``logical_bytes`` below the watermark."""
    if logical_bytes <= 0:
        return 0
    groups = math.ceil(logical_bytes / (node_logical_bytes(cfg) * cfg.width))
    return groups * cfg.width


def block_bytes(sc: Scenario, source: RequestSource) -> float:
    return load_model(sc.model).kv_bytes_per_token() * source.block_tokens


def ttl_report(
    sc: Scenario,
    source: RequestSource,
    ttls_s: Sequence[float] = DEFAULT_TTLS_S,
    capacities_blocks: Sequence[float] | None = None,
    gpus: int | None = None,
) -> tuple[TtlSweep, pd.DataFrame]:
    """The sweep and its frame with storage columns: ``needed_tb`` (peak resident logical bytes,
    scaled to ``gpus``), ``nodes_needed`` and ``tb_per_gpu``. The scenario's per-class TTLs are
    evaluated too (policy ``class_ttl``)."""
    cfg = sc.pools.storage
    class_ttl = {name: cfg.ttl_for(name) for name in source.class_names}
    sweep = ttl_sweep(
        source, ttls_s, capacities_blocks, class_ttl, block_bytes=block_bytes(sc, source)
    )
    frame = sweep.frame.copy()
    base = sc.pools.gpus
    target = gpus or base
    needed = frame["peak_resident_bytes"] * (target / base)
    frame["gpus"] = target
    frame["needed_tb"] = needed / 1e12
    frame["tb_per_gpu"] = frame["needed_tb"] / target
    frame["nodes_needed"] = [nodes_for(cfg, float(b)) for b in needed]
    return sweep, frame
