"""The capacity planner: sweeps over scenario variants and what-if reports.

- :func:`load_grid` reads a grid file (``cartesian`` or ``one_at_a_time`` over dotted scenario
  keys) into :class:`GridPoint`\\ s, each checked against the scenario before anything runs.
- :func:`run_sweep` runs every point as a full simulation (worker processes or Ray), keeps one
  JSON record per finished point so an interrupted sweep resumes, and returns the sweep table.
- :func:`render_report` turns one or more run folders into one self-contained HTML page.

::

    from deepinfer_sim.planner import load_grid, run_sweep, render_report
    points = load_grid("grid.yaml", "default")
    table = run_sweep("default", points, "runs/grid", workers=2)
    render_report(["runs/grid/runs/" + pid for pid in table["point_id"][:2]], "compare.html")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ..sim.results.report import render_report
    from .grid import GridPoint, GridSpec, expand, load_grid, point_id, read_grid
    from .sweep import build_table, flatten, run_sweep

# Imported on first use, not with the package: the analyses under planner/ (a run's error band
# reads planner.analysis) must not pay for the report's and the sweep's imports (pandas).
_HOME = {
    "render_report": "..sim.results.report",
    **dict.fromkeys(
        ("GridPoint", "GridSpec", "expand", "load_grid", "point_id", "read_grid"), ".grid"
    ),
    **dict.fromkeys(("build_table", "flatten", "run_sweep"), ".sweep"),
}


__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals())

__all__ = [
    "GridPoint",
    "GridSpec",
    "build_table",
    "expand",
    "flatten",
    "load_grid",
    "point_id",
    "read_grid",
    "render_report",
    "run_sweep",
]
