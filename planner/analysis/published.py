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
- ``prefill_prompt_tok_s_per_node``: prompt tokens per second per node when every DP rank
  computes one ``prompt``-token prompt in chunks of ``chunk`` tokens, each after the earlier ones
  as its prefix (chunked prefill of long prompts).
- ``decode_tok_s_per_gpu``: output tokens per second per GPU at ``batch_per_gpu`` sequences of
  ``context`` tokens.
- ``decode_tok_s_per_user``: output tokens per second one sequence gets when each data-parallel
  rank holds ``sequences_per_rank`` of ``context`` tokens (a rank of tp GPUs; batch 1 on a TP8
  server is 1).
- ``decode_tpot_s``: seconds per output token at the same point.
- ``burst_output_tok_s_per_gpu``: a whole simulation — ``requests`` requests of ``input`` prompt
  and ``output`` generated tokens all arrive at once; output tokens over the time the last one
  ends, per GPU. What a benchmark that submits a fixed set of requests up to a concurrency cap
  (the engine's batch limit, ``max_seqs_per_rank``) measures; the tail of the last wave is in it,
  as it is in the published figure.

Decode points may give ``verify`` (tokens computed per sequence-step) and ``accept`` (tokens
emitted per sequence-step) where the source states its speculative decoding's acceptance; else
the scenario's speculative policy sets them. A case may carry ``set``: dotted overrides of the
file's scenario for that case alone (e.g. the same deployment without MTP). Each file names its
``organization``: cases of one organization share engines, kernels and authors, so they are one
source when parameters are refitted leaving a source out (``validate`` reports ``ratio_loso``).

Each case is evaluated with every cost model asked for (the roofline, a profile): the scenario's
``cost_model`` is replaced for both pools. No per-case factors: what a case needs is in the
model, hardware and policy files.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ...errors import ConfigError, UserError
from ...scenario import apply_override, parse_override, scenario_from_dict
from ...validation import FrozenModel, read_yaml, validate
from . import steady

Quantity = Literal[
    "prefill_tok_s_per_node",
    "prefill_input_tok_s_per_node",
    "prefill_prompt_tok_s_per_node",
    "decode_tok_s_per_node",
    "decode_tok_s_per_node_at_user_speed",
    "decode_tok_s_per_gpu",
    "decode_tok_s_per_user",
    "decode_tpot_s",
    "prefill_tbo_speedup",
    "burst_output_tok_s_per_gpu",
]
SIMULATED = ("burst_output_tok_s_per_gpu",)  # quantities a cluster run gives (seconds each)
SPECULATION = ("verify", "accept")  # optional at every decode point
POINT_KEYS: dict[str, tuple[str, ...]] = {
    "prefill_tok_s_per_node": ("tokens_per_gpu", "prompt"),
    "prefill_input_tok_s_per_node": ("tokens_per_gpu", "prompt", "cached_fraction"),
    "prefill_prompt_tok_s_per_node": ("prompt", "chunk"),
    "decode_tok_s_per_node": ("batch_per_gpu", "context"),
    "decode_tok_s_per_node_at_user_speed": ("user_tok_s", "context"),
    "decode_tok_s_per_gpu": ("batch_per_gpu", "context"),
    "decode_tok_s_per_user": ("sequences_per_rank", "context"),
    "decode_tpot_s": ("sequences_per_rank", "context"),
    "prefill_tbo_speedup": ("tokens_per_gpu", "prompt"),
    "burst_output_tok_s_per_gpu": ("requests", "input", "output"),
}


class Case(FrozenModel):
    name: str
    quantity: Quantity
    point: dict[str, float]
    published: float = Field(gt=0)
    tolerance: float = Field(0.15, gt=0, lt=1)
    set: tuple[str, ...] = Field(
        (), description="dotted overrides of the file's scenario for this case alone"
    )


class CaseFile(FrozenModel):
    name: str
    source: str
    organization: str = Field(
        min_length=1,
        description="who published it: cases of one organization are one source when "
        "parameters are refitted leaving a source out",
    )
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
    family: str = ""  # the cost model asked for (``profile``: the hardware's own, cost_model)
    source: str = ""  # the organization that published it

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
        optional = SPECULATION if case.quantity.startswith("decode") else ()
        missing = [k for k in need if k not in case.point]
        extra = [k for k in case.point if k not in need and k not in optional]
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
    if case.quantity == "burst_output_tok_s_per_gpu":
        return burst_output_per_gpu(sc, int(pt["requests"]), int(pt["input"]), int(pt["output"]))
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
    if case.quantity == "prefill_prompt_tok_s_per_node":
        p = steady.chunked_prompt_point(sc, int(pt["prompt"]), int(pt["chunk"]))
        return p.tokens_per_s_per_node, p
    verify, accept = pt.get("verify"), pt.get("accept")
    context = int(pt["context"])
    if case.quantity in ("decode_tok_s_per_node", "decode_tok_s_per_gpu"):
        p = steady.decode_point(sc, pt["batch_per_gpu"], context, verify, accept)
        per = p.tokens_per_s_per_node if case.quantity.endswith("node") else p.tokens_per_s_per_gpu
        return per, p
    if case.quantity in ("decode_tok_s_per_user", "decode_tpot_s"):
        tp = sc.pools.decode.tp
        p = steady.decode_point(sc, pt["sequences_per_rank"] / tp, context, verify, accept)
        if case.quantity == "decode_tpot_s":
            return 1.0 / p.tokens_per_s_per_user, p
        return p.tokens_per_s_per_user, p
    p = steady.decode_at_user_speed(sc, context, pt["user_tok_s"], verify, accept)
    return p.tokens_per_s_per_node, p


def burst_output_per_gpu(
    sc: Any, requests: int, input_tokens: int, output_tokens: int
) -> tuple[float, steady.SteadyPoint]:
    """(output tokens per second per GPU of a burst run, a steady decode point of the decoding
    pool for its step size): see ``burst_output_tok_s_per_gpu``."""
    import numpy as np

    from ...sim.run import simulate
    from ...traces.source import RequestSource

    blocks = -(-input_tokens // 512)
    source = RequestSource.from_columns(
        arrival_s=np.zeros(requests),
        input_len=np.full(requests, input_tokens, dtype=np.int64),
        output_len=np.full(requests, output_tokens, dtype=np.int64),
        block_offsets=np.arange(requests + 1, dtype=np.int64) * blocks,
        block_hashes=np.arange(requests * blocks, dtype=np.int64),
        block_tokens=512,
        image_count=None,
        traffic_class=None,
        class_names=("default",),
    )
    res = simulate(sc, source=source)
    t = res.requests
    end = float(t["t_done_s"].max())
    gpus = res.summary["cost"]["gpus"]["total"]
    tokens = float(t.loc[t["state"] == "done", "output_tokens"].sum())
    pool = sc.serving_pool("decode")
    point = steady.SteadyPoint(
        pool="decode",
        cost_model=sc.cost_model.for_pool(pool),
        hardware=getattr(sc.pools, pool).hardware,
        ep=gpus,
        gpus_per_node=0,
        step_s=float(res.summary["latency"]["itl_s"]["mean"]),
        breakdown={},
        imbalance=1.0,
        tokens_per_s_per_gpu=tokens / end / gpus,
        tokens_per_s_per_user=0.0,
        tokens_per_s_per_node=0.0,
    )
    return tokens / end / gpus, point


def case_scenario(
    cf: CaseFile, path: Path, cost_model: str | None = None, case: Case | None = None
) -> Any:
    """The case file's scenario, with both pools on ``cost_model`` where one is given, and the
    ``case``'s own overrides (its ``set``) where one is given."""
    data = dict(cf.scenario)
    if cost_model is not None:
        pools = ("aggregated",) if data.get("serving") == "aggregated" else ("prefill", "decode")
        data["cost_model"] = {**data.get("cost_model", {}), **dict.fromkeys(pools, cost_model)}
    where = f"{path}: scenario" if case is None or not case.set else f"{path}: {case.name}: set"
    try:
        if case is not None and case.set:
            data = copy.deepcopy(data)
            for text in case.set:
                apply_override(data, *parse_override(text))
        return scenario_from_dict(data, path.parent)
    except ConfigError as exc:
        raise UserError(f"{where}: {str(exc).removeprefix('<dict>: ')}") from None


def result(
    cf: CaseFile, case: Case, cost_model: str, value: float, step_s: float, family: str = ""
) -> CaseResult:
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
        family=family or cost_model,
        source=cf.organization,
    )


PROFILE = "profile"  # a cost-model name: the shipped profile for each case's hardware


def profile_for(hardware: str) -> str:
    """The shipped calibration profile for ``hardware``: the one measured on it where there is
    one, else one derived for it (``profile`` in ``validate``: H200 cases run on h200-deepseek,
    B200 on sm100-derived, H800 on hopper-derived ...)."""
    from ...models.profile import available_profiles, load_profile

    found = []
    for name in available_profiles():
        prof = load_profile(name)
        if hardware in prof.hardware_names():
            found.append((prof.provenance.kind != "measured", name))
    if not found:
        raise UserError(f"no shipped calibration profile covers hardware {hardware!r}")
    return min(found)[1]


def cost_model_for(cf: CaseFile, cost_model: str) -> str:
    """``cost_model`` as a case file's scenario takes it (``profile``: its hardware's)."""
    if cost_model != PROFILE:
        return cost_model
    pools = cf.scenario.get("pools", {})
    serving = cf.scenario.get("serving", "disaggregated")
    pool = pools.get("aggregated" if serving == "aggregated" else "decode", {})
    return profile_for(str(pool.get("hardware", "gb200")))


def run_cases(
    cost_models: tuple[str, ...] = ("roofline",), paths: list[Path] | None = None
) -> list[CaseResult]:
    out = []
    for path, cf in case_files(paths):
        for cm in cost_models:
            model = cost_model_for(cf, cm)
            sc = case_scenario(cf, path, model)
            for case in cf.cases:
                own = case_scenario(cf, path, model, case) if case.set else sc
                value, point = case_point(case, own)
                out.append(result(cf, case, model, value, point.step_s, cm))
    return out
