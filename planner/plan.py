"""The capacity planner: the cheapest deployment that serves a workload within its SLOs.

A *shape* is one replicable unit: ``prefill_instances`` prefill instances of EP ``prefill_ep``
plus one decode group of EP ``decode_ep`` (and the scenario's vision encoders and storage). For
each shape the planner finds the largest request rate the unit sustains within the SLOs — p99
TTFT ≤ ``slo.ttft_s``, p99 TPOT ≤ ``slo.tpot_s`` (and ≤ 1 / ``slo.min_user_tok_s``), p99 E2E ≤
``slo.e2e_s`` when set, nothing
rejected — by bisection on load, each probe a full simulation of the workload's first
``planner.probe_requests`` requests replayed at that rate (the method of Vidur-Search and
DistServe). The target rate then needs ``ceil(target / (headroom × sustainable))`` replicas;
one more simulation at the per-replica rate gives the latencies at the operating point.

Shapes are tried cheapest-bound first: a shape whose cost at its cost-model rate bound
(planner/bounds.py) already exceeds the best simulated deployment is pruned unsimulated.
Storage nodes are sized from the one-pass TTL sweep at the scenario's TTLs, scaled to the
target rate. Shapes run in parallel worker processes.

Progress on disk, and resume: every probe and operating point is appended, as it finishes, to
``<probes_dir>/<shape slug>.jsonl`` (by default ``probes/`` beside ``runs_dir``: the CLI's
``plan/probes/``), keyed by a hash of the probe's fully resolved scenario. A re-run with the same
config reads those lines and simulates only the probes not there yet (an edited config or
``--set`` changes the hash and runs them again); a line cut short by a kill is ignored.

A shape whose worker process dies (the out-of-memory killer) is evaluated again in a fresh
worker ``retries`` times — its finished probes come from the log — then recorded ``error``
with the exit status; the other shapes go on (planner/executors.py). Each shape counts the
simulations it found done in the log (``from_log``), so a resumed plan can say so.

One scenario for the whole search: the scenario file is read once, at the start, into a
:class:`~.snapshot.Snapshot` (the resolved scenario, ``--set`` applied; planner/snapshot.py,
shared with ``sweep grid``); every shape, probe and operating point is cut from it, in the
workers too, never from the file again. Editing the file while a plan runs changes nothing in
that plan.

A search with a failed shape (``error``: a crash, a dead worker, an output it could not write)
is *incomplete*: :meth:`Plan.why` says so, names the failed shapes and whether one of them could
have been cheaper than the recommendation (its cost at its rate bound), and the CLI exits 1, as
``sweep grid`` does for a failed point.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from hashlib import sha1
from pathlib import Path
from typing import Any

from ..scenario import Scenario, dump_scenario
from ..sim.results.files import OutputError, output_error
from ..sim.results.report_numbers import MISS_ORDER, slo_checks
from ..sim.run import simulate
from ..traces.workload import build_source
from .analysis.storage_sizing import nodes_for, ttl_report
from .bounds import WorkloadStats, rate_bound
from .executors import Failed, WorkerPool, ray_context
from .snapshot import Snapshot, snapshot_of  # Snapshot is imported from here too (cli.py)


@dataclass(frozen=True)
class Shape:
    prefill_ep: int
    prefill_instances: int
    decode_ep: int

    def overrides(self) -> list[str]:
        return [
            f"pools.prefill.ep={self.prefill_ep}",
            f"pools.prefill.instances={self.prefill_instances}",
            f"pools.decode.ep={self.decode_ep}",
            "pools.decode.groups=1",
        ]

    @property
    def label(self) -> str:
        return f"{self.prefill_instances}xEP{self.prefill_ep} + EP{self.decode_ep}"

    @property
    def slug(self) -> str:
        return f"p{self.prefill_instances}x{self.prefill_ep}-d{self.decode_ep}"


OUTPUT_ERROR = "cannot write its results: "
"""How a shape's error starts when an output could not be written (not the shape's fault)."""


@dataclass
class ShapeResult:
    shape: Shape
    bound_rps: float
    unit_gpus: int
    unit_usd_h: float
    status: str = "pending"  # feasible | infeasible | pruned | error
    sustainable_rps: float = 0.0
    limited_by: str = ""
    probes: list[dict[str, Any]] = field(default_factory=list)
    replicas: int = 0
    usd_h: float = math.inf
    usd_per_mtok_output: float = math.inf
    ttft_p99_s: float = math.nan
    tpot_p99_s: float = math.nan
    revenue_per_gpu_hour_usd: float = math.nan
    error: str = ""
    run_dir: str = ""  # the operating point's run (summary, requests, time series)
    from_log: int = 0  # simulations (probes, operating point) found done in the probe log
    simulated: int = 0  # simulations run this time

    def row(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("shape", "probes")}
        return {"shape": self.shape.label, **asdict(self.shape), **out}


def max_sustainable_rate(
    meets: Callable[[float], bool], hi: float, steps: int, lo: float = 0.0
) -> float:
    """Largest rate in [lo, hi] with ``meets(rate)``, by bisection (``meets`` monotone: true
    below the answer, false above). Returns ``lo`` when even the first probe fails."""
    if meets(hi):
        return hi
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo


def slo_failure(summary: dict[str, Any], sc: Scenario) -> str:
    """'' when the run met the SLOs, else the first it missed in ``MISS_ORDER``: the rule the
    report shows (``report_numbers.slo_checks``)."""
    missed = {c.key for c in slo_checks(summary, sc.slo.model_dump()) if not c.met}
    return next((k for k in MISS_ORDER if k in missed), "")


def unit_cost(sc: Scenario) -> tuple[int, float]:
    """(GPUs, $/h) of one unit without storage."""
    return sc.pools.gpus, sc.gpu_usd_per_hour()


@dataclass(frozen=True)
class ProbeBase:
    """How to cut a probe of a given rate from the workload: its requests at rate scale 1.
    Every scenario comes from ``snapshot`` (``overrides``: the ``--set`` it already holds, kept
    to say what the plan was asked)."""

    overrides: tuple[str, ...]
    requests: int  # of the workload without max_requests / repeat
    rate_rps: float  # its mean arrival rate at the scenario's rate_scale
    snapshot: Snapshot

    def shaped(self, shape: Shape) -> Scenario:
        return self.snapshot.scenario(shape.overrides())

    def scenario(self, config: str, shape: Shape, rate: float) -> Scenario:
        sc = self.shaped(shape)
        need = max(sc.planner.probe_min_requests, math.ceil(rate * sc.planner.probe_seconds))
        if need <= self.requests:
            cut = [f"workload.max_requests={need}", "workload.repeat=1"]
        else:
            cut = [f"workload.repeat={math.ceil(need / self.requests)}"]
        scale = sc.workload.rate_scale * rate / self.rate_rps
        return self.snapshot.scenario([*shape.overrides(), *cut, f"workload.rate_scale={scale}"])


class ProbeLog:
    """One shape's finished probes, one JSON line each in ``path`` (None: kept nowhere).

    A line is ``{"kind": "probe" | "operating_point", "scenario_hash": ..., <numbers>}``; the
    hash is of the probe's fully resolved scenario, so a line answers only the same simulation.
    Lines are appended and flushed as each probe ends; one cut short by a kill is skipped.
    """

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self.done: dict[tuple[str, str], dict[str, Any]] = {}
        if self.path is None or not self.path.is_file():
            return
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and {"kind", "scenario_hash"} <= rec.keys():
                self.done[(rec["kind"], rec["scenario_hash"])] = rec

    @staticmethod
    def key(sc: Scenario) -> str:
        return sha1(dump_scenario(sc).encode()).hexdigest()

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        return self.done.get((kind, key))

    def add(self, kind: str, key: str, values: dict[str, Any]) -> None:
        rec = {"kind": kind, "scenario_hash": key, **values}
        self.done[(kind, key)] = rec
        if self.path is None:
            return
        line = json.dumps({**rec, "finished_at": datetime.now(UTC).isoformat()}) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as f:
                end = f.tell()
                try:
                    f.write(line.encode())
                    f.flush()
                    os.fsync(f.fileno())
                except OSError:  # no half line for the next one to be glued to
                    with contextlib.suppress(OSError):
                        f.truncate(end)
                    raise
        except OSError as exc:
            raise output_error(self.path, exc, lambda: len(line.encode())) from None


def evaluate_shape(
    config: str,
    base: ProbeBase,
    shape: Shape,
    hi: float,
    target: float,
    runs_dir: str | None = None,
    probes_file: str | None = None,
) -> ShapeResult:
    """Bisection for one shape, then its operating point at the target (runs in a worker);
    the operating point's full results go to ``runs_dir/<shape slug>`` when given. Probes
    already in ``probes_file`` (a :class:`ProbeLog`) are read, not simulated; new ones are
    appended as they finish. Every scenario comes from ``base.snapshot``, never from the file
    ``config`` names (only messages use it)."""
    res = ShapeResult(shape, hi, 0, math.nan)
    try:
        sc = base.shaped(shape)
        res.unit_gpus, res.unit_usd_h = unit_cost(sc)
    except Exception as exc:
        res.status, res.error = "error", f"{type(exc).__name__}: {exc}"
        return res
    plan = sc.planner
    fails: list[str] = []
    log = ProbeLog(probes_file)

    def meets(rate: float) -> bool:
        probe_sc = base.scenario(config, shape, rate)
        key = ProbeLog.key(probe_sc)
        rec = log.get("probe", key)
        if rec is not None:
            res.from_log += 1
        else:
            res.simulated += 1
            summary = simulate(probe_sc).summary
            why = slo_failure(summary, sc)
            rec = {
                "rate_rps": rate, "ok": not why, "missed": why,
                "ttft_p99_s": summary["latency"]["ttft_s"]["p99"],
                "tpot_p99_s": summary["latency"]["tpot_s"]["p99"],
            }  # fmt: skip
            log.add("probe", key, rec)
        probe = {k: rec[k] for k in ("rate_rps", "ok", "missed", "ttft_p99_s", "tpot_p99_s")}
        res.probes.append(probe)
        if probe["missed"]:
            fails.append(probe["missed"])
        return not probe["missed"]

    try:
        rate = max_sustainable_rate(meets, hi, plan.bisection_steps)
        res.sustainable_rps = rate
        res.limited_by = fails[-1] if fails else "bound"
        if rate <= 0:
            res.status = "infeasible"
            return res
        res.replicas = math.ceil(target / (rate * plan.headroom))
        op_sc = base.scenario(config, shape, target / res.replicas)
        key = ProbeLog.key(op_sc)
        if runs_dir is not None:
            res.run_dir = str(Path(runs_dir) / shape.slug)
        op = log.get("operating_point", key)
        if op is not None and res.run_dir and op.get("run_dir") != res.run_dir:
            op = None  # its run folder is elsewhere: simulate it again to have one here
        if op is not None and res.run_dir and not (Path(res.run_dir) / "summary.json").is_file():
            op = None
        if op is not None:
            res.from_log += 1
        else:
            res.simulated += 1
            result = simulate(op_sc)
            if res.run_dir:
                result.write(res.run_dir, plots=False)
            at = result.summary
            op = {
                "rate_rps": target / res.replicas,
                "run_dir": res.run_dir,
                "ttft_p99_s": at["latency"]["ttft_s"]["p99"],
                "tpot_p99_s": at["latency"]["tpot_s"]["p99"],
                "revenue_per_gpu_hour_usd": at["cost"]["revenue_per_gpu_hour_usd"],
            }
            log.add("operating_point", key, op)
        res.ttft_p99_s = op["ttft_p99_s"]
        res.tpot_p99_s = op["tpot_p99_s"]
        res.revenue_per_gpu_hour_usd = op["revenue_per_gpu_hour_usd"] or math.nan
        res.status = "feasible"
    except OutputError as exc:  # a full disk, say: the environment's, the CLI exits 2
        res.status, res.error = "error", f"{OUTPUT_ERROR}{exc}"
    except Exception as exc:  # a crashing shape is recorded, the plan goes on
        res.status, res.error = "error", f"{type(exc).__name__}: {exc}"
    return res


@dataclass
class Plan:
    target_rps: float
    storage_nodes: int
    storage_usd_h: float
    mean_output_tokens: float
    results: list[ShapeResult]

    def feasible(self) -> list[ShapeResult]:
        return sorted((r for r in self.results if r.status == "feasible"), key=lambda r: r.usd_h)

    @property
    def best(self) -> ShapeResult | None:
        ok = self.feasible()
        return ok[0] if ok else None

    def frontier(self) -> list[ShapeResult]:
        """Feasible shapes no other beats on both cost and p99 TTFT."""
        out, best_ttft = [], math.inf
        for r in self.feasible():
            if r.ttft_p99_s < best_ttft:
                out.append(r)
                best_ttft = r.ttft_p99_s
        return out

    def lower_usd_h(self, r: ShapeResult) -> float:
        """The least a deployment of ``r``'s shape can cost: enough replicas at its cost-model
        rate bound, plus storage (what pruning compares)."""
        if not r.bound_rps > 0 or not math.isfinite(r.unit_usd_h):
            return 0.0
        return math.ceil(self.target_rps / r.bound_rps) * r.unit_usd_h + self.storage_usd_h

    def failed(self) -> list[ShapeResult]:
        """Shapes whose search did not finish (an exception, a dead worker)."""
        return [r for r in self.results if r.status == "error"]

    @property
    def complete(self) -> bool:
        """Every shape was searched to the end (or pruned): no failed shape."""
        return not self.failed()

    def from_log(self) -> tuple[int, int]:
        """(simulations found done in the probe logs, simulations in all): a resumed plan's."""
        found = sum(r.from_log for r in self.results)
        return found, found + sum(r.simulated for r in self.results)

    def why(self) -> str:
        ok = self.feasible()
        failed = self.failed()
        if not ok:
            if failed and len(failed) == len(self.results):
                return (
                    f"The search is incomplete: all {len(failed)} shapes failed, so nothing is "
                    f"known about the SLOs (first error: {failed[0].error})."
                )
            if failed:
                return (
                    f"No shape that was searched met the SLOs at any load, but the search is "
                    f"incomplete: {self._failed_text(failed)}."
                )
            return "no shape met the SLOs at any load"
        best = ok[0]
        if failed:
            cheaper = [r for r in failed if self.lower_usd_h(r) < best.usd_h]
            if cheaper:
                text = (
                    f"The search is incomplete: {self._failed_text(failed)}; "
                    f"{len(cheaper)} of them could have been cheaper than "
                    f"{best.shape.label} × {best.replicas}, the cheapest of the shapes searched "
                    f"that meets the SLOs: ${best.usd_h:,.0f}/h."
                )
            else:
                text = (
                    f"The search is incomplete: {self._failed_text(failed)}; none of them could "
                    f"have been cheaper (their cost-model bounds), so "
                    f"{best.shape.label} × {best.replicas} is still the cheapest deployment "
                    f"meeting the SLOs: ${best.usd_h:,.0f}/h."
                )
        else:
            text = (
                f"{best.shape.label} × {best.replicas} is the cheapest deployment meeting the "
                f"SLOs: ${best.usd_h:,.0f}/h."
            )
        text += (
            f" One unit sustains {best.sustainable_rps:.1f} req/s "
            f"(limited by {best.limited_by}); {best.replicas} replicas at "
            f"{self.target_rps / best.replicas:.1f} req/s each."
        )
        if len(ok) > 1:
            nxt = ok[1]
            text += (
                f" Runner-up {nxt.shape.label} × {nxt.replicas} costs "
                f"{100 * (nxt.usd_h / best.usd_h - 1):.1f} % more."
            )
        pruned = sum(r.status == "pruned" for r in self.results)
        if pruned:
            text += f" {pruned} shapes were pruned by their cost-model bound."
        return text

    def _failed_text(self, failed: list[ShapeResult]) -> str:
        labels = ", ".join(r.shape.label for r in failed)
        return f"{len(failed)} of {len(self.results)} shapes failed ({labels})"

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        found, sims = self.from_log()
        return {
            "target_rps": self.target_rps,
            "storage_nodes": self.storage_nodes,
            "storage_usd_h": self.storage_usd_h,
            "complete": self.complete,
            "recommended": best.row() if best else None,
            "why": self.why(),
            "failed": {r.shape.label: r.error for r in self.failed()},
            "simulations": {"from_log": found, "total": sims},
            "frontier": [r.shape.label for r in self.frontier()],
            "shapes": [r.row() for r in self.results],
            "probes": {r.shape.label: r.probes for r in self.results},
        }


