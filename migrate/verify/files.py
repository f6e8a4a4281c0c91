"""The ranks' files: what a conversion's ranks do to one path that the original, one process, never could.

Why: matching weights say nothing of outputs. A checkpoint, a plot or a log written by every rank (each overwrites
the others: a torn checkpoint, one rank's plot at random), a folder outside the run deleted by every worker (a Keras
script's module-level ``tf.io.gfile.rmtree`` crashed 2 workers of 3 every time, and may go the harmless way in
verify's run), a file the main process deletes or writes while another rank reads or lists it (it is there or not
by timing) all read "equivalent" before. The events come from each process's record (``files``: kind, path as
given made absolute, where it lands, steps counted, monotonic time, the script's line; the barriers it passed:
:mod:`dpmigrate.verify.harness.files`). Three findings, each on the conversion's ranks only (the original is one
process: it is quoted, never judged):

- one path written by several ranks (rank-specific names are other paths: never together);
- a path outside the run's working folder deleted by several ranks;
- a path one rank writes, creates or deletes while another reads or lists it (or lists its folder) with no barrier
  between them: no barrier that the first entered after its event and the second left before its own.

:func:`check` gives the messages; :mod:`.compare` makes them causes of kind ``files``. Standard library only.
"""

from __future__ import annotations

import bisect
import dataclasses
import os

MODIFY = ("write", "delete", "mkdir")
ACCESS = ("read", "list")
SHOWN_RACES = 3  # race messages shown; the rest counted in the last one
_VERBS = {"write": "writes", "delete": "deletes", "mkdir": "creates", "read": "reads", "list": "lists"}


@dataclasses.dataclass
class Event:
    kind: str  # write, delete, mkdir, read, list
    path: str  # as the script gave it, made absolute
    lands: str  # where it lands: the folder part's links resolved
    step: int  # optimizer steps counted when it happened
    time: float  # time.monotonic(): one clock for the machine's processes
    where: str  # the script's file:line that caused it
    rank: int = 0


@dataclasses.dataclass
class Process:
    """One process's file events, barriers ((enter, leave) times, in order) and working folder."""

    rank: int
    events: list[Event]
    barriers: list[tuple[float, float]]
    cwd: str
    cwd_lands: str
    dropped: int = 0

    @classmethod
    def of(cls, files: dict, rank: int) -> Process:
        events = [Event(*e[:6], rank=rank) for e in files.get("events", ())]
        return cls(rank, events, [(b[0], b[1]) for b in files.get("barriers", ())], files.get("cwd", ""),
                   files.get("cwd_lands", ""), files.get("dropped", 0))

    def shown(self, event: Event) -> str:
        """The path relative to the working folder when inside it, else where it lands."""
        for path, cwd in ((event.path, self.cwd), (event.lands, self.cwd_lands)):
            if cwd and _inside(path, cwd):
                return os.path.relpath(path, cwd)
        return event.lands


def check(original: dict, ranks: list[dict]) -> list[str]:
    """The findings on the conversion's ranks (each a message with the path and the script's lines), from the
    ``files`` of the original's record and of each rank's ({} in records made before file events: nothing)."""
    one = Process.of(original, 0)
    job = [Process.of(files, rank) for rank, files in enumerate(ranks)]
    if len(job) < 2 or not all(p.cwd for p in job):
        return []
    messages, written = _several(job, one, "write")
    deleted, _ = _several(job, one, "delete", outside_only=True)
    messages += deleted
    messages += _races(job, skip=written)
    return messages


def _several(job: list[Process], one: Process, kind: str, outside_only: bool = False) -> tuple[list[str], set[str]]:
    """One message per path that ``kind`` events of several ranks share."""
    by_path: dict[str, list[Event]] = {}
    for process in job:
        for event in process.events:
            if event.kind == kind and not (outside_only and _in_working_folder(process, event)):
                by_path.setdefault(event.lands, []).append(event)
    messages, paths = [], set()
    for lands, events in by_path.items():
        ranks = sorted({e.rank for e in events})
        if len(ranks) < 2:
            continue
        paths.add(lands)
        first = events[0]
        shown = job[first.rank].shown(first)
        who = "every rank" if len(ranks) == len(job) else "ranks " + ", ".join(map(str, ranks))
        lines = _lines(events)
        before = _original(one, kind, shown)
        link = _link(job[first.rank], first)
        if kind == "write":
            messages.append(
                f"{shown} is written by {who} ({lines}){link}, {before}: the ranks overwrite each other's file (a torn "
                "checkpoint, one rank's plot or log at random, in any order). Write it on the main process only (`if "
                "dp.is_main_process():`, or dp.save(...) for a checkpoint), or give each rank a name of its own")
        else:
            messages.append(
                f"{shown}, outside the run's working folder, is deleted by {who} ({lines}){link}, {before}: the ranks "
                "race to delete it, so a slower one finds it gone (FileNotFoundError, NotFoundError) or deletes what "
                "another has just made, every run or at random. Delete it on the main process only, then dp.barrier() "
                "before the others use the folder")
    return messages, paths


