"""Scenario files: validation, dotted overrides and the messages a user sees when they err.

A scenario is one YAML file; everything a run depends on is in it (or in the model/hardware
YAML it names). These tests pin down that mistakes are caught at load time with a message that
names the key path, and that ``--set`` overrides reach exactly the key they name.
"""

from __future__ import annotations

import json

import pytest
import yaml

from deepinfer_sim.errors import ConfigError
from deepinfer_sim.scenario import (
    Scenario,
    apply_override,
    dump_scenario,
    json_schema,
    load_scenario,
    parse_override,
    scenario_from_dict,
)


def test_default_scenario_loads_by_name_and_by_path():
    """`default` is bundled: it resolves by name from any directory, and by its repo path."""
    by_name = load_scenario("default")
    assert by_name.pools.prefill.instances * by_name.pools.prefill.ep == 64
    assert by_name.pools.decode.ep == 64 and by_name.pools.decode.groups == 1
    assert by_name.model == "deepseek-v4.1-flash"
    assert by_name.workload.trace == "builtin:mooncake_conversation"


def test_overrides_reach_the_named_key_and_are_typed_as_yaml():
    """`--set pools.decode.ep=128` sets an int; strings and floats parse the YAML way."""
    sc = load_scenario(
        "default",
        ["pools.decode.ep=128", "workload.rate_scale=2.5", "policies.prefill_router=round_robin"],
    )
    assert sc.pools.decode.ep == 128
    assert sc.workload.rate_scale == 2.5
    assert sc.policies.prefill_router == "round_robin"


def test_override_creates_missing_sections():
    """A key whose section the YAML omitted still works (the section takes its defaults)."""
    sc = load_scenario("default", ["sim.horizon_s=30"])
    assert sc.sim.horizon_s == 30


@pytest.mark.parametrize(
    ("override", "path", "fragment"),
    [
        ("pools.decode.epp=3", "pools.decode.epp", "unknown key"),
        ("pools.decode.ep=abc", "pools.decode.ep", "valid integer"),
        ("pools.decode.ep=0", "pools.decode.ep", "greater than or equal to 1"),
        ("workload.spread.method=random", "workload.spread.method", "'uniform'"),
        ("slo.ttft_s=-1", "slo.ttft_s", "greater than 0"),
        ("model=no-such-model", "model", "unknown model 'no-such-model'"),
        ("pools.prefill.hardware=tpu", "pools.prefill.hardware", "unknown hardware 'tpu'"),
    ],
)
def test_bad_values_name_the_key_path(override, path, fragment):
    """Each mistake yields one ConfigError whose message starts at the offending key."""
    with pytest.raises(ConfigError) as err:
        load_scenario("default", [override])
    assert err.value.path == path
    assert fragment in str(err.value)


def test_window_must_be_ordered():
    with pytest.raises(ConfigError, match="end_s must be greater than start_s"):
        load_scenario("default", ["workload.start_s=10", "workload.end_s=5"])


def test_every_pool_hardware_needs_a_price():
    """Costs are computed for every pool, so a hardware kind without a price is refused."""
    data = {"prices": {"gpu_hour_usd": {"gb200": 1.0}}}
    with pytest.raises(ConfigError, match="no price for hardware 'l40s'"):
        scenario_from_dict(data)


@pytest.mark.parametrize("text", ["novalue", "=3", "a..b=1", "a.b[x]=1"])
def test_malformed_overrides(text):
    with pytest.raises(ConfigError):
        key, value = parse_override(text)
        apply_override({}, key, value)


def test_list_index_overrides():
    data = {"a": {"b": [{"c": 1}, {"c": 2}]}}
    apply_override(data, "a.b[1].c", 5)
    assert data["a"]["b"][1]["c"] == 5
    with pytest.raises(ConfigError, match="index 7"):
        apply_override(data, "a.b[7].c", 5)


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\npools:\n  prefill: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+"):
        load_scenario(bad)


def test_missing_file_and_unknown_name():
    with pytest.raises(ConfigError, match="no such scenario file"):
        load_scenario("nowhere/scenario.yaml")
    with pytest.raises(ConfigError, match="bundled: default"):
        load_scenario("no-such-bundled-scenario")


def test_relative_trace_paths_resolve_against_the_scenario_file(tmp_path):
    """A scenario that names `traces/x.jsonl` means relative to itself, not to the cwd."""
    (tmp_path / "sc.yaml").write_text(yaml.safe_dump({"workload": {"trace": "x.jsonl"}}))
    sc = load_scenario(tmp_path / "sc.yaml")
    assert sc.workload.trace == str((tmp_path / "x.jsonl").resolve())


def test_resolved_dump_round_trips():
    """`config.resolved.yaml` re-loads to the very same scenario (it is a complete record)."""
    sc = load_scenario("default", ["pools.decode.ep=128"])
    again = Scenario.model_validate(yaml.safe_load(dump_scenario(sc)))
    assert again == sc


def test_scenarios_are_frozen():
    sc = load_scenario("default")
    with pytest.raises(Exception, match="frozen"):
        sc.seed = 3


def test_json_schema_lists_every_section():
    schema = json_schema()
    assert set(schema["properties"]) >= {
        "model",
        "pools",
        "network",
        "policies",
        "workload",
        "slo",
        "prices",
        "seed",
        "sim",
    }
    json.dumps(schema)  # serializable
