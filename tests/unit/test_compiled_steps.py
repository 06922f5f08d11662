"""The compiled step functions give the same bits as their numpy references (DESIGN.md: a
compiled step keeps its plain-numpy version as the readable, tested reference).

Each pair is fed the same random inputs over the shapes the simulator meets (one or several
traffic classes, layer sets, ranks, draft depths, holes, lagged confidences) and compared with
``==``, not a tolerance: the goldens hold bit for bit only if these do. The last test runs a
whole small scenario both ways (``DEEPINFER_JIT=0`` in a child process) and compares every
request's numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from deepinfer_sim import fpmath, jit, load_scenario
from deepinfer_sim.models.profile_cost import ProfileStepCost
from deepinfer_sim.models.registry import load_hardware, load_model
from deepinfer_sim.rng import bit_source, normal
from deepinfer_sim.scenario import StoragePool
from deepinfer_sim.sim.core.assemble import make_step_cost
from deepinfer_sim.sim.policies.speculative import (
    DraftChain,
    accept_compiled,
    accept_drawn,
    best_threshold,
    best_threshold_compiled,
    chain_slot,
    chain_slot_compiled,
    count_at_least_compiled,
    survival_compiled,
    survival_drawn,
    survival_of,
)
from deepinfer_sim.sim.stages.decode import (
    advance,
    advance_compiled,
    routed_tokens,
    routed_tokens_compiled,
    slot_tokens,
    slot_tokens_compiled,
)
from deepinfer_sim.sim.stages.expert_load import (
    SlotWeights,
    popularity,
    popularity_compiled,
    slot_moments_compiled,
    slot_moments_reference,
)
from deepinfer_sim.sim.stages.expert_parallel import (
    imbalance_factor,
    imbalance_factor_compiled,
    imbalance_factor_drawn,
)
from deepinfer_sim.sim.stages.kvstore import KvStore
from deepinfer_sim.sim.stages.storage_nodes import StorageNodes

SIZES = [*range(0, 300), 511, 512, 513, 1000, 2560, 4096, 8192, 8193, 10_000, 40_000]


def test_pairwise_sum_is_numpys_sum_bit_for_bit() -> None:
    """Over the whole array (numpy 2) or per 8,192-element buffer (numpy 1.x): sum_block finds
    which, and the floor test runs this at numpy 1.26."""
    block = jit.sum_block()
    assert jit._numpy_sum_block() in (0, np.getbufsize())  # one of the two orders reproduces it
    rng = np.random.default_rng(1)
    for n in SIZES:
        a = rng.standard_normal(n) * 10.0 ** rng.uniform(-5, 5, n)
        assert jit.pairwise_sum(a, block) == a.sum(), n
    for shape in [(40, 64), (61, 8), (3, 5), (40, 256), (61, 256), (5, 3840)]:
        a = rng.standard_normal(shape) * 1e3
        assert jit.pairwise_sum(a, block) == a.sum(), shape
        assert jit.pairwise_sum(a.max(axis=1), block) == a.max(axis=1).sum(), shape


def test_pairwise_sum_sees_the_order() -> None:
    """A plain left-to-right loop would not pass the test above: the order is numpy's."""
    a = np.random.default_rng(2).standard_normal(1000) * 1e6
    plain = 0.0
    for x in a.tolist():
        plain += x
    assert plain != a.sum()


def test_exp_is_fpmaths_exp_bit_for_bit() -> None:
    """Every bit, sign of zero included: the common range, where the result is a power-of-two
    table's product, and beyond it (subnormal results, underflow to 0, overflow to inf), where
    it is ``ldexp``'s."""
    rng = np.random.default_rng(3)
    edges = [0.0, -0.0, 1e-300, -745.0, -745.2, -744.4, -708.4, 709.78, 709.79, 1100.0, -1100.0]
    edges += [1e4, -1e4, np.inf, -np.inf]
    for k in (-1001, -1000, 999, 1000, 1001):  # where the table ends (k = round(x / ln 2))
        edges += list(k * np.log(2.0) + np.array([-0.5, -0.4999, 0.4999, 0.5]))
    x = np.concatenate([rng.uniform(-60, 60, 20_000), rng.uniform(-800, 800, 20_000), edges])
    want = fpmath.exp(x)
    got = np.array([jit.exp(float(v)) for v in x])
    assert np.array_equal(got.view(np.int64), want.view(np.int64))
    assert np.isnan(jit.exp(float("nan")))


