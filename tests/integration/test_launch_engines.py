"""The launch files against the real engines, on the CPU: every command line parses with the
engine's own argument parser, and the Dynamo manifest has the shape of Dynamo's own templates.

What is checked, for a handful of scenarios (disaggregated and aggregated, Wide-EP over many
nodes, TP, MTP, DSpark, two-batch overlap, a TP wider than a node):

- each script is run with ``DRY_RUN=1`` for each of its roles (and node ranks 0 and 1 of a server
  over several nodes), so the words the engine would get are the ones bash makes of the file;
- SGLang lines go through ``sglang.srt.server_args.prepare_server_args`` (SGLang's parser and
  ``ServerArgs.from_cli_args``) and must not use a flag SGLang calls deprecated; the router line
  through smg's ``parse_router_args``;
- vLLM lines through ``make_arg_parser(FlexibleArgumentParser())``, ``validate_parsed_serve_args``
  and ``AsyncEngineArgs.from_cli_args``; the router line through vllm-router's
  ``parse_router_args``;
- the parsed values are the scenario's (GPUs, DP ranks, expert width, the per-server figures
  SGLang divides over its DP ranks, the router's prefill and decode servers);
- the Dynamo workers' args parse with their engine's parser too (less ``--disaggregation-mode``,
  dynamo.vllm's own flag), and each manifest has the apiVersion, kind and components of the
  template ai-dynamo's profiler fills for that backend and mode
  (``dynamo/profiler/templates/dgd/<backend>/{agg,disagg}.yaml`` in the wheel), every key that
  template sets, and every flag it passes (but ``--page-size``, sized there for its Qwen model).

Neither engine's parser runs the resolution that needs the model's config from the Hub and a GPU
(SGLang's ``resolve_once``, vLLM's ``create_engine_config``): the check is that every flag exists
and every value is one the flag takes, not that a server would start.

The engines are installed in two virtual environments under the temporary folder, keyed by the
versions (``planner.launch.CHECKED_AGAINST``), so a second run reuses them: the engine wheels
without their dependencies, CPU torch 2.13.0 from this machine's disk, and only the packages the
argument parsers' imports need, at the versions the engine's wheel asks for; installed with uv
(a minute, where pip takes three). Where the package index cannot be reached the test skips and
says so. ``DEEPINFER_SKIP_ENGINES=1`` skips it.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from deepinfer_sim.planner.launch import (
    CHECKED_AGAINST,
    PoolShape,
    dynamo_manifest,
    launch_files,
    pool_shapes,
)
from deepinfer_sim.scenario import Scenario, load_scenario

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("DEEPINFER_SKIP_ENGINES") == "1", reason="DEEPINFER_SKIP_ENGINES=1 is set"
    ),
]

TORCH = "torch==2.13.0+cpu"  # the CPU build on this machine's disk (pip's find-links)

# What the argument parsers' imports need (found by importing them in an empty environment),
# at the versions each engine's wheel asks for; setproctitle, orjson and uvicorn are the router
# launchers'.
NEEDS = {
    "sglang": [
        "numpy", "orjson", "psutil", "pybase64", "requests", "triton", "packaging", "pillow",
        "starlette", "msgspec", "pydantic", "pyzmq", "tqdm", "ipython", "aiohttp",
        "setproctitle",
    ],
    "vllm": [
        "regex", "pyyaml", "cbor2", "transformers", "openai", "openai-harmony", "cloudpickle",
        "cachetools", "uvloop", "py-cpuinfo", "fastapi", "prometheus-client",
        "partial-json-parser", "xgrammar", "llguidance", "psutil", "pyzmq", "aiohttp",
        "requests", "msgspec", "pillow", "pybase64", "setproctitle", "orjson", "uvicorn",
    ],
}  # fmt: skip
ROUTERS = {"sglang": "smg", "vllm": "vllm-router"}

# What pip prints when it cannot reach an index (as test_dependency_floor.py reads it).
NETWORK_ERRORS = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Name or service not known|"
    r"Temporary failure in name resolution|ConnectTimeout|ReadTimeout|timed out|ProxyError|"
    r"Network is unreachable|Connection refused|Could not fetch URL|SSLError|"
    r"Failed to fetch|dns error|error sending request"
)

# Scenarios whose launch files are checked: name or path, and --set overrides.
SCENARIOS: dict[str, tuple[str, list[str]]] = {
    "default": ("default", []),  # V4.1-Flash, DSpark, EP4 prefill, EP64 decode over 16 nodes
    "aggregated": ("v3-h200-aggregated", []),  # TP8 attention, EP8 experts, one node
    "aggregated-x2-mtp": (
        "v3-h200-aggregated",
        ["pools.aggregated.instances=2", "policies.speculative.policy=mtp1"],
    ),
    "wide-ep-tbo": ("sglang-v3-h100-96gpu", []),  # EP32 / EP72 on H100, two-batch overlap
    "tp8-mtp3": ("trtllm-r1-h200-min-latency", []),  # TP8, experts EP4 x TP2, MTP x 3
    "decode-tp8-on-gb200": ("default", ["pools.decode.tp=8"]),  # a TP wider than a node
}


def scenario(key: str) -> Scenario:
    ref, overrides = SCENARIOS[key]
    return load_scenario(ref, overrides)


# ---- the engines' environments -----------------------------------------------------------------


def _run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(kw.pop("env", {}))
    return subprocess.run(
        args, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, **kw
    )


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 30) -> str:
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-lines:])


def _need_ok(proc: subprocess.CompletedProcess[str], what: str) -> None:
    """An install step that failed: skip when the index is out of reach, else fail."""
    if proc.returncode == 0:
        return
    text = proc.stdout + proc.stderr
    if NETWORK_ERRORS.search(text):
        pytest.skip(f"{what} needs the package index: {_tail(proc, 3)}")
    if "torch" in text and "2.13.0+cpu" in text:
        pytest.skip(f"{what}: {TORCH} is not on this machine's disk: {_tail(proc, 3)}")
    pytest.fail(f"{what} failed:\n{_tail(proc)}")


def _pip_config(key: str) -> list[str]:
    """Values of a pip setting (find-links, constraint) from pip's own configuration."""
    proc = _run([sys.executable, "-m", "pip", "config", "list"])
    values: list[str] = []
    for line in proc.stdout.splitlines():
        name, _, value = line.partition("=")
        if name.endswith("." + key):
            values += value.strip().strip("'\"").split()
    return list(dict.fromkeys(values))


