"""summary.json: the run's headline numbers, in vLLM-bench vocabulary plus cost and revenue.

Throughput is measured over the run's makespan (first arrival to last completion), as vLLM's
benchmark does. Goodput counts completed requests that met both SLOs (TTFT and TPOT).
Utilization is the fraction of the window from the first arrival to the end of the simulation
that each engine spent stepping (a step cut by the horizon counts up to it), averaged over the
pool's engines: at most 1 by construction. Being busy is not being full (a Wide-EP group steps
whenever any rank holds one sequence), so ``load`` adds occupancy: sequences and KV per decode
rank against their limits, tokens per prefill step against the step budget, and queue depths.
Cost multiplies the GPUs of each pool by its hardware's price; revenue applies the configured
per-token prices to the tokens served (revenue, not cost, aggregated over VE, prefill and decode,
the way DeepSeek's published $/GPU-hour figure is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..models.registry import load_hardware
from .metrics import dist_stats
from .requests import RejectReason, State
from .storage_sizing import scenario_gpus

if TYPE_CHECKING:
    from .engine import Cluster


def _cost(cl: Cluster, out_tok_s: float, in_tok_s: float) -> dict[str, Any]:
    sc = cl.sc
    pools = sc.pools
    gpus = {"vision": pools.vision.gpus, "prefill": pools.prefill.gpus, "decode": pools.decode.gpus}
    price = sc.prices.gpu_hour_usd
    usd_h = sum(
        n * price[load_hardware(hw).name]
        for n, hw in zip(
            gpus.values(),
            (pools.vision.hardware, pools.prefill.hardware, pools.decode.hardware),
            strict=True,
        )
    )
    usd_h += pools.storage.nodes * sc.prices.storage_node_hour_usd
    total_gpus = sum(gpus.values())
    rev = sc.prices.revenue
    revenue_h = (
        (in_tok_s * rev.input_per_mtok_usd + out_tok_s * rev.output_per_mtok_usd) * 3600 / 1e6
    )
    out_mtok_h = out_tok_s * 3600 / 1e6
    return {
        "gpus": {**gpus, "total": total_gpus},
        "storage_nodes": pools.storage.nodes,
        "usd_per_hour": usd_h,
        "usd_per_mtok_output": usd_h / out_mtok_h if out_mtok_h > 0 else None,
        "revenue_usd_per_hour": revenue_h,
        "revenue_per_gpu_hour_usd": revenue_h / total_gpus if total_gpus else None,
    }


def _prefill(cl: Cluster) -> dict[str, Any]:
    t = cl.table
    stats = [p.stats for p in cl.prefill]
    looked = t.swa_lookup
    tiers = cl.sc.policies.tiers.names()
    by_tier = {}
    done = t.state == State.DONE
    for i, name in enumerate(tiers):
        sel = done & (t.tier == i)
        if sel.any():
            ttft = (t.t_transfer_end - t.arrival)[sel]
            by_tier[name] = {"requests": int(sel.sum()), "ttft_s": dist_stats(ttft)}
    return {
        "scheduler": cl.sc.pools.prefill.scheduler,
        "router": cl.sc.policies.prefill_router,
        "swa_mode": cl.sc.cache.swa.mode,
        "compute_tokens": sum(s.compute_tokens for s in stats),
        "replay_tokens": sum(s.replay_tokens for s in stats),
        "flops": sum(s.flops for s in stats),
        "replay_flops": sum(s.replay_flops for s in stats),
        "steps": sum(p.steps for p in cl.prefill),
        "swa_hits": int(((looked == 2) | (looked == 3)).sum()),
        "swa_remote_hits": int((looked == 3).sum()),
        "swa_misses": int((looked == 1).sum()),
        "by_tier": by_tier,
    }


def _cache(cl: Cluster) -> dict[str, Any]:
    t = cl.table
    src = t.source
    looked_up = t.state != State.PENDING
    looked_up &= t.state != State.REJECTED
    hit = t.hit_tokens[looked_up].astype(float)
    total = t.input_len[looked_up].astype(float)
    classes = src.traffic_class[looked_up]
    by_class = {}
    for code, name in enumerate(src.class_names):
        sel = classes == code
        if sel.any():
            by_class[name] = float(hit[sel].sum() / total[sel].sum())
    return {
        "enabled": cl.sc.cache.prefix.enabled,
        "hit_rate_tokens": float(hit.sum() / total.sum()) if total.sum() else None,
        "by_class": by_class,
        "hit_tokens": float(hit.sum()),
        "blocks_stored": len(cl.path.store) if cl.path and cl.path.store is not None else 0,
    }


def _eplb(cl: Cluster) -> dict[str, Any]:
    """Expert imbalance per pool (step-weighted over every EP group) and EPLB's work."""
    sc = cl.sc
    eplb = sc.policies.eplb
    constant = sc.policies.expert_imbalance
    out: dict[str, Any] = {"imbalance": eplb.imbalance}
    by_pool = {}
    totals = {"rebalances": 0, "moved_bytes": 0.0, "moved_experts": 0, "stall_s": 0.0}
    for pool, groups in (
        ("prefill", [p.experts for p in cl.prefill]),
        ("decode", [g.experts for g in cl.decode]),
    ):
        live = [e for e in groups if e is not None]
        if not live:
            out[f"{pool}_imbalance_mean"] = getattr(constant, pool)
            continue
        factors = np.concatenate([np.asarray(e.factors) for e in live])
        policy = getattr(eplb, pool)
        stats = {
            "policy": policy.policy,
            "window_steps": policy.window_steps,
            "period_steps": policy.period_steps,
            "redundant_experts_per_gpu": live[0].shape.redundant_per_rank,
            "steps": int(factors.size),
            "imbalance": dist_stats(factors),
            "rebalances": sum(e.rebalances for e in live),
            "moved_bytes": sum(e.moved_bytes for e in live),
            "moved_experts": sum(e.moved_experts for e in live),
            "stall_s": sum(e.stall_total_s for e in live),
        }
        by_pool[pool] = stats
        out[f"{pool}_imbalance_mean"] = float(factors.mean()) if factors.size else None
        for key in totals:
            totals[key] += stats[key]
    return {**out, **totals, "by_pool": by_pool}


