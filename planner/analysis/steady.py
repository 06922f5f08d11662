"""Steady-state operating points of one pool, straight from its StepCost: no simulation.

A decode point puts the same load on every rank of one Wide-EP group — ``batch_per_gpu``
sequences at ``context`` tokens, each computing ``verify`` tokens and emitting ``accept`` tokens a
step — and asks the pool's StepCost for the step time and where it goes
(:meth:`StepCost.decode_breakdown`). A prefill point fills every DP rank of one prefill instance
with ``tokens_per_gpu`` new tokens as whole prompts with no cached prefix
(:meth:`StepCost.prefill_breakdown`), its steps back to back: its compute at the hardware's
sustained clock (``StepCost.sustained_slowdown``, models/power_limit.py). Both are a handful of
closed-form evaluations, so a curve of them (``deepinfer-sim cost``,
:func:`decode_at_user_speed`'s bisection) costs milliseconds.

What the point leaves out, against a cluster run: queueing, ragged batches and contexts, the
scheduler's choices (dspark's per-sequence verify lengths), and EPLB's rebalancing — under
``policies.eplb.imbalance: live`` with the pool's experts where EP puts them (policy ``static``)
a point is costed with the expert-load model's mean imbalance at its load
(:func:`.eplb_analysis.static_imbalance`, a thousand steps drawn, ~0.1 s, remembered); otherwise,
EPLB included, with the scenario's constant ``policies.expert_imbalance`` for the pool.

Default speculative numbers follow the simulator (``sim/policies/speculative.py``, whose verify
policy gives v and the per-step overhead): a sequence computes 1 + v tokens a step (v drafts
verified, the policy's ``depth``: 0 for ``none``, 1 for ``mtp1``, ``fixed_k`` for
``fixed``, the draft count for ``dspark``; v never exceeds the scenario's and the model's draft
limit) and emits 1 + the drafts accepted before the first rejection. With easiness
α ~ Beta(m·κ, (1 − m)·κ) and draft j accepted with probability α·decay^(j−1) given the earlier
ones were, draft j survives with probability α^j·decay^(j(j−1)/2), so

    E[emitted] = 1 + Σ_{j=1..v} E[α^j]·decay^(j(j−1)/2),   E[α^j] = Π_{r<j} (m·κ + r) / (κ + r)

— exact, no sampling. A fractional v (a mix of ⌊v⌋ and ⌈v⌉ drafts) interpolates the last term.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import numpy as np

from ...errors import UserError
from ...models.cost import Chunk, StepBreakdown, StepCost
from ...models.draft import DraftCost
from ...models.hardware import HardwareSpec
from ...models.registry import load_hardware, load_model
from ...models.spec import ModelSpec
from ...scenario import Acceptance, AggregatedPool, DecodePool, PrefillPool, Scenario
from ...sim.core.assemble import (
    check_prefill_fits,
    make_step_cost,
    pool_config,
    rank_kv_capacity_tokens,
)
from ...sim.policies.speculative import offline_policy

__all__ = [
    "SteadyPoint",
    "chunked_prompt_point",
    "decode_at_user_speed",
    "decode_curve",
    "decode_point",
    "default_accept",
    "default_verify",
    "expected_accepted",
    "prefill_point",
]

PoolName = Literal["prefill", "decode"]


@dataclass(frozen=True)
class SteadyPoint:
    """One pool at one steady load. Throughputs are in output tokens (decode) or prompt tokens
    computed (prefill). ``breakdown`` maps each component to seconds (``StepBreakdown.as_dict``,
    plus ``speculative`` for decode); every component but ``a2a_hidden`` (all-to-all hidden
    behind compute) adds up to ``step_s``. Fields of the other pool's inputs are None (and left
    out of :meth:`as_dict`)."""

    pool: PoolName
    cost_model: str  # "roofline" or the calibration profile's name
    hardware: str
    ep: int  # GPUs of the instance / group
    gpus_per_node: int
    step_s: float
    breakdown: dict[str, float]
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    tokens_per_s_per_node: float
    imbalance: float  # the constant expert-imbalance factor the step was costed with
    # decode inputs
    batch_per_gpu: float | None = None
    context: int | None = None
    verify: float | None = None  # tokens computed per sequence-step (1 + drafts verified)
    accept: float | None = None  # tokens emitted per sequence-step
    kv_tokens_per_gpu: float | None = None  # KV (plus SWA slots, in KV-token units) held
    kv_capacity_tokens_per_gpu: float | None = None  # what a decode rank can hold
    # prefill inputs
    tokens_per_gpu: int | None = None
    prompt: int | None = None  # new tokens per prompt
    prefix: int | None = None  # cached tokens before each prompt's new ones
    # decode_at_user_speed only
    user_tok_s: float | None = None  # the speed asked for
    meets_speed: bool | None = None
    # what stopped the batch from growing: "speed" (a larger one is slower than asked), "kv"
    # (the rank's KV capacity), "max_seqs_per_rank" or "max_batch" (the search's own cap)
    batch_limit: str | None = None
    tp: int = 1  # a data-parallel rank's GPUs (its sequences: batch_per_gpu × tp)

    @property
    def kv_fits(self) -> bool | None:
        if self.kv_tokens_per_gpu is None or self.kv_capacity_tokens_per_gpu is None:
            return None
        return self.kv_tokens_per_gpu <= self.kv_capacity_tokens_per_gpu

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None}
        if self.kv_fits is not None:
            out["kv_fits"] = self.kv_fits
        return out


# ---- the pool's cost model -----------------------------------------------------------------


def _redundant(cfg: PrefillPool | DecodePool | AggregatedPool) -> float:
    """Redundant experts per GPU the pool's StepCost is built for (the one place that reads it)."""
    return cfg.redundant_per_gpu


