"""The documentation site's generated half (``docs/gen_pages.py``, ``dpmigrate.reporting.docs_pages``) and its build.

Each rule's docstring gives its page all four parts; the CLI reference names every option of the three parsers,
read from the parsers themselves (not from the generator); generating imports no framework; and, where MkDocs is
installed (the ``docs`` extra), ``mkdocs build --strict`` passes: no warning, broken link or broken anchor.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpmigrate.reporting.docs_pages import cli_reference, pages, rule_sections
from dpmigrate.rules import all_rules

ROOT = Path(__file__).resolve().parent.parent
RULES = all_rules()
# Set where mkdocs-material and mkdocs-gen-files (through ProperDocs) would print their notices about MkDocs 2
QUIET = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}


@pytest.mark.parametrize("rule", RULES, ids=[rule.name for rule in RULES])
def test_every_rule_docstring_gives_all_four_sections(rule):
    sections = rule_sections(rule.__doc__ or "")
    missing = [part for part, text in sections.items() if not text.strip()]
    assert not missing, (f"{rule.__module__}.{rule.__qualname__}: its docstring has no {', '.join(missing)} "
                         "(a first paragraph, then lines starting 'Why:', 'Example', 'Leaves alone:')")


def _parsers():
    from dpmigrate.cli import _parser as convert
    from dpmigrate.launch.cli import _parser as launch
    from dpmigrate.verify.cli import _parser as verify

    return [convert(), verify(), launch()]


def test_the_cli_reference_names_every_argument_of_the_three_commands():
    reference = cli_reference()
    for parser in _parsers():
        heading = f"## `{parser.prog}`"
        assert heading in reference
        section = reference.split(heading, 1)[1].split("\n## ", 1)[0]
        cells = re.findall(r"^\| `([^`]*)` \|", section, flags=re.M)  # the Argument column
        for action in parser._actions:
            names = action.option_strings or [action.metavar or action.dest]
            for name in names:
                assert any(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", cell) for cell in cells), (
                    f"{parser.prog}: {name} is not in the CLI reference's table")


def test_every_rule_has_a_page_linked_from_the_index():
    generated = pages()
    for rule in RULES:
        folder = rule.__module__.split(".")[2]
        assert f"rules/{folder}/{rule.name}.md" in generated
        assert f"]({folder}/{rule.name}.md)" in generated["rules/index.md"]


def test_generating_the_pages_imports_no_framework():
    code = ("import json, sys; from dpmigrate.reporting.docs_pages import pages; pages(); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tensorflow', 'paddle'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []


def _nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return [page for item in nav or () for page in _nav_pages(item)]


def _missing_hand_written_pages() -> list[str]:
    import yaml  # a dependency of mkdocs

    class Loader(yaml.SafeLoader):  # mkdocs.yml may hold !ENV or !!python/name tags: read them as nothing
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    docs = ROOT / config.get("docs_dir", "docs")
    generated = set(pages())
    return [page for page in _nav_pages(config["nav"]) if page not in generated and not (docs / page).is_file()]


def test_mkdocs_build_strict_passes(tmp_path):
    for module in ("mkdocs", "material", "mkdocs_gen_files"):
        pytest.importorskip(module, reason="the docs extra is not installed (pip install -e '.[docs]')")
    missing = _missing_hand_written_pages()
    if missing:
        pytest.skip(f"hand-written pages of mkdocs.yml's nav not written yet: {', '.join(missing)}")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **QUIET})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "reference" / "cli" / "index.html").is_file()
    assert (site / "rules" / "torch" / "rank-device" / "index.html").is_file()
