"""Wide-EP decode groups: one SimPy process per group, per-slot state in numpy arrays.

All ranks of a group step in lockstep; the slowest rank (its batch and KV length) sets the step
time (see StepCost.decode_step). Running sequences live in struct-of-arrays slots (request id, rank,
tokens left, first step) up to a high-water mark; a finished sequence leaves a hole (tokens left
set to a huge value) that the next admission reuses, so a step is a handful of vectorized numpy
operations however many sequences run, and the group costs one event per step.

Requests are routed to a (group, rank) before their KV transfer starts; when the KV lands they
wait in that rank's queue until a slot and KV memory are free. How much KV a sequence reserves,
whether it grows, and which sequences a rank drops when it runs out is the KV admission policy's
(``sim/policies/kv_admission.py``); the group keeps the per-rank reservations and does the moves.

Inter-token latencies are not recorded per token: the group keeps one row per step (end time,
duration, sequences stepped, sequences on their first step, tokens emitted) and each request
remembers the steps it ran in, from which ``sim/results/itl.py`` rebuilds every per-step ITL exactly
after the run.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

from ...jit import COMPILED, njit, pairwise_sum, sum_block
from ...models.cost import StepCost
from ..core.requests import RequestTable, State
from ..core.steploop import StepLoop
from ..policies.kv_admission import KvAdmission
from ..policies.speculative import SpecDecoder
from .expert_parallel import GroupExperts

_IDLE = np.iinfo(np.int64).max // 2  # tokens-left of an empty slot: never finishes


class DecodeGroup(StepLoop):
    def __init__(
        self,
        *,
        env: simpy.Environment,
        idx: int,
        ep: int,
        cost: StepCost,
        max_seqs_per_rank: int,
        kv_capacity_tokens: float,
        kv_admission: KvAdmission,
        imbalance: float,
        table: RequestTable,
        on_done: Callable[[int], None],
        spec: SpecDecoder | None = None,
        ideal_balance: bool = False,
        experts: GroupExperts | None = None,
    ) -> None:
        super().__init__(env)
        self.idx = idx
        self.ep = ep
        self.cost = cost
        self.max_seqs = max_seqs_per_rank
        self.kv_capacity = kv_capacity_tokens  # per rank
        self.kv_admission = kv_admission
        self.imbalance = imbalance  # this step's expert imbalance (constant without experts)
        self.experts = experts
        self.classes = 1 if experts is None else experts.load.classes
        self.table = table
        self.on_done = on_done
        # per-rank state, as the rows of one array the cost model reads at once:
        # running sequences, context tokens they hold, tokens computed this step (1 + verify
        # per sequence) and those tokens weighted by their sequence's context (attention work)
        self.load = np.zeros((4, ep), dtype=np.float64)
        self.batch = self.load[0]
        self.kv = self.load[1]
        self.reserved = np.zeros(ep, dtype=np.float64)  # KV tokens reserved by admission
        self.assigned = np.zeros(ep, dtype=np.int64)  # routed here and not finished
        self.assigned_kv = np.zeros(ep, dtype=np.float64)  # their prompt + output tokens
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
        self.s_ctx = np.zeros(cap, dtype=np.int64)  # context tokens the sequence holds
        self.s_cls = np.zeros(cap, dtype=np.int64)  # traffic class (expert-load model)
        self.spec = spec
        # set for a step by a subclass whose ranks may sit a step out (an aggregated instance
        # under SGLang's schedule): per rank, whether its sequences wait this step (None: none)
        self.sat_out: np.ndarray | None = None
        self.s_wait = np.zeros(cap)  # seconds a sequence sat out since it last emitted
        # per-step ITLs that a wait lengthened: (step, request, seconds waited before it)
        self.wait_row = array("i")
        self.wait_rid = array("q")
        self.wait_s_before = array("d")
        self._draft_s = 0.0  # this step's drafting time (SpecDecoder.draft)
        self.ideal = ideal_balance  # cost every step as if each rank held the mean load
        self.recompute: list[list[tuple[int, int]]] = [[] for _ in range(ep)]
        self.preemptions = 0
        self.recompute_s = 0.0
        self.down = np.zeros(ep, dtype=bool)  # ranks failed and not yet repaired
        self.penalty = np.zeros(ep)  # 0, or inf for a rank that is down (balancers add it)
        self.on_evict: Callable[[int], None] | None = None  # re-route a request off a dead rank
        self.rank_failures = 0
        self.verify_sum = 0  # draft tokens verified, summed over sequence-steps
        self.seq_steps = 0
        self.new_this_step = 0
        # one row per step, in typed arrays (8 bytes an entry, not a Python object each)
        self.step_end = array("d")
        self.step_dt = array("d")
        # counts of one step fit 4 bytes (read back as int64)
        self.step_n = array("i")
        self.step_new = array("i")
        self.step_tokens = array("i")  # tokens emitted (all sequences): per-token ITL
        self.busy_s = 0.0
        self.tokens_out = 0
        # occupancy integrals over stepping time (idle time adds nothing): sequence-seconds,
        # KV-token-seconds held and reserved, summed over the group's ranks
        self.seq_s = 0.0
        self.kv_s = 0.0
        self.reserved_s = 0.0

    @property
    def seq_overhead(self) -> float:
        return self.kv_admission.seq_overhead

    @property
    def steps(self) -> int:
        return len(self.step_dt)

    # ---- routing side -------------------------------------------------------------------------
    def assign(self, rid: int, rank: int) -> None:
        """Reserve a place on ``rank`` for a request whose KV is about to be sent here."""
        self.assigned[rank] += 1
        self.assigned_kv[rank] += float(self.table.input_len[rid] + self.table.output_len[rid])
        self.table.decode_group[rid] = self.idx
        self.table.decode_rank[rid] = rank

    def arrive(self, rid: int) -> None:
        """The request's KV has landed on its rank: queue it for a slot."""
        rank = int(self.table.decode_rank[rid])
        if self.down[rank] and self.on_evict is not None:  # it landed on a dead rank
            self._unassign(rid, rank)
            self.table.kv_lost[rid] = True
            self.on_evict(rid)
            return
        self.waiting[rank].append(rid)
        self.waiting_ranks.add(rank)
        self.n_waiting += 1
        self.table.state[rid] = State.DECODE_WAIT
        self.kick()

    # ---- engine side --------------------------------------------------------------------------
    def _has_slot(self, rank: int) -> bool:
        """Whether ``rank`` can run one more sequence."""
        return bool(self.batch[rank] < self.max_seqs)

    def _admit(self) -> None:
        t = self.table
        now = self.env.now
        k = self.steps
        policy = self.kv_admission
        for rank in list(self.waiting_ranks):
            q = self.waiting[rank]
            while q and self._has_slot(rank):
                rid = q[0]
                resumed = bool(t.kv_lost[rid])  # its KV was dropped (preemption, failure)
                done = int(t.decode_generated[rid])
                ctx = int(t.input_len[rid]) + done
                need = policy.reservation(ctx, float(t.input_len[rid] + t.output_len[rid]))
                if not policy.fits(self.reserved[rank], need, self.kv_capacity):
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
                self.s_left[i] = t.output_len[rid] - 1 - done  # token 1 came from prefill
                self.s_k0[i] = k
                self.s_ctx[i] = ctx
                self.s_cls[i] = t.source.traffic_class[rid]
                if resumed:  # recompute its KV in this step, on this rank
                    self.recompute[rank].append(policy.recompute(ctx))
                    t.kv_lost[rid] = False
                if self.spec is not None:
                    self.spec.admit(i, int(t.source.traffic_class[rid]))
                self.new_this_step += 1
                self.batch[rank] += 1
                self.kv[rank] += ctx
                self.reserved[rank] += need
                t.state[rid] = State.DECODE
                if not resumed:
                    t.t_decode_start[rid] = now
                    t.decode_first_step[rid] = k
            if not q:
                self.waiting_ranks.discard(rank)

    def begin_step(self) -> float | None:
        extra = self._admit_waiting()
        if self.n == 0:
            return None
        return extra + self._decode_step_time()

    def _admit_waiting(self) -> float:
        """Admit waiting requests to free slots; the seconds their KV recompute adds to this
        step (resumed sequences rebuild their KV first: a prefill of their context, in step)."""
        extra = 0.0
        if self.n_waiting:
            self._admit()
            if any(self.recompute):
                extra = self.cost.prefill_step(self.recompute, self.imbalance)
                self.recompute_s += extra
                for r in self.recompute:
                    r.clear()
        return extra

    def _decode_step_time(self) -> float:
        tokens = self._decode_tokens()
        stall = self._expert_step(tokens)
        step = self.cost.decode_step_packed(self._costed(self.load), self.imbalance)
        return self._with_speculation(stall + step)

    def _decode_tokens(self) -> np.ndarray:
        """This step's tokens per slot (1 + verified drafts; 0 for a hole), with the per-rank
        rows of ``load`` they make (tokens, context-weighted tokens) filled in; the drafter's
        time of the step is kept for :meth:`_with_speculation`."""
        load = self.load
        spec = self.spec
        hw = self.hw
        live = self.s_req[:hw] >= 0
        sat = self.sat_out
        if sat is not None:
            live &= ~sat[self.s_rank[:hw]]
        if spec is None or not spec.active:
            load[2] = load[0]
            load[3] = load[1]
            if sat is not None:
                load[2:, sat] = 0.0
            return live.astype(np.float64)
        if spec.draft is not None:  # fixed per group: _draft_s stays 0.0 without one
            costed = self._costed(load)
            self._draft_s = spec.draft.step_s(self.cost, costed[0], costed[1], self.imbalance)
        v = spec.choose(hw, live, self._step_time_with)
        tokens = np.empty(hw)
        args = (v, live, self.s_rank[:hw], self.s_ctx[:hw], load[2], load[3], tokens)
        self.verify_sum += int((slot_tokens_compiled if COMPILED else slot_tokens)(*args))
        return tokens

    def _with_speculation(self, step_s: float) -> float:
        """A decode step's seconds with speculative decoding's own: the policy's overhead and
        the drafter's passes."""
        spec = self.spec
        if spec is None or not spec.active:
            return step_s
        return step_s + spec.overhead_s + self._draft_s

    def _expert_step(self, tokens: np.ndarray) -> float:
        """Sample this step's expert imbalance from the slots' routed tokens; returns the weight
        shuffling stall of a rebalance due now (0 otherwise)."""
        if self.experts is None:
            return 0.0
        per_class, sq = np.empty((self.classes, 1)), np.empty((self.classes, 1))
        args = (tokens, self.s_cls[: self.hw], per_class, sq)
        if COMPILED:
            routed_tokens_compiled(*args, sum_block())
        else:
            routed_tokens(*args)
        self.imbalance, stall = self.experts.step(self.env.now, per_class, sq)
        return stall

    def _costed(self, load: np.ndarray) -> np.ndarray:
        """The per-rank rows the step is charged for: as they are — but none for a rank whose
        sequences sit the step out (``sat_out``) — or (the offline ideal) every rank at the
        group mean."""
        sat = self.sat_out
        if sat is not None and sat.any():
            load = load.copy()
            load[:, sat] = 0.0
        if not self.ideal:
            return load
        return np.repeat(load.mean(axis=1, keepdims=True), self.ep, axis=1)

    def _step_time_with(self, extra: float) -> float:
        """Step time if ``extra`` verify tokens were spread over the sequences (for dspark),
        drafting included."""
        scale = 1.0 + extra / max(1, self.n)
        probe = self.load.copy()
        probe[2] = probe[0] * scale
        probe[3] = probe[1] * scale
        return self.cost.decode_step_packed(self._costed(probe), self.imbalance) + self._draft_s

    def end_step(self, dt: float) -> None:
        """Every running sequence emitted its tokens; retire the finished ones."""
        if self.sat_out is not None:
            self._end_step_sat_out(dt)
            return
        n = self.n
        k = self.steps
        now = self.env.now
        self._log_step(now, dt, n, self.new_this_step)
        hw = self.hw
        left = self.s_left[:hw]
        spec = self.spec
        if spec is None or not spec.active:  # plain decoding: one token each
            self.tokens_out += n
            self.step_tokens.append(n)
            self.kv += self.batch
            self.kv_admission.grow(self.reserved, self.batch)
            self.s_ctx[:hw] += 1
            left -= 1  # holes hold _IDLE and never reach zero
        else:
            self._emit_accepted(hw, self.s_req[:hw] >= 0, left)
        self._retire_and_preempt(left, now, k)

    def _log_step(self, now: float, dt: float, ran: int, new: int) -> None:
        """The step's row of the step table (``ran`` sequences emitted, ``new`` of them in their
        first step) and the group's running totals; every held sequence counts for its seconds."""
        self.step_end.append(now)
        self.step_dt.append(dt)
        self.step_n.append(ran)
        self.step_new.append(new)
        self.new_this_step = 0
        self.busy_s += dt
        self.seq_steps += ran
        self.seq_s += self.n * dt
        if COMPILED:  # numpy's sums, a microsecond each less
            block = sum_block()
            self.kv_s += pairwise_sum(self.kv, block) * dt
            self.reserved_s += pairwise_sum(self.reserved, block) * dt
        else:
            self.kv_s += float(self.kv.sum()) * dt
            self.reserved_s += float(self.reserved.sum()) * dt

    def _emit_accepted(self, hw: int, live: np.ndarray, left: np.ndarray) -> None:
        """Speculative decoding: the ``live`` slots emit what the chain accepts, advanced."""
        assert self.spec is not None
        emitted = self.spec.accept(hw, live, left)
        grown = np.zeros(self.ep)
        args = (emitted, self.s_rank[:hw], self.s_ctx[:hw], left, self.kv, grown)
        out = int((advance_compiled if COMPILED else advance)(*args))
        self.tokens_out += out
        self.step_tokens.append(out)
        self.kv_admission.grow(self.reserved, grown)

    def _retire_and_preempt(self, left: np.ndarray, now: float, k: int) -> None:
        """After a step: retire the sequences with no tokens left, then drop those the KV
        admission policy says no longer fit."""
        idx = (left <= 0).nonzero()[0]  # flatnonzero of a 1-D array, without its wrapper
        if idx.size:
            self._retire(idx, now, k)
        hw = self.hw
        drop = self.kv_admission.victims(
            self.reserved,
            self.kv_capacity,
            self.s_rank[:hw],
            self.s_req[:hw],
            self.s_k0[:hw],
            self.s_ctx[:hw],
        )
        if drop.size:
            self._preempt(drop)

    def _end_step_sat_out(self, dt: float) -> None:
        """:meth:`end_step` of a step some ranks sat out (``sat_out``): only the other ranks'
        sequences emit. A sequence that waited keeps the seconds (``s_wait``) until it next
        emits; that step's ITL is then its duration plus the wait (``wait_row`` ...), and a new
        sequence's first step is the first it runs in (its ``s_k0``, ``decode_first_step``)."""
        assert self.sat_out is not None
        k = self.steps
        now = self.env.now
        t = self.table
        hw = self.hw
        live = self.s_req[:hw] >= 0
        sat = live & self.sat_out[self.s_rank[:hw]]
        stepping = live & ~sat
        ran = int(stepping.sum())
        wait = self.s_wait[:hw]
        back = np.flatnonzero(stepping & (wait > 0))  # they waited: this gap holds the wait
        if back.size:
            self.wait_row.frombytes(np.full(back.size, k, dtype=np.int32).tobytes())
            self.wait_rid.frombytes(self.s_req[back].astype(np.int64).tobytes())
            self.wait_s_before.frombytes(wait[back].tobytes())
            wait[back] = 0.0
        new = live & (self.s_k0[:hw] == k)
        wait[sat & ~new] += dt  # a new sequence's first gap, from its first token, spans it
        later = np.flatnonzero(new & sat)  # a new sequence's first step is a later one
        if later.size:
            self.s_k0[later] = k + 1
            rids = self.s_req[later]
            t.decode_first_step[rids[t.decode_first_step[rids] == k]] = k + 1
        self._log_step(now, dt, ran, int((new & stepping).sum()))
        left = self.s_left[:hw]
        spec = self.spec
        if spec is None or not spec.active:
            self.tokens_out += ran
            self.step_tokens.append(ran)
            grown = np.where(self.sat_out, 0.0, self.batch)
            self.kv += grown
            self.kv_admission.grow(self.reserved, grown)
            self.s_ctx[:hw][stepping] += 1
            left[stepping] -= 1
        else:
            self._emit_accepted(hw, stepping, left)
        self._retire_and_preempt(left, now, k)

    def _preempt(self, slots: np.ndarray) -> None:
        """Drop the sequences in ``slots`` (their KV is freed; each waits at the head of its
        rank's queue and recomputes its KV when readmitted)."""
        t = self.table
        for i in slots.tolist():
            rank = int(self.s_rank[i])
            rid = self._evict_slot(i)
            t.preemptions[rid] += 1
            self.preemptions += 1
            self.waiting[rank].appendleft(rid)
            self.waiting_ranks.add(rank)
            self.n_waiting += 1
            t.state[rid] = State.DECODE_WAIT

    def _evict_slot(self, i: int) -> int:
        """Take a running sequence out of slot ``i``, keeping its progress; its KV is gone."""
        t = self.table
        rid = int(self.s_req[i])
        rank = int(self.s_rank[i])
        ctx = float(self.s_ctx[i])
        t.decode_generated[rid] = int(t.output_len[rid]) - 1 - int(self.s_left[i])
        t.kv_lost[rid] = True
        self.batch[rank] -= 1
        self.kv[rank] -= ctx
        self.reserved[rank] -= self.kv_admission.reservation(
            ctx, float(t.input_len[rid] + t.output_len[rid])
        )
        self.s_req[i] = -1
        self.s_left[i] = _IDLE
        self.s_ctx[i] = 0
        self.s_wait[i] = 0.0
        self.free.append(i)
        self.n -= 1
        t.state[rid] = State.DECODE_WAIT
        return rid

    def _unassign(self, rid: int, rank: int) -> None:
        t = self.table
        self.assigned[rank] -= 1
        self.assigned_kv[rank] -= float(t.input_len[rid] + t.output_len[rid])

    def fail_rank(self, rank: int) -> list[int]:
        """The rank dies: its running and queued requests leave it (progress kept, KV lost) and
        are returned for re-routing; nothing is routed to it until ``repair_rank``."""
        self.down[rank] = True
        self.penalty[rank] = np.inf
        self.rank_failures += 1
        evicted = []
        slots = np.flatnonzero((self.s_rank[: self.hw] == rank) & (self.s_req[: self.hw] >= 0))
        for i in slots.tolist():
            evicted.append(self._evict_slot(i))
        while self.waiting[rank]:
            rid = self.waiting[rank].popleft()
            self.n_waiting -= 1
            self.table.kv_lost[rid] = True
            evicted.append(rid)
        self.waiting_ranks.discard(rank)
        for rid in evicted:
            self._unassign(rid, rank)
        return evicted

    def repair_rank(self, rank: int) -> None:
        self.down[rank] = False
        self.penalty[rank] = 0.0

    def _retire(self, idx: np.ndarray, now: float, k: int) -> None:
        n = self.n
        # Few sequences finish per step: scalar bookkeeping beats a dozen small numpy calls.
        t = self.table
        s_req, s_rank = self.s_req, self.s_rank
        batch, kv, reserved, assigned = self.batch, self.kv, self.reserved, self.assigned
        reservation = self.kv_admission.reservation
        finished = []
        for i in idx.tolist():
            rid = int(s_req[i])
            r = int(s_rank[i])
            batch[r] -= 1
            kv[r] -= float(self.s_ctx[i])
            context = float(t.input_len[rid] + t.output_len[rid])
            reserved[r] -= reservation(float(self.s_ctx[i]), context)
            self.assigned_kv[r] -= context
            assigned[r] -= 1
            t.t_done[rid] = now
            t.decode_last_step[rid] = k
            t.state[rid] = State.DONE
            s_req[i] = -1
            self.s_left[i] = _IDLE
            self.s_ctx[i] = 0
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
            np.asarray(self.step_n, dtype=np.int64),
            np.asarray(self.step_new, dtype=np.int64),
        )

    def report(self, now: float) -> dict[str, Any]:
        """The group's own part of the summary, as of ``now``: its steps and the sequence-steps
        they ran, speculative decoding's verified and emitted tokens, KV pressure (preemptions,
        recompute seconds), rank failures, busy seconds (``stepping_s``: the step in flight, up
        to ``now``), the occupancy integrals summed over its ranks, its experts' report (None
        when the expert imbalance is a constant), and its state now: sequences running and
        waiting, and per rank the sequences and the KV tokens reserved (copies)."""
        return {
            "ranks": self.ep,
            "steps": self.steps,
            "seq_steps": self.seq_steps,
            "verify_sum": self.verify_sum,
            "tokens_out": self.tokens_out,
            "preemptions": self.preemptions,
            "recompute_s": self.recompute_s,
            "rank_failures": self.rank_failures,
            "busy_s": self.busy_s,
            "stepping_s": self.stepping_s(now),
            "seq_s": self.seq_s,
            "kv_s": self.kv_s,
            "reserved_s": self.reserved_s,
            "experts": self.experts.report() if self.experts is not None else None,
            "running": self.n,
            "waiting": self.n_waiting,
            "batch": self.batch.copy(),
            "reserved": self.reserved.copy(),
        }

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


