"""Turn a lost rank into a clear message instead of a gloo traceback or a silent hang.

Each rank bumps a heartbeat counter in the job's key-value store (the one torch.distributed already
runs) every ``INTERVAL`` seconds from a daemon thread. When a collective fails (a peer's socket
closed, or the collective timeout expired), the uncaught-exception hook waits a little, sees whose
counter stopped moving, and prints which rank was lost after the traceback:

    dpmigrate: rank 0 lost rank 1 (no heartbeat for 2.0 s: the process exited, was killed or is frozen).

The job is then marked broken so that exit does not try a clean teardown with dead peers. Under
``dpmigrate launch`` (which sets ``DPMIGRATE_DIAGNOSIS_DIR``, a private folder of the job's log dir) the
diagnosis is also written there as ``lost-by-rank<i>.json`` (``{"rank": i, "lost": [...]}``), before
the message: the launcher kills a lost rank at once (a frozen process ignores SIGTERM) and names it in
its final line, instead of waiting for it to stop.

Module state: ``_broken`` and the excepthook this module installed (``_installed_hook``);
``_reset_for_tests()`` clears the first and puts the previous hook back.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import torch.distributed as dist

from .atomic import atomic_write

INTERVAL = 0.5
DIAGNOSIS_WAIT = 2.0
_KEY = "dpmigrate/heartbeat/{}"
DIAGNOSIS_DIR_VARIABLE = "DPMIGRATE_DIAGNOSIS_DIR"
_broken = False
_installed_hook: tuple | None = None  # (our hook, the hook it replaced)


def job_is_broken() -> bool:
    return _broken


def _reset_for_tests() -> None:
    """Forget that the job broke, and uninstall our excepthook if it is still the installed one."""
    global _broken, _installed_hook
    _broken = False
    if _installed_hook is not None and sys.excepthook is _installed_hook[0]:
        sys.excepthook = _installed_hook[1]
    _installed_hook = None


def _is_distributed_failure(exc: BaseException) -> bool:
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        word in text for word in ("Connection closed by peer", "Connection reset by peer", "Timed out", "gloo", "NCCL")
    )


class PeerMonitor:
    """The heartbeat thread of one rank and the diagnosis of lost peers."""

    def __init__(self, store, rank: int, world_size: int, timeout_s: float):
        self.store, self.rank, self.world_size, self.timeout_s = store, rank, world_size, timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="dpmigrate-heartbeat", daemon=True)

    @classmethod
    def start(cls, role, timeout_s: float) -> PeerMonitor | None:
        try:
            store = dist.distributed_c10d._get_default_store()
        except Exception:  # a backend without a store: no diagnosis, errors still propagate
            return None
        monitor = cls(store, role.rank, role.world_size, timeout_s)
        monitor._thread.start()
        _install_excepthook(monitor)
        return monitor

    def _beat(self) -> None:
        key = _KEY.format(self.rank)
        while not self._stop.is_set():
            try:
                self.store.add(key, 1)
            except Exception:
                return  # the store is gone: the job is ending
            self._stop.wait(INTERVAL)

    def stop(self) -> None:
        """Stop beating and wait for the thread (its store call is short; a dead store ends it)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _counters(self) -> list[int]:
        return [int(self.store.add(_KEY.format(r), 0)) for r in range(self.world_size)]

    def lost_ranks(self) -> list[int] | None:
        """Ranks whose heartbeat stopped, or None when the store itself cannot be reached."""
        try:
            before = self._counters()
            time.sleep(DIAGNOSIS_WAIT)
            after = self._counters()
        except Exception:
            return None
        return [r for r in range(self.world_size) if r != self.rank and after[r] == before[r]]

    def explain(self, exc: BaseException) -> str:
        lost = self.lost_ranks()
        if lost is None:
            return (
                f"dpmigrate: rank {self.rank} lost contact with the job: a collective failed and the job's "
                "store is unreachable, so the master process (rank 0 or the launcher) is gone."
            )
        if lost:
            _record_lost(self.rank, lost)
            names = ", ".join(str(r) for r in lost)
            return (
                f"dpmigrate: rank {self.rank} lost rank{'s' if len(lost) > 1 else ''} {names} (no heartbeat "
                f"for {DIAGNOSIS_WAIT:.1f} s: the process exited, was killed or is frozen). Stopping this rank; "
                "see that rank's log for why it ended."
            )
        return (
            f"dpmigrate: rank {self.rank}: a collective failed or waited more than the {self.timeout_s:g} s "
            "timeout, but every rank is still alive: the ranks are running different code (a collective, "
            "barrier or dp.save reached by some ranks only, e.g. inside `if dp.is_main_process():`). "
            "`dpmigrate --check` reports such code; raise the timeout with DPMIGRATE_TIMEOUT for long "
            "rank-0-only work."
        )


def _record_lost(rank: int, lost: list[int]) -> None:
    """Tell ``dpmigrate launch`` which ranks this one lost (atomically: :mod:`.atomic`)."""
    folder = os.environ.get(DIAGNOSIS_DIR_VARIABLE)
    if not folder:
        return
    data = json.dumps({"rank": rank, "lost": lost}).encode()
    try:
        atomic_write(os.path.join(folder, f"lost-by-rank{rank}.json"), lambda f: f.write(data))
    except OSError as e:  # the message below still names the lost ranks
        sys.stderr.write(f"dpmigrate: cannot tell the launcher which ranks were lost ({folder}: {e})\n")


def _install_excepthook(monitor: PeerMonitor) -> None:
    global _installed_hook
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        global _broken
        previous(exc_type, exc, tb)  # the traceback first; the explanation is the last thing printed
        if exc is not None and _is_distributed_failure(exc):
            _broken = True
            try:  # keep beating while diagnosing, or the peers diagnosing too would think us lost
                sys.stderr.write(monitor.explain(exc) + "\n")
                sys.stderr.flush()
            except Exception:
                pass
            monitor.stop()

    sys.excepthook = hook
    _installed_hook = (hook, previous)
