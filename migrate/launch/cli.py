"""``dpmigrate launch``: run a training script on N processes per node, one command for every framework.

    dpmigrate launch -n N [--nnodes M --node-rank R --master HOST:PORT --run-id ID [--iface NAME]
                     [--start-timeout S]] [--log-dir DIR] [--timeout S] [--framework F] [--dry-run] script.py ARGS...

Why: each framework has its own launcher with its own flags, defaults and pitfalls (a rendezvous
reachable from the network, every CPU rank using every core, a dead rank leaving the others hanging,
output of N ranks interleaved with no way to tell them apart). This module reads and checks the
request, picks the framework from the script's imports, asks that framework's backend for a plan (one
module each: :mod:`.torch`, :mod:`.paddle`) and hands it to the neutral supervisor (:mod:`.supervise`):

- the ranks get ``OMP_NUM_THREADS=1`` unless it is already set (N CPU ranks each using all cores
  thrash), ``PYTHONUNBUFFERED=1``, ``DPMIGRATE_TIMEOUT=S`` with ``--timeout`` (the runtime's
  collective timeout, in seconds) and ``DPMIGRATE_DIAGNOSIS_DIR`` (where the runtime records which
  peers it found lost: :mod:`.diagnosis`);
- several nodes: the ranks use the interface that routes to the master (:mod:`.network`; ``--iface``
  overrides), and a node gives up, naming who never came, if the nodes have not all met within
  ``--start-timeout`` (default 60 s); every process gets the bind guard (:mod:`.bind_guard`), so a server
  that binds every interface (Paddle's TCPStore, TF's gRPC) listens on the chosen address only
  (``--no-bind-guard`` turns it off);
- node 0 of a job with ``--master`` serves the rendezvous store on the master port: if that port is
  in use on this machine, one line says so and names a free one (exit 2), before anything starts;
- each rank's output is streamed live as ``[rank<i>] ...`` and kept in ``DIR/rank<i>.log`` (default
  ``DIR``: ``./dpmigrate-logs/<timestamp>``, created readable by this user only);
- the exit code and the final line: :mod:`.report`; Ctrl-C / SIGTERM stops every rank (exit 130 / 143);
  ``--dry-run`` prints the commands and their environments instead, and creates nothing.

Exit code 2: bad arguments, missing script, or a framework ``dpmigrate launch`` does not run yet.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import os
import re
import secrets
import shlex
import sys
import time
from pathlib import Path

from ..frameworks import FRAMEWORK_OF_PACKAGE
from ..local.modules import Reader, own_frameworks
from . import bind_guard, diagnosis, master_port, network, report, supervise
from . import paddle as paddle_backend
from . import tensorflow as tensorflow_backend
from . import torch as torch_backend
from .backend import Backend, Job, Plan, Process
from .processes import make_private_dirs

BACKENDS: dict[str, Backend] = {"torch": torch_backend, "paddle": paddle_backend, "tensorflow": tensorflow_backend}

NOT_YET_SUPPORTED: dict[str, str] = {}

# Top-level package -> framework. dpmigrate.runtime.<framework> (a converted script) decides first.
_FRAMEWORK_OF_PACKAGE = {**FRAMEWORK_OF_PACKAGE, "lightning": "torch", "pytorch_lightning": "torch"}
_FRAMEWORKS = ("torch", "tensorflow", "paddle")
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{16,128}")
_MAKE_RUN_ID = "--run-id $(python3 -c 'import secrets; print(secrets.token_hex(16))')"


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
    if job.network is not None and not args.no_bind_guard:
        plan = bind_guard.requested(plan, job.network.local_ip)
    if args.dry_run:
        print(describe(plan, job, framework))
        return 0
    guarded = bind_guard.wanted(plan)
    try:
        with bind_guard.prepared(plan) as plan:
            if guarded:
                print(bind_guard.describe(job.network.local_ip), file=sys.stderr, flush=True)
            outcome = supervise.run(plan, job, backend)
    except bind_guard.Unavailable as e:
        print(f"dpmigrate launch: error: {e}; or pass --no-bind-guard to let those servers listen on every "
              "interface (see the README on what to firewall)", file=sys.stderr)
        return 2
    code, line = report.final_line(outcome, job, plan.launcher.name if plan.launcher else None)
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
    p.add_argument("--run-id", metavar="ID", help="with --nnodes > 1: the same secret on every node, e.g. "
                   "from secrets.token_hex(16) (the keys the nodes exchange at the master are named after it)")
    p.add_argument("--iface", metavar="NAME", help="with --nnodes > 1: the network interface the ranks use "
                   "(default: the one holding this node's address towards the master)")
    p.add_argument("--start-timeout", type=float, default=60.0, metavar="S", help="with --nnodes > 1: exit "
                   "(naming the nodes that never came) if the nodes have not all met at the master within S "
                   "seconds (default 60)")
    p.add_argument("--hosts", metavar="H0,H1,...", help="with --nnodes > 1, TensorFlow, optional: every node's "
                   "address, node 0 first, for TF_CONFIG (by default the workers meet at --master and say it there)")
    p.add_argument("--no-bind-guard", action="store_true", help="with --nnodes > 1: do not preload the bind guard; "
                   "Paddle's TCPStore and TensorFlow's gRPC servers then listen on every interface")
    p.add_argument("--log-dir", metavar="DIR", help="where rank<i>.log go (default ./dpmigrate-logs/<timestamp>)")
    p.add_argument("--timeout", type=float, metavar="S", help="collective timeout in seconds (DPMIGRATE_TIMEOUT)")
    p.add_argument("--framework", choices=("auto", *_FRAMEWORKS), default="auto",
                   help="skip detection from the script's imports")
    p.add_argument("--dry-run", action="store_true", help="print the commands and environments, run nothing")
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
    if master is not None and node_rank == 0 and not args.dry_run:
        busy = master_port.in_use_message(args.master, *master)
        if busy:
            raise UsageError(busy)
    if not args.start_timeout > 0:
        raise UsageError(f"--start-timeout {args.start_timeout:g}: give the seconds the nodes have to meet, "
                         "e.g. --start-timeout 60")
    run_id = _run_id(args.run_id, nnodes)
    chosen = _network(args, master) if master is not None and nnodes > 1 else None
    hosts = tuple(h.strip() for h in (args.hosts or "").split(",") if h.strip())
    if hosts and len(hosts) != nnodes:
        raise UsageError(f"--hosts {args.hosts!r} lists {len(hosts)} host(s) for --nnodes {nnodes}: one per node, "
                         "node 0 first")
    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"{args.script}: no such script (looked in {Path.cwd()})")
    log_dir = Path(args.log_dir if args.log_dir else f"dpmigrate-logs/{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    return Job(nproc_per_node=n, nnodes=nnodes, node_rank=node_rank, master=master, script=script,
               script_args=tuple(args.script_args), log_dir=log_dir, timeout_s=args.timeout,
               run_id=run_id, start_timeout_s=args.start_timeout, network=chosen, hosts=hosts)


def _network(args: argparse.Namespace, master: tuple[str, int]) -> network.Network | None:
    """This node's address and interface towards the master (:mod:`.network`), said on one line.

    ``--dry-run`` may be run away from the cluster: then a master it cannot reach is said, not refused."""
    try:
        chosen = network.choose(*master, iface=args.iface, environ=os.environ)
    except network.NetworkError as e:
        if not args.dry_run:
            raise UsageError(str(e)) from None
        print(f"dpmigrate launch: network: not chosen ({e})", file=sys.stderr, flush=True)
        return None
    print(chosen.describe(args.master), file=sys.stderr, flush=True)
    return chosen


def _run_id(given: str | None, nnodes: int) -> str:
    """The job's run id: given (the same on every node) for several nodes, else a fresh random one.

    On several nodes the master's store listens on the network; its keys are named after the run id, so
    the id must be a secret shared by the nodes, never a default anyone could guess."""
    if given is None:
        if nnodes > 1:
            raise UsageError(f"--nnodes {nnodes} needs --run-id ID, the same secret on every node, e.g. "
                             f"{_MAKE_RUN_ID} once, passed to every node")
        return secrets.token_hex(16)
    if not _RUN_ID.fullmatch(given):
        raise UsageError(f"--run-id {given!r}: give 16 to 128 letters, digits, '-' or '_', random, e.g. "
                         f"{_MAKE_RUN_ID}")
    return given


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
    """Create the log dir (and missing parents) readable by this user only (0700); the default
    (timestamped) one gets a ``-2``... suffix if it exists already."""
    try:
        if not unique:
            make_private_dirs(path)
            return path
        make_private_dirs(path.parent)
        for i in range(1, 1000):
            candidate = path if i == 1 else path.with_name(f"{path.name}-{i}")
            try:
                candidate.mkdir(mode=0o700)  # exclusive: two jobs started in the same second get two dirs
            except FileExistsError:
                continue
            os.chmod(candidate, 0o700)  # mkdir's mode is filtered by the umask
            return candidate
    except OSError as e:
        raise UsageError(f"--log-dir {path}: cannot create it ({e.strerror or e})") from None
    raise UsageError(f"{path.parent}: too many log directories named {path.name}-*; pass --log-dir")


def detect_framework(script: Path) -> str:
    """The framework a script trains with, from its imports (any scope, not executed); a script that imports
    none itself trains with those of the local modules it imports (``import setup_mod``, where setup_mod.py
    imports tensorflow), found as ``dpmigrate`` finds them (:mod:`dpmigrate.local.modules`)."""
    try:
        tree = ast.parse(script.read_bytes(), filename=str(script))
    except FileNotFoundError:
        raise UsageError(f"{script}: no such script (looked in {Path.cwd()})") from None
    except (SyntaxError, ValueError) as e:
        where = f"{script}:{e.lineno}" if isinstance(e, SyntaxError) else str(script)
        raise UsageError(f"{where}: cannot read the script's imports ({e.__class__.__name__}: {e}); "
                         "fix it, or pass --framework torch|tensorflow|paddle") from None
    found = own_frameworks(tree, _FRAMEWORK_OF_PACKAGE)
    through = ""
    if not found:
        reader = Reader(_FRAMEWORK_OF_PACKAGE)
        modules = {name: reader.frameworks(file) for name, files in reader.imports(str(script), tree).items()
                   for file in files}
        found = {f for frameworks in modules.values() for f in frameworks}
        through = f" (through {', '.join(sorted(n for n, f in modules.items() if f))})"
    if len(found) == 1:
        return found.pop()
    if not found:
        raise UsageError(f"{script} imports none of torch, tensorflow, paddle, nor does any local module it imports; "
                         "if it trains with one through another module, pass --framework torch|tensorflow|paddle")
    both = " and ".join(sorted(found))
    raise UsageError(f"{script} imports {both}{through}; pass --framework with the one it trains with")


def _backend(framework: str, script: Path) -> Backend:
    if framework in NOT_YET_SUPPORTED:
        raise UsageError(f"{script} uses {framework}, which is not yet supported by dpmigrate launch; "
                         f"use: {NOT_YET_SUPPORTED[framework]}")
    backend = BACKENDS[framework]
    problem = backend.unavailable()
    if problem:
        raise UsageError(problem)
    return backend


def with_common_env(plan: Plan, job: Job) -> Plan:
    """Add what every rank (or launcher) of every framework gets; the backend's own variables win."""
    env = {"PYTHONUNBUFFERED": "1", diagnosis.VARIABLE: str(job.diagnosis_dir)}
    if "PYTHONHASHSEED" not in os.environ:  # one per job, the same on every node: sets of strings iterate alike
        env["PYTHONHASHSEED"] = str(hash_seed(job.run_id))
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"
    if job.timeout_s is not None:
        env["DPMIGRATE_TIMEOUT"] = f"{job.timeout_s:g}"
    processes = tuple(p if p.role == "service" else dataclasses.replace(p, env={**env, **p.env})
                      for p in plan.processes)
    return dataclasses.replace(plan, processes=processes)


