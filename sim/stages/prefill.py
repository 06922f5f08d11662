"""Prefill instances: chunked prefill on EP = DP ranks, one event per engine step.

Each request admitted to an instance is placed on the DP rank with the least outstanding work
and joins that rank's first-come-first-served list. Every step, each rank walks its list and its
chunk policy (``sim/policies/chunking.py``, the ``pools.prefill.scheduler`` tag) says how many
tokens of each sequence go into the step and when the step is full. The rank keeps its budgets:
the step-time budget less the fitted quadratic's fixed term a, each chunk charged
b·n + c·n·p + d·n², and the token budget (32,768 by default). The default policy gives each
sequence the largest chunk that still fits both, so several sequences share a step and a long
prompt spans several steps; ``whole`` is the first-come-first-served whole-prompt baseline. Each
chunk attends to everything computed before it (p grows).

SWA replay rides along: a request whose prefix-cache hit has no SWA slot first recomputes the
last tokens of the hit prefix through the prefill layers (counted as replay, not as new tokens),
and when a prompt's last chunk runs, its decoder-layer replay segment (128 tokens bounded, 2,560
exact) runs in the same step through the decoder layers. The step time comes from
``StepCost.prefill_step`` on the exact chunks, not from the fitted quadratic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np
import simpy

from ...models.cost import Chunk, StepCost
from ...models.power_limit import BusyShare
from ..core.requests import RequestTable, State
from ..core.steploop import StepLoop
from ..policies.chunking import ChunkPolicy, chunk_time
from .expert_parallel import GroupExperts


class PrefillSeq:
    """A prompt being prefilled: positions [pos, end) still to compute."""

    __slots__ = ("dec_replay", "enc_left", "end", "pos", "rank", "rid")

    def __init__(self, rid: int, rank: int, start: int, end: int, enc: int, dec: int) -> None:
        self.rid = rid
        self.rank = rank
        self.pos = start  # next position to compute (the computed prefix)
        self.end = end
        self.enc_left = enc  # leading positions that are encoder SWA replay, not new tokens
        self.dec_replay = dec  # decoder-layer replay tokens run with the last chunk


class PrefillStats:
    __slots__ = ("chunk_tokens", "compute_tokens", "flops", "replay_flops", "replay_tokens")

    def __init__(self) -> None:
        self.chunk_tokens = 0  # positions scheduled in chunks (new + encoder replay): the budget
        self.compute_tokens = 0
        self.replay_tokens = 0
        self.flops = 0.0
        self.replay_flops = 0.0

    def count(
        self, seq: PrefillSeq, n: int, replay: int, flops: Callable[[int, int, bool], float]
    ) -> None:
        """A chunk of ``n`` positions of ``seq`` (before its ``pos`` moves on) ran, with
        ``replay`` decoder-layer replay tokens: its encoder-replay part, computed tokens, FLOPs."""
        enc = min(n, seq.enc_left)
        seq.enc_left -= enc
        self.chunk_tokens += n
        self.compute_tokens += n - enc
        self.replay_tokens += enc + replay
        f = flops(n, seq.pos, False)
        self.flops += f
        if replay:
            rf = flops(replay, seq.end - replay, True)
            self.flops += rf
            self.replay_flops += rf
        if enc:
            self.replay_flops += f * enc / n


def fill_rank(
    seqs: Iterable[PrefillSeq],
    chunking: ChunkPolicy,
    time_left: float,
    tokens_left: int,
    quad: tuple[float, float, float],
    chunks: list[Chunk],
    replays: list[Chunk],
    running: list[tuple[PrefillSeq, int, int]],
) -> None:
    """One DP rank's chunks of a step: walk its sequences in order and let the chunk policy
    say how many tokens of each go in (``time_left`` past the quadratic's fixed term and
    ``tokens_left`` free; ``quad``: its per-sequence terms b, c, d), until one gets none or the
    step is full. Appends each chunk (n, computed prefix) to ``chunks``, the decoder-layer
    replay segment of a prompt whose last chunk runs to ``replays``, and (seq, n, replay) to
    ``running``. ``seqs`` may be lazy: a sequence is asked for only while the step has room."""
    b, c, d = quad
    take, full = chunking.take, chunking.full
    for seq in seqs:
        remaining = seq.end - seq.pos
        n = take(remaining, seq.pos, time_left, tokens_left, not chunks, b, c, d)
        if n <= 0:
            break
        chunks.append((n, seq.pos))
        replay = 0
        if n == remaining and seq.dec_replay:
            replay = seq.dec_replay
            replays.append((replay, seq.end - replay))
        running.append((seq, n, replay))
        time_left -= chunk_time(n, seq.pos, b, c, d)
        tokens_left -= n
        if full(time_left, tokens_left):
            break


def mark_started(
    running: Iterable[tuple[PrefillSeq, int, int]], start_col: np.ndarray, now: float
) -> None:
    """Stamp ``t_prefill_start`` of the requests whose first chunk is in this step."""
    for seq, _, _ in running:
        if start_col[seq.rid] != start_col[seq.rid]:  # NaN: first chunk of this request
            start_col[seq.rid] = now


class PrefillEngine(Protocol):
    """What the prefill path, its router and the admission policy ask of an engine that runs
    prompts: a :class:`PrefillInstance`, or an aggregated instance
    (``sim/stages/aggregated.py``) that decodes them too."""

    idx: int
    machine: int
    dp: int
    outstanding_s: float  # predicted seconds of work queued here (router signal)
    quad: tuple[float, float, float, float]
    stats: PrefillStats
    experts: GroupExperts | None

    @property
    def queued(self) -> int: ...

    def predicted_s(self, n: int, p: int) -> float: ...

    def submit(self, rid: int, start: int, enc_replay: int, dec_replay: int) -> None: ...

    def report(self, now: float) -> dict[str, Any]: ...


class PrefillInstance(StepLoop):
    __slots__ = (
        "busy_s",
        "busy_share",
        "chunking",
        "clock",
        "cost",
        "dp",
        "experts",
        "flops",
        "idx",
        "imbalance",
        "machine",
        "max_tokens",
        "on_done",
        "outstanding_s",
        "quad",
        "rank_tokens",
        "ranks",
        "slowdown",
        "slowdown_sum",
        "stats",
        "step_items",
        "steps",
        "table",
        "time_budget",
        "traffic_class",
    )

    def __init__(
        self,
        *,
        env: simpy.Environment,
        idx: int,
        machine: int,
        cost: StepCost,
        dp: int,
        max_tokens_per_step: int,
        step_time_budget_s: float,
        imbalance: float,
        table: RequestTable,
        flops: Callable[[int, int, bool], float],
        on_done: Callable[[int, int], None],
        chunking: ChunkPolicy,
        experts: GroupExperts | None = None,
        traffic_class: np.ndarray | None = None,
    ) -> None:
        super().__init__(env)
        self.experts = experts  # live expert imbalance; None: the constant ``imbalance``
        self.traffic_class = traffic_class
        self.chunking = chunking  # how much of each queued sequence a step takes
        self.idx = idx
        self.machine = machine
        self.cost = cost
        self.dp = dp
        self.max_tokens = max_tokens_per_step
        self.time_budget = step_time_budget_s
        self.imbalance = imbalance
        self.table = table
        self.flops = flops  # (n, p, replay_layers) -> FLOPs
        self.on_done = on_done
        self.quad = cost.prefill_quadratic(imbalance)
        self.ranks: list[list[PrefillSeq]] = [[] for _ in range(dp)]
        self.rank_tokens = [0] * dp  # tokens left to compute per rank
        self.outstanding_s = 0.0  # predicted seconds of work queued here (router signal)
        self.step_items: list[tuple[PrefillSeq, int, int]] = []  # (seq, n, replay) of this step
        self.busy_s = 0.0
        self.steps = 0
        self.stats = PrefillStats()
        # the GPU's clock at its power limit (models/power_limit.py); None: not modelled
        clock = cost.sustained_clock
        self.clock = BusyShare(clock) if clock is not None else None
        self.slowdown = 1.0  # the step in flight's
        self.busy_share = 1.0  # the share of the step in flight its GPUs compute
        self.slowdown_sum = 0.0  # the finished steps', summed (their mean is reported)

    def predicted_s(self, n: int, p: int) -> float:
        _, b, c, d = self.quad
        return chunk_time(n, p, b, c, d)

    @property
    def queued(self) -> int:
        return sum(len(r) for r in self.ranks)

    def submit(self, rid: int, start: int, enc_replay: int, dec_replay: int) -> None:
        """Prefill request ``rid`` from position ``start`` (its first ``enc_replay`` positions
        recompute SWA state of the cached prefix) and replay ``dec_replay`` decoder tokens."""
        end = int(self.table.input_len[rid])
        rank = self.rank_tokens.index(min(self.rank_tokens))
        self.ranks[rank].append(PrefillSeq(rid, rank, start, end, enc_replay, dec_replay))
        self.rank_tokens[rank] += end - start
        self.outstanding_s += self.predicted_s(end - start, start)
        self.table.state[rid] = State.PREFILL
        self.table.prefill_instance[rid] = self.idx
        self.kick()

    def begin_step(self) -> float | None:
        if not any(self.ranks):
            return None
        a, b, c, d = self.quad
        chunks: list[list[Chunk]] = []
        replays: list[list[Chunk]] = []
        running = self.step_items
        running.clear()
        now = self.env.now
        start_col = self.table.t_prefill_start
        for seqs in self.ranks:
            rank_chunks: list[Chunk] = []
            rank_replay: list[Chunk] = []
            fill_rank(
                seqs,
                self.chunking,
                self.time_budget - a,
                self.max_tokens,
                (b, c, d),
                rank_chunks,
                rank_replay,
                running,
            )
            chunks.append(rank_chunks)
            replays.append(rank_replay)
        mark_started(running, start_col, now)
        imbalance, stall = self.imbalance, 0.0
        if self.experts is not None:
            imbalance, stall = self._expert_step(now)
        if self.clock is None:
            return stall + self.cost.prefill_step(chunks, imbalance, replays)
        slowdown = self.slowdown = self.clock.factor(now)
        step = self.cost.prefill_step(chunks, imbalance, replays, slowdown)
        self.busy_share = self.cost.prefill_busy_share * step / (stall + step)
        return stall + step

    def _expert_step(self, now: float) -> tuple[float, float]:
        """Routed tokens of this step per class (chunks: prefill layers; decoder replay: the
        replay-only layers) and their per-request square sums, handed to the expert balance."""
        assert self.experts is not None
        classes = self.experts.load.classes
        tokens = np.zeros((classes, 2))
        sq = np.zeros((classes, 2))
        cls = self.traffic_class
        for seq, n, replay in self.step_items:
            c = int(cls[seq.rid]) if classes > 1 and cls is not None else 0
            tokens[c, 0] += n
            sq[c, 0] += n * n
            if replay:
                tokens[c, 1] += replay
                sq[c, 1] += replay * replay
        return self.experts.step(now, tokens, sq)

    def end_step(self, dt: float) -> None:
        self.busy_s += dt
        self.steps += 1
        stats = self.stats
        now = self.env.now
        if self.clock is not None:
            self.clock.ended(now, dt, self.busy_share)
        self.slowdown_sum += self.slowdown
        finished: list[int] = []
        for seq, n, replay in self.step_items:
            stats.count(seq, n, replay, self.flops)
            self.outstanding_s -= self.predicted_s(n, seq.pos)
            self.rank_tokens[seq.rank] -= n
            seq.pos += n
            if seq.pos >= seq.end:
                self.ranks[seq.rank].remove(seq)
                self.table.t_prefill_end[seq.rid] = now
                finished.append(seq.rid)
        self.step_items.clear()
        if not any(self.ranks):
            self.outstanding_s = 0.0  # drop accumulated float round-off
        for rid in finished:
            self.on_done(rid, self.idx)

    def report(self, now: float) -> dict[str, float]:
        """The instance's own part of the summary, as of ``now``: steps, busy seconds
        (``stepping_s``: the step in flight, up to ``now``), positions scheduled in chunks,
        tokens computed and replayed, their FLOPs (its experts report apart), and the prompts
        on it now (queued or being computed)."""
        stats = self.stats
        return {
            "steps": self.steps,
            "busy_s": self.busy_s,
            "stepping_s": self.stepping_s(now),
            "chunk_tokens": stats.chunk_tokens,
            "compute_tokens": stats.compute_tokens,
            "replay_tokens": stats.replay_tokens,
            "flops": stats.flops,
            "replay_flops": stats.replay_flops,
            "queued": self.queued,
            "slowdown_sum": self.slowdown_sum,
        }
