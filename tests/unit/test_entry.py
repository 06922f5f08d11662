"""The console script's entry (``entry.py``) leaves without the interpreter's teardown but with
``sys.exit``'s codes and messages, its output flushed, its exit handlers run, and — while a
thread still works — the normal, waiting exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

_RUN = """
import sys
sys.argv = ["deepinfer-sim", *{args!r}]
{before}
from deepinfer_sim.entry import main
main()
"""


def _entry(args: list[str], before: str = "") -> subprocess.CompletedProcess[str]:
    code = _RUN.format(args=args, before=before)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_a_command_that_succeeds_exits_0_with_its_output_flushed() -> None:
    done = _entry(["--help"])
    assert done.returncode == 0
    assert done.stdout.startswith("Usage: deepinfer-sim") and "run" in done.stdout


def test_a_bad_command_line_keeps_its_code_and_message() -> None:
    done = _entry(["no-such-command"])
    assert done.returncode == 2
    assert "No such command 'no-such-command'" in done.stderr


@pytest.mark.parametrize(
    ("code", "rc", "err"), [(None, 0, ""), (3, 3, ""), ("stopped", 1, "stopped")]
)
def test_exit_codes_are_sys_exits(code: object, rc: int, err: str, tmp_path: Path) -> None:
    """None is 0, an integer itself, a message printed and 1; exit handlers run first."""
    mark = tmp_path / "handler-ran"
    before = (
        "import atexit, pathlib\n"
        f"atexit.register(lambda: pathlib.Path({str(mark)!r}).write_text('yes'))\n"
        "import deepinfer_sim.cli\n"
        f"deepinfer_sim.cli.main = lambda: sys.exit({code!r})\n"
    )
    done = _entry([], before)
    assert done.returncode == rc and done.stderr.strip() == err
    assert mark.read_text() == "yes"


def test_a_working_thread_is_waited_for(tmp_path: Path) -> None:
    out = tmp_path / "late"
    before = (
        "import threading, time, pathlib\n"
        f"threading.Thread(target=lambda: (time.sleep(0.3), pathlib.Path({str(out)!r})"
        ".write_text('done'))).start()\n"
        "import deepinfer_sim.cli\n"
        "deepinfer_sim.cli.main = lambda: None\n"
    )
    done = _entry([], before)
    assert done.returncode == 0 and out.read_text() == "done"
