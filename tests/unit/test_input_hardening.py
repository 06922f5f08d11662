"""Issue 16: bad input is one ``error:`` line and exit status 2, never a traceback, a hang or a
silent drop.

Each test names the mistake a user can make (an infinite bandwidth, a billion instances, an
output folder that cannot be written, a file that is not UTF-8, an empty scenario, a window with
no requests, a ``--set`` into a mapping) and checks it is caught before any simulation runs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from deepinfer_sim.cli import main
from deepinfer_sim.errors import ConfigError
from deepinfer_sim.scenario import MAX_INSTANCES, apply_override, load_scenario
from deepinfer_sim.traces.workload import MAX_RATE_SCALE, MAX_REPEAT, build_source


def cli(*args: str) -> tuple[int, str]:
    """Run the CLI; (exit code, stdout + stderr)."""
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.output


def assert_user_error(code: int, output: str, *needles: str) -> None:
    assert code == 2, output
    assert output.startswith("error:"), output
    assert "Traceback" not in output
    assert len(output.strip().splitlines()) == 1, output
    for needle in needles:
        assert needle in output, output


@pytest.fixture
def blocked(tmp_path: Path) -> Path:
    """A path no folder can be made at, even as root: it lies under a regular file."""
    afile = tmp_path / "a-file"
    afile.write_text("x")
    return afile / "sub"


# ---- 1. non-finite numbers and bounds ------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "network.pd_gbps_per_8_gpus",
        "workload.rate_scale",
        "sim.timeseries_interval_s",
        "pools.storage.ttl_s.chatbot",
        "prices.gpu_hour_usd.gb200",
        "slo.ttft_s",
        "pools.prefill.instances",
    ],
)
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_non_finite_numbers_are_rejected_with_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_scenario("default", [f"{key}={value}"])
    assert exc.value.path == key


@pytest.mark.parametrize(
    ("override", "bound"),
    [
        ("pools.prefill.instances=1000000000", str(MAX_INSTANCES)),
        ("pools.decode.groups=1000000000", str(MAX_INSTANCES)),
        ("pools.decode.ep=5000", "1024"),
        ("pools.vision.instances=1000000000", str(MAX_INSTANCES)),
        ("pools.storage.nodes=1200000", str(MAX_INSTANCES)),
        ("sim.timeseries_interval_s=0.0001", "0.01"),
        ("network.latency_s=1000", "10"),
        ("network.cross_dc_latency_s=1000", "10"),
        ("pools.storage.node_latency_s=1000", "10"),
        ("network.pd_gbps_per_8_gpus=1e9", "1000000"),
        ("workload.rate_scale=1e9", f"{MAX_RATE_SCALE:g}"),
        ("workload.repeat=1000000", str(MAX_REPEAT)),
    ],
)
def test_sizes_rates_and_grids_are_bounded_and_the_message_names_the_bound(
    override: str, bound: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        load_scenario("default", [override])
    assert exc.value.path == override.split("=")[0]
    assert bound in str(exc.value)


def test_the_bounds_admit_a_real_deployment() -> None:
    """A 100k-GPU deployment still validates: 2,000 EP8 prefill instances + 200 EP384 groups
    (EP384: one of the 384 experts per GPU; an EP must split them evenly, see issue 29 below)."""
    sc = load_scenario(
        "default",
        [
            "pools.prefill.instances=2000",
            "pools.prefill.ep=8",
            "pools.decode.groups=200",
            "pools.decode.ep=384",
            "pools.storage.nodes=1200",
        ],
    )
    assert sc.pools.prefill.gpus + sc.pools.decode.gpus == 92_800


@pytest.mark.parametrize(
    "override",
    [
        "network.pd_gbps_per_8_gpus=.inf",
        "workload.rate_scale=.inf",
        "pools.prefill.instances=1000000000",
    ],
)
def test_run_ends_in_one_error_line_quickly(override: str, tmp_path: Path) -> None:
    t0 = time.perf_counter()
    code, out = cli("run", "default", "--set", override, "--out", str(tmp_path / "o"), "-q")
    assert_user_error(code, out, override.split("=")[0])
    assert time.perf_counter() - t0 < 10


# ---- 2. paths, files and empty inputs ---------------------------------------------------------


def test_run_checks_its_output_folder_before_simulating(blocked: Path) -> None:
    t0 = time.perf_counter()
    code, out = cli("run", "default", "--out", str(blocked), "-q")
    assert_user_error(code, out, "--out", str(blocked))
    assert time.perf_counter() - t0 < 10  # found before the run, not after it


def test_plan_checks_its_output_folder_before_searching(blocked: Path) -> None:
    code, out = cli("plan", "default", "--out", str(blocked))
    assert_user_error(code, out, "--out", str(blocked))


def test_sweep_grid_checks_its_output_folder_before_running(blocked: Path, tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("axes: {workload.max_requests: [10, 20]}\n")
    code, out = cli("sweep", "grid", "default", "--grid", str(grid), "--out", str(blocked))
    assert_user_error(code, out, "--out", str(blocked))


@pytest.mark.parametrize(
    "args",
    [
        ("schema", "--out", "{bad}"),
        ("report", "{tmp}", "--out", "{bad}"),
        ("trace", "stats", "builtin:mooncake_conversation", "--json", "{bad}"),
        ("trace", "convert", "builtin:mooncake_conversation", "{bad}.parquet"),
        ("cost", "default", "--json", "{bad}"),
        ("eplb", "default", "--steps", "2", "--json", "{bad}"),
    ],
    ids=["schema", "report", "trace-stats", "trace-convert", "cost", "eplb"],
)
def test_an_unwritable_output_file_is_one_error_line(
    args: tuple[str, ...], blocked: Path, tmp_path: Path
) -> None:
    bad = str(blocked / "out.json")
    code, out = cli(*(a.format(bad=bad, tmp=tmp_path) for a in args))
    assert_user_error(code, out, str(blocked))


def test_an_output_file_that_is_a_folder_is_one_error_line(tmp_path: Path) -> None:
    code, out = cli("schema", "--out", str(tmp_path))
    # click's own check (dir_okay=False) or ours: either way no traceback and exit 2
    assert code == 2 and "Traceback" not in out, out


def test_a_path_error_deep_in_a_command_is_still_one_line(tmp_path: Path) -> None:
    """The last line of defence: an OSError about a named file becomes ``error: PATH: why``."""
    folder = tmp_path / "trace.csv"
    folder.mkdir()
    code, out = cli("trace", "stats", str(folder))
    assert code == 2 and out.startswith("error:") and "Traceback" not in out, out


def test_a_non_utf8_scenario_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: x\ndescription: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml:2: not UTF-8 text \(byte 0xe9\)"):
        load_scenario(path)
    code, out = cli("run", str(path), "-q")
    assert_user_error(code, out, "latin1.yaml", "UTF-8")


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_an_empty_scenario_file_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    code, out = cli("run", str(path), "-q", "--out", str(tmp_path / "o"))
    assert_user_error(code, out, "empty.yaml", "empty")
    assert not (tmp_path / "o" / "summary.json").exists()


def test_a_window_without_requests_is_an_error_not_nan(tmp_path: Path) -> None:
    over = ["workload.start_s=100000", "workload.end_s=200000"]
    sc = load_scenario("default", over)
    with pytest.raises(ConfigError, match="holds no requests") as exc:
        build_source(sc.workload, sc.seed)
    assert exc.value.path == "workload"
    code, out = cli("run", "default", *[f"--set={o}" for o in over], "-q", "--out", str(tmp_path))
    assert_user_error(code, out, "workload", "no requests")
    assert "nan" not in out


def test_sessions_do_not_inherit_a_trace_replay_speed() -> None:
    """default.yaml replays its trace 4 times at 25x; switching it to sessions with --set gives
    the generator's own rate, unless the same command sets the speed too."""
    sc = load_scenario("default", ["workload.sessions.days=0.1"])
    assert (sc.workload.repeat, sc.workload.rate_scale) == (1, 1.0)
    sc = load_scenario("default", ["workload.sessions.days=0.1", "workload.rate_scale=3"])
    assert (sc.workload.repeat, sc.workload.rate_scale) == (1, 3.0)
    # a scenario written for sessions keeps its own speed (mixed.yaml: rate_scale 20)
    sc = load_scenario("mixed", ["workload.sessions.days=0.1"])
    assert sc.workload.rate_scale == 20.0
    # a trace scenario keeps its speed
    assert load_scenario("default").workload.rate_scale == 25.0


