"""Timeline export: one run as Chrome/Perfetto trace-event JSON (``{"traceEvents": [...]}``).

Open the file at ui.perfetto.dev (or chrome://tracing). Tracks, one per engine or link, each a
(pid, tid) named by ``process_name``/``thread_name`` metadata events:

- **prefill / instance i** — busy periods, *reconstructed*: prefill instances keep no step records,
  so each span is a union of the ``[t_prefill_start, t_prefill_end]`` intervals of the requests
  it prefilled (``requests.parquet``). An instance steps without a pause while any started prompt
  is unfinished, so the union's edges are step edges; the steps inside a period are not shown.
- **decode / group g** — every engine step, *exact*, from the step records the group keeps for
  ITL (``DecodeGroup.step_table``: end, duration, sequences stepped, sequences new this step),
  when the run is in memory (``deepinfer-sim run --timeline``). A finished run folder has no
  step records, so ``deepinfer-sim timeline RUN_DIR`` shows the group's busy periods (union of
  its requests' ``[t_decode_start, t_done]``) instead.
- **decode / group g rank r** (``ranks=True``) — the rank's busy periods, the same union over the
  requests placed on it (their last rank, after any failure or preemption).
- **P→D links / link i** — busy periods: the union of the KV transfers
  ``[t_prefill_end, t_first_token]`` of the requests prefilled on instance i (its backup path,
  when a cut moved flows there, is drawn on the same track). Prefix-cache write-backs share the
  link but are not per-request records and are not drawn.
- **storage / node n** — activity of each 3FS node's FIFO queue: its service intervals (reads,
  writes, rebuilds) merged when less than 1 ms apart, each span's args holding the exact busy
  time, operations and bytes; from a recorder the run installs on ``StorageNodes`` only when a
  timeline is asked for (off by default; O(1) per node served). Not in a run folder.
- **requests (sample)** — up to ``max_requests`` requests (evenly spaced over those alive in the
  window), each an async span from arrival to completion with nested stage spans (vision, queue,
  prefill, transfer, decode queue, decode), and one flow arrow prefill instance → P→D link →
  decode group.

Under aggregated serving an instance is drawn twice, as prefill / instance i (the spans of
the prompts it prefilled) and as decode / group i (its steps, exact: every step, mixed or not);
the P->D link tracks stay empty (a hand-off is local and takes no time).

Bounds: a window ``[t_from, t_to]`` (spans are clipped to it), the request sample, and a hard cap
on events. Past the cap, storage spans go first, then engine and link spans, each tier cut at a
time past which its tracks are dropped (so what is drawn is complete up to it; requests are
dropped whole, from the end of the sample, only if they alone overflow), and
``otherData.truncated`` says how many went and up to when each tier is complete.
Timestamps are simulated microseconds from t = 0. Nothing here runs on the simulator's hot path:
the spans are built after the run from columns and arrays it keeps anyway.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ...errors import UserError

if TYPE_CHECKING:
    from ...scenario import Scenario
    from ..core.cluster import Cluster
    from .result import Result

PID_REQUESTS, PID_PREFILL, PID_LINKS, PID_DECODE, PID_STORAGE = 1, 2, 3, 4, 5
DEFAULT_MAX_REQUESTS = 2_000
DEFAULT_MAX_EVENTS = 500_000  # ~60 MB of JSON
STORAGE_GAP_S = 1e-3  # storage node intervals closer than this are drawn as one span
_US = 1e6


@dataclass(frozen=True)
class TimelineOptions:
    t_from: float = 0.0  # seconds
    t_to: float = math.inf
    max_requests: int = DEFAULT_MAX_REQUESTS
    max_events: int = DEFAULT_MAX_EVENTS
    ranks: bool = False

    def __post_init__(self) -> None:
        if not self.t_from >= 0 or not self.t_to > self.t_from:
            raise UserError(
                f"timeline window: need 0 <= --from < --to (got {self.t_from}, {self.t_to})"
            )
        if self.max_requests < 0 or self.max_events < 1:
            raise UserError("timeline: --max-requests must be >= 0 and --max-events >= 1")


@dataclass
class DecodeSteps:
    """One decode group's step records (``DecodeGroup.step_table``)."""

    end: np.ndarray
    dt: np.ndarray
    seqs: np.ndarray
    new: np.ndarray


