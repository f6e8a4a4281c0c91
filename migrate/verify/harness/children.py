"""The processes a stopped run started, ended with it.

Why: verify stops the original and the converted script after K steps (``leaving.leave``: ``os._exit``), so the
scripts never shut down what they started. A ``DataLoader``'s worker processes then outlive them: Paddle's do
(measured: 6 left behind by one verify run of a script with ``num_workers=2``), torch's only until their
watchdog notices. Each run kills its own descendants before it exits.
"""

from __future__ import annotations

import os
import signal


def end_children() -> None:
    """Kill what this process started (a DataLoader's worker processes): stopped after K steps, the script
    never shuts them down, and Paddle's outlive their parent (measured: 6 left behind by one verify run)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return  # not Linux: the run's process group is ended by verify itself
    parents: dict[int, list[int]] = {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        parents.setdefault(int(fields[1]), []).append(int(entry))
    pending, found = [os.getpid()], []
    while pending:
        for child in parents.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    if not found:
        return
    _quiet_child_handler()
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except Exception:  # (OSError: gone already; anything a handler raises must not end the run)
            pass


def _quiet_child_handler() -> None:
    """Paddle's DataLoader installs a SIGCHLD handler that raises ``SystemError`` ("DataLoader process ... is
    killed by signal") in the main thread when a worker dies: killing the workers here then failed the rank, 1
    CI run in 2 (the run is about to end: no one is left to tell). Only the main thread may set a handler."""
    import threading

    if threading.current_thread() is threading.main_thread():
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
