"""Launch files (``planner/launch.py``): how a scenario's fields become engine flags, counts and
comments. Each script is run through bash with ``DRY_RUN=1``, so what is checked is the command
the file would run; ``tests/integration/test_launch_engines.py`` puts the same lines through the
engines' own parsers."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from deepinfer_sim.cli import main
from deepinfer_sim.planner.launch import (
    CHECKED_AGAINST,
    dynamo_manifest,
    launch_files,
    pool_shapes,
    write_launch_files,
)
from deepinfer_sim.scenario import Scenario, load_scenario


def dry_run(text: str, role: str, node_rank: int = 0, **env: str) -> list[str]:
    """The command ``text`` (a launch script) runs for ``role``, as bash makes its words."""
    import shlex

    proc = subprocess.run(
        ["bash", "-c", text, "launch.sh", role],
        env={**os.environ, "DRY_RUN": "1", "NODE_RANK": str(node_rank), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return shlex.split(proc.stdout)


def flags(argv: list[str]) -> dict[str, list[str]]:
    """``--flag value...`` -> {flag: [values]} (a repeated flag's values run on)."""
    out: dict[str, list[str]] = {}
    key = "_program"
    for word in argv:
        if word.startswith("--"):
            key = word
            out.setdefault(key, [])
        else:
            out.setdefault(key, []).append(word)
    return out


def notes(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("# not expressed:")]


def manifest(sc: Scenario, backend: str = "sglang") -> dict[str, Any]:
    return dict(yaml.safe_load(dynamo_manifest(sc, backend)))  # type: ignore[arg-type]


def component(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in doc["spec"]["components"] if c["name"] == name)


def container_args(doc: dict[str, Any], name: str) -> dict[str, list[str]]:
    return flags(component(doc, name)["podTemplate"]["spec"]["containers"][0]["args"])


@pytest.fixture(scope="module")
def default() -> Scenario:
    return load_scenario("default")


@pytest.fixture(scope="module")
def default_files(default):
    return launch_files(default)


def test_default_prefill_is_16_ep4_servers_with_4_attention_dp_ranks(default_files):
    """16 prefill instances of 4 GB200 (one node each): SGLang's world size is the instance's 4
    GPUs and its attention-DP width the 4 ranks; the chunk is the per-rank token budget times the
    ranks, because SGLang divides it over them."""
    sg = flags(dry_run(default_files.sglang, "prefill"))
    assert sg["_program"] == ["python3", "-m", "sglang.launch_server"]
    assert sg["--model-path"] == ["deepseek-ai/DeepSeek-V4.1-Flash"]
    assert sg["--disaggregation-mode"] == ["prefill"]
    assert (sg["--tp"], sg["--attn-dp-size"], sg["--ep"]) == (["4"], ["4"], ["4"])
    assert sg["--chunked-prefill-size"] == [str(32768 * 4)]
    assert sg["--ep-num-redundant-experts"] == ["16"]  # 4 per GPU x 4 GPUs
    assert sg["--kv-cache-dtype"] == ["fp8_e4m3"]
    assert "--nnodes" not in sg  # one node of 4 GPUs
    assert "--enable-dp-attention" not in sg  # deprecated in 0.5.23: --attn-dp-size says it
    vl = flags(dry_run(default_files.vllm, "prefill"))
    assert vl["_program"] == ["vllm", "serve", "deepseek-ai/DeepSeek-V4.1-Flash"]
    assert (vl["--tensor-parallel-size"], vl["--data-parallel-size"]) == (["1"], ["4"])
    assert vl["--max-num-batched-tokens"] == ["32768"]  # per engine, as the scenario's
    assert json.loads(vl["--kv-transfer-config"][0])["kv_role"] == "kv_producer"
    assert vl["--all2all-backend"] == ["deepep_high_throughput"]
    assert "--speculative-config" not in vl  # vLLM drafts on the decode side


def test_default_decode_group_spans_16_nodes_and_each_node_says_its_rank(default_files):
    """The EP64 decode group is one SGLang server over 16 nodes of 4 GPUs: the node's rank and
    the first node's address come from the environment. vLLM runs it as 64 DP engines, 4 per
    node: nodes after the first are headless and start at their first rank."""
    sg = flags(dry_run(default_files.sglang, "decode", 3, HEAD="10.1.2.3"))
    assert sg["--nnodes"] == ["16"] and sg["--node-rank"] == ["3"]
    assert sg["--dist-init-addr"] == ["10.1.2.3:5000"]
    assert (sg["--tp"], sg["--attn-dp-size"], sg["--ep"]) == (["64"], ["64"], ["64"])
    assert sg["--max-running-requests"] == [str(256 * 64)]
    assert sg["--cuda-graph-max-bs-decode"] == ["256"]
    head = flags(dry_run(default_files.vllm, "decode", 0))
    assert "--headless" not in head and head["--data-parallel-size-local"] == ["4"]
    assert head["--max-num-seqs"] == ["256"]
    node5 = flags(dry_run(default_files.vllm, "decode", 5, HEAD="10.1.2.3"))
    assert "--headless" in node5 and node5["--data-parallel-start-rank"] == ["20"]
    assert node5["--data-parallel-address"] == ["10.1.2.3"]


def test_default_router_lists_every_prefill_instance_and_decode_group(default_files):
    sg = dry_run(default_files.sglang, "router")
    assert sg[:3] == ["smg", "launch", "--pd-disaggregation"]
    assert sg.count("--prefill") == 16 and sg.count("--decode") == 1
    assert sg[sg.index("--prefill") + 1 : sg.index("--prefill") + 3] == [
        "http://prefill-0:30000",
        "8998",
    ]  # the URL and the bootstrap port
    hosts = {"PREFILL_HOSTS": "p1 p2", "DECODE_HOSTS": "d1"}
    vl = dry_run(default_files.vllm, "router", **hosts)
    assert vl[:2] == ["vllm-router", "--vllm-pd-disaggregation"]
    assert vl.count("--prefill") == 2 and "http://d1:30000" in vl


def test_dspark_maps_to_each_engines_dspark_and_what_neither_can_express_is_said(default_files):
    """The default's DSpark (5 drafts, confidence truncation): SGLang's DSPARK with block size 5
    on both PD sides, its attention DP with --enable-dp-lm-head and the built-in MoE all-to-all
    (0.5.23 refuses DeepEP there); vLLM's dspark with adaptive verification. SGLang verifies
    every draft of V4.1 in PD, and the simulator's lag / noise knobs are no engine's: said."""
    for role in ("prefill", "decode"):
        sg = flags(dry_run(default_files.sglang, role))
        assert sg["--speculative-algorithm"] == ["DSPARK"]
        assert sg["--speculative-dspark-block-size"] == ["5"]
        assert "--enable-dp-lm-head" in sg and sg["--moe-a2a-backend"] == ["none"]
    spec = json.loads(flags(dry_run(default_files.vllm, "decode"))["--speculative-config"][0])
    assert spec == {"method": "dspark", "num_speculative_tokens": 5,
                    "enable_adaptive_verification": True}  # fmt: skip
    said = "\n".join(notes(default_files.sglang))
    assert "static verify" in said and "lag_steps 2" in said
    assert "DeepEP not used" in said


def test_every_file_says_what_it_cannot_express(default_files):
    """Per-class TTL storage, the tiered prefill router, the two-dimensional decode balancer and
    the network are no engine's settings: each file says so in a comment, and names the sections
    that only steer the simulation."""
    for text in default_files.as_dict().values():
        said = "\n".join(notes(text))
        assert "per-class TTL (agent 259200 s, chatbot 604800 s" in said
        assert "tiered" in said
        assert "network (pd_gbps_per_8_gpus 400" in said
        assert "# simulator only" in text
        assert "0.5.23" in text or "0.33.0" in text or "1.6.1" in text
    assert "two_dim" in "\n".join(notes(default_files.sglang))


def test_engram_tables_in_host_memory_map_to_each_engines_setting(default_files):
    """V4.1-Flash keeps its n-gram (engram) tables in host memory: an SGLang environment switch,
    vLLM's --engram-config."""
    assert "export SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1" in default_files.sglang
    vl = flags(dry_run(default_files.vllm, "decode"))
    assert json.loads(vl["--engram-config"][0]) == {"cpu_offload": True}


def test_aggregated_is_one_server_role_without_pd_flags_or_router():
    sc = load_scenario("v3-h200-aggregated")
    files = launch_files(sc)
    assert "# Usage: sglang.sh server\n" in files.sglang
    sg = flags(dry_run(files.sglang, "server"))
    assert (sg["--tp"], sg["--attn-dp-size"], sg["--ep"]) == (["8"], ["1"], ["8"])
    assert "--disaggregation-mode" not in sg and "--speculative-algorithm" not in sg
    assert sg["--chunked-prefill-size"] == ["8192"] and sg["--max-running-requests"] == ["256"]
    assert sg["--kv-cache-dtype"] == ["bf16"]
    vl = flags(dry_run(files.vllm, "server"))
    assert vl["--tensor-parallel-size"] == ["8"] and "--enable-expert-parallel" in vl
    assert "--kv-transfer-config" not in vl and vl["--kv-cache-dtype"] == ["bfloat16"]
    with pytest.raises(subprocess.CalledProcessError):
        dry_run(files.sglang, "router")  # one instance: no router
    for backend, worker in (("sglang", "decode"), ("vllm", "worker")):
        doc = manifest(sc, backend)
        assert [(c["name"], c["type"]) for c in doc["spec"]["components"]] == [
            ("Frontend", "frontend"),
            (worker, "worker"),
        ]


def test_aggregated_instances_get_a_router_over_their_urls():
    sc = load_scenario("v3-h200-aggregated", ["pools.aggregated.instances=3"])
    argv = dry_run(launch_files(sc).sglang, "router")
    assert argv[:3] == ["smg", "launch", "--worker-urls"]
    assert argv[3:6] == [f"http://server-{i}:30000" for i in range(3)]


def test_tensor_parallel_attention_and_sliced_experts():
    """TensorRT-LLM's min-latency R1: attention TP8, experts EP4 x TP2, MTP run three times.
    SGLang takes --tp 8 --ep 4 (experts sliced over the other 2) without DeepEP, which would span
    all 8; vLLM cannot slice experts within EP: said."""
    sc = load_scenario("trtllm-r1-h200-min-latency")
    files = launch_files(sc)
    sg = flags(dry_run(files.sglang, "decode"))
    assert (sg["--tp"], sg["--attn-dp-size"], sg["--ep"]) == (["8"], ["1"], ["4"])
    assert "--moe-a2a-backend" not in sg
    assert sg["--speculative-algorithm"] == ["EAGLE"]
    assert sg["--speculative-num-steps"] == ["3"] and sg["--speculative-num-draft-tokens"] == ["4"]
    vl = flags(dry_run(files.vllm, "decode"))
    assert vl["--tensor-parallel-size"] == ["8"] and vl["--data-parallel-size"] == ["1"]
    assert json.loads(vl["--speculative-config"][0]) == {
        "method": "mtp",
        "num_speculative_tokens": 3,
    }
    assert any("EP4 x TP2 are not expressible" in n for n in notes(files.vllm))


@pytest.mark.parametrize("policy", ["none", "mtp1"])
def test_mtp_on_and_off(policy):
    """SGLang's Wide-EP V3 deployment without speculative decoding (as published) and with MTP:
    no speculative flag at all, or EAGLE with one draft on both PD sides (vLLM: decode only)."""
    sc = load_scenario("sglang-v3-h100-96gpu", [f"policies.speculative.policy={policy}"])
    files = launch_files(sc)
    for role in ("prefill", "decode"):
        sg = flags(dry_run(files.sglang, role))
        vl = flags(dry_run(files.vllm, role))
        if policy == "none":
            assert "--speculative-algorithm" not in sg and "--speculative-config" not in vl
        else:
            assert sg["--speculative-algorithm"] == ["EAGLE"]
            assert sg["--speculative-num-draft-tokens"] == ["2"]
            assert ("--speculative-config" in vl) == (role == "decode")


def test_wide_ep_counts_nodes_redundant_experts_and_two_batch_overlap():
    """SGLang's 96-H100 deployment: prefill EP32 (4 nodes of 8), decode EP72 (9 nodes) with 32
    redundant experts, two-batch overlap on both: replicas, nodeCount and GPUs per pod follow."""
    sc = load_scenario("sglang-v3-h100-96gpu")
    files = launch_files(sc)
    pre = flags(dry_run(files.sglang, "prefill"))
    dec = flags(dry_run(files.sglang, "decode"))
    assert pre["--nnodes"] == ["4"] and dec["--nnodes"] == ["9"]
    assert pre["--moe-a2a-backend"] == ["deepep"] and dec["--moe-a2a-backend"] == ["deepep"]
    assert dec["--ep-num-redundant-experts"] == ["32"] and pre["--ep-num-redundant-experts"] == [
        "32"
    ]
    assert "--enable-two-batch-overlap" in pre and "--enable-two-batch-overlap" in dec
    assert "--enable-dbo" in flags(dry_run(files.vllm, "decode"))
    assert "--enable-eplb" in dec  # policies.eplb.decode.policy eplb (the default)
    doc = manifest(sc)
    for name, nodes in (("prefill", 4), ("decode", 9)):
        comp = component(doc, name)
        assert comp["multinode"] == {"nodeCount": nodes} and comp["replicas"] == 1
        limits = comp["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"nvidia.com/gpu": "8"}
        args = container_args(doc, name)
        assert "--nnodes" not in args and "--node-rank" not in args  # Dynamo's operator adds them


def test_deepseek_v41_two_batch_overlap_is_said_not_launched_on_sglang():
    sc = load_scenario("default", ["pools.decode.two_batch_overlap=true"])
    files = launch_files(sc)
    assert "--enable-two-batch-overlap" not in dry_run(files.sglang, "decode")
    assert any("without two-batch overlap" in n for n in notes(files.sglang))
    assert "--enable-dbo" in dry_run(files.vllm, "decode")


def test_static_eplb_leaves_vllms_redundant_experts_unplaced_and_says_so():
    sc = load_scenario("default", ["policies.eplb.decode.policy=static"])
    files = launch_files(sc)
    assert "--enable-eplb" not in dry_run(files.sglang, "decode")
    assert "--ep-num-redundant-experts" in dry_run(files.sglang, "decode")
    assert any("vLLM places redundant experts only with EPLB" in n for n in notes(files.vllm))


def test_router_policies_map_where_the_routers_have_them():
    sc = load_scenario(
        "default",
        ["policies.prefill_router=cache_affinity", "policies.decode_balancer=least_requests"],
    )
    files = launch_files(sc)
    sg = flags(dry_run(files.sglang, "router"))
    assert sg["--prefill-policy"] == ["cache_aware"] and sg["--decode-policy"] == ["least_load"]
    assert flags(dry_run(files.sglang, "decode"))["--load-balance-method"] == ["total_requests"]
    vl = flags(dry_run(files.vllm, "router"))
    assert vl["--prefill-policy"] == ["cache_aware"] and "--decode-policy" not in vl
    frontend = component(manifest(sc), "Frontend")["podTemplate"]["spec"]["containers"][0]
    assert frontend["args"] == ["-m", "dynamo.frontend", "--router-mode", "kv"]


def test_a_large_token_budget_is_written_in_full():
    """Numbers go out as the engines read them: 1048576, never 1.04858e+06."""
    sc = load_scenario("default", ["pools.prefill.max_tokens_per_step=262144"])
    sg = flags(dry_run(launch_files(sc).sglang, "prefill"))
    assert sg["--chunked-prefill-size"] == ["1048576"]


def test_a_model_without_a_published_checkpoint_gets_a_placeholder_and_a_note():
    sc = load_scenario(
        "default",
        [
            "model=deepseek-v4.1-flash-mini",  # 48 experts: EP16 with one redundant per GPU
            "pools.decode.ep=16",
            "pools.prefill.redundant_experts_per_gpu=1",
        ],
    )
    files = launch_files(sc)
    assert "MODEL=${MODEL:-deepseek-v4.1-flash-mini}" in files.sglang
    assert any("set MODEL" in n for n in notes(files.vllm))
    assert dry_run(files.vllm, "prefill", MODEL="/models/mini")[2] == "/models/mini"


def test_ascend_hardware_is_said():
    files = launch_files(load_scenario("cloudmatrix384-r1-910c"))
    assert any("ascend910c" in n and "NVIDIA GPUs" in n for n in notes(files.sglang))


def test_the_dynamo_manifest_is_a_dynamo_graph_deployment_of_the_pools(default):
    doc = manifest(default)
    assert (doc["apiVersion"], doc["kind"]) == ("nvidia.com/v1beta1", "DynamoGraphDeployment")
    assert doc["metadata"]["name"] == "default"
    pre, dec = component(doc, "prefill"), component(doc, "decode")
    assert (pre["replicas"], dec["replicas"]) == (16, 1)
    assert "multinode" not in pre and dec["multinode"] == {"nodeCount": 16}
    main_container = dec["podTemplate"]["spec"]["containers"][0]
    assert main_container["command"] == ["python3", "-m", "dynamo.sglang"]
    assert main_container["image"].endswith(f":{CHECKED_AGAINST['ai-dynamo']}")
    args = container_args(doc, "decode")
    assert args["--disaggregation-mode"] == ["decode"] and args["--tp"] == ["64"]
    vllm_args = container_args(manifest(default, "vllm"), "prefill")
    assert vllm_args["--disaggregation-mode"] == ["prefill"]
    assert json.loads(vllm_args["--kv-transfer-config"][0])["kv_role"] == "kv_producer"


def test_a_scenario_name_becomes_a_kubernetes_name():
    sc = load_scenario("default", ["name=My_Plan/Winner 2"])
    assert manifest(sc)["metadata"]["name"] == "my-plan-winner-2"


def test_pool_shapes_follow_the_hardware_files_node_size(default):
    pre, dec = pool_shapes(default)
    assert (pre.nodes, pre.gpus_per_pod, dec.nodes, dec.gpus_per_pod) == (1, 4, 16, 4)


def test_a_script_refuses_an_unknown_role(default_files):
    proc = subprocess.run(
        ["bash", "-c", default_files.sglang, "sglang.sh", "bogus"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_write_launch_files_writes_three_files_in_launch(tmp_path, default):
    paths = write_launch_files(default, tmp_path)
    assert [p.name for p in paths] == ["sglang.sh", "vllm.sh", "dynamo.yaml"]
    assert all(p.parent == tmp_path / "launch" for p in paths)
    assert paths[0].stat().st_mode & stat.S_IXUSR and not paths[2].stat().st_mode & stat.S_IXUSR
    assert paths[0].read_text() == launch_files(default).sglang


def test_the_launch_command_writes_the_files_and_refuses_bad_input(tmp_path: Path):
    runner = CliRunner()
    res = runner.invoke(main, ["launch", "default", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "launch").iterdir()) == [
        "dynamo.yaml",
        "sglang.sh",
        "vllm.sh",
    ]
    assert "not expressed" in res.output
    vllm_res = runner.invoke(
        main, ["launch", "default", "--out", str(tmp_path / "v"), "--dynamo-backend", "vllm"]
    )
    assert (
        vllm_res.exit_code == 0 and "dynamo.vllm" in (tmp_path / "v/launch/dynamo.yaml").read_text()
    )
    for bad in (
        ["launch", "no-such-scenario"],
        ["launch", "default", "--set", "pools.decode.ep=7"],
        ["launch", "default", "--dynamo-backend", "trt"],
        ["launch", "default", "--out", str(tmp_path / "launch" / "sglang.sh")],
    ):
        res = runner.invoke(main, bad)
        assert res.exit_code == 2, (bad, res.output)
        assert res.output.startswith("error:") and "Traceback" not in res.output, res.output


@pytest.mark.parametrize(
    ("scheduler", "mixed", "sglang_note", "vllm_chunked", "vllm_note"),
    [
        ("tokens", True, None, True, None),
        ("prefill_first", False, None, True, "scheduler prefill_first"),
        ("whole", False, "scheduler whole: SGLang mixes", False, None),
    ],
)
def test_the_aggregated_schedule_maps_to_each_engines_setting(
    scheduler, mixed, sglang_note, vllm_chunked, vllm_note
):
    """Chunks beside the decode tokens: SGLang's --enable-mixed-chunk (its default is prefill
    first, unmixed); vLLM always mixes, so prefill_first is said not expressible there; whole
    prompts turn chunked prefill off in both."""
    sc = load_scenario("v3-h200-aggregated", [f"pools.aggregated.scheduler={scheduler}"])
    files = launch_files(sc)
    sg = flags(dry_run(files.sglang, "server"))
    assert ("--enable-mixed-chunk" in sg) == mixed
    assert (sg["--chunked-prefill-size"] == ["-1"]) == (scheduler == "whole")
    said = " ".join(notes(files.sglang))
    assert sglang_note is None or sglang_note in said
    vl = flags(dry_run(files.vllm, "server"))
    assert ("--no-enable-chunked-prefill" not in vl) == vllm_chunked
    said = " ".join(notes(files.vllm))
    assert (vllm_note is not None and vllm_note in said) or "prefill_first" not in said
