"""Aggregated serving: instances that prefill and decode in the same steps, one event per step.

An aggregated instance is a decode group (:class:`DecodeGroup`: running sequences in per-slot
arrays, per-rank load rows, KV admission, speculative decoding, retirement, the step table the
ITL is rebuilt from) whose DP ranks also run prompts. Every step, on each rank:

1. every running sequence's decode tokens go in first (1 + verified drafts);
2. the rank's prompts fill the rest of its token budget (``pools.aggregated.max_tokens_per_step``)
   oldest first — those already partly prefilled, then waiting ones, each started (a sequence
   slot taken, its KV reserved against the rank's capacity, as the KV admission policy says) only
   while the step has room for it; the chunk policy (``sim/policies/chunking.py``) says how much of
   each goes in, so a long prompt spans several steps;
3. one StepCost call prices the mixed batch (:meth:`StepCost.mixed_step`); the expert imbalance
   is sampled from all of the step's tokens.

That is vLLM's chunked prefill (``pools.aggregated.scheduler`` ``tokens``; ``whole`` takes whole
prompts only, TensorRT-LLM's in-flight batching on Hopper). SGLang's default, ``prefill_first``,
does not mix, rank by rank: a DP rank prefills whenever a prompt of its own can start or continue,
its chunks taking its whole budget while its running sequences sit the step out, and decodes
otherwise; the other ranks decode in the same (longer) step. A sequence's next ITL after a wait
spans it (``DecodeGroup.sat_out``, ``sim/results/itl.py``).

A prompt whose last chunk ran has its first token at the end of that step (its TTFT) and joins
the rank's decode batch at the next step, its KV already there: no transfer. A decode step that
carries chunks lasts longer — the prefill stall — and the running sequences' TPOT and ITL include
it. The prefill path in front (prefix lookup and cache loads, store writes, SWA replay) is the
disaggregated one's (``sim/stages/prefill_path.py``); a request is placed on an instance's rank by
the decode balancer when it arrives (:class:`~deepinfer_sim.sim.policies.router.RankRouter`).

Per step the work is O(ranks + chunks) beside the decode group's vectorized slot updates.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import simpy

from ...models.cost import Chunk, StepCost
from ..core.requests import RequestTable, State
from ..policies.chunking import ChunkPolicy, chunk_time
from ..policies.kv_admission import KvAdmission
from ..policies.speculative import SpecDecoder
from .decode import DecodeGroup
from .expert_parallel import GroupExperts
from .prefill import PrefillSeq, PrefillStats, fill_rank, mark_started


class AggregatedInstance(DecodeGroup):
    """One aggregated instance: ``dp`` ranks that each prefill and decode their own requests."""

    def __init__(
        self,
        *,
        env: simpy.Environment,
        idx: int,
        machine: int,
        dp: int,
        cost: StepCost,
        max_seqs_per_rank: int,
        max_tokens_per_step: int,
        kv_capacity_tokens: float,
        kv_admission: KvAdmission,
        chunking: ChunkPolicy,
        step_time_budget_s: float,
        prefill_imbalance: float,
        decode_imbalance: float,
        table: RequestTable,
        flops: Callable[[int, int, bool], float],
        on_done: Callable[[int], None],
        spec: SpecDecoder | None = None,
        experts: GroupExperts | None = None,
        prefill_first: bool = False,
    ) -> None:
        """``prefill_imbalance`` / ``decode_imbalance``: the constant expert imbalance of a step
        that carries chunks / only decodes (without live ``experts``); ``on_done``: a request
        ended (decoded, or answered by its prefill alone); ``prefill_first``: SGLang's schedule
        (:meth:`_prefill_first_step`) instead of chunks beside the decode tokens."""
        super().__init__(
            env=env,
            idx=idx,
            ep=dp,
            cost=cost,
            max_seqs_per_rank=max_seqs_per_rank,
            kv_capacity_tokens=kv_capacity_tokens,
            kv_admission=kv_admission,
            imbalance=decode_imbalance,
            table=table,
            on_done=on_done,
            spec=spec,
            experts=experts,
        )
        self.machine = machine
        self.dp = dp
        self.max_tokens = max_tokens_per_step
        self.chunking = chunking
        self.time_budget = step_time_budget_s
        self.prefill_imbalance = prefill_imbalance
        self.decode_imbalance = decode_imbalance
        self.flops = flops  # (n, p, replay_layers) -> FLOPs
        self.quad = cost.prefill_quadratic(prefill_imbalance)
        # set by the builder: the prefill path's prompt_done(rid, instance)
        self.on_prefilled: Callable[[int, int], None] = lambda rid, inst: None
        # per rank: prompts started (slot and KV held, in arrival order) and prompts waiting
        self.prompts: list[list[PrefillSeq]] = [[] for _ in range(dp)]
        self.pending: list[deque[PrefillSeq]] = [deque() for _ in range(dp)]
        self.prefilling = np.zeros(dp, dtype=np.int64)  # prompts started, per rank
        self.prefill_kv = np.zeros(dp)  # KV tokens their computed positions hold
        self.outstanding_s = 0.0  # predicted seconds of prefill queued here (admission signal)
        self.step_items: list[tuple[PrefillSeq, int, int]] = []  # (seq, n, replay) this step
        self._no_chunks: list[list[Chunk]] = [[] for _ in range(dp)]  # read only
        self.stats = PrefillStats()
        self.n_queued = 0
        # per step: prefill chunk tokens, and the most tokens (decode + chunks) one rank ran
        self.step_chunk_tokens = array("i")
        self.step_rank_tokens_max = array("i")
        self._rank_tokens_max = 0
        self._decoding = False  # whether the step in flight runs decode sequences
        # seconds and steps by what a step carried
        self.decode_only_s = self.mixed_s = self.prefill_only_s = 0.0
        self.decode_only_steps = self.mixed_steps = self.prefill_only_steps = 0
        self.step_tokens_sum = 0  # decode and chunk tokens over every step
        if prefill_first:  # per rank, whether it prefills this step and its sequences sit out
            self.sat_out = np.zeros(dp, dtype=bool)
        self.wait_steps = 0  # steps in which some running sequences waited (prefill_first)
        self.wait_s = 0.0

    # ---- routing side -------------------------------------------------------------------------
    def predicted_s(self, n: int, p: int) -> float:
        """Predicted prefill seconds of n new tokens after a prefix p (the balanced-step
        quadratic's per-sequence terms, as a prefill instance predicts them)."""
        _, b, c, d = self.quad
        return chunk_time(n, p, b, c, d)

    @property
    def queued(self) -> int:
        """Prompts on the instance, waiting to start or being prefilled."""
        return self.n_queued

    def submit(self, rid: int, start: int, enc_replay: int, dec_replay: int) -> None:
        """Prefill request ``rid`` (already assigned to a rank) from position ``start``, its
        first ``enc_replay`` positions recomputing SWA state, then ``dec_replay`` decoder
        tokens, as a prefill instance does."""
        t = self.table
        end = int(t.input_len[rid])
        rank = int(t.decode_rank[rid])
        self.pending[rank].append(PrefillSeq(rid, rank, start, end, enc_replay, dec_replay))
        self.n_queued += 1
        self.outstanding_s += self.predicted_s(end - start, start)
        t.state[rid] = State.PREFILL
        t.prefill_instance[rid] = self.idx
        self.kick()

    # ---- engine side --------------------------------------------------------------------------
    def _has_slot(self, rank: int) -> bool:
        """Whether ``rank`` can run one more sequence: its prompts hold slots too."""
        return bool(self.batch[rank] + self.prefilling[rank] < self.max_seqs)

    def begin_step(self) -> float | None:
        extra = self._admit_waiting()  # prompts prefilled last step join the decode batch
        step = self._mixed_step() if self.sat_out is None else self._prefill_first_step()
        return None if step is None else extra + step

    def _mixed_step(self) -> float | None:
        """The running sequences' decode tokens, and chunks in what they leave of the budget."""
        load = self.load
        self._decoding = self.n > 0
        tokens = self._decode_tokens() if self._decoding else None
        if tokens is None:
            load[2] = 0.0
            load[3] = 0.0
        chunks, replays = self._plan_chunks()
        if tokens is None and not self.step_items:
            return None
        return self._priced(chunks, replays, tokens, load)

    def _prefill_first_step(self) -> float | None:
        """SGLang's schedule with mixed chunks off, rank by rank (each DP rank schedules itself
        and the ranks step together): a rank prefills whenever a prompt of its own can start or
        continue — its chunks take its whole token budget and its running sequences sit the
        step out (``sat_out``) — and decodes otherwise. The step lasts as long as its slowest
        rank."""
        load = self.load
        sat = self.sat_out
        assert sat is not None
        sat[:] = False
        chunks, replays = self._no_chunks, self._no_chunks
        if self.n_queued:
            load[2] = 0.0
            load[3] = 0.0
            chunks, replays = self._plan_chunks()
            for r, rank_chunks in enumerate(chunks):
                sat[r] = bool(rank_chunks)
        else:
            self.step_items.clear()
            self._rank_tokens_max = 0
        self._decoding = bool((self.batch[~sat] > 0).any())
        if not (self._decoding or self.step_items):
            return None
        tokens = self._decode_tokens() if self._decoding else None
        if tokens is None:
            load[2] = 0.0
            load[3] = 0.0
        self._rank_tokens_max = max(self._rank_tokens_max, int(load[2].max()))
        return self._priced(chunks, replays, tokens, self._costed(load))

    def _priced(
        self,
        chunks: list[list[Chunk]],
        replays: list[list[Chunk]],
        tokens: np.ndarray | None,
        load: np.ndarray,
    ) -> float:
        """The step's seconds: its expert imbalance sampled, one StepCost call for the chunks
        and the decode ``load``, speculative decoding's own time on a decode step."""
        if self.experts is not None:
            imbalance, stall = self._mixed_experts(tokens)
        else:
            chunked = bool(self.step_items)
            imbalance, stall = (self.prefill_imbalance if chunked else self.decode_imbalance), 0.0
        self.imbalance = imbalance
        step = stall + self.cost.mixed_step(chunks, load, imbalance, replays)
        return self._with_speculation(step) if self._decoding else step

    def _plan_chunks(self) -> tuple[list[list[Chunk]], list[list[Chunk]]]:
        """Each rank's prefill chunks (and decoder-layer replay segments) in the budget its
        decode tokens leave."""
        running = self.step_items
        running.clear()
        if not self.n_queued:  # nothing to prefill: a decode step (the common case)
            self._rank_tokens_max = int(self.load[2].max())
            return self._no_chunks, self._no_chunks
        a, b, c, d = self.quad
        chunks: list[list[Chunk]] = []
        replays: list[list[Chunk]] = []
        decode_tokens = self.load[2]
        most = 0
        for r in range(self.dp):
            rank_chunks: list[Chunk] = []
            rank_replay: list[Chunk] = []
            used = int(decode_tokens[r])
            left = self.max_tokens - used
            if left > 0 and (self.prompts[r] or self.pending[r]):
                fill_rank(
                    self._prompts(r),
                    self.chunking,
                    self.time_budget - a,
                    left,
                    (b, c, d),
                    rank_chunks,
                    rank_replay,
                    running,
                )
                used += sum(n for n, _ in rank_chunks)
            most = max(most, used)
            chunks.append(rank_chunks)
            replays.append(rank_replay)
        self._rank_tokens_max = most
        mark_started(running, self.table.t_prefill_start, self.env.now)
        return chunks, replays

    def _prompts(self, rank: int) -> Iterator[PrefillSeq]:
        """The rank's prompts in arrival order: those started, then waiting ones, each started
        when it is asked for (the step has room) and it fits (a slot, its KV)."""
        yield from self.prompts[rank]
        pending = self.pending[rank]
        t = self.table
        policy = self.kv_admission
        while pending:
            seq = pending[0]
            rid = seq.rid
            if not self._has_slot(rank):
                return
            n_in = float(t.input_len[rid])
            need = policy.reservation(n_in, n_in + float(t.output_len[rid]))
            if not policy.fits(self.reserved[rank], need, self.kv_capacity):
                return
            pending.popleft()
            self.reserved[rank] += need
            self.prefilling[rank] += 1
            self.prefill_kv[rank] += seq.pos  # the cached prefix it loaded
            self.prompts[rank].append(seq)
            yield seq

    def _mixed_experts(self, tokens: np.ndarray | None) -> tuple[float, float]:
        """The step's expert imbalance and rebalance stall from its routed tokens per class:
        set 0 the prefill layers (chunks and decode tokens), set 1 the replay-only layers
        (decoder replay segments and decode tokens)."""
        assert self.experts is not None
        classes = self.classes
        per = np.zeros((classes, 2))
        sq = np.zeros((classes, 2))
        if tokens is not None:
            if classes == 1:
                per[0] += tokens.sum()
                sq[0] += (tokens * tokens).sum()
            else:
                cls = self.s_cls[: self.hw]
                per += np.bincount(cls, weights=tokens, minlength=classes)[:, None]
                sq += np.bincount(cls, weights=tokens * tokens, minlength=classes)[:, None]
        traffic = self.table.source.traffic_class
        for seq, n, replay in self.step_items:
            c = int(traffic[seq.rid]) if classes > 1 else 0
            per[c, 0] += n
            sq[c, 0] += n * n
            if replay:
                per[c, 1] += replay
                sq[c, 1] += replay * replay
        return self.experts.step(self.env.now, per, sq)

    def end_step(self, dt: float) -> None:
        """Decode side first (tokens emitted, finished sequences retired), then the chunks:
        a prompt whose last chunk ran is handed on (its first token is out)."""
        chunked = bool(self.step_items)
        decoded = self._decoding
        if self.sat_out is not None and (self.batch[self.sat_out] > 0).any():
            self.wait_steps += 1
            self.wait_s += dt
        super().end_step(dt)
        if chunked and decoded:
            self.mixed_steps += 1
            self.mixed_s += dt
        elif chunked:
            self.prefill_only_steps += 1
            self.prefill_only_s += dt
        else:
            self.decode_only_steps += 1
            self.decode_only_s += dt
        self.step_rank_tokens_max.append(self._rank_tokens_max)
        self.step_tokens_sum += int(self.load[2].sum()) if decoded else 0
        now = self.env.now
        stats = self.stats
        finished: list[int] = []
        chunk_tokens = 0
        for seq, n, replay in self.step_items:
            stats.count(seq, n, replay, self.flops)
            self.outstanding_s -= self.predicted_s(n, seq.pos)
            self.prefill_kv[seq.rank] += n
            chunk_tokens += n
            seq.pos += n
            if seq.pos >= seq.end:
                self.prompts[seq.rank].remove(seq)
                self.n_queued -= 1
                self.table.t_prefill_end[seq.rid] = now
                finished.append(seq.rid)
        self.step_items.clear()
        self.step_chunk_tokens.append(chunk_tokens)
        self.step_tokens_sum += chunk_tokens
        if not self.n_queued:
            self.outstanding_s = 0.0  # drop accumulated float round-off
        for rid in finished:
            self.on_prefilled(rid, self.idx)

    def hand_off(self, rid: int) -> None:
        """``rid``'s prompt is prefilled and its first token out: it moves to this rank's decode
        batch (its KV stays where it is), or ends when that token was the whole answer."""
        t = self.table
        rank = int(t.decode_rank[rid])
        n_in = float(t.input_len[rid])
        self.prefilling[rank] -= 1
        self.prefill_kv[rank] -= n_in
        self.reserved[rank] -= self.kv_admission.reservation(n_in, n_in + float(t.output_len[rid]))
        if t.output_len[rid] <= 1:
            self._unassign(rid, rank)
            t.t_done[rid] = self.env.now
            t.state[rid] = State.DONE
            self.on_done(rid)
            return
        self.arrive(rid)  # admitted to a slot (the reservation it just released) next step

    # ---- after the run ------------------------------------------------------------------------
    def report(self, now: float) -> dict[str, Any]:
        """The decode group's report (its ``busy_s``, ``stepping_s`` and ``steps``: every step)
        with the prefill side's (as a prefill instance reports it) and the time by what a step
        carried: ``prefill_busy_s`` / ``decode_busy_s`` (steps with chunks / with decode
        sequences; ``*_stepping_s``: the step in flight), and mixed, decode-only and
        prefill-only steps and seconds."""
        rep = super().report(now)
        stats = self.stats
        stepping = rep["stepping_s"]
        rep.update(
            {
                "chunk_tokens": stats.chunk_tokens,
                "compute_tokens": stats.compute_tokens,
                "replay_tokens": stats.replay_tokens,
                "flops": stats.flops,
                "replay_flops": stats.replay_flops,
                "queued": self.n_queued,
                "prefilling": int(self.prefilling.sum()),
                "prefill_busy_s": self.mixed_s + self.prefill_only_s,
                "prefill_stepping_s": stepping if self.step_items else 0.0,
                "decode_busy_s": self.mixed_s + self.decode_only_s,
                "decode_stepping_s": stepping if self._decoding else 0.0,
                "prefill_steps": self.mixed_steps + self.prefill_only_steps,
                "mixed_steps": self.mixed_steps,
                "mixed_s": self.mixed_s,
                "decode_only_steps": self.decode_only_steps,
                "decode_only_s": self.decode_only_s,
                "prefill_only_steps": self.prefill_only_steps,
                "prefill_only_s": self.prefill_only_s,
                "step_tokens": self.step_tokens_sum,
                "step_token_budget": self.max_tokens,
                "wait_steps": self.wait_steps,
                "wait_s": self.wait_s,
            }
        )
        return rep

    def check(self) -> list[str]:
        """The decode group's invariants, and the prompts': slots and KV within the rank's
        limits counted with the prompts started, and no step over its token budget."""
        errs = super().check()
        name = f"aggregated instance {self.idx}"
        if (self.prefilling < 0).any() or (self.batch + self.prefilling > self.max_seqs).any():
            errs.append(f"{name}: sequences and prompts out of [0, {self.max_seqs}] on a rank")
        if (self.prefill_kv < -1e-6).any() or (
            self.kv + self.prefill_kv > self.reserved + 1e-6
        ).any():
            errs.append(f"{name}: KV held by sequences and prompts exceeds its reservation")
        if int(self.prefilling.sum()) != sum(len(p) for p in self.prompts):
            errs.append(f"{name}: started prompts do not match the per-rank counts")
        started = sum(len(p) for p in self.prompts) + sum(len(q) for q in self.pending)
        if started != self.n_queued:
            errs.append(f"{name}: queued prompts do not match the per-rank lists")
        if self.step_rank_tokens_max and max(self.step_rank_tokens_max) > self.max_tokens:
            errs.append(f"{name}: a step ran more tokens on a rank than its budget")
        return errs
