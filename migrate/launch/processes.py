"""Operating-system helpers of ``dpmigrate launch``: start a process that dies with us, signal process groups,
find every process under one, create private files and folders.

Why a module of their own: the supervisor and the per-rank status wrapper (:mod:`.rank_status`) both
need them, and they are the only Linux-specific code of the launcher (with a fallback elsewhere).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable


def die_with_parent_hook(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """On Linux, a ``preexec_fn`` asking the kernel to send ``signum`` to the child when its parent dies.

    The kernel ties this to the parent *thread*: start children from a thread that outlives them (the
    supervisor starts them from the main thread).
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the forked child
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, int(signum))


def signal_group(pid: int, signum: int) -> None:
    """Signal ``pid``'s process group if it leads one, else ``pid`` alone; a process gone is fine."""
    try:
        os.killpg(pid, signum)
        return
    except (ProcessLookupError, PermissionError):
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def descendants(root: int) -> list[int]:
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


def make_private_dirs(path: Path) -> list[Path]:
    """Create ``path`` and its missing parents, each readable by this user only (0700, whatever the
    umask); return the folders created, outermost first. Existing folders are left as they are."""
    missing = []
    for folder in [path, *path.parents]:
        if folder.exists():
            break
        missing.append(folder)
    created = []
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # created meanwhile by someone else: not ours to change
            continue
        os.chmod(folder, 0o700)  # mkdir's mode is filtered by the umask
        created.append(folder)
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a folder")
    return created


def create_private_file(path: Path) -> None:
    """Create ``path`` empty, for this user only (0600); fail if anything (a file, a link) is there."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600))


def open_private_log(path: Path):
    """Open a log file for writing (line-buffered text), readable by this user only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    os.fchmod(fd, 0o600)  # a file left by an earlier run in the same --log-dir keeps its mode otherwise
    return open(fd, "w", encoding="utf-8", errors="replace", buffering=1)
