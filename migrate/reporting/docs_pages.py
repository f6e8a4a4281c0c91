"""The generated pages of the documentation site: the CLI reference and one page per conversion rule.

``docs/gen_pages.py`` (run by mkdocs-gen-files during ``mkdocs build``) writes what :func:`pages` returns. The
pages are made from the code itself, so they cannot drift from it: the CLI reference from the three argparse
parsers (``dpmigrate``, ``dpmigrate verify``, ``dpmigrate launch``), the rule pages from the registry
(:func:`dpmigrate.rules.all_rules`) and each rule's docstring, whose parts (``Why:``, ``Example``, ``Leaves
alone:``) the base class :class:`~dpmigrate.codemod.rule.Rule` asks for. Like ``dpmigrate --help``, generating
them imports no framework (torch, TensorFlow, Paddle): only the parsers and the rules (libcst).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re

# A section starts on a line of its own with its marker; an optional "(qualifier)" says more ("Example (note):").
_WHY = re.compile(r"Why:\s*")
_EXAMPLE = re.compile(r"Example(?:\s*\(([^)]*)\))?:\s*")
_LEAVES = re.compile(r"Leaves alone(?:\s*\(([^)]*)\))?:\s*")
# Inline code: RST's (``x``) and the Sphinx roles some docstrings use (:mod:`~dpmigrate.codemod.bindings`) in
# docstrings, markdown's (`x`) in the parsers' help
_CODE = re.compile(r"``(.+?)``|:[a-z]+:`~?([^`]+)`|`([^`]+)`")
FOLDERS = ("common", "torch", "tensorflow", "paddle")  # the folders of migrate/rules/, in the index's order


@dataclasses.dataclass(frozen=True)
class RuleDoc:
    """One rule's page: the four parts of its docstring (docstring text, RST inline code as written)."""

    name: str
    folder: str  # the folder of migrate/rules/ its class is in: common, torch, tensorflow or paddle
    source: str  # the module's path in the repository, e.g. migrate/rules/torch/rank_device.py
    class_name: str
    frameworks: tuple[str, ...]  # the frameworks whose rule set runs it
    what: str  # the first paragraph
    why: str  # after "Why:", up to "Example"
    example: str  # from the first "Example" line (kept, with its qualifier) up to "Leaves alone"
    leaves_alone: str  # after "Leaves alone:" to the end; "Leaves alone (declined): x" gives "(declined): x"

    @property
    def path(self) -> str:
        return f"rules/{self.folder}/{self.name}.md"


def rule_sections(doc: str) -> dict[str, str]:
    """``{"what", "why", "example", "leaves_alone"}`` of a rule docstring; a missing part is ``""``.

    The first paragraph is what the rule does; each other part runs from its marker to the next one, so
    the notes a docstring writes between them (matching, details) stay with the part they follow. Text
    between the first paragraph and ``Why:`` would belong to no part: ValueError, rather than lose it."""
    lines = inspect.cleandoc(doc).splitlines()
    parts: dict[str, list[str]] = {"what": [], "why": [], "example": [], "leaves_alone": []}
    current = "what"
    for line in lines:
        if current == "what" and not line.strip():
            current = "between"  # past the first paragraph; "Why:" comes next
            continue
        if _WHY.match(line) and not parts["why"]:
            current, line = "why", line[_WHY.match(line).end():]
        elif _EXAMPLE.match(line) and current in ("why", "between"):
            current = "example"
        elif (leaves := _LEAVES.match(line)) and not parts["leaves_alone"]:
            current = "leaves_alone"
            line = f"({leaves[1]}): {line[leaves.end():]}" if leaves[1] else line[leaves.end():]
        if current == "between" and line.strip():
            raise ValueError(f"text between the first paragraph and 'Why:' of a rule docstring: {line.strip()!r}")
        if current != "between":
            parts[current].append(line)
    return {key: "\n".join(value).strip() for key, value in parts.items()}


