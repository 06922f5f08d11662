"""The executors of sweeps and plans: local worker processes that outlive one another, and Ray.

Design notes
------------
- **Why not ProcessPoolExecutor.** When one of its workers dies hard (SIGKILL from the
  out-of-memory killer, a segfault in a native library), the pool is *broken*: every pending
  future fails with ``BrokenProcessPool``, the tasks not yet started included, the other workers
  are terminated mid-run, and nothing says which task killed it. One point over its memory
  would fail a whole sweep.
- **One task per worker, known to the driver.** :class:`WorkerPool` keeps ``size`` processes,
  each with its own pipe, and hands each one task at a time, so the driver always knows which
  task a worker holds. A worker that exits without answering died *of that task*: the driver
  starts a replacement and puts the task back at the head of the queue, ``retries`` times; then
  it reports the task as :class:`Failed` with the exit status (``exit -9, SIGKILL``). The other
  workers and the queued tasks never notice.
- **An exception is not a death.** A task function that raises is reported :class:`Failed` at
  once, with the exception, and not retried (a deterministic failure would fail again); the
  worker goes on. (Sweep points and plan shapes catch their own errors anyway.)
- **fork on Linux** (workers start at once with the simulator imported, and a script needs no
  ``if __name__ == "__main__"`` guard), spawn elsewhere. A replacement worker is forked while
  the driver may run a second thread (the progress bar's refresh): ``pause`` is a context
  manager the driver holds around every such fork (the sweep stops its bar meanwhile).
- **Orphans exit.** A worker whose driver died (killed itself) notices its parent changed
  within two seconds and exits instead of waiting on its pipe forever.
- **Test hook.** ``DEEPINFER_SIM_TEST_KILL=KEY[@N][,KEY[@N]...]`` makes the worker that runs the
  task named ``KEY`` (a sweep point id, a plan shape slug) SIGKILL itself before starting it, on
  its first ``N`` attempts (every attempt without ``@N``). It acts only in these worker
  processes, never in the driver, and does nothing unless the variable names the task.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from multiprocessing import connection as mp_connection
from typing import Any

from ..errors import UserError

KILL_ENV = "DEEPINFER_SIM_TEST_KILL"


def context() -> Any:
    """fork on Linux: workers start at once with the simulator already imported, and scripts
    need no ``if __name__ == "__main__"`` guard. Elsewhere (macOS, Windows) spawn."""
    if sys.platform == "linux":
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def exit_text(code: int | None) -> str:
    """``exit -9, SIGKILL`` for a process killed by signal 9, ``exit 3`` for ``sys.exit(3)``."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"exit {code}, {signal.Signals(-code).name}"
        except ValueError:
            return f"exit {code}"
    return f"exit {code}"


@dataclass(frozen=True)
class Failed:
    """A task with no result: its worker died ``attempts`` times, or its function raised."""

    key: str
    reason: str
    attempts: int

    def __str__(self) -> str:
        if self.attempts > 1:
            return f"{self.reason}, on each of {self.attempts} attempts"
        return self.reason


def _kill_hook(key: str, attempt: int) -> None:
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    for item in spec.split(","):
        name, _, times = item.strip().partition("@")
        if name == key and (not times or attempt < int(times)):
            os.kill(os.getpid(), signal.SIGKILL)