def _storage(cl: Cluster, read_gbps_peak: float) -> dict[str, Any] | None:
    """The 3FS store's traffic, retention and failures (None without storage nodes)."""
    path = cl.path
    kv = path.kv if path is not None else None
    if path is None or kv is None:
        return None
    cfg = cl.sc.pools.storage
    nodes = kv.nodes
    gpus = scenario_gpus(cl.sc)
    return {
        "nodes": cfg.nodes,
        "coding": f"{cfg.data_chunks}+{cfg.parity_chunks}",
        "logical_tb": cfg.logical_bytes / 1e12,
        "logical_tb_per_gpu": cfg.logical_bytes / 1e12 / gpus,
        "ttl_s": {name: kv.ttl[i] for i, name in enumerate(cl.table.source.class_names)},
        "refresh_on_read": cfg.refresh_on_read,
        "reads": kv.reads,
        "writes": kv.writes,
        "read_blocks": kv.read_blocks,
        "written_blocks": kv.written_blocks,
        "read_bytes": nodes.read_bytes,
        "write_bytes": nodes.write_bytes,
        "read_gbps_peak": read_gbps_peak,
        "read_latency_s": dist_stats(np.asarray(path.read_latencies)),
        "blocks_held": len(kv),
        "used_fraction": kv.used_fraction(),
        "used_fraction_peak": kv.used_fraction_peak,
        "evictions_gc": kv.evictions_gc,
        "expirations": kv.expirations,
        "node_failures": cl.counters.get("storage_node_failures", 0),
        "degraded_reads": nodes.degraded_reads,
        "lost_blocks": kv.lost_blocks,
        "lost_block_misses": kv.lost_misses,
        "writes_failed": kv.writes_failed,
        "rebuild_bytes": nodes.rebuild_bytes,
    }


class _Engine(Protocol):
    busy_s: float

    def stepping_s(self, now: float) -> float: ...


def _busy(engines: Sequence[_Engine], now: float) -> float:
    """Seconds the engines spent stepping up to ``now`` (a step in flight counts up to it)."""
    return sum(e.busy_s + e.stepping_s(now) for e in engines)


def _utilization(engines: Sequence[_Engine], now: float, window: float) -> float | None:
    if not engines:
        return None
    return float(min(1.0, _busy(engines, now) / (window * len(engines))))  # min(): round-off


