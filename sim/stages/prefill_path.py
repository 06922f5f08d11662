"""The prefill path: everything between a request's arrival (after any vision encoding) and the
hand-off of its finished prompt to the P->D transfer.

    prefix lookup (chained block hashes) -> length tier -> router picks an instance
    -> SWA lookup for the hit prefix (local / remote / miss) -> read the hit KV from the store
       (the 3FS cluster's erasure-coded read, sim/stages/kvstore.py) and load it (and a remote SWA
       slot) over the instance's ingress link -> chunked prefill (prefill.py)
    -> write the new blocks back to the store (over the instance's egress link, shared with
       P->D transfers) and keep the prompt's SWA slot on this machine -> on_prefilled

A prefix hit is whole blocks and always leaves at least one token to compute. On an SWA miss
the last ``bounded_replay_tokens`` of the hit prefix are recomputed through the prefill layers;
every prompt also rebuilds its decoder-layer SWA state, replaying its last 128 tokens (bounded)
or 2,560 (exact) through the decoder layers. Replay never enters the prefix cache.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import simpy

from ...errors import ConfigError
from ...models.attention import AttentionCost
from ...models.cost import StepCost
from ...models.hardware import HardwareSpec
from ...models.spec import ModelSpec
from ...scenario import AggregatedPool, Cache, PrefillPool, Tiers
from ...traces import RequestSource
from ..core.network import Link
from ..core.requests import RequestTable, State
from ..policies.chunking import make_chunk_policy
from ..policies.router import PrefillRouter, Route, make_router
from .expert_parallel import GroupExperts
from .kvstore import KvStore
from .prefill import PrefillEngine, PrefillInstance
from .prefix_cache import PrefixStore
from .swa import SwaDirectory, SwaLookup


def flop_counter(model: ModelSpec) -> Callable[[int, int, bool], float]:
    """FLOPs of n tokens after a prefix p through the prefill layers, or (replay) the decoder."""
    attn = AttentionCost.of(model)
    pre = sum(model.linear_flops_per_token("prefill"))
    rep = sum(model.linear_flops_per_token("replay"))
    pre_attn, rep_attn = attn.prefill_flops, attn.replay_flops

    def flops(n: int, p: int, replay: bool) -> float:
        if replay:
            return n * rep + rep_attn.chunk(n, p)
        return n * pre + pre_attn.chunk(n, p)

    return flops


def instances_per_machine(hw: HardwareSpec, ep: int) -> int:
    """Instances of ``ep`` GPUs one machine of ``hw`` holds (at least one)."""
    return max(1, hw.gpus_per_node // ep)


def check_step_time_budget(
    quad: tuple[float, float, float, float], model: ModelSpec, budget_s: float, key: str
) -> None:
    """A step-time budget must fit one token at the model's whole context (the chunk scheduler
    would otherwise never schedule the last tokens of the longest prompts)."""
    a, b, c, d = quad
    worst = a + b + c * model.max_context_tokens + d
    if worst > budget_s:
        raise ConfigError(
            key,
            f"{budget_s} s cannot fit one token at the model's "
            f"{model.max_context_tokens:,}-token context (needs {worst:.4g} s)",
        )


@dataclass(frozen=True)
class PrefillRouting:
    """``policies``' prefill routing: the router's tag, its length tiers and affinity slack."""

    router: str
    tiers: Tiers
    affinity_slack_s: float


class PrefillPath:
    def __init__(
        self,
        *,
        pool: PrefillPool | AggregatedPool,
        cache: Cache,
        routing: PrefillRouting,
        load_latency_s: float,
        model: ModelSpec,
        hw: HardwareSpec,
        env: simpy.Environment,
        table: RequestTable,
        source: RequestSource,
        cost: StepCost,
        imbalance: float,
        egress: list[Link],
        on_prefilled: Callable[[int, int], None],
        store: PrefixStore | None,
        experts_for: Callable[[int], GroupExperts | None] = lambda i: None,
        engines: Sequence[PrefillEngine] | None = None,
        router: PrefillRouter | None = None,
    ) -> None:
        """``store``: the prefix store (a ``KvStore`` for the 3FS cluster, or the in-memory one;
        None without prefix caching); ``egress``: each instance's P->D link, which its store
        writes share; ``experts_for(i)``: instance i's live expert balance, if any.
        ``engines`` and ``router``: engines built elsewhere (aggregated instances, which call
        :meth:`prompt_done` when a prompt's prefill ends) and how a request is placed on them;
        by default the path builds ``pool``'s prefill instances and ``routing``'s router."""
        self.env, self.table, self.source, self.model = env, table, source, model
        self.block = source.block_tokens
        self.on_prefilled = on_prefilled
        self.egress = egress
        self.kv_per_token = model.kv_bytes_per_token()
        self.slot_bytes = model.swa_slot_bytes
        self.store = store
        self.kv = store if isinstance(store, KvStore) else None  # the 3FS store, if any
        self.enc_replay = model.swa.bounded_replay_tokens if model.replay_only_layers else 0
        swa = model.swa
        dec = swa.exact_replay_tokens if cache.swa.mode == "exact" else swa.bounded_replay_tokens
        self.dec_replay = dec if model.replay_only_layers else 0
        per_machine = instances_per_machine(hw, pool.ep)
        machines = -(-pool.instances // per_machine)
        host = hw.host_memory_bytes_per_gpu * hw.gpus_per_node * cache.swa.host_fraction
        self.swa: SwaDirectory | None = None
        if self.slot_bytes > 0 and model.replay_only_layers:
            self.swa = SwaDirectory(machines, max(1, int(host // self.slot_bytes)))
        load_bw = cache.prefix.load_gbps_per_8_gpus * 1e9 / 8 * pool.ep / 8
        self.vlan_bw = cache.swa.vlan_gbps * 1e9 / 8
        self.ingress = [
            Link(env, f"load{i}", load_bw, load_latency_s) for i in range(pool.instances)
        ]
        self.boundaries = list(routing.tiers.boundaries)
        if engines is not None and router is not None:
            self.instances: Sequence[PrefillEngine] = engines
            self.router: PrefillRouter = router
        else:
            assert isinstance(pool, PrefillPool)
            self._build_instances(
                pool, routing, model, env, table, source, cost, imbalance, per_machine, experts_for
            )
        self.hit_blocks: dict[int, int] = {}
        self.store_writes = 0
        self.read_latencies = array("d")  # storage-side seconds of every hit read
        self.hit_tokens_total = 0
        self.input_tokens_total = 0

    def _build_instances(
        self,
        pool: PrefillPool,
        routing: PrefillRouting,
        model: ModelSpec,
        env: simpy.Environment,
        table: RequestTable,
        source: RequestSource,
        cost: StepCost,
        imbalance: float,
        per_machine: int,
        experts_for: Callable[[int], GroupExperts | None],
    ) -> None:
        """The prefill pool's instances and the router over them (disaggregated serving)."""
        flops = flop_counter(model)
        chunking = make_chunk_policy(pool.scheduler)
        instances = [
            PrefillInstance(
                env=env,
                idx=i,
                machine=i // per_machine,
                cost=cost,
                dp=pool.dp,
                max_tokens_per_step=pool.max_tokens_per_step,
                step_time_budget_s=pool.step_time_budget_s,
                imbalance=imbalance,
                table=table,
                flops=flops,
                on_done=self.prompt_done,
                chunking=chunking,
                experts=experts_for(i),
                traffic_class=source.traffic_class,
            )
            for i in range(pool.instances)
        ]
        check_step_time_budget(
            instances[0].quad, model, pool.step_time_budget_s, "pools.prefill.step_time_budget_s"
        )
        tiers = routing.tiers
        self.instances = instances
        self.router = make_router(
            routing.router,
            env,
            instances,
            len(tiers.boundaries) + 1,
            tiers.round_s,
            routing.affinity_slack_s,
        )

    # ---- arrival side ---------------------------------------------------------------------------
    def admit(self, rid: int) -> None:
        t, src = self.table, self.source
        n_in = int(t.input_len[rid])
        hashes = src.blocks(rid)
        cls = int(src.traffic_class[rid])
        k = self.store.lookup(hashes, self.env.now, cls) if self.store is not None else 0
        k = min(k, (n_in - 1) // self.block)  # leave at least one token to compute
        hit = k * self.block
        key = int(hashes[k - 1]) if k else -1
        holder = self.swa.holder(key) if (self.swa is not None and k) else None
        tier = bisect.bisect_right(self.boundaries, n_in)
        work = self.instances[0].predicted_s(n_in - hit, hit)
        inst = self.router.choose(rid, Route(tier, work, -1 if holder is None else holder))
        instance = self.instances[inst]
        enc = 0
        load = hit * self.kv_per_token
        fetch = 0.0
        if k and self.swa is not None:
            found = self.swa.lookup(key, instance.machine)
            t.swa_lookup[rid] = int(found) + 1
            if found == SwaLookup.MISS:
                enc = min(self.enc_replay, hit)
            elif found == SwaLookup.REMOTE:
                fetch = self.slot_bytes
        t.hit_tokens[rid] = hit
        self.hit_tokens_total += hit
        self.input_tokens_total += n_in
        t.tier[rid] = tier
        t.enc_replay[rid] = enc
        t.dec_replay[rid] = min(self.dec_replay, n_in)
        self.hit_blocks[rid] = k
        start = hit - enc
        t.state[rid] = State.PREFILL  # at its instance, loading its cached prefix first
        if load or fetch:
            # a remote slot comes over the VLAN: charge it at the ingress link's rate ratio
            nbytes = load + fetch * self.ingress[inst].bytes_per_s / self.vlan_bw
            link = self.ingress[inst]

            def transfer(_event: object = None) -> None:
                link.send(
                    rid, nbytes, lambda r: instance.submit(r, start, enc, int(t.dec_replay[r]))
                )

            read_s = self.kv.read(hashes[:k], self.env.now) if self.kv is not None else 0.0
            if read_s > 0:
                self.read_latencies.append(read_s)
                self.env.timeout(read_s).callbacks.append(transfer)
            else:
                transfer()
        else:
            instance.submit(rid, start, enc, int(t.dec_replay[rid]))

    # ---- completion side ------------------------------------------------------------------------
    def prompt_done(self, rid: int, inst: int) -> None:
        """Engine ``inst`` finished ``rid``'s prompt: write its new blocks to the store, keep
        its SWA slot, hand it on."""
        k = self.hit_blocks.pop(rid)
        hashes = self.source.blocks(rid)
        n_in = int(self.table.input_len[rid])
        if self.store is not None and k < hashes.size:
            new = hashes[k:]
            nbytes = (n_in - k * self.block) * self.kv_per_token
            cls = int(self.source.traffic_class[rid])
            store = self.store
            self.store_writes += 1
            self.egress[inst].send(
                2 * rid + 1, nbytes, lambda _f: store.insert(new, self.env.now, cls)
            )
        full = n_in // self.block
        if self.swa is not None and full:
            self.swa.insert(int(hashes[full - 1]), self.instances[inst].machine)
        self.on_prefilled(rid, inst)

    # ---- reports --------------------------------------------------------------------------------
    def report(self, now: float) -> dict[str, Any]:
        """The path's own part of the summary, as of ``now``: each instance's report and its
        experts' (None where the expert imbalance is a constant), the prompt tokens looked up in
        the prefix store and hit there, the blocks it holds, the store writes sent, the
        storage-side seconds of every hit read (the list itself, not a copy: the time series asks
        every sample), and the 3FS store's report (None without one)."""
        return {
            "instances": [inst.report(now) for inst in self.instances],
            "experts": [
                inst.experts.report() if inst.experts is not None else None
                for inst in self.instances
            ],
            "lookup_tokens": self.input_tokens_total,
            "hit_tokens": self.hit_tokens_total,
            "blocks_stored": len(self.store) if self.store is not None else 0,
            "store_writes": self.store_writes,
            "read_latencies": self.read_latencies,
            "storage": self.kv.report() if self.kv is not None else None,
        }

    # ---- invariants -----------------------------------------------------------------------------
    def check(self) -> list[str]:
        """Every replayed and computed token accounted for; SWA slots within host memory."""
        errs = self.swa.check() if self.swa is not None else []
        if self.kv is not None:
            errs.extend(self.kv.check())
        t = self.table
        if any(inst.queued for inst in self.instances) or any(link.active for link in self.ingress):
            return errs  # a run cut by its horizon: prompts are mid-prefill
        done = t.t_prefill_end == t.t_prefill_end  # not NaN
        replay = int((t.enc_replay[done] + t.dec_replay[done]).sum())
        compute = int((t.input_len[done] - t.hit_tokens[done]).sum())
        stats = [inst.stats for inst in self.instances]
        if sum(s.replay_tokens for s in stats) != replay:
            errs.append("replayed tokens do not add up to the requests' replay")
        if sum(s.compute_tokens for s in stats) != compute:
            errs.append("computed prefill tokens do not add up to prompts minus hits")
        return errs
