"""Run a launch plan under supervision, the same way for every framework: start, watch, stop, leave nothing.

- Every process of the plan starts in a session (process group) of its own, so a Ctrl-C in the
  terminal reaches only ``dpmigrate launch``, and stopping a process means signalling its whole group
  (a rank's data loader workers too). On Linux each also gets SIGTERM if ``dpmigrate launch`` dies
  (``PR_SET_PDEATHSIG``).
- Ranks started directly (one node): their exit statuses are known exactly (``Popen``). When one fails
  (a non-zero exit or a signal), the others are stopped: SIGTERM to their groups, SIGKILL after
  ``Plan.peer_grace_s``. A rank that was asked to stop is recorded as stopped and never blamed.
- A framework launcher (several nodes) starts and stops the ranks itself; its exit ends the job, and
  the ranks' exit statuses are read from the files :mod:`.rank_status` wrote. Once one of those says a
  rank failed, the ranks still running under the launcher get ``Plan.peer_grace_s``, then SIGKILL from
  us (torchrun itself waits a fixed 30 s before it kills them).
- A rank found lost by a peer while it still runs (frozen: its heartbeat stopped, :mod:`.diagnosis`)
  is killed at once, SIGKILL to its group (SIGTERM cannot stop a stopped or wedged process), and named.
- Launcher plans with ``Plan.start_timeout_s``: if none of this node's ranks has started by then (+
  ``START_MARGIN_S``), the nodes never all met; the launcher is killed, with a line that says so.
- Services (a rendezvous store) run until the ranks are done, then get SIGTERM. A service that listens
  on the plan's loopback socket starts only when a first client connects to it (see ``Process.listens``).
- SIGINT/SIGTERM/SIGHUP to ``dpmigrate launch`` are forwarded to every rank (or to the launcher); after
  ``Plan.grace_s``, or on a second signal, everything still running is killed with SIGKILL.
- Output: :mod:`.streams`. Signal handlers only queue the signal; the main loop acts on it (a handler
  interrupting the loop half-way through stopping processes could otherwise act twice).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from . import diagnosis, rank_status
from .backend import LOOPBACK_PORT, Backend, Job, Outcome, Plan, Process, RankExit, describe_returncode
from .processes import create_private_file, descendants, die_with_parent_hook, make_private_dirs
from .streams import LogFiles

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_S = 0.05
SERVICE_GRACE_S = 2.0
START_MARGIN_S = 3.0  # the start-timeout backstop acts this long after the backend's own deadline


@dataclasses.dataclass
class _Child:
    process: Process
    popen: subprocess.Popen
    asked_to_stop: bool = False
    returncode: int | None = None


def run(plan: Plan, job: Job, backend: Backend) -> Outcome:
    """Run ``plan`` to the end; the log dir must exist (the caller created it, private)."""
    for folder in (*plan.private_dirs, job.diagnosis_dir):
        make_private_dirs(folder)
    diagnosis.forget(job.diagnosis_dir)  # an earlier run's, in a reused --log-dir
    if plan.status_dir is not None:
        make_private_dirs(plan.status_dir)
        rank_status.forget_statuses(plan.status_dir)  # an earlier run's, in a reused --log-dir
    logs = LogFiles(job.log_dir, job.ranks)
    supervisor = _Supervisor(plan, job, logs, backend)
    lost_elsewhere: dict[int, int] = {}
    try:
        with _private_files(plan.private_files), _queue_signals(supervisor.signals):
            supervisor.start()
            supervisor.watch()
    finally:
        supervisor.leave_nothing_running()
        lost_elsewhere = {r: by for r, by in diagnosis.lost_ranks(job.diagnosis_dir).items() if r not in job.ranks}
        logs.close()
        with contextlib.suppress(OSError):  # kept only when it holds a diagnosis
            job.diagnosis_dir.rmdir()
    launcher = next((c for c in supervisor.children if c.process.role == "launcher"), None)
    if plan.status_dir is not None:
        exits = rank_status.read_statuses(plan.status_dir, job.ranks)
    else:
        exits = supervisor.rank_exits
    return Outcome(rank_exits=exits, launcher_returncode=launcher.returncode if launcher else None,
                   interrupted=supervisor.interrupted, launcher_lines=logs.launcher_lines, lost=supervisor.lost,
                   lost_elsewhere=lost_elsewhere)


class _Supervisor:
    def __init__(self, plan: Plan, job: Job, logs: LogFiles, backend: Backend):
        self.plan, self.job, self.logs, self.backend = plan, job, logs, backend
        self.children: list[_Child] = []
        self.pumps: list[threading.Thread] = []
        self.rank_exits: dict[int, RankExit] = {}
        self.signals: list[int] = []  # queued by the signal handlers
        self.interrupted: int | None = None
        self.kill_at: float | None = None  # when the grace after a stop request ends
        self.kill_ranks_at: float | None = None  # launcher plans: when the ranks under it get SIGKILL from us
        self.lost: dict[int, int] = {}  # rank found lost while running, and killed -> the rank that found it
        self.done = False  # every rank (or the launcher) has exited
        self.listener: socket.socket | None = None  # on 127.0.0.1, for the service with Process.listens
        self.port = ""
        self.on_first_client: Process | None = None  # that service, until a client connects
        self.started_at = time.monotonic()
        self.start_given_up = False  # the start-timeout backstop has acted (or is no longer needed)

    def start(self) -> None:
        """Start every process, except a listening service: that one starts on its first client."""
        self.started_at = time.monotonic()
        if _needs_listener(self.plan):
            self.listener = _loopback_listener()
            self.port = str(self.listener.getsockname()[1])
        for process in self.plan.processes:
            self._handle_signals()
            if self.interrupted is not None:
                return  # stopped while starting: start nothing more
            if process.listens:
                self.on_first_client = process
            else:
                self._spawn(process)

    def _start_service_on_first_client(self) -> None:
        """Start the listening service once a client waits on the socket (the kernel queues it meanwhile):
        a job whose ranks never connect (they meet another way) does not pay for the service."""
        if self.on_first_client is None or self.kill_at is not None or self.done:  # not while stopping
            return
        if not select.select([self.listener], [], [], 0)[0]:
            return
        self._spawn(self.on_first_client, self.listener)
        self.on_first_client = None
        self._close_listener()  # the service holds its own copy now

    def _close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def _spawn(self, process: Process, listener: socket.socket | None = None) -> None:
        env = {**os.environ, **{k: v.replace(LOOPBACK_PORT, self.port) for k, v in process.env.items()}}
        pass_fds: tuple[int, ...] = ()
        if listener is not None:
            env["DPMIGRATE_LISTEN_FD"] = str(listener.fileno())
            pass_fds = (listener.fileno(),)
        popen = subprocess.Popen(
            process.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, preexec_fn=die_with_parent_hook(), pass_fds=pass_fds,
        )
        self.children.append(_Child(process, popen))
        self.pumps += self.logs.start_pumps(process, popen.stdout, popen.stderr, self.backend,
                                            (sys.stdout, sys.stderr))

    def watch(self) -> None:
        """Until every rank (or the launcher) has exited: reap, stop the rest on a failure, honour signals."""
        while True:
            self._handle_signals()
            self._start_service_on_first_client()
            failed = self._reap()
            self._kill_lost_ranks()
            if failed and self.kill_at is None:
                self._ask_to_stop(signal.SIGTERM, self.plan.peer_grace_s)
            self._kill_ranks_the_launcher_waits_for()
            self._stop_a_launcher_whose_ranks_never_started()
            if all(c.returncode is not None for c in self.children if c.process.role != "service"):
                self.done = True
                break
            if self.kill_at is not None and time.monotonic() > self.kill_at:
                self._kill([c for c in self.children if c.process.role != "service"])
                self.kill_at = float("inf")  # killed: now only wait for the kernel
            time.sleep(POLL_S)
        self._stop_services()

    def _reap(self) -> bool:
        """Record the exits since the last look; True if one of them ends the job (a failure, the launcher)."""
        ends_job, now = False, time.time()
        for child in self.children:
            if child.returncode is not None or (returncode := child.popen.poll()) is None:
                continue
            child.returncode = returncode
            if child.process.role == "service" and not self.done and self.interrupted is None:
                self.logs.note(f"dpmigrate launch: {child.process.name} exited early "
                               f"({describe_returncode(returncode)}); ranks that rely on it will fail")
            elif child.process.role == "launcher":
                ends_job = True
            elif child.process.role == "rank":
                exit_ = RankExit(child.process.rank, returncode, stopped=child.asked_to_stop, ended=now)
                self.rank_exits[exit_.rank] = exit_
                ends_job = ends_job or exit_.failed
        return ends_job

    def _handle_signals(self) -> None:
        while self.signals:
            signum = self.signals.pop(0)
            if self.interrupted is not None:  # a second Ctrl-C: stop waiting
                self._kill(self.children)
                self.kill_at = float("inf")
                continue
            self.interrupted = signum
            self._ask_to_stop(signum, self.plan.grace_s)

    def _ask_to_stop(self, signum: int, grace_s: float) -> None:
        """Signal every rank (or the launcher, which stops its ranks); kill them after the grace."""
        for child in self.children:
            if child.process.role != "service" and child.returncode is None:
                child.asked_to_stop = True
                _signal_group(child.popen.pid, signum)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + grace_s

    def _kill_lost_ranks(self) -> None:
        """Kill at once this node's ranks that a peer found lost while they still run (frozen)."""
        if self.done or self.interrupted is not None:
            return
        for rank, by in diagnosis.lost_ranks(self.job.diagnosis_dir).items():
            if rank in self.lost or rank not in self.job.ranks:
                continue
            group = self._running_rank_group(rank)
            if group is None:  # it has exited: its own exit status tells what happened
                continue
            self.lost[rank] = by
            self.logs.note(f"dpmigrate launch: rank {rank} stopped responding (rank {by} lost it: no heartbeat); "
                           "killing it")
            _signal_group(group, signal.SIGKILL)

    def _running_rank_group(self, rank: int) -> int | None:
        """The process group of ``rank`` if it still runs on this node (one node: marked as stopped by us)."""
        if self.plan.status_dir is None:
            child = next((c for c in self.children if c.process.role == "rank" and c.process.rank == rank), None)
            if child is None or child.returncode is not None:
                return None
            child.asked_to_stop = True
            return child.popen.pid
        if rank in rank_status.read_statuses(self.plan.status_dir, (rank,)):
            return None
        group = rank_status.read_pids(self.plan.status_dir, (rank,)).get(rank)
        launcher = self._launcher()
        if group is None or launcher is None or group not in descendants(launcher.popen.pid):
            return None  # not started yet, or not ours (a stale pid file)
        return group

    def _kill_ranks_the_launcher_waits_for(self) -> None:
        """Launcher plans: once a rank failed, the ranks still under the launcher get ``peer_grace_s``
        (the launcher sends them SIGTERM), then SIGKILL from us, so the launcher's own wait ends."""
        if self.plan.status_dir is None or self.done or self.kill_ranks_at == float("inf"):
            return
        if self.kill_ranks_at is None:
            exits = rank_status.read_statuses(self.plan.status_dir, self.job.ranks).values()
            if self.lost or any(e.failed for e in exits):
                self.kill_ranks_at = time.monotonic() + self.plan.peer_grace_s
        elif time.monotonic() >= self.kill_ranks_at:
            launcher = self._launcher()
            if launcher is not None and launcher.returncode is None:
                for pid in descendants(launcher.popen.pid):  # the ranks run in sessions of their own
                    _signal_group(pid, signal.SIGKILL)
            self.kill_ranks_at = float("inf")

    def _stop_a_launcher_whose_ranks_never_started(self) -> None:
        """Launcher plans with a start timeout: if none of this node's ranks has started ``START_MARGIN_S``
        after it, the nodes never all met; kill the launcher (a backstop: its rendezvous gives up first)."""
        if self.plan.start_timeout_s is None or self.plan.status_dir is None or self.kill_at is not None:
            return
        launcher = self._launcher()
        if launcher is None or launcher.returncode is not None or self.start_given_up:
            return
        waited = time.monotonic() - self.started_at
        if waited < self.plan.start_timeout_s + START_MARGIN_S:
            return
        if rank_status.read_pids(self.plan.status_dir, self.job.ranks):
            self.start_given_up = True  # the ranks started: from here on, the collective timeout rules
            return
        self.start_given_up = True
        self.logs.note(f"dpmigrate launch: no rank of this node started within --start-timeout "
                       f"{self.plan.start_timeout_s:g} s (+{START_MARGIN_S:g} s): the nodes never all met; "
                       f"stopping {launcher.process.name}")
        self._kill([launcher])
        self.kill_at = float("inf")

    def _launcher(self) -> _Child | None:
        return next((c for c in self.children if c.process.role == "launcher"), None)

    def _stop_services(self) -> None:
        services = [c for c in self.children if c.process.role == "service" and c.returncode is None]
        for child in services:
            _signal_group(child.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + SERVICE_GRACE_S
        for child in services:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.returncode = child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))

    def _kill(self, children: list[_Child]) -> None:
        for child in children:
            if child.process.role == "launcher" and child.returncode is None:
                for pid in descendants(child.popen.pid):  # its ranks run in sessions of their own
                    _signal_group(pid, signal.SIGKILL)
            _signal_group(child.popen.pid, signal.SIGKILL)

    def leave_nothing_running(self) -> None:
        """Kill what is left of every process group (a finished rank's stray workers too), reap, drain."""
        self._close_listener()
        self._kill(self.children)
        for child in self.children:
            returncode = child.popen.wait()
            if child.returncode is None:
                child.returncode = returncode
        for pump in self.pumps:
            pump.join(timeout=5)
        for child in self.children:
            for pipe in (child.popen.stdout, child.popen.stderr):
                pipe.close()
        if self.plan.launcher is not None:
            for line in self.backend.trim_traceback(self.logs.held):
                _console_stderr(line)


def _signal_group(pgid: int, signum: int) -> None:
    """Signal the process group our child leads (it may outlive the child: its stray workers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _console_stderr(line: str) -> None:
    with contextlib.suppress(BrokenPipeError, ValueError):
        sys.stderr.write(line)
        sys.stderr.flush()


def _needs_listener(plan: Plan) -> bool:
    return any(p.listens or any(LOOPBACK_PORT in v for v in p.env.values()) for p in plan.processes)


def _loopback_listener() -> socket.socket:
    """A TCP socket listening on 127.0.0.1 at a port the OS picks (reachable from this machine only)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


@contextlib.contextmanager
def _private_files(paths: tuple[Path, ...]) -> Iterator[None]:
    created = []
    try:
        for path in paths:
            create_private_file(path)
            created.append(path)
        yield
    finally:
        for path in created:
            path.unlink(missing_ok=True)


@contextlib.contextmanager
def _queue_signals(queue: list[int]) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # Python allows handlers only there
        yield
        return
    previous = {s: signal.signal(s, lambda signum, _frame: queue.append(signum)) for s in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
