"""Seeded random streams: one independent ``numpy.random.Generator`` per named component.

``stream(seed, "workload")`` always yields the same generator for the same seed and name, and
streams of different names are statistically independent (SeedSequence spawn keys), so adding a
random component never shifts the numbers another component draws.
"""

from __future__ import annotations

import zlib

import numpy as np


def stream(seed: int, name: str) -> np.random.Generator:
    key = zlib.crc32(name.encode("utf-8"))
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,)))
