"""Links share bandwidth fairly among concurrent KV transfers (processor sharing).

With k flows on a link each progresses at bandwidth / k, so two equal transfers started together
both finish after twice the solo time, and a short transfer that joins a long one finishes first
and then hands its share back. A cut link stalls every flow until it is repaired.
"""

from __future__ import annotations

import simpy

from deepinfer_sim.sim.core.network import Link


def run_link(plan, bandwidth=100.0, latency=0.0, events=()):
    """plan: [(start_time, flow_id, bytes)] -> {flow_id: finish_time}."""
    env = simpy.Environment()
    link = Link(env, "test", bandwidth, latency)
    done: dict[int, float] = {}

    def start(t, fid, nbytes):
        yield env.timeout(t)
        link.send(fid, nbytes, lambda f: done.__setitem__(f, env.now))

    for t, fid, nbytes in plan:
        env.process(start(t, fid, nbytes))
    for t, action in events:
        env.timeout(t).callbacks.append(lambda _e, a=action: getattr(link, a)())
    env.run()
    return done, link


def test_solo_transfer_takes_bytes_over_bandwidth_plus_latency():
    done, _ = run_link([(0.0, 1, 500.0)], bandwidth=100.0, latency=0.25)
    assert abs(done[1] - 5.25) < 1e-9


def test_two_equal_flows_share_the_link():
    done, _ = run_link([(0.0, 1, 100.0), (0.0, 2, 100.0)])
    assert abs(done[1] - 2.0) < 1e-9 and abs(done[2] - 2.0) < 1e-9


def test_short_flow_joining_a_long_one():
    """Long: 300 B from t=0. Short: 50 B from t=1. Shared at 50 B/s each from t=1, the short one
    ends at t=2; the long one then has 300 - 100 - 50 = 150 B left alone: ends at t=3.5."""
    done, _ = run_link([(0.0, 1, 300.0), (1.0, 2, 50.0)])
    assert abs(done[2] - 2.0) < 1e-9
    assert abs(done[1] - 3.5) < 1e-9


def test_cut_stalls_flows_until_repair():
    """A 2 s cut in the middle of a 4 s transfer delays it by exactly 2 s."""
    done, _ = run_link([(0.0, 1, 400.0)], events=[(1.0, "cut"), (3.0, "repair")])
    assert abs(done[1] - 6.0) < 1e-9


def test_many_flows_all_finish_and_conserve_time():
    """Work conservation: with the link never idle, the last flow ends at total bytes / bw."""
    plan = [(0.0, i, float(10 + 7 * i)) for i in range(50)]
    done, link = run_link(plan)
    total = sum(b for _, _, b in plan)
    assert len(done) == 50
    assert abs(max(done.values()) - total / 100.0) < 1e-6
    assert link.active == 0 and link.transfers == 50
