"""Each component reports its own part of summary.json, built here directly (no cluster).

The summary assembles its sections from these reports; a report says what the component counted,
as of the time it is asked (an engine's busy time includes the step in flight up to then).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest
import simpy
from conftest import make_source

from deepinfer_sim.models.cost import StepCost
from deepinfer_sim.models.registry import load_model
from deepinfer_sim.scenario import EplbPool, ExpertLoad, StoragePool
from deepinfer_sim.sim.core.network import Link
from deepinfer_sim.sim.core.requests import RequestTable
from deepinfer_sim.sim.policies.admission import Admission, QueueLength
from deepinfer_sim.sim.policies.kv_admission import make_kv_admission
from deepinfer_sim.sim.stages.decode import DecodeGroup
from deepinfer_sim.sim.stages.expert_load import ExpertLoadModel
from deepinfer_sim.sim.stages.expert_parallel import GroupExperts, GroupShape
from deepinfer_sim.sim.stages.kvstore import KvStore
from deepinfer_sim.sim.stages.vision import VisionInstance


class HalfSecondSteps:
    """A step-cost double: every decode step takes 0.5 s whatever it runs."""

    def decode_step_packed(self, load: np.ndarray, imbalance: float = 1.0) -> float:
        return 0.5


def decode_group(outputs: list[int], ep: int = 2) -> tuple[simpy.Environment, DecodeGroup]:
    env = simpy.Environment()
    table = RequestTable(make_source(np.zeros(len(outputs)), 100, outputs))
    group = DecodeGroup(
        env=env,
        idx=0,
        ep=ep,
        cost=cast(StepCost, HalfSecondSteps()),  # a duck-typed double
        max_seqs_per_rank=4,
        kv_capacity_tokens=10_000,
        kv_admission=make_kv_admission("reserve", 0.0),
        imbalance=1.0,
        table=table,
        on_done=lambda rid: None,
    )
    for rid in range(len(outputs)):
        group.assign(rid, rid % ep)
        group.arrive(rid)
    return env, group


def test_decode_group_reports_its_steps_tokens_and_occupancy():
    """Two sequences of 2 and 1 decode tokens (the first token comes from prefill): the first
    step runs both, the second only the longer one."""
    env, group = decode_group([3, 2])
    env.run()
    r = group.report(env.now)
    assert (r["ranks"], r["steps"], r["seq_steps"], r["tokens_out"]) == (2, 2, 3, 3)
    assert r["busy_s"] == 1.0 and r["stepping_s"] == 0.0
    assert r["seq_s"] == 3 * 0.5  # sequences x seconds over the steps
    assert r["kv_s"] == (100 + 100) * 0.5 + 101 * 0.5  # context held while stepping
    assert r["preemptions"] == 0 and r["rank_failures"] == 0 and r["verify_sum"] == 0
    assert r["experts"] is None  # a constant imbalance: nothing to report
    assert r["running"] == 0 and r["waiting"] == 0 and not r["batch"].any()


def test_decode_group_report_shows_what_runs_now_per_rank():
    env, group = decode_group([5, 5, 5])  # ranks 0, 1, 0
    env.run(until=0.25)
    r = group.report(env.now)
    assert r["running"] == 3 and r["batch"].tolist() == [2, 1]
    assert r["reserved"].tolist() == [2 * 105, 105]  # whole context reserved
    r["batch"][0] = 99  # a copy: the report never writes into the group
    assert group.report(env.now)["batch"].tolist() == [2, 1]


def test_decode_group_report_counts_the_step_in_flight_up_to_now():
    env, group = decode_group([3])
    env.run(until=0.75)  # the first step ended at 0.5, the second is a quarter through
    r = group.report(env.now)
    assert r["steps"] == 1 and r["busy_s"] == 0.5 and r["stepping_s"] == 0.25


def test_vision_instance_reports_images_and_busy_time():
    env = simpy.Environment()
    table = RequestTable(make_source(np.zeros(2), 100, 2, images=[2, 1]))
    ve = VisionInstance(env, 0, 0.1, table, table.source.image_count, lambda rid: None)
    ve.submit(0)
    ve.submit(1)
    env.run(until=0.25)
    r = ve.report(env.now)
    assert r["images"] == 2 and r["seconds_per_image"] == 0.1
    assert r["busy_s"] == pytest.approx(0.2) and r["stepping_s"] == pytest.approx(0.05)


CLASSES = ("chatbot", "agent")


def kv_store(**cfg: Any) -> KvStore:
    base: dict[str, Any] = {"nodes": 24, "node_latency_s": 0.0}
    return KvStore(StoragePool(**{**base, **cfg}), CLASSES, 1e6, np.random.default_rng(0))


def test_kvstore_reports_its_config_traffic_and_holdings():
    kv = kv_store(ttl_s={"chatbot": 100.0, "agent": 10.0})
    kv.write(np.arange(8, dtype=np.int64), 0.0, traffic_class=0)
    kv.write(np.arange(100, 104, dtype=np.int64), 0.0, traffic_class=1)
    hit = kv.lookup(np.arange(8, dtype=np.int64), 1.0)
    kv.read(np.arange(hit, dtype=np.int64), 1.0)
    r = kv.report()
    cfg = kv.cfg
    assert r["nodes"] == 24 and r["coding"] == f"{cfg.data_chunks}+{cfg.parity_chunks}"
    assert r["ttl_s"] == {"chatbot": 100.0, "agent": 10.0}
    assert (r["writes"], r["written_blocks"], r["reads"], r["read_blocks"]) == (2, 12, 1, 8)
    assert r["blocks_held"] == 12 and r["lost_blocks"] == 0
    # the nodes' bytes: every block's data chunks (plus parity on writes), all nodes together
    assert r["read_bytes"] >= 8 * 1e6 and r["write_bytes"] > 12 * 1e6
    assert r["used_fraction"] == kv.used_fraction() > 0


def test_kvstore_report_counts_a_lost_group():
    kv = kv_store()
    kv.write(np.arange(40, dtype=np.int64), 0.0, traffic_class=0)
    held = kv.report()["blocks_held"]
    for node in range(kv.cfg.parity_chunks + 1):  # group 0 loses more nodes than its parity
        kv.fail_node(node)
    r = kv.report()
    assert r["lost_blocks"] > 0 and r["blocks_held"] == held - r["lost_blocks"]
    assert kv.nodes.report()["failed_nodes"] == kv.cfg.parity_chunks + 1


def test_group_experts_report_every_step_factor_and_its_policy():
    model = load_model("deepseek-v4-flash")
    load = ExpertLoadModel(ExpertLoad(), model, ("chatbot",), 3)
    shape = GroupShape(
        ranks=8,
        redundant_per_rank=1,
        layer_set=np.zeros(load.layers, dtype=np.int64),
        expert_bytes=1e6,
        move_bytes_per_s=1e9,
    )
    experts = GroupExperts(
        load,
        EplbPool(policy="eplb", window_steps=3, period_steps=4),
        shape,
        np.random.default_rng(0),
    )
    tokens = np.full((1, 1), 512.0)
    for k in range(10):
        experts.step(float(k), tokens, tokens.copy())
    r = experts.report()
    assert (r["policy"], r["window_steps"], r["period_steps"]) == ("eplb", 3, 4)
    assert r["redundant_experts_per_gpu"] == 1
    factors = np.asarray(r["factors"])
    assert factors.size == r["factor_steps"] == 10 and (factors >= 1.0).all()
    assert r["factor_sum"] == pytest.approx(factors.sum())
    assert r["rebalances"] >= 2 and r["stall_s"] == experts.stall_total_s > 0


def test_admission_reports_its_limits():
    assert Admission().report() == {
        "max_wait_s": None,
        "max_queued": None,
        "predicted_wait_max_s": None,  # no wait limit: nothing predicted
        "prefill_backlog_max": 0,
    }
    adm = QueueLength(3)
    adm.admitted()
    adm.admitted()
    adm.prefilled()
    r = adm.report()
    assert r["max_queued"] == 3 and r["prefill_backlog_max"] == 2


def test_link_reports_transfers_and_bytes():
    env = simpy.Environment()
    link = Link(env, "pd0", 1e9, 0.0)
    link.send(0, 1e6, lambda fid: None)
    link.send(2, 3e6, lambda fid: None)
    assert link.report() == {"transfers": 2, "bytes": 4e6, "active": 2}
    env.run()
    assert link.report()["active"] == 0
