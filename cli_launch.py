"""``deepinfer-sim launch``: the launch files of CONFIG's deployment (``planner/launch.py``):
``sglang.sh``, ``vllm.sh`` and a Dynamo ``dynamo.yaml`` in ``DIR/launch/``.

``cli.py`` registers the command on the main group. A mistake — a bad value, a config error, an
unwritable ``--out`` — is one ``error:`` line on stderr and exit status 2, the same whether
invoked under ``main`` or on its own.
"""

from __future__ import annotations

from pathlib import Path

import click

from .cli_common import (
    OneLineErrorCommand,
    console,
    default_out,
    overrides_option,
    user_errors,
    writable_dir,
)


@click.command("launch", cls=OneLineErrorCommand)
@click.argument("config", default="default")
@overrides_option(
    "Override a config value by dotted key, e.g. --set pools.decode.ep=128 (repeatable)."
)
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False),
    help="Folder to write launch/ in (default runs/<name>, beside `run`'s results).",
)  # fmt: skip
@click.option(
    "--dynamo-backend", type=click.Choice(["sglang", "vllm"]), default="sglang",
    show_default=True, help="The engine of dynamo.yaml's workers.",
)  # fmt: skip
@user_errors
def launch(
    config: str, overrides: tuple[str, ...], out_dir: str | None, dynamo_backend: str
) -> None:
    """Launch files for CONFIG's deployment: sglang.sh and vllm.sh (the prefill and decode
    servers, or the aggregated ones, and the router; run `sglang.sh ROLE`, DRY_RUN=1 prints the
    command) and dynamo.yaml (a Dynamo DynamoGraphDeployment). What the engines cannot express
    is a `# not expressed:` comment in each file. See docs/planner.md."""
    from .planner.launch import CHECKED_AGAINST, Engine, write_launch_files
    from .scenario import load_scenario

    sc = load_scenario(config, list(overrides))
    path = Path(config)
    base_dir = path.parent if path.is_file() else None  # its relative model/hardware files
    out = writable_dir(Path(out_dir) if out_dir else default_out(sc.name))
    backend: Engine = "vllm" if dynamo_backend == "vllm" else "sglang"
    paths = write_launch_files(sc, out, dynamo_backend=backend, base_dir=base_dir)
    con = console()
    for p in paths:
        notes = sum(line.startswith("# not expressed:") for line in p.read_text().splitlines())
        con.print(f"{p}  ({notes} settings not expressed, listed in the file)", markup=False)
    checked = ", ".join(f"{k} {v}" for k, v in CHECKED_AGAINST.items())
    con.print(f"flags and manifest checked against {checked}", markup=False)
