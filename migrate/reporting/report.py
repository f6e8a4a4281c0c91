"""What a run did, as text for people and as JSON for tools; both read the same plain records.

Text (stderr by default): one line per finding, as compilers and linters print them, so editors
jump to the site; a declined site or an error carries the manual fix on the next line::

    train.py:12:5: change shard-training-loader: sharded the training DataLoader
    train.py:40:9: declined save-on-main: torch.save inside a helper function
        fix: call dp.save(obj, path) instead, on every rank
    3 files, 2 changed, 5 changes, 1 declined, 0 errors; --batch per-device: every rank reads ...; lr unchanged

JSON (``--report json``), a stable, documented object (new keys may be added, none renamed)::

    {
      "schema": "dpmigrate-report/1",
      "tool": {"name": "dpmigrate", "version": "0.1.0"},
      "mode": "write" | "check" | "diff" | "copy",
      "summary": {"files": 3, "changed": 2, "changes": 5, "declined": 1, "errors": 0,
                  "notes": 0, "not_converted": 0},
      "policy": "--batch per-device: ...; lr unchanged",
      "files": [{"path": "train.py", "framework": "torch" | null, "changed": true,
                 "left_alone": null | "already uses torch.distributed ...: left unchanged",
                 "failure": null | {"reason": "...", "line": 3 | null, "col": 7 | null}}],
      "findings": [{"path": "train.py", "line": 12, "col": 5, "rule": "...",
                    "severity": "change" | "declined" | "error" | "note",
                    "message": "...", "fix": "..." | null}]
    }

``changed`` means written for ``write`` and ``copy``, would be written for ``check`` and ``diff``; ``left_alone``
says why a whole file was left as it is (distributed by hand, starting its own processes, mixing frameworks).
Lines and columns are 1-based. Files and findings are in the run's stable path order.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from .. import __version__
from ..findings import Finding


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why a file could not be converted or written (it is left byte-identical)."""

    reason: str
    line: int | None = None
    col: int | None = None


@dataclasses.dataclass(frozen=True)
class FileResult:
    """One file's outcome, without its bytes (a large tree's results stay small)."""

    path: str
    changed: bool = False
    framework: str | None = None
    findings: tuple[Finding, ...] = ()
    failure: Failure | None = None
    left_alone: str | None = None  # why the whole file was left as it is (distributed by hand, its own processes)

    def failure_line(self) -> str:
        """``path:line:col: error: reason``, the form editors and pre-commit users read."""
        assert self.failure is not None
        where = self.path if self.failure.line is None else f"{self.path}:{self.failure.line}:{self.failure.col or 1}"
        return f"{where}: error: {self.failure.reason}"


@dataclasses.dataclass(frozen=True)
class Summary:
    files: int
    changed: int
    changes: int
    declined: int
    errors: int
    notes: int
    not_converted: int

    @classmethod
    def of(cls, results: Sequence[FileResult]) -> Summary:
        findings = [f for r in results for f in r.findings]
        count = lambda severity: sum(f.severity == severity for f in findings)  # noqa: E731
        return cls(files=len(results), changed=sum(r.changed for r in results), changes=count("change"),
                   declined=count("declined"), errors=count("error"), notes=count("note"),
                   not_converted=sum(r.failure is not None for r in results))

    def line(self) -> str:
        parts = [_plural(self.files, "file"), f"{self.changed} changed", _plural(self.changes, "change"),
                 f"{self.declined} declined", _plural(self.errors, "error")]
        if self.not_converted:
            parts.append(f"{self.not_converted} not converted")
        return ", ".join(parts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def ordered(findings: Sequence[Finding]) -> list[Finding]:
    """A file's findings by position, keeping the engine's order among equal positions."""
    return sorted(findings, key=lambda f: (f.line, f.col))


def policy_line(batch: str, scale_lr: str, findings: Sequence[Finding] | None = None) -> str:
    """The batch and learning-rate policy, said in words (N is the number of ranks), as far as the run's changes
    applied it (their ``effect``): "the global batch is N x it" only where training data was sharded, "split"
    only where a batch size was, "lr x N" only where a learning rate was scaled. Without ``findings``, the
    policy as asked."""
    effects = None if findings is None else {f.effect for f in findings if f.effect and f.severity in ("change", "note")}
    split = effects is None or "split-batch" in effects
    sharded = effects is None or bool({"shard", "split-batch"} & effects)
    said = findings is None or any(f.severity in ("note", "declined") for f in findings)
    if not sharded:
        batches = (f"--batch {batch}: no training data was sharded (every rank reads all of it, as the notes and "
                   "declined sites say)" if said else f"--batch {batch}: no training data was sharded (every rank reads all "
                   "of it)")
    elif batch == "per-device":
        batches = "--batch per-device: every rank reads the script's batch size, so the global batch is N x it"
    elif split:
        batches = "--batch global: the script's batch size is the global batch, split over the N ranks"
    else:
        batches = ("--batch global asked, but no batch size was split (the notes and declined sites say why): every "
                   "rank reads the script's batch size, so the global batch is N x it")
    if scale_lr == "none":
        rates = "lr unchanged"
    elif effects is not None and "scale-lr" not in effects:
        rates = f"lr unchanged (--scale-lr {scale_lr} asked, but no learning rate was found to scale)"
    else:
        rates = {"linear": "lr x N (--scale-lr linear)", "sqrt": "lr x sqrt(N) (--scale-lr sqrt)"}[scale_lr]
    return f"{batches}; {rates}"


def render_text(results: Sequence[FileResult], policy: str | None = None) -> str:
    """The findings, then the summary line; ``policy`` (see :func:`policy_line`) is added to it when a
    file was converted, so nobody has to guess what global batch and learning rate the job trains with."""
    lines = []
    for result in results:
        for f in ordered(result.findings):
            lines.append(f"{f.location()}: {f.severity} {f.rule}: {f.message}")
            if f.fix and f.severity in ("declined", "error"):
                lines.append(f"    fix: {f.fix}")
    summary = Summary.of(results)
    lines.append(summary.line() + (f"; {policy}" if policy and summary.changed else ""))
    return "\n".join(lines) + "\n"


def render_json(results: Sequence[FileResult], mode: str, policy: str | None = None) -> str:
    document = {
        "schema": "dpmigrate-report/1",
        "tool": {"name": "dpmigrate", "version": __version__},
        "mode": mode,
        "summary": dataclasses.asdict(Summary.of(results)),
        "policy": policy,
        "files": [
            {"path": r.path, "framework": r.framework, "changed": r.changed, "left_alone": r.left_alone,
             "failure": dataclasses.asdict(r.failure) if r.failure else None}
            for r in results
        ],
        "findings": [
            {"path": f.path, "line": f.line, "col": f.col, "rule": f.rule, "severity": f.severity,
             "message": f.message, "fix": f.fix}
            for r in results for f in ordered(r.findings)
        ],
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
