"""Offline decode experiments on one Wide-EP group, driven directly (no prefill, no links).

- ``steady_throughput``: a fixed number of sequences per rank decoding long outputs; measures
  tokens per second per rank, verified and accepted tokens per sequence-step over a window of
  steps (the speculative-decoding reproduction sweeps this over concurrency).
- ``offline_makespan``: a batch of requests all present at t = 0, routed by a decode balancer
  (or costed as perfectly balanced), decoded to completion; throughput = output tokens /
  makespan (the decode-balancer comparison).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from ...models.registry import load_hardware, load_model
from ...scenario import Scenario
from ...sim.core.assemble import (
    decode_kv_capacity_tokens,
    make_expert_load,
    make_group_experts,
    make_spec_decoder,
    make_step_cost,
)
from ...sim.core.requests import RequestTable
from ...sim.policies.balancer import make_balancer
from ...sim.policies.kv_admission import make_kv_admission
from ...sim.stages.decode import DecodeGroup
from ...traces import RequestSource


@dataclass(frozen=True)
class DecodeRun:
    tokens_per_s_per_rank: float
    verify_tokens_per_seq_step: float
    accepted_tokens_per_seq_step: float
    mean_step_s: float
    steps: int
    makespan_s: float
    imbalance_mean: float  # expert imbalance over the measured steps (the constant if not live)


def _source(inputs: np.ndarray, outputs: np.ndarray, block: int = 512) -> RequestSource:
    blocks = -(-inputs // block)
    offsets = np.concatenate([[0], np.cumsum(blocks)])
    return RequestSource.from_columns(
        arrival_s=np.zeros(inputs.size),
        input_len=inputs,
        output_len=outputs,
        block_offsets=offsets,
        block_hashes=np.arange(offsets[-1]),
        block_tokens=block,
        name="offline",
    )


def _group(
    sc: Scenario, src: RequestSource, ideal: bool = False
) -> tuple[simpy.Environment, DecodeGroup]:
    model = load_model(sc.model)
    pool = sc.pools.decode
    hw = load_hardware(pool.hardware)
    env = simpy.Environment()
    table = RequestTable(src)
    cost = make_step_cost(sc, "decode", model, hw, pool.ep, pool.redundant_per_gpu)
    kv_cap = decode_kv_capacity_tokens(sc, model, hw)
    overhead = model.swa_slot_bytes / model.kv_hbm_bytes_per_token()
    spec = make_spec_decoder(sc, model, src, pool.dp * pool.max_seqs_per_rank, 0)
    group = DecodeGroup(
        env=env,
        idx=0,
        ep=pool.dp,
        cost=cost,
        max_seqs_per_rank=pool.max_seqs_per_rank,
        kv_capacity_tokens=kv_cap,
        kv_admission=make_kv_admission(pool.kv_policy, overhead),
        imbalance=sc.policies.expert_imbalance.decode,
        table=table,
        on_done=lambda rid: None,
        spec=spec,
        ideal_balance=ideal or pool.ideal_balance,
        experts=make_group_experts(sc, "decode", make_expert_load(sc, model, src), "decode/0"),
    )
    return env, group


def _imbalance_since(group: DecodeGroup, step: int) -> float:
    if group.experts is None:
        return group.imbalance
    return float(np.mean(group.experts.factors[step:]))


def steady_throughput(
    sc: Scenario,
    per_rank: int,
    context: int = 8192,
    steps: int = 300,
    warmup: int = 30,
    outputs: np.ndarray | None = None,
    on_group: Callable[[DecodeGroup], None] | None = None,
) -> DecodeRun:
    """``per_rank`` sequences on every rank, each at ``context`` tokens. Without ``outputs`` no
    sequence ends within the measured steps; with them (output lengths to draw from, cyclically)
    every finished sequence is replaced at once on its rank — a closed loop at constant
    concurrency, in which slow sequences stay longer, as they do in production. ``on_group``
    sees the group before it starts (e.g. to record its expert steps)."""
    pool = sc.pools.decode
    n = per_rank * pool.dp
    longest = (warmup + steps) * (sc.policies.speculative.max_draft_tokens + 1) + 16
    if outputs is None:
        outs = np.full(n, longest)
    else:
        total = n * (2 + longest // max(1, int(np.mean(outputs))) * 2)
        outs = np.resize(np.maximum(np.asarray(outputs), 2), total)
    src = _source(np.full(outs.size, context), outs)
    env, group = _group(sc, src)
    if on_group is not None:
        on_group(group)
    nxt = [n]

    def replace(rid: int) -> None:
        if nxt[0] < len(src):
            new = nxt[0]
            nxt[0] += 1
            group.table.t_transfer_end[new] = env.now
            group.assign(new, int(group.table.decode_rank[rid]))
            group.arrive(new)

    if outputs is not None:
        group.on_done = replace
    for rid in range(n):
        group.table.t_transfer_end[rid] = 0.0
        group.assign(rid, rid % pool.dp)
        group.arrive(rid)
    env.run(until=1e-9)
    while group.steps < warmup:
        env.step()
    t0, tok0, ver0, seq0 = env.now, group.tokens_out, group.verify_sum, group.seq_steps
    while group.steps < warmup + steps:
        env.step()
    dt = env.now - t0
    seq = group.seq_steps - seq0
    return DecodeRun(
        tokens_per_s_per_rank=(group.tokens_out - tok0) / dt / pool.dp,
        verify_tokens_per_seq_step=(group.verify_sum - ver0) / seq,
        accepted_tokens_per_seq_step=(group.tokens_out - tok0) / seq,
        mean_step_s=dt / steps,
        steps=steps,
        makespan_s=dt,
        imbalance_mean=_imbalance_since(group, warmup),
    )


def offline_makespan(
    sc: Scenario, inputs: np.ndarray, outputs: np.ndarray, ideal: bool = False
) -> DecodeRun:
    """Every request present at t = 0, routed by the scenario's balancer, decoded to the end."""
    src = _source(np.asarray(inputs), np.asarray(outputs))
    env, group = _group(sc, src, ideal)
    balancer = make_balancer(
        "round_robin" if ideal else sc.policies.decode_balancer,
        [group],
        sc.policies.long_request_tokens,
    )
    for rid in range(len(src)):
        group.table.t_transfer_end[rid] = 0.0
        _, rank = balancer.choose(rid)
        group.assign(rid, rank)
        group.arrive(rid)
    env.run()
    seq = max(1, group.seq_steps)
    return DecodeRun(
        tokens_per_s_per_rank=float((src.output_len - 1).sum()) / env.now / sc.pools.decode.dp,
        verify_tokens_per_seq_step=group.verify_sum / seq,
        accepted_tokens_per_seq_step=group.tokens_out / seq,
        mean_step_s=env.now / max(1, group.steps),
        steps=group.steps,
        makespan_s=env.now,
        imbalance_mean=_imbalance_since(group, 0),
    )
