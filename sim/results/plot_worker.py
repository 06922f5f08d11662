"""A helper process that draws a run's PNG plots beside the run.

Importing matplotlib and drawing two figures costs about as long as a small run itself (issue
32: 0.9 s of a 10-request run's 1.7 s). ``deepinfer-sim run`` therefore starts this worker when
the command line is read, before the simulator's modules are imported: it imports matplotlib
while the run imports and simulates, receives the figures' data (plain arrays, built by
:func:`.plots.plot_data`) once the result exists, and renders PNG bytes while the run writes its
other files. The run writes the PNGs itself, last and atomically, like every other output, so
the folder and its errors are the same as without the worker. A worker that is missing, fails or
answers nonsense changes nothing but the time: the plots are then drawn in the run's process.

This module imports only the standard library at the top: it runs before anything else.
"""

from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

_MODULE = "deepinfer_sim.sim.results.plot_worker"
_WAIT_S = 120.0  # two figures take well under a second; a worker this late is stuck
_worker: PlotWorker | None = None


class PlotWorker:
    """One started worker process; :meth:`submit` hands it the figures once, :meth:`result`
    waits for their PNG bytes (None when it failed)."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", _MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._thread: threading.Thread | None = None
        self._pngs: list[tuple[str, bytes]] | None = None

    def submit(self, figures: list[dict[str, Any]]) -> None:
        """Send the figures; the answer is collected in a thread (the run goes on writing)."""
        payload = pickle.dumps(figures, protocol=pickle.HIGHEST_PROTOCOL)
        self._thread = threading.Thread(target=self._exchange, args=(payload,), daemon=True)
        self._thread.start()

    def _exchange(self, payload: bytes) -> None:
        try:
            out, _ = self._proc.communicate(payload)
            status, value = pickle.loads(out)
        except Exception:  # any failure: the run draws the plots itself
            self.stop()
            return
        if self._proc.returncode == 0 and status == "ok":
            self._pngs = value

    def result(self) -> list[tuple[str, bytes]] | None:
        """The PNGs, waiting at most ``_WAIT_S`` (a worker that hangs is killed: the run then
        draws the plots itself)."""
        if self._thread is None:
            return None
        self._thread.join(_WAIT_S)
        if self._thread.is_alive():
            self.stop()
            self._thread.join()
            return None
        return self._pngs

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def prestart_for(argv: Sequence[str]) -> None:
    """Start the worker when ``argv`` (the command line after the program) runs a simulation
    that will draw plots: ``run`` without ``--no-plots`` or a help flag."""
    args = list(argv)
    if not args or args[0] != "run" or {"--no-plots", "-h", "--help"} & set(args):
        return
    start()


def start() -> None:
    global _worker
    if _worker is not None:
        return
    try:
        _worker = PlotWorker()
    except OSError:  # no process to be had: plots are drawn in this one
        return
    atexit.register(_worker.stop)


def take() -> PlotWorker | None:
    """The started worker, handed over once (None when none was started)."""
    global _worker
    worker, _worker = _worker, None
    return worker


def _serve() -> int:
    from .plot_draw import render, warm_up  # matplotlib, imported while the run starts

    try:
        warm_up()  # while the run still simulates: its figures are not here yet
        figures = pickle.load(sys.stdin.buffer)
        answer: tuple[str, Any] = ("ok", render(figures))
    except Exception as exc:  # reported; the run then draws in its own process
        answer = ("error", f"{type(exc).__name__}: {exc}")
    sys.stdout.buffer.write(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
    sys.stdout.buffer.flush()
    return 0 if answer[0] == "ok" else 1


if __name__ == "__main__":
    # The answer is written and flushed: leave without the interpreter's teardown (matplotlib's
    # and numpy's, ~0.1 s), which the run would otherwise wait out before it sees the end of it.
    os._exit(_serve())
