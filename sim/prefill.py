"""Prefill instances: one SimPy process per instance, one event per engine step.

An instance is EP = DP GPUs. Each step it takes queued requests first-come-first-served, places
each whole prompt on the DP rank with the fewest tokens so far (within the per-rank token
budget), and charges the step time the pool's StepCost gives for those per-rank chunks. A prompt
larger than the budget runs alone in its own step. Finished prompts are handed to ``on_done``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import simpy

from ..models.cost import Chunk, StepCost
from .requests import RequestTable, State
from .steploop import StepLoop


class PrefillInstance(StepLoop):
    __slots__ = (
        "batch",
        "busy_s",
        "cost",
        "dp",
        "idx",
        "imbalance",
        "max_tokens",
        "on_done",
        "queue",
        "queued_tokens",
        "running_tokens",
        "steps",
        "table",
        "tokens_done",
    )

    def __init__(
        self,
        env: simpy.Environment,
        idx: int,
        cost: StepCost,
        dp: int,
        max_tokens_per_step: int,
        imbalance: float,
        table: RequestTable,
        on_done: Callable[[int, int], None],
    ) -> None:
        super().__init__(env)
        self.idx = idx
        self.cost = cost
        self.dp = dp
        self.max_tokens = max_tokens_per_step
        self.imbalance = imbalance
        self.table = table
        self.on_done = on_done
        self.queue: deque[int] = deque()
        self.queued_tokens = 0  # tokens waiting (router's outstanding-work signal)
        self.running_tokens = 0
        self.busy_s = 0.0
        self.steps = 0
        self.tokens_done = 0
        self.batch: list[int] = []

    @property
    def outstanding_tokens(self) -> int:
        return self.queued_tokens + self.running_tokens

    def submit(self, rid: int) -> None:
        self.queue.append(rid)
        self.queued_tokens += int(self.table.input_len[rid])
        self.table.state[rid] = State.PREFILL
        self.table.prefill_instance[rid] = self.idx
        self.kick()

    def _take_batch(self) -> tuple[list[int], list[list[Chunk]], int]:
        """FCFS whole prompts onto the least-loaded DP rank, within the per-rank budget."""
        load = [0] * self.dp
        placed: list[list[Chunk]] = [[] for _ in range(self.dp)]
        batch: list[int] = []
        lengths = self.table.input_len
        tokens = 0
        while self.queue:
            rid = self.queue[0]
            n = int(lengths[rid])
            rank = load.index(min(load))
            if batch and load[rank] + n > self.max_tokens:
                break
            self.queue.popleft()
            load[rank] += n
            placed[rank].append((n, 0))
            batch.append(rid)
            tokens += n
        return batch, placed, tokens

    def begin_step(self) -> float | None:
        if not self.queue:
            return None
        batch, placed, tokens = self._take_batch()
        self.queued_tokens -= tokens
        self.running_tokens = tokens
        self.batch = batch
        self.table.t_prefill_start[batch] = self.env.now
        return self.cost.prefill_step(placed, self.imbalance)

    def end_step(self, dt: float) -> None:
        self.busy_s += dt
        self.steps += 1
        self.tokens_done += self.running_tokens
        self.running_tokens = 0
        now = self.env.now
        for rid in self.batch:
            self.table.t_prefill_end[rid] = now
            self.on_done(rid, self.idx)
