"""The golden fixture cases: ``fixtures/<framework>/<case>/before.py`` and what goes with them.

A case holds ``before.py`` (the input, as a user wrote it), ``after.py`` (the expected output),
``findings.txt`` (the expected report, one ``line:col severity rule`` per finding), and optionally
``options.json`` (fields of :class:`dpmigrate.findings.Options`) and ``execute.json`` (the case runs
here on CPU: see ``test_fixtures_execute.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

from dpmigrate.codemod.engine import convert
from dpmigrate.findings import Conversion, Options

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def cases(framework: str = "torch") -> list[Path]:
    return sorted(p.parent for p in (FIXTURES / framework).glob("*/before.py"))


def options(case: Path, **overrides) -> Options:
    path = case / "options.json"
    fields = json.loads(path.read_text()) if path.exists() else {}
    fields.update(overrides)
    return Options(**fields)


def run(case: Path, source_name: str = "before.py", **overrides) -> Conversion:
    return convert((case / source_name).read_bytes(), source_name, options(case, **overrides))


def finding_lines(conversion: Conversion) -> list[str]:
    return [f"{f.line}:{f.col} {f.severity} {f.rule}" for f in conversion.findings]
