"""``deepinfer-sim trace``: stats, convert and synth, on every shared trace.

The group is tested on its own (``cli.py`` registers it under ``main``); its errors are one
``error:`` line and exit status 2, never a traceback, whether it runs alone or nested.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from deepinfer_sim.cli_trace import TRACE_FORMATS, trace
from deepinfer_sim.traces import read_trace
from deepinfer_sim.traces._files import FORMATS
from deepinfer_sim.traces.readers import read_parquet

SHARED = Path(__file__).parents[2] / ".." / "shared" / "traces"
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(),
    reason=f"shared traces not found under {SHARED.resolve()} (only in the project workspace)",
)

# Every request trace in the shared folder, with what `trace stats` must report: requests,
# mean input and output tokens, and the infinite-cache prefix hit fraction.
SHARED_TRACES = {
    "mooncake": ("mooncake_fast25/conversation_trace.jsonl", 12_031, 12_035.1, 342.6, 0.3736),
    "azure_code": (
        "azure_llm_inference_2023/AzureLLMInferenceTrace_code.csv", 8_819, 2_047.8, 27.88, 0.0
    ),
    "azure_conv": (
        "azure_llm_inference_2023/AzureLLMInferenceTrace_conv.csv", 19_366, 1_154.7, 211.1, 0.0
    ),
    "tracelab": ("tracelab_example/round_trace.jsonl", 19, 27_053.3, 596.6, 0.8467),
}  # fmt: skip


TINY = {
    "name": "tiny",
    "seed": 1,
    "pools": {
        "prefill": {"instances": 2, "ep": 2, "hardware": "b200"},
        "decode": {"groups": 1, "ep": 8, "hardware": "b200", "max_seqs_per_rank": 64},
    },
    "workload": {"trace": "builtin:mooncake_conversation", "max_requests": 50},
}


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(trace, list(args), catch_exceptions=False)

    return invoke


def assert_one_error(res, message: str) -> None:
    assert res.exit_code == 2, res.output
    assert res.output.count("error:") == 1 and message in res.output, res.output
    assert "Traceback" not in res.output


def test_the_format_choices_match_the_readers():
    assert TRACE_FORMATS == FORMATS


@needs_shared
@pytest.mark.parametrize(
    ("file", "requests", "input_mean", "output_mean", "hit"),
    SHARED_TRACES.values(),
    ids=SHARED_TRACES,
)
def test_stats_and_convert_on_every_shared_trace(
    cli, tmp_path, file, requests, input_mean, output_mean, hit
):
    """``stats`` prints a table and writes JSON; ``convert`` writes a parquet whose stats are
    the same numbers (the conversion is exact)."""
    path = SHARED / file
    res = cli("stats", str(path), "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    assert f"{requests:,} requests" in res.output and "prefix hits, infinite cache" in res.output
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["requests"] == requests
    assert stats["input_tokens"]["mean"] == pytest.approx(input_mean, abs=0.1)
    assert stats["output_tokens"]["mean"] == pytest.approx(output_mean, abs=0.1)
    assert stats["prefix"]["infinite_hit_fraction"] == pytest.approx(hit, abs=1e-4)

    out = tmp_path / "t.parquet"
    res = cli("convert", str(path), str(out))
    assert res.exit_code == 0, res.output
    assert f"({requests:,} requests)" in res.output
    res = cli("stats", str(out), "--json", str(tmp_path / "p.json"))
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "p.json").read_text()) == stats


@needs_shared
def test_stats_with_an_lru_matches_the_mooncake_readme(cli, tmp_path):
    """The README's LRU numbers (21.1% at 10k blocks) count blocks; weighted by tokens (partial
    last blocks count less) the same replay serves 21.5%."""
    path = SHARED / SHARED_TRACES["mooncake"][0]
    res = cli("stats", str(path), "--lru-blocks", "10000", "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    assert "LRU 10,000 blocks" in res.output
    prefix = json.loads((tmp_path / "s.json").read_text())["prefix"]
    assert prefix["lru_hit_fraction"] == pytest.approx(0.2153, abs=1e-4)
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["rate"]["mean_per_s"] == pytest.approx(3.40, abs=0.005)


@needs_shared
def test_servegen_chunks_are_read_as_a_synthesized_day(cli, tmp_path):
    """ServeGen's chunk files are per-client rate windows and length distributions, not
    requests: stats and convert work on a day synthesized from them (either file of a pair)."""
    files = sorted((SHARED / "servegen_mm_image").glob("chunk-*"))
    assert len(files) == 70
    for path in files[:4]:
        res = cli("stats", str(path))
        assert res.exit_code == 0 and "multimodal" in res.output, res.output
    out = tmp_path / "x.parquet"
    assert cli("convert", str(files[0]), str(out)).exit_code == 0 and out.exists()


def test_convert_refuses_other_extensions_before_reading(cli, tmp_path):
    res = cli("convert", "builtin:azure_code", str(tmp_path / "out.csv"))
    assert_one_error(res, "output must be a .parquet file")
    assert not (tmp_path / "out.csv").exists()
    assert_one_error(cli("synth", "default", str(tmp_path / "x")), "output must be a .parquet")


def test_convert_a_builtin_and_override_its_format(cli, tmp_path):
    out = tmp_path / "code.parquet"
    res = cli("convert", "builtin:azure_code", str(out), "--format", "azure")
    assert res.exit_code == 0, res.output
    source = read_parquet(out)
    assert len(source) == 8_819 and source.class_names == ("agent",)
    assert source.name == "azure_code"


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        (None, [], "no such file"),
        ('{"timestamp": 0,\n', [], ":1: invalid JSON"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nx,1,1\n", [], ":2: column 'TIMESTAMP'"),
        ("hello\n", ["--format", "qwen"], ":1: invalid JSON"),
    ],
    ids=["missing", "bad-json", "bad-csv-row", "forced-format"],
)
def test_bad_traces_are_one_error_line(cli, tmp_path, content, args, message):
    path = tmp_path / ("t.csv" if content and content.startswith("TIME") else "t.jsonl")
    if content is not None:
        path.write_text(content)
    assert_one_error(cli("stats", str(path), *args), message)
    assert_one_error(cli("convert", str(path), str(tmp_path / "o.parquet"), *args), message)


def test_bad_options_are_usage_errors(cli):
    res = cli("stats", "builtin:azure_code", "--format", "nope")
    assert res.exit_code == 2 and "Invalid value for '--format'" in res.output
    res = cli("stats", "builtin:azure_code", "--lru-blocks", "-1")
    assert res.exit_code == 2 and "--lru-blocks" in res.output


def test_synth_writes_the_scenario_workload(cli, tmp_path):
    """``synth`` builds the workload exactly as a run would, and writes it as parquet."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "w.parquet"
    res = cli("synth", str(config), str(out), "--set", "workload.rate_scale=2")
    assert res.exit_code == 0, res.output
    assert "(50 requests)" in res.output
    source = read_parquet(out)
    expected = read_trace("builtin:mooncake_conversation")
    assert len(source) == 50 and source.block_tokens == expected.block_tokens
    assert source.arrival_s[-1] <= expected.arrival_s[49] / 2 + 3.0  # spread within a bucket
    assert_one_error(cli("synth", str(tmp_path / "none.yaml"), str(out)), "none.yaml")
    assert_one_error(
        cli("synth", str(config), str(out), "--set", "workload.nokey=1"), "workload.nokey"
    )


def test_errors_stay_one_line_when_nested_under_the_main_group(tmp_path):
    """Registered under ``main`` (as cli.py does), the output is the same."""
    from deepinfer_sim.cli import main

    res = CliRunner().invoke(main, ["trace", "stats", str(tmp_path / "none.jsonl")])
    assert_one_error(res, "no such file")
    res = CliRunner().invoke(main, ["trace", "stats", "builtin:azure_code"])
    assert res.exit_code == 0 and "8,819 requests" in res.output
