"""The timeline export: a run as Perfetto/Chrome trace-event JSON.

A small default-scenario run (``workload.max_requests=200``) is exported in memory
(``run --timeline``) and from its folder (``timeline RUN_DIR``), loaded back and read by a small
trace-event parser that checks what Perfetto's JSON importer relies on: each event has the keys
its phase needs, complete spans have a non-negative duration and never overlap on their track,
async spans open and close in order, flows start, (step) and finish on named tracks inside a span
there, and every timestamp lies in the run. Then the bounds: a window, a request sample and an
event cap, which must be reported in ``otherData``.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from deepinfer_sim.cli import main
from deepinfer_sim.scenario import load_scenario
from deepinfer_sim.sim.results.timeline import (
    PID_DECODE,
    PID_STORAGE,
    TimelineOptions,
    build_timeline,
    simulate_with_timeline,
    sources_from_run_dir,
)
from deepinfer_sim.sim.run import simulate

SHRINK = ["workload.max_requests=200"]
REQUIRED = {
    "X": {"name", "ph", "ts", "dur", "pid", "tid"},
    "b": {"name", "cat", "ph", "ts", "pid", "id"},
    "e": {"name", "cat", "ph", "ts", "pid", "id"},
    "s": {"name", "cat", "ph", "ts", "pid", "tid", "id"},
    "t": {"name", "cat", "ph", "ts", "pid", "tid", "id"},
    "f": {"name", "cat", "ph", "ts", "pid", "tid", "id"},
    "M": {"name", "ph", "pid", "args"},
}
EPS_US = 1e-3  # timestamps are rounded to the nanosecond


def parse(trace: dict[str, Any], end_us: float) -> dict[str, Any]:
    """Check a trace-event object; returns its spans per track and its flows."""
    assert set(trace) >= {"traceEvents", "otherData"}
    json.dumps(trace, allow_nan=False)  # strict JSON: no NaN or infinity anywhere
    processes, threads = set(), set()
    spans: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    asyncs: dict[tuple[str, str], list[str]] = defaultdict(list)
    flows: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for ev in trace["traceEvents"]:
        ph = ev["ph"]
        assert ph in REQUIRED, ev
        assert REQUIRED[ph] <= set(ev), (ph, ev)
        if ph == "M":
            if ev["name"] == "process_name":
                processes.add(ev["pid"])
            if ev["name"] == "thread_name":
                assert "tid" in ev and ev["args"]["name"]
                threads.add((ev["pid"], ev["tid"]))
            continue
        assert -EPS_US <= ev["ts"] <= end_us + EPS_US, ev
        if ph == "X":
            assert ev["dur"] >= 0, ev
            assert ev["ts"] + ev["dur"] <= end_us + EPS_US, ev
            spans[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"]))
        elif ph in "be":
            stack = asyncs[(ev["cat"], ev["id"])]
            if ph == "b":
                stack.append(ev["name"])
            else:
                assert stack and stack.pop() == ev["name"], ev
        else:
            flows[(ev["cat"], ev["id"])].append(ev)
    assert all(not stack for stack in asyncs.values()), "an async span never closed"
    for track, ss in spans.items():
        assert track in threads and track[0] in processes, f"track {track} has no name"
        ss.sort()
        for (_, e0), (s1, _) in itertools.pairwise(ss):
            assert s1 >= e0 - EPS_US, f"overlapping spans on {track}"
    for key, evs in flows.items():
        phases = [e["ph"] for e in evs]
        assert phases[0] == "s" and phases[-1] == "f" and set(phases[1:-1]) <= {"t"}, key
        assert all(a["ts"] <= b["ts"] for a, b in itertools.pairwise(evs)), key
        for ev in evs:
            track = (ev["pid"], ev["tid"])
            assert track in threads, f"flow {key} on an unnamed track"
            inside = any(s - EPS_US <= ev["ts"] <= e + EPS_US for s, e in spans.get(track, []))
            assert inside, f"flow {key} point at {ev['ts']} outside every span of {track}"
    return {"spans": spans, "flows": flows, "asyncs": asyncs, "threads": threads}


@pytest.fixture(scope="module")
def in_memory():
    sc = load_scenario("default", SHRINK)
    result, trace = simulate_with_timeline(simulate, sc, options=TimelineOptions(ranks=True))
    return result, trace


def test_a_run_exports_named_tracks_steps_and_flows(in_memory):
    """Every track is named; decode groups show their engine steps, the storage nodes their
    activity; sampled requests carry stage spans and a flow prefill -> link -> decode."""
    result, trace = in_memory
    end_us = result.summary["sim"]["simulated_s"] * 1e6
    p = parse(trace, end_us)
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"prefill busy", "transfers", "step", "rank busy", "node activity"} <= names
    other = trace["otherData"]
    assert other["decode_tracks"] == "engine steps" and "truncated" not in other
    assert other["requests_sampled"] == len(result.requests) <= other["max_requests"]
    assert len(p["flows"]) > 0.9 * (result.requests["state"] == "done").sum()
    assert all(len(f) == 3 for f in p["flows"].values())  # prefill, link, decode
    steps = sum(len(v) for (pid, tid), v in p["spans"].items() if pid == PID_DECODE and tid == 1)
    assert steps > 0
    assert any(pid == PID_STORAGE for pid, _ in p["spans"])


def test_a_run_folder_exports_busy_periods(in_memory, tmp_path):
    """From a folder (requests.parquet only) the decode group shows busy periods and there is no
    storage track; both say so in otherData."""
    result, _ = in_memory
    result.write(tmp_path, plots=False)
    trace = build_timeline(sources_from_run_dir(tmp_path))
    parse(trace, result.summary["sim"]["simulated_s"] * 1e6)
    other = trace["otherData"]
    assert other["decode_tracks"] == "busy periods"
    assert other["storage_tracks"] == "not recorded"
    assert other["requests_sampled"] == len(result.requests)


def test_window_sampling_and_cap_bound_the_file(in_memory):
    result, _ = in_memory
    sc = load_scenario("default", SHRINK)
    lo, hi = 4.0, 8.0
    opt = TimelineOptions(t_from=lo, t_to=hi, max_requests=50, ranks=True)
    _, trace = simulate_with_timeline(simulate, sc, options=opt)
    parse(trace, hi * 1e6)
    timed = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    assert all(lo * 1e6 - EPS_US <= e["ts"] <= hi * 1e6 + EPS_US for e in timed)
    assert all(e["ts"] + e["dur"] <= hi * 1e6 + EPS_US for e in timed if e["ph"] == "X")
    requests = {e["id"] for e in timed if e["ph"] == "b" and e.get("cat") == "request"}
    assert len(requests) == trace["otherData"]["requests_sampled"] == 50
    assert trace["otherData"]["requests_in_window"] > 50

    capped = build_timeline(
        sources_from_frame_and_steps(result, sc), TimelineOptions(max_events=400)
    )
    assert len(capped["traceEvents"]) <= 400
    cut = capped["otherData"]["truncated"]
    assert cut["max_events"] == 400 and cut["requests_dropped"] > 0
    parse(capped, result.summary["sim"]["simulated_s"] * 1e6)


def sources_from_frame_and_steps(result, sc):
    from deepinfer_sim.sim.results.timeline import TimelineSources

    return TimelineSources(
        requests=result.requests,
        prefill_instances=sc.pools.prefill.instances,
        decode_groups=sc.pools.decode.groups,
        decode_ep=sc.pools.decode.ep,
        end_s=result.summary["sim"]["simulated_s"],
    )


def test_cap_cuts_tracks_at_a_time_and_says_so(in_memory):
    """With room for the requests but not every span, spans past a cut-off go."""
    result, trace = in_memory
    n_meta = sum(e["ph"] == "M" for e in trace["traceEvents"])
    n_req = sum(e["ph"] in "bestf" for e in trace["traceEvents"])
    cap = n_meta + n_req + 500
    src = sources_from_frame_and_steps(result, load_scenario("default", SHRINK))
    capped = build_timeline(src, TimelineOptions(max_events=cap))
    assert len(capped["traceEvents"]) <= cap
    cut = capped["otherData"]["truncated"]
    assert cut["requests_dropped"] == 0 and cut["engine_and_link_spans_dropped"] > 0
    until_us = cut["engine_and_link_complete_until_s"] * 1e6
    assert all(e["ts"] < until_us for e in capped["traceEvents"] if e["ph"] == "X")


def test_options_refuse_an_empty_window():
    from deepinfer_sim.errors import UserError

    with pytest.raises(UserError, match="--from < --to"):
        TimelineOptions(t_from=5.0, t_to=5.0)


# ---- the CLI ----------------------------------------------------------------------------------


def test_cli_run_with_timeline_and_timeline_of_the_folder(tmp_path: Path):
    runner = CliRunner()
    out, tl = tmp_path / "run", tmp_path / "tl.json"
    res = runner.invoke(
        main,
        ["run", "default", "--out", str(out), "--no-plots", "-q", "--timeline", str(tl),
         "--set", SHRINK[0]],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    end_s = json.loads((out / "summary.json").read_text())["sim"]["simulated_s"]
    end_us = (end_s + 1e-3) * 1e6  # summary.json rounds its numbers
    parse(json.loads(tl.read_text()), end_us)

    res = runner.invoke(
        main,
        ["timeline", str(out), "--from", "2", "--to", "6", "--max-requests", "20", "--ranks"],
    )
    assert res.exit_code == 0, res.output
    assert "ui.perfetto.dev" in res.output
    trace = json.loads((out / "timeline.json").read_text())
    parse(trace, 6e6)
    assert trace["otherData"]["requests_sampled"] == 20
    assert trace["otherData"]["window_s"] == [2.0, 6.0]


def test_cli_timeline_of_a_missing_folder_is_a_clean_error(tmp_path: Path):
    res = CliRunner().invoke(main, ["timeline", str(tmp_path / "nope")])
    assert res.exit_code == 2
    assert res.output.startswith("error: ") and "no such run folder" in res.output
    assert "Traceback" not in res.output
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(main, ["timeline", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "not a run folder" in res.output
    res = CliRunner().invoke(
        main, ["timeline", str(tmp_path / "empty"), "--from", "3", "--to", "1"]
    )
    assert res.exit_code == 2 and res.output.startswith("error: ")