def advance(
    emitted: np.ndarray,
    rank: np.ndarray,
    ctx: np.ndarray,
    left: np.ndarray,
    kv: np.ndarray,
    grown: np.ndarray,
) -> int:
    """Slots emitted ``emitted`` tokens: their context grows and their tokens ``left`` fall by
    that many, each rank's ``kv`` grows by its slots' sum (also written into ``grown``, zeros
    on entry); returns the tokens emitted. The numpy reference of :func:`advance_compiled`."""
    grown += np.bincount(rank, weights=emitted, minlength=kv.size)
    kv += grown
    ctx += emitted
    left -= emitted
    return int(emitted.sum())


@njit
def advance_compiled(
    emitted: np.ndarray,
    rank: np.ndarray,
    ctx: np.ndarray,
    left: np.ndarray,
    kv: np.ndarray,
    grown: np.ndarray,
) -> int:
    """:func:`advance`, compiled: the same sums in the same order."""
    out = 0
    for i in range(emitted.size):
        e = emitted[i]
        grown[rank[i]] += e
        ctx[i] += e
        left[i] -= e
        out += e
    for r in range(kv.size):
        kv[r] += grown[r]
    return out


def slot_tokens(
    v: np.ndarray,
    live: np.ndarray,
    rank: np.ndarray,
    ctx: np.ndarray,
    rank_tokens: np.ndarray,
    rank_kv_tokens: np.ndarray,
    tokens: np.ndarray,
) -> int:
    """A speculative step's tokens per slot (1 + its ``v`` verified drafts, 0 for a hole) into
    ``tokens``, and per rank their sum and their context-weighted sum (``rank_tokens``,
    ``rank_kv_tokens``, overwritten); returns the drafts verified. The numpy reference of
    :func:`slot_tokens_compiled`."""
    counts = np.where(live, 1 + v, 0)
    rank_tokens[:] = np.bincount(rank, weights=counts, minlength=rank_tokens.size)
    rank_kv_tokens[:] = np.bincount(rank, weights=counts * ctx, minlength=rank_tokens.size)
    tokens[:] = counts
    return int(v[live].sum())


