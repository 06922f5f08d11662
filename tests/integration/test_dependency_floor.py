"""The oldest dependencies we claim to support, tested: the smoke matrix at the floor.

``pyproject.toml`` states a lower bound for every runtime dependency, and
``constraints/floor.txt`` pins each one to exactly that bound. The test below builds a fresh
virtual environment in a temporary folder (no system site-packages, no torch), installs the
package with those pins (dependencies the pins do not name resolve to their newest release, as
they would for a user installing the floor today) and runs
``tests/integration/test_smoke_matrix.py`` there, every command on every bundled scenario, with
that environment's own interpreter (and the TTL sweep's unit tests). The newest releases (the
ceiling) are what every other test runs on, since the README's install line resolves them; the
suite's last lines name their versions.

It needs the package index: where the index cannot be reached the test skips and says so, but
once the install has worked a failing command fails it. ``DEEPINFER_SKIP_FLOOR=1`` skips it (the
install takes a minute or two on a cold pip cache). In that run DeprecationWarnings are shown,
not raised: at the floor they come from newer transitive releases complaining about what an old
direct dependency calls (pyparsing 3.3 about matplotlib 3.8's camelCase names), which Python's
default filters hide from users and which does not break a command. Every other warning is
still an error there, as in the rest of the suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).parents[2]
FLOOR = ROOT / "constraints" / "floor.txt"
# The CLI smoke matrix, the TTL sweep's own tests (where numpy 2.4 once broke `sweep ttl`) and
# the compiled steps against their references (numba's oldest release compiling them for numpy's),
# the run's tables written through Arrow without pandas, and block ids kept in 4 bytes.
AT_THE_FLOOR = [
    "tests/integration/test_smoke_matrix.py",
    "tests/unit/test_ttl_sweep.py",
    "tests/unit/test_compiled_steps.py",
    "tests/unit/test_run_start.py",
    "tests/unit/test_block_id_width.py",
]

# What pip prints when it cannot reach an index, as opposed to failing to resolve or build.
NETWORK_ERRORS = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Name or service not known|"
    r"Temporary failure in name resolution|ConnectTimeout|ReadTimeout|timed out|ProxyError|"
    r"Network is unreachable|Connection refused|Could not fetch URL|SSLError"
)


def runtime_floors() -> dict[str, Version]:
    """Runtime dependency -> the lower bound ``pyproject.toml`` states for it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    floors = {}
    for line in project["dependencies"]:
        req = Requirement(line)
        lower = [s.version for s in req.specifier if s.operator == ">="]
        assert len(lower) == 1, f"{line}: expected one >= bound"
        floors[req.name.lower()] = Version(lower[0])
    return floors


def pinned() -> dict[str, str]:
    """Package -> version, from the ``name==version`` lines of ``constraints/floor.txt``."""
    pins = {}
    for line in FLOOR.read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def test_floor_file_pins_every_runtime_dependency_at_its_stated_floor() -> None:
    """The pins and pyproject's bounds cannot drift apart: raising a floor means both."""
    assert {name: Version(v) for name, v in pinned().items()} == runtime_floors()


def _index_unreachable() -> str | None:
    """Why pip's package index cannot be reached, or None when it answers."""
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        from pip._internal.models.index import PyPI  # pip's default index, as pip uses it

        url = PyPI.simple_url
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/simpy/", timeout=20):
            return None
    except (urllib.error.URLError, OSError) as exc:
        return f"package index {url} unreachable ({exc})"


# NPY_DISABLE_CPU_FEATURES names numpy 2's SIMD targets (X86_V3, ...), which the floor's numpy
# 1.x rejects at import; the CPU switches are test_portability.py's business, not this test's
_NOT_PASSED_ON = ("PYTHONPATH", "VIRTUAL_ENV", "NPY_DISABLE_CPU_FEATURES")


def _run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _NOT_PASSED_ON}
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 60) -> str:
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-lines:])


@pytest.mark.floor
@pytest.mark.skipif(
    os.environ.get("DEEPINFER_SKIP_FLOOR") == "1", reason="DEEPINFER_SKIP_FLOOR=1 is set"
)
def test_smoke_matrix_passes_on_the_oldest_supported_dependencies(tmp_path: Path) -> None:
    why = _index_unreachable()
    if why:
        pytest.skip(why)
    venv = tmp_path / "floor-venv"
    made = _run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, _tail(made)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--timeout", "60", "--retries", "2"]
    install = _run(
        [*pip, "--constraint", str(FLOOR), "--editable", str(ROOT), f"pytest=={pytest.__version__}"]
    )
    if install.returncode != 0:
        if NETWORK_ERRORS.search(install.stdout + install.stderr):
            pytest.skip(f"installing the floor needs the package index: {_tail(install, 3)}")
        pytest.fail(f"the floor does not install:\n{_tail(install)}")

    check = "import importlib.metadata as m, sys; print(*(m.version(n) for n in sys.argv[1:]))"
    pins = pinned()
    got = _run([python, "-c", check, *pins])
    assert got.returncode == 0, _tail(got)
    assert dict(zip(pins, got.stdout.split(), strict=True)) == pins
    no_torch = _run([python, "-c", "import importlib.util as u; print(u.find_spec('torch'))"])
    assert no_torch.stdout.strip() == "None"

    pytest_cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    smoke = _run([*pytest_cmd, "-W", "default::DeprecationWarning", *AT_THE_FLOOR], cwd=ROOT)
    assert smoke.returncode == 0, f"the smoke tests fail at the floor:\n{_tail(smoke, 120)}"
    assert re.search(r"\b\d+ passed\b", smoke.stdout), _tail(smoke)