# ---- 3. dotted overrides merge into mappings --------------------------------------------------


def test_a_dotted_key_into_a_default_mapping_keeps_the_other_entries() -> None:
    sc = load_scenario("default", ["prices.gpu_hour_usd.gb200=7"])
    assert sc.prices.gpu_hour_usd["gb200"] == 7.0
    assert sc.prices.gpu_hour_usd["l40s"] == 1.0  # the vision pool's price is still there


def test_a_dotted_ttl_keeps_the_other_class_ttl() -> None:
    """mixed.yaml does not spell ttl_s out: setting chatbot must not drop agent's 3 days."""
    sc = load_scenario("mixed", ["pools.storage.ttl_s.chatbot=100"])
    assert sc.pools.storage.ttl_s == {"agent": 3 * 86400.0, "chatbot": 100.0}
    sc = load_scenario("default", ["pools.storage.ttl_s.chatbot=100"])
    assert sc.pools.storage.ttl_s == {"agent": 3 * 86400.0, "chatbot": 100.0}


def test_a_dotted_key_into_a_mapping_of_models_keeps_the_default_entry() -> None:
    sc = load_scenario("mixed", ["policies.speculative.acceptance.chatbot={mean: 0.7}"])
    acc = sc.policies.speculative.acceptance
    assert set(acc) == {"default", "chatbot"} and acc["chatbot"].mean == 0.7