def _wanted(wheel: Path, names: list[str]) -> list[str]:
    """``names`` as requirements, at the versions ``wheel``'s metadata asks (torch excluded:
    the CPU build is installed instead)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode())
    asked = {}
    for text in msg.get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            asked[canonicalize_name(req.name)] = req
    out = []
    for name in names:
        pinned = asked.get(canonicalize_name(name))
        out.append(f"{name}{pinned.specifier}" if pinned is not None else name)
    return out


@dataclass(frozen=True)
class Engines:
    python: dict[str, Path]  # engine -> its environment's interpreter
    dynamo_wheel: Path


def _cache_root() -> Path:
    """The cache folder, keyed by the versions and the dependency lists (a change rebuilds)."""
    import hashlib

    versions = "-".join(f"{k}{v}" for k, v in sorted(CHECKED_AGAINST.items()))
    deps = hashlib.sha256(json.dumps([TORCH, NEEDS], sort_keys=True).encode()).hexdigest()[:8]
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    base = os.environ.get("DEEPINFER_ENGINE_CACHE") or tempfile.gettempdir()
    return Path(base) / f"deepinfer-sim-launch-{py}-{versions}-{deps}"


def _index_unreachable() -> str | None:
    """Why pip's package index cannot be reached, or None when it answers."""
    import urllib.error
    import urllib.request

    urls = _pip_config("index-url") or [os.environ.get("PIP_INDEX_URL", "")]
    url = urls[0] if urls and urls[0] else "https://pypi.org/simple"
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/sglang/", timeout=20):
            return None
    except (urllib.error.URLError, OSError) as exc:
        return f"package index {url} unreachable ({exc})"


