"""Every converted fixture is executed on 2 processes against 1, or carries its exemption (issue 22), and the
fixture table of the contributing page (``docs/contributing.md``) says which, made from the fixtures themselves
(``tests/fixture_table.py``)."""

from pathlib import Path

from fixture_table import BEGIN, END, converted_fixtures, how, table

PAGE = Path(__file__).resolve().parent.parent / "docs" / "contributing.md"


def test_every_converted_fixture_is_executed_or_exempt_with_its_reason():
    missing = [f"{c.parent.name}/{c.name}" for c in converted_fixtures() if "no execute.json" in how(c)]
    assert not missing, f"converted fixtures with no execute.json (executed, or an exemption saying why): {missing}"


def test_the_contributing_page_shows_the_table_of_the_fixtures_as_they_are():
    text = PAGE.read_text()
    assert BEGIN in text and END in text, "docs/contributing.md lacks the fixture table (python tests/fixture_table.py)"
    shown = text[text.index(BEGIN):text.index(END) + len(END)]
    assert shown == table(), ("docs/contributing.md's fixture table is stale: paste the output of "
                              "python tests/fixture_table.py")
