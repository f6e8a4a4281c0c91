"""Which ranks the ranks themselves found lost, as the runtime recorded it for ``dpmigrate launch``.

Why: a frozen rank (stopped, deadlocked, stuck in a system call) never exits and ignores SIGTERM, so a
launcher that only watches exit statuses waits out its whole grace period before killing it, and its
report then blames the peer whose collective timed out. The runtime knows better: when a collective
fails, each surviving rank checks whose heartbeat stopped (``dpmigrate.runtime._torch_faults``) and,
under ``dpmigrate launch``, writes ``lost-by-rank<i>.json`` = ``{"rank": i, "lost": [j, ...]}`` into
the folder named by ``DPMIGRATE_DIAGNOSIS_DIR`` (private, in the job's log dir). The supervisor reads
it while the job runs, kills the lost ranks at once and names them in the final line.

A structured file, not the runtime's message text: the message is for people and may change.
Standard library only: importing it loads no framework.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..runtime.atomic import TMP_SUFFIX

VARIABLE = "DPMIGRATE_DIAGNOSIS_DIR"  # the same name as dpmigrate.runtime._torch_faults.DIAGNOSIS_DIR_VARIABLE


def lost_ranks(folder: Path) -> dict[int, int]:
    """Lost rank -> the rank that found it lost (the lowest, if several did), from every file so far."""
    lost: dict[int, int] = {}
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("lost-by-rank") and n.endswith(".json"))
    except FileNotFoundError:
        return lost
    for name in names:
        try:
            data = json.loads((folder / name).read_text())
            by, ranks = int(data["rank"]), [int(r) for r in data["lost"]]
        except (OSError, ValueError, KeyError, TypeError):  # not ours, or half-written by hand: ignore
            continue
        for rank in ranks:
            lost[rank] = min(by, lost.get(rank, by))
    return lost


def forget(folder: Path) -> None:
    """Remove what an earlier run left in ``folder`` (a reused log dir), before a new run."""
    for stale in [*folder.glob("lost-by-rank*.json"), *folder.glob(f".lost-by-rank*{TMP_SUFFIX}")]:
        stale.unlink(missing_ok=True)
