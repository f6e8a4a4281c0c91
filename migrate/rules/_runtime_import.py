"""Add ``import dpmigrate.runtime.torch as dp`` exactly where libcst's ``AddImportsVisitor`` puts it.

Why not the visitor itself: for one ``import M as A`` it reads and changes only the module's
leading statements, yet copies and walks the whole tree twice and builds two matcher visitors,
about a tenth of a whole conversion. This is its placement for that one case, byte for byte
(libcst 1.x, ``_add_imports.py``): after a docstring or ``__strict__`` line and after the first
block of import lines, with a blank line before the statement that follows; nothing at all when
that block already imports ``M`` the same way.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

_IMPORT_LINE = m.SimpleStatementLine(body=[m.ImportFrom() | m.Import()])
_FIRST_LINE_KEPT_ON_TOP = m.SimpleStatementLine(body=[
    m.Assign(targets=[m.AssignTarget(target=m.Name("__strict__"))]) | m.Expr(value=m.SimpleString()),
])


def add_import(module: cst.Module, name: str, alias: str | None) -> cst.Module:
    """``module`` with ``import name as alias`` (``import name`` when alias is None) added."""
    body = list(module.body)
    start = 1 if body and m.matches(body[0], _FIRST_LINE_KEPT_ON_TOP) else 0
    end = start
    while end < len(body) and m.matches(body[end], _IMPORT_LINE):
        end += 1
    if _already_imported(body[start:end], name, alias):
        return module
    code = f"import {name}" if alias is None else f"import {name} as {alias}"
    new = cst.parse_statement(code, config=module.config_for_parsing)
    return module.with_changes(body=(*body[:end], new, *_blank_line_before(body[end:])))


def _already_imported(imports: list[cst.SimpleStatementLine], name: str, alias: str | None) -> bool:
    aliases: dict[str, str] = {}  # as the visitor gathers them: the last alias of a module wins
    plain: set[str] = set()
    for line in imports:
        statement = line.body[0]
        if not isinstance(statement, cst.Import):
            continue
        for imported in statement.names:
            if imported.evaluated_alias is not None:
                aliases[imported.evaluated_name] = imported.evaluated_alias
            else:
                plain.add(imported.evaluated_name)
    return name in plain if alias is None else aliases.get(name) == alias


def _blank_line_before(statements: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """The statements, the first one preceded by an empty line if it has none (comments kept)."""
    if not statements:
        return statements
    first, rest = statements[0], statements[1:]
    if not first.leading_lines:
        return [first.with_changes(leading_lines=(cst.EmptyLine(),)), *rest]
    if first.leading_lines[0].comment is None:
        return statements
    return [first.with_changes(leading_lines=(cst.EmptyLine(), *first.leading_lines)), *rest]
