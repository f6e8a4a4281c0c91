"""What ``dpmigrate verify DIR/`` and ``--from LIST`` say over many scripts: a progress line as each ends, a summary
table at the end, and the counts per framework and verdict.

Each row is one script's own JSON report (:func:`.report.render_json`) with the keys ``script``, ``framework``,
``verdict``, ``headline`` and the added ``seconds``: the rows are the JSON document's ``scripts`` as they are, so the
table and the document cannot tell different stories.
"""

from __future__ import annotations

from pathlib import Path

from .report import EXIT_CODES, SEVERITY, worst

REASON_CHARS = 100


def shown(script: str) -> str:
    """The script's path as the user reads it: relative to the current folder when it lies below it."""
    path = Path(script)
    if path.is_absolute():
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return script
    return script


def reason(headline: str, width: int = REASON_CHARS) -> str:
    """The headline after its first colon (the verdict is in its own column), cut to ``width`` characters."""
    text = headline.split(":", 1)[1].strip() if ":" in headline else headline.strip()
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def progress_line(done: int, total: int, row: dict) -> str:
    """``[3/20] path/to/train.py  equivalent  (max |dw| 2.1e-07 after 3 steps (tolerance 1e-05), 14.2 s)``"""
    why = reason(row["headline"])
    return f"[{done}/{total}] {shown(row['script'])}  {row['verdict']}  ({why + ', ' if why else ''}{row['seconds']:.1f} s)"


def counts(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Scripts per framework and verdict, frameworks sorted and verdicts from the best to the worst."""
    found: dict[str, dict[str, int]] = {}
    for row in rows:
        found.setdefault(row["framework"], {}).setdefault(row["verdict"], 0)
        found[row["framework"]][row["verdict"]] += 1
    return {framework: {v: found[framework][v] for v in sorted(found[framework], key=_rank)} for framework in sorted(found)}


def _rank(verdict: str) -> int:
    return SEVERITY.index(verdict) if verdict in SEVERITY else len(SEVERITY)


def _tally(by_verdict: dict[str, int]) -> str:
    return ", ".join(f"{n} {verdict}" for verdict, n in by_verdict.items())


def render_table(rows: list[dict]) -> str:
    """One line per script (script, framework, verdict, seconds, short headline), the counts per framework, the
    totals with the worst verdict and its exit code."""
    header = ("script", "framework", "verdict", "seconds", "headline")
    cells = [(shown(r["script"]), r["framework"], r["verdict"], f"{r['seconds']:.1f}", reason(r["headline"]))
             for r in rows]
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(4)]
    lines = [f"dpmigrate verify: {len(rows)} script{'s' if len(rows) != 1 else ''}"]
    for line in [header, *cells]:
        lines.append("  " + "  ".join([line[0].ljust(widths[0]), line[1].ljust(widths[1]), line[2].ljust(widths[2]),
                                       line[3].rjust(widths[3]), line[4]]).rstrip())
    for framework, by_verdict in counts(rows).items():
        lines.append(f"{framework}: {_tally(by_verdict)}")
    overall: dict[str, int] = {}
    for row in sorted(rows, key=lambda r: _rank(r["verdict"])):
        overall[row["verdict"]] = overall.get(row["verdict"], 0) + 1
    bad = worst(r["verdict"] for r in rows)
    lines.append(f"total: {len(rows)} script{'s' if len(rows) != 1 else ''}"
                 f"{': ' + _tally(overall) if rows else ''}; worst {bad} (exit {EXIT_CODES[bad]})")
    return "\n".join(lines) + "\n"