def _pool_cost(sc: Scenario, pool: PoolName) -> tuple[StepCost, ModelSpec, HardwareSpec, str]:
    """(StepCost, model, hardware, cost-model name) of the pool that runs ``pool``'s steps,
    built as a cluster run does."""
    name = sc.serving_pool(pool)
    cfg = pool_config(sc, name)
    model = load_model(sc.model)
    hw = load_hardware(cfg.hardware)
    cost = make_step_cost(sc, name, model, hw, cfg.ep, _redundant(cfg))
    ref = sc.cost_model.for_pool(name)
    if ref != "roofline":
        from ...models.profile import load_profile

        ref = load_profile(ref).name
    return cost, model, hw, ref


def _pool_imbalance(
    sc: Scenario,
    pool: PoolName,
    cost: StepCost,
    hw: HardwareSpec,
    load: tuple[float, float],
    step_at: Callable[[float], float],
) -> float:
    """The expert imbalance a point of ``pool`` is costed with, its group routing ``load`` =
    (requests, tokens each) a step (``step_at``: the point's step time at an imbalance): the
    load model's mean where the imbalance is live and the experts stay where EP puts them (a
    static placement has no rebalances to wait out, so a steady point can draw it); else the
    scenario's constant (one expert group has none: the cost model takes it as 1)."""
    constant: float = getattr(sc.policies.expert_imbalance, pool)
    eplb = sc.policies.eplb
    groups = cost.shape.expert_groups
    if eplb.imbalance != "live" or eplb.for_pool(pool).policy != "static" or groups == 1:
        return constant
    from .eplb_analysis import static_imbalance  # it imports the offline analyses

    redundant = int(cost.shape.redundant_experts_per_gpu)
    return static_imbalance(sc, pool, hw.name, groups, redundant, *load, step_at(constant))


# ---- speculative defaults --------------------------------------------------------------------