def test_a_mapping_value_still_replaces_the_mapping() -> None:
    sc = load_scenario("mixed", ["pools.storage.ttl_s={chatbot: 100}"])
    assert sc.pools.storage.ttl_s == {"chatbot": 100.0}


def test_apply_override_outside_the_scenario_schema_creates_plain_mappings() -> None:
    data: dict[str, object] = {}
    apply_override(data, "not.a.scenario.key", 1)
    assert data == {"not": {"a": {"scenario": {"key": 1}}}}


# ---- 4. issue 29: stated rules instead of silent guesses ----------------------------------------


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("pools.decode.ep=7", "pools.decode.ep"),
        ("pools.prefill.ep=7", "pools.prefill.ep"),
    ],
)
def test_an_ep_that_does_not_split_the_experts_is_an_error(override: str, key: str) -> None:
    """EP7 on V4.1-Flash's 384 experts used to run, rounding the slots per rank up and placing
    experts nobody asked for. Engines refuse it, and so does the scenario: the error names the
    key, the rule and the nearest widths that divide the experts."""
    with pytest.raises(ConfigError) as exc:
        load_scenario("default", [override])
    assert exc.value.path == key
    assert "does not split the model's 384 routed experts evenly" in str(exc.value)
    assert "as engines require" in str(exc.value) and "nearest:" in str(exc.value)