def _load(cl: Cluster, window: float, queues: dict[str, dict[str, float]] | None) -> dict[str, Any]:
    """Occupancy next to busy time. Time-weighted means are over ``window_s`` (an idle engine
    holds nothing); ``*_while_busy`` means are over the time the engines were stepping."""
    sc = cl.sc
    now = cl.env.now
    queues = queues or {}
    d = sc.pools.decode
    ranks = len(cl.decode) * d.ep
    cap = cl.kv_capacity_tokens
    busy_d = sum(g.busy_s for g in cl.decode)
    seq_s = sum(g.seq_s for g in cl.decode)
    kv_s = sum(g.kv_s for g in cl.decode)
    res_s = sum(g.reserved_s for g in cl.decode)
    seqs_mean = seq_s / (window * ranks)
    decode = {
        "busy_fraction": _utilization(cl.decode, now, window),
        "seqs_per_rank_mean": seqs_mean,
        "seqs_per_rank_while_busy": seq_s / (busy_d * ranks) if busy_d else 0.0,
        "max_seqs_per_rank": d.max_seqs_per_rank,
        "batch_fill": seqs_mean / d.max_seqs_per_rank,
        "kv_tokens_per_rank_mean": kv_s / (window * ranks),
        "kv_capacity_tokens_per_rank": cap,
        "kv_used_fraction_mean": kv_s / (window * ranks * cap),
        "kv_reserved_fraction_mean": res_s / (window * ranks * cap),
        "kv_used_fraction_while_busy": kv_s / (busy_d * ranks * cap) if busy_d else 0.0,
        "queue": queues.get("decode"),
        "parked_queue": queues.get("decode_parked"),
    }
    p = sc.pools.prefill
    steps = sum(i.steps for i in cl.prefill)
    chunk_tokens = sum(i.stats.chunk_tokens for i in cl.prefill)
    budget = p.max_tokens_per_step * p.ep
    per_step = chunk_tokens / steps if steps else 0.0
    busy_p = sum(i.busy_s for i in cl.prefill)
    prefill = {
        "busy_fraction": _utilization(cl.prefill, now, window),
        "tokens_per_step_mean": per_step,
        "step_token_budget": budget,
        "step_token_fill": per_step / budget,
        "step_s_mean": busy_p / steps if steps else 0.0,
        "step_time_budget_s": p.step_time_budget_s,
        "queue": queues.get("prefill"),
    }
    out: dict[str, Any] = {"window_s": window, "prefill": prefill, "decode": decode}
    out["transfer"] = {"queue": queues.get("transfer")}
    if cl.vision:
        out["vision"] = {
            "busy_fraction": _utilization(cl.vision, now, window),
            "queue": queues.get("vision"),
        }
    return out


def _vision(cl: Cluster, window: float) -> dict[str, Any] | None:
    """The VE stage: images encoded, time in the stage (queue + encode), encode time alone."""
    if not cl.vision:
        return None
    t = cl.table
    encoded = np.isfinite(t.t_vision_done)
    per_image = cl.vision[0].seconds_per_image
    images = t.source.image_count[encoded].astype(float)
    return {
        "instances": len(cl.vision),
        "hardware": cl.sc.pools.vision.hardware,
        "requests": int(encoded.sum()),
        "images": int(sum(v.encoded for v in cl.vision)),
        "seconds_per_image": per_image,
        "encode_s": dist_stats(images * per_image),
        "stage_s": dist_stats((t.t_vision_done - t.arrival)[encoded]),
        "ve_utilization": _utilization(cl.vision, cl.env.now, window),
    }


