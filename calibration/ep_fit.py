"""Fit the simulator's all-to-all constants from DeepEP measurements (issue 33).

    python -m deepinfer_sim.calibration.ep_fit FILE... [--hardware h200] [--json OUT]
        [--modes low_latency normal] [--bytes busiest|mean]

Reads one or more ``deepep_bench.json`` files (``kernels/deepep_bench.py``) and fits, per DeepEP
mode, ``time = latency + bytes / bandwidth`` — the form ``models/comm.py`` charges an exchange —
for the dispatch, for the combine, and for both together (one latency and one bandwidth, as the
simulator uses one per mode). ``bytes``: by default what crossed the busiest GPU port in one
direction (the slowest rank's share; a row's time is the slowest rank's), or with
``--bytes mean`` what a rank sends on average (closer to how ``AllToAll`` counts). The fit
weighs every point by its own time (least squares on relative residuals, latency and 1 /
bandwidth kept ≥ 0), so the small low-latency sizes count as much as the large ones.

Reported per mode: per-message latency, the effective NVLink bandwidth per direction and its
share of the hardware file's ``scaleup.bytes_per_s_per_dir`` — these map onto
``AllToAllParams.low_latency_scaleup_efficiency`` / ``normal_scaleup_efficiency`` and
``latency_s`` (one latency for both modes in the model: the low-latency fit's, since decode is
where it matters; the normal fit's is reported beside it) — and, from the overlap rows, the
median hidden share of the exchange under a concurrent GEMM and the GEMM's slowdown, turned into
the SM share the kernels take (``normal_sm_share``, ``low_latency_sm_share``).

Held-out check: the fits are redone on every other tokens-per-rank size (the 1st, 3rd, …) and
their error reported on the sizes left out; the issue's bar is 10 %. Bad input (a missing file,
malformed JSON, no rows for a mode) ends with one ``error:`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from ..errors import UserError

MODES = ("low_latency", "normal")
KINDS = ("dispatch", "combine")
BAR_PCT = 10.0
REQUIRED = ("mode", "tokens_per_rank", "world", "dispatch_s", "combine_s")
BYTES_KEYS = {
    "busiest": {"dispatch": "dispatch_busiest_bytes", "combine": "combine_busiest_bytes"},
    "mean": {"dispatch": "dispatch_bytes_sent", "combine": "combine_bytes_sent"},
}


@dataclass(frozen=True, slots=True)
class Line:
    """``time = latency_s + bytes / bandwidth`` and how well it fits its own points."""

    latency_s: float
    bandwidth: float | None  # bytes/s; None: the fit found no byte dependence
    points: int
    rms_rel_err_pct: float
    max_rel_err_pct: float

    def predict(self, x: np.ndarray) -> np.ndarray:
        slope = 0.0 if self.bandwidth is None else 1.0 / self.bandwidth
        return self.latency_s + x * slope


@dataclass(frozen=True, slots=True)
class Point:
    kind: str  # dispatch | combine
    tokens: int
    bytes: float
    time_s: float


def fit_line(x: np.ndarray, t: np.ndarray) -> Line:
    """Least squares on relative residuals with latency ≥ 0 and 1 / bandwidth ≥ 0."""
    x, t = np.asarray(x, dtype=float), np.asarray(t, dtype=float)
    if len(t) < 2 or len(np.unique(x)) < 2:
        raise UserError("need at least two distinct byte counts to fit a latency and a bandwidth")
    if np.any(t <= 0):
        raise UserError("a time is zero or negative")
    w = 1.0 / t
    a = np.column_stack([np.ones_like(x), x]) * w[:, None]
    # scale the byte column so both unknowns are of order one for the solver
    scale = float(np.median(t) / max(np.median(x), 1.0))
    a[:, 1] *= scale
    (lat, slope_scaled), _ = nnls(a, np.ones_like(t))
    slope = slope_scaled * scale
    line = Line(float(lat), 1.0 / slope if slope > 0 else None, len(t), 0.0, 0.0)
    rel = (line.predict(x) - t) / t * 100
    return Line(
        line.latency_s,
        line.bandwidth,
        len(t),
        float(np.sqrt(np.mean(rel**2))),
        float(np.max(np.abs(rel))),
    )


def _pct_errors(line: Line, pts: Sequence[Point]) -> list[float]:
    x = np.array([p.bytes for p in pts])
    t = np.array([p.time_s for p in pts])
    return [float(v) for v in (line.predict(x) - t) / t * 100]


def _fit(pts: Sequence[Point]) -> Line:
    return fit_line(np.array([p.bytes for p in pts]), np.array([p.time_s for p in pts]))


def held_out(pts: Sequence[Point]) -> dict[str, Any] | None:
    """Fit on every other tokens-per-rank size, report the error on the others (None when fewer
    than three sizes: two to fit, one to check)."""
    sizes = sorted({p.tokens for p in pts})
    if len(sizes) < 3:
        return None
    train_sizes, test_sizes = sizes[0::2], sizes[1::2]
    train = [p for p in pts if p.tokens in train_sizes]
    test = [p for p in pts if p.tokens in test_sizes]
    line = _fit(train)
    errs = _pct_errors(line, test)
    by_size: dict[int, float] = {}
    for p, e in zip(test, errs, strict=True):
        by_size[p.tokens] = max(by_size.get(p.tokens, 0.0), abs(e))
    worst = max(abs(e) for e in errs)
    return {
        "train_tokens": train_sizes,
        "test_tokens": test_sizes,
        "fit": asdict(line),
        "max_abs_pct": worst,
        "mean_abs_pct": float(np.mean(np.abs(errs))),
        "max_abs_pct_by_tokens": {str(k): v for k, v in sorted(by_size.items())},
        "within_bar": worst <= BAR_PCT,
    }


def _line_dict(line: Line, scaleup: float) -> dict[str, Any]:
    d = asdict(line)
    d["bandwidth_bytes_per_s"] = d.pop("bandwidth")
    bw = line.bandwidth
    d["efficiency"] = bw / scaleup if bw is not None else None
    return d


def _median(xs: Sequence[float]) -> float | None:
    return float(np.median(xs)) if len(xs) else None


def overlap_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Medians over the rows that carry overlap results (None when none do)."""
    ov = [r for r in rows if "hidden_share" in r and "sm_share" in r]
    if not ov:
        return None
    return {
        "rows": len(ov),
        "hidden_share_median": _median([r["hidden_share"] for r in ov]),
        "gemm_slowdown_median": _median([r["gemm_slowdown"] for r in ov]),
        "sm_share_median": _median([r["sm_share"] for r in ov]),
        # where the GEMM outlasts the exchange its slowdown measures the SM share directly
        "sm_share_median_gemm_longer": _median(
            [r["sm_share"] for r in ov if r["gemm_alone_s"] >= r["exchange_alone_s"]]
        ),
    }


