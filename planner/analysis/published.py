"""Published deployments as checks: the simulator's steady operating points against the
throughput others measured (``deepinfer-sim validate``).

A case file (``configs/published/*.yaml``, bundled) holds a ``scenario`` (the deployment: model,
hardware, EP widths, redundant experts, two-batch overlap, speculative decoding), its ``source``
and a list of ``cases``, each a ``quantity`` measured at a ``point``, the ``published`` value
and a ``tolerance`` (relative). Quantities:

- ``prefill_tok_s_per_node``: prompt tokens computed per second per node, every GPU of one
  prefill instance filled with ``tokens_per_gpu`` tokens of ``prompt``-token prompts.
- ``prefill_input_tok_s_per_node``: the same, counting cached prompt tokens too — each prompt
  computes its last (1 − ``cached_fraction``) after a prefix of the rest.
- ``decode_tok_s_per_node``: output tokens per second per node at ``batch_per_gpu`` sequences
  of ``context`` tokens (the scenario's speculative policy sets tokens verified and accepted).
- ``decode_tok_s_per_node_at_user_speed``: the same at the largest batch whose sequences still
  get ``user_tok_s`` output tokens per second each, at ``context`` tokens.
- ``prefill_tbo_speedup``: prefill throughput with two-batch overlap over the same step with no
  overlap at all (the all-to-all after the compute), at a ``prefill_tok_s_per_node`` point.

Each case is evaluated with every cost model asked for (the roofline, a profile): the scenario's
``cost_model`` is replaced for both pools. No per-case factors: what a case needs is in the
model, hardware and policy files.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ...errors import ConfigError, UserError
from ...scenario import scenario_from_dict
from ...validation import FrozenModel, read_yaml, validate
from . import steady

Quantity = Literal[
    "prefill_tok_s_per_node",
    "prefill_input_tok_s_per_node",
    "decode_tok_s_per_node",
    "decode_tok_s_per_node_at_user_speed",
    "prefill_tbo_speedup",
]
POINT_KEYS: dict[str, tuple[str, ...]] = {
    "prefill_tok_s_per_node": ("tokens_per_gpu", "prompt"),
    "prefill_input_tok_s_per_node": ("tokens_per_gpu", "prompt", "cached_fraction"),
    "decode_tok_s_per_node": ("batch_per_gpu", "context"),
    "decode_tok_s_per_node_at_user_speed": ("user_tok_s", "context"),
    "prefill_tbo_speedup": ("tokens_per_gpu", "prompt"),
}


class Case(FrozenModel):
    name: str
    quantity: Quantity
    point: dict[str, float]
    published: float = Field(gt=0)
    tolerance: float = Field(0.15, gt=0, lt=1)


class CaseFile(FrozenModel):
    name: str
    source: str
    scenario: dict[str, Any]
    cases: tuple[Case, ...] = Field(min_length=1)


@dataclass(frozen=True)
class CaseResult:
    file: str
    name: str
    quantity: str
    published: float
    cost_model: str
    simulated: float
    ratio: float
    tolerance: float
    step_s: float

    @property
    def within(self) -> bool:
        return bool(abs(self.ratio - 1.0) <= self.tolerance)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "within": self.within}


def published_dir() -> Path:
    return Path(str(resources.files("deepinfer_sim.configs"))) / "published"


def load_case_file(path: Path) -> CaseFile:
    return case_file_of(read_yaml(path), path)


def case_file_of(data: Any, path: Path) -> CaseFile:
    """``data`` (a case file's parsed YAML, read from ``path``) validated, each case's point
    checked against its quantity."""
    cf = validate(CaseFile, data, source=str(path))
    for i, case in enumerate(cf.cases):
        need = POINT_KEYS[case.quantity]
        missing = [k for k in need if k not in case.point]
        extra = [k for k in case.point if k not in need]
        if missing or extra:
            raise ConfigError(
                f"cases[{i}].point",
                f"{case.quantity} needs {', '.join(need)}"
                + (f" (missing {', '.join(missing)})" if missing else "")
                + (f" (unknown {', '.join(extra)})" if extra else ""),
                source=str(path),
            )
    return cf


def case_files(paths: list[Path] | None = None) -> list[tuple[Path, CaseFile]]:
    files = paths or sorted(published_dir().glob("*.yaml"))
    return [(p, load_case_file(p)) for p in files]


def _with_tbo(sc: Any, on: bool) -> Any:
    prefill = sc.pools.prefill.model_copy(update={"two_batch_overlap": on})
    return sc.pools.model_copy(update={"prefill": prefill})


def case_point(case: Case, sc: Any) -> tuple[float, steady.SteadyPoint]:
    """(the case's quantity as simulated on ``sc``, the steady point whose step gives it: for
    ``prefill_tbo_speedup``, the point with two-batch overlap)."""
    pt = case.point
    if case.quantity == "prefill_tok_s_per_node":
        p = steady.prefill_point(sc, int(pt["tokens_per_gpu"]), int(pt["prompt"]))
        return p.tokens_per_s_per_node, p
    if case.quantity == "prefill_input_tok_s_per_node":
        # each prompt computes its last (1 - cached_fraction) after a cached prefix of the rest
        prompt = round(pt["prompt"])
        new = max(1, round(prompt * (1 - pt["cached_fraction"])))
        p = steady.prefill_point(sc, int(pt["tokens_per_gpu"]), new, prompt - new)
        return p.tokens_per_s_per_node * prompt / new, p
    if case.quantity == "prefill_tbo_speedup":
        tokens, prompt = int(pt["tokens_per_gpu"]), int(pt["prompt"])
        on = sc.model_copy(update={"pools": _with_tbo(sc, True)})
        off = sc.model_copy(
            update={
                "pools": _with_tbo(sc, False),
                "cost_model": sc.cost_model.model_copy(
                    update={"step": sc.cost_model.step.model_copy(update={"comm_overlap": 0.0})}
                ),
            }
        )
        fast = steady.prefill_point(on, tokens, prompt)
        slow = steady.prefill_point(off, tokens, prompt)
        return fast.tokens_per_s_per_node / slow.tokens_per_s_per_node, fast
    if case.quantity == "decode_tok_s_per_node":
        p = steady.decode_point(sc, pt["batch_per_gpu"], int(pt["context"]))
    else:
        p = steady.decode_at_user_speed(sc, int(pt["context"]), pt["user_tok_s"])
    return p.tokens_per_s_per_node, p


def case_scenario(cf: CaseFile, path: Path, cost_model: str | None = None) -> Any:
    """The case file's scenario, with both pools on ``cost_model`` where one is given."""
    data = dict(cf.scenario)
    if cost_model is not None:
        data["cost_model"] = {
            **data.get("cost_model", {}),
            "prefill": cost_model,
            "decode": cost_model,
        }
    try:
        return scenario_from_dict(data, path.parent)
    except ConfigError as exc:
        raise UserError(f"{path}: scenario: {str(exc).removeprefix('<dict>: ')}") from None


def result(cf: CaseFile, case: Case, cost_model: str, value: float, step_s: float) -> CaseResult:
    return CaseResult(
        file=cf.name,
        name=case.name,
        quantity=case.quantity,
        published=case.published,
        cost_model=cost_model,
        simulated=value,
        ratio=value / case.published if math.isfinite(value) else math.inf,
        tolerance=case.tolerance,
        step_s=step_s,
    )


def run_cases(
    cost_models: tuple[str, ...] = ("roofline",), paths: list[Path] | None = None
) -> list[CaseResult]:
    out = []
    for path, cf in case_files(paths):
        for cm in cost_models:
            sc = case_scenario(cf, path, cm)
            for case in cf.cases:
                value, point = case_point(case, sc)
                out.append(result(cf, case, cm, value, point.step_s))
    return out
