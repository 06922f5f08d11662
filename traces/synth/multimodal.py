"""Multimodal (image) requests drawn from the ServeGen mm-image distributions.

ServeGen (Alibaba Bailian / Qwen-VL, Apache-2.0; ``../shared/traces/servegen_mm_image``) is not a
request trace: per client and 10-minute window it gives a request rate and marginal PMFs of text
tokens, image tokens, image count and output tokens. :func:`pool_servegen` mixes every
(client, window) PMF weighted by that window's request rate into one PMF per field — the traffic
mix of the whole service — and the result ships as ``traces/data/servegen_mm_image_pmf.json``.

:func:`read_servegen` instead replays one client's own day from its chunk pair (its fitted
inter-arrival distribution per window, its per-window PMFs), which is how ``read_trace`` and
``deepinfer-sim trace`` read a ServeGen file.

:func:`generate_multimodal` samples requests from the pooled PMFs: Poisson arrivals at
``requests_per_s``; ``image_count`` from its PMF; image tokens from the image-token PMF given
that count is non-zero (the PMFs are marginals, so tokens and count are drawn independently
apart from that); text and output tokens from theirs. A request's prompt is text + image
tokens; every request gets fresh block ids (images and their questions are not shared across
users). The vision encoder stage costs each image by ``pools.vision`` (``tokens_per_image`` ×
encoder parameters).
"""

from __future__ import annotations

import ast
import csv
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from ...rng import exponential, gamma, stream, weibull
from ...validation import FrozenModel
from ..readers._common import _lengths_only
from ..source import RequestSource

FIELDS = ("text_tokens", "image_tokens", "image_count", "output_tokens")
SHIPPED = "servegen_mm_image_pmf.json"


class MultimodalWorkload(FrozenModel):
    """Image requests (traffic class ``multimodal``) mixed into a scenario's workload."""

    requests_per_s: float = Field(gt=0, description="mean Poisson arrival rate")
    duration_s: float | None = Field(
        None, gt=0, description="arrivals over this span (default: the rest of the workload's)"
    )
    class_name: str = Field("multimodal", min_length=1)


def pool_servegen(folder: str | Path) -> dict[str, Any]:
    """One rate-weighted PMF per field from the ServeGen ``chunk-*-{trace.csv,dataset.json}``."""
    root = Path(folder)
    acc: dict[str, dict[int, float]] = {f: {} for f in FIELDS}
    chunks = sorted(root.glob("chunk-*-dataset.json"), key=lambda p: int(p.name.split("-")[1]))
    for dataset in chunks:
        trace = dataset.with_name(dataset.name.replace("-dataset.json", "-trace.csv"))
        with trace.open() as fh:
            rates = {int(float(row[0])): float(row[1]) for row in csv.reader(fh) if row}
        for window, fields in json.loads(dataset.read_text()).items():
            rate = rates.get(int(window), 0.0)
            if rate <= 0:
                continue
            for f in FIELDS:
                for value, p in ast.literal_eval(fields[f]).items():
                    acc[f][int(value)] = acc[f].get(int(value), 0.0) + p * rate
    out: dict[str, Any] = {}
    for f, pmf in acc.items():
        values = sorted(pmf)
        total = sum(pmf.values())
        out[f] = {"values": values, "probs": [pmf[v] / total for v in values]}
    return out


def shipped_pmfs() -> dict[str, Any]:
    text = resources.files("deepinfer_sim.traces.data").joinpath(SHIPPED).read_text()
    return json.loads(text)["fields"]


def _draw(pmf: dict[str, Any], rng: np.random.Generator, n: int, positive: bool = False):
    values = np.asarray(pmf["values"], dtype=np.int64)
    probs = np.asarray(pmf["probs"], dtype=float)
    if positive:
        probs = np.where(values > 0, probs, 0.0)
    return rng.choice(values, size=n, p=probs / probs.sum())


def generate_multimodal(
    cfg: MultimodalWorkload, duration_s: float, seed: int, block_tokens: int = 512
) -> RequestSource:
    """Image requests over ``cfg.duration_s`` (or ``duration_s``), deterministic for ``seed``."""
    rng = stream(seed, "workload/multimodal")
    span = cfg.duration_s or duration_s
    n = int(rng.poisson(cfg.requests_per_s * span))
    arrival = np.sort(rng.uniform(0.0, span, n))
    pmfs = shipped_pmfs()
    images = _draw(pmfs["image_count"], rng, n)
    image_tokens = np.where(images > 0, _draw(pmfs["image_tokens"], rng, n, positive=True), 0)
    text = np.maximum(_draw(pmfs["text_tokens"], rng, n), 1)
    output = np.maximum(_draw(pmfs["output_tokens"], rng, n), 1)
    input_len = text + image_tokens
    return _lengths_only(
        "servegen-mm-image", arrival, input_len, output, block_tokens, cfg.class_name, images
    )


