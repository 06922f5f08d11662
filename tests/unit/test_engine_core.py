"""The real engine core, replayed in real time on the CPU at toy widths.

``EngineCore`` runs a reduced stack of real layers (attention + shared expert + routed experts,
random weights) under a continuous-batching scheduler. These tests replay small request lists
(arrivals mostly at t=0, so the schedule does not depend on how fast this machine is) and check
the bookkeeping the calibration relies on: every request completes, first tokens come before
completion, token counts add up per mode, budgets and batch limits hold, speculative verify
advances sequences by the accepted tokens, and a fixed request list gives a fixed sequence of
steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

from deepinfer_sim.kernels._util import EagerGraph, capture_eagerly
from deepinfer_sim.kernels.engine import EngineCore, EngineResult
from deepinfer_sim.kernels.shapes import LayerShape

SHAPE = LayerShape.toy()
LAYERS = [("csa", True), ("hca", True), ("csa", False)]
REQUESTS = [(0.0, 30, 5), (0.0, 7, 1), (0.0, 50, 9), (0.0, 12, 3), (0.0, 3, 4), (0.0, 21, 6)]


def engine(**over: Any) -> EngineCore:
    kw: dict[str, Any] = {
        "layers": LAYERS,
        "device": "cpu",
        "max_seqs": 4,
        "max_tokens": 128,
        "prefill_token_budget": 32,
        "max_decode_batch": 3,
        "seed": 3,
    }
    kw.update(over)
    return EngineCore(SHAPE, **kw)


def run(requests: Any = REQUESTS, **over: Any) -> EngineResult:
    return engine(**over).run(requests)


def check_complete(res: EngineResult, requests: Any = REQUESTS) -> None:
    r = res.requests
    assert len(r) == len(requests)
    assert r["done_s"].notna().all() and r["first_token_s"].notna().all()
    assert (r["first_token_s"] <= r["done_s"]).all()
    assert (r["first_token_s"] >= r["arrival_s"]).all()
    assert (r["ttft_s"] >= 0).all()
    s = res.steps
    assert (s["end_s"] >= s["start_s"]).all()
    assert (np.diff(s["start_s"]) >= 0).all()


@pytest.mark.parametrize("verify", [1, 3])
def test_mixed_mode_serves_every_request(verify: int) -> None:
    """Mixed steps (decodes + chunked prefill) finish every request with all its tokens: the
    prefill tokens of all steps add up to the prompts, each request generates its output
    length, and no step takes more prefill tokens than the budget or more sequences than the
    decode batch allows."""
    res = run(verify_tokens=verify)
    check_complete(res)
    r, s = res.requests, res.steps
    assert s["prefill_tokens"].sum() == sum(p for _, p, _ in REQUESTS)
    assert (s["prefill_tokens"] <= 32).all()
    assert (s["decode_seqs"] <= 3).all()
    assert list(r["generated"]) == [o for _, _, o in REQUESTS]
    assert (r.loc[r["output_len"] > 1, "tpot_s"] > 0).all()
    assert r.loc[r["output_len"] == 1, "tpot_s"].isna().all()
    if verify == 1:
        assert s["decode_seqs"].sum() == sum(o - 1 for _, _, o in REQUESTS)
    # a 50-token prompt with a 32-token budget is chunked over steps
    assert (s["prefill_tokens"] == 32).sum() >= 2


def test_prefill_only_places_whole_prompts_first_come_first_served() -> None:
    """Prefill-only steps take whole queued prompts in arrival order until the next would exceed
    the budget; a prompt larger than the budget runs alone. Each request is done when its
    prompt is, and that moment is its first token."""
    res = run(mode="prefill_only", prefill_token_budget=40)
    check_complete(res)
    r, s = res.requests, res.steps
    assert (r["first_token_s"] == r["done_s"]).all()
    assert (r["generated"] == 1).all()
    assert s["decode_seqs"].sum() == 0
    assert s["prefill_tokens"].sum() == sum(p for _, p, _ in REQUESTS)
    # FCFS packing of [30, 7, 50, 12, 3, 21] under 40: [30, 7], [50] alone, [12, 3, 21]
    assert list(s["prefill_tokens"]) == [37, 50, 36]
    assert list(s["prefill_seqs"]) == [2, 1, 3]


def test_decode_only_admits_prompts_already_in_cache() -> None:
    """Decode-only requests arrive with their prompt in cache (no prefill compute): admission is
    the first token, then output_len - 1 decode tokens, at most max_decode_batch at a time; the
    KV the steps attend over includes the prompts."""
    res = run(mode="decode_only")
    check_complete(res)
    r, s = res.requests, res.steps
    assert s["prefill_tokens"].sum() == 0
    assert (s["decode_seqs"] <= 3).all()
    assert s["decode_seqs"].sum() == sum(o - 1 for _, _, o in REQUESTS)
    assert list(r["generated"]) == [o for _, _, o in REQUESTS]
    assert (r["first_token_s"] == r["admit_s"]).all()
    assert s["decode_kv_tokens"].iloc[0] >= 30 + 50  # the first batch holds those prompts


def test_steps_record_issue_time_and_no_gpu_time_on_the_cpu() -> None:
    """Each step records the host's time to issue it, within its wall time; its GPU time comes
    from CUDA events, so on a CPU it is NaN rather than a made-up number."""
    s = run(mode="prefill_only", prefill_token_budget=40).steps
    wall = s["end_s"] - s["start_s"]
    assert (s["issue_s"] > 0).all() and (s["issue_s"] <= wall).all()
    assert s["gpu_s"].isna().all()


def test_graphed_prefill_runs_each_step_on_staging_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill-only steps as graphs (CPU stand-in ``capture_eagerly``: the body re-run): one
    capture per tuple of prompt lengths (its step marked), on staging slots kept across steps
    and runs; the steps
    are those of the eager engine; a step whose staging slots do not fit the pools, or whose
    capture fails, runs eagerly."""
    reqs = [(0.0, 30, 2), (0.0, 7, 2), (0.0, 30, 2), (0.0, 7, 2), (0.0, 12, 2), (0.0, 9, 2)]
    eager = engine(mode="prefill_only", prefill_token_budget=40, max_seqs=8).run(reqs)
    eng = engine(mode="prefill_only", prefill_token_budget=40, max_seqs=8)
    captured: list[Any] = []

    def record(device: Any, body: Any, *rest: Any) -> EagerGraph:
        captured.append(body)
        return capture_eagerly(device, body, *rest)

    eng.prefill_graphs = True
    monkeypatch.setattr(eng, "_capture_fn", record)
    res = eng.run(reqs)
    cols = ["prefill_tokens", "prefill_seqs"]
    assert res.steps[cols].equals(eager.steps[cols])  # [30, 7] twice, then [12, 9]
    assert len(captured) == 2 and sorted(eng._prefill_graphs) == [(12, 9), (30, 7)]
    assert list(res.steps["graph"]) == [1, 1, 1] and list(res.steps["captured"]) == [1, 0, 1]
    assert len(eng._staging) == 2
    pool = eng.layers[0].pool
    assert pool.in_use.sum() == 2 and pool.in_use[eng._staging].all()  # requests' slots freed
    again = eng.run(reqs)
    assert len(captured) == 2 and again.steps["captured"].sum() == 0  # replays only
    tight = engine(mode="prefill_only", prefill_token_budget=40, max_seqs=3)
    tight.prefill_graphs = True
    monkeypatch.setattr(tight, "_capture_fn", record)
    check_complete(tight.run(reqs[:2]), reqs[:2])  # 2 requests + 2 staging > 3 slots
    assert tight._prefill_graphs == {}

    def fail(*args: Any) -> EagerGraph:
        raise RuntimeError("operation not permitted when stream is capturing")

    broken = engine(mode="prefill_only", prefill_token_budget=40, max_seqs=8)
    broken.prefill_graphs = True
    monkeypatch.setattr(broken, "_capture_fn", fail)
    out = broken.run(reqs)  # a failed capture runs that step eagerly, and the shape from then on
    assert out.steps[cols].equals(eager.steps[cols]) and broken._prefill_graph_failed
    assert out.steps["graph"].sum() == 0
    with pytest.raises(ValueError, match="CUDA-graph prefill"):
        engine(prefill_graphs=True)


