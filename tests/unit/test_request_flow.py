"""The request flow between stages, driven directly: a cluster of doubles, no stages built."""

from collections import deque

import numpy as np
import simpy
from conftest import make_source

from deepinfer_sim.sim.core.cluster import Cluster
from deepinfer_sim.sim.core.flow import RequestFlow, RequestLimits
from deepinfer_sim.sim.core.requests import RejectReason, RequestTable, State
from deepinfer_sim.sim.policies.admission import Admission

LIMITS = RequestLimits(
    max_context_tokens=10_000,
    kv_capacity_tokens=5_000,
    seq_overhead_tokens=100,
    kv_bytes_per_token=2.0,
    slot_bytes=1_000.0,
)


class Group:
    """A decode group double: which ranks are down, what was assigned and what arrived."""

    def __init__(self, ep=2):
        self.down = np.zeros(ep, dtype=bool)
        self.assigned, self.arrived = [], []

    def assign(self, rid, rank):
        self.assigned.append((rid, rank))

    def arrive(self, rid):
        self.arrived.append(rid)


class FirstRank:
    def choose(self, rid):
        return 0, 0


class Link:
    def __init__(self, up=True):
        self.up, self.sent = up, []

    def send(self, fid, nbytes, cb):
        self.sent.append((fid, nbytes, cb))


def flow_of(inputs, outputs, images=None, live_ranks=2, links=(True,), backups=()):
    src = make_source(np.zeros(len(inputs)), inputs, outputs, images=images)
    env = simpy.Environment()
    table = RequestTable(src)
    cl = Cluster(None, None, env, table, [], [], [Group()], [Link(u) for u in links], 5_000, 100)
    cl.backup_links = [Link(u) for u in backups]
    cl.live_ranks = live_ranks
    cl.all_ended = env.event()
    prefilled = []
    return cl, RequestFlow(cl, LIMITS, FirstRank(), prefilled.append), prefilled


def test_admission_rejects_with_the_reason_and_sends_the_rest_to_prefill():
    cl, flow, to_prefill = flow_of([9_000, 4_950, 100, 100], [2_000, 10, 10, 10], [0, 0, 1, 0])
    for rid in range(4):
        flow.admit(rid)
    reasons = cl.table.reject_reason
    assert reasons[0] == RejectReason.CONTEXT_TOO_LONG  # 11,000 > 10,000
    assert reasons[1] == RejectReason.KV_CAPACITY  # 4,960 + 100 > 5,000
    assert reasons[2] == RejectReason.NO_VISION_ENCODER
    assert to_prefill == [3] and cl.arrived == 4 and cl.ended == 3
    assert isinstance(cl.admission, Admission) and cl.admission.backlog == 1


def test_a_one_token_answer_ends_at_its_prefill():
    cl, flow, _ = flow_of([100], [1])
    flow.prefilled(0, 0)
    assert cl.table.state[0] == State.DONE and cl.ended == 1 and not cl.links[0].sent


def test_the_kv_goes_over_the_instance_link_or_its_backup_while_it_is_cut():
    cl, flow, _ = flow_of([100, 200], [5, 5], links=(True, False), backups=(True, True))
    flow.prefilled(0, 0)
    flow.prefilled(1, 1)
    ((fid, nbytes, _),) = cl.links[0].sent
    assert (fid, nbytes) == (0, 2.0 * 100 + 1_000)
    assert not cl.links[1].sent and cl.backup_links[1].sent[0][0] == 2
    assert cl.counters["rerouted_transfers"] == 1
    assert cl.decode[0].assigned == [(0, 0), (1, 0)]
    cl.env.run(until=1.0)
    flow.transferred(2)
    assert cl.table.t_transfer_end[1] == 1.0 and cl.decode[0].arrived == [1]


def test_with_no_live_rank_a_request_waits_for_a_repair_or_is_rejected_when_none_comes():
    cl, flow, _ = flow_of([100, 100], [5, 5], live_ranks=0)
    cl.repairs_pending = 1
    flow.route_decode(0, 0)
    assert cl.parked == deque([(0, 0)]) and cl.table.state[0] == State.DECODE_WAIT
    cl.repairs_pending = 0
    flow.route_decode(1, 0)
    assert cl.table.reject_reason[1] == RejectReason.NO_DECODE_RANK and cl.ended == 1


def test_a_rerouted_request_recomputes_on_its_new_rank_without_a_transfer():
    cl, flow, _ = flow_of([100], [5])
    flow.reroute(0)
    assert cl.table.failures[0] == 1 and cl.counters["requeued"] == 1
    assert cl.decode[0].arrived == [0] and not cl.links[0].sent
