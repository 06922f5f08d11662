"""Shared fixtures: tiny synthetic workloads and scenarios that run in milliseconds; and a
closing line naming the runtime dependencies the run tested (the newest releases where the
README's install line resolved them: the ceiling; ``test_dependency_floor.py`` tests the floor)."""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from packaging.requirements import Requirement

from deepinfer_sim.scenario import Scenario, scenario_from_dict
from deepinfer_sim.traces import RequestSource

# The repository root is the ``deepinfer_sim`` package itself, so pytest sees it as a test package
# and, before the first test, imports its ``__init__.py`` (looking for a ``setup_module``) under
# the checkout folder's name; for a folder such as ``deepinfer-sim``, not a Python identifier,
# that import fails and every test errors. The root has no setup: skip it (the tests import the
# installed package as usual).
_REPO_ROOT = Path(__file__).resolve().parents[1]
_package_setup = pytest.Package.setup


def _setup_unless_repo_root(self: pytest.Package) -> None:
    if Path(self.path).resolve() != _REPO_ROOT:
        _package_setup(self)


pytest.Package.setup = _setup_unless_repo_root  # type: ignore[method-assign]


@pytest.fixture(autouse=True, scope="session")
def _piped_width_as_without_workers() -> None:
    """pytest-xdist's workers run with ``COLUMNS=80``; the CLI tests read the width a piped
    run gets (``cli_common.console``: 240 unless ``COLUMNS`` says otherwise), as they do when
    the suite runs in one process."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)


SOURCE_ARRAYS = (
    "arrival_s",
    "input_len",
    "output_len",
    "block_offsets",
    "block_hashes",
    "traffic_class",
    "image_count",
    "session_id",
)


def assert_same_source(a: RequestSource, b: RequestSource, *, exact: bool = False) -> None:
    """Every column, class name and block size equal; ``exact`` also checks dtypes and name."""
    for field in SOURCE_ARRAYS:
        x, y = getattr(a, field), getattr(b, field)
        if exact:
            assert x.dtype == y.dtype, field
        np.testing.assert_array_equal(x, y, err_msg=field)
    assert (a.class_names, a.block_tokens) == (b.class_names, b.block_tokens)
    if exact:
        assert a.name == b.name


def make_source(
    arrivals: Any,
    input_len: Any,
    output_len: Any,
    images: Any = None,
    classes: Any = None,
    class_names: tuple[str, ...] = ("chatbot",),
    block_tokens: int = 512,
) -> RequestSource:
    """A source whose requests share no prefix blocks (fresh ids for every block)."""
    arrivals = np.asarray(arrivals, dtype=float)
    n = arrivals.size
    input_len = np.broadcast_to(np.asarray(input_len, dtype=np.int64), (n,))
    output_len = np.broadcast_to(np.asarray(output_len, dtype=np.int64), (n,))
    blocks = -(-input_len // block_tokens)
    offsets = np.concatenate([[0], np.cumsum(blocks)])
    return RequestSource.from_columns(
        arrival_s=arrivals,
        input_len=input_len,
        output_len=output_len,
        block_offsets=offsets,
        block_hashes=np.arange(offsets[-1]),
        block_tokens=block_tokens,
        image_count=None if images is None else np.broadcast_to(images, (n,)),
        traffic_class=None if classes is None else classes,
        class_names=class_names,
        name="synthetic",
    )


def tiny_dict(**over: Any) -> dict[str, Any]:
    """A small deployment: 2 prefill instances (EP2) + one EP8 decode group on B200."""
    data: dict[str, Any] = {
        "name": "tiny",
        "seed": 1,
        "pools": {
            "prefill": {"instances": 2, "ep": 2, "hardware": "b200"},
            "decode": {"groups": 1, "ep": 8, "hardware": "b200", "max_seqs_per_rank": 64},
        },
        "workload": {"trace": "builtin:mooncake_conversation", "max_requests": 200},
        "sim": {"progress": False, "timeseries_interval_s": 0.5},
    }
    for key, value in over.items():
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return data


@pytest.fixture
def tiny() -> Callable[..., Scenario]:
    """``tiny(**{"pools.decode.ep": 16})`` -> a validated tiny Scenario."""

    def build(**over: Any) -> Scenario:
        return scenario_from_dict(tiny_dict(**over))

    return build


@pytest.fixture
def synthetic() -> Callable[..., RequestSource]:
    """``synthetic(arrivals, input_len, output_len, images=None)`` -> a RequestSource."""
    return make_source


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """``runtime dependencies tested: numpy 2.4.1, ...``, from the installed package's
    requirements, so that a CI log says which releases passed."""
    names = [
        Requirement(r).name
        for r in importlib.metadata.requires("deepinfer-sim") or []
        if "extra ==" not in r
    ]
    tested = ", ".join(f"{n} {importlib.metadata.version(n)}" for n in names)
    terminalreporter.write_line(f"runtime dependencies tested: {tested}")