def _download(root: Path) -> dict[str, Path]:
    """The engine, router and Dynamo wheels (pip download --no-deps), kept in the cache."""
    wheels = root / "wheels"
    wanted = {
        "sglang": f"sglang=={CHECKED_AGAINST['sglang']}",
        "vllm": f"vllm=={CHECKED_AGAINST['vllm']}",
        "smg": f"smg=={CHECKED_AGAINST['smg']}",
        "vllm-router": f"vllm-router=={CHECKED_AGAINST['vllm-router']}",
        "ai-dynamo": f"ai-dynamo=={CHECKED_AGAINST['ai-dynamo']}",
    }

    def found(name: str) -> Path | None:
        stem = name.replace("-", "_")
        hits = sorted(wheels.glob(f"{stem}-{CHECKED_AGAINST[name]}-*.whl"))
        return hits[0] if hits else None

    missing = [spec for name, spec in wanted.items() if found(name) is None]
    if missing and (why := _index_unreachable()):
        pytest.skip(why)
    if missing:
        wheels.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        got = _run([*pip, "-d", str(wheels), *missing])
        _need_ok(got, "downloading the engine wheels")
    paths = {name: found(name) for name in wanted}
    assert all(paths.values()), paths
    return {k: v for k, v in paths.items() if v is not None}


def _build_env(root: Path, engine: str, wheels: dict[str, Path]) -> Path:
    """A virtual environment with one engine and its router; reused once complete."""
    venv = root / f"venv-{engine}"
    python = venv / "bin" / "python"
    if (venv / "ready").exists():
        return python
    if why := _index_unreachable():
        pytest.skip(why)
    shutil.rmtree(venv, ignore_errors=True)
    made = _run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, _tail(made)
    uv_env = {"UV_CACHE_DIR": str(root / "uv-cache")}
    _need_ok(_run([str(python), "-m", "pip", "install", "--quiet", "uv"]), "installing uv")
    uv = [str(venv / "bin" / "uv"), "pip", "install", "--quiet", "--python", str(python)]
    for link in _pip_config("find-links"):
        uv += ["--find-links", link]
    deps = _run([*uv, TORCH, *_wanted(wheels[engine], NEEDS[engine])], env=uv_env)
    _need_ok(deps, f"installing {engine}'s parser dependencies")
    own = _run([*uv, "--no-deps", str(wheels[engine]), str(wheels[ROUTERS[engine]])], env=uv_env)
    _need_ok(own, f"installing {engine}")
    listed = _run([str(venv / "bin" / "uv"), "pip", "list", "--python", str(python)])
    assert not re.search(r"^nvidia-", listed.stdout, re.M), "a CUDA build of torch came in"
    (venv / "ready").write_text("ok\n")
    return python


@pytest.fixture(scope="module")
def engines() -> Engines:
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    wheels = _download(root)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {e: pool.submit(_build_env, root, e, wheels) for e in ("sglang", "vllm")}
        python = {e: f.result() for e, f in futures.items()}
    return Engines(python, wheels["ai-dynamo"])


# ---- the command lines -------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    scenario: str
    engine: str
    role: str
    node_rank: int
    argv: list[str]
    shape: PoolShape | None  # None: the router

    @property
    def label(self) -> str:
        return f"{self.scenario} {self.engine} {self.role} node {self.node_rank}"


def _dry_run(script: Path, role: str, node_rank: int) -> list[str]:
    env = {"DRY_RUN": "1", "NODE_RANK": str(node_rank), "HEAD": "10.0.0.1"}
    proc = _run(["bash", str(script), role], env=env)
    assert proc.returncode == 0, f"{script} {role}: {_tail(proc)}"
    return shlex.split(proc.stdout)


