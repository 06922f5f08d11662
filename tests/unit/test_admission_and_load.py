"""Admission control, offered vs served load, and transfers moved to a backup link.

Under overload a cluster without admission control rejects nothing: its prefill queue, and
every TTFT, grow for as long as the overload lasts. ``policies.admission`` turns requests away
at arrival instead, each with its reason in ``requests.rejected_by_reason``:
``queue_time`` when the predicted wait before the prompt's prefill starts exceeds
``max_wait_s`` (or, ``slo_aware``, a share of the TTFT SLO), ``queue_length`` when
``max_queued`` prompts already wait for or are in prefill. The default, ``none``, admits all.

``offered_load`` in the summary sets what was offered (every arrival over the arrival window)
against what was served (completions over the completion window): equal rates when the cluster
keeps up, a served rate below the offered one when it does not. ``served_over_offered`` counts
over one window, the whole run: the output tokens served of those offered, 1 when every request
was served, below 1 when some were turned away or left in flight.

A cut P->D link with a backup path moves its flows to the backup, and transfers that start
while it is cut go there too; ``transfer.rerouted`` counts both.

The runs are the tiny deployment of ``conftest.py`` (2 prefill instances of 2 ranks, one decode
group of 8) with 8,000-token prompts: about 0.08 s of prefill each, some 50 prompts a second
for the pool. 1,000 requests in 10 s offer twice that.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import make_source, tiny_dict

from deepinfer_sim import simulate
from deepinfer_sim.errors import ConfigError
from deepinfer_sim.scenario import scenario_from_dict
from deepinfer_sim.sim.results.result import Result

PROMPT, OUTPUT = 8000, 50


def run(n: int, window_s: float, **over: Any) -> Result:
    sc = scenario_from_dict(tiny_dict(**{"cache.prefix.enabled": False, **over}))
    return simulate(sc, source=make_source(np.linspace(0, window_s, n), PROMPT, OUTPUT))


@pytest.fixture(scope="module")
def overloaded() -> Result:
    """Twice the pool's prefill capacity, no admission control."""
    return run(1000, 10.0)


def test_by_default_nothing_is_rejected_and_served_falls_behind_offered(overloaded):
    """``none`` admits everything: the queue grows (TTFT of seconds), every request completes
    in the end, and the served rate is well below the offered one. Everything offered was
    served, late: ``served_over_offered`` is 1, the lag shows in the rates."""
    s = overloaded.summary
    assert s["requests"]["rejected"] == 0 and s["requests"]["rejected_by_reason"] == {}
    assert s["requests"]["completed"] == 1000
    adm = s["admission"]
    assert adm["policy"] == "none" and adm["rejected"] == 0
    assert adm["max_wait_s"] is None and adm["max_queued"] is None
    assert s["latency"]["ttft_s"]["p99"] > 5.0
    load = s["offered_load"]
    offered, served = load["offered"], load["served"]
    assert offered["request_per_s"] == pytest.approx(1000 / 10.0)
    assert offered["input_tok_per_s"] == pytest.approx(1000 * PROMPT / 10.0)
    assert offered["output_tok_per_s"] == pytest.approx(1000 * OUTPUT / 10.0)
    assert served["request_per_s"] < 0.6 * offered["request_per_s"]
    assert served["input_tok_per_s"] < offered["input_tok_per_s"]
    assert served["output_tok_per_s"] < offered["output_tok_per_s"]
    assert load["served_over_offered"] == 1.0 and load["completed_fraction"] == 1.0


