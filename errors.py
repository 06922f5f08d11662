"""User-facing error types.

Every error a user can cause (a bad config key, a malformed trace row, a bad CLI value) is raised
as a subclass of :class:`UserError` carrying one message that names *what* is wrong and *where*.
The CLI prints that message and exits non-zero; it never shows a traceback for these.
Internal bugs (violated invariants) are :class:`InvariantError` and are not user errors.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user supplied is wrong; the message says what and where."""


class ConfigError(UserError):
    """A scenario/config value is invalid. ``path`` is the dotted key path."""

    def __init__(self, path: str, message: str, source: str | None = None) -> None:
        self.path = path
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{path}: {message}" if path else f"{where}{message}")


class TraceError(UserError):
    """A trace file is malformed. Names the file, the 1-based line (when known) and the field."""

    def __init__(self, file: str, message: str, line: int | None = None) -> None:
        self.file = file
        self.line = line
        loc = f"{file}:{line}" if line is not None else file
        super().__init__(f"{loc}: {message}")


class InvariantError(AssertionError):
    """An end-of-run conservation check failed: a simulator bug, never bad input."""


class ConfigWarning(UserWarning):
    """A config value that is valid but does nothing in this run (say, prices for a traffic
    class the workload never produces). The CLI shows it as one ``warning:`` line."""
