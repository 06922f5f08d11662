"""Loading YAML into frozen pydantic models, with one clear message per mistake.

Every config file the user touches (scenarios, model and hardware specs, calibration profiles) is
validated here: unknown keys are errors, values are type-checked, and a failure becomes a
:class:`~deepinfer_sim.errors.ConfigError` naming the dotted key path and what was expected.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from .cache import ParsedFiles
from .errors import ConfigError

M = TypeVar("M", bound=BaseModel)
# libyaml's parser where PyYAML was built with it (same documents, ~5x faster: the cost profiles
# are tens of kB), else the pure-Python one
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# files this large are kept parsed in the user's cache (a 199 kB calibration profile: 44-68 ms)
_PARSED = ParsedFiles("yaml", f"{_SAFE_LOADER.__name__} {yaml.__version__}")
_PARSED_MIN_BYTES = 32 * 1024


class FrozenModel(BaseModel):
    """Base for every config model: immutable, unknown keys forbidden, and every number finite
    (``.inf`` or ``.nan`` in a config is an error naming the key: an infinite bandwidth or rate
    would hang or crash a run instead)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False
    )


def _wants_number(tp: Any) -> bool:
    """Whether ``tp`` takes an int or a float and not a bool."""
    tp = _strip_annotated(tp)
    if tp in (int, float):
        return True
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [_strip_annotated(a) for a in typing.get_args(tp)]
        return any(a in (int, float) for a in args) and not any(a in (bool, Any) for a in args)
    return False


def _strip_annotated(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _boolean_for_number(tp: Any, value: Any) -> str | None:
    """Where in ``value`` a boolean stands for a number that ``tp`` expects: ``""`` for
    ``value`` itself, ``"[2]"`` or ``".name"`` inside a model, a list or a mapping; None if
    nowhere. (Pydantic's lax mode would read ``instances: true`` as 1 and ``disk_tb: false`` as
    0.0; strict mode would also refuse a YAML list for a tuple, so the check is done here.)"""
    tp = _strip_annotated(tp)
    if isinstance(value, bool):
        return "" if _wants_number(tp) else None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            where = _boolean_for_number(arg, value)
            if where:
                return where
        return None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if not isinstance(value, dict) or not set(value) <= set(tp.model_fields):
            return None  # not this model (another member of a union), or an unknown key
        for key, item in value.items():
            where = _boolean_for_number(tp.model_fields[key].annotation, item)
            if where is not None:
                return f".{key}{where}"
        return None
    args = typing.get_args(tp)
    if isinstance(value, list | tuple) and origin in (tuple, list, Sequence) and args:
        for i, item in enumerate(value):
            if origin is tuple and args[-1] is not Ellipsis:
                if i >= len(args):
                    break
                item_tp = args[i]
            else:
                item_tp = args[0]
            where = _boolean_for_number(item_tp, item)
            if where is not None:
                return f"[{i}]{where}"
    if isinstance(value, dict) and origin in (dict, Mapping) and len(args) == 2:
        for key, item in value.items():
            where = _boolean_for_number(args[1], item)
            if where is not None:
                return f".{key}{where}"
    return None


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
    """Validate ``data`` into ``model`` or raise ConfigError naming the key path. A boolean
    where a number is expected is an error too (pydantic would read ``true`` as 1)."""
    where = _boolean_for_number(model, data)
    if where is not None:
        path = where.removeprefix(".")
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        raise ConfigError(
            path, "expected a number, got a boolean (true/false is not a number)", source=source
        )
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
    cache = len(raw) >= _PARSED_MIN_BYTES
    if cache:
        found, document = _PARSED.load(raw)
        if found:
            return document
    document = _parse(text, p)
    if cache:
        _PARSED.store(raw, document)
    return document


def _parse(text: str, p: Path) -> Any:
    loader = _SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _refuse_duplicate_keys(loader, node, p)
        return loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError("", f"YAML syntax error: {problem}", source=where) from None
    finally:
        loader.dispose()


def _refuse_duplicate_keys(loader: Any, root: yaml.Node, path: Path) -> None:
    """A key given twice in one mapping is an error naming its dotted path and both lines (YAML
    itself would silently keep the last one). Keys a merge (``<<: *base``) brings in may be
    overridden, as YAML intends."""
    seen_nodes: set[int] = set()
    todo: list[tuple[yaml.Node, str]] = [(root, "")]
    while todo:
        node, where = todo.pop()
        if id(node) in seen_nodes:  # an alias: its node was checked where it was defined
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo.extend((item, f"{where}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    todo.append((value_node, where))
                    continue
                key = (
                    loader.construct_object(key_node, deep=True)
                    if isinstance(key_node, yaml.ScalarNode)
                    else id(key_node)
                )
                name = f"{where}.{key}" if where else str(key)
                line = key_node.start_mark.line + 1
                try:
                    earlier = first.get(key)
                except TypeError:  # an unhashable key: YAML itself refuses it later
                    continue
                if earlier is not None:
                    raise ConfigError(
                        name,
                        f"duplicate key (first at line {earlier}); YAML would keep only the "
                        "last value, so one of the two is a mistake",
                        source=f"{path}:{line}",
                    )
                first[key] = line
                todo.append((value_node, name))


def load_yaml_model(model: type[M], path: str | Path) -> M:
    """Read a YAML file and validate it into ``model``."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("", "expected a mapping at the top level", source=str(path))
    return validate(model, data, source=str(path))
