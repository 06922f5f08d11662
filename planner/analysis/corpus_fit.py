"""The parameters chosen by looking at the published corpus, fitted across all of it, and each
case predicted again with them refitted leaving its source out (``validate``'s ``ratio_loso``).

A cost model has a few global knobs no kernel measurement sets: the roofline's efficiencies and
per-layer overhead, the latency of a tensor-parallel all-reduce (nothing here measured one: the
H200 lent is a single GPU). Their shipped values (the defaults of ``cost_model.roofline`` and
``cost_model.step.tensor_parallel``) are the ones that fit every source's cases at once: least
squares of log(simulated / published) over the cases a steady point evaluates (the burst cases
run a whole simulation each and are left out of the fit, not out of the check). A case's
leave-one-source-out ratio is its prediction with the knobs refitted without any case of its
source (its ``organization``: cases of one organization share engines, kernels and authors),
so no case helps choose the parameters it is judged with.

The profile family fits the all-reduce latency alone (the profiles measured the rest); the
roofline family fits its own three with that latency held at the profile family's value — one
default serves both. :func:`write_fit` records the fitted values and the per-case ratios, which
``error_band`` reads to say how far to trust a question's answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import UserError
from . import published
from .published import Case

PROFILE, ROOFLINE = published.PROFILE, "roofline"
ALLREDUCE = ("step", "tensor_parallel", "allreduce_latency_s")


@dataclass(frozen=True)
class Knob:
    """One fitted parameter: its place under ``cost_model`` and its bounds."""

    path: tuple[str, ...]
    low: float
    high: float

    @property
    def key(self) -> str:
        return "cost_model." + ".".join(self.path)


KNOBS: dict[str, tuple[Knob, ...]] = {
    PROFILE: (Knob(ALLREDUCE, 2e-6, 1e-4),),
    ROOFLINE: (
        Knob(("roofline", "memory_efficiency"), 0.2, 0.9),  # 0.88: the H200's measured copy share
        Knob(("roofline", "gemm_efficiency"), 0.1, 0.9),
        Knob(("roofline", "layer_overhead_s"), 1e-6, 5e-4),
    ),
}


@dataclass
class Prepared:
    """One case on one cost-model family, its scenario built once."""

    file: str
    name: str
    source: str
    quantity: str
    published: float
    family: str
    cost_model: str
    case: Case
    scenario: Any
    attributes: dict[str, str]


def _with(sc: Any, values: dict[tuple[str, ...], float]) -> Any:
    """``sc`` with ``cost_model.<path>`` set for each path (models copied, not re-validated)."""
    cm = sc.cost_model
    for path, value in values.items():
        parent = cm
        chain = [cm]
        for part in path[:-1]:
            parent = getattr(parent, part)
            chain.append(parent)
        node = chain[-1].model_copy(update={path[-1]: value})
        for part, above in zip(reversed(path[:-1]), reversed(chain[:-1]), strict=True):
            node = above.model_copy(update={part: node})
        cm = node
    return sc.model_copy(update={"cost_model": cm})


def attributes(sc: Any, quantity: str, cost_model: str) -> dict[str, str]:
    """What makes two questions alike for an error band: pool kind, parallelism, hardware."""
    from ...models.registry import load_hardware

    aggregated = getattr(sc, "serving", "disaggregated") == "aggregated"
    pool_name = "aggregated" if aggregated else ("prefill" if "prefill" in quantity else "decode")
    pool = getattr(sc.pools, pool_name)
    hw = load_hardware(pool.hardware)
    arch = {"sm90": "hopper", "sm100": "blackwell", "sm103": "blackwell"}.get(hw.arch, hw.vendor)
    return {
        "pool": pool_name,
        "parallel": "tp" if pool.tp > 1 else "dp",
        "hardware": arch,
        "family": ROOFLINE if cost_model == ROOFLINE else PROFILE,
    }


def prepare(families: Sequence[str], paths: list[Path] | None = None) -> list[Prepared]:
    out = []
    for path, cf in published.case_files(paths):
        for family in families:
            model = published.cost_model_for(cf, family)
            base = published.case_scenario(cf, path, model)
            for case in cf.cases:
                sc = published.case_scenario(cf, path, model, case) if case.set else base
                out.append(
                    Prepared(
                        file=cf.name,
                        name=case.name,
                        source=cf.organization,
                        quantity=case.quantity,
                        published=case.published,
                        family=family,
                        cost_model=model,
                        case=case,
                        scenario=sc,
                        attributes=attributes(sc, case.quantity, model),
                    )
                )
    return out


def ratio(p: Prepared, values: dict[tuple[str, ...], float]) -> float:
    value, _ = published.case_point(p.case, _with(p.scenario, values))
    return value / p.published


def _defaults(family: str) -> dict[tuple[str, ...], float]:
    from ...scenario import CostModel

    cm: Any = CostModel()
    out = {}
    for knob in KNOBS[family]:
        node = cm
        for part in knob.path:
            node = getattr(node, part)
        out[knob.path] = float(node)
    return out


def fit(
    cases: list[Prepared], family: str, held: dict[tuple[str, ...], float] | None = None
) -> dict[tuple[str, ...], float]:
    """The family's knobs minimizing Σ log(ratio)² over ``cases`` (steady points only; ``held``:
    other knobs fixed at these values). Powell's method in log space within the bounds, from the
    current defaults: deterministic."""
    knobs = KNOBS[family]
    fixed = dict(held or {})
    mine = [c for c in cases if c.family == family and c.quantity not in published.SIMULATED]
    if not mine:
        raise UserError(f"no case to fit the {family} parameters on")
    start = _defaults(family)
    lo = np.array([math.log(k.low) for k in knobs])
    hi = np.array([math.log(k.high) for k in knobs])

    def values(x: np.ndarray) -> dict[tuple[str, ...], float]:
        return {**fixed, **{k.path: math.exp(v) for k, v in zip(knobs, x, strict=True)}}

    def loss(x: np.ndarray) -> float:
        total = 0.0
        for c in mine:
            r = ratio(c, values(np.clip(x, lo, hi)))
            total += math.log(r) ** 2 if r > 0 and math.isfinite(r) else 100.0
        return total

    from scipy.optimize import minimize  # only a fit needs it: reading a band must not

    x0 = np.clip(np.array([math.log(start[k.path]) for k in knobs]), lo, hi)
    res = minimize(
        loss, x0, method="Powell", bounds=list(zip(lo, hi, strict=True)), options={"xtol": 1e-3}
    )
    return values(np.clip(res.x, lo, hi))


@dataclass
class FitResult:
    shipped: dict[str, dict[str, float]]  # family -> knob key -> value fitted on every source
    rows: list[dict[str, Any]]  # per case and family: ratio, ratio_loso, source, attributes


def fit_corpus(families: Sequence[str] = (ROOFLINE, PROFILE)) -> FitResult:
    """Fit every family's knobs on the whole corpus, then on the corpus less each source, and
    predict each case with both. The profile family's all-reduce latency is fitted first and
    held in the roofline family's fits."""
    cases = prepare(families)
    order = [f for f in (PROFILE, ROOFLINE) if f in families]

    def fits(pool: list[Prepared]) -> dict[str, dict[tuple[str, ...], float]]:
        out: dict[str, dict[tuple[str, ...], float]] = {}
        held: dict[tuple[str, ...], float] = {}
        for family in order:
            out[family] = fit(pool, family, held)
            if family == PROFILE:
                held = {ALLREDUCE: out[family][ALLREDUCE]}
        if ROOFLINE in out and PROFILE not in out:
            out[ROOFLINE].setdefault(ALLREDUCE, _defaults(PROFILE)[ALLREDUCE])
        return out

    everything = fits(cases)
    sources = sorted({c.source for c in cases})
    loso = {s: fits([c for c in cases if c.source != s]) for s in sources}
    rows = []
    for c in cases:
        rows.append(
            {
                "file": c.file,
                "case": c.name,
                "source": c.source,
                "family": c.family,
                "cost_model": c.cost_model,
                "quantity": c.quantity,
                "published": c.published,
                "ratio_default": ratio(c, {}),
                "ratio": ratio(c, everything[c.family]),
                "ratio_loso": ratio(c, loso[c.source][c.family]),
                **c.attributes,
            }
        )
    shipped = {
        fam: {"cost_model." + ".".join(p): v for p, v in vals.items()}
        for fam, vals in everything.items()
    }
    return FitResult(shipped, rows)