def test_redundant_slots_may_make_the_split_even() -> None:
    """The rule's other half: every rank holds the same number of slots once the redundant ones
    are counted, as DeepSeek's production decode (256 experts + 32 redundant over EP144) and
    SGLang's EP72 deployment do; the published scenarios load."""
    sc = load_scenario(
        "default",
        ["model=deepseek-v3", "pools.decode.ep=144", "pools.decode.redundant_experts=32"],
    )
    assert sc.pools.decode.ep == 144
    with pytest.raises(ConfigError, match="nor do the 272 slots with the 16 redundant ones"):
        load_scenario(
            "default",
            ["model=deepseek-v3", "pools.decode.ep=144", "pools.decode.redundant_experts=16"],
        )
    for name in ("deepseek-v3-production-h800", "deepseek-v3-profile-h800", "sglang-v3-h100-96gpu"):
        load_scenario(name)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("pools: {prefill: {instances: true}}", "pools.prefill.instances"),
        ("pools: {storage: {disk_tb: false}}", "pools.storage.disk_tb"),
        ("pools: {storage: {ttl_s: {chatbot: true}}}", "pools.storage.ttl_s.chatbot"),
        ("planner: {decode_ep: [64, true]}", "planner.decode_ep[1]"),
        ("faults: [{kind: link_cut, at_s: 1, duration_s: true}]", "faults[0].duration_s"),
        ("policies: {admission: {policy: queue_length, max_queued: true}}", None),
        ("sim: {horizon_s: false}", "sim.horizon_s"),
    ],
)
def test_a_boolean_is_never_a_number(text: str, key: str | None, tmp_path: Path) -> None:
    """``instances: true`` used to load as one instance (pydantic reads true as 1). A boolean
    where a number is expected is now an error naming the key, wherever it sits: a field, a
    list item, a mapping value, one member of a union of models."""
    path = tmp_path / "bool.yaml"
    path.write_text(f"name: bool\n{text}\n")
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    assert exc.value.path == (key or "policies.admission.max_queued")
    assert "expected a number, got a boolean" in str(exc.value)
    assert str(exc.value).startswith(f"{path}: ")


def test_a_boolean_setting_still_takes_a_boolean() -> None:
    sc = load_scenario("default", ["network.backup_links=true", "sim.progress=false"])
    assert sc.network.backup_links is True and sc.sim.progress is False
    with pytest.raises(ConfigError, match=r"pools\.decode\.groups: expected a number"):
        load_scenario("default", ["pools.decode.groups=true"])


def test_a_duplicate_key_names_the_key_the_file_and_both_lines(tmp_path: Path) -> None:
    """YAML keeps the last of two equal keys, so a scenario that says ``instances: 4`` and,
    lower down, ``instances: 8`` silently ran 8. The loader now refuses it."""
    path = tmp_path / "dup.yaml"
    path.write_text(
        "name: dup\npools:\n  prefill:\n    instances: 4\n    ep: 4\n    instances: 8\n"
    )
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    assert exc.value.path == "pools.prefill.instances"
    assert str(exc.value).startswith(f"{path}:6: pools.prefill.instances: duplicate key")
    assert "first at line 4" in str(exc.value)
    code, out = cli("run", str(path), "-q", "--out", str(tmp_path / "o"))
    assert_user_error(code, out, f"{path}:6", "duplicate key")
    # in a list item, and in a flow mapping on one line
    path.write_text("faults:\n  - {kind: link_cut, at_s: 1, at_s: 2, duration_s: 1}\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml:2: faults\[0\]\.at_s: duplicate key"):
        load_scenario(path)


def test_a_merge_key_may_be_overridden(tmp_path: Path) -> None:
    """YAML's ``<<: *base`` merge is not a duplicate: a key given beside it overrides the
    merged one, as YAML intends."""
    path = tmp_path / "merge.yaml"
    path.write_text(
        "name: merge\nx-base: &base {instances: 4, ep: 4}\n"
        "pools:\n  prefill:\n    <<: *base\n    instances: 8\n"
    )
    with pytest.raises(ConfigError, match="x-base: unknown key"):  # the anchor's holder
        load_scenario(path)
    path.write_text(
        "name: merge\npools:\n  prefill: &p {instances: 4, ep: 4}\n"
        "  vision:\n    <<: {instances: 1}\n    instances: 2\n"
    )
    assert load_scenario(path).pools.vision.instances == 2


def test_model_and_hardware_files_refuse_duplicate_keys_too(tmp_path: Path) -> None:
    """The same loader reads every config file, not only scenarios: a hardware file whose first
    key comes again at its end is refused at that line."""
    from deepinfer_sim.models.registry import bundled_dir, load_hardware

    lines = (bundled_dir("hardware") / "h200.yaml").read_text().splitlines()
    key = next(line.split(":")[0] for line in lines if line[:1].isalpha())
    path = tmp_path / "h200.yaml"
    path.write_text("\n".join([*lines, f"{key}: again"]) + "\n")
    with pytest.raises(ConfigError, match=rf"h200\.yaml:{len(lines) + 1}: {key}: duplicate key"):
        load_hardware(str(path))
