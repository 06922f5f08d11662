"""Refactors keep results: every golden case gives the stored summary and per-request hashes.

Regenerate only on purpose (``python tests/golden/cases.py --update``), saying why in the commit.
"""

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "golden_cases", Path(__file__).parents[1] / "golden" / "cases.py"
)
assert _spec and _spec.loader
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)


@pytest.mark.parametrize("name", list(cases.CASES))
def test_golden_case_is_unchanged(name):
    want = json.loads(cases.GOLDEN.read_text())[name]
    got = json.loads(json.dumps(cases.run_case(name)))
    assert got["summary"] == want["summary"]
    assert got["requests_sha256"] == want["requests_sha256"]
    assert got["timeseries_sha256"] == want["timeseries_sha256"]


def test_the_hash_sees_one_changed_value():
    import pandas as pd

    a = pd.DataFrame({"x": [1.0, 2.0], "y": [3, 4]})
    b = a.copy()
    b.loc[1, "x"] = 2.0000001
    assert cases.frame_hash(a) == cases.frame_hash(a.copy())
    assert cases.frame_hash(a) != cases.frame_hash(b)
    assert cases.frame_hash(a) != cases.frame_hash(a.rename(columns={"y": "z"}))
