"""``plan`` and ``sweep grid`` on a real Ray cluster, started the way users start one, and a plan
that outlives one of the cluster's machines.

A user points the planner at a cluster somebody started: ``ray start --head`` on one machine,
``ray start --address=HOST:PORT`` on each of the others, then ``deepinfer-sim plan CONFIG
--executor ray --address HOST:PORT`` (or ``sweep grid``). These tests do exactly that on this
machine: a head node of one CPU and a second node of one CPU that joins it, each a ``ray start
--block`` process of its own (its own process session, temporary folder, ports and
authentication token, so nothing is shared with another Ray on the machine), and the commands
run as a user runs them, in a subprocess.

- **A sweep on the cluster is the sweep on one machine.** Its two points run as Ray tasks, one
  on each node (one CPU each), and the table has the numbers a local sweep has.
- **A plan outlives a node.** The second node is killed mid-plan: the ``ray start`` process, its
  raylet, its agents and the worker running a shape, all SIGKILLed at once, as when a machine
  drops off the network. Ray runs that shape again (``max_retries``) on the head; the new run
  reads the probes the dead node had already logged in ``probes/<shape>.jsonl`` (a folder both
  nodes see: here the same disk) and simulates only the rest. The plan must end as the plan on
  one machine ends (same recommended shape, same sustainable rates, same probes) with every
  probe in the logs once: none lost, none run twice.

Each test starts a cluster of its own (10-20 s, hidden behind its local reference run); the two
take one to one and a half minutes together on a 2-core machine. They skip, saying so, only where
Ray is not installed (the ``ray`` extra: ``pip install -e '.[dev,ray]'``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import tiny_dict

from deepinfer_sim.planner.executors import real_ray
from deepinfer_sim.planner.plan import Shape

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(
        real_ray() is None,
        reason="Ray is not installed (the optional `ray` extra: pip install -e '.[dev,ray]')",
    ),
]

BIN = Path(sys.executable).parent  # the venv's `ray` and `deepinfer-sim`, beside its python
STARTED = "Ray runtime started"  # what `ray start` prints once its node has joined

# Two shapes (one prefill instance or two), each a bisection: the probe at the cost-model bound
# misses the 2 s TTFT SLO, two more probes follow, then the operating point: four simulations of
# a second or two each, so a shape that has logged its first probe has seconds of work left.
PLAN = [
    "planner.prefill_ep=[2]",
    "planner.prefill_instances=[1, 2]",
    "planner.decode_ep=[8]",
    "planner.bisection_steps=2",
    "planner.probe_seconds=10",
    "planner.probe_min_requests=50",
    "slo.ttft_s=2",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from /proc (Ray's workers are in process groups of
    their own: killing the node's process group alone would leave them to exit later)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Node:
    """One ``ray start --block`` process (its own session) and the Ray processes below it."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], root: Path) -> None:
        self.name = name
        folder = root / name
        folder.mkdir()
        self.log = folder / "ray-start.log"
        ports = {
            "node-manager-port": free_port(),
            "object-manager-port": free_port(),
            "dashboard-agent-listen-port": free_port(),
            "dashboard-agent-grpc-port": free_port(),
            "metrics-export-port": free_port(),
            "runtime-env-agent-port": free_port(),
        }
        cmd = [
            str(BIN / "ray"), "start", "--block", *args, "--num-cpus=1",
            f"--temp-dir={folder}", "--object-store-memory=100000000", "--disable-usage-stats",
            "--min-worker-port=0", "--max-worker-port=0",  # workers: any free port
            *(f"--{k}={v}" for k, v in ports.items()),
        ]  # fmt: skip
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=folder,
                start_new_session=True,
            )

    def ready(self, timeout: float = 90) -> Node:
        """Wait for ``ray start`` to say its node joined the cluster."""
        deadline = time.monotonic() + timeout
        while STARTED not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"`ray start` ({self.name}) did not start:\n{self.tail()}")
            time.sleep(0.2)
        return self

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> list[int]:
        """SIGKILL the node's every process at once; return their ids."""
        pids = descendants(self.proc.pid)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        return pids


class Cluster:
    """Two nodes on this machine: a head and a second node joining it. Both start at once (the
    second waits for the head by itself): :meth:`ready` waits for them; :meth:`stop` kills all."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # nothing from this process's Ray (an earlier test's ray.init sets RAY_ variables)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.env.update(
            RAY_AUTH_MODE="token",  # a token of its own: no other Ray here can join or drive it
            RAY_AUTH_TOKEN=secrets.token_hex(32),
            RAY_USAGE_STATS_ENABLED="0",
        )
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[Node] = []

    def start(self) -> None:
        head = [
            "--head", f"--port={self.port}", "--include-dashboard=false",
            f"--dashboard-port={free_port()}", f"--ray-client-server-port={free_port()}",
        ]  # fmt: skip
        self.nodes.append(Node("head", head, self.env, self.root))
        self.nodes.append(Node("second", [f"--address={self.address}"], self.env, self.root))

    @property
    def second(self) -> Node:
        return self.nodes[1]

    def ready(self) -> None:
        for node in self.nodes:
            node.ready()

    def stop(self) -> None:
        for node in reversed(self.nodes):
            if node.proc.poll() is None:
                node.kill()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A cluster of its own for each test (a node killed, or a node left from another test,
    would change where the tasks run), started but not waited for: each test runs its local
    reference meanwhile."""
    # a short folder: Ray's socket paths under it must stay within the 107 bytes of AF_UNIX
    root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp" if Path("/tmp").is_dir() else None))
    made = Cluster(root)
    try:
        made.start()
        yield made
    finally:
        made.stop()
        shutil.rmtree(root, ignore_errors=True)