def default_verify(sc: Scenario, model: ModelSpec | None = None) -> float:
    """Tokens a sequence computes per step under the scenario's speculative policy: 1 + the
    most drafts it verifies (its ``depth``): 1 for ``none``, 2 for ``mtp1``, 1 + ``fixed_k`` for
    ``fixed`` and 1 + the draft count for ``dspark`` (both capped at the draft limit). dspark's
    mean verify length depends on its confidence cut-off at run time and is not known offline;
    the full draft length is its upper bound."""
    return 1.0 + offline_policy(sc.policies.speculative, model or load_model(sc.model)).depth


def expected_accepted(acc: Acceptance, drafts: float) -> float:
    """Expected tokens one sequence emits per step when it verifies ``drafts`` draft tokens
    (the bonus token plus the leading accepted drafts), exactly, under the acceptance model."""
    a = acc.mean * acc.concentration
    total = 1.0
    moment = 1.0  # E[α^j]
    for j in range(1, math.ceil(drafts) + 1):
        moment *= (a + j - 1) / (acc.concentration + j - 1)
        survive = moment * acc.position_decay ** (j * (j - 1) / 2)
        total += survive * min(1.0, drafts - (j - 1))
    return total


def default_accept(sc: Scenario, verify: float) -> float:
    """Expected tokens emitted per sequence-step at ``verify`` tokens computed (1 when nothing
    is verified, e.g. under ``none``), under the acceptance model of the workload's
    ``traffic_class`` override, else of the ``default`` class."""
    spec = sc.policies.speculative
    return expected_accepted(spec.for_class(sc.workload.traffic_class or "default"), verify - 1)


# ---- operating points ----------------------------------------------------------------------


def _positive(name: str, value: float) -> None:
    if not value > 0 or not math.isfinite(value):
        raise UserError(f"{name} must be a positive number, got {value}")


def _decode(
    sc: Scenario,
    parts: tuple[StepCost, ModelSpec, HardwareSpec, str],
    batch: float,
    context: int,
    verify: float,
    accept: float,
) -> SteadyPoint:
    cost, model, hw, name = parts
    ep, dp, tp = cost.shape.ep, cost.shape.dp, cost.shape.tp
    per_rank = float(batch) * tp  # a tensor-parallel rank's GPUs share its sequences
    batches, kv = np.full(dp, per_rank), np.full(dp, per_rank * context)
    imbalance = _pool_imbalance(
        sc,
        "decode",
        cost,
        hw,
        (per_rank * dp, verify),
        lambda imb: cost.decode_breakdown(batches, kv, verify, imb).step_s,
    )
    bd: StepBreakdown = cost.decode_breakdown(batches, kv, verify, imbalance)
    breakdown = bd.as_dict()
    # the simulator adds the policy's overhead (dspark's confidence head and scheduling time)
    # and the drafter's passes to every decode step
    policy = offline_policy(sc.policies.speculative, model)
    breakdown["speculative"] = policy.overhead_s
    draft = DraftCost.of(model, policy.depth) if policy.speculates else None
    breakdown["draft"] = draft.step_s(cost, batches, kv, imbalance) if draft else 0.0
    step = bd.step_s + breakdown["speculative"] + breakdown["draft"]
    seq_overhead = model.swa_slot_bytes / model.kv_hbm_bytes_per_token()
    return SteadyPoint(
        pool="decode",
        cost_model=name,
        hardware=hw.name,
        ep=ep,
        gpus_per_node=hw.gpus_per_node,
        step_s=step,
        breakdown=breakdown,
        imbalance=imbalance,
        batch_per_gpu=float(batch),
        context=context,
        verify=verify,
        accept=accept,
        kv_tokens_per_gpu=per_rank * (context + seq_overhead),  # each GPU: its rank's cache
        kv_capacity_tokens_per_gpu=_decode_rank(sc, model, hw)[0],
        tokens_per_s_per_gpu=batch * accept / step,
        tokens_per_s_per_user=accept / step,
        tokens_per_s_per_node=batch * accept / step * hw.gpus_per_node,
        tp=tp,
    )