def script_lines(tmp: Path) -> list[Line]:
    """Every command of every scenario's two scripts, as bash makes them."""
    out = []
    for key in SCENARIOS:
        sc = scenario(key)
        shapes = {("server" if s.role == "aggregated" else s.role): s for s in pool_shapes(sc)}
        files = launch_files(sc).as_dict()
        for engine in ("sglang", "vllm"):
            path = tmp / f"{key}-{engine}.sh"
            path.write_text(files[f"{engine}.sh"])
            roles = re.search(r"^# Usage: \S+ (\S+)$", files[f"{engine}.sh"], re.M)
            assert roles, "no usage line"
            for role in roles.group(1).split("|"):
                shape = shapes.get(role)
                ranks = [0, 1] if shape is not None and shape.nodes > 1 else [0]
                for rank in ranks:
                    argv = _dry_run(path, role, rank)
                    out.append(Line(key, engine, role, rank, argv, shape))
    return out


def dynamo_lines() -> list[Line]:
    """The Dynamo workers' args as the engines' command lines."""
    out = []
    for key in SCENARIOS:
        sc = scenario(key)
        for engine in ("sglang", "vllm"):
            doc = yaml.safe_load(dynamo_manifest(sc, engine))
            shapes = pool_shapes(sc)
            for comp, shape in zip(doc["spec"]["components"][1:], shapes, strict=True):
                args = list(comp["podTemplate"]["spec"]["containers"][0]["args"])
                if "--disaggregation-mode" in args and engine == "vllm":
                    i = args.index("--disaggregation-mode")
                    del args[i : i + 2]
                argv = ["python3", "-m", "sglang.launch_server", *args]
                if engine == "vllm":
                    argv = ["vllm", "serve", *args]
                out.append(Line(key, engine, f"dynamo {comp['name']}", 0, argv, shape))
    return out


CHECKER = r"""
import contextlib, io, json, logging, sys, warnings
engine = sys.argv[1]
if engine == "sglang":
    from sglang.srt.server_args import prepare_server_args
    from smg.launch_router import parse_router_args
    FIELDS = ("tp_size", "attn_dp_size", "ep_size", "dp_size", "disaggregation_mode",
              "chunked_prefill_size", "max_running_requests", "speculative_algorithm",
              "enable_two_batch_overlap", "nnodes", "moe_a2a_backend", "kv_cache_dtype")
    def server(argv):
        a = prepare_server_args(argv)
        return {k: getattr(a, k) for k in FIELDS}
else:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm_router.launch_router import parse_router_args
    PARSER = make_arg_parser(FlexibleArgumentParser())
    FIELDS = ("tensor_parallel_size", "data_parallel_size", "enable_expert_parallel",
              "max_num_seqs", "max_num_batched_tokens", "enable_dbo",
              "data_parallel_size_local", "data_parallel_start_rank", "kv_cache_dtype")
    def plain(v):
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, dict):
            return v
        return {k: getattr(v, k) for k in ("kv_role", "method", "num_speculative_tokens")
                if hasattr(v, k)}
    def server(argv):
        args = PARSER.parse_args(argv)
        validate_parsed_serve_args(args)
        engine_args = AsyncEngineArgs.from_cli_args(args)
        out = {k: getattr(engine_args, k) for k in FIELDS}
        out["headless"] = args.headless
        out["kv_transfer_config"] = plain(engine_args.kv_transfer_config)
        out["speculative_config"] = plain(engine_args.speculative_config)
        return out
def router(argv):
    r = parse_router_args(argv)
    return {"prefill": len(r.prefill_urls), "decode": len(r.decode_urls),
            "workers": len(r.worker_urls)}
results = []
for job in json.load(sys.stdin):
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fields = (router if job["router"] else server)(job["argv"])
        text = log.getvalue() + "".join(str(w.message) for w in caught)
        results.append({"ok": True, "fields": fields, "log": text})
    except BaseException as exc:  # argparse exits
        results.append({"ok": False, "log": log.getvalue() + repr(exc)})
print(json.dumps(results, default=str))
"""