def summarize(
    cl: Cluster,
    itl_stats: dict[str, float],
    wall_s: float,
    read_gbps_peak: float = 0.0,
    queues: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    t = cl.table
    sc = cl.sc
    states = np.bincount(t.state, minlength=len(State))
    done = t.state == State.DONE
    completed = int(done.sum())
    rejected = int(states[State.REJECTED])
    reasons = np.bincount(t.reject_reason[t.state == State.REJECTED], minlength=len(RejectReason))
    first_token = t.t_transfer_end
    ttft = (first_token - t.arrival)[done]
    dec = np.maximum(t.output_len - 1, 0)
    has_dec = done & (dec > 0)
    tpot = (t.t_done[has_dec] - first_token[has_dec]) / dec[has_dec]
    e2e = (t.t_done - t.arrival)[done]
    arrived_mask = t.state != State.PENDING
    start = float(t.arrival[arrived_mask].min()) if arrived_mask.any() else 0.0
    end = float(np.nanmax(t.t_done[done])) if completed else cl.env.now
    makespan = max(end - start, 1e-12)
    window = max(cl.env.now - start, 1e-12)  # busy time is counted up to now, not to ``end``
    in_tok = float(t.input_len[done].sum())
    out_tok = float(t.output_len[done].sum())
    in_s, out_s = in_tok / makespan, out_tok / makespan
    pools = sc.pools
    good = done.copy()
    good[done] = ttft <= sc.slo.ttft_s
    tpot_full = np.full(t.n, 0.0)
    tpot_full[has_dec] = tpot
    good &= tpot_full <= sc.slo.tpot_s
    n_good = int(good.sum())
    seq_steps = sum(g.seq_steps for g in cl.decode)
    steps = sum(g.steps for g in cl.decode)
    verified = sum(g.verify_sum for g in cl.decode)
    emitted = sum(g.tokens_out for g in cl.decode)
    ranks = pools.decode.groups * pools.decode.ep
    return {
        "scenario": sc.name,
        "requests": {
            "in_workload": int(t.n),
            "not_arrived": int(t.n) - cl.arrived,  # cut off by sim.horizon_s
            "arrived": cl.arrived,
            "completed": completed,
            "rejected": rejected,
            "in_flight": cl.arrived - completed - rejected,
            "rejected_by_reason": {
                r.name.lower(): int(reasons[r]) for r in RejectReason if r and reasons[r]
            },
        },
        "latency": {
            "ttft_s": dist_stats(ttft),
            "tpot_s": dist_stats(tpot),
            "itl_s": itl_stats,
            "e2e_s": dist_stats(e2e),
        },
        "throughput": {
            "duration_s": makespan,
            "request_per_s": completed / makespan,
            "input_tok_per_s": in_s,
            "output_tok_per_s": out_s,
            "total_tok_per_s": in_s + out_s,
            "output_tok_per_s_per_gpu": out_s
            / max(1, pools.prefill.gpus + pools.decode.gpus + pools.vision.gpus),
            "input_tok_per_s_per_prefill_gpu": in_s / pools.prefill.gpus,
            "output_tok_per_s_per_decode_gpu": out_s / pools.decode.gpus,
        },
        "goodput": {
            "slo": {"ttft_s": sc.slo.ttft_s, "tpot_s": sc.slo.tpot_s},
            "requests": n_good,
            "request_per_s": n_good / makespan,
            "fraction_of_completed": n_good / completed if completed else None,
        },
        "utilization": {
            "vision": _utilization(cl.vision, cl.env.now, window),
            "prefill": _utilization(cl.prefill, cl.env.now, window),
            "decode": _utilization(cl.decode, cl.env.now, window),
        },
        "load": _load(cl, window, queues),
        "decode": {
            "steps": steps,
            "mean_batch_per_rank": seq_steps / (steps * pools.decode.ep) if steps else 0.0,
            "balancer": sc.policies.decode_balancer,
            "speculative": sc.policies.speculative.policy,
            "verify_tokens_per_seq_step": verified / seq_steps if seq_steps else 0.0,
            "accepted_tokens_per_seq_step": emitted / seq_steps if seq_steps else 0.0,
            "tokens_per_s_per_rank": out_s / ranks,
            "kv_policy": pools.decode.kv_policy,
            "preemptions": sum(g.preemptions for g in cl.decode),
            "recompute_s": sum(g.recompute_s for g in cl.decode),
            "rank_failures": sum(g.rank_failures for g in cl.decode),
            "requeued_after_failure": cl.counters.get("requeued", 0),
            "group_outages": cl.counters.get("group_outages", 0),
            "parked_no_live_rank": cl.counters.get("parked", 0),
            "parked_at_end": len(cl.parked),
            "kv_capacity_tokens_per_rank": cl.kv_capacity_tokens,
        },
        "transfer": {
            "bytes": float(t.transfer_bytes.sum()),
            "mean_s": dist_stats((t.t_transfer_end - t.t_prefill_end)[has_dec])["mean"],
            "p99_s": dist_stats((t.t_transfer_end - t.t_prefill_end)[has_dec])["p99"],
            "link_cuts": cl.counters.get("link_cuts", 0),
            "rerouted": cl.counters.get("rerouted_transfers", 0),
        },
        "vision": _vision(cl, window),
        "prefill": _prefill(cl),
        "cache": _cache(cl),
        "storage": _storage(cl, read_gbps_peak),
        "eplb": _eplb(cl),
        "cost": _cost(cl, out_s, in_s),
        "sim": {
            "seed": sc.seed,
            "simulated_s": cl.env.now,
            "events": cl.env.events,
            "wall_s": wall_s,
        },
    }
