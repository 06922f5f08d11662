"""deepinfer-sim: a discrete-event cluster simulator and capacity planner for serving
DeepSeek-V4.1-Flash disaggregated (vision encoder / prefill / Wide-EP decode / KV storage).

The API is the product; the CLI is a thin shell over it::

    from deepinfer_sim import load_scenario, simulate
    result = simulate(load_scenario("default", ["workload.rate_scale=50"]))
    result.summary["latency"]["ttft_s"]

The API names are imported on first use (PEP 562), so ``import deepinfer_sim.cli`` — and a
``--help`` — does not pay for the simulator's modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports
from .errors import ConfigError, InvariantError, TraceError, UserError

if TYPE_CHECKING:
    from .scenario import Scenario, load_scenario, scenario_from_dict
    from .sim.results.result import Result
    from .sim.run import simulate

__version__ = "0.1.0"

_LAZY = {
    "Result": ".sim.results.result",
    "Scenario": ".scenario",
    "load_scenario": ".scenario",
    "scenario_from_dict": ".scenario",
    "simulate": ".sim.run",
}
"""API name -> the module that defines it, imported when the name is first read."""

__all__ = [
    "ConfigError",
    "InvariantError",
    "Result",
    "Scenario",
    "TraceError",
    "UserError",
    "__version__",
    "load_scenario",
    "scenario_from_dict",
    "simulate",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
