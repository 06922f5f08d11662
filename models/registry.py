"""Find model and hardware specs by name (bundled YAML) or by path (a user's own file)."""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ..errors import ConfigError
from ..validation import load_yaml_model
from .hardware import HardwareSpec
from .spec import ModelSpec

_NOUN = {"models": "model", "hardware": "hardware", "scenarios": "scenario"}


def bundled_dir(kind: str) -> Path:
    """Folder of bundled YAML of one kind: ``models``, ``hardware`` or ``scenarios``."""
    return Path(str(resources.files("deepinfer_sim.configs") / kind))


def available(kind: str) -> list[str]:
    return sorted(p.stem for p in bundled_dir(kind).glob("*.yaml"))


def resolve_yaml(ref: str, folder: Path, noun: str, base_dir: Path | None = None) -> Path:
    """``ref`` is a name of a YAML file in ``folder`` or a path to one (relative paths against
    ``base_dir`` when given); a missing one is a ConfigError listing what ``folder`` offers."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        p = Path(ref)
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        if not p.is_file():
            raise ConfigError("", f"no such {noun} file: {p}")
        return p
    p = folder / f"{ref}.yaml"
    if not p.is_file():
        names = ", ".join(sorted(q.stem for q in folder.glob("*.yaml"))) or "none"
        raise ConfigError("", f"unknown {noun} {ref!r}; bundled: {names}")
    return p


def resolve(kind: str, ref: str, base_dir: Path | None = None) -> Path:
    """A bundled name (``gb200``) or a YAML path (relative to ``base_dir`` when given)."""
    return resolve_yaml(ref, bundled_dir(kind), _NOUN[kind], base_dir)


@lru_cache(maxsize=64)
def _load_model(path: Path) -> ModelSpec:
    return load_yaml_model(ModelSpec, path)


@lru_cache(maxsize=64)
def _load_hardware(path: Path) -> HardwareSpec:
    return load_yaml_model(HardwareSpec, path)


_SLICE = re.compile(r"^(?P<base>.+)@tp(?P<tp>[0-9]+)(?:-moetp(?P<moe_tp>[0-9]+))?$")


def load_model(ref: str, base_dir: Path | None = None) -> ModelSpec:
    """A bundled model name or a YAML path; ``NAME@tpT`` (``NAME@tpT-moetpM``) is one GPU's
    slice of it under tensor parallelism (:meth:`ModelSpec.tp_slice`), e.g. what
    ``calibrate --model deepseek-v3@tp8`` times."""
    m = _SLICE.match(ref)
    if m is None:
        return _load_model(resolve("models", ref, base_dir))
    base = _load_model(resolve("models", m["base"], base_dir))
    tp, moe_tp = int(m["tp"]), int(m["moe_tp"] or 1)
    try:
        return base.tp_slice(tp, moe_tp)
    except ValueError as exc:
        raise ConfigError("", f"model {ref!r}: {exc}") from None


def load_hardware(ref: str, base_dir: Path | None = None) -> HardwareSpec:
    return _load_hardware(resolve("hardware", ref, base_dir))
