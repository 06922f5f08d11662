"""``deepinfer-sim validate``: the bundled published deployments (``configs/published/``)
predicted by each cost model, simulated / published per case
(``planner/analysis/published.py``).

Exit status 0 when every case ran (whether or not it is within its tolerance: the table says
which are); ``--strict`` makes a case outside its tolerance an exit status 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from .cli_common import console, figure, user_errors, writable_file, write_text


@click.command()
@click.option(
    "--cost-model",
    "cost_models",
    multiple=True,
    default=("roofline", "hopper-derived"),
    show_default=True,
    help="Cost model(s) to predict with: roofline or a calibration profile (repeatable).",
)
@click.option(
    "--case-file",
    "files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Case file(s) instead of the bundled ones (configs/published/*.yaml).",
)
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the cases.")
@click.option("--strict", is_flag=True, help="Exit 1 if a case is outside its tolerance.")
@user_errors
def validate(
    cost_models: tuple[str, ...], files: tuple[Path, ...], json_path: Path | None, strict: bool
) -> None:
    """Predict published deployments and compare (simulated / published)."""
    from rich.table import Table

    from .planner.analysis.published import run_cases

    if json_path:
        writable_file(json_path, "--json")
    results = run_cases(tuple(cost_models), list(files) or None)
    t = Table(title="published deployments: simulated / published", header_style="bold")
    for col in ("deployment", "case", "cost model", "published", "simulated", "ratio", "ok"):
        t.add_column(col, justify="right" if col in ("published", "simulated", "ratio") else "left")
    for r in results:
        t.add_row(
            r.file,
            r.name,
            r.cost_model,
            figure(r.published),
            figure(r.simulated),
            f"{r.ratio:.2f}",
            "yes" if r.within else f"no (±{r.tolerance:.0%})",
        )
    con = console()
    con.print(t)
    n_ok = sum(r.within for r in results)
    per_model = []
    for model in dict.fromkeys(r.cost_model for r in results):
        mine = [r.within for r in results if r.cost_model == model]
        per_model.append(f"{model} {sum(mine)} of {len(mine)}")
    con.print(f"{n_ok} of {len(results)} within tolerance ({', '.join(per_model)})")
    if json_path:
        write_text(json_path, json.dumps([r.as_dict() for r in results], indent=2) + "\n", "--json")
    if strict and n_ok < len(results):
        raise SystemExit(1)
