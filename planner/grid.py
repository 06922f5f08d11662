"""Grid files: which scenario variants a sweep runs.

A grid file is a small YAML mapping::

    mode: cartesian            # or one_at_a_time
    base:                      # optional: overrides applied to every point
      workload.max_requests: 2000
    axes:                      # dotted scenario keys -> the values to try
      pools.decode.ep: [32, 64, 128]
      workload.rate_scale: [20, 30]

``cartesian`` runs every combination (here 3 × 2 = 6 points, the last axis varying fastest);
``one_at_a_time`` runs the base scenario once, then varies each axis alone from the base
scenario's own value (values equal to it are not run twice): 1 + 2 + 1 = 4 points here.

A point is an ordered mapping of dotted overrides (exactly the ``--set`` keys a run would get)
plus a stable id: a hash of those overrides, so the same point keeps its id, and its results
folder, across runs of the sweep and edits of the grid that keep it. ``params`` holds the value of
every grid key at that point (for ``one_at_a_time`` the base scenario's value of the axes it does
not vary), which is what the sweep table shows.

Every point is validated against the scenario before anything runs, so a typo in the grid fails
in milliseconds with the key path, never an hour into a sweep.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, field_validator

from ..errors import ConfigError
from ..scenario import Scenario, _split_path, load_scenario, parse_override
from ..validation import FrozenModel, read_yaml, validate
from .snapshot import Snapshot

_MISSING = object()


class GridSpec(FrozenModel):
    """The contents of a grid file."""

    mode: Literal["cartesian", "one_at_a_time"] = Field(
        "cartesian",
        description="cartesian: every combination of the axes; one_at_a_time: the base "
        "scenario plus each axis varied alone",
    )
    base: dict[str, Any] = Field(
        default_factory=dict, description="dotted overrides applied to every point"
    )
    axes: dict[str, Annotated[list[Any], Field(min_length=1)]] = Field(
        ..., min_length=1, description="dotted scenario key -> list of values to try"
    )

    @field_validator("base", "axes")
    @classmethod
    def _keys_are_dotted_paths(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            _check_key(key)
        return value

    @field_validator("axes")
    @classmethod
    def _values_are_distinct(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in axes.items():
            seen: set[str] = set()
            for v in values:
                canon = _canonical(v)
                if canon in seen:
                    raise ValueError(f"axis {key!r} lists {v!r} twice")
                seen.add(canon)
        return axes


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key.strip():
        raise ValueError(f"{key!r} is not a dotted scenario key")
    try:
        _split_path(key)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def inline_yaml(value: Any) -> str:
    """One line of YAML that reads back as ``value`` (what a ``--set`` value needs; JSON would
    turn 1e-05 into a string under YAML 1.1)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, sort_keys=False)
    text = text.strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")].strip()
    elif text == "...":
        text = ""
    return text


def point_id(overrides: Mapping[str, Any]) -> str:
    """Stable id of a point: 12 hex digits of the SHA-1 of its overrides (key order ignored)."""
    return hashlib.sha1(_canonical(dict(overrides)).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class GridPoint:
    """One scenario variant: the dotted overrides it applies and its stable id."""

    overrides: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)
    point_id: str = ""

    def __post_init__(self) -> None:
        if not self.point_id:
            object.__setattr__(self, "point_id", point_id(self.overrides))
        if not self.params:
            object.__setattr__(self, "params", dict(self.overrides))

    def as_set(self) -> list[str]:
        """The overrides as ``--set`` strings for :func:`~deepinfer_sim.load_scenario`."""
        return [f"{k}={inline_yaml(v)}" for k, v in self.overrides.items()]

    @classmethod
    def of(cls, point: GridPoint | Mapping[str, Any] | Sequence[str]) -> GridPoint:
        """A point from a mapping of dotted overrides or a list of ``key=value`` strings."""
        if isinstance(point, GridPoint):
            return point
        if isinstance(point, Mapping):
            return cls(dict(point))
        if isinstance(point, str):
            point = [point]
        return cls(dict(parse_override(text) for text in point))


