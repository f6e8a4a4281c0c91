"""How the runs went on past the K compared steps (``dpmigrate verify --to-end S``).

Why: a conversion that trains like the original for K steps can still fail later: a reload after the first
``fit`` that only rank 0 wrote, a save at the end of an epoch, a collective one rank never reaches. At 3 steps such
a conversion read "equivalent" (issue 32, blind spot 6). With ``--to-end`` the harness writes its record at step K
and lets each run go on, unrecorded, to its end or for at most S seconds more (:func:`..harness.leaving.go_on`), and
writes how it ended (``end.json``: it exited, reached the bound, or ended itself with ``os._exit``, and its optimizer
steps in all). This module reads that for the original and every rank, and says:

- the conversion failed after step K where the original did not: a verdict of its own (diverges);
- the conversion made no optimizer step in the S seconds where the original made several: a hang;
- the original itself failed after step K: the comparison stands, the end is not the conversion's doing.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from . import dumps
from .harness.core import END_FILE

HANG_STEPS = 3  # the original's steps in the bound above which none on a rank reads as a hang
# a rank that made every step but did not end is a hang only when the original ended well within the bound: the N
# processes share the cores, so the conversion's end may take several times the original's (a final evaluation)
SLOWER, MARGIN_S = 4, 10.0


@dataclasses.dataclass
class End:
    """One process past step K: how it ended ("exit", "bound", "os._exit(N)", or "" when it said nothing: killed)."""

    ended: str
    steps: int | None
    seconds: float | None = None  # how long it went on past step K


def recorded_to_k(out: Path, rank: int = 0) -> bool:
    """The process wrote its record at step K (and then went on): a later failure does not void the comparison."""
    try:
        return dumps.Record.read(dumps.rank_folder(out, rank)).stop == "steps"
    except (FileNotFoundError, OSError, ValueError, KeyError):
        return False


def read(out: Path, rank: int = 0) -> End:
    try:
        data = json.loads((dumps.rank_folder(out, rank) / END_FILE).read_text())
        return End(str(data.get("ended") or ""), data.get("steps"), data.get("seconds"))
    except (OSError, ValueError):
        return End("", None)


@dataclasses.dataclass
class Ending:
    lines: list[str]  # what the report says of the runs' ends
    failure: str = ""  # the conversion failed (or hung) after step K where the original did not: the headline


def judge(k: int, bound: float, single: Path, job: Path, nproc: int, original_code: int | None,
          job_code: int | None) -> Ending:
    """The runs' ends, compared. ``original_code``/``job_code``: their exit codes (None: stopped at the time limit)."""
    one = read(single)
    ranks = [read(job, r) for r in range(nproc)]
    original = _describe("the original", [one], original_code, k, bound)
    conversion = _describe("the conversion", ranks, job_code, k, bound)
    lines = [f"{original}; {conversion}"]
    if original_code not in (0, None) or (one.ended.startswith("os._exit") and one.ended != "os._exit(0)"):
        lines.append("the original itself fails after step K: the end of the conversion is not compared")
        return Ending(lines)
    if job_code != 0:
        code = "did not end within --timeout" if job_code is None else f"failed (exit code {job_code})"
        return Ending(lines, f"the conversion {code} after step {k}, where the original "
                             f"{_went_on(one, k, bound)}: trained alike up to step {k}, then broke")
    stuck = [r for r, end in enumerate(ranks) if end.ended == "bound" and one.ended == "exit" and None not in (
        end.steps, one.steps) and end.steps >= one.steps]
    if stuck and one.seconds is not None and one.seconds * SLOWER + MARGIN_S <= bound:
        which = "every rank" if len(stuck) == nproc else "rank " + ", ".join(map(str, stuck))
        return Ending(lines, f"{which} of the conversion made all the original's {one.steps} steps but did not end "
                             f"within {bound:g} s after step {k}, where the original ran to its end: a hang after "
                             "training (a barrier or collective one rank never reaches, a wait for a file)")
    stalled = [r for r, end in enumerate(ranks) if end.ended == "bound" and end.steps is not None and end.steps <= k]
    if stalled and one.steps is not None and one.steps - k >= HANG_STEPS:
        which = "every rank" if len(stalled) == nproc else "rank " + ", ".join(map(str, stalled))
        return Ending(lines, f"{which} of the conversion made no optimizer step in the {bound:g} s after step {k}, "
                             f"where the original made {one.steps - k}: a hang (a collective or barrier one rank "
                             "never reaches, a rank waiting for a file another never writes)")
    return Ending(lines)


def _describe(who: str, ends: list[End], code: int | None, k: int, bound: float) -> str:
    kinds = {e.ended for e in ends}
    steps = sorted({e.steps for e in ends if e.steps is not None})
    counted = (f", {steps[0]} steps in all" if len(steps) == 1 else
               f", {'/'.join(str(e.steps) for e in ends)} steps in all on its ranks" if steps else "")
    if code is None:
        return f"{who} did not end within --timeout{counted}"
    if code != 0:
        return f"{who} failed after step {k} (exit code {code}){counted}"
    if kinds == {"bound"}:
        return f"{who} ran {bound:g} s past step {k} without failing (the --to-end bound){counted}"
    if kinds == {"exit"}:
        return f"{who} ran to its end{counted}"
    if kinds == {"exit", "bound"}:
        at_bound = ", ".join(str(r) for r, e in enumerate(ends) if e.ended == "bound")
        return f"{who} ran to its end on some ranks, and was stopped at the {bound:g} s bound on rank {at_bound}{counted}"
    ended = next((e.ended for e in ends if e.ended.startswith("os._exit")), "")
    return f"{who} ended itself ({ended}){counted}" if ended else f"{who} ended{counted}"


def _went_on(one: End, k: int, bound: float) -> str:
    if one.ended == "bound":
        return f"ran {bound:g} s past it without failing"
    if one.ended.startswith("os._exit"):
        return f"ended itself ({one.ended})"
    return "ran to its end" + (f" ({one.steps} steps)" if one.steps is not None else "")
