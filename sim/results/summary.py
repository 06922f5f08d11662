"""summary.json: the run's headline numbers, in vLLM-bench vocabulary plus cost and revenue.

Throughput is measured over the run's makespan (first arrival to last completion), as vLLM's
benchmark does. Goodput counts completed requests that met every SLO that is set (TTFT and TPOT,
and E2E when ``slo.e2e_s`` is set; ``goodput.slo`` lists those applied). Latency distributions
carry ``vllm bench serve``'s statistics: mean, std, min, max and the ``sim.percentiles``
(p50, p90 and p99 always). ITL is measured per decode step (``itl_s``, vLLM's per-chunk ITL under
speculative decoding) and per token (``itl_per_token_s``), see ``sim/results/itl.py``. Peak output
throughput is the most output tokens (first tokens included) delivered in one time-series
interval over its width (``sim.timeseries_interval_s``, 1 s by default as vLLM's buckets); peak
concurrency is the most requests between arrival and completion at any instant.
Utilization is the fraction of the window from the first arrival to the end of the simulation
that each engine spent stepping (a step cut by the horizon counts up to it), averaged over the
pool's engines: at most 1 by construction. Being busy is not being full (a Wide-EP group steps
whenever any rank holds one sequence), so ``load`` adds occupancy: sequences and KV per decode
rank against their limits, tokens per prefill step against the step budget, and queue depths.
Under aggregated serving (``serving: aggregated``) one pool both prefills and decodes: its
engines report in ``utilization.aggregated`` and ``load.aggregated`` (busy, tokens per step
against the budget, steps by what they carried and how long each kind took: the prefill stall),
``utilization.prefill`` / ``utilization.decode`` become the share of time in steps that carried
prefill chunks / decode sequences, and ``load.prefill`` / ``load.decode`` those two sides of the
same engines. Cost multiplies the GPUs of each pool by its hardware's price; revenue applies
the configured per-token prices to the tokens served, per traffic class where a class is priced
apart (see ``sim/results/revenue.py``; revenue, not cost, aggregated over VE, prefill and decode,
the way DeepSeek's published $/GPU-hour figure is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.requests import RejectReason, State
from .metrics import bench_stats, dist_stats, latency_percentiles
from .reports import Report, Reports
from .revenue import TokenRates, revenue

if TYPE_CHECKING:
    import pandas as pd

    from ..core.cluster import Cluster
    from .columns import Columns


def _cost(cl: Cluster, rep: Reports, makespan: float) -> dict[str, Any]:
    sc = cl.sc
    pools = sc.pools
    gpus = pools.gpus_by_pool()
    usd_h = sc.gpu_usd_per_hour() + pools.storage.nodes * sc.prices.storage_node_hour_usd
    total_gpus = pools.gpus
    t = cl.table
    done = t.state == State.DONE
    in_tok_s = float(t.input_len[done].sum()) / makespan
    out_tok_s = float(t.output_len[done].sum()) / makespan
    cache = _cache(cl, rep)
    by_class = {}
    for code, name in enumerate(t.source.class_names):
        sel = done & (t.source.traffic_class == code)
        if sel.any():
            by_class[name] = TokenRates.split(
                float(t.input_len[sel].sum()) / makespan,
                float(t.output_len[sel].sum()) / makespan,
                cache["by_class"].get(name, 0.0),
            )
    total = TokenRates.split(in_tok_s, out_tok_s, cache["hit_rate_tokens"] or 0.0)
    earned, earned_by_class = revenue(sc.prices.revenue, total, by_class)
    revenue_h = sum(earned.values())
    out_mtok_h = out_tok_s * (3600 / 1e6)
    return {
        "gpus": {**gpus, "total": total_gpus},
        "storage_nodes": pools.storage.nodes,
        "usd_per_hour": usd_h,
        "usd_per_mtok_output": usd_h / out_mtok_h if out_mtok_h > 0 else None,
        "revenue_usd_per_hour": revenue_h,
        "revenue_usd_per_hour_by_tokens": earned,  # USD per hour by the tokens that earned it
        "revenue_usd_per_hour_by_class": earned_by_class,
        "revenue_per_gpu_hour_usd": revenue_h / total_gpus if total_gpus else None,
    }


def _prefill(cl: Cluster, rep: Reports) -> dict[str, Any]:
    t = cl.table
    stats = rep.prefill
    looked = t.swa_lookup
    tiers = cl.sc.policies.tiers.names()
    by_tier = {}
    done = t.state == State.DONE
    for i, name in enumerate(tiers):
        sel = done & (t.tier == i)
        if sel.any():
            ttft = (t.t_transfer_end - t.arrival)[sel]
            by_tier[name] = {"requests": int(sel.sum()), "ttft_s": dist_stats(ttft)}
    sc = cl.sc
    agg = sc.pools.aggregated if sc.aggregated else None
    return {
        "scheduler": agg.scheduler if agg is not None else sc.pools.prefill.scheduler,
        # aggregated: the decode balancer places a request on the rank that serves it all
        "router": sc.policies.decode_balancer if agg is not None else sc.policies.prefill_router,
        "swa_mode": sc.cache.swa.mode,
        "compute_tokens": sum(s["compute_tokens"] for s in stats),
        "replay_tokens": sum(s["replay_tokens"] for s in stats),
        "flops": sum(s["flops"] for s in stats),
        "replay_flops": sum(s["replay_flops"] for s in stats),
        "steps": sum(s["prefill_steps" if agg is not None else "steps"] for s in stats),
        # the prefill steps' mean compute slowdown at the power limit (models/power_limit.py)
        "clock_slowdown_mean": _mean_slowdown(stats) if agg is None else None,
        "swa_hits": int(((looked == 2) | (looked == 3)).sum()),
        "swa_remote_hits": int((looked == 3).sum()),
        "swa_misses": int((looked == 1).sum()),
        "by_tier": by_tier,
    }


def _mean_slowdown(stats: list[Report]) -> float | None:
    steps = sum(s["steps"] for s in stats)
    return sum(s["slowdown_sum"] for s in stats) / steps if steps else None


def _cache(cl: Cluster, rep: Reports) -> dict[str, Any]:
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
        "blocks_stored": rep.path["blocks_stored"] if rep.path is not None else 0,
    }


def _eplb(cl: Cluster, rep: Reports) -> dict[str, Any]:
    """Expert imbalance per pool (step-weighted over every EP group) and EPLB's work."""
    sc = cl.sc
    eplb = sc.policies.eplb
    constant = sc.policies.expert_imbalance
    out: dict[str, Any] = {"imbalance": eplb.imbalance}
    by_pool = {}
    totals = {"rebalances": 0, "moved_bytes": 0.0, "moved_experts": 0, "stall_s": 0.0}
    pools: tuple[tuple[str, list[Report | None]], ...] = (
        ("prefill", rep.prefill_experts),
        ("decode", [g["experts"] for g in rep.decode]),
    )
    if sc.aggregated:  # one engine both ways: its experts once
        pools = (("aggregated", [g["experts"] for g in rep.decode]),)
    for pool, groups in pools:
        live = [e for e in groups if e is not None]
        if not live and pool == "aggregated":  # a step with chunks: prefill's, else decode's
            out["prefill_imbalance_mean"] = constant.prefill
            out["decode_imbalance_mean"] = constant.decode
            continue
        if not live:
            out[f"{pool}_imbalance_mean"] = getattr(constant, pool)
            continue
        factors = np.concatenate([np.asarray(e["factors"]) for e in live])
        first = live[0]
        stats = {
            "policy": first["policy"],
            "window_steps": first["window_steps"],
            "period_steps": first["period_steps"],
            "redundant_experts_per_gpu": first["redundant_experts_per_gpu"],
            "steps": int(factors.size),
            "imbalance": dist_stats(factors),
            "rebalances": sum(e["rebalances"] for e in live),
            "moved_bytes": sum(e["moved_bytes"] for e in live),
            "moved_experts": sum(e["moved_experts"] for e in live),
            "stall_s": sum(e["stall_s"] for e in live),
        }
        by_pool[pool] = stats
        out[f"{pool}_imbalance_mean"] = float(factors.mean()) if factors.size else None
        for key in totals:
            totals[key] += stats[key]
    return {**out, **totals, "by_pool": by_pool}


