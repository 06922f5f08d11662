"""The ``deepinfer-sim`` console script: starts the plot worker when the command will draw plots
(``sim/results/plot_worker.py``), then imports and runs the command line (``cli.py``), so the
worker imports matplotlib while the CLI imports the simulator."""

from __future__ import annotations

import sys


def main() -> None:
    from .sim.results.plot_worker import prestart_for

    prestart_for(sys.argv[1:])
    from .cli import main as cli_main

    cli_main()