def _races(job: list[Process], skip: set[str]) -> list[str]:
    """Writes, creations and deletes of one rank against another's reads and listings, with no barrier between."""
    found: dict[tuple[str, str, str], tuple[Event, Event, str]] = {}
    for a in job:
        changed: dict[str, list[Event]] = {}
        in_folder: dict[str, list[Event]] = {}
        for event in a.events:
            if event.kind in MODIFY and event.lands not in skip:
                changed.setdefault(event.lands, []).append(event)
                if event.kind != "mkdir":
                    in_folder.setdefault(os.path.dirname(event.lands), []).append(event)
        if not changed:
            continue
        for b in job:
            if b is a:
                continue
            made_by_b = {e.lands: e.time for e in b.events if e.kind in ("mkdir", "write")}
            for access in (e for e in b.events if e.kind in ACCESS):
                candidates = [(m, "it") for m in changed.get(access.lands, ())]
                if access.kind == "list":
                    candidates += [(m, "its folder") for m in in_folder.get(access.lands, ())]
                candidates += [(m, "a folder it is in") for folder in _ancestors(access.lands)
                               for m in changed.get(folder, ()) if m.kind == "delete"]
                for change, what in candidates:
                    if change.kind == "mkdir" and made_by_b.get(change.lands, access.time + 1) <= access.time:
                        continue  # it made the folder itself first
                    if _separated(change.time, a.barriers, access.time, b.barriers):
                        continue
                    found.setdefault((change.lands, change.where, access.where), (change, access, what))
    messages = []
    for change, access, what in list(found.values())[:SHOWN_RACES]:
        shown = job[change.rank].shown(change)
        messages.append(
            f"rank {change.rank} {_VERBS[change.kind]} {shown} ({change.where}) while rank {access.rank} "
            f"{_VERBS[access.kind]} {what} ({access.where}) with no barrier between them: "
            f"whether rank {access.rank} finds it, whole or half-written, is down to timing (the original does one "
            "after the other). Call dp.barrier() on every rank between the two (after the "
            f"{change.kind}, before the {access.kind})")
    if len(found) > SHOWN_RACES:
        messages[-1] += f" ({len(found) - SHOWN_RACES} more such pairs)"
    return messages


def _separated(t_a: float, barriers_a: list[tuple[float, float]], t_b: float, barriers_b: list[tuple[float, float]]) -> bool:
    """Whether a barrier both passed orders the two events: the k-th barrier, entered by one after its event and
    left by the other before its own (the ranks meet at their k-th barrier: collectives come in the same order)."""
    for t_first, first, t_then, then in ((t_a, barriers_a, t_b, barriers_b), (t_b, barriers_b, t_a, barriers_a)):
        k = bisect.bisect_left([enter for enter, _ in first], t_first)  # the first barrier entered after the event
        if k < min(len(first), len(then)) and then[k][1] <= t_then:
            return True
    return False


def _ancestors(path: str) -> list[str]:
    found = []
    parent = os.path.dirname(path)
    while parent and parent != path and len(found) < 32:
        found.append(parent)
        path, parent = parent, os.path.dirname(parent)
    return found


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _in_working_folder(process: Process, event: Event) -> bool:
    """Inside the run's working folder, as given and where it lands (not through a link to the user's folder)."""
    return _inside(event.path, process.cwd) and _inside(event.lands, process.cwd_lands)


def _lines(events: list[Event]) -> str:
    lines = list(dict.fromkeys(e.where for e in events if e.where))
    return ", ".join(lines[:3]) + (" ..." if len(lines) > 3 else "")


def _link(process: Process, event: Event) -> str:
    """Said when the path lands outside the working folder through one of the scratch folder's links."""
    if _inside(event.path, process.cwd) and not _inside(event.lands, process.cwd_lands):
        return f" (through a link of the scratch folder, into {os.path.dirname(event.lands)}: your own folder)"
    return ""


def _original(one: Process, kind: str, shown: str) -> str:
    times = sum(1 for e in one.events if e.kind == kind and one.shown(e) == shown)
    verb = {"write": "writes", "delete": "deletes"}[kind]
    if not times:
        return f"which the original never {verb}"
    return f"where the original {verb} it from its one process"
