"""``dpmigrate verify``'s answer: one screen of text, or the same facts as JSON (``--report json``)."""

from __future__ import annotations

import dataclasses
import json

from .compare import Comparison

SCHEMA = "dpmigrate-verify/1"

# Each verdict's exit code, and how bad it is: over several scripts the worst decides the exit status.
EXIT_CODES = {"equivalent": 0, "nothing to verify": 0, "inconclusive": 3, "error": 2, "diverges": 1}
SEVERITY = ("equivalent", "nothing to verify", "inconclusive", "error", "diverges")


def worst(verdicts) -> str:
    """The worst of several verdicts ("equivalent" for none)."""
    return max(verdicts, key=SEVERITY.index, default="equivalent")


@dataclasses.dataclass
class Outcome:
    """Everything the report says; ``comparison`` is None when the runs could not be compared."""

    script: str
    framework: str
    nproc: int
    steps: int
    tolerance: float
    verdict: str  # one of SEVERITY: "error" is "could not run"
    headline: str  # "equivalent: ...", "diverges ...", "could not run: ...", "inconclusive: ..."
    conversion: str = ""  # how the converted script was made
    original_seconds: float | None = None
    converted_seconds: float | None = None
    harness: list[str] = dataclasses.field(default_factory=list)  # what the harness changed in the runs
    comparison: Comparison | None = None
    details: list[str] = dataclasses.field(default_factory=list)  # output tail of a failed run
    ending: list[str] = dataclasses.field(default_factory=list)  # how the runs went on past step K (--to-end)
    shares: str = ""  # the shares pass: the ranks' parts of the first epoch with shuffling on (:mod:`.shares`)
    kept: str | None = None  # the work folder, when kept

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def render_text(o: Outcome) -> str:
    steps = "every optimizer step" if o.steps == 0 else f"{o.steps} optimizer step{'s' if o.steps != 1 else ''}"
    lines = [f"dpmigrate verify: {o.script} ({o.framework}): the original on 1 process against the conversion on "
             f"{o.nproc}, {steps}"]
    if o.conversion:
        lines.append(f"  conversion: {o.conversion}")
    c = o.comparison
    if o.original_seconds is not None:
        what = f"{c.original_steps} steps, {c.parameters} parameters ({c.values:,} values), " if c else ""
        lines.append(f"  original:   {what}{o.original_seconds:.1f} s")
    if o.converted_seconds is not None:
        what = ""
        if c:
            counts = sorted(set(c.converted_steps))
            what = (f"{counts[0]} steps on each of {o.nproc} ranks, " if len(counts) == 1
                    else f"{', '.join(map(str, c.converted_steps))} steps on ranks 0-{o.nproc - 1}, ")
        lines.append(f"  converted:  {what}{o.converted_seconds:.1f} s")
    if c:
        lines.append(f"  data:       {_data_line(c)}")
    if o.harness:
        lines.append(f"  harness:    {'; '.join(o.harness)}")
    if o.shares:
        lines.append(f"  shuffled:   {o.shares.removeprefix('shuffled: ')}")
    for line in o.ending:
        lines.append(f"  past K:     {line}")
    for note in c.notes if c else ():
        lines.append(f"  note:       {note}")
    lines.append(o.headline)
    if c:
        for cause in c.causes:
            lines.append(f"  likely cause ({cause.kind}): {cause.message}")
    lines.extend(f"  | {line}" for line in o.details)
    if o.kept:
        lines.append(f"  runs, logs and records kept in {o.kept}")
    return "\n".join(lines) + "\n"


def _data_line(c: Comparison) -> str:
    d = c.data
    if not d.observed:
        return "inputs not observed (no DataLoader batch or model input seen): the split is not proven"
    where = {"loader": "loader batches", "model": "model inputs", "step": "train_step batches",
             "feed": "feeds"}.get(d.source, d.source)
    if d.split == d.observed:
        original, ranks = d.sizes
        return (f"each step's {original} samples split {' + '.join(map(str, ranks))} over the ranks, disjoint "
                f"({d.split} of {d.observed} steps, {where})")
    if d.same:
        return f"every rank read the same samples at {len(d.same)} of {d.observed} steps ({where}): not sharded"
    return f"the ranks' samples split the original's batch at {d.split} of {d.observed} steps ({where}): {d.detail}"


def headline(c: Comparison, tolerance: float) -> str:
    if c.equivalent:
        return (f"equivalent: max |dw| {c.max_difference:.1e} after {c.steps} step{'s' if c.steps != 1 else ''} "
                f"(tolerance {tolerance:.0e})")
    if c.first is not None:
        return (f"diverges after step {c.first.step}: {c.first.parameter} differs by {c.first.value:.2g} (tolerance "
                f"{tolerance:.0e}); {c.differing} of {c.parameters} parameters differ")
    if c.update_differs is not None:
        u = c.update_differs
        return (f"diverges at step {u.step}: its update differs from the original's by {u.value:.0%} (most in "
                f"{u.parameter}), although the weights stay within the tolerance (max |dw| {c.max_difference:.1e}): "
                "the steps are small, the difference is not")
    if c.ranks_disagree is not None:
        return f"diverges: the ranks disagree after step {c.ranks_disagree.step} although rank 0 matches the original"
    if c.data.same:
        return (f"diverges: the weights match (max |dw| {c.max_difference:.1e}) but every rank trained on the same "
                "data")
    if c.causes and all(cause.kind == "files" for cause in c.causes):
        return (f"diverges: the weights match (max |dw| {c.max_difference:.1e}) but the ranks clash over files (a path "
                "written or deleted by several ranks, or changed by one while another reads it)")
    return f"diverges: the weights match (max |dw| {c.max_difference:.1e}) but the runs did different work"


def render_json(o: Outcome) -> str:
    data = {
        "schema": SCHEMA, "verdict": o.verdict, "exit_code": o.exit_code, "headline": o.headline, "script": o.script,
        "framework": o.framework, "nproc": o.nproc, "steps": o.steps, "tolerance": o.tolerance,
        "conversion": o.conversion, "original_seconds": o.original_seconds, "converted_seconds": o.converted_seconds,
        "harness": o.harness, "details": o.details, "kept": o.kept, "ending": o.ending,
        "shares": o.shares,
        "comparison": dataclasses.asdict(o.comparison) if o.comparison else None,
    }
    return json.dumps(data, indent=2) + "\n"
