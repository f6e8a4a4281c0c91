"""`dpmigrate launch --nnodes 2` (TensorFlow) across two network namespaces: the cases test_tf_multinode.py
does not cover (issue 12): 2 nodes x 2 workers with the checkpoint written once (started with --master alone,
issue 20), a node whose master never comes (--master alone), and a worker killed mid-run.

Each node is a namespace of its own (tests/netns.py), each node's launcher runs in its own folder, no
environment variable is set by hand. The test process never imports tensorflow (one framework per
process): the jobs write NumPy files, and the checkpoint is read by a fresh TensorFlow process.
Skipped only where namespaces cannot be created.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from netns import TwoNodes, finish, start_launch, user_env
from test_tf_multinode import PORT, RUN_ID

pytestmark = [pytest.mark.multinode, pytest.mark.slow,
              pytest.mark.skipif(__import__("importlib.util").util.find_spec("tensorflow") is None,
                                 reason="tensorflow is not installed")]

JOBS = Path(__file__).parent / "jobs"
COLLECTIVE_TIMEOUT_S = 20
SLACK_S = 5  # what the issue allows after a timeout

LOAD = """\
import sys
import numpy as np
from tensorflow import keras
model = keras.models.load_model(sys.argv[1])
np.savez(sys.argv[2], *[np.asarray(w) for w in model.get_weights()])
"""


def start_node(nodes: TwoNodes, node: int, tmp_path: Path, script: Path, *args: str, nproc: int = 1,
               launch: tuple[str, ...] = (), hosts: bool = True) -> subprocess.Popen:
    """Node ``node``'s `dpmigrate launch`, in its namespace and its own folder ``tmp_path/node<i>``; without
    ``hosts``, ``--master`` alone (the workers meet at the rendezvous node 0 serves there)."""
    given = ["--hosts", ",".join(nodes.addresses)] if hosts else []
    return start_launch(nodes, node, tmp_path, ["-n", str(nproc), "--master", f"{nodes.addresses[0]}:{PORT}", *given,
                                                "--run-id", RUN_ID, *launch, str(script), *args])


def max_difference(a_path: Path, b_path: Path) -> float:
    with np.load(a_path) as a, np.load(b_path) as b:
        assert sorted(a.files) == sorted(b.files)
        return max(float(np.abs(a[k] - b[k]).max()) for k in a.files)


def test_two_nodes_of_two_workers_train_like_one_process_and_the_chief_alone_keeps_the_model(nodes, tmp_path):
    """(a) 2 nodes x 2 workers started with --master alone (issue 20: no --hosts; the workers meet at node 0's
    rendezvous), a GradientTape loop as converted, against 1 process with the global batch, to 1e-5; (d) every
    worker calls dp.save: the model exists once, on the chief's node (global rank 0), and loads in a fresh
    single process with the trained weights."""
    script = JOBS / "tf_train.py"
    single = subprocess.run([sys.executable, str(script), "--mode", "tape", "--out", str(tmp_path / "single.npz")],
                            env=user_env(), capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr
    procs = [start_node(nodes, node, tmp_path, script, "--mode", "tape", "--out", "dist.npz", "--save", "model.keras",
                        nproc=2, launch=("--timeout", "60"), hosts=False) for node in (0, 1)]
    (code0, out0, err0), (code1, _, err1) = finish(procs)
    assert code0 == 0 and code1 == 0, err0[-3000:] + err1[-3000:]
    assert "trained 12 steps on 4 worker(s)" in out0
    assert max_difference(tmp_path / "single.npz", tmp_path / "node0" / "dist.npz") < 1e-5
    assert (tmp_path / "node0" / "model.keras").is_file()
    assert sorted(p.name for p in (tmp_path / "node1").iterdir()) == ["logs"]  # no model, no temporary copy
    assert [p.name for p in (tmp_path / "node0").iterdir() if p.name.startswith(".")] == []
    loaded = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / "node0" / "model.keras"),
                             str(tmp_path / "loaded.npz")], env={**user_env(), "TF_USE_LEGACY_KERAS": "1"},
                            capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert max_difference(tmp_path / "single.npz", tmp_path / "loaded.npz") < 1e-5
    assert nodes.pids(0) == nodes.pids(1) == []


def test_with_master_alone_a_node_whose_master_never_comes_exits_within_the_start_timeout_naming_it(nodes, tmp_path):
    """--master alone, node 1 started by itself: its worker never reaches node 0's rendezvous and says so."""
    start_timeout = 10
    alone = start_node(nodes, 1, tmp_path, JOBS / "tf_fault.py", str(tmp_path), "join", hosts=False,
                       launch=("--start-timeout", str(start_timeout)))
    started = time.time()
    ((code, _, err),) = finish([alone])
    assert code != 0
    assert time.time() - started <= start_timeout + SLACK_S + 5, err[-2000:]
    assert (f"worker 1 (node 1) could not reach the master {nodes.addresses[0]}:{PORT} within --start-timeout "
            f"{start_timeout} s: node 0 (rank 0) never arrived") in err, err[-3000:]
    assert nodes.pids(0) == nodes.pids(1) == []


def test_a_worker_killed_mid_run_ends_every_process_on_both_nodes(nodes, tmp_path):
    """(c) Worker 1 (node 1) kills itself (SIGKILL) after 3 barriers: both nodes' launchers exit non-zero, node 1
    naming rank 1, and no process of the job is left in either namespace, within the collective timeout + 5 s."""
    procs = [start_node(nodes, node, tmp_path, JOBS / "tf_fault.py", str(tmp_path), "kill",
                        launch=("--timeout", str(COLLECTIVE_TIMEOUT_S))) for node in (0, 1)]
    ended = []
    for proc in procs:
        proc.wait(timeout=300)
        ended.append(time.time())
    (code0, _, err0), (code1, _, err1) = finish(procs)
    killed_at = float((tmp_path / "killed.rank1").read_text())
    assert nodes.pids(0) == nodes.pids(1) == []  # the launchers left nothing running
    took = max(ended) - killed_at
    print(f"both nodes ended {took:.1f} s after worker 1 was killed")
    assert took <= COLLECTIVE_TIMEOUT_S + SLACK_S, f"took {took:.1f} s\n{err0[-3000:]}"
    assert code1 == 128 + 9 and code0 != 0, err0[-3000:] + err1[-3000:]
    final1, final0 = err1.rstrip().splitlines()[-1], err0.rstrip().splitlines()[-1]
    assert final1.startswith("dpmigrate launch: rank 1 failed (killed by SIGKILL)"), final1
    assert final0.startswith("dpmigrate launch: rank 0 failed"), final0
