"""``dpmigrate launch`` for TensorFlow: the workers it plans (fast), and what a running job listens on (slow)."""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dpmigrate.launch
from dpmigrate.launch import cli
from dpmigrate.launch import tensorflow as tf_backend
from dpmigrate.launch.processes import descendants

pytestmark = pytest.mark.alone  # its slow jobs time how fast a failure or a signal ends them: run one at a time

RUN_ID = "0123456789abcdef0123456789abcdef"
JOBS = Path(__file__).parent / "jobs"


def tf_script(tmp_path: Path, body: str = "") -> Path:
    path = tmp_path / "train.py"
    path.write_text("import dpmigrate.runtime.tensorflow as dp\nimport tensorflow as tf\n" + body)
    return path


def dry_run(capsys, *argv: str) -> tuple[str, dict[str, tuple[dict[str, str], list[str]]]]:
    assert dpmigrate.launch.main(["--dry-run", *argv]) == 0
    out = capsys.readouterr().out.splitlines()
    processes = {}
    for comment, line in zip(out[1::2], out[2::2]):
        words = shlex.split(line)
        start = words.index(sys.executable)
        processes[comment.split()[1]] = dict(w.split("=", 1) for w in words[1:start]), words[start:]
    return out[0], processes


def test_tensorflow_is_a_launch_backend_detected_from_the_imports(tmp_path):
    assert cli.BACKENDS["tensorflow"] is tf_backend and "tensorflow" not in cli.NOT_YET_SUPPORTED
    assert cli.detect_framework(tf_script(tmp_path)) == "tensorflow"