def fit_file() -> Path:
    """Where the shipped corpus fit lives (``deepinfer-sim validate --write-fit`` writes it)."""
    return published.published_dir() / "fit.json"


def write_fit(result: FitResult, path: Path) -> None:
    import json

    from ...sim.results.files import write_text

    body = {"shipped": result.shipped, "cases": result.rows}
    write_text(path, json.dumps(body, indent=1, sort_keys=True) + "\n")


@dataclass(frozen=True)
class ErrorBand:
    """How far a cost model's answer to a question may be off: the leave-one-source-out
    errors of the corpus cases most like it."""

    band: float  # relative: 0.2 is ±20 %
    cases: int
    alike: dict[str, str]  # the attributes they share with the question

    def text(self) -> str:
        what = ", ".join(f"{k} {v}" for k, v in self.alike.items() if k != "family")
        return (
            f"±{self.band:.0%} (the largest leave-one-source-out error of the {self.cases} "
            f"published cases alike: {what or 'any'}; docs/validation.md)"
        )


def error_band(
    pool: str, parallel: str, hardware: str, family: str, rows: list[dict[str, Any]] | None = None
) -> ErrorBand | None:
    """The band of a question about ``pool`` (prefill, decode, aggregated) on ``parallel`` (tp,
    dp) ``hardware`` (hopper, blackwell, huawei, ...) with a ``family`` cost model (roofline,
    profile): among the shipped fit's cases of that family, those sharing the most of the
    three attributes (pool counts most, then parallelism, then hardware), and the largest
    |ratio_loso − 1| among them — the honest worst case of a prediction like it. None when the
    fit file is missing or holds no case of the family."""
    if rows is None:
        import json

        try:
            rows = json.loads(fit_file().read_text())["cases"]
        except (OSError, ValueError, KeyError):
            return None
    mine = [r for r in rows if r.get("family") == family and r.get("ratio_loso")]
    if not mine:
        return None
    want = {"pool": pool, "parallel": parallel, "hardware": hardware}
    weights = {"pool": 4, "parallel": 2, "hardware": 1}

    def score(r: dict[str, Any]) -> int:
        return sum(w for k, w in weights.items() if r.get(k) == want[k])

    best = max(score(r) for r in mine)
    near = [r for r in mine if score(r) == best]
    band = max(abs(r["ratio_loso"] - 1.0) for r in near)
    alike = {k: v for k, v in want.items() if all(r.get(k) == v for r in near)}
    return ErrorBand(band, len(near), alike)


def band_for(sc: Any, pool: str) -> ErrorBand | None:
    """:func:`error_band` of scenario ``sc``'s ``pool`` (its hardware, parallelism and cost
    model); under aggregated serving, the aggregated pool's, whichever phase is asked for."""
    quantity = "prefill" if pool == "prefill" else "decode"
    a = attributes(sc, quantity, sc.cost_model.for_pool(sc.serving_pool(pool)))
    return error_band(a["pool"], a["parallel"], a["hardware"], a["family"])
