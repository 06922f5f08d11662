"""deepinfer-sim: a discrete-event cluster simulator and capacity planner for serving
DeepSeek-V4.1-Flash disaggregated (vision encoder / prefill / Wide-EP decode / KV storage).

The API is the product; the CLI is a thin shell over it::

    from deepinfer_sim import load_scenario, simulate
    result = simulate(load_scenario("default", ["workload.rate_scale=50"]))
    result.summary["latency"]["ttft_s"]
"""

from .errors import ConfigError, InvariantError, TraceError, UserError
from .scenario import Scenario, load_scenario, scenario_from_dict
from .sim.results.result import Result
from .sim.run import simulate

__version__ = "0.1.0"

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
