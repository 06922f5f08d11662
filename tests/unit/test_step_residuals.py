"""Step residuals of the engine-core replays: the batch rebuild and the ratios."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from deepinfer_sim.calibration.step_residuals import (
    decode_batches,
    decode_residuals,
    prefill_prompts,
    prefill_residuals,
    residuals,
)

STORED = Path(__file__).resolve().parents[2] / "calibration" / "validation" / "h200-deepseek"


class FixedCost:
    """Every decode step 1 ms, every prefill step 1 µs per token."""

    def decode_step(self, batch, kv, verify):
        return 1e-3

    def prefill_step(self, ranks):
        return 1e-6 * sum(n for c in ranks for n, _ in c)


def _steps(starts, seqs, kv):
    starts = np.asarray(starts, float)
    return pd.DataFrame(
        {
            "start_s": starts,
            "end_s": starts + 2e-3,
            "decode_seqs": seqs,
            "decode_kv_tokens": kv,
            "prefill_tokens": 0,
            "prefill_seqs": 0,
        }
    )


def test_decode_batches_admits_in_order_up_to_the_limit_and_retires_after_output_minus_one():
    reqs = pd.DataFrame(
        {
            "arrival_s": [0.0, 0.0, 0.0, 0.05],
            "prompt_len": [10, 20, 30, 40],
            "output_len": [2, 3, 3, 2],
        }
    )
    steps = _steps([0.0, 0.01, 0.02, 0.06], [2, 2, 1, 1], [30, 52, 31, 40])
    rebuilt = decode_batches(reqs, steps, max_batch=2)
    assert rebuilt["batch"].tolist() == [2, 2, 1, 1]
    # step 0: requests 0 and 1; step 1: request 0 left, 1 (ctx 21) and 2 (ctx 30); step 2: 2 alone
    assert rebuilt["kv_sum"].tolist() == [30, 51, 31, 40]
    assert rebuilt["kv_max"].tolist() == [20, 30, 31, 40]


def test_ratios_are_measured_over_predicted_and_split_uniform_from_mixed():
    reqs = pd.DataFrame({"arrival_s": [0.0, 0.0], "prompt_len": [10, 10], "output_len": [3, 2]})
    steps = _steps([0.0, 0.01], [2, 1], [20, 11])
    res = decode_residuals(reqs, steps, FixedCost(), max_batch=8)
    assert res["rebuilt_batch_matches"] == 2
    assert res["ratio_p50_uniform"] == 2.0
    assert np.isnan(res["ratio_p50_mixed"])


def test_prefill_steps_are_rebuilt_from_the_request_list_first_come_first_served():
    """Step k holds the next ``prefill_seqs`` prompts; a step whose prompts do not sum to its
    recorded tokens is left out, and the ratios are measured over predicted."""
    reqs = pd.DataFrame({"prompt_len": [1000, 300, 200, 50, 70], "arrival_s": 0.0})
    pre = pd.DataFrame(
        {
            "start_s": [0.0, 1.0, 2.0],
            "end_s": [1e-3, 1.001, 2.001],
            "prefill_tokens": [1000, 500, 999],
            "prefill_seqs": [1, 2, 2],
        }
    )
    assert prefill_prompts(reqs, pre) == [[1000], [300, 200], None]
    out = prefill_residuals(reqs, pre, FixedCost())
    assert out["rebuilt_steps"] == 2 and out["one_prompt_steps"] == 1
    assert out["ratio_p50"] == pytest.approx(1.5)  # 1 ms measured / 1 ms and 0.5 ms predicted
    assert [r["steps"] for r in out["by_prompts"]] == [1, 1]


def test_the_stored_replays_are_rebuilt_step_for_step():
    res = residuals(STORED, str(STORED / "shipped-calls5-6.yaml"))  # the profile they ran with
    dec = res["mooncake_conversation"]["decode"]
    assert dec["rebuilt_batch_matches"] == dec["steps"] > 1000
    for trace in res.values():
        assert trace["prefill"]["one_prompt_steps"] > 50
        assert trace["prefill"]["rebuilt_steps"] == trace["prefill"]["steps"]
