"""The CLI's behaviour outside a terminal: plain progress lines, full-width tables, Ctrl-C."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from deepinfer_sim.cli_common import Progress, UserErrorGroup, console


def test_progress_off_a_terminal_is_rate_limited_plain_lines(capsys) -> None:
    p = Progress(True, every_s=0.0)
    p(10.0, 5, 100)
    p(20.0, 9, 100)
    p.stop()
    err = capsys.readouterr().err.splitlines()
    assert err == [line for line in err if line.startswith("progress: ")] and len(err) == 2
    assert "9 of 100 requests ended" in err[1]
    quiet = Progress(True, every_s=3600.0)
    quiet(1.0, 1, 2)
    assert capsys.readouterr().err == ""  # not yet due


def test_tables_are_not_cut_when_piped(monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width >= 240  # pytest captures stdout: not a terminal


def test_ctrl_c_exits_130() -> None:
    @click.group(cls=UserErrorGroup)
    def cli() -> None: ...

    @cli.command()
    def slow() -> None:
        raise KeyboardInterrupt

    res = CliRunner().invoke(cli, ["slow"])
    assert res.exit_code == 130 and "interrupted" in res.output


@pytest.mark.parametrize("flag", ["--progress", "--no-progress"])
def test_run_reports_progress_only_when_asked(flag: str, tmp_path, monkeypatch) -> None:
    """Off a terminal, --progress prints plain progress lines (here due at once), and
    --no-progress prints none."""
    import deepinfer_sim.cli as cli

    monkeypatch.setattr(cli, "Progress", lambda enabled: Progress(enabled, every_s=0.0))
    args = ["run", "default", "--set", "workload.max_requests=20", "--no-plots", flag]
    res = CliRunner().invoke(cli.main, [*args, "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert ("progress: " in res.output) == (flag == "--progress")