def fit_mode(rows: Sequence[dict[str, Any]], scaleup: float, basis: str) -> dict[str, Any]:
    """Dispatch, combine and joint fits of one mode's rows, held-out errors, overlap."""
    keys = BYTES_KEYS[basis]
    pts = {
        kind: [
            Point(kind, int(r["tokens_per_rank"]), float(r[keys[kind]]), float(r[f"{kind}_s"]))
            for r in rows
        ]
        for kind in KINDS
    }
    joint = pts["dispatch"] + pts["combine"]
    out: dict[str, Any] = {
        "rows": len(rows),
        "worlds": sorted({int(r["world"]) for r in rows}),
        "models": sorted({str(r.get("model")) for r in rows}),
        "routings": sorted({str(r.get("routing", "uniform")) for r in rows}),
        "tokens_per_rank": sorted({int(r["tokens_per_rank"]) for r in rows}),
    }
    for name, p in (("dispatch", pts["dispatch"]), ("combine", pts["combine"]), ("joint", joint)):
        out[name] = _line_dict(_fit(p), scaleup)
    out["held_out"] = {name: held_out(p) for name, p in (*pts.items(), ("joint", joint))}
    out["overlap"] = overlap_summary(rows)
    return out


def load_rows(paths: Sequence[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every row of every file (each tagged with its file), and what each file says of itself."""
    rows: list[dict[str, Any]] = []
    sources: list[dict[str, Any]] = []
    for path in paths:
        if not path.is_file():
            raise UserError(f"no file {path}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: unreadable ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise UserError(f"{path}: no 'rows' list (not a deepep_bench.json?)")
        for i, r in enumerate(data["rows"]):
            if not isinstance(r, dict):
                raise UserError(f"{path}: row {i} is not an object")
            missing = [k for k in REQUIRED if k not in r]
            if missing:
                raise UserError(f"{path}: row {i} lacks {', '.join(missing)}")
            rows.append({**r, "_source": str(path)})
        sources.append(
            {
                "file": str(path),
                "device": data.get("device"),
                "world": data.get("world"),
                "date": data.get("date"),
                "deep_ep": data.get("deep_ep"),
                "stand_in": "stand_in" in data,
                "rows": len(data["rows"]),
            }
        )
    return rows, sources


def _scaleup(hardware: str) -> float:
    from ..models.registry import load_hardware

    return float(load_hardware(hardware).scaleup.bytes_per_s_per_dir)


def fit_files(
    paths: Sequence[Path],
    hardware: str = "h200",
    modes: Sequence[str] = MODES,
    basis: str = "busiest",
) -> dict[str, Any]:
    """The whole fit as a JSON-ready dict; ``UserError`` on bad input."""
    rows, sources = load_rows(paths)
    scaleup = _scaleup(hardware)
    result: dict[str, Any] = {
        "sources": sources,
        "hardware": hardware,
        "scaleup_bytes_per_s_per_dir": scaleup,
        "bytes": basis,
        "bar_pct": BAR_PCT,
        "modes": {},
    }
    names = ", ".join(str(p) for p in paths)
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            other = [m for m in MODES if m != mode]
            raise UserError(
                f"no {mode} rows in {names} (--modes {' '.join(other)} fits the other mode alone)"
            )
        for r in mine:
            for kind in KINDS:
                if BYTES_KEYS[basis][kind] not in r:
                    raise UserError(f"{r['_source']}: a {mode} row lacks {BYTES_KEYS[basis][kind]}")
        try:
            result["modes"][mode] = fit_mode(mine, scaleup, basis)
        except UserError as exc:
            raise UserError(f"{mode} rows of {names}: {exc}") from None
    result["all_to_all_params"] = suggested_params(result["modes"])
    return result


def suggested_params(modes: dict[str, Any]) -> dict[str, Any]:
    """The ``AllToAllParams`` fields the fits give (only those measured)."""
    out: dict[str, Any] = {}
    ll, normal = modes.get("low_latency"), modes.get("normal")
    if ll is not None and ll["joint"]["efficiency"] is not None:
        out["low_latency_scaleup_efficiency"] = ll["joint"]["efficiency"]
    if normal is not None and normal["joint"]["efficiency"] is not None:
        out["normal_scaleup_efficiency"] = normal["joint"]["efficiency"]
    src = ll if ll is not None else normal
    if src is not None:
        out["latency_s"] = src["joint"]["latency_s"]
        out["latency_s_from"] = "low_latency joint fit" if ll is not None else "normal joint fit"
    for name, m in (("normal_sm_share", normal), ("low_latency_sm_share", ll)):
        if m is not None and m["overlap"] is not None:
            out[name] = m["overlap"]["sm_share_median"]
    return out


def _fmt_line(d: dict[str, Any]) -> str:
    bw = d["bandwidth_bytes_per_s"]
    eff = d["efficiency"]
    bw_s = f"{bw / 1e9:8.1f}" if bw is not None else f"{'inf':>8}"
    eff_s = f"{eff:6.3f}" if eff is not None else f"{'-':>6}"
    return f"{d['latency_s'] * 1e6:9.2f} {bw_s} {eff_s} {d['rms_rel_err_pct']:6.1f}"


def lines(result: dict[str, Any]) -> list[str]:
    out = []
    for s in result["sources"]:
        tag = "  (STAND-IN data, not a measurement)" if s["stand_in"] else ""
        out.append(f"source: {s['file']}: {s['device']}, world {s['world']}, {s['date']}{tag}")
    out.append(
        f"hardware {result['hardware']}: scale-up {result['scaleup_bytes_per_s_per_dir'] / 1e9:.0f}"
        f" GB/s per direction; bytes: {result['bytes']}; held-out bar {result['bar_pct']:.0f} %"
    )
    out.append(
        f"{'mode':<12} {'fit':<9} {'lat µs':>9} {'GB/s':>8} {'eff':>6} {'rms %':>6}"
        f" {'held-out max % (mean)':>22}"
    )
    for mode, m in result["modes"].items():
        for name in ("dispatch", "combine", "joint"):
            h = m["held_out"][name]
            if h is None:
                ho = "n/a (< 3 sizes)"
            else:
                ok = "ok" if h["within_bar"] else "OVER"
                ho = f"{h['max_abs_pct']:6.1f} ({h['mean_abs_pct']:.1f}) {ok}"
            out.append(f"{mode:<12} {name:<9} {_fmt_line(m[name])} {ho:>22}")
        ov = m["overlap"]
        if ov is not None:
            out.append(
                f"{mode:<12} overlap   hidden share {ov['hidden_share_median']:.2f}, GEMM slowdown "
                f"{ov['gemm_slowdown_median']:.3f}, SM share {ov['sm_share_median']:.3f} "
                f"(medians of {ov['rows']} rows)"
            )
        out.append(
            f"{mode:<12} rows {m['rows']}, worlds {m['worlds']}, tokens/rank {m['tokens_per_rank']}"
        )
    p = result["all_to_all_params"]
    out.append(
        "AllToAllParams: " + ", ".join(f"{k}={_num(v)}" for k, v in p.items() if k[-5:] != "_from")
    )
    if "latency_s_from" in p:
        out.append(f"  latency_s from the {p['latency_s_from']}")
    return out


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m deepinfer_sim.calibration.ep_fit",
        description="Fit AllToAllParams from deepep_bench.json files (DeepEP V1, one node).",
    )
    ap.add_argument("files", nargs="+", type=Path, metavar="FILE")
    ap.add_argument("--hardware", default="h200", help="bundled hardware name or YAML path")
    ap.add_argument("--json", type=Path, metavar="OUT", help="write the fit as JSON ('-': stdout)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--bytes", choices=tuple(BYTES_KEYS), default="busiest")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result = fit_files(args.files, args.hardware, args.modes, args.bytes)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json is not None and str(args.json) == "-":
        print(json.dumps(result, indent=2))
        return 0
    print("\n".join(lines(result)))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
