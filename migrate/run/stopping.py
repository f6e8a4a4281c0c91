"""Stop a run at once on Ctrl-C or ``kill``: no traceback, no worker left behind, no half-written file.

A run converts in worker processes (``-j N``) and writes in the main one. On SIGINT or SIGTERM the
main process raises :class:`Interrupted` where it stands (a ``BaseException``, so that the guard that
reports a rule's bug as a failure never swallows it); ``converting.convert_all`` then kills the
workers (they only read, so killing them loses nothing), and the CLI prints one line and exits 130 or
143, as shells expect. A write that was under way is either complete or not made at all: the atomic
writer removes its temporary on any exception, and ``os.replace`` is all or nothing. Workers ignore
SIGINT (Ctrl-C reaches the whole process group, and the main process decides), take SIGTERM by
default, and on Linux ask the kernel to kill them when their parent dies, so that even ``kill -9`` of
the CLI leaves none behind.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator


class Interrupted(BaseException):
    """The run was stopped by a signal; ``code`` is the exit status a shell expects (128 + signal number)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.name, self.code = signum, signal.Signals(signum).name, 128 + signum


def _raise(signum: int, frame: object) -> None:
    for other in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the clean-up short
        signal.signal(other, signal.SIG_IGN)
    raise Interrupted(signum)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`Interrupted` for the duration (only in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def worker_init() -> None:
    """Run first in every worker process: ignore Ctrl-C, die on SIGTERM, die with the parent (Linux)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no libc to ask: the parent still kills its workers on every signal it can catch