def _storage(cl: Cluster, rep: Reports, read_gbps_peak: float) -> dict[str, Any] | None:
    """The 3FS store's traffic, retention and failures (None without storage nodes): the
    store's report with the run's numbers in their places (capacity per GPU, peak read rate
    from the time series, the hit reads' latencies from the prefill path, node failures)."""
    path = rep.path
    kv = path["storage"] if path is not None else None
    if path is None or kv is None:
        return None
    run = {
        "logical_tb": {"logical_tb_per_gpu": kv["logical_tb"] / cl.sc.pools.gpus},
        "write_bytes": {
            "read_gbps_peak": read_gbps_peak,
            "read_latency_s": dist_stats(np.asarray(path["read_latencies"])),
        },
        "expirations": {"node_failures": cl.counters.get("storage_node_failures", 0)},
    }
    out: dict[str, Any] = {}
    for key, value in kv.items():
        out[key] = value
        out.update(run.get(key, {}))
    return out


def _busy(engines: Sequence[Report], kind: str = "") -> float:
    """Seconds the engines spent stepping up to the reports' time (a step in flight counts up
    to it); ``kind`` ``prefill_`` / ``decode_``: in an aggregated instance's steps that carried
    prefill chunks / decode sequences."""
    return sum(e[f"{kind}busy_s"] + e[f"{kind}stepping_s"] for e in engines)


