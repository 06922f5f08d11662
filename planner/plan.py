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
import itertools
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
from .bounds import WorkloadStats, unit_rate_bound
from .executors import Failed, WorkerPool, ray_context
from .grid import inline_yaml
from .snapshot import Snapshot, snapshot_of  # Snapshot is imported from here too (cli.py)


@dataclass(frozen=True)
class Shape:
    """One replicable unit: ``prefill_instances`` prefill instances of EP ``prefill_ep`` and one
    decode group of EP ``decode_ep`` (``kind`` disaggregated), or one aggregated instance of
    ``prefill_ep`` GPUs (``kind`` aggregated; the other two unused); ``extra``: the
    ``planner.vary`` settings of this point of the search (``key=value`` overrides)."""

    prefill_ep: int
    prefill_instances: int
    decode_ep: int
    kind: str = "disaggregated"
    extra: tuple[str, ...] = ()

    def overrides(self) -> list[str]:
        if self.kind == "aggregated":
            pools = [
                "serving=aggregated",
                f"pools.aggregated.ep={self.prefill_ep}",
                "pools.aggregated.instances=1",
            ]
        else:
            pools = [
                f"pools.prefill.ep={self.prefill_ep}",
                f"pools.prefill.instances={self.prefill_instances}",
                f"pools.decode.ep={self.decode_ep}",
                "pools.decode.groups=1",
            ]
        return [*pools, *self.extra]

    def deployment(self, replicas: int) -> list[str]:
        """Overrides of the whole deployment: ``replicas`` copies of this unit."""
        if self.kind == "aggregated":
            return [*self.overrides(), f"pools.aggregated.instances={replicas}"]
        return [
            *self.overrides(),
            f"pools.prefill.instances={self.prefill_instances * replicas}",
            f"pools.decode.groups={replicas}",
        ]

    @property
    def label(self) -> str:
        if self.kind == "aggregated":
            base = f"agg EP{self.prefill_ep}"
        else:
            base = f"{self.prefill_instances}xEP{self.prefill_ep} + EP{self.decode_ep}"
        return " ".join([base, *(_short(e) for e in self.extra)])

    @property
    def slug(self) -> str:
        if self.kind == "aggregated":
            base = f"a{self.prefill_ep}"
        else:
            base = f"p{self.prefill_instances}x{self.prefill_ep}-d{self.decode_ep}"
        if not self.extra:
            return base
        return f"{base}-{sha1(' '.join(self.extra).encode()).hexdigest()[:8]}"