def candidate_shapes(sc: Scenario) -> list[Shape]:
    p = sc.planner
    return [
        Shape(pe, pi, de) for pe in p.prefill_ep for pi in p.prefill_instances for de in p.decode_ep
    ]


def plan(
    config: str | Path | Snapshot,
    overrides: Sequence[str] = (),
    workers: int = 1,
    progress: Callable[[ShapeResult], None] | None = None,
    runs_dir: str | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    probes_dir: str | None = None,
    retries: int = 1,
) -> Plan:
    """Search the scenario's candidate shapes (see the module notes); ``executor="ray"`` runs
    each batch of ``workers`` shapes as Ray tasks (a local instance, or ``ray_address``).

    ``config`` is a scenario file or bundled name, read once here into a :class:`Snapshot`
    (with ``overrides``), or a Snapshot already taken (``overrides`` applied on top of it: a
    what-if); nothing reads the file again.

    Each probe is appended to ``probes_dir/<shape slug>.jsonl`` as it finishes (default:
    ``probes/`` beside ``runs_dir``; nowhere when neither is given), and probes already there
    for the same resolved scenario are not simulated again: a re-run resumes. A shape whose
    worker dies is evaluated again ``retries`` times, then recorded ``error``."""
    if probes_dir is None and runs_dir is not None:
        probes_dir = str(Path(runs_dir).parent / "probes")
    snap = snapshot_of(config, overrides)
    sc = snap.scenario()
    source = build_source(sc.workload, sc.seed)
    stats = WorkloadStats.of(source)
    target = (sc.planner.target_rate_rps or stats.rate_rps) * sc.planner.traffic_scale
    whole = snap.scenario(["workload.repeat=1"])
    whole_source = build_source(whole.workload, whole.seed)
    base = ProbeBase(
        tuple(overrides), len(whole_source), WorkloadStats.of(whole_source).rate_rps, snap
    )
    storage_nodes = 0
    if sc.pools.storage.nodes:
        _, frame = ttl_report(sc, source, [1.0])
        per_class = frame[(frame["policy"] == "class_ttl") & (frame["traffic_class"] == "all")]
        need = float(per_class["peak_resident_bytes"].iloc[0]) * target / stats.rate_rps
        storage_nodes = max(sc.pools.storage.width, nodes_for(sc.pools.storage, need))
    storage_usd_h = storage_nodes * sc.prices.storage_node_hour_usd
    results = []
    for shape in candidate_shapes(sc):
        shaped = base.shaped(shape)
        gpus, usd_h = unit_cost(shaped)
        bound = rate_bound(shaped, stats)
        results.append(ShapeResult(shape, bound, gpus, usd_h))
    # cheapest possible deployment first: enough replicas at the bound
    results.sort(key=lambda r: math.ceil(target / r.bound_rps) * r.unit_usd_h)
    best_usd = math.inf
    stack = contextlib.ExitStack()
    ray = stack.enter_context(ray_context(workers, ray_address)) if executor == "ray" else None
    pool = WorkerPool(workers) if workers > 1 and ray is None else None
    try:
        pending = list(results)
        while pending:
            batch: list[ShapeResult] = []
            while pending and len(batch) < workers:
                r = pending.pop(0)
                lower = math.ceil(target / r.bound_rps) * r.unit_usd_h + storage_usd_h
                if lower >= best_usd:
                    r.status = "pruned"
                    if progress:
                        progress(r)
                    continue
                batch.append(r)
            args: list[tuple[Any, ...]]
            args = [(snap.source, base, r.shape, r.bound_rps, target, runs_dir) for r in batch]
            if probes_dir is not None:  # (added only when set: test doubles take six arguments)
                args = [
                    (*a, str(Path(probes_dir) / f"{r.shape.slug}.jsonl"))
                    for a, r in zip(args, batch, strict=True)
                ]
            if ray is not None:
                remote = ray.remote(num_cpus=1, max_retries=retries)(evaluate_shape)
                done = ray.get([remote.remote(*a) for a in args])
            elif pool is not None:
                done = list(batch)
                keys = [r.shape.slug for r in batch]
                for i, out, _ in pool.imap(evaluate_shape, args, keys, retries):
                    if isinstance(out, Failed):  # its worker died (out of memory?)
                        out = replace(batch[i], status="error", error=str(out))
                    done[i] = out
            else:
                done = [evaluate_shape(*a) for a in args]
            for r, d in zip(batch, done, strict=True):
                if d.status == "error" and not math.isfinite(d.unit_usd_h):
                    d = replace(d, unit_gpus=r.unit_gpus, unit_usd_h=r.unit_usd_h)
                idx = results.index(r)
                results[idx] = d
                if d.status == "feasible":
                    d.usd_h = d.replicas * d.unit_usd_h + storage_usd_h
                    out_tok_h = target * stats.output_tokens * 3600 / 1e6
                    d.usd_per_mtok_output = d.usd_h / out_tok_h
                    best_usd = min(best_usd, d.usd_h)
                if progress:
                    progress(d)
    finally:
        if pool is not None:
            pool.close()
        stack.close()
    return Plan(target, storage_nodes, storage_usd_h, stats.output_tokens, results)
