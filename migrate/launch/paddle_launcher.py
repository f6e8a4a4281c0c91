"""Run ``python -m paddle.distributed.launch`` for ``dpmigrate launch``: isolated, every rank's output relayed.

    python -m dpmigrate.launch.paddle_launcher [--isolate | --node R ...] WORKER_LOG_DIR -- python -m paddle.distributed.launch

Why a process between the supervisor and Paddle's launcher (Paddle 3.3.1, measured here):

- Output. Paddle's launcher writes each rank's output to ``WORKER_LOG_DIR/workerlog.<local rank>`` and
  echoes only local rank 0's to its stdout (and, when a rank fails, the last 3000 bytes of its log). Each
  rank runs under :mod:`.paddle_rank`, which marks its lines ``[rank<i>] `` (``[rank<i>]! `` for stderr);
  this process follows every ``workerlog.*`` from where it ended before the job, relays each marked line
  once (stdout, or stderr for ``!``, as ``[rank<i>] <line>``), and drops the marked lines of Paddle's
  echo, which are copies. Paddle's own lines pass through unchanged.
- ``CUDA_VISIBLE_DEVICES=""``: Paddle's launcher dies on it (IndexError in ``_build_pod_with_master``);
  an empty value is removed (no GPU was visible either way).
- Network (``--isolate``, one node): rank 0 serves Paddle's TCPStore on ``0.0.0.0`` at the port of
  ``PADDLE_MASTER`` (``LibUVTCPServer::createServer`` binds ``0.0.0.0`` or ``::``; there is no option to
  bind elsewhere), reachable from the network. So before it starts anything this process moves into a
  new user and network namespace of its own (``unshare(CLONE_NEWUSER | CLONE_NEWNET)``, the same uid
  and gid mapped, no privilege needed where unprivileged user namespaces are enabled) and brings up its
  loopback interface: the job's sockets, whatever address they bind, exist only there, unreachable from
  the host's interfaces and from other jobs. Where the kernel refuses, one line says so and the job runs
  without that isolation.
- Several nodes (``--node R ... [--serve]``): :mod:`.paddle_nodes`: node 0 serves the nodes' rendezvous at the
  master address only (before Paddle's launcher, which then joins it instead of serving its own on every
  interface); every node gives up after ``--start-timeout`` naming who never came, and stops its job when
  a rank of another node failed (Paddle's launcher stops its ranks; what is left after ``STOP_GRACE_S`` is
  killed); then it exits 1.
It exits as Paddle's launcher did (same code, or killed by the same signal); the supervisor's stop
signals reach both (same process group), so this process only waits for the launcher to finish.
Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import paddle_nodes
from .private_network import enter_private_network
from .processes import descendants, die_with_parent_hook, signal_group
from .rank_status import STOP_SIGNALS, _exit_like

POLL_S = 0.1
STOP_GRACE_S = 5.0  # several nodes: Paddle's launcher's time to stop its ranks when we stop the job
_MARKED = re.compile(rb"^\[rank(\d+)\](!?) ")


class _Follower:
    """Follows ``workerlog.*`` files and relays their marked lines, each once."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.offsets = {path: path.stat().st_size for path in folder.glob("workerlog.*")}  # an earlier run's
        self.partial: dict[Path, bytes] = {}

    def poll(self, final: bool = False) -> None:
        for path in sorted(self.folder.glob("workerlog.*")):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            self.offsets[path] = self.offsets.get(path, 0) + len(data)
            text = self.partial.pop(path, b"") + data
            lines = text.split(b"\n")
            rest = lines.pop()
            if rest and final:
                lines.append(rest)
            elif rest:
                self.partial[path] = rest
            for line in lines:
                _relay_rank_line(line + b"\n")


def _relay_rank_line(line: bytes) -> None:
    match = _MARKED.match(line)
    if match is None:  # a line the rank's wrapper did not write (Paddle's own, in the rank's log): keep it
        out = sys.stdout.buffer
    else:
        out = sys.stderr.buffer if match.group(2) else sys.stdout.buffer
        tag = b"[rank" + match.group(1) + b"] "
        line = tag + line[match.end():].replace(match.group(0), tag)  # also the marks after each "\r"
    out.write(line)
    out.flush()


def _pass_through(pipe, out) -> None:
    """Paddle's launcher's own lines; its echo of a rank's log (marked lines) is a copy and is dropped."""
    for raw in iter(pipe.readline, b""):
        if _MARKED.match(raw) is None:
            out.write(raw)
            out.flush()


