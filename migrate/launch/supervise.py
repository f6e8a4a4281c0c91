"""Run one launch job under supervision: live rank-prefixed output, per-rank logs, signals, no orphans.

``dpmigrate launch`` hands the work of starting ranks to each framework's own launcher (torchrun
today). What that launcher does not do for us is done here, the same way for every framework:

- Its stdout and stderr are read line by line. A line the backend attributes to a rank
  (``backend.split_rank``) goes to the terminal as it is (already prefixed, e.g. ``[rank1] loss 0.3``)
  and, without the prefix, to ``<log dir>/rank<i>.log``. Every other line is the launcher's own: it
  goes to ``<log dir>/launcher.log`` and to the terminal, and is kept for the failure report. Once the
  launcher starts printing a traceback (it is about to exit), the rest of its lines are held and the
  backend chooses what of them is worth showing (``backend.trim_traceback``).
- The launcher runs in its own session, so a Ctrl-C in the terminal reaches only ``dpmigrate launch``,
  which forwards SIGINT/SIGTERM/SIGHUP to the launcher's process group. The launcher then stops its
  ranks itself; if it has not exited after ``Plan.grace_s`` (or on a second signal), every process
  under it is killed with SIGKILL, each rank's whole process group included (its data loader workers).
  On Linux the launcher also gets SIGTERM if ``dpmigrate launch`` itself dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping, Protocol

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclasses.dataclass(frozen=True)
class Job:
    """A validated ``dpmigrate launch`` request, independent of the framework."""

    nproc_per_node: int
    nnodes: int
    node_rank: int
    master: tuple[str, int] | None  # (host, port); None: one node, rendezvous on this machine
    script: Path
    script_args: tuple[str, ...]
    log_dir: Path
    timeout_s: float | None  # collective timeout for the runtime (DPMIGRATE_TIMEOUT)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The global ranks this node runs (node ranks are contiguous blocks of ``nproc_per_node``)."""
        first = self.node_rank * self.nproc_per_node
        return tuple(range(first, first + self.nproc_per_node))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a backend wants run: the command, the environment it adds, and how long a stop may take."""

    argv: tuple[str, ...]
    env: Mapping[str, str]  # added to (or replacing in) the current environment; shown by --dry-run
    grace_s: float  # after forwarding a signal, wait this long before killing everything


@dataclasses.dataclass(frozen=True)
class RankFailure:
    """One rank's failure as the launcher reported it."""

    rank: int
    exitcode: int  # negative: killed by that signal
    root_cause: bool = False  # the launcher's "first observed failure"

    @property
    def signal_name(self) -> str | None:
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def describe(self) -> str:
        name = self.signal_name
        return f"killed by {name}" if name else f"exit code {self.exitcode}"

    @property
    def job_exit_code(self) -> int:
        """As a shell reports it: the exit code, or 128 + the signal number."""
        return self.exitcode if self.exitcode >= 0 else 128 - self.exitcode


class Backend(Protocol):
    """What :func:`run` needs from a framework's backend launcher (see ``launch_torch``)."""

    def split_rank(self, line: str) -> tuple[int | None, str]: ...

    def trim_traceback(self, held: list[str]) -> list[str]: ...


@dataclasses.dataclass
class Outcome:
    returncode: int  # the launcher's own exit status (negative: killed by that signal)
    interrupted: int | None  # the signal that made us stop the job, if one did
    launcher_lines: list[str]  # the launcher's own output (never a rank's), for the failure report


