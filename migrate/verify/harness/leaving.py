"""How a process under the harness ends: at step K (the ranks meet first, through files), past it after the
``--to-end`` bound, or by the script's own ``os._exit``, which must not lose the record.

Split from :mod:`.core`, which records; this module only decides when and how the process leaves.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING

from .children import end_children

if TYPE_CHECKING:
    from .core import Recorder

BARRIER_TIMEOUT_S = 120.0
_real_exit = os._exit  # the harness's own way out (os._exit is wrapped while a script runs: see wrap_os_exit)


def leave(recorder: Recorder) -> None:
    """End the process after its record is written; the ranks of a job meet first (files, not sockets)."""
    _flush()
    _meet(recorder, "done")
    end_children()
    _real_exit(0)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def _meet(recorder: Recorder, name: str) -> None:
    """The ranks of a job wait for each other through files (none dies in a peer's collective)."""
    if recorder.world_size > 1:
        (recorder.out / f"{name}-{recorder.rank}").touch()
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        while time.monotonic() < deadline:
            if all((recorder.out / f"{name}-{r}").exists() for r in range(recorder.world_size)):
                break
            time.sleep(0.02)


def go_on(recorder: Recorder) -> None:
    """Past step K with ``DPMIGRATE_VERIFY_TO_END``: the script runs on, unrecorded, so a crash or a hang later
    (a reload after the first fit, the end of an epoch, a final save) is seen; after the bound, a timer ends the
    process the way :func:`leave` does, the ranks meeting first. The timer is a thread of its own: it fires while
    the main thread waits in a collective (a hang), which the step count then shows."""

    recorder.past_k = time.monotonic()

    def at_the_bound():
        recorder.end("bound")
        _flush()
        _meet(recorder, "bound")
        end_children()
        _real_exit(0)

    timer = threading.Timer(recorder.to_end, at_the_bound)
    timer.daemon = True
    timer.start()



# --- activation -----------------------------------------------------------------------------------------


def wrap_os_exit(recorder: Recorder) -> None:
    """A script that ends itself with ``os._exit`` (no atexit) still leaves its record and says how it ended: a
    script ending so right after step K read as "never imported tensorflow" (issue 32)."""

    def _exit(code: int = 0, *rest):
        if os.getpid() == recorder.pid:
            try:
                recorder.finish("exit")
                recorder.end(f"os._exit({code})")
            except Exception:
                pass
        _real_exit(code, *rest)

    os._exit = _exit

