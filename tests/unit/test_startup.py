"""Start-up stays cheap: the CLI, the default scenario and its trace load without the heavy
libraries (imported by the commands and stages that need them), the package's API names are
imported on first use, and the parsed copy of the shipped Mooncake trace is the trace itself.
Times are measured by ``benchmarks/startup.py``, not here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import deepinfer_sim
from deepinfer_sim.traces import read_mooncake, read_trace, resolve_trace_path
from deepinfer_sim.traces._cache import cache_path, cached_columns
from deepinfer_sim.traces.readers.mooncake import mooncake_columns

HEAVY = ("matplotlib", "scipy", "pandas", "pyarrow", "rich", "torch", "ray", "numba")

_STARTUP = """
import json, sys
heavy = {heavy!r}
loaded = lambda: sorted(m for m in heavy if m in sys.modules)
import deepinfer_sim.cli
after_import = loaded()
from deepinfer_sim import load_scenario
from deepinfer_sim.traces.workload import build_source
sc = load_scenario("default")
build_source(sc.workload, sc.seed)
print(json.dumps({{"import": after_import, "load_and_trace": loaded()}}))
"""


def test_startup_imports_no_heavy_library():
    code = _STARTUP.format(heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"import": [], "load_and_trace": []}


def test_api_names_are_imported_on_first_use():
    from deepinfer_sim.scenario import load_scenario
    from deepinfer_sim.sim.run import simulate

    assert deepinfer_sim.simulate is simulate
    assert deepinfer_sim.load_scenario is load_scenario
    assert set(deepinfer_sim.__all__) <= set(dir(deepinfer_sim))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = deepinfer_sim.nope


def _mooncake_trace() -> Path:
    return resolve_trace_path("builtin:mooncake_conversation")[0]


def test_shipped_copy_holds_the_parsed_trace():
    cached = cached_columns(_mooncake_trace())
    assert cached is not None, "rebuild it: python -m deepinfer_sim.traces._cache"
    parsed = mooncake_columns(_mooncake_trace())
    assert cached.keys() == parsed.keys()
    for key, column in parsed.items():
        assert cached[key].dtype == column.dtype, key
        assert np.array_equal(cached[key], column), key


def test_builtin_read_through_the_copy_equals_the_reader():
    via_copy = read_trace("builtin:mooncake_conversation", traffic_class="agent")
    parsed = read_mooncake(_mooncake_trace(), "agent").with_name("mooncake_conversation")
    assert via_copy.name == parsed.name and via_copy.class_names == parsed.class_names
    assert via_copy.block_tokens == parsed.block_tokens
    for key in ("arrival_s", "input_len", "output_len", "block_offsets", "block_hashes"):
        assert np.array_equal(getattr(via_copy, key), getattr(parsed, key)), key


def test_a_stale_or_broken_copy_is_not_used(tmp_path):
    trace = tmp_path / "mooncake_conversation.jsonl.gz"
    shutil.copyfile(_mooncake_trace(), trace)
    copy = cache_path(trace)
    shutil.copyfile(cache_path(_mooncake_trace()), copy)
    assert cached_columns(trace) is not None
    trace.write_bytes(b'{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [7]}\n')
    assert cached_columns(trace) is None
    copy.write_bytes(b"not a zip file")
    assert cached_columns(trace) is None
