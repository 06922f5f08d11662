"""Wide-EP decode groups: one SimPy process per group, per-slot state in numpy arrays.

All ranks of a group step in lockstep; the slowest rank (its batch and KV length) sets the step
time (see StepCost.decode_step). Running sequences live in struct-of-arrays slots (request id, rank,
tokens left, first step) up to a high-water mark; a finished sequence leaves a hole (tokens left
set to a huge value) that the next admission reuses, so a step is a handful of vectorized numpy
operations however many sequences run, and the group costs one event per step.

Requests are routed to a (group, rank) before their KV transfer starts; when the KV lands they
wait in that rank's queue until a slot and KV memory are free. Admission reserves a request's
whole context (prompt + output + SWA slot) up front, so a running sequence never runs out of KV
memory and nothing is preempted.

Inter-token latencies are not recorded per token: the group keeps one row per step (end time,
duration, sequences stepped, sequences on their first step) and each request remembers the steps
it ran in, from which :meth:`DecodeGroup.itl_samples` rebuilds every ITL exactly after the run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import simpy

from ..models.cost import StepCost
from .requests import RequestTable, State
from .steploop import StepLoop

_IDLE = np.iinfo(np.int64).max // 2  # tokens-left of an empty slot: never finishes


class DecodeGroup(StepLoop):
    def __init__(
        self,
        env: simpy.Environment,
        idx: int,
        ep: int,
        cost: StepCost,
        max_seqs_per_rank: int,
        kv_capacity_tokens: float,
        seq_overhead_tokens: float,
        imbalance: float,
        table: RequestTable,
        on_done: Callable[[int], None],
    ) -> None:
        super().__init__(env)
        self.idx = idx
        self.ep = ep
        self.cost = cost
        self.max_seqs = max_seqs_per_rank
        self.kv_capacity = kv_capacity_tokens
        self.seq_overhead = seq_overhead_tokens
        self.imbalance = imbalance
        self.table = table
        self.on_done = on_done
        # per-rank state; batch and kv are the rows of one array the cost model reads at once
        self.load = np.zeros((2, ep), dtype=np.float64)
        self.batch = self.load[0]  # running sequences
        self.kv = self.load[1]  # context tokens held by running sequences
        self.reserved = np.zeros(ep, dtype=np.float64)  # KV tokens reserved by admission
        self.assigned = np.zeros(ep, dtype=np.int64)  # routed here and not finished
        self.waiting: list[deque[int]] = [deque() for _ in range(ep)]
        self.waiting_ranks: set[int] = set()
        self.n_waiting = 0
        # per-slot state of running sequences; slots [0, hw) are in use or holes
        cap = ep * max_seqs_per_rank
        self.n = 0  # running sequences
        self.hw = 0  # high-water mark of slots ever used
        self.free: list[int] = []  # holes below the high-water mark
        self.s_req = np.full(cap, -1, dtype=np.int64)
        self.s_rank = np.zeros(cap, dtype=np.int64)
        self.s_left = np.full(cap, _IDLE, dtype=np.int64)
        self.s_k0 = np.zeros(cap, dtype=np.int64)
        self.new_this_step = 0
        # one row per step
        self.step_end: list[float] = []
        self.step_dt: list[float] = []
        self.step_n: list[int] = []
        self.step_new: list[int] = []
        self.busy_s = 0.0
        self.tokens_out = 0

    @property
    def steps(self) -> int:
        return len(self.step_dt)

    # ---- routing side -------------------------------------------------------------------------
    def assign(self, rid: int, rank: int) -> None:
        """Reserve a place on ``rank`` for a request whose KV is about to be sent here."""
        self.assigned[rank] += 1
        self.table.decode_group[rid] = self.idx
        self.table.decode_rank[rid] = rank

    def arrive(self, rid: int) -> None:
        """The request's KV has landed on its rank: queue it for a slot."""
        rank = int(self.table.decode_rank[rid])
        self.waiting[rank].append(rid)
        self.waiting_ranks.add(rank)
        self.n_waiting += 1
        self.table.state[rid] = State.DECODE_WAIT
        self.kick()

    # ---- engine side --------------------------------------------------------------------------
    def _admit(self) -> None:
        t = self.table
        now = self.env.now
        k = self.steps
        for rank in list(self.waiting_ranks):
            q = self.waiting[rank]
            while q and self.batch[rank] < self.max_seqs:
                rid = q[0]
                need = float(t.input_len[rid] + t.output_len[rid]) + self.seq_overhead
                if self.reserved[rank] + need > self.kv_capacity:
                    break
                q.popleft()
                self.n_waiting -= 1
                if self.free:
                    i = self.free.pop()
                else:
                    i = self.hw
                    self.hw += 1
                self.n += 1
                self.s_req[i] = rid
                self.s_rank[i] = rank
                self.s_left[i] = t.output_len[rid] - 1  # the first token came from prefill
                self.s_k0[i] = k
                self.new_this_step += 1
                self.batch[rank] += 1
                self.kv[rank] += t.input_len[rid]
                self.reserved[rank] += need
                t.state[rid] = State.DECODE
                t.t_decode_start[rid] = now
                t.decode_first_step[rid] = k
            if not q:
                self.waiting_ranks.discard(rank)

    def begin_step(self) -> float | None:
        if self.n_waiting:
            self._admit()
        if self.n == 0:
            return None
        return self.cost.decode_step_packed(self.load, 1.0, self.imbalance)

    def end_step(self, dt: float) -> None:
        """Every running sequence emitted one token; retire the finished ones."""
        n = self.n
        k = self.steps
        now = self.env.now
        self.step_end.append(now)
        self.step_dt.append(dt)
        self.step_n.append(n)
        self.step_new.append(self.new_this_step)
        self.new_this_step = 0
        self.busy_s += dt
        self.tokens_out += n
        self.kv += self.batch
        left = self.s_left[: self.hw]
        left -= 1  # holes hold _IDLE and never reach zero
        idx = np.flatnonzero(left <= 0)
        if idx.size == 0:
            return
        # Few sequences finish per step: scalar bookkeeping beats a dozen small numpy calls.
        t = self.table
        s_req, s_rank = self.s_req, self.s_rank
        batch, kv, reserved, assigned = self.batch, self.kv, self.reserved, self.assigned
        finished = []
        for i in idx.tolist():
            rid = int(s_req[i])
            r = int(s_rank[i])
            context = float(t.input_len[rid] + t.output_len[rid])
            batch[r] -= 1
            kv[r] -= context - 1  # the last token is emitted, never attended to
            reserved[r] -= context + self.seq_overhead
            assigned[r] -= 1
            t.t_done[rid] = now
            t.decode_last_step[rid] = k
            t.state[rid] = State.DONE
            s_req[i] = -1
            self.s_left[i] = _IDLE
            finished.append(rid)
        self.n = n - len(finished)
        if self.n == 0:
            self.hw = 0
            self.free.clear()
        else:
            self.free.extend(idx.tolist())
        for rid in finished:
            self.on_done(rid)

    # ---- after the run ------------------------------------------------------------------------
    def step_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (
            np.asarray(self.step_end),
            np.asarray(self.step_dt),
            np.asarray(self.step_n),
            np.asarray(self.step_new),
        )

    def check(self) -> list[str]:
        errs = []
        if (self.batch < 0).any() or (self.batch > self.max_seqs).any():
            errs.append(f"decode group {self.idx}: batch out of [0, {self.max_seqs}]")
        if (self.kv < -1e-6).any() or (self.reserved > self.kv_capacity + 1e-6).any():
            errs.append(f"decode group {self.idx}: KV out of [0, capacity]")
        if (self.kv > self.reserved + 1e-6).any():
            errs.append(f"decode group {self.idx}: KV in use exceeds its reservation")
        if int(self.batch.sum()) != self.n or int((self.s_req[: self.hw] >= 0).sum()) != self.n:
            errs.append(f"decode group {self.idx}: per-rank batch does not match running slots")
        return errs
