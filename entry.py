"""The ``deepinfer-sim`` console script: starts the plot worker when the command will draw plots
(``sim/results/plot_worker.py``), then imports and runs the command line (``cli.py``), so the
worker imports matplotlib while the CLI imports the simulator. It leaves without the
interpreter's teardown once the command is done (see :func:`_leave`)."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading


def main() -> None:
    from .sim.results.plot_worker import prestart_for

    prestart_for(sys.argv[1:])
    from .cli import main as cli_main

    try:
        cli_main()
    except SystemExit as exc:
        _leave(exc.code)
    _leave(0)


def _leave(code: object) -> None:
    """Exit with ``code`` as ``sys.exit`` would (None: 0; a message: printed, 1), after the exit
    handlers and with the standard streams flushed, but without tearing the interpreter down:
    freeing numpy's, pyarrow's and the simulator's modules one by one cost ~0.05 s of a
    10-request run (1.04 → 0.99 s, benchmarks/startup.py) that no command's output depends on
    (every file is written and closed by then)."""
    main_thread = threading.main_thread()
    if any(t is not main_thread and t.is_alive() and not t.daemon for t in threading.enumerate()):
        raise SystemExit(code)  # a thread still works: the normal exit, which waits for it
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # closed, or its reader went away (a pipe into head)
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code or 0)
