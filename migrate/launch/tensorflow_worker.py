"""Start one TensorFlow worker of a one-node ``dpmigrate launch`` job: in the job's private network, with its TF_CONFIG.

    python -m dpmigrate.launch.tensorflow_worker JOB_FILE RANK NPROC SCRIPT ARGS...
    python -m dpmigrate.launch.tensorflow_worker - RANK NPROC SCRIPT ARGS...   (several nodes: TF_CONFIG given)
    python -m dpmigrate.launch.tensorflow_worker meet RANK NPROC SCRIPT ARGS... (several nodes, --master alone:
        the workers meet at the master, see :mod:`.tensorflow_nodes`; details in DPMIGRATE_TF_MEET)

Why: a TensorFlow worker's gRPC server listens on ``[::]:<its port>``, every interface (TF 2.21's
``grpc_server_lib`` hard-codes the wildcard; ``ServerDef`` has a port and no address), and has no
authentication. On one node nothing should be reachable from the network, so the workers share a
network namespace of their own whose only interface is loopback:

- rank 0 enters a new user + network namespace (:func:`.private_network.isolate_network`, no privilege
  needed where unprivileged user namespaces are allowed), has the OS pick a free port per worker there
  (bound on 127.0.0.1, then released: nothing else runs in that namespace, so they stay free), and
  writes ``{"pid", "isolated", "ports"}`` to ``JOB_FILE`` (created empty and private by the supervisor);
- every other rank waits for that file (up to ``DPMIGRATE_START_TIMEOUT``), joins rank 0's namespaces
  (``setns`` on ``/proc/<pid>/ns/user`` and ``.../net``);
- each then sets ``TF_CONFIG`` (all workers on 127.0.0.1 at those ports, ``task.index`` = its rank) and
  replaces itself with ``python SCRIPT ARGS`` (``execv``: same pid, so the supervisor sees the script's
  own exit status and its signals reach the script).

Where the kernel refuses namespaces, one line says so and the ports are picked on the host's loopback
(then the workers' servers are reachable on every interface while the job runs). Standard library only.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
import time
from pathlib import Path

from . import tensorflow_nodes
from .private_network import CLONE_NEWNET, CLONE_NEWUSER, enter_private_network

POLL_S = 0.05


def _free_loopback_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _write_job_file(path: Path, content: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(content) + "\n")  # the newline marks it complete
        f.flush()
        os.fsync(f.fileno())


def _read_job_file(path: Path, timeout_s: float, rank: int) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            text = path.read_text()
        except OSError:
            text = ""
        if text.endswith("\n"):
            return json.loads(text)
        if time.monotonic() > deadline:
            raise SystemExit(f"dpmigrate launch: rank {rank} waited {timeout_s:g} s for rank 0 to set up the job's "
                             "network and it never did (rank 0 never came up); see rank 0's output")
        time.sleep(POLL_S)


def _join(pid: int, rank: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, flag in (("user", CLONE_NEWUSER), ("net", CLONE_NEWNET)):
        try:
            fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
        except OSError as e:
            raise SystemExit(f"dpmigrate launch: rank {rank} cannot join rank 0's network ({e}); rank 0 (pid {pid}) "
                             "has ended, see its output") from None
        try:
            if libc.setns(fd, flag) != 0:
                raise SystemExit(f"dpmigrate launch: rank {rank} cannot join rank 0's {kind} namespace: "
                                 f"{os.strerror(ctypes.get_errno())}")
        finally:
            os.close(fd)


def _say_exposure(rank: int) -> None:
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    me = config.get("cluster", {}).get("worker", [])[rank] if config else "?"
    print(f"dpmigrate launch: worker {rank}'s TensorFlow gRPC server listens on every interface at the port of {me} "
          "(TensorFlow 2.21 cannot bind one address) and has no authentication: run the nodes on a trusted network "
          "and firewall the workers' ports from everything else (--no-bind-guard was given)", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print("usage: python -m dpmigrate.launch.tensorflow_worker JOB_FILE RANK NPROC SCRIPT ARGS... "
              "(run by dpmigrate launch)", file=sys.stderr)
        return 2
    job_file, rank, nproc, command = Path(argv[0]), int(argv[1]), int(argv[2]), argv[3:]
    timeout_s = float(os.environ.get("DPMIGRATE_START_TIMEOUT") or 60)
    if str(job_file) == "meet":  # several nodes, --master alone: the workers meet at the master's rendezvous
        workers = tensorflow_nodes.cluster(json.loads(os.environ.pop(tensorflow_nodes.VARIABLE)), rank, timeout_s)
        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
        job_file = Path("-")
    if str(job_file) == "-":  # several nodes: TF_CONFIG is given; without the bind guard, say what listens where
        if not os.environ.get("DPMIGRATE_BIND_ADDRESS"):
            _say_exposure(rank)
        os.execv(sys.executable, [sys.executable, *command])
    if rank == 0:
        isolated = enter_private_network(
            "the TensorFlow workers' gRPC servers listen on all interfaces at their ports while the job runs "
            "(TensorFlow has no option to bind them to 127.0.0.1)"
        )
        if isolated is False:
            return 1
        job = {"pid": os.getpid(), "isolated": bool(isolated), "ports": _free_loopback_ports(nproc)}
        _write_job_file(job_file, job)
    else:
        job = _read_job_file(job_file, timeout_s, rank)
        if job["isolated"]:
            _join(int(job["pid"]), rank)
    workers = [f"127.0.0.1:{port}" for port in job["ports"]]
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *command])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
