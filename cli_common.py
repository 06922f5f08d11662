"""Pieces every command module of the CLI shares: the UserError → one ``error:`` line + exit 2
handling (as a group class and as a decorator for commands that stand alone), ConfigWarning →
one ``warning:`` line, the ``--set`` option, the default output folder, the rich console and
the progress line."""

from __future__ import annotations

import errno
import functools
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from .errors import ConfigError, ConfigWarning, UserError

F = TypeVar("F", bound=Callable[..., Any])


class UserErrorGroup(click.Group):
    """Turns UserError into one clean line and exit status 2, and Ctrl-C into exit status 130
    (the shell's convention for SIGINT) instead of click's "Aborted!" and 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _show_warning
                return super().invoke(ctx)
        except UserError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)
        except OSError as exc:
            if not is_environment_error(exc):  # not about a path or the disk: a bug, show it
                raise
            click.echo(f"error: {path_error(exc)}", err=True)
            ctx.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


_python_showwarning = warnings.showwarning


def _show_warning(message: Warning | str, category: type[Warning], *args: Any, **kw: Any) -> None:
    """A ConfigWarning as one ``warning:`` line; any other warning as Python shows it."""
    if issubclass(category, ConfigWarning):
        click.echo(f"warning: {message}", err=True)
    else:
        _python_showwarning(message, category, *args, **kw)


class _CliError(click.ClickException):
    """One ``error:`` line on stderr, exit status 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class OneLineErrorCommand(click.Command):
    """A command that reports a bad option (value) as one ``error:`` line and exit status 2,
    with no usage banner, whether invoked under ``main`` or on its own."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _CliError(exc.format_message()) from None


def user_errors(f: F) -> F:
    """For a command that is also invoked on its own (outside a UserErrorGroup)."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except UserError as exc:
            raise _CliError(" ".join(str(exc).split())) from None
        except OSError as exc:
            if not is_environment_error(exc):
                raise
            raise _CliError(path_error(exc)) from None

    return wrapper  # type: ignore[return-value]


_FULL = tuple(c for c in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if c is not None)


def is_environment_error(exc: OSError) -> bool:
    """An OSError about a path the user named, or a full disk (which a library may raise
    without a file name: pyarrow does), is the environment's, not a bug."""
    return exc.filename is not None or exc.errno in _FULL


def path_error(exc: OSError) -> str:
    """``PermissionError(13, ..., "out/x.json")`` -> ``"out/x.json: Permission denied"``: the
    last line of defence for a path the user named that cannot be read or written (or a disk
    that filled, where the library did not say which file)."""
    if exc.filename is None:
        return f"cannot write: {os.strerror(exc.errno or 0)} (free space on the output disk)"
    return f"{exc.filename}: {exc.strerror or exc}"


OUTPUT_ROOT = "runs"


def default_out(name: str, suffix: str = "") -> Path:
    """``runs/<name><suffix>``: a command's output folder when no ``--out`` is given. A
    scenario ``name`` that would put it anywhere but inside ``runs/`` (``../x``, ``/etc``, or
    ``runs/`` itself) is a ConfigError naming the key, before anything is written."""
    folder = f"{name}{suffix}"
    norm = os.path.normpath(os.path.join(OUTPUT_ROOT, folder))
    if os.path.isabs(folder) or not norm.startswith(OUTPUT_ROOT + os.sep):
        raise ConfigError(
            "name",
            f"{name!r} would put the default output folder outside {OUTPUT_ROOT}/ (at {norm}): "
            "a scenario name becomes a folder name under it; rename the scenario or give --out",
        )
    return Path(norm)


def writable_dir(path: str | Path, what: str = "--out") -> Path:
    """Create folder ``path`` (with its parents) and prove a file can be written in it, before
    any work is done: an unwritable output folder is one UserError naming it, not a traceback
    after an hour of simulation."""
    import tempfile

    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserError(f"{what} {p}: is a file, not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".deepinfer-sim-probe-"):
            pass
    except OSError as exc:
        raise UserError(f"{what} {p}: cannot write there ({exc.strerror or exc})") from None
    return p


def writable_file(path: str | Path, what: str = "--out") -> Path:
    """Check, before any work, that file ``path`` can be written: not a folder, and its folder
    (created with its parents if missing, as the writers do) writable."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{what} {p}: is a folder (expected a file name)")
    writable_dir(p.parent, what=f"{what} {p}: folder")
    return p


def write_text(path: str | Path, text: str, what: str = "--out") -> None:
    """Write ``text`` to ``path`` atomically; failing is one UserError naming the option, the
    path and (a full disk) the space it needs."""
    from .sim.results.files import OutputError
    from .sim.results.files import write_text as write

    try:
        write(path, text)
    except OutputError as exc:
        raise UserError(f"{what} {exc}") from None


def overrides_option(help_text: str) -> Callable[[F], F]:
    def decorate(f: F) -> F:
        return click.option(
            "--set", "overrides", multiple=True, metavar="KEY=VALUE", help=help_text
        )(f)

    return decorate


def console(stderr: bool = False):
    """A rich console; when its stream is not a terminal (piped, redirected), as wide as
    ``$COLUMNS`` or 240 columns, so tables are never cut to rich's default 80."""
    import os
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", "240"))
    return Console(stderr=stderr, highlight=False, width=width)


class Progress:
    """A run's progress: a live bar on a terminal, else one plain line to stderr, the first
    ``first_s`` wall seconds in (default 5 s, or ``every_s`` if that is sooner: a long run shows
    it started), then at most every ``every_s`` (a run in a pipe or a batch job is never silent
    for long). Lines come when the simulator reports (sim/run.py: every 1/50 of the arrival
    span), so no more often than that."""

    def __init__(self, enabled: bool, every_s: float = 30.0, first_s: float = 5.0) -> None:
        import sys
        import time

        self._clock = time.monotonic
        self._start = self._clock()
        self._due = self._start + min(first_s, every_s)
        self._every = every_s
        self._bar: Any = None
        self.enabled = enabled
        if enabled and sys.stderr.isatty():
            from rich.progress import Progress as Bar

            self._bar = Bar(console=console(stderr=True), transient=True)
            self._task = self._bar.add_task("simulating", total=None)
            self._bar.start()

    def __call__(self, now: float, ended: int, total: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=ended, total=total, description=f"t={now:,.0f}s")
            return
        wall = self._clock()
        if wall >= self._due:
            self._due = wall + self._every
            click.echo(
                f"progress: {now:,.0f} simulated s, {ended:,} of {total:,} requests ended, "
                f"{wall - self._start:,.0f} s wall",
                err=True,
            )

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def figure(x: float) -> str:
    """A published or simulated figure: thousands separators from 100 up, 3 digits below."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
