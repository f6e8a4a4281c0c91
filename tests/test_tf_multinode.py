"""`dpmigrate launch --nnodes 2` (TensorFlow) across two network namespaces joined by a veth pair (issue 12).

Each node is a namespace of its own (tests/netns.py), each node's launcher runs in its own folder and no
environment variable is set by hand: TF_CONFIG names node 0 by the --master address and this node by
the address the launcher found towards the master. Skipped only where namespaces cannot be created.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from netns import TwoNodes, finish, start_launch, user_env

pytestmark = [pytest.mark.multinode, pytest.mark.slow]

JOBS = Path(__file__).parent / "jobs"
RUN_ID = "multinode-tf-run-id-0123456789ab"
PORT = 29500  # the namespaces are fresh: nothing else listens in them
START_TIMEOUT_S = 15


def start_node(nodes: TwoNodes, node: int, tmp_path: Path, script: Path, *args: str,
               launch: tuple[str, ...] = ()) -> subprocess.Popen:
    """Node ``node``'s `dpmigrate launch` (1 worker), in its namespace and its own folder ``tmp_path/node<i>``."""
    return start_launch(nodes, node, tmp_path, ["-n", "1", "--master", f"{nodes.addresses[0]}:{PORT}", "--hosts",
                                                ",".join(nodes.addresses), "--run-id", RUN_ID, *launch, str(script),
                                                *args])


def test_two_nodes_train_like_one_process(nodes, tmp_path):
    """(a) 2 nodes x 1 worker, a GradientTape loop as written, against 1 process with the global batch;
    (exposure) while the workers hold after training, each namespace's /proc/net/tcp*: each worker's gRPC
    server (TF 2.21 binds ``[::]``) listens on its node's own address only, through the bind guard."""
    script = JOBS / "tf_train.py"
    single = subprocess.run([sys.executable, str(script), "--mode", "tape", "--out", str(tmp_path / "single.npz")],
                            env=user_env(), capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr
    hold = tmp_path / "hold"
    hold.write_text("")
    procs = [start_node(nodes, node, tmp_path, script, "--mode", "tape", "--out", "dist.npz", "--hold", str(hold))
             for node in (0, 1)]
    try:
        deadline = time.monotonic() + 240
        while not all(Path(f"{hold}.rank{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the job did not train"
            time.sleep(0.2)
        listening = [nodes.listening(node) for node in (0, 1)]
    finally:
        hold.unlink()
    (code0, out0, err0), (code1, out1, err1) = finish(procs)
    assert code0 == 0 and code1 == 0, err0[-3000:] + err1[-3000:]
    for node, err in enumerate((err0, err1)):
        assert (f"bind guard: a server of this job that asks for every interface (Paddle's TCPStore, TensorFlow's "
                f"gRPC servers) listens on {nodes.addresses[node]} only") in err
        assert "listens on every interface" not in err
        assert f"::ffff:{nodes.addresses[node]}:{PORT + 0}" in listening[node] or \
            f"{nodes.addresses[node]}:{PORT}" in listening[node], listening  # the worker's gRPC server
        elsewhere = [a for a in listening[node] if a.rsplit(":", 1)[0] not in
                     (nodes.addresses[node], f"::ffff:{nodes.addresses[node]}")]
        assert elsewhere == [], listening
    with np.load(tmp_path / "single.npz") as a, np.load(tmp_path / "node0" / "dist.npz") as b:
        worst = max(float(np.abs(a[k] - b[k]).max()) for k in a.files)
    assert worst < 1e-5, worst
    assert nodes.pids(0) == nodes.pids(1) == []


def test_a_node_whose_peer_never_comes_exits_within_the_start_timeout_naming_it(nodes, tmp_path):
    """(b) Node 1 started alone: node 0 (worker 0, the master) never comes."""
    alone = start_node(nodes, 1, tmp_path, JOBS / "tf_fault.py", str(tmp_path), "join",
                       launch=("--start-timeout", str(START_TIMEOUT_S)))
    ((code, _, err),) = finish([alone])
    ended = time.time()
    waited_from = float((tmp_path / "init.rank1").read_text())
    assert code != 0
    assert ended - waited_from <= START_TIMEOUT_S + 5, ended - waited_from
    assert (f"dpmigrate: worker 1 waited {START_TIMEOUT_S} s for the other workers to join and gave up: worker 0 "
            f"({nodes.addresses[0]}:{PORT}) never came up: nothing listens there") in err, err[-3000:]
    assert nodes.pids(0) == nodes.pids(1) == []
