"""Loading YAML into frozen pydantic models, with one clear message per mistake.

Every config file the user touches (scenarios, model and hardware specs, calibration profiles) is
validated here: unknown keys are errors, values are type-checked, and a failure becomes a
:class:`~deepinfer_sim.errors.ConfigError` naming the dotted key path and what was expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import ConfigError

M = TypeVar("M", bound=BaseModel)
# libyaml's parser where PyYAML was built with it (same documents, ~5x faster: the cost profiles
# are tens of kB), else the pure-Python one
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class FrozenModel(BaseModel):
    """Base for every config model: immutable, unknown keys forbidden, and every number finite
    (``.inf`` or ``.nan`` in a config is an error naming the key: an infinite bandwidth or rate
    would hang or crash a run instead)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False
    )


def dotted(loc: tuple[Any, ...]) -> str:
    """``("pools", "prefill", 0, "ep")`` -> ``"pools.prefill[0].ep"``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _describe(err: Any) -> str:
    msg = str(err.get("msg", "invalid value"))
    if err.get("type") == "extra_forbidden":
        return "unknown key (check the spelling; `deepinfer-sim schema` lists every key)"
    if "input" in err and err.get("type") not in ("missing",):
        shown = repr(err["input"])
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return f"{msg} (got {shown})"
    return msg


def validation_message(exc: ValidationError, prefix: str = "") -> tuple[str, str]:
    """The first error of a pydantic ValidationError as (dotted path, message)."""
    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    path = dotted(loc)
    if prefix:
        path = f"{prefix}.{path}" if path else prefix
    extra = len(exc.errors()) - 1
    msg = _describe(err)
    if extra:
        msg += f" (and {extra} more error{'s' if extra > 1 else ''})"
    return path, msg


def validate(model: type[M], data: Any, *, source: str | None = None, prefix: str = "") -> M:
    """Validate ``data`` into ``model`` or raise ConfigError naming the key path."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        path, msg = validation_message(exc, prefix)
        raise ConfigError(path, msg, source=source) from None


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; a missing file or a syntax error becomes a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("", f"no such config file: {p}")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError("", f"cannot read: {exc.strerror or exc}", source=str(p)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        bad = raw[exc.start]
        raise ConfigError("", f"not UTF-8 text (byte 0x{bad:02x})", source=f"{p}:{line}") from None
    try:
        return yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError("", f"YAML syntax error: {problem}", source=where) from None


def load_yaml_model(model: type[M], path: str | Path) -> M:
    """Read a YAML file and validate it into ``model``."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("", "expected a mapping at the top level", source=str(path))
    return validate(model, data, source=str(path))