def _serve(conn: Any) -> None:
    """A worker: run ``(fn, args, key, attempt)`` jobs from the pipe and send back each result
    (or a :class:`Failed` for an exception) until it reads ``None`` or the driver is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's: it stops us
    parent = os.getppid()
    try:
        while True:
            if not conn.poll(2.0):
                if os.getppid() != parent:
                    return  # orphaned: the driver died
                continue
            try:
                job = conn.recv()
            except (EOFError, OSError):
                return
            if job is None:
                return
            fn, args, key, attempt = job
            _kill_hook(key, attempt)
            try:
                out: Any = fn(*args)
            except Exception as exc:
                tb = traceback.format_exc(limit=-3)
                out = Failed(key, f"{type(exc).__name__}: {exc}\n{tb}", attempt + 1)
            conn.send(out)
    finally:
        conn.close()


class _Worker:
    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()  # ours: so the worker's death reads as EOF on self.conn
        self.job: int | None = None

    def stop(self) -> None:
        if self.job is None and self.proc.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.proc.join(2.0)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(2.0)
        self.conn.close()


class WorkerPool:
    """``size`` worker processes; :meth:`imap` runs tasks on them and survives their deaths.

    ``pause`` (a context-manager factory) is held around each replacement fork.
    """

    def __init__(
        self, size: int, pause: Callable[[], AbstractContextManager[Any]] | None = None
    ) -> None:
        self._ctx = context()
        self._pause = pause or contextlib.nullcontext
        self._workers = [_Worker(self._ctx) for _ in range(max(1, size))]

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for w in self._workers:
            w.stop()

    def _replace(self, n: int) -> None:
        old = self._workers[n]
        with contextlib.suppress(OSError):
            old.conn.close()
        old.proc.join(0.1)
        with self._pause():
            self._workers[n] = _Worker(self._ctx)

    def imap(
        self,
        fn: Callable[..., Any],
        args: Sequence[tuple[Any, ...]],
        keys: Sequence[str] | None = None,
        retries: int = 1,
    ) -> Iterator[tuple[int, Any, int]]:
        """Run ``fn(*args[i])`` for every i; yield ``(i, result, attempts)`` as each finishes,
        in finishing order. A task whose worker died ``retries + 1`` times, or whose ``fn``
        raised, yields a :class:`Failed` as its result. ``keys`` name the tasks (hook, errors)."""
        names = [str(k) for k in keys] if keys is not None else [str(i) for i in range(len(args))]
        queue = deque(range(len(args)))
        attempts = [0] * len(args)
        while queue or any(w.job is not None for w in self._workers):
            for n in range(len(self._workers)):
                w = self._workers[n]
                if w.job is not None or not queue:
                    continue
                if not w.proc.is_alive():  # died idle (killed from outside): not the task's fault
                    self._replace(n)
                    w = self._workers[n]
                i = queue.popleft()
                try:
                    w.conn.send((fn, args[i], names[i], attempts[i]))
                except OSError:  # died between the check and the send
                    queue.appendleft(i)
                    self._replace(n)
                    continue
                w.job = i
            busy = [w for w in self._workers if w.job is not None]
            ready = set(mp_connection.wait([x for w in busy for x in (w.conn, w.proc.sentinel)]))
            for n in range(len(self._workers)):
                w = self._workers[n]
                job = w.job
                if job is None or (w.conn not in ready and w.proc.sentinel not in ready):
                    continue
                i = job
                try:
                    out = w.conn.recv()
                except (EOFError, OSError):  # the worker died running task i
                    w.proc.join(1.0)
                    code = w.proc.exitcode
                    attempts[i] += 1
                    self._replace(n)
                    if attempts[i] <= retries:
                        queue.appendleft(i)  # first in line for the next free worker
                    else:
                        why = f"worker died ({exit_text(code)})"
                        yield i, Failed(names[i], why, attempts[i]), attempts[i]
                    continue
                w.job = None
                yield i, out, attempts[i] + 1


def real_ray() -> Any | None:
    """The Ray package, or None. A directory named ``ray`` on the path (Ray's own session
    folder /tmp/ray, when /tmp is on sys.path) imports as an empty namespace package: not Ray."""
    try:
        import ray
    except ImportError:
        return None
    return ray if hasattr(ray, "remote") else None


def import_ray() -> Any:
    """The Ray package, or a clean error saying how to install it."""
    ray = real_ray()
    if ray is None:
        raise UserError(
            "the ray executor needs Ray, which is not installed: pip install 'deepinfer-sim[ray]'"
        )
    return ray


@contextlib.contextmanager
def ray_context(workers: int, address: str | None) -> Iterator[Any]:
    """The ``ray`` module, initialized (a local instance of ``workers`` CPUs, or the cluster at
    ``address``) for the duration, unless the caller had already initialized it."""
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"address": address, "log_to_driver": False}
        if address is None:  # a local Ray instance: `workers` CPUs, no dashboard
            kwargs.update(num_cpus=max(1, workers), include_dashboard=False)
        try:
            ray.init(**kwargs)
        except Exception as exc:  # ConnectionError, TimeoutError, RuntimeError... from Ray
            where = f"at {address}" if address else "locally"
            raise UserError(
                f"cannot start or reach Ray {where}: {' '.join(str(exc).split())}"
            ) from None
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()
