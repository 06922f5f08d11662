"""RequestTable: the per-request record of a run, as preallocated columnar arrays.

Requests flow through the simulator as integer ids (their row in the workload); each stage writes
its timestamps and placements into these columns, so there is no per-request object on the hot
path and the final ``requests.parquet`` is a direct view of the arrays.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from ...traces import RequestSource
from ..results.columns import Categorical, Columns


class State(IntEnum):
    PENDING = 0  # not yet arrived
    VISION = 1
    PREFILL = 2
    TRANSFER = 3
    DECODE_WAIT = 4
    DECODE = 5
    DONE = 6
    REJECTED = 7


class RejectReason(IntEnum):
    NONE = 0
    CONTEXT_TOO_LONG = 1  # prompt + output exceeds the model's context window
    KV_CAPACITY = 2  # the request can never fit in one decode rank's KV memory
    NO_VISION_ENCODER = 3  # the request has images but the scenario has no VE instance
    NO_DECODE_RANK = 4  # every decode rank is down and none will be repaired
    # admission control (policies.admission), decided at arrival
    QUEUE_TIME = 5  # the predicted wait before its prefill starts exceeds the limit
    QUEUE_LENGTH = 6  # the prefill pool already holds policies.admission.max_queued prompts


class RequestTable:
    """Columns indexed by request id. Times are simulated seconds; NaN means "not reached"."""

    def __init__(self, source: RequestSource) -> None:
        n = len(source)
        self.source = source
        self.n = n
        nan = lambda: np.full(n, np.nan)  # noqa: E731
        neg = lambda: np.full(n, -1, dtype=np.int32)  # noqa: E731
        self.arrival = source.arrival_s
        self.input_len = source.input_len
        self.output_len = source.output_len
        self.state = np.zeros(n, dtype=np.int8)
        self.reject_reason = np.zeros(n, dtype=np.int8)
        self.t_vision_done = nan()
        self.t_prefill_start = nan()
        self.t_prefill_end = nan()
        self.t_transfer_end = nan()
        self.t_decode_start = nan()
        self.t_done = nan()
        # int32: a group's step index and a request's tokens stay far below 2**31
        self.decode_first_step = np.full(n, -1, dtype=np.int32)  # index in its group's steps
        self.decode_last_step = np.full(n, -1, dtype=np.int32)
        self.decode_generated = np.zeros(n, dtype=np.int32)  # tokens decoded before a preemption
        self.preemptions = np.zeros(n, dtype=np.int32)
        self.kv_lost = np.zeros(n, dtype=bool)  # must recompute its KV when next admitted
        self.failures = np.zeros(n, dtype=np.int32)  # times moved off a failed decode rank
        self.prefill_instance = neg()
        self.decode_group = neg()
        self.decode_rank = neg()
        self.vision_instance = neg()
        self.transfer_bytes = np.zeros(n)
        # prefill path: prefix-cache hit, length tier, SWA lookup and replayed tokens
        self.hit_tokens = np.zeros(n, dtype=np.int64)
        self.tier = neg()
        # SWA lookup: 0 nothing to look up, 1 miss, 2 local hit, 3 remote hit
        self.swa_lookup = np.zeros(n, dtype=np.int8)
        self.enc_replay = np.zeros(n, dtype=np.int64)
        self.dec_replay = np.zeros(n, dtype=np.int64)

    def reject(self, rid: int, reason: RejectReason) -> None:
        self.state[rid] = State.REJECTED
        self.reject_reason[rid] = reason

    def columns(self, itl_max: np.ndarray) -> Columns:
        """One row per request (the ``requests.parquet`` table); the table's own arrays, not a
        second copy of every one."""
        src = self.source
        out = self.output_len
        first = self.t_transfer_end
        ttft = first - self.arrival
        decode_tokens = np.maximum(out - 1, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(decode_tokens > 0, (self.t_done - first) / decode_tokens, np.nan)
        return Columns(
            {
                "request_id": np.arange(self.n),
                "arrival_s": self.arrival,
                "traffic_class": Categorical(src.traffic_class, tuple(src.class_names)),
                "input_tokens": self.input_len,
                "output_tokens": out,
                "images": src.image_count,
                "state": Categorical(self.state, tuple(s.name.lower() for s in State)),
                "reject_reason": Categorical(
                    self.reject_reason, tuple(r.name.lower() for r in RejectReason)
                ),
                "vision_instance": self.vision_instance,
                "prefill_instance": self.prefill_instance,
                "decode_group": self.decode_group,
                "decode_rank": self.decode_rank,
                "t_vision_done_s": self.t_vision_done,
                "t_prefill_start_s": self.t_prefill_start,
                "t_prefill_end_s": self.t_prefill_end,
                "t_first_token_s": first,
                "t_decode_start_s": self.t_decode_start,
                "t_done_s": self.t_done,
                "ttft_s": ttft,
                "tpot_s": tpot,
                "itl_max_s": itl_max,
                "e2e_s": self.t_done - self.arrival,
                "queue_prefill_s": self.t_prefill_start
                - np.where(np.isnan(self.t_vision_done), self.arrival, self.t_vision_done),
                "transfer_s": self.t_transfer_end - self.t_prefill_end,
                "queue_decode_s": self.t_decode_start - self.t_transfer_end,
                "transfer_bytes": self.transfer_bytes,
                "preemptions": self.preemptions,
                "rank_failures": self.failures,
                "prefix_hit_tokens": self.hit_tokens,
                "tier": self.tier,
                "swa": Categorical(self.swa_lookup, ("none", "miss", "local", "remote")),
                "encoder_replay_tokens": self.enc_replay,
                "decoder_replay_tokens": self.dec_replay,
            }
        )
