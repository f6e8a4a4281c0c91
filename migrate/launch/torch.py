"""The torch backend of ``dpmigrate launch``: the torchrun command for a job, and reading torchrun's output.

``sys.executable -m torch.distributed.run`` (torchrun) starts and watches the ranks. The flags, for the
torch 2.13 ``run.py`` this project pins:

One node, no ``--master``: ``--standalone --local-addr 127.0.0.1``
    ``--standalone`` is c10d rendezvous on ``localhost:0``: the OS picks a free port when the store
    binds, so two jobs at once never clash and no port is guessed beforehand. ``--local-addr`` makes
    the address the ranks get (``MASTER_ADDR``) ``127.0.0.1`` instead of this host's FQDN, and gloo
    then listens on loopback only. torch's TCPStore has no bind-address option: its two store servers
    in the torchrun process listen on all interfaces, at those OS-chosen ports.
Several nodes (or ``--master`` given): ``--rdzv-backend static --nnodes M --node-rank R
    --master-addr HOST --master-port PORT``. Static rendezvous honours the node rank the user gave (c10d
    would assign its own) and needs nothing but the master's TCPStore. With ``--max-restarts 0`` nothing
    is elastic anyway. A rank failing on one node stops that node's ranks; the other nodes' ranks learn
    of it through the collective timeout (``--timeout``).
Always: ``--nproc-per-node N --max-restarts 0 --monitor-interval 0.1 --shutdown-timeout 10``
    A dead rank is noticed within 0.1 s and its peers get SIGTERM, then SIGKILL 10 s later.
Output: ``--log-dir <logs>/torchrun --tee 3`` and ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``
    torchrun redirects each rank's stdout and stderr to files and tails them to its own stdout and
    stderr, each line prefixed by this template (``[rank${rank}] `` gives ``[rank1] loss 0.3``, by
    global rank; torchrun's default would be ``[default1]:``, by local rank). ``dpmigrate launch``
    reads torchrun's output and files each prefixed line under its rank (``rank<i>.log``, both streams
    in one file; their relative order is that of torchrun's 0.1 s polling). torchrun's own per-rank
    files (split stdout/stderr, and ``error.json`` from scripts using ``@record``) stay in ``torchrun/``.

Failures are read from the ChildFailedError summary torchrun prints before it exits (its format is
tested against the pinned torch): each entry's ``rank`` and ``exitcode``, and which one is the "Root
Cause (first observed failure)".
"""

from __future__ import annotations

import importlib.util
import re
import sys

from .launch_job import Job, Plan, RankFailure

LAUNCHER = "torchrun"
PREFIX_TEMPLATE = "[rank${rank}] "
SHUTDOWN_TIMEOUT_S = 10
MONITOR_INTERVAL_S = 0.1

_RANK_PREFIX = re.compile(r"\[rank(\d+)\] ")
_ENTRY_RANK = re.compile(r"\s*rank\s*:\s*(\d+)\s*\(local_rank:")
_ENTRY_EXITCODE = re.compile(r"\s*exitcode\s*:\s*(-?\d+)")


def unavailable() -> str | None:
    """Why torchrun cannot run here, or None. Finds torch without importing it."""
    if importlib.util.find_spec("torch") is None:
        return (f"torch is not installed for {sys.executable}; install it (pip install 'dpmigrate[torch]') "
                "or run dpmigrate from the environment the script trains in")
    return None


def plan(job: Job) -> Plan:
    argv = [sys.executable, "-m", "torch.distributed.run"]
    if job.master is None:
        argv += ["--standalone", "--local-addr", "127.0.0.1"]
    else:
        host, port = job.master
        argv += ["--rdzv-backend", "static", "--nnodes", str(job.nnodes), "--node-rank", str(job.node_rank),
                 "--master-addr", host, "--master-port", str(port)]
    argv += [
        "--nproc-per-node", str(job.nproc_per_node), "--max-restarts", "0",
        "--monitor-interval", str(MONITOR_INTERVAL_S), "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S),
        "--log-dir", str(job.log_dir / "torchrun"), "--tee", "3",
        str(job.script), *job.script_args,
    ]
    env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": PREFIX_TEMPLATE}
    return Plan(argv=tuple(argv), env=env, grace_s=SHUTDOWN_TIMEOUT_S + 5)


def split_rank(line: str) -> tuple[int | None, str]:
    """``"[rank1] loss 0.3\\n"`` -> ``(1, "loss 0.3\\n")``; torchrun's own lines -> ``(None, line)``."""
    match = _RANK_PREFIX.match(line)
    if match is None:
        return None, line
    return int(match.group(1)), line[match.end():]


def trim_traceback(held: list[str]) -> list[str]:
    """Of torchrun's final traceback, keep what helps: the failure summary, not torchrun's own frames.

    ChildFailedError: only the summary block after the exception line (our final line names the rank).
    SignalException (we forwarded a signal): nothing. Anything else is a torchrun problem: all of it.
    """
    for i, line in enumerate(held):
        if "ChildFailedError:" in line:
            return held[i + 1:]
        if "SignalException:" in line:
            return []
    return held


def parse_failures(lines: list[str]) -> list[RankFailure]:
    """The ranks and exit codes of torchrun's ChildFailedError summary, root cause marked."""
    failures: list[RankFailure] = []
    in_root, rank = False, None
    for line in lines:
        if line.startswith("Root Cause"):
            in_root = True
        elif line.startswith("Failures:"):
            in_root = False
        elif (match := _ENTRY_RANK.match(line)) is not None:
            rank = int(match.group(1))
        elif rank is not None and (match := _ENTRY_EXITCODE.match(line)) is not None:
            failures.append(RankFailure(rank, int(match.group(1)), root_cause=in_root))
            rank = None
    return failures
