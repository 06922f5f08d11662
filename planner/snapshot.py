"""One scenario for a whole search: the scenario file read once, at the start.

``plan`` and ``sweep grid`` run many simulations, in worker processes, for a long time. Each
simulation is a variant of one base scenario (a shape, a probe's rate, a grid point), and the
answer compares them with each other, so every variant must come from the same base. Reading
the file again for each one would let an edit (or a deletion) of the file during the search
change it midway. Instead the file is read once into a :class:`Snapshot` (the resolved scenario,
``--set`` applied, every default filled in) and every variant, in every worker, is cut from it.

A snapshot gives byte for byte the scenario that reading the file with the same overrides gives
(``load_scenario``), so the hashes of resolved scenarios that a plan's probe log and a sweep's
point records resume by are the ones a search that read the file recorded. One rule of reading
a file looks at the file as written rather than resolved: when ``--set`` switches a trace
scenario to generated sessions, the trace's replay speed (``workload.repeat``,
``workload.rate_scale``) is dropped unless a ``--set`` gave it. The snapshot keeps the
overrides it was taken with, so it applies that rule exactly as reading the file does.

A snapshot is small and picklable (the YAML text, the folder that relative model, hardware,
profile and trace names are read from, and the overrides), so it travels to worker processes
and Ray tasks as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..scenario import (
    Scenario,
    _sessions_replay_from_defaults,
    apply_override,
    dump_scenario,
    load_scenario,
    parse_override,
    scenario_from_dict,
    scenario_path,
)


@dataclass(frozen=True)
class Snapshot:
    """A scenario as resolved once (file read, ``--set`` applied, every default filled in):
    what a plan or a sweep cuts every variant from, in its workers too, so an edit of the file
    during the search changes nothing in it."""

    text: str  # dump_scenario of the resolved scenario
    base_dir: str  # the scenario file's folder: what relative model/hardware/profile names mean
    source: str  # the scenario file, for messages
    overrides: tuple[str, ...] = ()  # the --set it was taken with (derive adds to them)

    @classmethod
    def of(cls, config: str | Path, overrides: Sequence[str] = ()) -> Snapshot:
        """Read ``config`` (a path or a bundled name) with ``overrides``, once."""
        path = scenario_path(config)
        sc = load_scenario(config, list(overrides))
        return cls(dump_scenario(sc), str(path.parent.resolve()), str(path), tuple(overrides))

    def scenario(self, overrides: Sequence[str] = ()) -> Scenario:
        """The snapshot with ``overrides`` (dotted ``KEY=VALUE``) applied, validated: the
        scenario reading the file with the snapshot's overrides, then these, gives."""
        data: dict[str, Any] = yaml.safe_load(self.text)
        workload = data.get("workload")
        had_sessions = isinstance(workload, dict) and workload.get("sessions") is not None
        keys = [parse_override(text)[0] for text in self.overrides]
        for text in overrides:
            key, value = parse_override(text)
            apply_override(data, key, value)
            keys.append(key)
        if not had_sessions:  # as load_scenario: a switch to sessions drops a trace's speed
            _sessions_replay_from_defaults(data, keys)
        try:
            return scenario_from_dict(data, Path(self.base_dir))
        except ConfigError as exc:  # named after the file it came from, not "<dict>"
            text = str(exc)
            if exc.source and text.startswith(f"{exc.source}: "):
                text = text[len(exc.source) + 2 :]
            raise ConfigError("", text, f"{self.source} (as read at the start)") from None

    def derive(self, overrides: Sequence[str]) -> Snapshot:
        """A snapshot of this one with ``overrides`` applied (a what-if, a sweep's ``--set``)."""
        return replace(
            self,
            text=dump_scenario(self.scenario(overrides)),
            overrides=(*self.overrides, *overrides),
        )


def snapshot_of(config: str | Path | Snapshot, overrides: Sequence[str] = ()) -> Snapshot:
    """``config`` read once with ``overrides``, or, already a snapshot, with ``overrides``
    applied on top of it."""
    if isinstance(config, Snapshot):
        return config.derive(overrides) if overrides else config
    return Snapshot.of(config, overrides)
