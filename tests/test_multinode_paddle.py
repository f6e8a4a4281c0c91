"""`dpmigrate launch --nnodes 2` (Paddle) across two network namespaces joined by a veth pair (issue 12).

Each node is a namespace of its own (10.77.0.1 and 10.77.0.2, its own loopback, the machine's /etc/hosts),
each node's launcher runs in its own folder, no environment variable is set by hand, and the jobs run
through Paddle's own launcher. The test process never imports paddle: the jobs write NumPy files, and a
checkpoint is read by a separate plain-Paddle process (tests/jobs/paddle_load.py). Skipped only where
network namespaces cannot be created (the reason is shown).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from netns import TwoNodes, finish, start_launch, user_env

pytestmark = [pytest.mark.multinode, pytest.mark.slow,
              pytest.mark.skipif(__import__("importlib.util").util.find_spec("paddle") is None,
                                 reason="paddle is not installed")]

JOBS = Path(__file__).parent / "jobs"
TRAIN = JOBS / "paddle_train.py"
RUN_ID = "multinode-paddle-run-id-0123456789"
PORT = 29500  # the namespaces are fresh: nothing else listens in them
START_TIMEOUT_S = 15
SLACK_S = 5  # what the issue allows after a timeout
COLLECTIVE_TIMEOUT_S = 30  # gloo's, fixed in Paddle 3.3.1 (the runtime's barriers get --timeout)


def start_node(nodes: TwoNodes, node: int, tmp_path: Path, *args: str, nproc: int = 1,
               launch: tuple[str, ...] = (), port: int = PORT) -> subprocess.Popen:
    """Node ``node``'s `dpmigrate launch`, in its namespace and its own folder ``tmp_path/node<i>``."""
    return start_launch(nodes, node, tmp_path, ["-n", str(nproc), "--master", f"{nodes.addresses[0]}:{port}",
                                                "--run-id", RUN_ID, *launch, str(TRAIN), *args])


def max_difference(a_path: Path, b_path: Path) -> float:
    with np.load(a_path) as a, np.load(b_path) as b:
        assert sorted(a.files) == sorted(b.files)
        return max(float(np.abs(a[k] - b[k]).max()) for k in a.files)


