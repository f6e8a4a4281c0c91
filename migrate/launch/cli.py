"""``dpmigrate launch``: run a training script on N processes per node, one command for every framework.

    dpmigrate launch -n N [--nnodes M --node-rank R --master HOST:PORT] [--log-dir DIR]
                     [--timeout S] [--framework F] [--dry-run] script.py ARGS...

Why: each framework has its own launcher with its own flags, defaults and pitfalls (a rendezvous on a
public interface, every CPU rank using every core, a dead rank leaving the others hanging, output of N
ranks interleaved with no way to tell them apart). This command picks the framework from the script's
imports and hands the job to a small backend launcher for it (``launch_torch``: torchrun, see there for
the exact flags); what is common to all of them is here and in ``launch_job``:

- the ranks get ``OMP_NUM_THREADS=1`` unless it is already set (N CPU ranks each using all cores
  thrash), ``PYTHONUNBUFFERED=1``, and ``DPMIGRATE_TIMEOUT=S`` with ``--timeout`` (the runtime's
  collective timeout, in seconds);
- each rank's output is streamed live as ``[rank<i>] ...`` and kept in ``DIR/rank<i>.log`` (default
  ``DIR``: ``./dpmigrate-logs/<timestamp>``); the launcher's own messages go to ``DIR/launcher.log``;
- the exit code is the job's: 0 when every rank succeeded, else the failed rank's exit code (128 +
  the signal number if a signal killed it), and one final line names the failed rank(s);
- Ctrl-C / SIGTERM stops every rank (exit 130 / 143); ``--dry-run`` prints the command instead.

Exit code 2: bad arguments, missing script, or a framework ``dpmigrate launch`` does not run yet.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from .frameworks import FRAMEWORK_OF_PACKAGE
from . import launch_job, launch_torch
from .launch_job import Job, Outcome, Plan, RankFailure

BACKENDS = {"torch": launch_torch}

NOT_YET_SUPPORTED = {
    "tensorflow": "start one process per worker yourself, each with its TF_CONFIG "
                  "(tf.distribute.MultiWorkerMirroredStrategy reads it)",
    "paddle": "python -m paddle.distributed.launch --nproc_per_node N script.py ARGS",
}

# Top-level package -> framework. dpmigrate.runtime.<framework> (a converted script) decides first.
_FRAMEWORK_OF_PACKAGE = {**FRAMEWORK_OF_PACKAGE, "lightning": "torch", "pytorch_lightning": "torch"}
_FRAMEWORKS = ("torch", "tensorflow", "paddle")


class UsageError(Exception):
    """A request ``dpmigrate launch`` refuses before starting anything (exit code 2)."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage error (or the help)
        return int(e.code or 0)
    try:
        job = _job(args)
        framework = args.framework if args.framework != "auto" else detect_framework(job.script)
        backend = _backend(framework, job.script)
        if not args.dry_run:
            job = dataclasses.replace(job, log_dir=_create_log_dir(job.log_dir, unique=args.log_dir is None))
    except UsageError as e:
        print(f"dpmigrate launch: error: {e}", file=sys.stderr)
        return 2
    plan = with_common_env(backend.plan(job), job)
    if args.dry_run:
        print(describe(plan, job, framework))
        return 0
    outcome = launch_job.run(plan, job, backend)
    code, line = final_line(outcome, job, backend.parse_failures(outcome.launcher_lines), backend.LAUNCHER)
    print(line, file=sys.stderr, flush=True)
    return code


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dpmigrate launch", description="Run a training script on N processes per node.",
        epilog="Everything after the script is passed to it unchanged.")
    p.add_argument("-n", "--nproc-per-node", type=int, required=True, metavar="N", help="processes on this node")
    p.add_argument("--nnodes", type=int, default=1, metavar="M", help="number of nodes (default 1)")
    p.add_argument("--node-rank", type=int, default=0, metavar="R", help="this node's rank, 0 to M-1")
    p.add_argument("--master", metavar="HOST:PORT", help="node 0's address; required with --nnodes > 1")
    p.add_argument("--log-dir", metavar="DIR", help="where rank<i>.log go (default ./dpmigrate-logs/<timestamp>)")
    p.add_argument("--timeout", type=float, metavar="S", help="collective timeout in seconds (DPMIGRATE_TIMEOUT)")
    p.add_argument("--framework", choices=("auto", *_FRAMEWORKS), default="auto",
                   help="skip detection from the script's imports")
    p.add_argument("--dry-run", action="store_true", help="print the command and environment, run nothing")
    p.add_argument("script", help="the training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS")
    return p