def test_imbalance_factor_compiled_is_the_reference() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        classes, layers = int(rng.integers(1, 4)), int(rng.integers(1, 62))
        ranks, sets = int(rng.choice([2, 8, 16, 64, 72, 256])), int(rng.integers(1, 3))
        share = rng.dirichlet(np.ones(ranks), size=(classes, layers))
        q2 = share * rng.uniform(0.5, 1.0, share.shape)
        bias = rng.uniform(0.0, 1e-3, share.shape)
        tokens = rng.uniform(0, 5000, (classes, sets))
        tokens[rng.random(tokens.shape) < 0.1] = 0.0
        sq = tokens * rng.uniform(1, 300, tokens.shape)
        layer_set = rng.integers(0, sets, layers)
        k, z = int(rng.integers(1, 9)), rng.standard_normal((layers, ranks))
        args = (share, q2, bias, tokens, sq, layer_set, k, z)
        block = jit.sum_block()
        assert imbalance_factor_compiled(*args, block) == imbalance_factor(*args)
        seed = int(rng.integers(1 << 30))
        drawn = np.random.default_rng(seed)
        got = imbalance_factor_drawn(bit_source(drawn), np.empty_like(z), block, *args[:-1])
        assert got == imbalance_factor(*args[:-1], _reference_normal(seed, z.shape))