def _short(override: str) -> str:
    """``pools.decode.two_batch_overlap=false`` as ``decode.two_batch_overlap=false``."""
    key, _, value = override.partition("=")
    return f"{key.removeprefix('pools.').removeprefix('policies.')}={value}"


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
    rate_rps: float = 0.0  # what the deployment serves: the target, or within a GPU budget
    storage_nodes: int = 0
    tok_s_per_user: float = math.nan  # at the operating point: 1 / mean TPOT
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
    gpu_budget: int | None = None  # plan --gpus: replicas fill the budget, no target rate

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
        if base.gpu_budget is not None:
            res.replicas = base.gpu_budget // res.unit_gpus
            per_replica = rate * plan.headroom
        else:
            res.replicas = math.ceil(target / (rate * plan.headroom))
            per_replica = target / res.replicas
        res.rate_rps = per_replica * res.replicas
        op_sc = base.scenario(config, shape, per_replica)
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
                "rate_rps": per_replica,
                "run_dir": res.run_dir,
                "ttft_p99_s": at["latency"]["ttft_s"]["p99"],
                "tpot_p99_s": at["latency"]["tpot_s"]["p99"],
                "tpot_mean_s": at["latency"]["tpot_s"]["mean"],
                "missed": slo_failure(at, sc),
                "revenue_per_gpu_hour_usd": at["cost"]["revenue_per_gpu_hour_usd"],
            }
            log.add("operating_point", key, op)
        res.ttft_p99_s = op["ttft_p99_s"]
        res.tpot_p99_s = op["tpot_p99_s"]
        if op.get("missed"):  # the rate it claims must hold too (a probe's noise, say)
            res.status, res.limited_by = "infeasible", f"operating point: {op['missed']}"
            return res
        tpot = op.get("tpot_mean_s") or math.nan  # (logs of older versions lack it)
        res.tok_s_per_user = 1.0 / tpot if tpot > 0 else math.nan
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
    gpu_budget: int | None = None  # plan --gpus: the highest rate within it, not the cheapest
    front: list[Any] = field(default_factory=list)  # front.FrontPoint: the search space's front

    def feasible(self) -> list[ShapeResult]:
        """Shapes that met the SLOs, best first: the cheapest for the target rate, or within a
        GPU budget the highest rate (then the cheapest per token)."""
        ok = [r for r in self.results if r.status == "feasible"]
        if self.gpu_budget is not None:
            return sorted(ok, key=lambda r: (-r.rate_rps, r.usd_per_mtok_output))
        return sorted(ok, key=lambda r: r.usd_h)

    @property
    def best(self) -> ShapeResult | None:
        ok = self.feasible()
        return ok[0] if ok else None

    def frontier(self) -> list[ShapeResult]:
        """Feasible shapes no other beats on both cost and p99 TTFT."""
        out, best_ttft = [], math.inf
        for r in sorted(self.feasible(), key=lambda r: r.usd_h):
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
            over = [r for r in self.results if r.status == "over_budget"]
            if over and len(over) == len(self.results):
                smallest = min(r.unit_gpus for r in over)
                return (
                    f"every shape needs more GPUs than the budget of {self.gpu_budget} "
                    f"(the smallest, {smallest})"
                )
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
        if self.gpu_budget is not None:
            return self._why_within_budget(best, failed)
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

    def _why_within_budget(self, best: ShapeResult, failed: list[ShapeResult]) -> str:
        gpus = best.replicas * best.unit_gpus
        text = (
            f"{best.shape.label} × {best.replicas} ({gpus} of {self.gpu_budget} GPUs) serves the "
            f"highest rate within the budget meeting the SLOs: {best.rate_rps:.1f} req/s "
            f"({best.replicas} × {best.rate_rps / best.replicas:.1f} req/s, "
            f"{self._headroom_text(best)}), ${best.usd_h:,.0f}/h, "
            f"${best.usd_per_mtok_output:.2f}/M output tokens."
        )
        if failed:
            higher = [
                r
                for r in failed
                if ((self.gpu_budget or 0) // max(r.unit_gpus, 1)) * r.bound_rps > best.rate_rps
            ]
            text = (
                f"The search is incomplete: {self._failed_text(failed)}; "
                + (
                    f"{len(higher)} of them could have served more. "
                    if higher
                    else "none of them could have served more (their cost-model bounds). "
                )
                + text
            )
        pruned = sum(r.status == "pruned" for r in self.results)
        if pruned:
            text += f" {pruned} shapes were pruned by their cost-model bound."
        over = sum(r.status == "over_budget" for r in self.results)
        if over:
            text += f" {over} shapes need more GPUs than the budget."
        return text

    @staticmethod
    def _headroom_text(r: ShapeResult) -> str:
        share = r.rate_rps / (r.replicas * r.sustainable_rps) if r.sustainable_rps else math.nan
        return f"{share:.0%} of the {r.sustainable_rps:.1f} req/s one sustains"

    def _failed_text(self, failed: list[ShapeResult]) -> str:
        labels = ", ".join(r.shape.label for r in failed)
        return f"{len(failed)} of {len(self.results)} shapes failed ({labels})"

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        found, sims = self.from_log()
        return {
            "mode": "gpus" if self.gpu_budget is not None else "rate",
            "gpu_budget": self.gpu_budget,
            "target_rps": self.target_rps if self.gpu_budget is None else None,
            "storage_nodes": self.storage_nodes,
            "storage_usd_h": self.storage_usd_h,
            "complete": self.complete,
            "recommended": best.row() if best else None,
            "why": self.why(),
            "failed": {r.shape.label: r.error for r in self.failed()},
            "simulations": {"from_log": found, "total": sims},
            "frontier": [r.shape.label for r in self.frontier()],
            "front": [asdict(p) for p in self.front if p.pareto or p.simulated],
            "shapes": [r.row() for r in self.results],
            "probes": {r.shape.label: r.probes for r in self.results},
        }


def candidate_shapes(sc: Scenario) -> list[Shape]:
    """Every shape of the planner's search space: each pool kind's shapes times every
    combination of ``planner.vary``."""
    p = sc.planner
    units: list[Shape] = []
    if "disaggregated" in p.kinds:
        units += [
            Shape(pe, pi, de)
            for pe in p.prefill_ep
            for pi in p.prefill_instances
            for de in p.decode_ep
        ]
    if "aggregated" in p.kinds:
        units += [Shape(ep, 1, 0, "aggregated") for ep in p.aggregated_ep]
    shapes: list[Shape] = []
    for unit in units:
        axes = [
            [f"{key}={inline_yaml(v)}" for v in values]
            for key, values in p.vary.items()
            if _applies(key, unit.kind)
        ]
        shapes += [replace(unit, extra=tuple(combo)) for combo in itertools.product(*axes)]
    return shapes


def _applies(key: str, kind: str) -> bool:
    """Does a ``planner.vary`` key bear on a shape of ``kind``? The aggregated pool's keys only
    on aggregated shapes, the prefill and decode pools' only on disaggregated ones."""
    if key.startswith("pools.aggregated."):
        return kind == "aggregated"
    if key.startswith(("pools.prefill.", "pools.decode.")):
        return kind == "disaggregated"
    return True


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
    if executor == "ray":  # Ray tasks run in folders of their own (on other machines, too)
        runs_dir = str(Path(runs_dir).resolve()) if runs_dir is not None else None
        probes_dir = str(Path(probes_dir).resolve()) if probes_dir is not None else None
    snap = snapshot_of(config, overrides)
    sc = snap.scenario()
    budget = sc.planner.gpus
    source = build_source(sc.workload, sc.seed)
    stats = WorkloadStats.of(source)
    target = (sc.planner.target_rate_rps or stats.rate_rps) * sc.planner.traffic_scale
    whole = snap.scenario(["workload.repeat=1"])
    whole_source = build_source(whole.workload, whole.seed)
    base = ProbeBase(
        tuple(overrides), len(whole_source), WorkloadStats.of(whole_source).rate_rps, snap, budget
    )
    storage = StorageSizer.of(sc, source, stats)
    results = []
    for shape in candidate_shapes(sc):
        shaped = base.shaped(shape)
        gpus, usd_h = unit_cost(shaped)
        if budget is not None and gpus > budget:
            results.append(ShapeResult(shape, 0.0, gpus, usd_h, status="over_budget"))
            continue
        results.append(ShapeResult(shape, unit_rate_bound(shaped, stats), gpus, usd_h))
    searched = [r for r in results if r.status == "pending"]
    if budget is not None:  # the highest rate the budget could serve first
        searched.sort(key=lambda r: -(budget // r.unit_gpus) * r.bound_rps)
    else:  # the cheapest possible deployment first: enough replicas at the bound
        searched.sort(key=lambda r: math.ceil(target / r.bound_rps) * r.unit_usd_h)
    headroom = sc.planner.headroom
    best_usd, best_rate = math.inf, 0.0

    def hopeless(r: ShapeResult) -> bool:
        if budget is not None:
            return (budget // r.unit_gpus) * r.bound_rps * headroom <= best_rate
        lower = math.ceil(target / r.bound_rps) * r.unit_usd_h + storage.usd_h(target)
        return lower >= best_usd

    stack = contextlib.ExitStack()
    ray = stack.enter_context(ray_context(workers, ray_address)) if executor == "ray" else None
    pool = WorkerPool(workers) if workers > 1 and ray is None else None
    try:
        pending = list(searched)
        while pending:
            batch: list[ShapeResult] = []
            while pending and len(batch) < workers:
                r = pending.pop(0)
                if hopeless(r):
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
                refs = [remote.remote(*a) for a in args]
                done = []
                for r, ref in zip(batch, refs, strict=True):
                    try:
                        done.append(ray.get(ref))
                    except Exception as exc:  # its worker died on every try
                        why = f"ray task failed: {type(exc).__name__}: {exc}"
                        done.append(replace(r, status="error", error=why))
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
                results[results.index(r)] = d
                if d.status == "feasible":
                    if budget is None:
                        d.rate_rps = target
                    d.storage_nodes = storage.nodes(d.rate_rps)
                    d.usd_h = d.replicas * d.unit_usd_h + storage.usd_h(d.rate_rps)
                    out_tok_h = d.rate_rps * stats.output_tokens * 3600 / 1e6
                    d.usd_per_mtok_output = d.usd_h / out_tok_h
                    best_usd = min(best_usd, d.usd_h)
                    best_rate = max(best_rate, d.rate_rps)
                if progress:
                    progress(d)
    finally:
        if pool is not None:
            pool.close()
        stack.close()
    from .front import front  # (it reads Plan)

    answer = Plan(
        target, storage.nodes(target), storage.usd_h(target), stats.output_tokens, results, budget
    )
    answer.front = front(answer, base, stats)
    return answer


@dataclass(frozen=True)
class StorageSizer:
    """Storage nodes for a rate: the one-pass TTL sweep's peak resident KV at the scenario's
    TTLs, scaled from the workload's rate (no nodes when the scenario has none)."""

    pool: Any  # pools.storage
    bytes_per_rps: float
    node_usd_h: float

    @classmethod
    def of(cls, sc: Scenario, source: Any, stats: WorkloadStats) -> StorageSizer:
        per_rps = 0.0
        if sc.pools.storage.nodes:
            _, frame = ttl_report(sc, source, [1.0])
            rows = frame[(frame["policy"] == "class_ttl") & (frame["traffic_class"] == "all")]
            per_rps = float(rows["peak_resident_bytes"].iloc[0]) / stats.rate_rps
        return cls(sc.pools.storage, per_rps, sc.prices.storage_node_hour_usd)

    def nodes(self, rate_rps: float) -> int:
        if not self.pool.nodes:
            return 0
        return max(self.pool.width, nodes_for(self.pool, self.bytes_per_rps * rate_rps))

    def usd_h(self, rate_rps: float) -> float:
        return self.nodes(rate_rps) * self.node_usd_h