def test_queue_time_rejects_with_its_reason_and_bounds_ttft(overloaded):
    """With a 0.5 s limit on the predicted prefill wait, about half the requests are turned away
    as ``queue_time``, and the admitted ones see a TTFT of under a second instead of growing
    to nine."""
    res = run(1000, 10.0, **{"policies.admission": {"policy": "queue_time", "max_wait_s": 0.5}})
    s = res.summary
    req = s["requests"]
    assert req["rejected"] > 0
    assert req["rejected_by_reason"] == {"queue_time": req["rejected"]}
    assert req["completed"] + req["rejected"] == 1000 and req["in_flight"] == 0
    adm = s["admission"]
    assert adm["policy"] == "queue_time" and adm["max_wait_s"] == 0.5
    assert adm["rejected"] == req["rejected"]
    assert adm["rejected_fraction"] == pytest.approx(req["rejected"] / 1000)
    assert adm["predicted_wait_max_s"] > 0.5  # the arrivals it turned away saw more
    frame = res.requests
    turned = frame["state"] == "rejected"
    assert (frame.loc[turned, "reject_reason"] == "queue_time").all()
    assert frame.loc[turned, "t_prefill_start_s"].isna().all()  # never queued
    ttft = s["latency"]["ttft_s"]
    assert ttft["max"] < 0.5 + 1.0
    assert ttft["p99"] < overloaded.summary["latency"]["ttft_s"]["p99"] / 5
    # it serves what it admits: served still trails offered (the rejected half)
    served = frame.loc[frame["state"] == "done", "output_tokens"].sum()
    assert s["offered_load"]["served_over_offered"] == pytest.approx(served / (1000 * OUTPUT))
    assert s["offered_load"]["served_over_offered"] < 0.7


def test_slo_aware_queue_time_derives_its_limit_from_the_ttft_slo():
    """``slo_aware`` takes ``slo_wait_fraction`` (0.5) of ``slo.ttft_s`` as the limit: with a
    1 s SLO the admitted requests meet it at p99; with a ``max_wait_s`` too, the smaller wins."""
    slo = {"slo.ttft_s": 1.0}
    aware = {"policy": "queue_time", "slo_aware": True}
    s = run(1000, 10.0, **slo, **{"policies.admission": aware}).summary
    assert s["admission"]["max_wait_s"] == pytest.approx(0.5)
    assert s["requests"]["rejected_by_reason"]["queue_time"] > 0
    assert s["latency"]["ttft_s"]["p99"] <= 1.0
    both = {**aware, "max_wait_s": 0.2}
    tighter = run(1000, 10.0, **slo, **{"policies.admission": both}).summary
    assert tighter["admission"]["max_wait_s"] == 0.2
    assert tighter["requests"]["rejected"] > s["requests"]["rejected"]


def test_queue_length_caps_the_prefill_queue():
    """At most ``max_queued`` prompts are ever between admission and the end of their prefill;
    arrivals beyond that are rejected as ``queue_length``."""
    cap = 8
    res = run(1000, 10.0, **{"policies.admission": {"policy": "queue_length", "max_queued": cap}})
    s = res.summary
    req = s["requests"]
    assert req["rejected"] > 0 and req["rejected_by_reason"] == {"queue_length": req["rejected"]}
    assert req["completed"] + req["rejected"] == 1000
    assert s["admission"]["prefill_backlog_max"] == cap
    assert s["load"]["prefill"]["queue"]["max"] <= cap
    assert res.timeseries["prefill_queue"].max() <= cap
    assert s["latency"]["ttft_s"]["max"] < 1.0


def test_at_light_load_served_matches_offered_and_nothing_is_turned_away():
    """50 requests a second over 20 s, half the pool's capacity: an admission policy has
    nothing to reject and the served rates equal the offered ones."""
    limit = {"policies.admission": {"policy": "queue_time", "max_wait_s": 0.5}}
    s = run(500, 20.0, **limit).summary
    assert s["requests"]["rejected"] == 0 and s["requests"]["completed"] == 500
    load = s["offered_load"]
    assert load["served_over_offered"] == 1.0
    for key in ("request_per_s", "input_tok_per_s", "output_tok_per_s"):
        assert load["served"][key] == pytest.approx(load["offered"][key], rel=0.02)
    assert load["served"]["requests"] == load["offered"]["requests"] == 500


