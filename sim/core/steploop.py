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
    __slots__ = ("_step_dt", "_step_t0", "env", "running")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.running = False
        self._step_dt = 0.0
        self._step_t0 = -1.0  # when the step in flight began; -1 while idle

    def stepping_s(self, now: float) -> float:
        """Seconds the step in flight has run by ``now`` (0 while idle). An engine's busy time
        is counted when a step ends; adding this clips it to a window ending at ``now``, so a busy
        fraction over any window is at most 1."""
        t0 = self._step_t0
        return min(max(0.0, now - t0), self._step_dt) if t0 >= 0 else 0.0

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
            self._step_t0 = -1.0
            return
        self._step_dt = dt
        self._step_t0 = self.env.now
        self.env.timeout(dt).callbacks.append(self._end)

    def _end(self, _ev: object) -> None:
        self.end_step(self._step_dt)
        self._next()