class StorageRecorder:
    """Per-node activity of the storage nodes, merged as service intervals arrive.

    Installed as ``StorageNodes.recorder``; a node's queue is FIFO, so each new interval starts at
    or after the node's last one ends and merging is O(1). Intervals closer than ``gap_s`` join
    one span (a node serves a chunk in tens of µs: drawn one by one they would outnumber every
    other track), whose args keep the exact busy time, reads, writes and bytes. Only spans that
    overlap the window are kept, at most ``cap`` of them (``dropped`` counts the rest). A read and
    a write are told apart by the per-byte service time, so with equal read and write bandwidths
    all count as writes."""

    __slots__ = ("cap", "dropped", "gap_s", "open", "periods", "t_from", "t_to")

    def __init__(
        self, nodes: int, t_from: float, t_to: float, cap: int, gap_s: float = STORAGE_GAP_S
    ) -> None:
        self.t_from, self.t_to, self.cap, self.gap_s = t_from, t_to, cap, gap_s
        # open span per node: [start, end, reads, writes, bytes, busy seconds]
        self.open: list[list[float] | None] = [None] * nodes
        self.periods: list[tuple[int, float, float, int, int, float, float]] = []
        self.dropped = 0

    def __call__(
        self, nodes: list[int], service: float, done: list[float], nbytes: float, write: bool
    ) -> None:
        gap = self.gap_s
        for node, end in zip(nodes, done, strict=True):
            start = end - service
            cur = self.open[node]
            if cur is not None and start <= cur[1] + gap:
                cur[1] = end
                cur[3 if write else 2] += 1
                cur[4] += nbytes
                cur[5] += service
                continue
            if cur is not None:
                self._close(node, cur)
            self.open[node] = [start, end, float(not write), float(write), nbytes, service]

    def _close(self, node: int, p: list[float]) -> None:
        if p[1] < self.t_from or p[0] > self.t_to:
            return
        if len(self.periods) >= self.cap:
            self.dropped += 1
            return
        self.periods.append((node, p[0], p[1], int(p[2]), int(p[3]), p[4], p[5]))

    def finish(self) -> list[tuple[int, float, float, int, int, float, float]]:
        for node, cur in enumerate(self.open):
            if cur is not None:
                self._close(node, cur)
            self.open[node] = None
        return self.periods


@dataclass
class TimelineSources:
    """What a timeline is built from: the per-request table and, when the run was in memory,
    the decode groups' step records and the storage nodes' busy periods."""

    requests: pd.DataFrame
    prefill_instances: int
    decode_groups: int
    decode_ep: int
    storage_nodes: int = 0
    storage_width: int = 0
    decode_steps: list[DecodeSteps] | None = None
    storage: list[tuple[int, float, float, int, int, float, float]] | None = None
    storage_dropped: int = 0
    scenario: str = ""
    end_s: float | None = None
    source: str = "run"


class TimelineCapture:
    """Pass ``capture.on_build`` to ``simulate(..., on_build=...)`` to keep what a timeline
    needs from the cluster: the decode groups (their step records) and the storage recorder."""

    def __init__(self, options: TimelineOptions) -> None:
        self.options = options
        self.cluster: Cluster | None = None
        self.recorder: StorageRecorder | None = None

    def on_build(self, cl: Cluster) -> None:
        self.cluster = cl
        kv = cl.path.kv if cl.path is not None else None
        if kv is not None:
            o = self.options
            self.recorder = StorageRecorder(len(kv.nodes.busy), o.t_from, o.t_to, o.max_events)
            kv.nodes.recorder = self.recorder

    def sources(self, result: Result) -> TimelineSources:
        cl = self.cluster
        if cl is None:
            raise RuntimeError("TimelineCapture.on_build was not called by simulate()")
        steps = [DecodeSteps(*g.step_table()[:4]) for g in cl.decode]
        rec = self.recorder
        storage = rec.finish() if rec is not None else None
        nodes = cl.sc.pools.storage
        return TimelineSources(
            requests=result.requests,
            prefill_instances=len(cl.prefill),
            decode_groups=len(cl.decode),
            decode_ep=_decode_ranks(cl.sc),
            storage_nodes=len(rec.open) if rec is not None else 0,
            storage_width=nodes.width if rec is not None else 0,
            decode_steps=steps,
            storage=storage,
            storage_dropped=rec.dropped if rec is not None else 0,
            scenario=cl.sc.name,
            end_s=float(cl.env.now),
            source="run (in memory)",
        )


