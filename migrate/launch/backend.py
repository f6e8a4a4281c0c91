"""What a framework backend of ``dpmigrate launch`` gives the neutral supervisor, as plain data.

A backend (one module per framework, e.g. :mod:`dpmigrate.launch.torch`) answers four questions
(:class:`Backend`): can it run here, which processes does a :class:`Job` need (a :class:`Plan`), and,
when it delegates to the framework's own launcher, which of that launcher's output lines belong to
which rank and what of its final traceback is worth showing. Everything else (starting processes,
streaming and filing their output, signals, stopping, the exit code and the final line) is the
supervisor's, identical for every framework.

A plan either starts the ranks itself (one node: the supervisor sees every rank's exit status
directly) or starts the framework's launcher, which starts the ranks (several nodes); then each rank
runs under :mod:`dpmigrate.launch.rank_status`, which writes its exit status to ``Plan.status_dir``.
Either way the failure report is built from exit statuses, never from a launcher's text.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Protocol

from .network import Network

LOOPBACK_PORT = "<loopback port>"
"""In a :class:`Process`'s environment values: replaced by the port of a TCP socket the supervisor
binds on 127.0.0.1 (port chosen by the OS, so no port is guessed and two jobs never clash) before it
starts anything. The process with ``listens=True`` inherits the listening socket when the first client
connects (the kernel queues the client meanwhile); its file descriptor number is in its
``DPMIGRATE_LISTEN_FD``."""


@dataclasses.dataclass(frozen=True)
class Job:
    """A validated ``dpmigrate launch`` request, independent of the framework."""

    nproc_per_node: int
    nnodes: int
    node_rank: int
    master: tuple[str, int] | None  # (host, port); None: one node, nothing listens off loopback
    script: Path
    script_args: tuple[str, ...]
    log_dir: Path  # absolute; private (0700) when dpmigrate creates it
    timeout_s: float | None  # collective timeout for the runtime (DPMIGRATE_TIMEOUT)
    run_id: str  # unguessable: names the rendezvous and prefixes the multi-node store's keys
    start_timeout_s: float = 60.0  # several nodes: give up (naming who never came) if they have not all met
    network: Network | None = None  # several nodes: this node's address and interface towards the master
    hosts: tuple[str, ...] = ()  # several nodes, TensorFlow: every node's address, node 0 first (--hosts)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The global ranks this node runs (node ranks are contiguous blocks of ``nproc_per_node``)."""
        first = self.node_rank * self.nproc_per_node
        return tuple(range(first, first + self.nproc_per_node))

    @property
    def diagnosis_dir(self) -> Path:
        """Where the ranks record which peers they lost (:mod:`.diagnosis`); private, created by the supervisor."""
        return self.log_dir / "diagnosis"


@dataclasses.dataclass(frozen=True)
class Process:
    """One process the supervisor starts, in a session (process group) of its own."""

    name: str  # "rank0", "torchrun", "store": the log line prefix and the report's name for it
    argv: tuple[str, ...]
    env: Mapping[str, str]  # added to (or replacing in) the current environment; shown by --dry-run
    role: Literal["rank", "launcher", "service"]
    # rank: one rank of the job; a failure stops the others. launcher: a framework launcher that starts
    # the ranks itself; its exit ends the job. service: a helper the ranks use while they run, stopped
    # when they are done (its exit status does not decide the job's).
    rank: int | None = None  # for role "rank"
    listens: bool = False  # inherits the loopback listening socket (LOOPBACK_PORT); started only when a
    # first client connects to it, so a job that does not use it does not pay for starting it


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a backend wants run for a job."""

    processes: tuple[Process, ...]
    grace_s: float  # after asking the processes to stop, wait this long before killing them
    peer_grace_s: float = 5.0  # after a rank failed, its peers on this node (asked to stop by the supervisor
    # or by the framework's launcher) get this long before the supervisor kills their process groups
    private_files: tuple[Path, ...] = ()  # created empty (O_EXCL, 0600) before the start, removed after
    private_dirs: tuple[Path, ...] = ()  # created (0700) before the start, for the processes' own files
    status_dir: Path | None = None  # where rank_status writes each rank's exit (launcher plans)
    start_timeout_s: float | None = None  # launcher plans: if no rank has started this long (+ START_MARGIN_S)
    # after the launcher, the supervisor stops it (a backstop: the backend's rendezvous should give up first)

    @property
    def launcher(self) -> Process | None:
        return next((p for p in self.processes if p.role == "launcher"), None)


@dataclasses.dataclass(frozen=True)
class RankExit:
    """How one rank ended, as the supervisor (one node) or the rank's status file (launcher) saw it."""

    rank: int
    returncode: int  # negative: killed by that signal
    stopped: bool  # it was asked to stop (by dpmigrate or the framework's launcher) before it ended
    ended: float  # time.time() of the exit (or of its observation): orders the failures

    @property
    def failed(self) -> bool:
        """Failed by itself: a rank that was stopped is never blamed, whatever its exit code."""
        return self.returncode != 0 and not self.stopped

    @property
    def signal_name(self) -> str | None:
        return signal_name(self.returncode)

    def describe(self) -> str:
        return describe_returncode(self.returncode)

    @property
    def job_exit_code(self) -> int:
        """As a shell reports it: the exit code, or 128 + the signal number."""
        return exit_code_of(self.returncode)


def signal_name(returncode: int) -> str | None:
    """``-9`` -> ``"SIGKILL"``; None for a normal exit."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def describe_returncode(returncode: int) -> str:
    """``-9`` -> ``"killed by SIGKILL"``, ``3`` -> ``"exit code 3"``."""
    name = signal_name(returncode)
    return f"killed by {name}" if name else f"exit code {returncode}"


def exit_code_of(returncode: int) -> int:
    """``Popen.returncode`` as a shell reports it: negative (killed by a signal) -> 128 + the signal."""
    return returncode if returncode >= 0 else 128 - returncode


@dataclasses.dataclass
class Outcome:
    """How a job ended."""

    rank_exits: dict[int, RankExit]  # the ranks whose exit is known, by rank
    launcher_returncode: int | None  # the framework launcher's exit status; None without one
    interrupted: int | None  # the signal that made dpmigrate stop the job, if one did
    launcher_lines: list[str]  # the launcher's and services' own output (never a rank's)
    lost: dict[int, int] = dataclasses.field(default_factory=dict)  # rank found frozen and killed -> the
    # rank that found it lost (its heartbeat stopped while it was still running)
    lost_elsewhere: dict[int, int] = dataclasses.field(default_factory=dict)  # several nodes: a rank of another
    # node that a rank of this node found lost -> that rank (the other node's supervisor names why it ended)


class Backend(Protocol):
    """Everything the launcher asks of a framework backend (a module: see :mod:`dpmigrate.launch.torch`)."""

    def unavailable(self) -> str | None:
        """Why this backend cannot run here (framework not installed...), or None."""

    def plan(self, job: Job) -> Plan:
        """The processes to start for ``job`` (pure: creates nothing, so ``--dry-run`` can print it)."""

    def split_rank(self, line: str) -> tuple[int | None, str]:
        """A launcher output line -> (the rank it belongs to, the line without the rank prefix), or
        (None, line) for the launcher's own lines. Only called for launcher plans."""

    def trim_traceback(self, held: list[str]) -> list[str]:
        """Of the launcher's final traceback, what the user should see. Only called for launcher plans."""
