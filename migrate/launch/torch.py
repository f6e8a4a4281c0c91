"""The torch backend of ``dpmigrate launch``: which processes a job needs, for the torch 2.13 this project pins.

One node (no ``--master``): no torchrun, and nothing listens off 127.0.0.1.
    torchrun ``--standalone`` runs its agent's TCPStore on every interface, and that agent unpickles
    what a client stores under its rendezvous key: anyone who can reach the machine could run code in
    the job (torch's TCPStore has no bind-address option). So the supervisor starts the N ranks itself,
    ``sys.executable SCRIPT ARGS``, each with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, GROUP_RANK=0, GROUP_WORLD_SIZE=1) and two ways to meet:
    - ``DPMIGRATE_RENDEZVOUS``: a FileStore file, created empty and private in the private log dir; the
      runtime (``dpmigrate.runtime.torch``) starts its process group with ``file://`` on it: no socket.
    - ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` and ``TORCHELASTIC_USE_AGENT_STORE=True``, for scripts
      that call ``init_process_group()`` themselves (env://, hand-written DDP, Lightning): every rank is
      a client of the TCPStore that :mod:`.torch_store` serves on a socket the supervisor bound to
      127.0.0.1 (no rank starts a store of its own, which would listen on every interface). The store
      starts when a rank first connects, so converted scripts do not pay for its ``import torch``.
    ``GLOO_SOCKET_IFNAME=lo`` (and ``NCCL_SOCKET_IFNAME=lo``) make the collectives listen on loopback.
    The supervisor knows each rank's exit status directly and stops the others when one fails.
Several nodes (or ``--master`` given): torchrun, started as ``python -m dpmigrate.launch.torch_rendezvous``
    (torchrun's own ``main`` with dpmigrate's static rendezvous registered: :mod:`.torch_rendezvous`),
    ``--rdzv-backend dpmigrate-static --rdzv-id RUN_ID --nnodes M --rdzv-endpoint HOST:PORT --rdzv-conf
    rank=R,bind=IP,start_timeout=S,nproc=N --local-addr IP``. Static rendezvous honours the node rank
    the user gave (c10d would assign its own) and needs nothing but the master's TCPStore, which node 0
    serves on the master address only (torch's own ``static`` backend listens on every interface); the
    run id (the same on every node, unguessable) is the prefix of the keys the agents exchange there. A
    node gives up, naming who never came, ``--start-timeout`` seconds after it started. The ranks get
    ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` = the interface that routes to the master
    (:mod:`.network`; ``--iface`` overrides, the user's own setting is kept): gloo's default, the host
    name's address, is a loopback address on many hosts, which no other node can reach.
    Plus ``--nproc-per-node N --max-restarts 0 --monitor-interval 0.1 --shutdown-timeout 5``: a dead
    rank is noticed within 0.1 s and its peers get SIGTERM. torchrun then waits a fixed 30 s before
    SIGKILL (``--shutdown-timeout`` applies only when torchrun itself is signalled; no flag shortens the
    wait after a rank failed), so the supervisor kills the peers' process groups itself after
    ``PEER_GRACE_S``. Each rank runs under :mod:`.rank_status`, which records its pid and its exact
    exit status for that and for the failure report (torchrun's own summary is text, not an interface).
    Output: ``--log-dir <logs>/torchrun --tee 3`` and ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``:
    torchrun tails each rank's output to its own, each line prefixed ``[rank<i>] `` (by global rank),
    and the supervisor files those lines under their rank.
"""

from __future__ import annotations

import importlib.util
import re
import sys

from . import torch_rendezvous
from .backend import LOOPBACK_PORT, Job, Plan, Process

PREFIX_TEMPLATE = "[rank${rank}] "
ONE_NODE_GRACE_S = 5
PEER_GRACE_S = 3  # after a rank failed, its peers' time to stop on SIGTERM before they are killed
SHUTDOWN_TIMEOUT_S = 5  # torchrun's, when it is signalled (Ctrl-C): it forwards the signal, then kills
MONITOR_INTERVAL_S = 0.1
LOOPBACK_INTERFACE = "lo0" if sys.platform == "darwin" else "lo"

_RANK_PREFIX = re.compile(r"\[rank(\d+)\] ")
_PORT_IN_USE = re.compile(r"failed to listen on any local network address\. port: (\d+).*EADDRINUSE")


