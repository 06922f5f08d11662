"""The ``vllm bench serve`` vocabulary in summary.json, next to the simulator's own.

A latency distribution (TTFT, TPOT, ITL per decode step and per token, E2E) carries the mean,
the standard deviation, the extremes and the percentiles ``sim.percentiles`` asks for (p50, p90
and p99 always: the CLI, the planner and the report read them). Throughput states its totals
(requests completed, input and output tokens, duration), its peak output rate over one
time-series interval and the peak number of requests in flight. Goodput counts a request good
only when it meets every SLO that is set, an end-to-end one included, and says which it applied.

Each run is the tiny deployment (2 EP2 prefill instances, one EP8 decode group) on 200 Mooncake
conversation requests: about 80 simulated seconds, well under a second of wall time.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
import pytest
from conftest import tiny_dict

from deepinfer_sim import simulate
from deepinfer_sim.errors import ConfigError
from deepinfer_sim.scenario import scenario_from_dict
from deepinfer_sim.sim.results.result import Result

DISTRIBUTIONS = ("ttft_s", "tpot_s", "itl_s", "itl_per_token_s", "e2e_s")
DEFAULT_KEYS = ("p50", "p90", "p95", "p99", "p99.9")


def run(**over: Any) -> Result:
    return simulate(scenario_from_dict(tiny_dict(**over)))


@pytest.fixture(scope="module")
def base() -> Result:
    return run()


def done(res: Result) -> Any:
    req = res.requests
    return req[req["state"] == "done"]


def test_every_latency_distribution_has_mean_std_min_max_and_the_default_percentiles(base):
    """Ordered as a distribution must be: min <= p50 <= ... <= p99.9 <= max, the mean between
    the extremes, a non-negative spread."""
    lat = base.summary["latency"]
    assert lat["itl_s_per"] == "decode step"
    for name in DISTRIBUTIONS:
        d = lat[name]
        assert set(d) == {"mean", "std", "min", "max", *DEFAULT_KEYS}, name
        chain = [d["min"], *(d[k] for k in DEFAULT_KEYS), d["max"]]
        assert all(a <= b for a, b in pairwise(chain)), (name, chain)
        assert d["min"] <= d["mean"] <= d["max"] and d["std"] >= 0, name
        assert d["min"] > 0, name


def test_ttft_tpot_e2e_statistics_are_the_requests_tables(base):
    """The unweighted distributions are plain statistics of the per-request columns."""
    req = done(base)
    lat = base.summary["latency"]
    for name in ("ttft_s", "e2e_s", "tpot_s"):
        v = req[name].dropna().to_numpy()
        d = lat[name]
        assert d["mean"] == pytest.approx(v.mean())
        assert d["std"] == pytest.approx(v.std())
        assert (d["min"], d["max"]) == (pytest.approx(v.min()), pytest.approx(v.max()))
        assert d["p99.9"] == pytest.approx(np.percentile(v, 99.9))
    # the largest per-step ITL of any request is the distribution's maximum
    assert lat["itl_s"]["max"] == pytest.approx(req["itl_max_s"].max())


def test_configured_percentiles_are_reported_and_p50_p90_p99_always():
    res = run(**{"sim.percentiles": [25, 75, 99.99]})
    req = done(res)
    for name in DISTRIBUTIONS:
        d = res.summary["latency"][name]
        assert set(d) == {"mean", "std", "min", "max", "p25", "p50", "p75", "p90", "p99", "p99.99"}
        assert d["p25"] <= d["p50"] <= d["p75"] <= d["p90"] <= d["p99"] <= d["p99.99"] <= d["max"]
    ttft = req["ttft_s"].to_numpy()
    assert res.summary["latency"]["ttft_s"]["p75"] == pytest.approx(np.percentile(ttft, 75))


@pytest.mark.parametrize("bad", [[50, 101], [-1], []])
def test_percentiles_out_of_range_are_refused(bad):
    with pytest.raises(ConfigError, match=r"sim\.percentiles"):
        scenario_from_dict(tiny_dict(**{"sim.percentiles": bad}))


def test_totals_are_the_requests_tables_sums(base):
    thr, req = base.summary["throughput"], done(base)
    assert thr["completed"] == len(req) == base.summary["requests"]["completed"]
    assert thr["total_input_tokens"] == int(req["input_tokens"].sum())
    assert thr["total_output_tokens"] == int(req["output_tokens"].sum())
    span = req["t_done_s"].max() - base.requests["arrival_s"].min()
    assert thr["duration_s"] == pytest.approx(span)
    assert thr["output_tok_per_s"] == pytest.approx(thr["total_output_tokens"] / span)


def test_peak_output_throughput_is_the_busiest_interval_and_beats_the_mean(base):
    """Per interval: decode tokens from the time series plus first tokens from the requests
    table; every output token is delivered in exactly one interval."""
    thr, ts, req = base.summary["throughput"], base.timeseries, base.requests
    assert thr["peak_window_s"] == 0.5
    edges = np.concatenate([[0.0], ts["t_s"].to_numpy()])
    decoded = ts["output_tok_per_s"].to_numpy() * np.diff(edges)
    firsts = np.histogram(req["t_first_token_s"].dropna(), bins=edges)[0]
    per_interval = decoded + firsts
    assert per_interval.sum() == pytest.approx(thr["total_output_tokens"])
    assert thr["peak_output_tok_per_s"] == pytest.approx(per_interval.max() / 0.5)
    assert thr["peak_output_tok_per_s"] >= thr["output_tok_per_s"]


def test_peak_concurrency_counts_requests_between_arrival_and_completion(base):
    thr, req = base.summary["throughput"], base.requests
    arr, fin = req["arrival_s"].to_numpy(), req["t_done_s"].to_numpy()
    brute = max(int(((arr <= t) & (fin > t)).sum()) for t in arr)
    assert thr["peak_concurrent_requests"] == brute
    # the time series samples in-flight counts now and then: never above the exact peak
    ts = base.timeseries
    sampled = (ts["arrived"] - ts["completed"] - ts["rejected"]).max()
    assert 0 < sampled <= thr["peak_concurrent_requests"]


def test_an_e2e_slo_counts_only_requests_meeting_every_slo(base):
    """Without ``slo.e2e_s`` goodput applies TTFT and TPOT; with a tight one (the median E2E)
    about half the requests drop out, exactly those over it."""
    assert base.summary["goodput"]["slo"] == {"ttft_s": 5.0, "tpot_s": 0.05}
    median = float(done(base)["e2e_s"].median())
    res = run(**{"slo.e2e_s": median})
    good = res.summary["goodput"]
    assert good["slo"] == {"ttft_s": 5.0, "tpot_s": 0.05, "e2e_s": median}
    req = done(res)
    meets = (req["ttft_s"] <= 5.0) & (req["tpot_s"].fillna(0.0) <= 0.05) & (req["e2e_s"] <= median)
    assert good["requests"] == int(meets.sum())
    assert good["requests"] < base.summary["goodput"]["requests"]
    assert good["fraction_of_completed"] == pytest.approx(meets.mean())


def test_itl_per_token_equals_per_step_without_speculative_decoding():
    lat = run(**{"policies.speculative.policy": "none"}).summary["latency"]
    assert lat["itl_per_token_s"] == pytest.approx(lat["itl_s"])


def test_itl_per_token_under_speculative_decoding(base):
    """A DSpark step delivers several tokens per sequence: the per-token gap is shorter than
    the per-step one, and its mean is the decode time per decoded token (TPOT weighted by
    tokens)."""
    lat = base.summary["latency"]
    assert base.summary["decode"]["accepted_tokens_per_seq_step"] > 1.5
    assert lat["itl_per_token_s"]["mean"] < lat["itl_s"]["mean"] / 1.5
    req = done(base)
    decoded = (req["output_tokens"] - 1).clip(lower=0)
    per_token = (req["t_done_s"] - req["t_first_token_s"]).sum() / decoded.sum()
    assert lat["itl_per_token_s"]["mean"] == pytest.approx(per_token, rel=1e-6)