def test_one_node_starts_each_worker_itself_through_the_namespace_wrapper(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    script = tf_script(tmp_path)
    header, processes = dry_run(capsys, "-n", "2", "--start-timeout", "20", "--log-dir", str(tmp_path / "logs"),
                                str(script), "--lr", "0.1")
    assert header.startswith("# dpmigrate launch: tensorflow, ranks 0-1 of 2")
    assert sorted(processes) == ["rank0", "rank1"]  # no store, no framework launcher
    for rank in (0, 1):
        env, command = processes[f"rank{rank}"]
        job_file = tmp_path / "logs" / f"tensorflow-job-{command[3].split('-job-')[1]}"
        assert command == [sys.executable, "-m", "dpmigrate.launch.tensorflow_worker", str(job_file), str(rank), "2",
                           str(script), "--lr", "0.1"]
        assert env["DPMIGRATE_START_TIMEOUT"] == "20" and env["OMP_NUM_THREADS"] == "1"
        assert "TF_CONFIG" not in env  # written by the wrapper, inside the job's namespace, with the ports chosen there
        if importlib.util.find_spec("tf_keras") is not None:
            assert env["TF_USE_LEGACY_KERAS"] == "1"  # Keras 3's fit fails under MultiWorkerMirroredStrategy


def test_the_users_own_legacy_keras_choice_is_kept(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    env = dry_run(capsys, "-n", "2", str(tf_script(tmp_path)))[1]["rank0"][0]
    assert "TF_USE_LEGACY_KERAS" not in env  # inherited as the user set it


@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None, reason="tf-keras is not installed")
def test_a_script_reading_keras3_only_apis_keeps_keras3_on_its_workers(tmp_path, capsys):
    """tf-keras has no keras.ops: with TF_USE_LEGACY_KERAS=1 `from tensorflow.keras import ops` fails on every
    worker (issue 20); such a script's workers keep Keras 3 (its custom loops run; its fit the converter declines)."""
    script = tf_script(tmp_path, "from tensorflow import keras\nscore = keras.ops.einsum('i,i->', [1.0], [2.0])\n")
    env = dry_run(capsys, "-n", "2", str(script))[1]["rank0"][0]
    assert "TF_USE_LEGACY_KERAS" not in env
    assert tf_backend.uses_keras3_only(script) and not tf_backend.uses_keras3_only(tf_script(tmp_path))


def test_several_nodes_give_every_worker_the_whole_cluster_with_this_nodes_chosen_address(tmp_path, capsys):
    script = tf_script(tmp_path)
    _, processes = dry_run(capsys, "-n", "2", "--nnodes", "2", "--node-rank", "1", "--master", "127.0.0.1:29600",
                           "--hosts", "127.0.0.1,node1", "--run-id", RUN_ID, str(script))
    assert sorted(processes) == ["rank2", "rank3"]
    for rank in (2, 3):
        env, command = processes[f"rank{rank}"]
        config = json.loads(env["TF_CONFIG"])
        # node 1's own entries: the address this node uses towards the master (here loopback), not the name given
        assert config == {"cluster": {"worker": ["127.0.0.1:29600", "127.0.0.1:29601", "127.0.0.1:29600",
                                                 "127.0.0.1:29601"]}, "task": {"type": "worker", "index": rank}}
        assert command[:5] == [sys.executable, "-m", "dpmigrate.launch.tensorflow_worker", "-", str(rank)]


def test_several_nodes_with_master_alone_meet_at_the_rendezvous_node_0_serves(tmp_path, capsys):
    """No --hosts: node 0 serves the workers' rendezvous on the master port (a service of its job); every worker
    says its own address there (this node's, towards the master) on PORT + 1 + local rank, and reads the others';
    the run id travels in the environment, never on a command line."""
    script = tf_script(tmp_path)
    for node, ranks in ((0, (0, 1)), (1, (2, 3))):
        _, processes = dry_run(capsys, "-n", "2", "--nnodes", "2", "--node-rank", str(node), "--master",
                               "127.0.0.1:29600", "--run-id", RUN_ID, str(script))
        assert sorted(processes) == sorted([f"rank{r}" for r in ranks] + (["rendezvous"] if node == 0 else []))
        for j, rank in enumerate(ranks):
            env, command = processes[f"rank{rank}"]
            assert "TF_CONFIG" not in env and RUN_ID not in " ".join(command)
            assert command[:5] == [sys.executable, "-m", "dpmigrate.launch.tensorflow_worker", "meet", str(rank)]
            meeting = json.loads(env["DPMIGRATE_TF_MEET"])
            assert meeting == {"master": "127.0.0.1:29600", "run_id": RUN_ID, "nnodes": 2, "nproc": 2,
                               "me": f"127.0.0.1:{29601 + j}"}
        if node == 0:
            env, command = processes["rendezvous"]
            assert command[-1] == "serve" and json.loads(env["DPMIGRATE_TF_MEET"])["me"] == "127.0.0.1:29600"


def test_workers_meeting_at_a_master_build_one_tf_config_in_rank_order(tmp_path):
    """Two 'nodes' of one worker each, on this machine: the rendezvous served, both workers say where they listen
    (node 1 first), each gets every worker in rank order."""
    import socket
    import threading

    from dpmigrate.launch import tensorflow_nodes
    from dpmigrate.launch.paddle_nodes import MasterStore

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = MasterStore("127.0.0.1", port, RUN_ID)
    try:
        meetings = [json.loads(tensorflow_nodes.meeting_env(master=("127.0.0.1", port), run_id=RUN_ID, nnodes=2, nproc=1,
                                                            host="127.0.0.1", port=port + 1 + 10 * r)) for r in (0, 1)]
        found = {}
        threads = [threading.Thread(target=lambda r=r: found.__setitem__(r, tensorflow_nodes.cluster(meetings[r], r, 20)))
                   for r in (1, 0)]
        for thread in threads:
            thread.start()
            time.sleep(0.3)
        for thread in threads:
            thread.join(30)
        assert found[0] == found[1] == [f"127.0.0.1:{port + 1}", f"127.0.0.1:{port + 11}"]
        assert store.prefix("/") and all(k.startswith((f"/{RUN_ID}/", "/healthy")) for k in store.prefix("/"))
    finally:
        store.close()


def test_a_worker_whose_nodes_never_arrive_names_them_within_the_start_timeout(tmp_path):
    import socket

    from dpmigrate.launch import tensorflow_nodes
    from dpmigrate.launch.paddle_nodes import MasterStore

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    meeting = json.loads(tensorflow_nodes.meeting_env(master=("127.0.0.1", port), run_id=RUN_ID, nnodes=2, nproc=2,
                                                      host="127.0.0.1", port=port + 1))
    with pytest.raises(SystemExit) as unreached:
        tensorflow_nodes.cluster(meeting, 2, 1)
    assert f"worker 2 (node 1) could not reach the master 127.0.0.1:{port} within --start-timeout 1 s: node 0 " \
           "(ranks 0-1) never arrived" in str(unreached.value)
    store = MasterStore("127.0.0.1", port, RUN_ID)
    try:
        with pytest.raises(SystemExit) as missing:
            tensorflow_nodes.cluster(meeting, 2, 1)
    finally:
        store.close()
    assert f"nodes 0, 1 (ranks 0-3) never arrived at the master 127.0.0.1:{port}" in str(missing.value)


@pytest.mark.parametrize("extra, message", [
    (["--hosts", "a,b,c"], "--hosts 'a,b,c' lists 3 host(s) for --nnodes 2"),
])
def test_several_nodes_without_a_matching_host_list_exit_2(tmp_path, capsys, extra, message):
    script = tf_script(tmp_path)
    argv = ["-n", "1", "--nnodes", "2", "--node-rank", "1", "--master", "127.0.0.1:29600", "--run-id", RUN_ID,
            "--log-dir", str(tmp_path / "logs"), *extra, str(script)]
    assert dpmigrate.launch.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()


# ---------------------------------------------------------------- a running job (slow)

WAIT_UNTIL_TOLD = """
import os, sys, time
dp.init()
folder = sys.argv[1]
open(os.path.join(folder, f"ready{dp.rank()}"), "w").write(str(os.getpid()))
while not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.05)
dp.barrier()
"""


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(FileNotFoundError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(FileNotFoundError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _listening(tables: list[Path], inodes: set[str]) -> list[str]:
    """Local addresses of the LISTEN sockets among ``inodes`` in the given /proc net tables."""
    found = []
    for table in tables:
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                host, port = fields[1].split(":")
                raw = bytes.fromhex(host)
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.append(f"{ipaddress.ip_address(words)}:{int(port, 16)}")
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_a_one_node_job_listens_only_inside_its_private_loopback_network(tmp_path):
    script = tf_script(tmp_path, WAIT_UNTIL_TOLD)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "RANK", "WORLD_SIZE", "MASTER_"))}
    proc = subprocess.Popen([sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(tmp_path / "logs"),
                             str(script), str(tmp_path)], cwd=tmp_path, env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "timeout"
            time.sleep(0.1)
        time.sleep(0.2)  # the pid is written before close: let the write land
        workers = [int((tmp_path / f"ready{r}").read_text()) for r in (0, 1)]
        job = [proc.pid, *descendants(proc.pid)]
        inodes = set().union(*(_socket_inodes(pid) for pid in job))
        seen_from_host = _listening([Path("/proc/net/tcp"), Path("/proc/net/tcp6")], inodes)
        inside = _listening([Path(f"/proc/{workers[0]}/net/tcp"), Path(f"/proc/{workers[0]}/net/tcp6")], inodes)
        host_net = os.readlink("/proc/self/ns/net")
        worker_nets = {os.readlink(f"/proc/{pid}/ns/net") for pid in workers}
    finally:
        (tmp_path / "go").write_text("")
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert seen_from_host == []  # nothing of the job listens in the host's network at all
    assert len(worker_nets) == 1 and host_net not in worker_nets  # both workers share one private network
    # inside it, TensorFlow's servers listen on the wildcard (TF 2.21 cannot bind one address): hence the namespace
    assert sorted(a.rsplit(":", 1)[0] for a in inside) == ["::", "::"], inside
