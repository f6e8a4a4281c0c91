"""End a gloo process group at exit so that a job which trained correctly never dies of SIGABRT.

The cause, from core dumps of ranks that printed "terminate called without an active exception"
after training had finished: gloo runs every collective on one of its worker threads
(``pt_gloo_runloop``), and that thread drops its reference to the finished collective *after* the
caller has seen the result. When the collective's tensors have Python objects (``dp.all_gather``,
``dp.all_reduce``, a comm hook's buffer), dropping them takes the GIL. If the main thread has reached
the end of the script by then and Python has begun to finalize, CPython 3.11 ends any other thread
that asks for the GIL with ``pthread_exit``, here from inside a C++ frame that cannot be unwound:
``~AsyncAllgatherWork -> decref_pyobject -> gil_scoped_acquire -> take_gil -> pthread_exit ->
std::terminate``. An unloaded machine schedules the worker before the main thread gets that far; a
loaded one sometimes does not. The heartbeat thread (``_torch_faults``) inside a store call is the
same hazard.

So, at exit and while Python is still whole (an ``atexit`` handler runs before finalization), the
runtime joins its heartbeat thread, waits with the GIL released until every gloo worker thread is
idle (blocked waiting for new work, read from ``/proc/self/task/*/syscall``), and only then destroys
the process group. ``benchmarks/torch_exit.py`` runs 200 jobs on a loaded machine to show it holds.
"""

from __future__ import annotations

import os
import platform
import time

GLOO_WORKER = "pt_gloo_runloop"
_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
_FUTEX_WAIT_BITSET = 9
_POLL_S = 0.005


def _gloo_worker_states() -> list[bool] | None:
    """For each gloo worker thread of this process, whether it is idle; None when it cannot be read."""
    if _FUTEX is None:
        return None
    states = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().strip() != GLOO_WORKER:
                    continue
            with open(f"/proc/self/task/{task}/syscall") as f:
                fields = f.read().split()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        except OSError:
            return None  # /proc/*/syscall not readable here (ptrace restrictions)
        states.append(_waits_for_work(fields))
    return states


def _waits_for_work(fields: list[str]) -> bool:
    """``futex(addr, FUTEX_WAIT_BITSET..., val, NULL)``: a condition-variable wait with no timeout.

    That is a gloo worker waiting for its next collective. A worker still dropping the last one is
    running, waiting to run, or waiting for the GIL (CPython waits for it with a timeout).
    """
    if len(fields) < 5 or not fields[0].isdigit() or int(fields[0]) != _FUTEX:
        return False
    try:
        op, timeout = int(fields[2], 16), int(fields[4], 16)
    except ValueError:
        return False
    return op & 0x7F == _FUTEX_WAIT_BITSET and timeout == 0


def wait_for_idle_gloo_workers(timeout_s: float = 10.0) -> bool:
    """Sleep (GIL released) until every gloo worker thread is idle in two polls in a row.

    Returns False when that could not be seen within ``timeout_s``, or cannot be seen on this
    platform (then it has slept a short fixed time instead, which is all it can do).
    """
    states = _gloo_worker_states()
    if states is None:
        time.sleep(0.1)
        return False
    deadline = time.monotonic() + timeout_s
    idle_polls = 0
    while time.monotonic() < deadline:
        states = _gloo_worker_states()
        idle_polls = idle_polls + 1 if states is not None and all(states) else 0
        if idle_polls >= 2:
            return True
        time.sleep(_POLL_S)
    return False
