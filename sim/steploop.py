"""StepLoop: drives an engine's steps with plain timeout callbacks.

An engine (prefill instance, decode group, vision encoder) is a loop "begin a step, wait its
duration, end it, begin the next" that sleeps when it has no work. Written as timeout callbacks
rather than a SimPy process it costs exactly one event per step and none while idle. Work that
arrives at an idle engine starts a step through a zero-delay event, so everything arriving at
the same instant joins that step (as a process resuming after the current callback would).
"""

from __future__ import annotations

import simpy


class StepLoop:
    __slots__ = ("_step_dt", "env", "running")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.running = False
        self._step_dt = 0.0

    def begin_step(self) -> float | None:
        """Start a step and return its duration, or None when there is nothing to do."""
        raise NotImplementedError

    def end_step(self, dt: float) -> None:
        """The step begun ``dt`` seconds ago has finished."""
        raise NotImplementedError

    def kick(self) -> None:
        """New work arrived: make sure a step will start."""
        if not self.running:
            self.running = True
            self.env.timeout(0).callbacks.append(self._next)

    def _next(self, _ev: object = None) -> None:
        dt = self.begin_step()
        if dt is None:
            self.running = False
            return
        self._step_dt = dt
        self.env.timeout(dt).callbacks.append(self._end)

    def _end(self, _ev: object) -> None:
        self.end_step(self._step_dt)
        self._next()