def test_step_sequence_is_deterministic() -> None:
    """A fixed request list (all arrived) and seed give the same steps, token for token."""
    cols = ["prefill_tokens", "prefill_seqs", "decode_seqs", "decode_tokens", "kv_tokens"]
    for mode in ("mixed", "prefill_only", "decode_only"):
        a = run(mode=mode, verify_tokens=2).steps[cols]
        b = run(mode=mode, verify_tokens=2).steps[cols]
        assert a.equals(b), mode


def test_speculative_verify_advances_by_accepted_tokens() -> None:
    """With every draft accepted, verify-3 steps advance a sequence 3 tokens at a time; with none
    accepted, one token per step, like plain decode (the cache is rolled back each step)."""
    reqs = [(0.0, 10, 10)]
    full = run(reqs, verify_tokens=3, accept_prob=1.0, mode="decode_only")
    none = run(reqs, verify_tokens=3, accept_prob=0.0, mode="decode_only")
    plain = run(reqs, verify_tokens=1, mode="decode_only")
    assert len(full.steps) == 3  # 9 tokens after the first, 3 per step
    assert len(none.steps) == len(plain.steps) == 9
    assert list(none.steps["kv_tokens"]) == list(plain.steps["kv_tokens"] + 2)
    assert full.requests["generated"].iloc[0] == 10