def run(plan: Plan, job: Job, backend: Backend) -> Outcome:
    """Start ``plan.argv``, stream and file its output until it exits, and stop it on a signal."""
    job.log_dir.mkdir(parents=True, exist_ok=True)
    logs = _LogFiles(job.log_dir, job.ranks)
    try:
        proc = subprocess.Popen(
            plan.argv, env={**os.environ, **plan.env}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=_die_with_parent_hook(),
        )
    except BaseException:
        logs.close()
        raise
    stopper = _Stopper(proc, plan.grace_s)
    pumps = [
        threading.Thread(target=logs.pump, args=(proc.stdout, sys.stdout, backend, False), daemon=True),
        threading.Thread(target=logs.pump, args=(proc.stderr, sys.stderr, backend, True), daemon=True),
    ]
    for pump in pumps:
        pump.start()
    try:
        with _forward_signals(stopper):
            while True:
                try:
                    returncode = proc.wait(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    stopper.poll()
    finally:
        if proc.poll() is None:  # we are leaving on an exception of our own: leave nothing running
            stopper.kill()
            proc.wait()
        for pump in pumps:
            pump.join(timeout=5)
        logs.close()
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
    for line in backend.trim_traceback(logs.held):
        _console(sys.stderr, line)
    return Outcome(returncode, stopper.signum, logs.launcher_lines)


class _LogFiles:
    """Per-rank log files and the launcher's own log, fed by one pump thread per output stream."""

    def __init__(self, log_dir: Path, ranks: tuple[int, ...]):
        self.log_dir = log_dir
        self.lock = threading.Lock()
        self.files: dict[int, IO[str]] = {r: self._open(f"rank{r}.log") for r in ranks}
        self.launcher_log = self._open("launcher.log")
        self.launcher_lines: list[str] = []
        self.held: list[str] = []  # the launcher's lines from its final traceback on

    def _open(self, name: str) -> IO[str]:
        return open(self.log_dir / name, "w", encoding="utf-8", errors="replace", buffering=1)

    def pump(self, stream: IO[bytes], console: IO[str], backend: Backend, is_stderr: bool) -> None:
        # A pump still running after run() gave up waiting for it finds its pipe and files closed: it ends.
        with contextlib.suppress(ValueError, OSError):
            self._pump(stream, console, backend, is_stderr)

    def _pump(self, stream: IO[bytes], console: IO[str], backend: Backend, is_stderr: bool) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            rank, text = backend.split_rank(line)
            with self.lock:
                if rank is not None:
                    if rank not in self.files:  # a rank we did not expect (uneven nodes): file it anyway
                        self.files[rank] = self._open(f"rank{rank}.log")
                    self.files[rank].write(text)
                    _console(console, line)
                    continue
                self.launcher_log.write(line)
                self.launcher_lines.append(line.rstrip("\n"))
                if is_stderr and (self.held or line.startswith("Traceback (most recent call last)")):
                    self.held.append(line)
                else:
                    _console(console, line)

    def close(self) -> None:
        with self.lock:
            for f in [*self.files.values(), self.launcher_log]:
                f.close()


def _console(stream: IO[str], line: str) -> None:
    try:
        stream.write(line)
        stream.flush()
    except (BrokenPipeError, ValueError):  # terminal gone or stream closed: the log files still have it
        pass


class _Stopper:
    """Forward a stop signal to the launcher; kill everything under it if it does not stop in time."""

    def __init__(self, proc: subprocess.Popen, grace_s: float):
        self.proc, self.grace_s = proc, grace_s
        self.signum: int | None = None
        self.deadline: float | None = None

    def request(self, signum: int) -> None:
        if self.signum is not None:  # a second Ctrl-C: stop waiting
            self.kill()
            return
        self.signum, self.deadline = signum, time.monotonic() + self.grace_s
        _signal_group(self.proc.pid, signum)

    def poll(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.kill()
            self.deadline = None

    def kill(self) -> None:
        for pid in _descendants(self.proc.pid):  # ranks run in sessions of their own: kill each group
            _signal_group(pid, signal.SIGKILL)
        _signal_group(self.proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def _forward_signals(stopper: _Stopper) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # Python allows handlers only there
        yield
        return
    previous = {s: signal.signal(s, lambda signum, _frame: stopper.request(signum)) for s in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _signal_group(pid: int, signum: int) -> None:
    """Signal ``pid``'s process group if it leads one, else ``pid`` alone; a process gone is fine."""
    try:
        os.killpg(pid, signum)
        return
    except (ProcessLookupError, PermissionError):
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _descendants(root: int) -> list[int]:
    """All processes under ``root``, children first (from /proc on Linux, else from ``ps``)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parent_table():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _parent_table() -> list[tuple[int, int]]:
    if os.path.isdir("/proc/self"):
        table = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:  # exited meanwhile
                continue
            fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) ": state ppid ...
            table.append((int(name), int(fields[1])))
        return table
    out = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True, text=True).stdout
    return [(int(a), int(b)) for a, b in (line.split() for line in out.splitlines() if line.strip())]


def _die_with_parent_hook() -> Callable[[], None] | None:
    """On Linux, a ``preexec_fn`` asking the kernel to SIGTERM the launcher when we die."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the forked child
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, int(signal.SIGTERM))
