"""The device-side inputs of a decode step, shared by every layer of the step.

A decode step of the deepseek backend computes all its indices on the device from two tensors:
the sequences' pool slots and their lengths before the step. ``DevicePlan`` holds them (and
their host copies); a layer's plan adds the static sizes its kernels need (visible-entry caps,
page-table width), which are what a captured CUDA graph's shapes depend on (``graph_key``).
Plans of one step share the two tensors (``share``), so refilling them (``update``) before a graph
replay serves every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._util import to_device
from ..cache import SlotBook


@dataclass
class DevicePlan:
    slots: np.ndarray
    lengths: np.ndarray
    v: int
    slots_t: torch.Tensor
    lengths_t: torch.Tensor

    @property
    def B(self) -> int:
        return int(self.slots.size)

    @property
    def graph_key(self) -> tuple[int, ...]:
        return ()

    @staticmethod
    def inputs(
        pool: SlotBook, seqs: np.ndarray | list[int], v: int, device: torch.device, share: object
    ) -> tuple[np.ndarray, np.ndarray, torch.Tensor, torch.Tensor]:
        """Host slots and lengths of ``seqs``, and their device tensors (``share``'s when it
        is a plan of the same step)."""
        slots = np.asarray(seqs, dtype=np.int64)
        lengths = pool.lengths[slots].copy()
        if np.any(lengths + v > pool.max_tokens):
            raise ValueError("decode would exceed the pool's max_tokens")
        if isinstance(share, DevicePlan) and share.v == v and np.array_equal(share.slots, slots):
            return slots, lengths, share.slots_t, share.lengths_t
        return slots, lengths, to_device(slots, device), to_device(lengths, device)

    @classmethod
    def step_sched(cls, share: object, slots_t: torch.Tensor) -> dict[Any, Any]:
        """The scheduler-metadata store of the step ``share`` plans (a plan of this class with
        the same slot tensor), or a new one: FlashMLA's metadata is made by a step's first layer
        and reused by the others."""
        if isinstance(share, cls) and share.slots_t is slots_t:
            return share.sched  # type: ignore[attr-defined]
        return {}

    def update(self, pool: SlotBook, seqs: np.ndarray) -> None:
        """Refill the device tensors in place for another step of the same shape (graphs)."""
        slots = np.asarray(seqs, dtype=np.int64)
        if slots.size != self.B:
            raise ValueError("a plan's batch size is fixed")
        self.slots, self.lengths = slots, pool.lengths[slots].copy()
        self.slots_t.copy_(to_device(slots, self.slots_t.device), non_blocking=True)
        self.lengths_t.copy_(to_device(self.lengths, self.lengths_t.device), non_blocking=True)
