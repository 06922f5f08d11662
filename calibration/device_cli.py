"""What the device measurement commands share on their command lines (``layer_kernels``,
``sustained``, ``launch_gap``): the device, kernel backend, hardware file and output options, and
a measurement run to one JSON file, a bad argument answered with one line and exit status 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import UserError


def add_device_args(ap: argparse.ArgumentParser) -> None:
    """``--device``, ``--kernels``, ``--hardware`` and the required ``--out FILE.json``."""
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kernels", default="deepseek")
    ap.add_argument("--hardware", default=None, help="hardware file (default: the GPU's)")
    ap.add_argument("--out", required=True, type=Path)


def measure_to_json(out: Path, measure: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """``measure()`` written to ``out`` (and returned), or None after printing the UserError it
    raised as one line (nothing written)."""
    try:
        res = measure()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    out.write_text(json.dumps(res, indent=1) + "\n")
    return res
