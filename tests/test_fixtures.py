"""Golden fixtures: every ``fixtures/<framework>/<case>/before.py`` converts to its checked-in ``after.py``.

``pytest tests/test_fixtures.py --update-fixtures`` rewrites ``after.py`` and ``findings.txt`` from the
current converter; review the diff before committing it.
"""

from __future__ import annotations

import pytest
from fixture_cases import cases, finding_lines, run

FRAMEWORKS = ("torch", "paddle", "tensorflow")
CASES = [case for framework in FRAMEWORKS for case in cases(framework)]
MINIMUM_CASES = {"torch": 12, "paddle": 8, "tensorflow": 12}


def _case_id(case):
    return f"{case.parent.name}/{case.name}"


@pytest.mark.parametrize("framework", sorted(MINIMUM_CASES))
def test_there_are_enough_fixtures(framework):
    names = [c.name for c in cases(framework)]
    assert len(names) >= MINIMUM_CASES[framework], names


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_fixture_converts_to_expected_output(case, update_fixtures):
    result = run(case)
    lines = finding_lines(result)
    if update_fixtures:
        (case / "after.py").write_bytes(result.output)
        (case / "findings.txt").write_text("".join(f"{line}\n" for line in lines))
    assert result.output.decode(errors="replace") == (case / "after.py").read_bytes().decode(errors="replace")
    assert result.output == (case / "after.py").read_bytes()
    assert lines == (case / "findings.txt").read_text().splitlines()


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_fixture_second_run_changes_nothing(case):
    again = run(case, "after.py")
    assert again.output == (case / "after.py").read_bytes()
    assert not [f for f in again.findings if f.severity == "change"]


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_fixture_output_compiles(case):
    compile((case / "after.py").read_bytes(), str(case / "after.py"), "exec")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_fixture_input_compiles(case):
    compile((case / "before.py").read_bytes(), str(case / "before.py"), "exec")
