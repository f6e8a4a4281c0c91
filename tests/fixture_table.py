"""The contributing page's table of converted fixtures and how each is executed, made from their ``execute.json``.

    python tests/fixture_table.py        # print the table (paste it into docs/contributing.md's fixture section)

``tests/test_fixture_table.py`` checks that the page holds exactly this table, so it never drifts from the
fixtures and the exemptions the tests read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BEGIN, END = "<!-- fixture table: python tests/fixture_table.py -->", "<!-- end of fixture table -->"


def converted_fixtures() -> list[Path]:
    """Every fixture whose conversion changes the script (``after.py`` differs from ``before.py``)."""
    return sorted(c for c in FIXTURES.glob("*/*") if (c / "before.py").exists()
                  and (c / "before.py").read_bytes() != (c / "after.py").read_bytes())


def how(case: Path) -> str:
    spec_file = case / "execute.json"
    if not spec_file.exists():
        return "not executed: **no execute.json**"
    spec = json.loads(spec_file.read_text())
    if "not_executed" in spec:
        return f"**not executed**: {spec['not_executed']}"
    if "own_test" in spec:
        return f"executed by `{spec['own_test']}`, and by verify"
    exemption = spec.get("verify")
    reference = " against its conversion run plainly" if spec.get("reference") == "converted" else ""
    shares = f"; with its shuffling on, the shares: {spec['shares']}" if "shares" in spec else ""
    if exemption is None:
        return f"verify: equivalent, data split proven{reference}{shares}"
    causes = ", ".join(exemption.get("causes", [])) or "-"
    return f"verify must say **{exemption['verdict']}** ({causes}): {exemption['why']}{shares}"


def table() -> str:
    rows = ["| fixture | how it is executed (2 processes against 1, `tests/test_fixtures_execute*.py`) |", "|---|---|"]
    rows += [f"| `{c.parent.name}/{c.name}` | {how(c)} |" for c in converted_fixtures()]
    return "\n".join([BEGIN, *rows, END])


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
