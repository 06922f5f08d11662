"""The GPU's clock at its power limit: how much slower a compute-bound step runs once the GPU has
computed with few breaks, against the calibration's short timing of the same call.

A hardware file's ``sustained_clock`` states it, measured with ``calibration/sustained.py``
(docs/validation.md, "Prefill under sustained load"): a call timed the calibration's way (a few
synchronized calls after a warm-up) and back to back for seconds, and at partial busy shares.
The power limiter averages over a few tenths of a second (calls 44-45), so what sets the clock
is how busy the GPU was over its recent past. The model keeps that as an exponentially weighted
busy share (time constant ``window_s``) and slows a step's compute linearly from 1 at
``onset_share`` to ``slowdown`` at a GPU busy without a break::

    factor(s) = 1 + (slowdown − 1) · clip((s − onset_share) / (1 − onset_share), 0, 1)

with ``s`` the share averaged over the step. Decode steps are memory-bound and were measured
keeping their clock: only prefill compute is slowed (not the exchange, not host time).
"""

from __future__ import annotations

from pydantic import Field

from .. import fpmath
from ..validation import FrozenModel


class SustainedClock(FrozenModel):
    """A hardware file's measured slowdown of compute-bound work at the power limit."""

    slowdown: float = Field(
        ge=1,
        le=2,
        description="a compute-bound call's time back to back for seconds over the "
        "calibration's timing of it",
    )
    window_s: float = Field(gt=0, description="time constant of the limiter's busy share")
    onset_share: float = Field(
        ge=0, lt=1, description="busy share below which the clock holds (no slowdown)"
    )
    source: str = Field(description="the measurement (device call, GPU, workload)")

    def factor(self, share: float) -> float:
        """The compute slowdown at a busy share ``share`` (0..1)."""
        rise = (share - self.onset_share) / (1.0 - self.onset_share)
        return 1.0 + (self.slowdown - 1.0) * min(1.0, max(0.0, rise))


class BusyShare:
    """One engine's busy share as the limiter sees it, advanced once per step (O(1)).

    ``factor(now)`` prices the step starting at ``now``: the share decays over the idle time
    since the last step ended, then is averaged over a step like the last one — as long, its
    GPUs busy the same share of it (a step's own length is only known once priced; consecutive
    steps of a loaded engine are alike). ``ended(now, dt, busy)`` records the step of ``dt``
    seconds that ends at ``now``, its GPUs computing a share ``busy`` of it (an eager engine's
    host-bound step leaves them idle for the rest)."""

    __slots__ = ("_busy", "_clock", "_last_dt", "_last_end", "_share")

    def __init__(self, clock: SustainedClock) -> None:
        self._clock = clock
        self._share = 0.0
        self._last_end = 0.0
        self._last_dt = 0.0
        self._busy = 1.0

    def share(self, now: float) -> float:
        """The busy share at ``now``, decayed over the idle time since the last step ended."""
        share = self._share
        idle = now - self._last_end
        if share and idle > 0:
            share *= fpmath.exp(-idle / self._clock.window_s)
            self._share = share
        return share

    def factor(self, now: float) -> float:
        w = self._clock.window_s
        share = self.share(now)
        dt = self._last_dt
        if dt <= 0:
            return self._clock.factor(share)
        x = dt / w
        level = self._busy  # the share tends to the step's busy share, from ``share``
        mean = level - (level - share) * (1.0 - fpmath.exp(-x)) / x
        return self._clock.factor(mean)

    def ended(self, now: float, dt: float, busy: float = 1.0) -> None:
        self._share = busy - (busy - self._share) * fpmath.exp(-dt / self._clock.window_s)
        self._last_end = now
        self._last_dt = dt
        self._busy = busy