def _reference_normal(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Normal draws of a new generator of ``seed``, the numpy way (the reference path)."""
    on = jit.COMPILED.on
    jit.COMPILED.on = False
    try:
        return normal(np.random.default_rng(seed), shape)
    finally:
        jit.COMPILED.on = on


def _draft_inputs(rng: np.random.Generator) -> tuple:
    depth, cap = int(rng.integers(1, 8)), int(rng.integers(1, 400))
    hw = int(rng.integers(1, cap + 1))
    logit = rng.normal(0.0, 3.0, (depth, cap))[:, :hw]
    noise = rng.standard_normal((depth, hw))
    live = rng.random(hw) < 0.8
    hist = rng.random((2, depth, cap))
    valid = rng.random((2, cap)) < 0.5
    return depth, cap, hw, logit, noise, live, hist, valid


def test_survival_compiled_is_the_reference() -> None:
    rng = np.random.default_rng(4)
    for trial in range(200):
        _, _, hw, logit, noise, live, hist, valid = _draft_inputs(rng)
        lagged = trial % 2 == 0
        h1, v1, h2, v2 = hist.copy(), valid.copy(), hist.copy(), valid.copy()
        want = survival_of(noise.copy(), 0.7, logit, lagged, h1[1, :, :hw], v1[1, :hw], live)
        got = survival_compiled(noise.copy(), 0.7, logit, lagged, h2[1, :, :hw], v2[1, :hw], live)
        assert np.array_equal(got, want)
        assert np.array_equal(h1, h2) and np.array_equal(v1, v2)  # the lag ring too
        seed = int(rng.integers(1 << 30))
        want = survival_of(
            _reference_normal(seed, noise.shape),
            0.7,
            logit,
            lagged,
            h1[0, :, :hw],
            v1[0, :hw],
            live,
        )
        drawn = np.random.default_rng(seed)  # alive while its addresses are used
        args = (0.7, logit, lagged, h2[0, :, :hw], v2[0, :hw], live)
        got = survival_drawn(bit_source(drawn), np.empty_like(noise), *args)
        assert np.array_equal(got, want)
        assert np.array_equal(h1, h2) and np.array_equal(v1, v2)


def test_accept_compiled_is_the_chains_accept_capped() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        depth, cap, hw, _, _, live, _, _ = _draft_inputs(rng)
        chain = DraftChain(classes=[], depth=depth, capacity=cap, rng=np.random.default_rng(9))
        chain.survival[:] = np.cumprod(rng.random((depth, cap)), axis=0)
        v = rng.integers(0, depth + 1, cap)
        left = rng.integers(-2, 6, hw)
        want = np.minimum(chain.accept(live, v[:hw]), np.maximum(left, 0))
        u = np.random.default_rng(9).random(hw)  # the uniforms chain.accept drew
        assert np.array_equal(accept_compiled(chain.survival, u, live, v, left), want)
        drawn = np.random.default_rng(9)
        got = accept_drawn(bit_source(drawn), chain.survival, live, v, left, hw)
        assert np.array_equal(got, want)
        assert drawn.random() == chain.rng.random()  # the same uniforms taken


def test_advance_compiled_is_the_reference() -> None:
    rng = np.random.default_rng(6)
    for _ in range(200):
        ranks, hw = int(rng.integers(1, 72)), int(rng.integers(0, 500))
        emitted = rng.integers(0, 6, hw)
        rank = rng.integers(0, ranks, hw)
        ctx, left = rng.integers(0, 10_000, hw), rng.integers(0, 500, hw)
        kv = rng.uniform(0, 1e6, ranks)
        state = [emitted, rank, ctx, left, kv, np.zeros(ranks)]
        ref = [a.copy() for a in state]
        assert advance_compiled(*state) == advance(*ref)
        for a, b in zip(state, ref, strict=True):
            assert np.array_equal(a, b)


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # V4.1-Flash: two attention kinds, GEMM staircases
        ["model=deepseek-v3", "pools.decode.tp=8", "pools.decode.ep=8"],  # tiled verify, linear
        ["model=deepseek-v3", "pools.decode.tp=4", "pools.decode.ep=16"],
        ["model=deepseek-v3", "pools.decode.tp=8", "pools.decode.ep=8", "pools.decode.moe_tp=8"],
        ["pools.decode.two_batch_overlap=true"],
    ],
)
def test_profile_costs_compiled_are_the_reference(overrides: list[str], monkeypatch) -> None:
    """The profile cost model's compiled slowest-rank time against its numpy decode_dense,
    over ranks with empty slots, verify lengths and the fits' GEMM staircases; its compiled
    routed-expert time against the Python one; and its compiled decode step against
    StepCost's (exchange hidden in part, replicated tokens, tensor parallelism, two-batch
    overlap, idle groups)."""
    sc = load_scenario("default", overrides)
    model, hw = load_model(sc.model), load_hardware(sc.hardware_kinds()["decode"])
    pool = sc.pools.decode
    cost = make_step_cost(sc, "decode", model, hw, pool.ep, pool.redundant_per_gpu)
    assert isinstance(cost, ProfileStepCost)
    rng = np.random.default_rng(7)
    for _ in range(300):
        batch = rng.integers(0, 200, pool.ep).astype(float)
        batch[rng.random(pool.ep) < 0.2] = 0.0
        tokens = batch * rng.choice([1.0, 2.0, 3.4, 6.0], pool.ep)
        kv = batch * rng.uniform(0, 20_000, pool.ep)
        moe_tokens = float(rng.choice([0.5, 3.0, 117.0, 4096.0, 70_000.0]) * rng.random())
        load = np.stack([batch, kv, tokens, tokens * kv / np.maximum(batch, 1.0)])
        if rng.random() < 0.05:
            load[:] = 0.0  # a group with nothing to run
        imbalance = float(rng.choice([1.0, 1.09, 3.2]))
        compiled = (
            cost.decode_dense_max(batch, kv, tokens),
            [cost.moe_s(moe_tokens, phase) for phase in ("prefill", "decode")],
            cost.decode_step_packed(load, imbalance),
        )
        monkeypatch.setattr("deepinfer_sim.models.profile_cost.COMPILED", False)
        reference = (
            cost.decode_dense_max(batch, kv, tokens),
            [cost.moe_s(moe_tokens, phase) for phase in ("prefill", "decode")],
            cost.decode_step_packed(load, imbalance),
        )
        monkeypatch.setattr("deepinfer_sim.models.profile_cost.COMPILED", True)
        assert compiled == reference


RUN = """
import hashlib, json, sys
from deepinfer_sim import load_scenario, simulate
from deepinfer_sim.jit import COMPILED
r = simulate(load_scenario("default", ["workload.max_requests=300"]))
cols = ["ttft_s", "tpot_s", "e2e_s", "output_tokens"]
digest = hashlib.sha256(r.requests[cols].to_numpy(dtype=float).tobytes()).hexdigest()
events = r.summary["sim"]["events"]
print(json.dumps({"compiled": bool(COMPILED), "digest": digest, "events": events}))
"""


def test_a_run_is_the_same_compiled_or_not() -> None:
    out = {}
    for flag in ("1", "0"):
        env = {**os.environ, "DEEPINFER_JIT": flag}
        done = subprocess.run(
            [sys.executable, "-c", RUN], env=env, capture_output=True, text=True, check=True
        )
        row = json.loads(done.stdout.strip().splitlines()[-1])
        assert row["compiled"] == (flag == "1")
        out[flag] = row
    assert out["1"]["digest"] == out["0"]["digest"]
    assert out["1"]["events"] == out["0"]["events"]


def test_slot_tokens_compiled_is_the_reference() -> None:
    rng = np.random.default_rng(8)
    for _ in range(200):
        ranks, hw = int(rng.integers(1, 72)), int(rng.integers(0, 500))
        v, live = rng.integers(0, 6, hw), rng.random(hw) < 0.85
        rank, ctx = rng.integers(0, ranks, hw), rng.integers(0, 100_000, hw)
        want = [rng.random(ranks), rng.random(ranks), np.empty(hw)]
        got = [a.copy() for a in want]
        assert slot_tokens_compiled(v, live, rank, ctx, *got) == slot_tokens(
            v, live, rank, ctx, *want
        )
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a, b)


def test_routed_tokens_compiled_is_the_reference() -> None:
    rng = np.random.default_rng(9)
    for _ in range(200):
        classes, hw = int(rng.integers(1, 4)), int(rng.integers(0, 20_000))
        tokens = rng.integers(0, 7, hw).astype(float)
        cls = rng.integers(0, classes, hw)
        want = [np.empty((classes, 1)), np.empty((classes, 1))]
        got = [np.empty((classes, 1)), np.empty((classes, 1))]
        routed_tokens(tokens, cls, *want)
        routed_tokens_compiled(tokens, cls, got[0], got[1], jit.sum_block())
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a, b)


def test_log_is_fpmaths_log_bit_for_bit() -> None:
    g = np.random.default_rng(10)
    x = np.ldexp(g.uniform(0.5, 1.0, 20_000), g.integers(-900, 900, 20_000))
    x[:5] = [1.0, 0.5, 2.0, 1e-300, 0.7071067811865476]
    got = np.array([jit.log(float(v)) for v in x])
    assert np.array_equal(got, fpmath.log(x))
    assert jit.log(0.0) == -np.inf and np.isnan(jit.log(-1.0)) and jit.log(np.inf) == np.inf


def test_chain_slot_compiled_is_the_reference() -> None:
    rng = np.random.default_rng(11)
    for _ in range(500):
        depth = int(rng.integers(1, 8))
        alpha, decay = float(rng.uniform(0, 1.2)), rng.uniform(0.3, 1.1, depth)
        want, got = [np.empty(depth), np.empty(depth)], [np.empty(depth), np.empty(depth)]
        chain_slot(alpha, decay, *want)
        chain_slot_compiled(alpha, decay, *got)
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a, b)


def test_a_run_takes_the_compiled_steps_by_its_size(monkeypatch) -> None:
    monkeypatch.setattr(jit.COMPILED, "forced", None)
    monkeypatch.setattr(jit.COMPILED, "on", False)
    jit.use_for_run(jit.MIN_REQUESTS - 1)
    assert not jit.COMPILED
    jit.use_for_run(jit.MIN_REQUESTS)
    assert jit.COMPILED
    monkeypatch.setattr(jit.COMPILED, "forced", False)  # DEEPINFER_JIT=0
    jit.use_for_run(10**6)
    assert not jit.COMPILED


def test_power_is_fpmaths_power_bit_for_bit() -> None:
    g = np.random.default_rng(12)
    x, y = g.uniform(0.0, 50.0, 5000), g.uniform(-4.0, 4.0, 5000)
    x[:3] = 0.0
    y[0] = 0.0
    got = [jit.power(float(a), float(b)) for a, b in zip(x, y, strict=True)]
    want = [fpmath.power(float(a), float(b)) for a, b in zip(x, y, strict=True)]
    assert got == want


def test_two_dim_choose_compiled_is_the_reference(monkeypatch) -> None:
    """The balancer's compiled pick over every rank of every group, against its loop over
    the groups (shared rows, ties, ranks that are down, empty groups)."""
    from types import SimpleNamespace

    from deepinfer_sim.sim.policies import balancer

    rng = np.random.default_rng(13)
    for _ in range(300):
        n_groups, ranks = int(rng.integers(1, 17)), int(rng.choice([1, 8, 64]))
        table = SimpleNamespace(input_len=rng.integers(1, 100_000, 5), output_len=np.ones(5))
        groups = []
        for i in range(n_groups):
            assigned = rng.integers(0, 4, ranks) * (rng.random() < 0.9)
            groups.append(
                SimpleNamespace(
                    idx=i,
                    ep=ranks,
                    table=table,
                    assigned=assigned,
                    assigned_kv=assigned * rng.uniform(0, 30_000, ranks),
                    penalty=np.where(rng.random(ranks) < 0.05, np.inf, 0.0),
                )
            )
        pick = balancer.TwoDimBalancer(groups, 16384)  # type: ignore[arg-type]
        assert pick.rows is not None and groups[0].assigned.base is pick.rows[0]
        rid = int(rng.integers(0, 5))
        monkeypatch.setattr(balancer, "COMPILED", True)
        compiled = pick.choose(rid)
        monkeypatch.setattr(balancer, "COMPILED", False)
        assert compiled == pick.choose(rid)


CACHE = """
import numpy as np
from deepinfer_sim import jit
jit.pairwise_sum(np.ones(3), 0)
"""


def test_the_compiled_functions_are_cached_outside_the_package(tmp_path) -> None:
    """Never beside the installed modules (numba's default), where ``pip uninstall`` leaves
    them and a later install finds a stale package folder: under XDG_CACHE_HOME."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    subprocess.run([sys.executable, "-c", CACHE], env=env, check=True)
    assert list((tmp_path / "deepinfer-sim" / "numba").rglob("jit._pairwise*.nbi"))
    beside = os.path.join(os.path.dirname(jit.__file__), "__pycache__")
    cached_beside = [f for f in os.listdir(beside) if ".nb" in f] if os.path.isdir(beside) else []
    assert not cached_beside


def test_count_at_least_compiled_is_the_reference() -> None:
    rng = np.random.default_rng(14)
    for _ in range(200):
        depth, hw = int(rng.integers(1, 8)), int(rng.integers(0, 400))
        survival = np.cumprod(rng.random((depth, hw)), axis=0)
        candidates = [0.0, 0.3, 2.0, float(survival.flat[0]) if survival.size else 1.0]
        threshold = candidates[int(rng.integers(0, 4))]  # an exact survival value: a tie
        got = np.full(hw, -1, dtype=np.int64)
        count_at_least_compiled(survival, threshold, got)
        assert np.array_equal(got, (survival >= threshold).sum(axis=0))


@pytest.mark.parametrize(("classes", "experts"), [(1, 16), (3, 256), (2, 384)])
def test_popularity_compiled_is_the_reference(classes: int, experts: int) -> None:
    """The experts' popularity under a drift state: softmax rows with logits far apart (tiny
    and underflowing shares) and hash-routed layers (all-zero logits)."""
    rng = np.random.default_rng(classes * experts)
    layers = 5
    log_class = rng.standard_normal((classes, layers, experts)) * rng.uniform(0.1, 30.0)
    log_class[:, 0, :] = 0.0  # a hash-routed layer
    x = rng.standard_normal((layers, experts)) * 0.3
    x[0] = 0.0
    want = popularity(log_class, x)
    assert np.array_equal(popularity_compiled(log_class, x, jit.sum_block()), want)


def test_compiled_normals_are_the_references(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled normal draws give the reference's bits (numpy's ziggurat, its tail values
    redrawn portably) and leave the generator where the reference leaves it: sizes from none to
    a million (hundreds of tail draws, the wedge's uniforms), one generator after another, and
    a generator of another kind."""
    from deepinfer_sim import rng as rngmod

    for make in (np.random.default_rng, lambda s: np.random.Generator(np.random.MT19937(s))):
        compiled, reference = make(16), make(16)
        sizes: list[int | tuple[int, ...]] = [0, 1, 7, (40, 64), 2560, 1_000_000, 3]
        for size in sizes:
            out = np.empty(size)
            rngmod.normal_fill(rngmod.bit_source(compiled), out.reshape(-1))
            monkeypatch.setattr(jit.COMPILED, "on", False)
            want = rngmod.normal(reference, size)
            assert np.array_equal(out, want)
            assert compiled.random() == reference.random()  # the streams stand at one place
    tails = np.empty(1_000_000)
    generator = np.random.default_rng(3)
    rngmod.normal_fill(rngmod.bit_source(generator), tails)
    assert (np.abs(tails) >= rngmod._NORMAL_TAIL).sum() > 100


def test_compiled_beta_is_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beta draws on the generator's own stream give the reference's values and leave the stream
    where it does: shapes above and below 1 (the boosted gamma), tiny shapes whose gammas
    underflow (the end picked by a uniform), a thousand draws each."""
    from deepinfer_sim import rng as rngmod

    shapes = [(0.96, 0.54), (30.0, 2.0), (0.3, 0.7), (1.0, 1.0), (1e-3, 2e-3), (1e-300, 1e-300)]
    for a, b in shapes:
        compiled, reference = np.random.default_rng(5), np.random.default_rng(5)
        got = [rngmod.beta_compiled(rngmod.bit_source(compiled), a, b) for _ in range(1000)]
        monkeypatch.setattr(jit.COMPILED, "on", False)
        want = [rngmod.beta(reference, a, b) for _ in range(1000)]
        monkeypatch.undo()
        assert got == want, (a, b)
        assert compiled.random() == reference.random()


def test_balanced_packing_compiled_is_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """EPLB's packing gives the same bins compiled: continuous weights, many ties (small
    integers), bins that do not divide the items, one bin, one item per bin."""
    from deepinfer_sim.sim.policies import eplb

    rng = np.random.default_rng(11)
    cases = [(61, 272, 64), (3, 40, 8), (5, 41, 8), (2, 16, 16), (4, 9, 1), (7, 100, 3)]
    for layers, items, bins in cases:
        for weight in (rng.random((layers, items)), rng.integers(0, 4, (layers, items)) * 1.0):
            monkeypatch.setattr(eplb, "COMPILED", True)
            got = eplb.balanced_packing(weight, bins)
            monkeypatch.setattr(eplb, "COMPILED", False)
            assert np.array_equal(got, eplb.balanced_packing(weight, bins)), (layers, items, bins)


def test_eplb_moves_compiled_are_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The experts a rebalance moves and the kept-expert counts its rank matching maximizes,
    compiled: placements with replicas, several copies of an expert on one rank, empty slots."""
    from deepinfer_sim.sim.policies import eplb

    rng = np.random.default_rng(5)
    for layers, experts, ranks, redundant in ((40, 256, 64, 1), (3, 16, 4, 2), (2, 9, 4, 3)):
        spr = eplb.slots_per_rank(experts, ranks, redundant)
        static = eplb.static_placement(layers, experts, ranks, redundant)
        placements = [static]
        for skew in (0.3, 3.0):
            loads = rng.pareto(skew, (layers, experts))
            placements.append(eplb.rebalance(loads, ranks, redundant))
        doubled = rng.integers(0, experts + 1, (layers, ranks * spr))  # copies, empty slots
        placements.append(eplb.Placement(doubled, static.replicas, ranks))
        for old in placements:
            for new in placements:
                monkeypatch.setattr(eplb, "COMPILED", True)
                got = eplb.moved_experts(old, new, experts), eplb.kept_experts(old, new, experts)
                monkeypatch.setattr(eplb, "COMPILED", False)
                want = eplb.moved_experts(old, new, experts), eplb.kept_experts(old, new, experts)
                for g, w in zip(got, want, strict=True):
                    assert np.array_equal(g, w), (layers, experts, ranks)


@pytest.mark.parametrize("classes", [1, 3])
def test_add_window_run_compiled_is_the_reference(classes: int) -> None:
    """A window run's expert-load moments, compiled: one class and several, zero tokens."""
    from deepinfer_sim.sim.stages.expert_parallel import add_window_run, add_window_run_compiled

    rng = np.random.default_rng(8)
    layers, experts = 7, 384
    pop = rng.dirichlet(np.full(experts, 0.3), (classes, layers))
    t = rng.integers(0, 5000, (classes, layers)) * 8.0
    h = t * rng.integers(1, 900, (classes, layers))
    t[0, 0] = h[0, 0] = 0.0
    start = rng.random((layers, experts)) * 100
    got_mean, got_var, want_mean, want_var = (start.copy() for _ in range(4))
    for _ in range(3):
        add_window_run_compiled(got_mean, got_var, pop, t, h)
        add_window_run(want_mean, want_var, pop, t, h)
    assert np.array_equal(got_mean, want_mean) and np.array_equal(got_var, want_var)


def test_best_threshold_compiled_is_the_reference() -> None:
    """DSpark's threshold from its drafts' survivals: holes (zeros), survivals on a bin's edge
    and at 1, step-time slopes from flat to steep (the best bin moves from the top to none)."""
    rng = np.random.default_rng(15)
    for trial in range(400):
        depth, hw = int(rng.integers(1, 8)), int(rng.integers(1, 400))
        survival = np.cumprod(rng.random((depth, hw)), axis=0)
        survival[:, rng.random(hw) < 0.2] = 0.0  # holes
        if trial % 4 == 0:
            survival.flat[: hw // 3] = np.floor(survival.flat[: hw // 3] * 256) / 256  # edges
            survival.flat[0] = 1.0
        n_live = int(rng.integers(1, hw + 1))
        t0 = float(rng.uniform(0.005, 0.05))
        slope = float(t0 * 10.0 ** rng.uniform(-7, 0))
        want = best_threshold(survival, n_live, t0, slope)
        assert best_threshold_compiled(survival, n_live, t0, slope) == want, trial


@pytest.mark.parametrize(
    ("experts", "ranks", "redundant"),
    [(256, 64, 1), (384, 4, 4), (16, 1, 2), (120, 1, 8), (384, 2, 1), (56, 8, 1)],
)
def test_slot_moments_compiled_is_the_reference(experts: int, ranks: int, redundant: int) -> None:
    """The per-rank moments under a placement: slots per rank from 5 (a decode group) to 100
    (a prefill instance: numpy's 8-lane pairwise rows), 8, one block of 128 and more than one
    block (193), redundant slots and empty ones."""
    rng = np.random.default_rng(experts + ranks)
    classes, layers = 3, 4
    extra = redundant * ranks
    phy2log = np.stack(
        [
            np.concatenate([rng.permutation(experts), rng.integers(0, experts + 1, extra)])
            for _ in range(layers)
        ]
    )
    replicas = np.zeros((layers, experts), dtype=np.int64)
    for lay in range(layers):
        np.add.at(replicas[lay], phy2log[lay][phy2log[lay] < experts], 1)
    pop = rng.dirichlet(np.full(experts, 0.3), size=(classes, layers))
    het = np.concatenate([[0.0], rng.uniform(0, 0.1, layers - 1)])
    slots = SlotWeights(phy2log, replicas, ranks)
    want = slot_moments_reference(pop, slots, het)
    share, q2, bias = (np.empty((classes, layers, ranks)) for _ in range(3))
    slot_moments_compiled(
        pop, slots.flat, slots.w1, slots.w2, het, share, q2, bias, jit.sum_block()
    )
    for a, b in zip(want, (share, q2, bias), strict=True):
        assert np.array_equal(a, b)


def _store_state(kv: KvStore) -> list[object]:
    """Everything a KV store holds: its counters, its block columns and every queue."""
    c = kv.cols
    cols = [getattr(c, name)[: c.size].tolist() for name in ("where", "cls", "age", "lru_pos")]
    queues = [(q.head, q.tail, q.items[: q.tail].tolist(), list(q.marks)) for q in kv.lru]
    counters = (kv.held, kv.expirations, kv.lost_misses, kv.written_blocks, kv.evictions_gc)
    return [cols, queues, counters, kv.slots.direct, kv.slots._added, kv.slots._high]


@pytest.mark.parametrize("nodes", [12, 36])
@pytest.mark.parametrize("refresh", [True, False])
def test_kvstore_compiled_is_the_reference(nodes: int, refresh: bool, monkeypatch) -> None:
    """Two stores take the same lookups and writes, one through the compiled block work
    (sim/stages/kvstore_steps.py), one through the numpy reference: the same answers and the
    same state after every call — expired and lost blocks, repeated blocks in a write, classes
    changing, GC, a store of several coding groups, and the switch out of direct slots."""
    cfg = StoragePool(
        nodes=nodes,
        node_latency_s=0.0,
        disk_tb=8e-7,  # 20 disks a node, 10 data nodes: 160 blocks a group, so GC runs
        ttl_s={"chatbot": 30.0, "agent": 8.0},
        refresh_on_read=refresh,
    )
    stores = [KvStore(cfg, ("chatbot", "agent"), 1e6, np.random.default_rng(0)) for _ in "ab"]
    rng = np.random.default_rng(11)
    module = "deepinfer_sim.sim.stages.kvstore.COMPILED"
    now = 0.0
    for step in range(600):
        now += float(rng.exponential(0.5))
        start = int(rng.integers(0, 400))
        keys = np.arange(start, start + int(rng.integers(0, 40)), dtype=np.int64)
        if rng.random() < 0.1 and len(keys) > 2:
            keys[-1] = keys[0]  # a block repeated in one request
        if step == 500:
            keys = np.array([2**40, 5], dtype=np.int64)  # out of the direct range: hash mode
        cls = int(rng.integers(-1, 2))
        write = rng.random() < 0.5 or step == 500
        if step == 300:
            for kv in stores:
                for node in range(3):  # group 0 lost
                    kv.fail_node(node)
        if step == 350:
            for kv in stores:
                for node in range(3):
                    kv.repair_node(node, now)
        answers = []
        for kv, compiled in zip(stores, (True, False), strict=True):
            monkeypatch.setattr(module, compiled)
            if write:
                answers.append(kv.write(keys, now, max(cls, 0)))
            else:
                answers.append(kv.lookup(keys, now, cls))
        assert answers[0] == answers[1], step
        assert _store_state(stores[0]) == _store_state(stores[1]), step
    assert not stores[0].slots.direct
    assert stores[0].expirations and stores[0].evictions_gc and stores[0].lost_misses


@pytest.mark.parametrize("latency", [0.0, 2e-4])
def test_storage_nodes_compiled_are_the_reference(latency: float, monkeypatch) -> None:
    """Reads and writes of the storage nodes through serve_group and through the Python
    reference: the same answers, queues, latencies used and counters after every call, with
    nodes failing (degraded reads) and coming back, and ties between idle nodes."""
    cfg = StoragePool(nodes=24, node_latency_s=latency)
    nodes = [StorageNodes(cfg, np.random.default_rng(5)) for _ in "ab"]
    rng = np.random.default_rng(3)
    now = 0.0
    for step in range(800):
        now += float(rng.exponential(2e-3)) if rng.random() < 0.8 else 0.0
        group = int(rng.integers(0, 2))
        nbytes = float(rng.choice([1e6, 3.3e7, 2e8]))
        read = rng.random() < 0.6
        failing = {200: 3, 210: 4, 400: 15}.get(step)  # two in group 0: degraded reads
        if failing is not None:
            for n in nodes:
                n.fail(failing)
        if step == 300:
            for n in nodes:
                n.repair(3, 0.0, now)
        answers = []
        for n, compiled in zip(nodes, (True, False), strict=True):
            monkeypatch.setattr("deepinfer_sim.sim.stages.storage_nodes.COMPILED", compiled)
            answers.append(n.read(group, nbytes, now) if read else n.write(group, nbytes, now))
        assert answers[0] == answers[1], step
        a, b = nodes
        assert a.busy.tolist() == b.busy.tolist(), step
        assert (a.read_bytes, a.write_bytes, a.degraded_reads) == (
            b.read_bytes,
            b.write_bytes,
            b.degraded_reads,
        )
    assert nodes[0].degraded_reads
