"""Pieces every command module of the CLI shares: the UserError → one ``error:`` line + exit 2
handling (as a group class and as a decorator for commands that stand alone), the ``--set``
option and the rich console."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


class UserErrorGroup(click.Group):
    """Turns UserError into one clean line and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)


class _CliError(click.ClickException):
    """One ``error:`` line on stderr, exit status 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def user_errors(f: F) -> F:
    """For a command that is also invoked on its own (outside a UserErrorGroup)."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except UserError as exc:
            raise _CliError(" ".join(str(exc).split())) from None

    return wrapper  # type: ignore[return-value]


def overrides_option(help_text: str) -> Callable[[F], F]:
    def decorate(f: F) -> F:
        return click.option(
            "--set", "overrides", multiple=True, metavar="KEY=VALUE", help=help_text
        )(f)

    return decorate


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)
