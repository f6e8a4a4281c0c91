"""Run one rank under a framework's launcher and record exactly how it ended.

    python -m dpmigrate.launch.rank_status STATUS_DIR SCRIPT ARGS...

Why: on several nodes the framework's launcher (torchrun) starts the ranks, so dpmigrate does not see
their exit statuses; torchrun reports them only in a human-readable summary whose format is no
interface (a torchrun upgrade could change it and silently break the failure report). This wrapper
runs the real rank, ``sys.executable SCRIPT ARGS``, as its child, waits for it and writes
``STATUS_DIR/rank<RANK>.json``: the exit code (negative: the signal that killed it), whether the rank
was asked to stop before it ended (then it is not to blame), and when it ended. It then exits the way
the rank did (same code, or killed by the same signal), so the launcher sees no difference. At the
start it writes ``STATUS_DIR/rank<RANK>.pid``, its pid, which is also its process group's id (torchrun
starts each rank in a session of its own): dpmigrate kills that group itself when torchrun would wait
too long (torchrun waits a fixed 30 s for the peers of a failed rank, whatever ``--shutdown-timeout``).

Signals: the rank stays in this wrapper's process group, and torchrun (like dpmigrate) stops a rank by
signalling its whole group, so the rank receives every stop signal itself. The wrapper forwards
nothing (a second SIGINT would interrupt the rank's own cleanup); it only notes that a stop was
asked for. If the wrapper dies, the kernel sends the rank SIGTERM (``PR_SET_PDEATHSIG``).
Standard library only: importing it loads no framework.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..runtime.atomic import TMP_SUFFIX, atomic_write
from .backend import RankExit
from .processes import die_with_parent_hook

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or "RANK" not in os.environ:
        print("usage: RANK=<rank> python -m dpmigrate.launch.rank_status STATUS_DIR SCRIPT ARGS... "
              "(run by dpmigrate launch under torchrun, which sets RANK)", file=sys.stderr)
        return 2
    status_dir, command = Path(argv[0]), [sys.executable, *argv[1:]]
    rank = int(os.environ["RANK"])
    stop_requested: list[int] = []
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda s, _frame: stop_requested.append(s))
    try:
        _write_atomically(status_dir, f"rank{rank}.pid", f"{os.getpid()}\n")
    except OSError as e:
        print(f"dpmigrate launch: cannot record rank {rank}'s pid in {status_dir} ({e})", file=sys.stderr)
    child = subprocess.Popen(command, preexec_fn=die_with_parent_hook())
    returncode = child.wait()  # retried after each signal handler (PEP 475)
    exit_ = RankExit(rank, returncode, stopped=bool(stop_requested), ended=time.time())
    try:
        write_status(status_dir, exit_)
    except OSError as e:
        print(f"dpmigrate launch: cannot record rank {rank}'s exit status in {status_dir} ({e})", file=sys.stderr)
    _exit_like(returncode)
    return returncode


def write_status(status_dir: Path, exit_: RankExit) -> None:
    """Write ``rank<i>.json`` atomically."""
    _write_atomically(status_dir, f"rank{exit_.rank}.json", json.dumps(
        {"rank": exit_.rank, "returncode": exit_.returncode, "stopped": exit_.stopped, "ended": exit_.ended}))


def _write_atomically(folder: Path, name: str, text: str) -> None:
    """Readers never see half of it: :func:`dpmigrate.runtime.atomic.atomic_write`, the one writer."""
    data = text.encode()
    atomic_write(folder / name, lambda f: f.write(data))


def read_statuses(status_dir: Path, ranks: tuple[int, ...]) -> dict[int, RankExit]:
    """The exits recorded for ``ranks`` (a rank whose wrapper was killed has none)."""
    found = {}
    for rank in ranks:
        try:
            data = json.loads((status_dir / f"rank{rank}.json").read_text())
        except FileNotFoundError:
            continue
        found[rank] = RankExit(int(data["rank"]), int(data["returncode"]), bool(data["stopped"]),
                               float(data["ended"]))
    return found


def read_pids(status_dir: Path, ranks: tuple[int, ...]) -> dict[int, int]:
    """The pids (= process group ids) of the wrappers of ``ranks`` that have started."""
    found = {}
    for rank in ranks:
        with contextlib.suppress(FileNotFoundError, ValueError):
            found[rank] = int((status_dir / f"rank{rank}.pid").read_text())
    return found


def forget_statuses(status_dir: Path) -> None:
    """Remove what an earlier run left in ``status_dir`` (a reused log dir), before a new run."""
    for stale in [*status_dir.glob("rank*.json"), *status_dir.glob("rank*.pid"), *status_dir.glob(f".rank*{TMP_SUFFIX}")]:
        stale.unlink(missing_ok=True)


def _exit_like(returncode: int) -> None:
    """End this process as the rank ended: killed by the same signal (without a core file of our own)."""
    if returncode >= 0:
        sys.stdout.flush()
        os._exit(returncode)
    signum = -returncode
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for s in {*STOP_SIGNALS, signum}:
        with contextlib.suppress(ValueError, OSError):  # SIGKILL has no handler to reset
            signal.signal(s, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    time.sleep(1)  # a signal that does not kill by default (e.g. SIGCHLD): fall back to an exit code
    os._exit(128 + signum)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