def unavailable() -> str | None:
    """Why torch jobs cannot run here, or None. Finds torch without importing it."""
    if importlib.util.find_spec("torch") is None:
        return (f"torch is not installed for {sys.executable}; install it (pip install 'dpmigrate[torch]') "
                "or run dpmigrate from the environment the script trains in")
    return None


def plan(job: Job) -> Plan:
    return _one_node(job) if job.master is None else _torchrun(job)


def rendezvous_file(job: Job):
    """The one-node FileStore: in the private log dir, named after the run so a reused dir never clashes."""
    return job.log_dir / f"rendezvous-{job.run_id}"


def _one_node(job: Job) -> Plan:
    n, store_file = job.nproc_per_node, rendezvous_file(job)
    shared = {
        "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
        "DPMIGRATE_RENDEZVOUS": str(store_file),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": LOOPBACK_PORT, "TORCHELASTIC_USE_AGENT_STORE": "True",
        "GLOO_SOCKET_IFNAME": LOOPBACK_INTERFACE, "NCCL_SOCKET_IFNAME": LOOPBACK_INTERFACE,
    }
    store = Process("store", (sys.executable, "-m", "dpmigrate.launch.torch_store"), {}, "service", listens=True)
    ranks = tuple(
        Process(f"rank{r}", (sys.executable, str(job.script), *job.script_args),
                {"RANK": str(r), "LOCAL_RANK": str(r), **shared}, "rank", rank=r)
        for r in job.ranks
    )
    return Plan(processes=(store, *ranks), grace_s=ONE_NODE_GRACE_S, peer_grace_s=PEER_GRACE_S,
                private_files=(store_file,))


def _torchrun(job: Job) -> Plan:
    host, port = job.master
    status_dir = job.log_dir / "rank-status"
    network = job.network
    bind = network.master_ip if network else host  # node 0's store: on the master address only
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    conf = f"rank={job.node_rank},bind={bind},start_timeout={job.start_timeout_s:g},nproc={job.nproc_per_node}"
    local_addr = ("--local-addr", network.local_ip) if network else ()
    argv = (
        sys.executable, "-m", "dpmigrate.launch.torch_rendezvous",
        "--rdzv-backend", torch_rendezvous.BACKEND_NAME, "--rdzv-id", job.run_id, "--nnodes", str(job.nnodes),
        "--rdzv-endpoint", endpoint, "--rdzv-conf", conf, *local_addr,
        "--nproc-per-node", str(job.nproc_per_node), "--max-restarts", "0",
        "--monitor-interval", str(MONITOR_INTERVAL_S), "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S),
        "--log-dir", str(job.log_dir / "torchrun"), "--tee", "3",
        "--module", "dpmigrate.launch.rank_status", str(status_dir), str(job.script), *job.script_args,
    )
    env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": PREFIX_TEMPLATE, **(network.env if network else {})}
    torchrun = Process("torchrun", argv, env, "launcher")
    return Plan(processes=(torchrun,), grace_s=SHUTDOWN_TIMEOUT_S + 5, peer_grace_s=PEER_GRACE_S,
                status_dir=status_dir, start_timeout_s=job.start_timeout_s,
                private_dirs=(job.log_dir / "torchrun",))


def split_rank(line: str) -> tuple[int | None, str]:
    """``"[rank1] loss 0.3\\n"`` -> ``(1, "loss 0.3\\n")``; torchrun's own lines -> ``(None, line)``.

    The prefix is ours (``PREFIX_TEMPLATE``), not a torchrun format."""
    match = _RANK_PREFIX.match(line)
    if match is None:
        return None, line
    return int(match.group(1)), line[match.end():]


def trim_traceback(held: list[str]) -> list[str]:
    """Of torchrun's final traceback, what helps: its failure summary, not its own frames.

    Display only (the failure report comes from the ranks' exit statuses): ChildFailedError: the
    summary block after the exception line; SignalException (we forwarded a signal): nothing; the
    store could not listen on the master port (taken after :mod:`.master_port` checked it): one line;
    anything else, or a format this does not recognise: all of it, so nothing is lost.
    """
    for line in held:
        busy = _PORT_IN_USE.search(line)
        if busy:
            return [f"dpmigrate launch: the --master port {busy.group(1)} is in use on this machine (torchrun's "
                    "store could not listen on it); pick a free port\n"]
    for i, line in enumerate(held):
        if "ChildFailedError:" in line:
            return held[i + 1:]
        if "SignalException:" in line:
            return []
    return held