def cli(*args: str) -> list[str]:
    return [str(BIN / "deepinfer-sim"), *args]


def sets(overrides: list[str]) -> list[str]:
    return [x for s in overrides for x in ("--set", s)]


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def log_lines(folder: Path) -> dict[str, list[dict]]:
    """Every complete line of every probe log in ``folder``, by file name."""
    out = {}
    for path in sorted(folder.glob("*.jsonl")):
        text = path.read_text(encoding="utf-8")
        out[path.name] = [json.loads(x) for x in text.splitlines(keepends=True) if x.endswith("\n")]
    return out


def test_a_sweep_grid_on_the_cluster_has_the_numbers_of_a_local_one(cluster, tmp_path):
    """Two points, two nodes of one CPU each: one point on each, through ``sweep grid
    --executor ray --address``, the output folder given relative to where the command runs (the
    Ray tasks write the points' runs: they must land there, not in the Ray workers' folders)."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(**{"workload.max_requests": 60})))
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"axes": {"pools.decode.ep": [8, 16]}}))
    args = ["sweep", "grid", str(config), "--grid", str(grid), "--workers", "2"]
    run(cli(*args, "--out", "local"), tmp_path, cluster.env)  # while the cluster starts
    cluster.ready()
    out = run(
        cli(*args, "--out", "sweep", "--executor", "ray", "--address", cluster.address),
        tmp_path,
        cluster.env,
    )
    assert "2 points: 2 run, 0 already done, 0 failed" in out

    table = pd.read_parquet(tmp_path / "sweep" / "sweep.parquet")
    local = pd.read_parquet(tmp_path / "local" / "sweep.parquet")
    assert (table["status"] == "ok").all(), table["error"].tolist()
    cols = ["point_id", "latency.ttft_s.p99", "throughput.output_tok_per_s", "requests.completed"]
    pd.testing.assert_frame_equal(table[cols], local[cols])  # same seeds, same numbers
    for pid in table["point_id"]:
        assert (tmp_path / "sweep" / "runs" / pid / "summary.json").is_file()
    # the second node ran a point: its worker's log is in the node's own folder
    node = cluster.second
    assert list((cluster.root / node.name).glob("session_*/logs/worker-*")), node.tail()


def test_a_plan_on_the_cluster_outlives_a_node_killed_mid_shape(cluster, tmp_path):
    """Both shapes start at once, one on each node. As soon as both have logged a probe, the
    second node is killed with everything on it. The plan goes on: the dead node's shape runs
    again on the head, from its probe log, and the answer is the local one."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_dict()))
    args = ["plan", str(config), "--workers", "2", *sets(PLAN)]
    run(cli(*args, "--out", "local"), tmp_path, cluster.env)  # while the cluster starts
    cluster.ready()
    node = cluster.second

    probes = tmp_path / "ray" / "plan" / "probes"
    cmd = cli(*args, "--out", "ray", "--executor", "ray", "--address", cluster.address)
    with (tmp_path / "plan.out").open("w+") as out:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=cluster.env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
        try:
            deadline = time.monotonic() + 120
            while not (len(lines := log_lines(probes)) == 2 and all(lines.values())):
                assert proc.poll() is None and time.monotonic() < deadline, node.tail()
                time.sleep(0.02)
            killed = node.kill()
            gone = time.monotonic() + 10
            while any(running(p) for p in killed) and time.monotonic() < gone:
                time.sleep(0.1)
            assert not any(running(p) for p in killed), "the node's processes outlived SIGKILL"
            at_kill = log_lines(probes)
            proc.wait(240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        output = out.read()
    assert proc.returncode == 0, output

    # the answer of the plan on one machine: same shape, same rates, probe for probe
    mine = json.loads((tmp_path / "ray" / "plan" / "plan.json").read_text())
    theirs = json.loads((tmp_path / "local" / "plan" / "plan.json").read_text())
    assert mine["complete"] and mine["recommended"] is not None, output
    assert mine["recommended"]["shape"] == theirs["recommended"]["shape"]
    assert mine["recommended"]["replicas"] == theirs["recommended"]["replicas"]
    keep = ("shape", "status", "sustainable_rps", "limited_by", "replicas", "usd_h")
    assert [{k: r[k] for k in keep} for r in mine["shapes"]] == [
        {k: r[k] for k in keep} for r in theirs["shapes"]
    ]
    assert mine["probes"] == theirs["probes"]
    assert mine["simulations"]["total"] == theirs["simulations"]["total"]

    # none lost, none run twice: each (kind, scenario_hash) once, and the local run's set
    def keys(folder: Path) -> list[tuple[str, str]]:
        return [(r["kind"], r["scenario_hash"]) for x in log_lines(folder).values() for r in x]

    ray_keys, local_keys = keys(probes), keys(tmp_path / "local" / "plan" / "probes")
    assert len(ray_keys) == len(set(ray_keys)), ray_keys
    assert sorted(ray_keys) == sorted(local_keys)

    # the dead node's shape (the one shape resumed) was cut off mid-search, and its new run read
    # every probe the node had logged instead of simulating it again
    found = {
        Shape(r["prefill_ep"], r["prefill_instances"], r["decode_ep"]).slug: r["from_log"]
        for r in mine["shapes"]
    }
    resumed = [slug for slug, n in found.items() if n]
    assert len(resumed) == 1, (found, at_kill, output)
    cut = at_kill[f"{resumed[0]}.jsonl"]
    assert cut and not any(r["kind"] == "operating_point" for r in cut), at_kill
    assert found[resumed[0]] == len(cut)
    assert "resumed:" in output