@njit
def slot_tokens_compiled(
    v: np.ndarray,
    live: np.ndarray,
    rank: np.ndarray,
    ctx: np.ndarray,
    rank_tokens: np.ndarray,
    rank_kv_tokens: np.ndarray,
    tokens: np.ndarray,
) -> int:
    """:func:`slot_tokens`, compiled: the same sums in the same order."""
    rank_tokens[:] = 0.0
    rank_kv_tokens[:] = 0.0
    verified = 0
    for i in range(v.size):
        n = 1 + v[i] if live[i] else 0
        if live[i]:
            verified += v[i]
        rank_tokens[rank[i]] += n
        rank_kv_tokens[rank[i]] += n * ctx[i]
        tokens[i] = n
    return verified


def routed_tokens(
    tokens: np.ndarray, cls: np.ndarray, per_class: np.ndarray, sq: np.ndarray
) -> None:
    """Each traffic class's routed tokens of a step and their squares' sum, from the slots'
    ``tokens`` and classes ``cls``, into ``per_class`` and ``sq`` ((classes, 1)). The numpy
    reference of :func:`routed_tokens_compiled`."""
    if per_class.shape[0] == 1:
        per_class[0, 0] = tokens.sum()
        sq[0, 0] = (tokens * tokens).sum()
    else:
        per_class[:, 0] = np.bincount(cls, weights=tokens, minlength=per_class.shape[0])
        sq[:, 0] = np.bincount(cls, weights=tokens * tokens, minlength=per_class.shape[0])


@njit
def routed_tokens_compiled(
    tokens: np.ndarray, cls: np.ndarray, per_class: np.ndarray, sq: np.ndarray, block: int
) -> None:
    """:func:`routed_tokens`, compiled: numpy's pairwise sums for one class, index order for
    several (as ``np.bincount`` adds)."""
    if per_class.shape[0] == 1:
        per_class[0, 0] = pairwise_sum(tokens, block)
        sq[0, 0] = pairwise_sum(tokens * tokens, block)
        return
    per_class[:] = 0.0
    sq[:] = 0.0
    for i in range(tokens.size):
        per_class[cls[i], 0] += tokens[i]
        sq[cls[i], 0] += tokens[i] * tokens[i]
