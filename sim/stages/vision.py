"""Vision-encoder (VE) instances: one GPU each, first-come-first-served, one event per request.

A request with images is encoded on the VE instance with the fewest outstanding images, then
handed to the prefill router; requests without images skip this stage. The encode time per image
comes from a roofline of the encoder (parameters × image tokens) on the VE hardware.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
import simpy

from ..core.requests import RequestTable, State
from ..core.steploop import StepLoop


class VisionInstance(StepLoop):
    def __init__(
        self,
        env: simpy.Environment,
        idx: int,
        seconds_per_image: float,
        table: RequestTable,
        images: Sequence[int] | np.ndarray,
        on_done: Callable[[int], None],
    ) -> None:
        super().__init__(env)
        self.idx = idx
        self.seconds_per_image = seconds_per_image
        self.table = table
        self.images = images
        self.on_done = on_done
        self.queue: deque[int] = deque()
        self.current = -1
        self.outstanding_images = 0
        self.busy_s = 0.0
        self.encoded = 0

    def submit(self, rid: int) -> None:
        self.queue.append(rid)
        self.outstanding_images += int(self.images[rid])
        self.table.state[rid] = State.VISION
        self.table.vision_instance[rid] = self.idx
        self.kick()

    def begin_step(self) -> float | None:
        if not self.queue:
            return None
        self.current = self.queue.popleft()
        return int(self.images[self.current]) * self.seconds_per_image

    def end_step(self, dt: float) -> None:
        rid, k = self.current, int(self.images[self.current])
        self.busy_s += dt
        self.encoded += k
        self.outstanding_images -= k
        self.table.t_vision_done[rid] = self.env.now
        self.on_done(rid)

    def report(self, now: float) -> dict[str, float]:
        """The instance's own part of the summary, as of ``now``: images encoded, the encode
        time per image, busy seconds (``stepping_s``: the encode in flight, up to ``now``) and
        the requests queued behind the one encoding."""
        return {
            "images": self.encoded,
            "seconds_per_image": self.seconds_per_image,
            "busy_s": self.busy_s,
            "stepping_s": self.stepping_s(now),
            "queued": len(self.queue),
        }


def least_outstanding(instances: Sequence[VisionInstance]) -> VisionInstance:
    return min(instances, key=lambda v: v.outstanding_images)