def _pair(path: Path) -> tuple[Path, Path]:
    """(trace.csv, dataset.json) of the ServeGen chunk ``path`` names (either file)."""
    name = path.name
    stem = name.removesuffix("-trace.csv").removesuffix("-dataset.json")
    return path.with_name(f"{stem}-trace.csv"), path.with_name(f"{stem}-dataset.json")


def read_servegen(
    path: str | os.PathLike[str], seed: int = 0, block_tokens: int = 512
) -> RequestSource:
    """One day of one ServeGen client, synthesized from its description (either chunk file).

    Per 10-minute window of ``chunk-i-trace.csv``: inter-arrival times from the fitted
    distribution (Gamma or Weibull with shape = param1 and scale = param2; exponential at the
    window's mean rate when none is fitted); lengths and image counts from the window's PMFs in
    ``chunk-i-dataset.json`` (the latest window at or before it that has them, else the
    earliest). Deterministic for ``seed``."""
    from ...errors import TraceError

    trace, dataset = _pair(Path(path))
    for part in (trace, dataset):
        if not part.exists():
            raise TraceError(str(path), f"a ServeGen chunk needs its pair {part.name} beside it")
    with trace.open() as fh:
        rows = [r for r in csv.reader(fh) if r]
    pmfs = {int(w): v for w, v in json.loads(dataset.read_text()).items()}
    if not pmfs:
        raise TraceError(str(dataset), "no length distributions in this ServeGen chunk")
    windows = sorted(pmfs)
    rng = stream(seed, f"servegen/{trace.name}")
    arrivals: list[np.ndarray] = []
    fields: dict[str, list[np.ndarray]] = {f: [] for f in FIELDS}
    for line, row in enumerate(rows, start=1):
        try:
            start, rate = float(row[0]), float(row[1])
            dist, a, b = (
                row[3],
                (float(row[4]) if row[4] else 0.0),
                (float(row[5]) if row[5] else 0.0),
            )
        except (IndexError, ValueError):
            raise TraceError(
                str(trace), "expected window_start,rate,cv,dist,param1,param2", line
            ) from None
        if rate <= 0:
            continue
        n_max = int(rate * 600 * 3) + 16
        if dist == "Gamma" and a > 0 and b > 0:
            gaps = gamma(rng, a, b, n_max)
        elif dist == "Weibull" and a > 0 and b > 0:
            gaps = b * weibull(rng, a, n_max)
        else:
            gaps = exponential(rng, 1.0 / rate, n_max)
        t = start + np.cumsum(gaps)
        t = t[t < start + 600.0]
        at = max((w for w in windows if w <= start), default=windows[0])
        window = pmfs[at]
        for name in FIELDS:
            values = ast.literal_eval(window[name])
            pmf = {"values": list(values), "probs": list(values.values())}
            fields[name].append(_draw(pmf, rng, t.size))
        arrivals.append(t)
    arrival = np.concatenate(arrivals) if arrivals else np.zeros(0)
    col = {k: (np.concatenate(v) if v else np.zeros(0, np.int64)) for k, v in fields.items()}
    images = col["image_count"]
    input_len = np.maximum(col["text_tokens"] + np.where(images > 0, col["image_tokens"], 0), 1)
    name = f"servegen-{trace.name.removesuffix('-trace.csv')}"
    output = np.maximum(col["output_tokens"], 1)
    return _lengths_only(name, arrival, input_len, output, block_tokens, "multimodal", images)


def main() -> None:
    """Rebuild the shipped PMF file from a ServeGen checkout (``python -m ...multimodal DIR``)."""
    import sys

    folder = Path(sys.argv[1])
    doc = {
        "source": "https://github.com/alibaba/ServeGen data/multimodal/mm-image "
        "(commit 4d6f0c7795d6b7ddc61fae1eeb73f9bd5a118f8f)",
        "licence": "Apache-2.0",
        "derivation": "every (client, 10-minute window) PMF of chunk-*-dataset.json mixed with "
        "weight = that window's mean request rate in chunk-*-trace.csv "
        "(traces/synth/multimodal.py pool_servegen)",
        "fields": pool_servegen(folder),
    }
    out = Path(__file__).parent / "data" / SHIPPED
    out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
