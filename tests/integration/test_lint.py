"""ruff and mypy over the whole tree (what ``scripts/check`` runs): CI runs the README's test
command, so this is how CI keeps the tree lint- and type-clean."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]')")
    return found


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff(args: list[str]) -> None:
    res = subprocess.run([_tool("ruff"), *args], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]


def test_mypy(tmp_path: Path) -> None:
    """Through a link named deepinfer_sim, so module names are the import name whatever the
    checkout folder is called."""
    (tmp_path / "deepinfer_sim").symlink_to(ROOT, target_is_directory=True)
    cmd = [_tool("mypy"), "--config-file", str(ROOT / "pyproject.toml")]
    cmd += ["--cache-dir", str(ROOT / ".mypy_cache"), "deepinfer_sim"]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