PROGRAMS = {
    "sglang": (["python3", "-m", "sglang.launch_server"], ["smg", "launch"]),
    "vllm": (["vllm", "serve"], ["vllm-router"]),
}


def check(engines: Engines, lines: list[Line]) -> dict[int, dict[str, Any]]:
    """Each line through its engine's parsers, the two engines at once; results by line."""
    jobs: dict[str, list[tuple[int, dict[str, Any]]]] = {"sglang": [], "vllm": []}
    for i, line in enumerate(lines):
        server, router = PROGRAMS[line.engine]
        for program, is_router in ((server, False), (router, True)):
            if line.argv[: len(program)] == program:
                argv = line.argv[len(program) :]
                jobs[line.engine].append((i, {"argv": argv, "router": is_router}))
                break
        else:
            pytest.fail(f"{line.label}: unexpected program {line.argv[:3]}")

    def run(engine: str) -> list[dict[str, Any]]:
        env = {"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
        payload = json.dumps([job for _, job in jobs[engine]])
        proc = subprocess.run(
            [str(engines.python[engine]), "-c", CHECKER, engine],
            input=payload,
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            cwd=tempfile.gettempdir(),
        )
        assert proc.returncode == 0, f"{engine} checker: {proc.stderr[-3000:]}"
        return list(json.loads(proc.stdout.strip().splitlines()[-1]))

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = {e: pool.submit(run, e) for e in jobs}
        results = {e: f.result() for e, f in done.items()}
    by_line = {}
    for engine, items in jobs.items():
        for (i, _), result in zip(items, results[engine], strict=True):
            by_line[i] = result
    return by_line


@pytest.fixture(scope="module")
def parsed(engines: Engines, tmp_path_factory: pytest.TempPathFactory):
    lines = script_lines(tmp_path_factory.mktemp("launch")) + dynamo_lines()
    return lines, check(engines, lines)


# ---- the tests ---------------------------------------------------------------------------------


def test_every_server_and_router_line_parses_with_the_engines_own_parsers(parsed):
    lines, results = parsed
    failed = [f"{line.label}: {results[i]['log'][-600:]}" for i, line in enumerate(lines)]
    failed = [f for i, f in enumerate(failed) if not results[i]["ok"]]
    assert not failed, "\n\n".join(failed)
    deprecated = [
        f"{line.label}: {results[i]['log'][-400:]}"
        for i, line in enumerate(lines)
        if "deprecated" in results[i]["log"].lower()
    ]
    assert not deprecated, "\n\n".join(deprecated)


def test_the_engines_read_the_scenarios_shape_from_the_lines(parsed):
    """The values the parsers hold are the scenario's: what SGLang divides over its DP ranks is
    back to the per-rank figure, vLLM's per-engine figures are the scenario's as they are."""
    lines, results = parsed
    for i, line in enumerate(lines):
        got, s = results[i].get("fields"), line.shape
        if s is None or got is None:  # the router; a line that did not parse fails above
            continue
        if line.engine == "sglang":
            assert (got["tp_size"], got["attn_dp_size"]) == (s.gpus, s.dp), line.label
            assert got["ep_size"] == s.expert_width, line.label
            assert got["nnodes"] == (1 if line.role.startswith("dynamo") else s.nodes)
            if s.max_tokens_per_step is not None and not s.whole_prompts:
                assert got["chunked_prefill_size"] // s.dp == s.max_tokens_per_step, line.label
            if s.max_seqs_per_rank is not None:
                assert got["max_running_requests"] // s.dp == s.max_seqs_per_rank, line.label
        else:
            assert got["tensor_parallel_size"] == s.tp, line.label
            assert got["data_parallel_size"] == s.dp, line.label
            assert got["enable_expert_parallel"] == (s.expert_width > 1), line.label
            if s.max_seqs_per_rank is not None:
                assert got["max_num_seqs"] == s.max_seqs_per_rank, line.label
            if s.max_tokens_per_step is not None:
                assert got["max_num_batched_tokens"] == s.max_tokens_per_step, line.label
            role = {"prefill": "kv_producer", "decode": "kv_consumer"}.get(s.role)
            if role is not None:
                assert got["kv_transfer_config"]["kv_role"] == role, line.label
            if line.node_rank > 0 and s.nodes > 1 and s.tp <= s.hardware.gpus_per_node:
                assert got["headless"], line.label
                local = s.hardware.gpus_per_node // s.tp
                assert got["data_parallel_start_rank"] == line.node_rank * local, line.label


def test_the_routers_get_every_prefill_instance_and_decode_group(parsed):
    lines, results = parsed
    routers = [
        (line, results[i]["fields"]) for i, line in enumerate(lines) if line.role == "router"
    ]
    assert {line.scenario for line, _ in routers} == set(SCENARIOS) - {"aggregated"}
    for line, got in routers:
        shapes = pool_shapes(scenario(line.scenario))
        if len(shapes) == 2:
            assert (got["prefill"], got["decode"]) == (shapes[0].count, shapes[1].count)
        else:
            assert got["workers"] == shapes[0].count


def _template(wheel: Path, backend: str, mode: str) -> dict[str, Any]:
    with zipfile.ZipFile(wheel) as z:
        text = z.read(f"dynamo/profiler/templates/dgd/{backend}/{mode}.yaml").decode()
    return dict(yaml.safe_load(text))


MODEL_TUNING = {"--page-size"}
"""Template flags sized for the template's Qwen3-0.6B, not for every model: DeepSeek's attention
backends choose their own page size."""


def _keys(doc: Any, path: str = "") -> set[str]:
    """The key paths a document sets; components and containers are matched by name."""
    if isinstance(doc, dict):
        out = set()
        for k, v in doc.items():
            out.add(f"{path}.{k}")
            out |= _keys(v, f"{path}.{k}")
        return out
    if isinstance(doc, list) and doc and isinstance(doc[0], dict) and "name" in doc[0]:
        return set().union(*(_keys(item, f"{path}[{item['name']}]") for item in doc))
    return set()


def _flags(doc: dict[str, Any]) -> dict[str, set[str]]:
    return {
        c["name"]: {a for a in c["podTemplate"]["spec"]["containers"][0]["args"] if a[:2] == "--"}
        for c in doc["spec"]["components"]
    }


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_the_dynamo_manifest_has_the_shape_of_dynamos_own_template(engines, backend):
    for key in SCENARIOS:
        sc = scenario(key)
        mode = "agg" if sc.aggregated else "disagg"
        template = _template(engines.dynamo_wheel, backend, mode)
        ours = yaml.safe_load(dynamo_manifest(sc, backend))
        where = f"{key} ({backend} {mode})"
        assert (ours["apiVersion"], ours["kind"]) == (template["apiVersion"], template["kind"])

        def structure(doc: dict[str, Any]) -> set[tuple[str, str]]:
            return {(c["name"], c["type"]) for c in doc["spec"]["components"]}

        assert structure(ours) == structure(template), where
        missing = _keys(template) - _keys(ours)
        assert not missing, f"{where}: keys the template sets and ours lacks: {sorted(missing)}"
        for name, flags in _flags(template).items():
            lacking = flags - _flags(ours)[name] - MODEL_TUNING
            assert not lacking, f"{where}: {name} lacks the template's {sorted(lacking)}"
        for comp in ours["spec"]["components"][1:]:
            limit = int(comp["podTemplate"]["spec"]["containers"][0]["resources"]["limits"][
                "nvidia.com/gpu"
            ])  # fmt: skip
            shape = next(s for s in pool_shapes(sc) if comp["type"] in (s.role, "worker"))
            assert limit * comp.get("multinode", {}).get("nodeCount", 1) == shape.gpus, where
            assert comp["replicas"] == shape.count, where