def rule_docs() -> list[RuleDoc]:
    """Every registered rule, in the registry's order (the order ``--list-rules`` prints)."""
    from ..frameworks import REGISTRY
    from ..rules import all_rules

    runs = {name: [f for f in REGISTRY.values() if name in {r.name for r in f.rule_set().RULES}]
            for name in (rule.name for rule in all_rules())}
    docs = []
    for rule in all_rules():
        module = rule.__module__.split(".")  # dpmigrate.rules.<folder>.<module>
        sections = rule_sections(rule.__doc__ or "")
        docs.append(RuleDoc(
            name=rule.name, folder=module[2], source="/".join(["migrate", *module[1:]]) + ".py",
            class_name=rule.__qualname__,
            frameworks=tuple(f.rule_set().VOCABULARY.display_name for f in runs[rule.name]), **sections,
        ))
    return docs


# --- markdown --------------------------------------------------------------------------------------


def inline(text: str, links: dict[str, str] | None = None) -> str:
    """Docstring or help text as markdown: RST inline code as code spans (a rule's name linked to its page
    when ``links`` has it), and the rest escaped, so that ``*.py``, ``rank<i>.log`` or ``[ARGS]`` show as
    written."""
    out, end = [], 0
    for match in _CODE.finditer(text):
        out.append(_escape(text[end:match.start()]))
        code = match[1] or match[2] or match[3]
        span = f"`` {code} ``" if "`" in code else f"`{code}`"
        out.append(f"[{span}]({links[code]})" if links and code in links else span)
        end = match.end()
    out.append(_escape(text[end:]))
    return "".join(out)


def _escape(text: str) -> str:
    text = re.sub(r"([\\`*_\[\]|])", r"\\\1", text)
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _code_line(line: str) -> str:
    """A line of a code block: RST inline code written plainly (backquotes show as such in a block)."""
    return _CODE.sub(lambda m: m[1] or m[2] or m[3], line)


def blocks(text: str, links: dict[str, str] | None = None) -> str:
    """A docstring part as markdown. Indented lines are code (the docstrings' examples line up the code before
    and after the change under each other): a fenced block, an ``Example (qualifier):`` label above it as
    a caption; lines at the margin are prose, joined into paragraphs."""
    out: list[str] = []
    code: list[str] = []
    prose: list[str] = []

    def flush() -> None:
        if prose:
            out.append(inline(" ".join(prose), links))
            prose.clear()
        if code:
            under = [len(line) - len(line.lstrip()) + (3 if line.lstrip().startswith("->") else 0)
                     for line in code[1:] if line.strip()]
            if under and min(under) < len(code[0]) - len(code[0].lstrip()):  # the code under a label starts left
                code[0] = " " * min(under) + code[0].lstrip()  # of it (a long "after" line): line them up
            width = min(len(line) - len(line.lstrip()) for line in code if line.strip())
            out.append("```text\n" + "\n".join(line[width:].rstrip() for line in code) + "\n```")
            code.clear()

    for line in text.splitlines():
        label = _EXAMPLE.match(line)
        if label:
            flush()
            if label[1]:
                out.append(f"*Example ({inline(label[1])}):*")
            code.append(" " * label.end() + _code_line(line[label.end():]))
        elif not line.strip():
            flush()
        elif line[0].isspace():
            if prose:
                flush()
            code.append(_code_line(line))
        else:
            if code:
                flush()
            prose.append(line.strip())
    flush()
    return "\n\n".join(out)


def _section(text: str, links: dict[str, str]) -> str:
    """A part after its marker, as a sentence: capitalised, a qualifier (``(declined): ...``) in italics."""
    qualifier = re.match(r"\(([^)]*)\):\s*", text)
    if qualifier:
        text = text[qualifier.end():]
    body = blocks(text[:1].upper() + text[1:] if not qualifier else text, links)
    if not qualifier:
        return body
    lead = f"*{inline(qualifier[1][:1].upper() + qualifier[1][1:])}:*"
    return f"{lead}\n\n{body}" if body.startswith("```") else f"{lead} {body}"


