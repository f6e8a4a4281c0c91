"""Stream every process's output live to the terminal, rank-prefixed, and file it per rank.

Why here and not in each backend: every framework's ranks print, and a user reading N interleaved
streams must be able to tell them apart, whatever started them. One pump thread per output pipe reads
line by line:

- a rank's line goes to the terminal as ``[rank<i>] <line>`` (stdout to stdout, stderr to stderr) and,
  as it is, to ``<log dir>/rank<i>.log`` (both streams in one file, in arrival order);
- a framework launcher's line (several nodes) is split by the backend (``split_rank``): a rank's line
  is filed under that rank and shown as it is (the launcher already prefixed it); the launcher's own
  lines go to ``launcher.log``, to the terminal, and into ``Outcome.launcher_lines``. From the first
  line of its final traceback on, its stderr is held back, and the backend picks what of it is worth
  showing (``trim_traceback``) once it has exited;
- a service's line goes to ``launcher.log`` and to the terminal's stderr as ``[<name>] <line>``.

Log files are created readable by this user only (0600).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path
from typing import IO

from .backend import Backend, Process
from .processes import open_private_log


class LogFiles:
    """Per-rank log files and the launcher's own log, fed by the pump threads."""

    def __init__(self, log_dir: Path, ranks: tuple[int, ...]):
        self.log_dir = log_dir
        self.lock = threading.Lock()
        self.files: dict[int, IO[str]] = {}
        self.launcher_log: IO[str] | None = None
        try:
            for rank in ranks:
                self.files[rank] = open_private_log(log_dir / f"rank{rank}.log")
            self.launcher_log = open_private_log(log_dir / "launcher.log")
        except BaseException:
            self.close()
            raise
        self.launcher_lines: list[str] = []
        self.held: list[str] = []  # the launcher's stderr lines from its final traceback on

    def start_pumps(self, process: Process, stdout: IO[bytes], stderr: IO[bytes], backend: Backend,
                    consoles: tuple[IO[str], IO[str]]) -> list[threading.Thread]:
        pumps = [threading.Thread(target=self._pump, args=(process, pipe, console, backend, is_stderr),
                                  name=f"dpmigrate-pump-{process.name}", daemon=True)
                 for pipe, console, is_stderr in ((stdout, consoles[0], False), (stderr, consoles[1], True))]
        for pump in pumps:
            pump.start()
        return pumps

    def _pump(self, process: Process, pipe: IO[bytes], console: IO[str], backend: Backend, is_stderr: bool) -> None:
        # A pump still running after the supervisor gave up waiting for it finds its files closed: it ends.
        with contextlib.suppress(ValueError, OSError):
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                if not line.endswith("\n"):
                    line += "\n"
                with self.lock:
                    self._route(process, line, console, backend, is_stderr)

    def _route(self, process: Process, line: str, console: IO[str], backend: Backend, is_stderr: bool) -> None:
        if process.role == "rank":
            self._rank_file(process.rank).write(line)
            write_console(console, f"[rank{process.rank}] {line}")
            return
        if process.role == "launcher":
            rank, text = backend.split_rank(line)
            if rank is not None:
                self._rank_file(rank).write(text)
                write_console(console, line)
                return
            self.launcher_log.write(line)
            self.launcher_lines.append(line.rstrip("\n"))
            if is_stderr and (self.held or line.startswith("Traceback (most recent call last)")):
                self.held.append(line)
            else:
                write_console(console, line)
            return
        self.launcher_log.write(f"[{process.name}] {line}")
        self.launcher_lines.append(f"[{process.name}] {line.rstrip()}")
        write_console(console, f"[{process.name}] {line}")

    def note(self, line: str) -> None:
        """A message of dpmigrate launch itself: to the terminal's stderr and ``launcher.log``."""
        with self.lock:
            self.launcher_log.write(line + "\n")
            self.launcher_lines.append(line)
            write_console(sys.stderr, line + "\n")

    def _rank_file(self, rank: int) -> IO[str]:
        if rank not in self.files:  # a rank we did not expect (uneven nodes): file it anyway
            self.files[rank] = open_private_log(self.log_dir / f"rank{rank}.log")
        return self.files[rank]

    def close(self) -> None:
        with self.lock:
            for f in [*self.files.values(), self.launcher_log]:
                if f is not None:
                    f.close()


def write_console(stream: IO[str], line: str) -> None:
    try:
        stream.write(line)
        stream.flush()
    except (BrokenPipeError, ValueError):  # terminal gone or stream closed: the log files still have it
        pass