def read_grid(path: str | Path) -> GridSpec:
    """Read and validate a grid file; mistakes are ConfigErrors naming the file and key path."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("", "expected a mapping with an 'axes' key", source=str(path))
    for key in data:  # a misspelt top-level key says so (before "axes: Field required")
        if key not in GridSpec.model_fields:
            raise ConfigError(
                str(key), "unknown key (a grid file has mode, base and axes)", source=str(path)
            )
    return validate(GridSpec, data, source=str(path))


def lookup(data: Any, key: str) -> Any:
    """The value at a dotted key in a nested mapping (``_MISSING`` when absent)."""
    node = data
    for part in _split_path(key):
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return _MISSING
            node = node[part]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return _MISSING
    return node


def expand(spec: GridSpec, base_values: Mapping[str, Any] | None = None) -> list[GridPoint]:
    """The points of a grid, in a stable order.

    ``base_values`` (dotted key -> the base scenario's value) lets ``one_at_a_time`` skip values
    equal to the base and fill the columns of the axes a point does not vary.
    """
    base = dict(spec.base)
    keys = list(spec.axes)
    points: list[GridPoint] = []
    if spec.mode == "cartesian":
        combos: list[dict[str, Any]] = [{}]
        for key in keys:
            combos = [{**c, key: v} for c in combos for v in spec.axes[key]]
        for combo in combos:
            over = {k: v for k, v in base.items() if k not in combo} | combo
            points.append(GridPoint(over))
        return points
    known = dict(base_values or {})
    at_base = {k: base[k] if k in base else known[k] for k in keys if k in base or k in known}
    points.append(GridPoint(dict(base), params={**base, **at_base}))
    for key in keys:
        for v in spec.axes[key]:
            if key in at_base and _canonical(at_base[key]) == _canonical(v):
                continue
            over = {k: b for k, b in base.items() if k != key} | {key: v}
            points.append(GridPoint(over, params={**base, **at_base, key: v}))
    return points


def _scenario(config: str | Path | Snapshot, overrides: list[str]) -> Scenario:
    """``config`` (a file, a bundled name or a :class:`Snapshot` of one) with ``overrides``."""
    if isinstance(config, Snapshot):
        return config.scenario(overrides)
    return load_scenario(config, overrides)


def check_points(
    config: str | Path | Snapshot,
    points: Sequence[GridPoint],
    base_overrides: Sequence[str] = (),
    source: str | None = None,
) -> list[Scenario]:
    """Load every point's scenario (no run): the first bad one raises a ConfigError naming it."""
    out = []
    for i, p in enumerate(points):
        try:
            out.append(_scenario(config, [*base_overrides, *p.as_set()]))
        except ConfigError as exc:
            shown = ", ".join(p.as_set()) or "no overrides"
            raise ConfigError("", f"point {i + 1} ({shown}): {exc}", source=source) from None
    return out


def load_grid(
    grid_file: str | Path, config: str | Path | Snapshot, base_overrides: Sequence[str] = ()
) -> list[GridPoint]:
    """Read a grid file, expand it against ``config`` (+ ``--set`` overrides) and check every
    point loads. Raises ConfigError naming the grid file, the point and the key path.
    ``config`` may be the :class:`Snapshot` a sweep runs from (``sweep grid`` passes one, so the
    scenario file is read once)."""
    spec = read_grid(grid_file)
    base_values: dict[str, Any] = {}
    if spec.mode == "one_at_a_time":
        try:
            base_sc = _scenario(config, [*base_overrides, *GridPoint(dict(spec.base)).as_set()])
        except ConfigError as exc:
            raise ConfigError("base", str(exc), source=str(grid_file)) from None
        dumped = base_sc.model_dump(mode="json")
        for key in spec.axes:
            value = lookup(dumped, key)
            if value is not _MISSING:
                base_values[key] = value
    points = expand(spec, base_values)
    check_points(config, points, base_overrides, source=str(grid_file))
    return points
