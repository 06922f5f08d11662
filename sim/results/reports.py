"""Every component's own report at one moment, taken once: what the summary and each
time-series sample read instead of the components' internals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.cluster import Cluster

Report = dict[str, Any]


@dataclass(frozen=True)
class Reports:
    """The reports of every vision encoder, prefill instance (and its experts), decode group,
    the prefill path (with its store), the backup links and the admission policy."""

    vision: list[Report]
    prefill: list[Report]
    prefill_experts: list[Report | None]
    decode: list[Report]
    path: Report | None
    backup_links: list[Report]
    admission: Report

    @classmethod
    def of(cls, cl: Cluster) -> Reports:
        now = cl.env.now
        path = cl.path.report(now) if cl.path is not None else None
        return cls(
            vision=[v.report(now) for v in cl.vision],
            prefill=path["instances"] if path is not None else [],
            prefill_experts=path["experts"] if path is not None else [],
            decode=[g.report(now) for g in cl.decode],
            path=path,
            backup_links=[link.report() for link in cl.backup_links],
            admission=cl.admission.report(),
        )