def _arguments(argv: list[str]) -> argparse.Namespace | None:
    if "--" not in argv:
        return None
    head, command = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    parser = argparse.ArgumentParser(prog="python -m dpmigrate.launch.paddle_launcher", add_help=False)
    parser.add_argument("--isolate", action="store_true")
    parser.add_argument("--node", type=int)  # several nodes (all of these): see paddle_nodes
    parser.add_argument("--nnodes", type=int)
    parser.add_argument("--nproc", type=int)
    parser.add_argument("--master")  # IP:PORT, as Paddle's launcher gets it
    parser.add_argument("--serve", action="store_true")  # node 0: serve the master's store on that address
    parser.add_argument("--run-id")
    parser.add_argument("--start-timeout", type=float)
    parser.add_argument("--status-dir", type=Path)
    parser.add_argument("folder", type=Path)
    try:
        args = parser.parse_args(head)
    except SystemExit:
        return None
    args.command = command
    return args if command else None


def _meeting(args: argparse.Namespace, started: float) -> paddle_nodes.Meeting | None:
    """Several nodes: the master's store (node 0 serves it) and this node's view of the others."""
    host, _, port = args.master.rpartition(":")
    host = host.strip("[]")
    store = None
    if args.serve:
        try:
            store = paddle_nodes.MasterStore(host, int(port), args.run_id)
        except OSError as e:
            raise SystemExit(f"dpmigrate launch: cannot serve the master's rendezvous at {args.master} "
                             f"({e.strerror or e}); nothing was started") from None
    return paddle_nodes.Meeting(node=args.node, nnodes=args.nnodes, nproc=args.nproc, master=(host, int(port)),
                                run_id=args.run_id, start_timeout_s=args.start_timeout, status_dir=args.status_dir,
                                diagnosis_dir=paddle_nodes.diagnosis_dir_from_env(), started=started, store=store)


def _stop(launcher: subprocess.Popen) -> None:
    """Stop Paddle's launcher (it stops its ranks); what is left after STOP_GRACE_S is killed."""
    with contextlib.suppress(ProcessLookupError):
        launcher.send_signal(signal.SIGTERM)
    try:
        launcher.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        for pid in [*descendants(launcher.pid), launcher.pid]:
            signal_group(pid, signal.SIGKILL)
        launcher.wait()


def main(argv: list[str]) -> int:
    started = time.monotonic()
    args = _arguments(argv)
    if args is None:
        print("usage: python -m dpmigrate.launch.paddle_launcher [--isolate | --node R --nnodes M --nproc N "
              "--master IP:PORT [--serve] --run-id ID --start-timeout S --status-dir DIR] WORKER_LOG_DIR -- "
              "COMMAND...", file=sys.stderr)
        return 2
    folder, command = args.folder, args.command
    for signum in STOP_SIGNALS:  # the launcher, in our process group, gets the same signal and stops the job
        signal.signal(signum, lambda *_: None)
    if args.isolate and enter_private_network(
        "rank 0's Paddle TCPStore listens on all interfaces at the PADDLE_MASTER port while the job runs "
        "(Paddle has no option to bind it to 127.0.0.1)"
    ) is False:
        return 1
    meeting = _meeting(args, started) if args.master else None
    env = dict(os.environ)
    if "CUDA_VISIBLE_DEVICES" in env and not env["CUDA_VISIBLE_DEVICES"].strip():
        del env["CUDA_VISIBLE_DEVICES"]
    follower = _Follower(folder)
    launcher = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=die_with_parent_hook())
    pumps = [threading.Thread(target=_pass_through, args=(pipe, out), daemon=True)
             for pipe, out in ((launcher.stdout, sys.stdout.buffer), (launcher.stderr, sys.stderr.buffer))]
    for pump in pumps:
        pump.start()
    why_stopped = None
    while launcher.poll() is None:
        follower.poll()
        why_stopped = meeting.poll(time.monotonic()) if meeting else None
        if why_stopped:
            print(why_stopped, file=sys.stderr, flush=True)
            _stop(launcher)
            break
        time.sleep(POLL_S)
    follower.poll(final=True)
    for pump in pumps:
        pump.join(timeout=5)
    if meeting is not None and meeting.met and launcher.returncode != 0:
        meeting.settle(time.monotonic())  # name a rank lost on another node, if that is why this node failed
        meeting.record_lost()
    if meeting is not None and meeting.store is not None:
        meeting.store.close()
    if why_stopped:
        return 1
    _exit_like(launcher.returncode)
    return launcher.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
