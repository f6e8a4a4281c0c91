"""The layout shows the flow (issue 34): at most 8 modules loose at the top of ``migrate/``, every folder of it a
package the wheel lists, so a module added at the top has to earn its place beside the CLI and the registry."""

from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11: the backport config.py reads with too
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
MAX_LOOSE = 8


def test_at_most_eight_modules_sit_loose_at_the_top_of_migrate():
    loose = sorted(p.name for p in (ROOT / "migrate").glob("*.py"))
    assert len(loose) <= MAX_LOOSE, loose


def test_every_package_folder_of_migrate_is_in_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(["dpmigrate", *p.parent.relative_to(ROOT / "migrate").parts]).rstrip(".")
               for p in (ROOT / "migrate").rglob("__init__.py")}
    folders |= {".".join(["dpmigrate", "runtime", *p.parent.relative_to(ROOT / "runtime").parts]).rstrip(".")
                for p in (ROOT / "runtime").rglob("__init__.py")}
    assert folders <= listed, sorted(folders - listed)


def test_test_modules_are_named_after_what_they_test_not_after_an_audit_round():
    """Issue 34: eight modules were named after the audit round that found their shapes (``test_rules_audit_round_q``);
    they are grouped by subject now, and ``tests/paddle_audit_rounds.md`` keeps the rounds' notes."""
    named_after_rounds = sorted(p.name for p in (ROOT / "tests").glob("test_*.py") if "round" in p.stem.split("_"))
    assert not named_after_rounds, named_after_rounds
    assert (ROOT / "tests" / "paddle_audit_rounds.md").read_text().count("## `test_") == 8
