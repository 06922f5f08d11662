"""The verify policies of ``sim/policies/speculative.py``, each on its own: no cluster, no cost
model. What a policy needs is stood in for by trivial doubles — a draft chain of one traffic
class with seeded acceptance, a seeded stream, and a step time that is a constant plus a price
per verify token.
"""

from __future__ import annotations

import numpy as np
import pytest

from deepinfer_sim import load_scenario
from deepinfer_sim.errors import ConfigError
from deepinfer_sim.scenario import Speculative
from deepinfer_sim.sim.policies.speculative import (
    VERIFY_POLICIES,
    ClassAcceptance,
    DraftChain,
    DSpark,
    FixedK,
    Mtp1,
    NoSpeculation,
    PolicyParts,
    SpecDecoder,
    VerifyPolicy,
    make_verify_policy,
)

N = 200


def chain(depth: int = 5, n: int = N, seed: int = 0) -> DraftChain:
    """n sequences admitted, fairly easy drafts (mean acceptance 0.7)."""
    c = DraftChain(
        classes=[ClassAcceptance(0.7, 4.0, 1.0)],
        depth=depth,
        capacity=n,
        rng=np.random.default_rng(seed),
    )
    for slot in range(n):
        c.admit(slot, 0)
    return c


def priced(per_token: float):
    """A step of 10 ms plus ``per_token`` seconds per verify token added."""
    return lambda extra: 0.01 + extra * per_token


def verify(policy: VerifyPolicy, live: np.ndarray, per_token: float = 0.0) -> np.ndarray:
    v = np.zeros(live.size, dtype=np.int64)
    policy.choose(v, live, chain(max(1, policy.depth), live.size), priced(per_token))
    return v


def dspark(lag: int = 0, sigma: float = 0.3, seed: int = 1, n: int = N) -> DSpark:
    return DSpark(
        depth=5,
        lag_steps=lag,
        noise_sigma=sigma,
        overhead_s=4e-4,
        retune_steps=1,
        capacity=n,
        rng=np.random.default_rng(seed),
    )


@pytest.mark.parametrize(
    ("policy", "length"), [(NoSpeculation(), 0), (Mtp1(), 1), (FixedK(k=3), 3)]
)
def test_fixed_length_policies_verify_the_same_for_every_live_sequence(policy, length):
    """none verifies nothing, mtp1 one draft, fixed k drafts; holes verify nothing, and what
    verification costs changes none of them."""
    live = np.ones(N, dtype=bool)
    live[::7] = False
    for price in (0.0, 1.0):
        v = verify(policy, live, price)
        assert (v[live] == length).all() and (v[~live] == 0).all()
    assert policy.depth == length
    assert policy.overhead_s == 0.0
    assert policy.speculates == (length > 0)


def test_dspark_verifies_longer_prefixes_when_verification_is_cheap():
    live = np.ones(N, dtype=bool)
    free = verify(dspark(), live, 0.0)
    dear = verify(dspark(), live, 1e-4)  # each verify token costs 1 % of the step
    prohibitive = verify(dspark(), live, 1.0)
    assert free.mean() > 4.5
    assert dear.mean() < free.mean() - 1
    assert (prohibitive == 0).all()
    assert (verify(dspark(), np.zeros(N, dtype=bool), 0.0) == 0).all()  # holes verify nothing


def test_dspark_with_lag_truncates_with_the_confidences_of_lag_steps_earlier():
    """Same stream, same drafts: the lagged policy's choice at step t is the unlagged one's at
    step t − 2. A fresh sequence has no history: it uses its current confidences until it has."""
    n = 50
    drafts = chain(n=n)
    live = np.ones(n, dtype=bool)
    step = priced(2e-5)
    now, lagged = dspark(lag=0, sigma=1.0, n=n), dspark(lag=2, sigma=1.0, n=n)

    def run(steps: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        a: list[np.ndarray] = []
        b: list[np.ndarray] = []
        for _ in range(steps):
            for policy, out in ((now, a), (lagged, b)):
                v = np.zeros(n, dtype=np.int64)
                policy.choose(v, live, drafts, step)
                out.append(v)
        return a, b

    a, b = run(5)
    assert any((a[i] != a[0]).any() for i in range(1, 5))  # the noise moves the choice
    for t in range(5):
        assert (b[t] == a[t if t < 2 else t - 2]).all()
    assert (b[2] != a[2]).any()  # and it is not the current choice
    for slot in range(n):  # new sequences in every slot
        drafts.admit(slot, 0)
        now.admit(slot)
        lagged.admit(slot)
    a, b = run(3)
    assert (b[0] == a[0]).all() and (b[1] == a[1]).all() and (b[2] == a[0]).all()


def test_spec_decoder_emits_accepted_drafts_plus_one_capped_by_what_is_left():
    rng = np.random.default_rng(3)
    dec = SpecDecoder(
        policy=FixedK(k=4), classes=[ClassAcceptance(0.9, 10.0, 1.0)], capacity=N, rng=rng
    )
    for slot in range(N):
        dec.admit(slot, 0)
    live = np.ones(N, dtype=bool)
    live[:10] = False
    assert (dec.choose(N, live, priced(0.0))[live] == 4).all()
    left = np.full(N, 10**6)
    left[10:20] = 2
    emitted = dec.accept(N, live, left)
    assert (emitted[:10] == 0).all()
    assert (emitted[10:20] <= 2).all()
    assert ((emitted[20:] >= 1) & (emitted[20:] <= 5)).all()
    assert dec.active and dec.overhead_s == 0.0


def test_registry_builds_each_tag_from_its_config_section():
    parts = PolicyParts(max_draft=3, capacity=N, rng=np.random.default_rng(0))
    built = {tag: make_verify_policy(Speculative(policy=tag), parts) for tag in VERIFY_POLICIES}
    assert isinstance(built["none"], NoSpeculation)
    assert isinstance(built["mtp1"], Mtp1)
    assert isinstance(built["fixed"], FixedK) and built["fixed"].depth == 3  # fixed_k 5, capped
    assert isinstance(built["dspark"], DSpark) and built["dspark"].depth == 3
    assert built["dspark"].overhead_s == Speculative().overhead_s
    assert not SpecDecoder(
        policy=built["none"], classes=[ClassAcceptance(0.7, 4.0, 1.0)], capacity=N, rng=parts.rng
    ).active


def test_registry_refuses_an_unknown_tag():
    cfg = Speculative().model_copy(update={"policy": "eagle"})  # past the config's validation
    parts = PolicyParts(max_draft=5, capacity=N, rng=np.random.default_rng(0))
    with pytest.raises(ConfigError, match="unknown verify policy 'eagle'"):
        make_verify_policy(cfg, parts)


def test_switching_the_tag_keeps_the_other_policies_keys():
    """``--set policies.speculative.policy=fixed`` on the default scenario leaves its dspark
    keys (lag_steps, overhead_s...) in place: the config is one model with every policy's keys,
    not a union tagged by policy, and the fixed policy ignores them."""
    cfg = load_scenario("default", ["policies.speculative.policy=fixed"]).policies.speculative
    assert cfg.lag_steps == 2
    parts = PolicyParts(max_draft=5, capacity=N, rng=np.random.default_rng(0))
    policy = make_verify_policy(cfg, parts)
    assert isinstance(policy, FixedK) and policy.overhead_s == 0.0