@pytest.mark.parametrize("nproc", [1, 2], ids=["2x1", "2x2"])
def test_two_nodes_train_like_one_process_and_save_the_checkpoint_once(nodes, tmp_path, nproc):
    """(a) the global batch split over 2 nodes x nproc == 1 process, to 1e-5; (d) the checkpoint is written
    once, on global rank 0's node, and loads into the original single-process model; (exposure) while the
    job ran, every socket listening in either namespace was on that node's own address or Paddle's TCPStore."""
    single = subprocess.run([sys.executable, str(TRAIN), "--out", "single.npz"], cwd=tmp_path,
                            env={**user_env(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr
    procs = [start_node(nodes, node, tmp_path, "--out", "dist.npz", "--checkpoint", "ckpt.pdparams", nproc=nproc,
                        launch=("--timeout", "60")) for node in (0, 1)]
    results = finish(procs)
    for node, (code, _, err) in enumerate(results):
        assert code == 0, f"node {node}:\n{err[-4000:]}"
        assert (f"dpmigrate launch: network: {nodes.addresses[node]} on {nodes.ifaces[node]}, from the route to "
                f"the master") in err
    assert f"trained 20 steps on {2 * nproc} process(es)" in results[0][1]
    assert not (tmp_path / "node1" / "ckpt.pdparams").exists()  # written once: by global rank 0, on node 0
    assert max_difference(tmp_path / "single.npz", tmp_path / "node0" / "dist.npz") < 1e-5
    loaded = subprocess.run([sys.executable, str(JOBS / "paddle_load.py"), str(tmp_path / "node0" / "ckpt.pdparams")],
                            cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout.splitlines()[-1]) == {
        "keys": ["0.bias", "0.weight", "2.bias", "2.weight"], "missing": [], "unexpected": []}


@pytest.mark.parametrize("guard", [True, False], ids=["bind-guard", "no-bind-guard"])
def test_what_listens_while_a_two_node_job_runs(nodes, tmp_path, guard):
    """(exposure) While a 2-node job runs (each rank holding after training), each namespace's /proc/net/tcp*:
    the nodes' rendezvous at the master port is served by dpmigrate on node 0's address only (Paddle's own
    would listen on every interface); Paddle's TCPStore, served by global rank 0 at the PADDLE_MASTER port
    Paddle picked, binds 0.0.0.0 (Paddle 3.3.1 has no option to bind elsewhere) and the bind guard puts it on
    node 0's address only; nothing listens on a wildcard address; node 1 listens on nothing. The control, with
    ``--no-bind-guard``: the store is back on 0.0.0.0, the one socket on a wildcard address."""
    hold = tmp_path / "hold"
    hold.write_text("")
    launch = () if guard else ("--no-bind-guard",)
    procs = [start_node(nodes, node, tmp_path, "--steps", "2", "--hold", str(hold), launch=launch) for node in (0, 1)]
    try:
        ready = [Path(f"{hold}.rank0"), Path(f"{hold}.rank1")]
        deadline = time.monotonic() + 120
        while not all(p.exists() for p in ready):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the job did not start"
            time.sleep(0.2)
        listening = [nodes.listening(node) for node in (0, 1)]
        env = json.loads(next((tmp_path / "node0" / "logs" / "paddle").glob("backup_env.0.json")).read_text())
    finally:
        hold.unlink()
    results = finish(procs)
    assert [code for code, _, _ in results] == [0, 0], results[0][2][-3000:] + results[1][2][-3000:]
    store_port = env["PADDLE_MASTER"].rsplit(":", 1)[1]
    assert f"{nodes.addresses[0]}:{PORT}" in listening[0]  # the rendezvous, on node 0's address only
    store = f"{nodes.addresses[0]}:{store_port}" if guard else f"0.0.0.0:{store_port}"
    assert store in listening[0]  # Paddle's TCPStore: through the bind guard, or where Paddle binds it
    for node in (0, 1):
        others = [a for a in listening[node] if not a.startswith(f"{nodes.addresses[node]}:")]
        assert others == ([store] if node == 0 and not guard else []), listening


def test_a_node_whose_peer_never_comes_exits_within_the_start_timeout_naming_it(nodes, tmp_path):
    """(b) Node 1 started alone (node 0 never comes), and, at the same time, node 0 started alone in a job
    whose node 1 never comes: each exits non-zero within --start-timeout + 5 s, naming the master address it
    tried and the node and ranks that never arrived; nothing of either job is left running."""
    launch = ("--start-timeout", str(START_TIMEOUT_S))
    started = time.monotonic()
    alone = [start_node(nodes, 1, tmp_path, "--out", "x.npz", nproc=2, launch=launch),  # nothing at PORT
             start_node(nodes, 0, tmp_path, "--out", "x.npz", nproc=2, launch=launch, port=PORT + 1)]
    took = []
    for proc in alone:
        proc.wait(timeout=START_TIMEOUT_S + 60)
        took.append(time.monotonic() - started)
    (code1, _, err1), (code0, _, err0) = finish(alone)
    master = nodes.addresses[0]
    assert code1 != 0 and code0 != 0, err1 + err0
    assert (f"dpmigrate launch: node 1 could not reach the master {master}:{PORT} within --start-timeout "
            f"{START_TIMEOUT_S} s: node 0 (ranks 0-1) never arrived") in err1, err1
    assert (f"dpmigrate launch: node 1 (ranks 2-3) never arrived at the master {master}:{PORT + 1} within "
            f"--start-timeout {START_TIMEOUT_S} s") in err0, err0
    assert max(took) <= START_TIMEOUT_S + SLACK_S, f"took {took} s\n{err1[-2000:]}\n{err0[-2000:]}"
    assert nodes.pids(0) == nodes.pids(1) == []


@pytest.mark.parametrize("victim", [1, 0], ids=["on-node-1", "global-rank-0"])
def test_a_worker_killed_mid_run_ends_every_process_on_both_nodes(nodes, tmp_path, victim):
    """(c) A rank is killed with SIGKILL at step 3 (rank 1 on node 1; or global rank 0, which serves Paddle's
    TCPStore): both nodes' launchers exit non-zero, each naming the killed rank, and no process of the job is
    left in either namespace, within the collective timeout + 5 s."""
    procs = [start_node(nodes, node, tmp_path, "--steps", "100000", "--die-rank", str(victim), "--die-at", "3",
                        launch=("--timeout", "20")) for node in (0, 1)]
    ended = []
    for proc in procs:
        proc.wait(timeout=240)
        ended.append(time.time())
    results = finish(procs)
    assert nodes.pids(0) == nodes.pids(1) == []  # the launchers left nothing running
    killed_node, other = victim, 1 - victim
    status = tmp_path / f"node{killed_node}" / "logs" / "rank-status" / f"rank{victim}.json"
    killed_at = json.loads(status.read_text())["ended"]  # written by the rank's wrapper when the rank died
    final = [err.rstrip().splitlines()[-1] for _, _, err in results]
    assert results[killed_node][0] == 128 + 9, results[killed_node][2][-3000:]
    assert final[killed_node].startswith(f"dpmigrate launch: rank {victim} failed (killed by SIGKILL)"), final
    assert results[other][0] != 0, results[other][2][-3000:]
    assert "lost rank" not in final[killed_node], final
    assert re.match(rf"dpmigrate launch: rank {other} failed \(.*\); it lost rank {victim}, on another node",
                    final[other]), results[other][2][-3000:]
    took = max(ended) - killed_at
    print(f"both nodes ended {took:.1f} s after rank {victim} was killed")
    assert took <= COLLECTIVE_TIMEOUT_S + SLACK_S, f"took {took:.1f} s"