def rule_page(doc: RuleDoc, links: dict[str, str]) -> str:
    """The page of one rule, in the shape of ruff's: what it does, why, an example, what it leaves alone."""
    links = {name: target for name, target in links.items() if name != doc.name}
    return "\n".join([
        f"# {doc.name}", "",
        f"Runs for: {', '.join(doc.frameworks)}. Select or ignore it by name: `--select {doc.name}`, "
        f"`--ignore {doc.name}`.", "",
        "## What it does", "", blocks(doc.what, links), "",
        "## Why", "", _section(doc.why, links), "",
        "## Example", "", blocks(doc.example, links), "",
        "## Leaves alone", "", _section(doc.leaves_alone, links), "",
        f"Source: `{doc.source}` (class `{doc.class_name}`).", "",
    ])


def rules_index(docs: list[RuleDoc]) -> str:
    """``rules/index.md``: the rules grouped by the folder they live in, each with its summary."""
    titles = {"common": "Shared by several frameworks", "torch": "PyTorch", "tensorflow": "TensorFlow",
              "paddle": "PaddlePaddle"}
    lines = ["# Rules", "",
             "The conversion rules `dpmigrate` runs, generated from their docstrings. `dpmigrate --list-rules` "
             "lists them; `--select` and `--ignore` (or `select` and `ignore` in `[tool.dpmigrate]`) choose "
             "which run. The shared rules are one idea in every framework, read through the framework's "
             "vocabulary; each page says which frameworks run it.", ""]
    for folder in FOLDERS:
        group = [d for d in docs if d.folder == folder]
        if not group:
            continue
        lines += [f"## {titles[folder]}", "", "| Rule | What it does |", "| --- | --- |"]
        lines += [f"| [{d.name}]({folder}/{d.name}.md) | {inline(' '.join(d.what.split()))} |" for d in group]
        lines.append("")
    return "\n".join(lines)


# --- the command line ------------------------------------------------------------------------------


def parsers() -> list[argparse.ArgumentParser]:
    """The parsers of ``dpmigrate``, ``dpmigrate verify`` and ``dpmigrate launch``, as the commands build them."""
    from ..cli import _parser as convert
    from ..launch.cli import _parser as launch
    from ..verify.cli import _parser as verify

    return [convert(), verify(), launch()]


def parser_section(parser: argparse.ArgumentParser) -> str:
    """One command: its description, usage (at a fixed width, not the terminal's) and every argument's help."""

    def formatter(prog: str) -> argparse.HelpFormatter:
        return argparse.HelpFormatter(prog, width=100)

    parser.formatter_class = formatter
    help_formatter = parser._get_formatter()
    lines = [f"## `{parser.prog}`", "", inline(parser.description or ""), "",
             "```text", parser.format_usage().strip(), "```", ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS]
        if not actions:
            continue
        lines += [f"### {inline(group.title[0].upper() + group.title[1:])}", "", "| Argument | Description |", "| --- | --- |"]
        for action in actions:
            invocation = help_formatter._format_action_invocation(action)
            text = help_formatter._expand_help(action) if action.help else ""
            lines.append(f"| `{invocation}` | {inline(' '.join(text.split()))} |")
        lines.append("")
    if parser.epilog:
        lines += [inline(parser.epilog), ""]
    return "\n".join(lines)


def cli_reference() -> str:
    """``reference/cli.md``: the three commands' options, generated from their parsers."""
    sections = [parser_section(parser) for parser in parsers()]
    return "\n".join(["# CLI reference", "",
                      "Generated from the commands' own argument parsers: what `--help` prints, as one page.", "",
                      *sections])


def pages() -> dict[str, str]:
    """Every generated page: its path under ``docs/`` and its markdown."""
    docs = rule_docs()
    found: dict[str, str] = {"reference/cli.md": cli_reference(), "rules/index.md": rules_index(docs)}
    for doc in docs:
        # links are relative to the page: rules/<folder>/<name>.md -> ../<folder>/<other>.md
        links = {d.name: f"../{d.folder}/{d.name}.md" for d in docs}
        found[doc.path] = rule_page(doc, links)
    return found