def test_real_time_arrivals_and_slot_reuse() -> None:
    """Requests become visible only when the wall clock passes their arrival (the idle engine
    sleeps until then), and more requests than slots reuse freed slots."""
    reqs = [(0.0, 9, 3), (0.15, 5, 2)] + [(0.0, 4, 2)] * 6
    res = run(reqs, max_seqs=2, max_decode_batch=2)
    check_complete(res, reqs)
    late = res.requests.iloc[1]
    assert late["admit_s"] >= 0.15
    assert res.steps["start_s"].max() >= 0.15


def test_invalid_requests_and_settings_are_refused() -> None:
    """Requests that cannot fit the cache, empty prompts, and unknown modes are errors."""
    with pytest.raises(ValueError):
        run([(0.0, 120, 20)])
    with pytest.raises(ValueError):
        run([(0.0, 0, 2)])
    with pytest.raises(ValueError):
        engine(mode="both")
    with pytest.raises(ValueError):
        engine(layers=[("csa", False)])


CAPTURE_S = 1.0


def test_graphed_decode_captures_each_shape_once_off_the_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decode-only steps as graphs (deepseek backend emulated on the CPU, ``capture_eagerly``
    standing in for the capture): each new (batch, verify, entry caps) shape is captured once,
    with the replay clock stopped — a capture that takes a second shows in no step's time and
    delays no request — and the steps are those of the eager engine. (A second: a CPU step of
    this toy engine takes milliseconds, but well over 0.2 s on a loaded 2-core machine.)"""
    import time

    reqs = [(0.0, 30, 6), (0.0, 7, 3), (0.0, 50, 5), (0.0, 12, 4)]
    eager = engine(mode="decode_only", backend="deepseek").run(reqs)
    eng = engine(mode="decode_only", backend="deepseek")
    captures: list[Any] = []

    def slow_capture(device: Any, body: Any, *rest: Any) -> EagerGraph:
        captures.append(body)
        time.sleep(CAPTURE_S)
        return capture_eagerly(device, body, *rest)

    eng.graphs = True
    monkeypatch.setattr(eng, "_capture_fn", slow_capture)
    t0 = time.perf_counter()
    res = eng.run(reqs)
    wall = time.perf_counter() - t0
    s = res.steps
    cols = ["decode_seqs", "decode_tokens", "kv_tokens"]
    assert s[cols].equals(eager.steps[cols])
    assert (s["graph"] == 1).all() and len(captures) == len(eng._graphs)
    # the batch shrinks as requests finish: new shapes (the warm-up step captured one more)
    assert int(s["captured"].sum()) == len(captures) - 1 >= 2
    assert s["end_s"].iloc[-1] < wall - CAPTURE_S * len(captures)  # the captures' time is not on it
    assert ((s["end_s"] - s["start_s"]) < CAPTURE_S).all()
    again = eng.run(reqs)
    assert again.steps["captured"].sum() == 0 and len(captures) == len(eng._graphs)
