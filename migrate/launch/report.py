"""How a launched job ended, in one exit code and one final line, from exact exit statuses only.

The exit code is the job's: 0 when every rank succeeded, else the first culprit's (128 + the signal
number if a signal killed it); 128 + N when dpmigrate was stopped by signal N. The final line names the
ranks that failed by themselves, most telling first: a rank killed by a signal ahead of the peers that
then failed with exit code 1 because their collective broke, then in the order they ended. Ranks
that were asked to stop (by dpmigrate, or by the framework's launcher after a peer failed) are never
blamed, whatever their exit code. A rank a peer found lost while it still ran (frozen: its heartbeat
stopped, see :mod:`.diagnosis`) is named first, as killed by dpmigrate, and the exit code is then
128 + SIGKILL (137) on every path (the peer that found it may have failed by itself, or, under
torchrun, been stopped by torchrun first). A rank of another node that this node's ranks found lost
is named after the culprits: that node's own final line says how it ended.
"""

from __future__ import annotations

import signal

from .backend import Job, Outcome, RankExit, describe_returncode, exit_code_of


def final_line(outcome: Outcome, job: Job, launcher: str | None) -> tuple[int, str]:
    """The job's exit code and the line that says how it ended (``launcher``: the framework launcher's
    name when the plan had one, e.g. "torchrun")."""
    logs = f"Logs: {job.log_dir}"
    if outcome.interrupted is not None:
        name = signal.Signals(outcome.interrupted).name
        return 128 + outcome.interrupted, f"dpmigrate launch: {name} received; all ranks were stopped. {logs}"
    lost = outcome.lost
    culprits = [e for e in failed_ranks(list(outcome.rank_exits.values())) if e.rank not in lost]
    if culprits or lost:
        named = "; ".join(
            [f"rank {r} stopped responding (rank {by} lost it: no heartbeat), so it was killed"
             for r, by in sorted(lost.items())]
            + ([", ".join(f"rank {e.rank} failed ({e.describe()})" for e in culprits)] if culprits else []))
        stopped = any(e.stopped for e in outcome.rank_exits.values() if e.rank not in lost)
        others = "" if not stopped else (
            "; the other ranks were stopped" if job.nnodes == 1 else "; the other ranks on this node were stopped")
        elsewhere = outcome.lost_elsewhere
        if elsewhere:
            ranks = ", ".join(map(str, sorted(elsewhere)))
            named += (f"; it lost rank{'s' if len(elsewhere) > 1 else ''} {ranks}, on another node (no heartbeat; "
                      "that node's log says why it ended)")
        code = 128 + signal.SIGKILL if lost else culprits[0].job_exit_code
        return code, f"dpmigrate launch: {named}{others}. {logs}"
    if outcome.launcher_returncode not in (None, 0):
        code = exit_code_of(outcome.launcher_returncode)
        missing = [r for r in job.ranks if r not in outcome.rank_exits]
        unknown = f"; no exit status from rank(s) {', '.join(map(str, missing))}" if missing else ""
        return code, (f"dpmigrate launch: {launcher} failed ({describe_returncode(outcome.launcher_returncode)}) "
                      f"and no rank failed by itself{unknown}; see its messages above. {logs}")
    ranks = f"all {len(job.ranks)} ranks" if len(job.ranks) > 1 else f"rank {job.ranks[0]}"
    where = " on this node" if job.nnodes > 1 else ""
    return 0, f"dpmigrate launch: {ranks}{where} finished. {logs}"


def failed_ranks(exits: list[RankExit]) -> list[RankExit]:
    """The ranks that failed by themselves: killed by a signal first, then in the order they ended."""
    return sorted((e for e in exits if e.failed), key=lambda e: (e.signal_name is None, e.ended, e.rank))