def hash_seed(run_id: str) -> int:
    """The job's PYTHONHASHSEED, from its run id (random for one node, the nodes' shared secret for several):
    unset, each rank would hash strings its own way, and a vocabulary built from ``list(set(words))`` numbered
    the words differently on each rank (issue 19 audit round I). A digest, so the seed tells nothing of the id."""
    return int.from_bytes(hashlib.sha256(b"PYTHONHASHSEED " + run_id.encode()).digest()[:4], "big")


def describe(plan: Plan, job: Job, framework: str) -> str:
    """The ``--dry-run`` output: a comment, then per process a comment and one shell line (env + command)."""
    ranks = f"ranks {job.ranks[0]}-{job.ranks[-1]}" if len(job.ranks) > 1 else f"rank {job.ranks[0]}"
    lines = [f"# dpmigrate launch: {framework}, {ranks} of {job.nproc_per_node * job.nnodes} on node "
             f"{job.node_rank} of {job.nnodes}; logs in {job.log_dir}"]
    for process in plan.processes:
        role = _ROLES[process.role] if not process.listens else _ROLES[process.role] + ", started on first use"
        lines += [f"# {process.name} ({role})", _shell_line(process)]
    return "\n".join(lines)


_ROLES = {"rank": "a rank", "launcher": "starts this node's ranks",
          "service": "serves the ranks on 127.0.0.1 while they run"}


def _shell_line(process: Process) -> str:
    return shlex.join(["env", *(f"{k}={v}" for k, v in process.env.items()), *process.argv])