def test_a_short_run_that_served_every_request_reads_all_of_it_served():
    """40 requests of the tiny deployment's trace, arriving over 12 s, all served with a p99
    TTFT under a second. Their completions spread over a slightly longer span than their
    arrivals (the latencies differ), so dividing the served rate by the offered one read
    0.94: "served / offered 94 %" for a run that served everything. Counted over one window
    it is 1."""
    sc = scenario_from_dict(tiny_dict(**{"workload.max_requests": 40}))
    s = simulate(sc).summary
    assert s["requests"]["completed"] == s["requests"]["arrived"] == 40
    load = s["offered_load"]
    assert load["served"]["window_s"] != load["offered"]["window_s"]
    assert load["served_over_offered"] == 1.0 and load["completed_fraction"] == 1.0


def test_a_run_cut_by_its_horizon_served_less_than_it_was_offered():
    """The overloaded load cut at 10 s, while the backlog is still queued: the requests left
    in flight were offered and not served, so ``served_over_offered`` is well below 1."""
    res = run(1000, 10.0, **{"sim.horizon_s": 10.0})
    s = res.summary
    assert s["requests"]["in_flight"] > 300
    served = res.requests.loc[res.requests["state"] == "done", "output_tokens"].sum()
    load = s["offered_load"]
    assert load["served_over_offered"] == pytest.approx(served / (1000 * OUTPUT))
    assert load["served_over_offered"] < 0.7


def test_rerouted_counts_every_transfer_that_used_the_backup_link():
    """Instance 0's link is cut from 3 s to 8 s. Without a backup its transfers stall and none
    is rerouted; with one, the flows on the link at the cut move to the backup and those that
    start during the cut go there directly: ``transfer.rerouted`` counts both (it used to count
    the moved ones only)."""
    cut_s, dur_s = 3.0, 5.0
    fault = [{"kind": "link_cut", "at_s": cut_s, "duration_s": dur_s, "target": 0}]
    slow = {"network.pd_gbps_per_8_gpus": 20.0, "faults": fault}  # transfers of ~0.1 s
    stalled = run(200, 10.0, **slow).summary
    assert stalled["transfer"]["link_cuts"] == 1 and stalled["transfer"]["rerouted"] == 0
    assert stalled["transfer"]["backup_bytes"] == 0
    res = run(200, 10.0, **slow, **{"network.backup_links": True})
    s = res.summary
    f = res.requests
    used_backup = (
        (f["prefill_instance"] == 0)
        & (f["t_prefill_end_s"] < cut_s + dur_s)
        & (f["t_first_token_s"] > cut_s)
    )
    started_on_backup = used_backup & (f["t_prefill_end_s"] > cut_s)
    assert started_on_backup.sum() > 10  # the case the counter used to miss
    assert s["transfer"]["rerouted"] == int(used_backup.sum())
    assert s["transfer"]["rerouted_store_writes"] == 0  # no prefix store in this run
    # the whole KV of the transfers that started there, and what was left of the moved ones
    backup_bytes = s["transfer"]["backup_bytes"]
    assert f.loc[started_on_backup, "transfer_bytes"].sum() <= backup_bytes
    assert backup_bytes <= f.loc[used_backup, "transfer_bytes"].sum() * (1 + 1e-3)
    assert s["transfer"]["p99_s"] < stalled["transfer"]["p99_s"]


@pytest.mark.parametrize(
    "admission, key",
    [
        ({"policy": "queue_time"}, "policies.admission.queue_time"),
        ({"policy": "queue_time", "max_wait_s": 0}, "policies.admission.queue_time.max_wait_s"),
        ({"policy": "queue_length", "max_queued": 0}, "policies.admission.queue_length"),
        ({"policy": "queue_length"}, "policies.admission.queue_length.max_queued"),
        ({"policy": "reject_all"}, "policies.admission"),
        ({"policy": "none", "max_wait_s": 1}, "policies.admission.none.max_wait_s"),
    ],
)
def test_a_bad_admission_policy_is_a_config_error_naming_the_key(admission, key):
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(tiny_dict(**{"policies.admission": admission}))
    assert key in str(err.value)