def _decode_inputs(
    sc: Scenario, model: ModelSpec, context: int, verify: float | None, accept: float | None
) -> tuple[float, float]:
    if context < 0:
        raise UserError(f"context must be ≥ 0 tokens, got {context}")
    v = default_verify(sc, model) if verify is None else float(verify)
    if not v >= 1 or not math.isfinite(v):
        raise UserError(f"verify must be ≥ 1 token per sequence-step, got {verify}")
    a = default_accept(sc, v) if accept is None else float(accept)
    if not 1 <= a <= v:
        raise UserError(
            f"accept must lie between 1 and verify ({v:g}) tokens per sequence-step, got {a:g}"
        )
    return v, a


def decode_point(
    sc: Scenario,
    batch_per_gpu: float,
    context: int,
    verify: float | None = None,
    accept: float | None = None,
) -> SteadyPoint:
    """Every rank of the scenario's decode group holds ``batch_per_gpu`` sequences of ``context``
    tokens per GPU (a tensor-parallel rank of tp GPUs: batch_per_gpu × tp, so with tp > 1 it may
    be a fraction); each computes ``verify`` tokens and emits ``accept`` tokens per step
    (defaults: :func:`default_verify`, :func:`default_accept`). Per-GPU throughput =
    batch·accept / step, per user = accept / step. dspark's per-step overhead is part of the
    step (``speculative``)."""
    _positive("batch_per_gpu", batch_per_gpu)
    parts = _pool_cost(sc, "decode")
    v, a = _decode_inputs(sc, parts[1], context, verify, accept)
    return _decode(sc, parts, batch_per_gpu, context, v, a)


def _decode_rank(sc: Scenario, model: ModelSpec, hw: HardwareSpec) -> tuple[float, int]:
    """(KV tokens, most sequences) one rank that decodes can hold: a decode group's rank, or an
    aggregated instance's under aggregated serving."""
    name = sc.serving_pool("decode")
    cfg = sc.pools.aggregated if name == "aggregated" else sc.pools.decode
    assert cfg is not None  # the scenario fills in the aggregated pool's defaults
    return rank_kv_capacity_tokens(cfg, f"pools.{name}", model, hw), cfg.max_seqs_per_rank


def _check_prefill_fits(sc: Scenario, model: ModelSpec, hw: HardwareSpec) -> None:
    """The weights of the pool that prefills fit its GPUs (an aggregated instance's: with room
    for KV), else one ConfigError naming the pool."""
    if sc.aggregated:
        _decode_rank(sc, model, hw)
    else:
        check_prefill_fits(sc, model, hw)