def _decode_ranks(sc: Scenario) -> int:
    """DP ranks of one decode group (or aggregated instance: it prefills on them too)."""
    agg = sc.pools.aggregated if sc.aggregated else None
    return agg.dp if agg is not None else sc.pools.decode.dp


def sources_from_run_dir(run_dir: str | Path) -> TimelineSources:
    """A finished run folder: ``requests.parquet`` and the sizes in ``config.resolved.yaml``."""
    from ...scenario import load_scenario

    d = Path(run_dir)
    if not d.is_dir():
        raise UserError(f"{d}: no such run folder")
    req, cfg = d / "requests.parquet", d / "config.resolved.yaml"
    for f in (req, cfg):
        if not f.is_file():
            raise UserError(f"{d}: no {f.name} (not a run folder? `deepinfer-sim run` writes one)")
    sc = load_scenario(str(cfg))
    frame = pd.read_parquet(req)
    end = None
    summary = d / "summary.json"
    if summary.is_file():
        try:
            end = float(json.loads(summary.read_text(encoding="utf-8"))["sim"]["simulated_s"])
        except (KeyError, TypeError, ValueError):
            end = None
    agg = sc.pools.aggregated if sc.aggregated else None
    return TimelineSources(
        requests=frame,
        prefill_instances=agg.instances if agg is not None else sc.pools.prefill.instances,
        decode_groups=agg.instances if agg is not None else sc.pools.decode.groups,
        decode_ep=_decode_ranks(sc),
        scenario=sc.name,
        end_s=end,
        source=f"run folder {d} (requests.parquet)",
    )


# ---- building ---------------------------------------------------------------------------------


