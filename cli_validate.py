"""``deepinfer-sim validate``: the bundled published deployments (``configs/published/``)
predicted by each cost model, simulated / published per case
(``planner/analysis/published.py``), with the parameters fitted on the corpus and — unless
``--no-loso`` — refitted leaving each case's source out (``planner/analysis/corpus_fit.py``).

Exit status 0 when every case ran (whether or not it is within its tolerance: the table says
which are); ``--strict`` makes a case outside its tolerance an exit status 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from .cli_common import console, figure, user_errors, writable_file, write_text

FAMILIES = ("roofline", "profile")


@click.command()
@click.option(
    "--cost-model",
    "cost_models",
    multiple=True,
    default=FAMILIES,
    show_default=True,
    help="Cost model(s) to predict with: roofline, a calibration profile, or profile (each "
    "case's hardware's shipped profile: measured where there is one, else derived; repeatable).",
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
@click.option(
    "--no-loso",
    is_flag=True,
    help="Skip refitting the corpus parameters leaving each source out (about a minute).",
)
@click.option(
    "--write-fit",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the corpus fit (parameters and per-case ratios) where cost, plan and run read "
    "their error bands: configs/published/fit.json.",
)
@user_errors
def validate(
    cost_models: tuple[str, ...],
    files: tuple[Path, ...],
    json_path: Path | None,
    strict: bool,
    no_loso: bool,
    write_fit: Path | None,
) -> None:
    """Predict published deployments and compare (simulated / published)."""
    from rich.table import Table

    from .errors import UserError
    from .planner.analysis import corpus_fit
    from .planner.analysis.published import case_files, run_cases

    if json_path:
        writable_file(json_path, "--json")
    loso = not no_loso and not files and set(cost_models) <= set(FAMILIES)
    if write_fit and not loso:
        raise UserError(
            "--write-fit needs the leave-one-source-out fit: drop --no-loso, "
            "--case-file and cost models other than roofline and profile"
        )
    tolerance = {
        (cf.name, c.name): c.tolerance
        for _, cf in case_files(list(files) or None)
        for c in cf.cases
    }
    rows: list[dict[str, Any]] = []
    if loso:
        fit = corpus_fit.fit_corpus(tuple(cost_models))
        for r in fit.rows:
            tol = tolerance[(r["file"], r["case"])]
            rows.append(
                {
                    "file": r["file"], "name": r["case"], "source": r["source"],
                    "quantity": r["quantity"], "family": r["family"],
                    "cost_model": r["cost_model"], "published": r["published"],
                    "simulated": r["ratio_default"] * r["published"],
                    "ratio": r["ratio_default"], "ratio_loso": r["ratio_loso"],
                    "tolerance": tol, "within": abs(r["ratio_default"] - 1) <= tol,
                    "within_loso": abs(r["ratio_loso"] - 1) <= tol,
                    **{k: r[k] for k in ("pool", "parallel", "hardware")},
                }
            )  # fmt: skip
        if write_fit:
            corpus_fit.write_fit(fit, write_fit)
    else:
        for res in run_cases(tuple(cost_models), list(files) or None):
            rows.append({**res.as_dict(), "ratio_loso": None, "within_loso": None})
    t = Table(title="published deployments: simulated / published", header_style="bold")
    cols = ("deployment", "case", "source", "cost model", "published", "simulated", "ratio")
    for col in (*cols, "ratio LOSO", "ok"):
        numeric = col in ("published", "simulated", "ratio", "ratio LOSO")
        t.add_column(col, justify="right" if numeric else "left")
    for r in rows:
        t.add_row(
            r["file"], r["name"], r["source"], r["cost_model"], figure(r["published"]),
            figure(r["simulated"]), f"{r['ratio']:.2f}",
            "-" if r["ratio_loso"] is None else f"{r['ratio_loso']:.2f}",
            "yes" if r["within"] else f"no (±{r['tolerance']:.0%})",
        )  # fmt: skip
    con = console()
    con.print(t)
    n_ok = sum(r["within"] for r in rows)
    per_model = []
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        line = f"{family} {sum(r['within'] for r in mine)} of {len(mine)}"
        if loso:
            line += f" ({sum(r['within_loso'] for r in mine)} leaving the source out)"
        per_model.append(line)
    sources = len({r["source"] for r in rows})
    con.print(f"{n_ok} of {len(rows)} within tolerance ({', '.join(per_model)}); {sources} sources")
    if json_path:
        write_text(json_path, json.dumps(rows, indent=2) + "\n", "--json")
    if strict and n_ok < len(rows):
        raise SystemExit(1)
