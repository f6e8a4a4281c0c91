"""The Paddle backend of ``dpmigrate launch``: ``python -m paddle.distributed.launch``, as Paddle 3.3.1 needs it.

Every job runs Paddle's own launcher (it sets the variables ``fleet.init`` reads: PADDLE_TRAINER_ID,
PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS, PADDLE_MASTER, PADDLE_DISTRI_BACKEND=gloo on a CPU build)
with ``--nproc_per_node N`` (``--devices 0,1`` fails on a CPU build) and ``--log_dir <logs>/paddle``
(inside the job's private log dir; Paddle also writes each rank's whole environment there), through
:mod:`.paddle_launcher`, which removes an empty ``CUDA_VISIBLE_DEVICES`` (Paddle's launcher dies on
it) and relays every rank's output. Each rank runs under :mod:`.paddle_rank`, which records its exit
status in ``Plan.status_dir`` (the failure report is built from those, never from Paddle's text) and
marks its output lines with its rank.

One node (no ``--master``): rank 0 serves Paddle's TCPStore on all interfaces (no bind option in
Paddle 3.3.1), so :mod:`.paddle_launcher` first moves the whole job into a private network namespace
whose only interface is loopback (``--isolate``); where the kernel forbids unprivileged namespaces it
says so in one line and runs the job without it.
Several nodes: ``--nnodes M --rank R --master IP:PORT --job_id RUN_ID --host LOCAL_IP``, no namespace. ``--host``
is the address this node advertises (Paddle's default, the host name's address, is often loopback): the one
that routes to the master (:mod:`.network`; ``--iface`` overrides); the ranks get ``GLOO_SOCKET_IFNAME``.
The relay serves the nodes' rendezvous on node 0 (on the master address only, where Paddle's own would
listen on every interface), gives up naming who never came after ``--start-timeout``, and stops a node
whose peers lost a rank: :mod:`.paddle_nodes`. Paddle's TCPStore (global rank 0) binds every interface
(Paddle 3.3.1 has no option to bind elsewhere); the bind guard (:mod:`.bind_guard`, preloaded by the
launcher) puts it on the master address only.
Output lines are ``[rank<i>] ...`` (the marks :mod:`.paddle_launcher` relays), filed under their rank.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys

from .backend import Job, Plan, Process

GRACE_S = 10  # Paddle's launcher gives its ranks up to 30 s after a signal; ours kills sooner
PEER_GRACE_S = 3  # after a rank failed, Paddle's launcher stops the others (3 s), then we kill what is left

_RANK_PREFIX = re.compile(r"\[rank(\d+)\] ")


def unavailable() -> str | None:
    """Why Paddle jobs cannot run here, or None. Finds paddle without importing it."""
    if importlib.util.find_spec("paddle") is None:
        return (f"paddle is not installed for {sys.executable}; install it (pip install 'dpmigrate[paddle]') "
                "or run dpmigrate from the environment the script trains in")
    return None


def paddle_log_dir(job: Job):
    """Where Paddle's launcher writes workerlog.<i>, envlog.<i> and backup_env.<i>.json (private)."""
    return job.log_dir / "paddle"


def plan(job: Job) -> Plan:
    logs, status_dir = paddle_log_dir(job), job.log_dir / "rank-status"
    paddle_args = ["--nproc_per_node", str(job.nproc_per_node), "--log_dir", str(logs)]
    shim = [sys.executable, "-m", "dpmigrate.launch.paddle_launcher"]
    env: dict[str, str] = {}
    if job.master is None:
        shim.append("--isolate")
    else:
        network = job.network
        host, port = job.master
        master_ip = network.master_ip if network else host  # Paddle compares it with its --host: an address
        endpoint = f"[{master_ip}]:{port}" if ":" in master_ip else f"{master_ip}:{port}"
        paddle_args += ["--nnodes", str(job.nnodes), "--rank", str(job.node_rank), "--master", endpoint,
                        "--job_id", job.run_id]
        if network is not None:
            paddle_args += ["--host", network.local_ip]  # the address this node's ranks advertise
            env.update(network.env)  # GLOO_SOCKET_IFNAME: gloo's own default is the host name's address
            env["NO_PROXY"] = env["no_proxy"] = _no_proxy(master_ip)  # Paddle's HTTP client honours proxies
        shim += ["--node", str(job.node_rank), "--nnodes", str(job.nnodes), "--nproc", str(job.nproc_per_node),
                 "--master", endpoint, *(["--serve"] if job.node_rank == 0 else []), "--run-id", job.run_id,
                 "--start-timeout", f"{job.start_timeout_s:g}", "--status-dir", str(status_dir)]
    argv = (
        *shim, str(logs), "--", sys.executable, "-m", "paddle.distributed.launch", *paddle_args,
        # Paddle runs a training script not ending in .py as a command: here, each rank's wrapper.
        sys.executable, "-m", "dpmigrate.launch.paddle_rank", str(status_dir), str(job.script), *job.script_args,
    )
    launcher = Process("paddle.distributed.launch", argv, env, "launcher")
    return Plan(processes=(launcher,), grace_s=GRACE_S, peer_grace_s=PEER_GRACE_S, status_dir=status_dir,
                private_dirs=(logs,), start_timeout_s=job.start_timeout_s if job.master is not None else None)


def _no_proxy(master_ip: str) -> str:
    """The user's NO_PROXY plus the master: Paddle's launcher reaches it with httpx, which uses HTTP proxies."""
    current = os.environ.get("NO_PROXY") or os.environ.get("no_proxy") or ""
    return ",".join(x for x in (current, master_ip) if x)


def split_rank(line: str) -> tuple[int | None, str]:
    """``"[rank1] loss 0.3\\n"`` -> ``(1, "loss 0.3\\n")``; Paddle's own lines -> ``(None, line)``."""
    match = _RANK_PREFIX.match(line)
    if match is None:
        return None, line
    return int(match.group(1)), line[match.end():]


def trim_traceback(held: list[str]) -> list[str]:
    """Paddle's launcher prints a traceback only when it crashes itself: show all of it."""
    return held