def _rank_capacity(
    sc: Scenario, parts: tuple[StepCost, ModelSpec, HardwareSpec, str], context: int
) -> tuple[int, str]:
    """The most sequences of ``context`` tokens one decode rank holds and the bound that sets it:
    ``"kv"`` (its KV capacity) or ``"max_seqs_per_rank"``. Refused when not one fits."""
    _, model, hw, _ = parts
    seq_overhead = model.swa_slot_bytes / model.kv_hbm_bytes_per_token()
    capacity, cap = _decode_rank(sc, model, hw)
    by_kv = int(capacity // (context + seq_overhead))
    if by_kv < 1:
        raise UserError(
            f"not one sequence of {context:,} tokens fits a decode rank's KV capacity "
            f"({capacity:,.0f} tokens)"
        )
    return (by_kv, "kv") if by_kv < cap else (cap, "max_seqs_per_rank")


def decode_at_user_speed(
    sc: Scenario,
    context: int,
    user_tok_s: float,
    verify: float | None = None,
    accept: float | None = None,
    max_batch: int = 1024,
) -> SteadyPoint:
    """The largest whole batch per rank at which each user still gets ``user_tok_s`` tokens per
    second, by bisection (per-user speed falls as the batch grows), never beyond what a rank
    holds: its KV capacity at ``context`` tokens, ``max_seqs_per_rank``, and ``max_batch`` per
    GPU (a tensor-parallel rank of tp GPUs: tp·max_batch). ``batch_limit`` names the bound that
    stopped it. If even one sequence per rank is slower, that point comes back with
    ``meets_speed=False``."""
    _positive("user_tok_s", user_tok_s)
    if max_batch < 1:
        raise UserError(f"max_batch must be ≥ 1, got {max_batch}")
    parts = _pool_cost(sc, "decode")
    v, a = _decode_inputs(sc, parts[1], context, verify, accept)
    tp = parts[0].shape.tp
    rank_top, rank_limit = _rank_capacity(sc, parts, context)
    top, limit = (
        (rank_top, rank_limit) if rank_top <= max_batch * tp else (max_batch * tp, "max_batch")
    )

    def at(per_rank: int) -> SteadyPoint:
        return _decode(sc, parts, per_rank / tp, context, v, a)

    lo = at(1)
    if lo.tokens_per_s_per_user < user_tok_s:
        best, meets, limit = lo, False, "speed"
    else:
        best, meets = lo, True
        hi = at(top)
        if hi.tokens_per_s_per_user >= user_tok_s:
            best = hi
        else:  # invariant: batch lo_b meets the speed, hi_b does not
            limit = "speed"
            lo_b, hi_b = 1, top
            while hi_b - lo_b > 1:
                mid = (lo_b + hi_b) // 2
                p = at(mid)
                if p.tokens_per_s_per_user >= user_tok_s:
                    lo_b, best = mid, p
                else:
                    hi_b = mid
    return replace(best, user_tok_s=float(user_tok_s), meets_speed=meets, batch_limit=limit)


def prefill_chunks(tokens_per_gpu: int, prompt: int, cached: int = 0) -> list[Chunk]:
    """One rank's chunks: whole prompts of ``prompt`` new tokens, each after ``cached`` prefix
    tokens found in the cache; when ``tokens_per_gpu`` is not a multiple of ``prompt``, the
    last is a partial prompt (after the same prefix)."""
    whole, rest = divmod(tokens_per_gpu, prompt)
    return [(prompt, cached)] * whole + ([(rest, cached)] if rest else [])


def prefill_point(sc: Scenario, tokens_per_gpu: int, prompt: int, cached: int = 0) -> SteadyPoint:
    """Every DP rank of one prefill instance computes ``tokens_per_gpu`` new tokens per GPU per
    step (a tensor-parallel rank of tp GPUs: tp times as many) as whole prompts of ``prompt``
    new tokens, each after ``cached`` tokens of cached prefix (0: no cache hit; the remainder,
    if any, as one partial prompt). Per-GPU throughput = tokens_per_gpu / step (computed
    tokens); per user = prompt / step, the rate at which one prompt is computed (it finishes
    within the step)."""
    if tokens_per_gpu < 1:
        raise UserError(f"tokens_per_gpu must be ≥ 1, got {tokens_per_gpu}")
    if prompt < 1:
        raise UserError(f"prompt must be ≥ 1 token, got {prompt}")
    cost, model, hw, name = _pool_cost(sc, "prefill")
    dp, tp = cost.shape.dp, cost.shape.tp
    per_rank = tokens_per_gpu * tp
    if prompt > per_rank:
        raise UserError(
            f"prompt ({prompt:,} tokens) must not exceed a rank's tokens per step "
            f"({per_rank:,}: tokens_per_gpu × tp): a prefill point computes whole prompts in "
            "one step"
        )
    _check_prefill_fits(sc, model, hw)
    chunks = prefill_chunks(per_rank, prompt, cached)

    def step_at(imb: float) -> float:
        return cost.prefill_breakdown([chunks] * dp, imb, cost.sustained_slowdown).step_s

    load = (len(chunks) * dp, per_rank / len(chunks))
    imbalance = _pool_imbalance(sc, "prefill", cost, hw, load, step_at)
    bd = cost.prefill_breakdown([chunks] * dp, imbalance, cost.sustained_slowdown)
    rate = tokens_per_gpu / bd.step_s
    return _prefill_steady(
        (cost, model, hw, name), imbalance, bd, bd.step_s, tokens_per_gpu, rate, prompt, cached
    )


def _prefill_steady(
    parts: tuple[StepCost, ModelSpec, HardwareSpec, str],
    imbalance: float,
    bd: StepBreakdown,
    prompt_s: float,
    tokens_per_gpu: int,
    rate_per_gpu: float,
    prompt: int,
    prefix: int,
) -> SteadyPoint:
    """A prefill point: ``bd`` the step shown, a prompt computed in ``prompt_s``, prompt tokens
    at ``rate_per_gpu`` per second per GPU (``tokens_per_gpu`` per step)."""
    cost, _, hw, name = parts
    return SteadyPoint(
        pool="prefill",
        cost_model=name,
        hardware=hw.name,
        ep=cost.shape.ep,
        gpus_per_node=hw.gpus_per_node,
        step_s=bd.step_s,
        breakdown=bd.as_dict(),
        imbalance=imbalance,
        tokens_per_gpu=tokens_per_gpu,
        prompt=prompt,
        prefix=prefix,
        tokens_per_s_per_gpu=rate_per_gpu,
        tokens_per_s_per_user=prompt / prompt_s,
        tokens_per_s_per_node=rate_per_gpu * hw.gpus_per_node,
        tp=cost.shape.tp,
    )


def chunked_prompt_point(sc: Scenario, prompt: int, chunk: int) -> SteadyPoint:
    """Every DP rank of one prefill instance computes one ``prompt``-token prompt in chunks of
    at most ``chunk`` tokens, each after the ones before it as its prefix (chunked prefill of a
    long prompt, as engines do under a per-step token budget). Throughput = the prompts' tokens
    over the sum of the steps; ``step_s`` and ``breakdown`` are the last (longest) step's."""
    if prompt < 1 or chunk < 1:
        raise UserError(f"prompt and chunk must be ≥ 1 token, got {prompt} and {chunk}")
    cost, model, hw, name = _pool_cost(sc, "prefill")
    _check_prefill_fits(sc, model, hw)
    ep, dp, tp = cost.shape.ep, cost.shape.dp, cost.shape.tp
    first = min(chunk, prompt)
    imbalance = _pool_imbalance(
        sc,
        "prefill",
        cost,
        hw,
        (dp, first),
        lambda imb: cost.prefill_breakdown([[(first, 0)]] * dp, imb).step_s,
    )
    total, done, steps = 0.0, 0, 0
    bd: StepBreakdown | None = None
    while done < prompt:
        n = min(chunk, prompt - done)
        bd = cost.prefill_breakdown([[(n, done)]] * dp, imbalance, cost.sustained_slowdown)
        total += bd.step_s
        done += n
        steps += 1
    assert bd is not None
    rate = dp * prompt / total / ep
    # the breakdown shown is the last (longest) step's; step_s, as every prefill point's, is
    # the step shown
    return _prefill_steady(
        (cost, model, hw, name), imbalance, bd, total, max(1, chunk // tp), rate, prompt, 0
    )


def decode_curve(
    sc: Scenario, context: int, verify: float | None = None, accept: float | None = None
) -> list[SteadyPoint]:
    """The throughput/interactivity curve of the decode pool: one steady point per batch, from
    one sequence per data-parallel rank (the fastest a user is served) up to the most a rank
    holds — ``max_seqs_per_rank`` or, first, its KV capacity at ``context`` tokens — in steps of
    about 2^(1/2). Each point has its throughput per GPU and per user."""
    parts = _pool_cost(sc, "decode")
    v, a = _decode_inputs(sc, parts[1], context, verify, accept)
    tp = parts[0].shape.tp
    top, _ = _rank_capacity(sc, parts, context)
    sizes: list[int] = []
    k = 1.0
    while int(k) <= top:
        if not sizes or int(k) != sizes[-1]:
            sizes.append(int(k))
        k *= math.sqrt(2.0)
    if sizes[-1] != top:
        sizes.append(top)
    return [_decode(sc, parts, n / tp, context, v, a) for n in sizes]