def _job(args: argparse.Namespace) -> Job:
    """The validated request; its log dir is not created yet (nothing is, before every check passed)."""
    n, nnodes, node_rank = args.nproc_per_node, args.nnodes, args.node_rank
    if n < 1:
        raise UsageError(f"-n {n}: give the number of processes per node, 1 or more")
    if nnodes < 1:
        raise UsageError(f"--nnodes {nnodes}: give the number of nodes, 1 or more")
    if not 0 <= node_rank < nnodes:
        raise UsageError(f"--node-rank {node_rank} with --nnodes {nnodes}: node ranks run from 0 to {nnodes - 1}")
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError(f"--timeout {args.timeout:g}: give the collective timeout in seconds, e.g. --timeout 300")
    master = parse_master(args.master) if args.master is not None else None
    if master is None and nnodes > 1:
        raise UsageError(f"--nnodes {nnodes} needs --master HOST:PORT, node 0's address and a free port on it "
                         "(the same on every node), e.g. --master node0:29500")
    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"{args.script}: no such script (looked in {Path.cwd()})")
    log_dir = Path(args.log_dir if args.log_dir else f"dpmigrate-logs/{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    return Job(nproc_per_node=n, nnodes=nnodes, node_rank=node_rank, master=master, script=script,
               script_args=tuple(args.script_args), log_dir=log_dir, timeout_s=args.timeout)