def _utilization(engines: Sequence[Report], window: float, kind: str = "") -> float | None:
    if not engines:
        return None
    return float(min(1.0, _busy(engines, kind) / (window * len(engines))))  # min(): round-off


def _load(
    cl: Cluster, rep: Reports, window: float, queues: dict[str, dict[str, float]] | None
) -> dict[str, Any]:
    """Occupancy next to busy time. Time-weighted means are over ``window_s`` (an idle engine
    holds nothing); ``*_while_busy`` means are over the time the engines were stepping."""
    sc = cl.sc
    queues = queues or {}
    if sc.aggregated:
        return _load_aggregated(cl, rep, window, queues)
    d = sc.pools.decode
    groups = rep.decode
    ranks = len(groups) * d.dp
    cap = cl.kv_capacity_tokens
    busy_d = sum(g["busy_s"] for g in groups)
    seq_s = sum(g["seq_s"] for g in groups)
    kv_s = sum(g["kv_s"] for g in groups)
    res_s = sum(g["reserved_s"] for g in groups)
    seqs_mean = seq_s / (window * ranks)
    decode = {
        "busy_fraction": _utilization(groups, window),
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
    instances = rep.prefill
    steps = sum(i["steps"] for i in instances)
    chunk_tokens = sum(i["chunk_tokens"] for i in instances)
    budget = p.max_tokens_per_step * p.dp
    per_step = chunk_tokens / steps if steps else 0.0
    busy_p = sum(i["busy_s"] for i in instances)
    prefill = {
        "busy_fraction": _utilization(instances, window),
        "tokens_per_step_mean": per_step,
        "step_token_budget": budget,
        "step_token_fill": per_step / budget,
        "step_s_mean": busy_p / steps if steps else 0.0,
        "step_time_budget_s": p.step_time_budget_s,
        "queue": queues.get("prefill"),
    }
    out: dict[str, Any] = {"window_s": window, "prefill": prefill, "decode": decode}
    out["transfer"] = {"queue": queues.get("transfer")}
    if rep.vision:
        out["vision"] = {
            "busy_fraction": _utilization(rep.vision, window),
            "queue": queues.get("vision"),
        }
    return out


def _load_aggregated(
    cl: Cluster, rep: Reports, window: float, queues: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """``load`` of an aggregated run: the pool as a whole (``aggregated``: busy, tokens per step
    — decode and chunks — against the budget, and the mean step by what it carried, the mixed
    steps' excess over the decode-only ones being the prefill stall; under scheduler
    prefill_first the steps the running sequences waited out, ``wait_steps`` / ``wait_s``), its
    decode side
    (``decode``: sequences and KV per rank, as a decode group's; busy: steps with sequences)
    and its prefill side (``prefill``: chunk tokens per step that carried chunks, against the
    same budget; busy: steps with chunks)."""
    sc = cl.sc
    agg = sc.pools.aggregated
    assert agg is not None
    engines = rep.decode
    ranks = len(engines) * agg.dp
    cap = cl.kv_capacity_tokens
    busy = sum(e["busy_s"] for e in engines)
    busy_d = sum(e["decode_busy_s"] for e in engines)
    seq_s = sum(e["seq_s"] for e in engines)
    kv_s = sum(e["kv_s"] for e in engines)
    res_s = sum(e["reserved_s"] for e in engines)
    seqs_mean = seq_s / (window * ranks)
    budget = agg.max_tokens_per_step * agg.dp

    def total(key: str) -> float:
        return sum(e[key] for e in engines)

    def mean_s(kind: str) -> float | None:
        steps = total(f"{kind}_steps")
        return total(f"{kind}_s") / steps if steps else None

    # every engine step (a decode group's "steps" leaves out those its sequences waited)
    steps = total("mixed_steps") + total("decode_only_steps") + total("prefill_only_steps")
    p_steps = total("prefill_steps")
    chunk_per_step = total("chunk_tokens") / p_steps if p_steps else 0.0
    per_step = total("step_tokens") / steps if steps else 0.0
    mixed, pure = mean_s("mixed"), mean_s("decode_only")
    aggregated = {
        "instances": len(engines),
        "ranks": ranks,
        "busy_fraction": _utilization(engines, window),
        "steps": int(steps),
        "tokens_per_step_mean": per_step,
        "step_token_budget": budget,
        "step_token_fill": per_step / budget,
        "mixed_steps": int(total("mixed_steps")),
        "decode_only_steps": int(total("decode_only_steps")),
        "prefill_only_steps": int(total("prefill_only_steps")),
        "mixed_step_s_mean": mixed,
        "decode_only_step_s_mean": pure,
        "prefill_only_step_s_mean": mean_s("prefill_only"),
        "prefill_stall_s_mean": mixed - pure if mixed is not None and pure is not None else None,
        "wait_steps": int(total("wait_steps")),
        "wait_s": total("wait_s"),
        "queue": queues.get("prefill"),
    }
    decode = {
        "busy_fraction": _utilization(engines, window, "decode_"),
        "seqs_per_rank_mean": seqs_mean,
        "seqs_per_rank_while_busy": seq_s / (busy_d * ranks) if busy_d else 0.0,
        "max_seqs_per_rank": agg.max_seqs_per_rank,
        "batch_fill": seqs_mean / agg.max_seqs_per_rank,
        "kv_tokens_per_rank_mean": kv_s / (window * ranks),
        "kv_capacity_tokens_per_rank": cap,
        "kv_used_fraction_mean": kv_s / (window * ranks * cap),
        "kv_reserved_fraction_mean": res_s / (window * ranks * cap),
        "kv_used_fraction_while_busy": kv_s / (busy * ranks * cap) if busy else 0.0,
        "queue": queues.get("decode"),
        "parked_queue": queues.get("decode_parked"),
    }
    prefill = {
        "busy_fraction": _utilization(engines, window, "prefill_"),
        "tokens_per_step_mean": chunk_per_step,
        "step_token_budget": budget,
        "step_token_fill": chunk_per_step / budget,
        "step_s_mean": total("prefill_busy_s") / p_steps if p_steps else 0.0,
        "step_time_budget_s": agg.step_time_budget_s if agg.scheduler == "chunked" else None,
        "queue": queues.get("prefill"),
    }
    out: dict[str, Any] = {
        "window_s": window,
        "aggregated": aggregated,
        "prefill": prefill,
        "decode": decode,
    }
    if rep.vision:
        out["vision"] = {
            "busy_fraction": _utilization(rep.vision, window),
            "queue": queues.get("vision"),
        }
    return out


def _vision(cl: Cluster, rep: Reports, window: float) -> dict[str, Any] | None:
    """The VE stage: images encoded, time in the stage (queue + encode), encode time alone."""
    if not rep.vision:
        return None
    t = cl.table
    encoded = np.isfinite(t.t_vision_done)
    per_image = rep.vision[0]["seconds_per_image"]
    images = t.source.image_count[encoded].astype(float)
    return {
        "instances": len(rep.vision),
        "hardware": cl.sc.pools.vision.hardware,
        "requests": int(encoded.sum()),
        "images": int(sum(v["images"] for v in rep.vision)),
        "seconds_per_image": per_image,
        "encode_s": dist_stats(images * per_image),
        "stage_s": dist_stats((t.t_vision_done - t.arrival)[encoded]),
        "ve_utilization": _utilization(rep.vision, window),
    }


def _admission(cl: Cluster, rep: Reports) -> dict[str, Any]:
    """policies.admission: its limit, what it turned away, and the prefill backlog it saw."""
    t = cl.table
    adm = rep.admission
    admission_reasons = (RejectReason.QUEUE_TIME, RejectReason.QUEUE_LENGTH)
    turned = (t.state == State.REJECTED) & np.isin(t.reject_reason, admission_reasons)
    n = int(turned.sum())
    return {
        "policy": cl.sc.policies.admission.policy,
        "max_wait_s": adm["max_wait_s"],
        "max_queued": adm["max_queued"],
        "rejected": n,
        "rejected_fraction": n / cl.arrived if cl.arrived else 0.0,
        "predicted_wait_max_s": adm["predicted_wait_max_s"],
        "prefill_backlog_max": adm["prefill_backlog_max"],
    }


def _rates(
    n: int, in_tok: float, out_tok: float, first: float, last: float
) -> dict[str, float | None]:
    span = last - first
    ok = n > 1 and span > 0
    return {
        "window_s": max(span, 0.0),
        "requests": n,
        "request_per_s": n / span if ok else None,
        "input_tok_per_s": in_tok / span if ok else None,
        "output_tok_per_s": out_tok / span if ok else None,
    }


def _offered_load(cl: Cluster) -> dict[str, Any]:
    """Offered vs served load. Offered: every arrived request (rejected ones too) over the
    arrival window (first to last arrival). Served: the completed requests over the completion
    window (first to last completion): an overloaded cluster shows its service rate below the
    offered rate.

    ``served_over_offered`` counts over one window, the whole run: the output tokens of the
    completed requests over those of every arrived request, so a run that served everything
    reads 1 (however its latencies spread its completions), and one that turned requests away
    or still had some in flight at the end reads below 1. (Dividing the two rates, as it once
    did, compared spans that differ by the spread of latencies: a short run that served all it
    was offered read 94 %.) A run that served everything late reads 1 here; its lag shows in
    the served rate, its latencies and the peak queue depths."""
    t = cl.table
    arrived = t.state != State.PENDING
    done = t.state == State.DONE
    arr = t.arrival[arrived]
    fin = t.t_done[done]
    offered_out = float(t.output_len[arrived].sum())
    served_out = float(t.output_len[done].sum())
    offered = _rates(
        int(arrived.sum()),
        float(t.input_len[arrived].sum()),
        offered_out,
        float(arr.min()) if arr.size else 0.0,
        float(arr.max()) if arr.size else 0.0,
    )
    served = _rates(
        int(done.sum()),
        float(t.input_len[done].sum()),
        served_out,
        float(fin.min()) if fin.size else 0.0,
        float(fin.max()) if fin.size else 0.0,
    )
    return {
        "offered": offered,
        "served": served,
        "served_over_offered": served_out / offered_out if offered_out > 0 else None,
        "completed_fraction": int(done.sum()) / cl.arrived if cl.arrived else None,
    }


def _peak_output_tok_per_s(cl: Cluster, timeseries: pd.DataFrame | Columns | None) -> float | None:
    """Most output tokens delivered in one time-series interval, over the interval's nominal
    width (a final, shorter interval too, as vLLM's last 1 s bucket): the decode tokens the
    interval's row counted plus the first tokens (delivered with the KV hand-off) that fell in
    it. None without time-series rows."""
    if timeseries is None or timeseries.empty:
        return None
    ends = np.asarray(timeseries["t_s"], dtype=float)
    edges = np.concatenate([[0.0], ends])
    decoded = np.asarray(timeseries["output_tok_per_s"], dtype=float) * np.diff(edges)
    first = cl.table.t_transfer_end
    first = first[np.isfinite(first)]
    firsts = np.histogram(first, bins=edges)[0] if edges.size > 1 else np.zeros(0)
    return float((decoded + firsts).max() / cl.sc.sim.timeseries_interval_s)


def _peak_concurrency(cl: Cluster) -> int:
    """Most requests in flight at once, exactly, from the requests table: a request counts from
    its arrival to its completion (to the end of the run when still in flight); a rejected one
    never counts (the table keeps no rejection time, and most are rejected at arrival)."""
    t = cl.table
    live = (t.state != State.PENDING) & (t.state != State.REJECTED)
    done = t.state == State.DONE
    times = np.concatenate([t.arrival[live], t.t_done[done]])
    if times.size == 0:
        return 0
    steps = np.concatenate([np.ones(int(live.sum())), -np.ones(int(done.sum()))])
    order = np.lexsort((steps, times))  # at equal times a completion before an arrival
    return int(np.cumsum(steps[order]).max())


def summarize(
    cl: Cluster,
    itl_stats: dict[str, dict[str, float]],
    wall_s: float,
    read_gbps_peak: float = 0.0,
    queues: dict[str, dict[str, float]] | None = None,
    timeseries: pd.DataFrame | Columns | None = None,
) -> dict[str, Any]:
    """The run's summary.json. ``itl_stats`` is :func:`~deepinfer_sim.sim.results.itl.itl_summary`'s
    (``itl_s`` per decode step, ``itl_per_token_s``); ``timeseries`` gives the peak output
    throughput (None without it)."""
    t = cl.table
    sc = cl.sc
    rep = Reports.of(cl)
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
    pcts = latency_percentiles(sc.sim.percentiles)
    slo = sc.slo
    good = done.copy()
    good[done] = ttft <= slo.ttft_s
    tpot_full = np.full(t.n, 0.0)
    tpot_full[has_dec] = tpot
    good &= tpot_full <= slo.tpot_s
    applied_slo = {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}
    if slo.e2e_s is not None:
        good[done] &= e2e <= slo.e2e_s
        applied_slo["e2e_s"] = slo.e2e_s
    n_good = int(good.sum())
    groups = rep.decode
    seq_steps = sum(g["seq_steps"] for g in groups)
    steps = sum(g["steps"] for g in groups)
    verified = sum(g["verify_sum"] for g in groups)
    emitted = sum(g["tokens_out"] for g in groups)
    agg = pools.aggregated if sc.aggregated else None
    # the engines that decode and those that prefill: decode groups and prefill instances, or
    # the aggregated instances both ways
    dp = agg.dp if agg is not None else pools.decode.dp
    ranks = (agg.instances if agg is not None else pools.decode.groups) * dp
    prefill_gpus = agg.gpus if agg is not None else pools.prefill.gpus
    decode_gpus = agg.gpus if agg is not None else pools.decode.gpus
    utilization = {
        "vision": _utilization(rep.vision, window),
        "prefill": _utilization(rep.prefill, window),
        "decode": _utilization(groups, window),
    }
    if agg is not None:  # steps that carried chunks / sequences, and all of them
        utilization["prefill"] = _utilization(groups, window, "prefill_")
        utilization["decode"] = _utilization(groups, window, "decode_")
        utilization["aggregated"] = _utilization(groups, window)
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
            "ttft_s": bench_stats(ttft, pcts),
            "tpot_s": bench_stats(tpot, pcts),
            "itl_s": itl_stats["itl_s"],  # per decode step (vLLM's per-chunk ITL)
            "itl_s_per": "decode step",
            "itl_per_token_s": itl_stats["itl_per_token_s"],
            "e2e_s": bench_stats(e2e, pcts),
        },
        "throughput": {
            "duration_s": makespan,
            "completed": completed,
            "total_input_tokens": int(in_tok),
            "total_output_tokens": int(out_tok),
            "request_per_s": completed / makespan,
            "input_tok_per_s": in_s,
            "output_tok_per_s": out_s,
            "total_tok_per_s": in_s + out_s,
            "output_tok_per_s_per_gpu": out_s / max(1, pools.gpus),
            "input_tok_per_s_per_prefill_gpu": in_s / prefill_gpus,
            "output_tok_per_s_per_decode_gpu": out_s / decode_gpus,
            "peak_output_tok_per_s": _peak_output_tok_per_s(cl, timeseries),
            "peak_window_s": sc.sim.timeseries_interval_s,
            "peak_concurrent_requests": _peak_concurrency(cl),
        },
        "goodput": {
            "slo": applied_slo,  # the SLOs a good request met, all of them
            "requests": n_good,
            "request_per_s": n_good / makespan,
            "fraction_of_completed": n_good / completed if completed else None,
        },
        "utilization": utilization,
        "load": _load(cl, rep, window, queues),
        "decode": {
            "steps": steps,
            "mean_batch_per_rank": seq_steps / (steps * dp) if steps else 0.0,
            "balancer": sc.policies.decode_balancer,
            "speculative": sc.policies.speculative.policy,
            "verify_tokens_per_seq_step": verified / seq_steps if seq_steps else 0.0,
            "accepted_tokens_per_seq_step": emitted / seq_steps if seq_steps else 0.0,
            "tokens_per_s_per_rank": out_s / ranks,
            "kv_policy": agg.kv_policy if agg is not None else pools.decode.kv_policy,
            "preemptions": sum(g["preemptions"] for g in groups),
            "recompute_s": sum(g["recompute_s"] for g in groups),
            "rank_failures": sum(g["rank_failures"] for g in groups),
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
            # P->D transfers that used a backup link: moved there at a cut, or started while
            # their instance's link was cut; store writes moved at a cut are counted apart
            "rerouted": cl.counters.get("rerouted_transfers", 0),
            "rerouted_store_writes": cl.counters.get("rerouted_store_writes", 0),
            "backup_bytes": float(sum(link["bytes"] for link in rep.backup_links)),
        },
        "admission": _admission(cl, rep),
        "offered_load": _offered_load(cl),
        "vision": _vision(cl, rep, window),
        "prefill": _prefill(cl, rep),
        "cache": _cache(cl, rep),
        "storage": _storage(cl, rep, read_gbps_peak),
        "eplb": _eplb(cl, rep),
        "cost": _cost(cl, rep, makespan),
        "sim": {
            "seed": sc.seed,
            "simulated_s": cl.env.now,
            "events": cl.env.events,
            "wall_s": wall_s,
        },
        **_precision(cl),
    }


def _precision(cl: Cluster) -> dict[str, Any]:
    """``precision``: per pool whose model dtypes differ from its profile's, the rule that moved
    the profile's fits (models/precision.py); absent when every pool runs as measured."""
    from ..core.assemble import dtype_rules

    rules = dtype_rules(cl.sc)
    return {"precision": {p: r.as_dict() for p, r in rules.items()}} if rules else {}
