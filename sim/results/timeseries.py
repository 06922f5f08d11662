"""Time series of a run: one sample per interval of simulated time (one event per sample).

Each sample records cumulative counts, queue depths, utilization over the last interval and
token rates, so ``timeseries.parquet`` shows how the cluster filled, saturated and drained.

Utilization is an engine's busy time inside the interval (a step still running at the sample
counts up to the sample, the rest in the next interval) over the interval times the engines, so
it never exceeds 1. A rate with nothing to divide (the prefix hit rate of an interval in which no
prompt was looked up, the expert imbalance of one in which no step ran) is NaN, not 0. The same
samples give the run's queue-depth statistics (:meth:`queue_stats`).

Under aggregated serving ``prefill_util`` and ``decode_util`` are the shares of the interval
its instances spent in steps that carried prefill chunks and decode sequences, and
``aggregated_util`` the share they spent stepping.

Every number comes from a component's own ``report()`` (the engines', the prefill path's with the
store's, the links') and the requests table; a sample asks each component once.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.requests import State
from .columns import Columns
from .reports import Report, Reports

if TYPE_CHECKING:
    from ..core.cluster import Cluster


def _factor_sums(pool: str, groups: list[Report | None]) -> dict[str, float]:
    live = [e for e in groups if e is not None]
    return {
        f"{pool}_eplb_sum": sum(e["factor_sum"] for e in live),
        f"{pool}_eplb_steps": sum(e["factor_steps"] for e in live),
    }


def _busy(engines: list[Report], kind: str = "") -> float:
    """Stepping seconds so far; ``kind`` ``prefill_`` / ``decode_``: an aggregated instance's
    steps that carried prefill chunks / decode sequences."""
    return sum(e[f"{kind}busy_s"] + e[f"{kind}stepping_s"] for e in engines)


# summary queue name -> time-series column (prefill: prompts on the instances, queued or being
# computed; transfer: P->D flows in flight; decode: requests waiting for a slot on their rank;
# decode_parked: requests waiting for a repair because every decode rank is down)
_QUEUES = {
    "vision": "vision_queue",
    "prefill": "prefill_queue",
    "transfer": "transfers_in_flight",
    "decode": "decode_waiting",
    "decode_parked": "decode_parked",
}


class ColumnLog:
    """Rows of named numbers kept as typed columns: 8 bytes a value instead of a dict per row.

    A column of ints is int64 until a float comes (then float64), a column of floats float64, as
    pandas infers them from the rows; a column of anything else (bools) stays a list."""

    def __init__(self) -> None:
        self.columns: dict[str, array[Any] | list[Any]] = {}
        self.rows = 0

    def append(self, row: dict[str, Any]) -> None:
        if not self.columns:
            self.columns = {k: _column_for(v) for k, v in row.items()}
        for key, value in row.items():
            col = self.columns[key]
            if isinstance(col, array) and col.typecode == "q" and not _is_int(value):
                col = self.columns[key] = array("d", col) if _is_float(value) else list(col)
            col.append(value)
        self.rows += 1

    def column(self, key: str) -> np.ndarray:
        col = self.columns[key]
        if isinstance(col, array):
            return np.array(col, dtype=np.int64 if col.typecode == "q" else np.float64)
        return np.asarray(col)

    def table(self) -> Columns:
        return Columns({key: self.column(key) for key in self.columns})  # no rows: no columns


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _is_float(value: Any) -> bool:
    return isinstance(value, float | np.floating)


def _column_for(value: Any) -> array[Any] | list[Any]:
    if _is_int(value):
        return array("q")
    return array("d") if _is_float(value) else []


class TimeseriesSampler:
    def __init__(self, cl: Cluster, interval_s: float) -> None:
        self.cl = cl
        self.interval = interval_s
        self.log = ColumnLog()
        self.kv = cl.path.kv if cl.path is not None else None
        self.aggregated = cl.sc.aggregated  # prefill_util / decode_util: the two sides of one pool
        self.read_gbps_peak = 0.0
        self._prev = self._counters(Reports.of(cl))
        cl.env.process(self._run())

    def _counters(self, s: Reports) -> dict[str, float]:
        path = s.path
        store = path["storage"] if path is not None else None
        sides = ("prefill_", "decode_") if self.aggregated else ("", "")
        counters = {
            "t": self.cl.env.now,
            "prefill_busy": _busy(s.prefill, sides[0]),
            "decode_busy": _busy(s.decode, sides[1]),
            "vision_busy": _busy(s.vision),
            "prefill_tokens": sum(p["compute_tokens"] for p in s.prefill),
            "hit_tokens": path["hit_tokens"] if path else 0,
            "lookup_tokens": path["lookup_tokens"] if path else 0,
            "output_tokens": sum(g["tokens_out"] for g in s.decode),
            "storage_read_bytes": store["read_bytes"] if store is not None else 0.0,
            **_factor_sums("prefill", s.prefill_experts),
            **_factor_sums("decode", [g["experts"] for g in s.decode]),
        }
        if self.aggregated:
            counters["aggregated_busy"] = _busy(s.decode)
        return counters

    def _run(self):
        while True:
            yield self.cl.env.timeout(self.interval)
            self.sample()

    def sample(self) -> None:
        cl = self.cl
        s = Reports.of(cl)
        now = self._counters(s)
        dt = now["t"] - self._prev["t"]
        if dt <= 0:
            return
        states = np.bincount(cl.table.state, minlength=len(State))
        pools = cl.sc.pools
        prefill_engines, decode_engines = pools.prefill.instances, pools.decode.groups
        if pools.aggregated is not None and self.aggregated:
            prefill_engines = decode_engines = pools.aggregated.instances
        batches = np.concatenate([g["batch"] for g in s.decode])
        reserved = np.concatenate([g["reserved"] for g in s.decode])

        def util(key: str, units: int) -> float:
            # <= 1 by construction; min() only absorbs float round-off of step end times
            return min(1.0, (now[key] - self._prev[key]) / (dt * units)) if units else 0.0

        row = {
            "t_s": now["t"],
            "arrived": cl.arrived,
            "completed": int(states[State.DONE]),
            "rejected": int(states[State.REJECTED]),
            "vision_queue": sum(v["queued"] for v in s.vision),
            "prefill_queue": sum(p["queued"] for p in s.prefill),
            "transfers_in_flight": sum(link.report()["active"] for link in cl.links),
            "decode_waiting": sum(g["waiting"] for g in s.decode),
            "decode_running": sum(g["running"] for g in s.decode),
            "decode_parked": len(cl.parked),
            "decode_batch_mean": float(batches.mean()),
            "decode_batch_max": int(batches.max()),
            "decode_kv_reserved_frac": float(reserved.mean() / cl.kv_capacity_tokens),
            "vision_util": util("vision_busy", pools.vision.instances),
            "prefill_util": util("prefill_busy", prefill_engines),
            "decode_util": util("decode_busy", decode_engines),
            "prefill_tok_per_s": (now["prefill_tokens"] - self._prev["prefill_tokens"]) / dt,
            "output_tok_per_s": (now["output_tokens"] - self._prev["output_tokens"]) / dt,
            "prefill_imbalance": self._imbalance("prefill", now),
            "decode_imbalance": self._imbalance("decode", now),
            "prefix_hit_rate": self._hit_rate(now),
            **self._storage(now, dt),
        }
        if self.aggregated:
            row["aggregated_util"] = util("aggregated_busy", decode_engines)
        self.log.append(row)
        self._prev = now

    def _storage(self, now: dict[str, float], dt: float) -> dict[str, float]:
        kv = self.kv
        if kv is None:
            return {}
        kv.expire(now["t"])  # the sweep lookups leave to writes: count what is still live
        held = kv.report()
        gbps = (now["storage_read_bytes"] - self._prev["storage_read_bytes"]) / dt / 1e9
        self.read_gbps_peak = max(self.read_gbps_peak, gbps)
        return {
            "storage_used_frac": held["used_fraction"],
            "storage_blocks": float(held["blocks_held"]),
            "storage_read_gbps": gbps,
            "storage_failed_nodes": float(kv.nodes.report()["failed_nodes"]),
        }

    def _hit_rate(self, now: dict[str, float]) -> float:
        """Prefix-cache hits over the prompt tokens looked up in the interval (NaN: none were)."""
        looked_up = now["lookup_tokens"] - self._prev["lookup_tokens"]
        if looked_up <= 0:
            return float("nan")
        return (now["hit_tokens"] - self._prev["hit_tokens"]) / looked_up

    def _imbalance(self, pool: str, now: dict[str, float]) -> float:
        """Mean expert-imbalance factor of the pool's steps in the interval (NaN: none ran)."""
        steps = now[f"{pool}_eplb_steps"] - self._prev[f"{pool}_eplb_steps"]
        if steps <= 0:
            return float("nan")
        return (now[f"{pool}_eplb_sum"] - self._prev[f"{pool}_eplb_sum"]) / steps

    def table(self) -> Columns:
        return self.log.table()

    def queue_stats(self) -> dict[str, dict[str, float]]:
        """Queue depth per pool over the run's samples (one every ``interval``): mean, p99 and
        max. Depths between samples are not seen, so ``max`` is the largest sampled depth."""
        out = {}
        for pool, col in _QUEUES.items():
            depth = self.log.column(col).astype(np.float64) if self.log.rows else np.zeros(0)
            if depth.size == 0:
                depth = np.zeros(1)
            out[pool] = {
                "mean": float(depth.mean()),
                "p99": float(np.percentile(depth, 99)),
                "max": float(depth.max()),
            }
        return out