def parse_master(text: str) -> tuple[str, int]:
    """``"node0:29500"`` -> ``("node0", 29500)``; ``"[::1]:29500"`` -> ``("::1", 29500)``."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port or (":" in host and not text.startswith("[")):
        raise UsageError(f"--master {text!r}: give node 0's address and a port as HOST:PORT, e.g. --master "
                         "node0:29500 (an IPv6 address in brackets: [::1]:29500)")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--master {text!r}: port {port!r} is not a number from 1 to 65535")
    return host, int(port)


def _create_log_dir(path: Path, *, unique: bool) -> Path:
    """Create the log dir; the default (timestamped) one gets a ``-2``... suffix if it exists already."""
    if not unique:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--log-dir {path}: cannot create it ({e.strerror})") from None
        return path
    for i in range(1, 1000):
        candidate = path if i == 1 else path.with_name(f"{path.name}-{i}")
        try:
            candidate.mkdir(parents=True)  # exclusive: two jobs started in the same second get two dirs
            return candidate
        except FileExistsError:
            continue
    raise UsageError(f"{path.parent}: too many log directories named {path.name}-*; pass --log-dir")


def detect_framework(script: Path) -> str:
    """The framework a script trains with, from its imports (any scope, not executed)."""
    try:
        tree = ast.parse(script.read_bytes(), filename=str(script))
    except FileNotFoundError:
        raise UsageError(f"{script}: no such script (looked in {Path.cwd()})") from None
    except (SyntaxError, ValueError) as e:
        where = f"{script}:{e.lineno}" if isinstance(e, SyntaxError) else str(script)
        raise UsageError(f"{where}: cannot read the script's imports ({e.__class__.__name__}: {e}); "
                         "fix it, or pass --framework torch|tensorflow|paddle") from None
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:  # not `from . import x`
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["dpmigrate", "runtime"] and len(parts) > 2 and parts[2] in _FRAMEWORKS:
                return parts[2]  # a converted script says which runtime it uses
            if parts[0] in _FRAMEWORK_OF_PACKAGE:
                found.add(_FRAMEWORK_OF_PACKAGE[parts[0]])
    if len(found) == 1:
        return found.pop()
    if not found:
        raise UsageError(f"{script} imports none of torch, tensorflow, paddle; if it trains with one through "
                         "another module, pass --framework torch|tensorflow|paddle")
    both = " and ".join(sorted(found))
    raise UsageError(f"{script} imports {both}; pass --framework with the one it trains with")


def _backend(framework: str, script: Path):
    if framework in NOT_YET_SUPPORTED:
        raise UsageError(f"{script} uses {framework}, which is not yet supported by dpmigrate launch; "
                         f"use: {NOT_YET_SUPPORTED[framework]}")
    backend = BACKENDS[framework]
    problem = backend.unavailable()
    if problem:
        raise UsageError(problem)
    return backend


def with_common_env(plan: Plan, job: Job) -> Plan:
    """Add what every rank of every framework gets (the backend's own variables win)."""
    env = {"PYTHONUNBUFFERED": "1"}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"
    if job.timeout_s is not None:
        env["DPMIGRATE_TIMEOUT"] = f"{job.timeout_s:g}"
    return dataclasses.replace(plan, env={**env, **plan.env})


def describe(plan: Plan, job: Job, framework: str) -> str:
    """The ``--dry-run`` output: a comment, then one shell line with the environment and the command."""
    ranks = f"ranks {job.ranks[0]}-{job.ranks[-1]}" if len(job.ranks) > 1 else f"rank {job.ranks[0]}"
    header = (f"# dpmigrate launch: {framework}, {ranks} of {job.nproc_per_node * job.nnodes} on node "
              f"{job.node_rank} of {job.nnodes}; logs in {job.log_dir}")
    return header + "\n" + shlex.join(["env", *(f"{k}={v}" for k, v in plan.env.items()), *plan.argv])


def final_line(outcome: Outcome, job: Job, failures: list[RankFailure], launcher: str) -> tuple[int, str]:
    """The job's exit code and the one line that says how it ended."""
    logs = f"Logs: {job.log_dir}"
    if outcome.interrupted is not None:
        name = signal.Signals(outcome.interrupted).name
        return 128 + outcome.interrupted, f"dpmigrate launch: {name} received; all ranks were stopped. {logs}"
    if outcome.returncode == 0:
        ranks = f"all {len(job.ranks)} ranks" if len(job.ranks) > 1 else f"rank {job.ranks[0]}"
        where = " on this node" if job.nnodes > 1 else ""
        return 0, f"dpmigrate launch: {ranks}{where} finished. {logs}"
    culprits = failed_ranks(failures)
    if not culprits:
        status = RankFailure(-1, outcome.returncode)
        return status.job_exit_code, (f"dpmigrate launch: {launcher} failed ({status.describe()}) without naming "
                                      f"a failed rank; see its messages above. {logs}")
    named = ", ".join(f"rank {f.rank} failed ({f.describe()})" for f in culprits)
    others = "" if len(culprits) >= len(job.ranks) else (
        "; the other ranks were stopped" if job.nnodes == 1 else "; the other ranks on this node were stopped")
    return culprits[0].job_exit_code, f"dpmigrate launch: {named}{others}. {logs}"


def failed_ranks(failures: list[RankFailure]) -> list[RankFailure]:
    """The ranks that failed by themselves, most telling first.

    Ranks the launcher stopped with SIGTERM are left out (unless one is the root cause). A rank killed
    by a signal comes first: a peer's crash makes a rank raise (exit code 1), never die of a signal,
    while the launcher's "first observed" is only the first it happened to poll.
    """
    seen: dict[int, RankFailure] = {}
    for f in failures:
        if (f.root_cause or f.exitcode != -signal.SIGTERM) and f.rank not in seen:
            seen[f.rank] = f
    return sorted(seen.values(), key=lambda f: (f.signal_name is None, not f.root_cause, f.rank))


if __name__ == "__main__":
    sys.exit(main())