def _union(
    starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge intervals: (period starts, period ends, intervals per period, and for each input
    interval the index of its period)."""
    if starts.size == 0:
        e = np.zeros(0)
        i = np.zeros(0, dtype=np.int64)
        return e, e, i, i
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    last = np.append(idx[1:], s.size) - 1
    period = np.empty(s.size, dtype=np.int64)
    period[order] = np.cumsum(new) - 1
    return s[idx], reach[last], np.diff(np.append(idx, s.size)), period


@dataclass
class _Spans:
    """``X`` events of one kind as columns (built vectorized, turned into dicts last)."""

    pid: int
    tid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    name: str
    args: dict[str, np.ndarray] = field(default_factory=dict)


class _Builder:
    def __init__(self, src: TimelineSources, opt: TimelineOptions) -> None:
        self.src, self.opt = src, opt
        self.meta: list[dict[str, Any]] = []
        self.spans: list[_Spans] = []
        self.lo = opt.t_from
        hi = opt.t_to
        if src.end_s is not None:
            hi = min(hi, src.end_s)
        self.hi = hi

    # -- tracks
    def process(self, pid: int, name: str) -> None:
        self.meta.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        self.meta.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}
        )

    def thread(self, pid: int, tid: int, name: str) -> None:
        self.meta.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
        )
        self.meta.append(
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
             "args": {"sort_index": tid}}
        )  # fmt: skip

    def add(self, spans: _Spans) -> None:
        keep = (spans.end >= self.lo) & (spans.start <= self.hi) & (spans.end >= spans.start)
        if not keep.all():
            spans = _Spans(
                spans.pid, spans.tid[keep], spans.start[keep], spans.end[keep], spans.name,
                {k: v[keep] for k, v in spans.args.items()},
            )  # fmt: skip
        spans.start = np.maximum(spans.start, self.lo)
        spans.end = np.minimum(spans.end, self.hi)
        self.spans.append(spans)

    def union_tracks(
        self, pid: int, tid_of: np.ndarray, start: np.ndarray, end: np.ndarray, name: str,
        weights: dict[str, np.ndarray] | None = None,
    ) -> None:  # fmt: skip
        """Busy periods per track id: union of the intervals, with their count (and sums)."""
        ok = np.isfinite(start) & np.isfinite(end) & (tid_of >= 0)
        tid_of, start, end = tid_of[ok], start[ok], end[ok]
        w = {k: v[ok] for k, v in (weights or {}).items()}
        for tid in np.unique(tid_of):
            sel = tid_of == tid
            ps, pe, count, period = _union(start[sel], end[sel])
            args: dict[str, np.ndarray] = {"requests": count}
            for k, v in w.items():
                args[k] = np.bincount(period, weights=v[sel], minlength=ps.size)
            self.add(_Spans(pid, np.full(ps.size, int(tid)), ps, pe, name, args))


_FLOAT_COLS = (
    "arrival_s", "t_vision_done_s", "t_prefill_start_s", "t_prefill_end_s", "t_first_token_s",
    "t_decode_start_s", "t_done_s", "transfer_bytes", "ttft_s", "tpot_s", "e2e_s",
)  # fmt: skip
_INT_COLS = (
    "input_tokens", "output_tokens", "prefix_hit_tokens", "prefill_instance", "decode_group",
    "decode_rank",
)  # fmt: skip
_TEXT_COLS = ("traffic_class", "state", "reject_reason")


def _sample(candidates: np.ndarray, n: int) -> np.ndarray:
    if candidates.size <= n:
        return candidates
    return candidates[np.unique(np.linspace(0, candidates.size - 1, n).round().astype(np.int64))]


def _num(v: Any) -> Any:
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return round(f, 6) if math.isfinite(f) else None
    return v


def _us(t: float) -> float:
    return round(t * _US, 3)


def build_timeline(src: TimelineSources, options: TimelineOptions | None = None) -> dict[str, Any]:
    """The trace-event JSON object (a dict) for ``src`` within ``options``' bounds."""
    opt = options or TimelineOptions()
    b = _Builder(src, opt)
    req = src.requests
    col = lambda name: req[name].to_numpy(dtype=np.float64)  # noqa: E731
    arrival = col("arrival_s")
    p_start, p_end = col("t_prefill_start_s"), col("t_prefill_end_s")
    first, d_start, done = col("t_first_token_s"), col("t_decode_start_s"), col("t_done_s")
    inst = req["prefill_instance"].to_numpy(dtype=np.int64)
    group = req["decode_group"].to_numpy(dtype=np.int64)
    rank = req["decode_rank"].to_numpy(dtype=np.int64)
    nbytes = req["transfer_bytes"].to_numpy(dtype=np.float64)
    if src.end_s is None:
        ends = np.concatenate([arrival, done[np.isfinite(done)]])
        src.end_s = float(ends.max()) if ends.size else 0.0
        b.hi = min(b.hi, src.end_s)

    # prefill instances: busy periods (no step records exist)
    b.process(PID_PREFILL, "prefill instances")
    for i in range(src.prefill_instances):
        b.thread(PID_PREFILL, i + 1, f"prefill {i}")
    new_tokens = (req["input_tokens"] - req["prefix_hit_tokens"]).to_numpy(dtype=np.float64)
    b.union_tracks(
        PID_PREFILL, inst + 1, p_start, p_end, "prefill busy", {"new_tokens": new_tokens}
    )

    # P->D links: busy periods of the KV transfers
    b.process(PID_LINKS, "P→D links")
    for i in range(src.prefill_instances):
        b.thread(PID_LINKS, i + 1, f"P→D link {i}")
    moved = (nbytes > 0) & np.isfinite(first)
    b.union_tracks(
        PID_LINKS, np.where(moved, inst + 1, -1), p_end, first, "transfers", {"bytes": nbytes}
    )

    # decode groups: exact steps, or busy periods; ranks: busy periods
    b.process(PID_DECODE, "decode groups")
    per = src.decode_ep + 1 if opt.ranks else 1
    group_tid = lambda g: g * per + 1  # noqa: E731
    for g in range(src.decode_groups):
        b.thread(PID_DECODE, group_tid(g), f"decode group {g}")
        if opt.ranks:
            for r in range(src.decode_ep):
                b.thread(PID_DECODE, group_tid(g) + 1 + r, f"group {g} rank {r}")
    steps: list[tuple[np.ndarray, np.ndarray]] = []
    if src.decode_steps is not None:
        for g, st in enumerate(src.decode_steps):
            start = st.end - st.dt
            steps.append((start, st.end))
            b.add(
                _Spans(
                    PID_DECODE, np.full(st.end.size, group_tid(g)), start, st.end, "step",
                    {"seqs": st.seqs, "new": st.new},
                )
            )  # fmt: skip
    else:
        tid = np.where(group >= 0, group * per + 1, -1)
        b.union_tracks(PID_DECODE, tid, d_start, done, "decode busy")
    if opt.ranks:
        tid = np.where((group >= 0) & (rank >= 0), group * per + 2 + rank, -1)
        b.union_tracks(PID_DECODE, tid, d_start, done, "rank busy")

    # storage nodes: recorded busy periods
    if src.storage is not None:
        b.process(PID_STORAGE, "storage nodes")
        for n in range(src.storage_nodes):
            g = n // src.storage_width if src.storage_width else 0
            b.thread(PID_STORAGE, n + 1, f"storage node {n} (group {g})")
        if src.storage:
            a = np.asarray(src.storage, dtype=np.float64)
            b.add(
                _Spans(
                    PID_STORAGE, a[:, 0].astype(np.int64) + 1, a[:, 1], a[:, 2], "node activity",
                    {"reads": a[:, 3].astype(np.int64), "writes": a[:, 4].astype(np.int64),
                     "bytes": a[:, 5], "busy_ms": a[:, 6] * 1e3},
                )
            )  # fmt: skip

    # requests: a sample, async spans with nested stages, and flows across the tracks
    b.process(PID_REQUESTS, "requests (sample)")
    b.thread(PID_REQUESTS, 1, "requests")
    last = np.fmax.reduce([arrival, p_start, p_end, first, d_start, done])
    last = np.where(np.isfinite(last), last, arrival)
    open_end = np.where(np.isfinite(done), done, np.fmax(last, src.end_s))
    alive = (arrival <= b.hi) & (open_end >= b.lo)
    sample = _sample(np.flatnonzero(alive), opt.max_requests)
    per_request = _request_events(b, req, sample, open_end, steps, per)
    return _assemble(b, per_request, len(sample), int(alive.sum()))


def _request_events(
    b: _Builder,
    req: pd.DataFrame,
    sample: np.ndarray,
    open_end: np.ndarray,
    steps: list[tuple[np.ndarray, np.ndarray]],
    per: int,
) -> list[list[dict[str, Any]]]:
    """Per sampled request: its async span, nested stage spans and its flow events."""
    lo, hi = b.lo, b.hi
    f = {k: req[k].to_numpy(dtype=np.float64)[sample].tolist() for k in _FLOAT_COLS}
    i = {k: req[k].to_numpy(dtype=np.int64)[sample].tolist() for k in _INT_COLS}
    text = {k: req[k].astype(str).to_numpy()[sample].tolist() for k in _TEXT_COLS}
    out: list[list[dict[str, Any]]] = []
    clip = lambda t: min(max(t, lo), hi)  # noqa: E731
    for j, (rid, end) in enumerate(zip(sample.tolist(), open_end[sample].tolist(), strict=True)):
        r = {k: v[j] for k, v in f.items()}
        a, vis = r["arrival_s"], r["t_vision_done_s"]
        ps, pe, ft = r["t_prefill_start_s"], r["t_prefill_end_s"], r["t_first_token_s"]
        ds, dn = r["t_decode_start_s"], r["t_done_s"]
        stages = [
            ("vision", a, vis),
            ("queue", vis if vis == vis else a, ps),
            ("prefill", ps, pe),
            ("transfer", pe, ft),
            ("decode queue", ft, ds),
            ("decode", ds, dn),
        ]
        base = {"cat": "request", "id": f"0x{rid:x}", "pid": PID_REQUESTS, "tid": 1}
        args: dict[str, Any] = {"request": rid}
        args.update({k: v[j] for k, v in text.items()})
        args.update({k: v[j] for k, v in i.items()})
        args.update({k: _num(r[k]) for k in ("ttft_s", "tpot_s", "e2e_s")})
        if args["state"] != "rejected":
            del args["reject_reason"]
        name = f"request {rid}"
        evs = [{**base, "ph": "b", "name": name, "ts": _us(clip(a)), "args": args}]
        for stage, s, e in stages:
            if not (s == s and e == e) or e < lo or s > hi:
                continue
            evs.append({**base, "ph": "b", "name": stage, "ts": _us(clip(s))})
            evs.append({**base, "ph": "e", "name": stage, "ts": _us(clip(e))})
        evs.append({**base, "ph": "e", "name": name, "ts": _us(clip(end))})
        inst, g = i["prefill_instance"][j], i["decode_group"][j]
        evs.extend(_flow(rid, inst, g, r, steps, per, lo, hi))
        out.append(evs)
    return out


def _flow(
    rid: int,
    inst: int,
    g: int,
    r: dict[str, float],
    steps: list[tuple[np.ndarray, np.ndarray]],
    per: int,
    lo: float,
    hi: float,
) -> list[dict[str, Any]]:
    """Prefill instance → P→D link → decode group, each point inside a span of its track (the
    midpoint of the request's interval there; with step records, of its first decode step)."""
    ps, pe, ft = r["t_prefill_start_s"], r["t_prefill_end_s"], r["t_first_token_s"]
    ds, dn = r["t_decode_start_s"], r["t_done_s"]
    if inst < 0 or g < 0 or not (ps == ps and pe == pe and ds == ds and dn == dn):
        return []
    t_dec = (ds + dn) / 2
    if steps:
        start, end = steps[g]
        k = int(np.searchsorted(start, ds + 1e-9, side="right")) - 1
        if 0 <= k < start.size and end[k] > ds:
            t_dec = float(start[k] + end[k]) / 2
    points = [("s", PID_PREFILL, inst + 1, (ps + pe) / 2)]
    if r["transfer_bytes"] > 0 and ft == ft and ft > pe:
        points.append(("t", PID_LINKS, inst + 1, (pe + ft) / 2))
    points.append(("f", PID_DECODE, g * per + 1, t_dec))
    if any(not (lo <= t <= hi) for _, _, _, t in points):
        return []
    out = []
    for ph, pid, tid, t in points:
        ev = {"ph": ph, "cat": "flow", "name": "request", "id": rid, "pid": pid, "tid": tid,
              "ts": _us(t)}  # fmt: skip
        if ph == "f":
            ev["bp"] = "e"
        out.append(ev)
    return out


def _assemble(
    b: _Builder, per_request: list[list[dict[str, Any]]], sampled: int, alive: int
) -> dict[str, Any]:
    """Metadata, then track spans, then request events, within ``max_events``: whole requests
    are dropped from the end of the sample first when they alone overflow, then track spans
    past a time cut-off (every track is complete up to it)."""
    opt, src = b.opt, b.src
    room = max(0, opt.max_events - len(b.meta))
    request_events: list[dict[str, Any]] = []
    dropped_requests = 0
    for i, evs in enumerate(per_request):
        if len(request_events) + len(evs) > room:
            dropped_requests = len(per_request) - i
            break
        request_events.extend(evs)
    budget = room - len(request_events)
    # storage spans (the most numerous, the least looked at) give way first, then the rest;
    # within a tier the spans past a time cut-off go, so every track is complete up to it
    cutoff = {PID_STORAGE: math.inf, 0: math.inf}
    dropped = {PID_STORAGE: 0, 0: 0}
    tier = lambda sp: PID_STORAGE if sp.pid == PID_STORAGE else 0  # noqa: E731
    for t in (0, PID_STORAGE):
        starts = [sp.start for sp in b.spans if tier(sp) == t]
        st = np.concatenate(starts) if starts else np.zeros(0)
        if st.size > budget:
            cutoff[t] = float(np.partition(st, budget)[budget])
        kept = int((st < cutoff[t]).sum())
        dropped[t] = st.size - kept
        budget -= kept
    events: list[dict[str, Any]] = list(b.meta)
    for sp in b.spans:
        sel = np.flatnonzero(sp.start < cutoff[tier(sp)])
        t0 = np.round(sp.start[sel] * _US, 3)
        dur = np.maximum(np.round(sp.end[sel] * _US, 3) - t0, 0.0).round(3).tolist()
        ts, tids = t0.tolist(), sp.tid[sel].tolist()
        argcols = {k: [_num(x) for x in v[sel]] for k, v in sp.args.items()}
        for j in range(sel.size):
            events.append(
                {"ph": "X", "name": sp.name, "pid": sp.pid, "tid": tids[j], "ts": ts[j],
                 "dur": dur[j], "args": {k: v[j] for k, v in argcols.items()}}
            )  # fmt: skip
    truncated: dict[str, Any] | None = None
    if dropped_requests or dropped[0] or dropped[PID_STORAGE]:
        truncated = {"max_events": opt.max_events, "requests_dropped": dropped_requests}
        if dropped[PID_STORAGE]:
            truncated["storage_spans_dropped"] = dropped[PID_STORAGE]
            truncated["storage_complete_until_s"] = cutoff[PID_STORAGE]
        if dropped[0]:
            truncated["engine_and_link_spans_dropped"] = dropped[0]
            truncated["engine_and_link_complete_until_s"] = cutoff[0]
    if math.isfinite(cutoff[0]):  # a flow needs a span to bind to at each of its points
        cut_us = cutoff[0] * _US
        late = {e["id"] for e in request_events if e["cat"] == "flow" and e["ts"] >= cut_us}
        request_events = [e for e in request_events if e["cat"] != "flow" or e["id"] not in late]
    events.extend(request_events)
    other: dict[str, Any] = {
        "generator": "deepinfer-sim timeline",
        "scenario": src.scenario,
        "built_from": src.source,
        "window_s": [b.lo, b.hi],
        "requests_sampled": sampled - dropped_requests,
        "requests_in_window": alive,
        "max_requests": opt.max_requests,
        "max_events": opt.max_events,
        "events": len(events),
        "prefill_tracks": "busy periods (reconstructed from requests)",
        "decode_tracks": "engine steps" if src.decode_steps is not None else "busy periods",
        "storage_tracks": "busy periods" if src.storage is not None else "not recorded",
    }
    if src.storage_dropped:
        other["storage_periods_dropped"] = src.storage_dropped
    if truncated is not None:
        other["truncated"] = truncated
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_timeline(trace: dict[str, Any], path: str | Path) -> Path:
    """Write compact JSON, atomically (sim/results/files.py: a failure, a full disk say, is one
    OutputError naming the file and the space it needs, and leaves no temporary file)."""
    from .files import write_json

    return write_json(path, lambda f: json.dump(trace, f, separators=(",", ":"), allow_nan=False))


def timeline_of_run_dir(
    run_dir: str | Path, out: str | Path, options: TimelineOptions | None = None
) -> dict[str, Any]:
    trace = build_timeline(sources_from_run_dir(run_dir), options)
    write_timeline(trace, out)
    return trace


def simulate_with_timeline(
    simulate: Callable[..., Result], *args: Any, options: TimelineOptions, **kwargs: Any
) -> tuple[Result, dict[str, Any]]:
    """``simulate(*args, **kwargs)`` with a timeline captured from the run in memory."""
    cap = TimelineCapture(options)
    result = simulate(*args, on_build=cap.on_build, **kwargs)
    return result, build_timeline(cap.sources(result), options)
