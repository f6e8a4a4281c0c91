"""``import dpmigrate.runtime.<framework> as dp`` put where libcst's ``AddImportsVisitor`` puts an import.

Why not the visitor itself: importing ``libcst.codemod`` loads ``libcst.matchers`` too, about
300 ms together, which a pre-commit run converting one small script paid for this one line; and
the visitor walks and copies the module. For the one import the engine adds (a plain ``import``,
never already there: a file importing the runtime is not converted), the visitor's placement is
these few steps of its ``_split_module``, ``_skip_first`` and ``_insert_empty_line``: after a first
docstring or ``__strict__`` flag, after the block of imports that follows, and with a blank line
before the next statement if it has none. ``tests/test_engine_fast_paths.py`` checks it against the
visitor on every fixture and on layouts the fixtures lack.
"""

from __future__ import annotations

import libcst as cst

from . import patterns as m

_IMPORT_LINE = m.SimpleStatementLine(body=[m.ImportFrom() | m.Import()])
_FIRST_LINE_KEPT_FIRST = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name("__strict__"))])]) \
    | m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())])


def add_import(module: cst.Module, name: str, alias: str | None) -> cst.Module:
    """``module`` with ``import name as alias`` (``import name`` for no alias) added, as ``AddImportsVisitor`` would."""
    body = list(module.body)
    start = 1 if body and m.matches(body[0], _FIRST_LINE_KEPT_FIRST) else 0
    end = start
    while end < len(body) and m.matches(body[end], _IMPORT_LINE):
        end += 1
    # the visitor parses its import with the module's indent, which may hold a form feed: any plain one will do
    config = module.with_changes(default_indent="    ").config_for_parsing
    new = cst.parse_statement(f"import {name}" if alias is None else f"import {name} as {alias}", config=config)
    return module.with_changes(body=[*body[:end], new, *_blank_line_before_first(body[end:])])


def _blank_line_before_first(statements: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    if not statements:
        return statements
    first = statements[0]
    if not first.leading_lines:
        return [first.with_changes(leading_lines=(cst.EmptyLine(),)), *statements[1:]]
    if first.leading_lines[0].comment is None:
        return statements
    return [first.with_changes(leading_lines=(cst.EmptyLine(), *first.leading_lines)), *statements[1:]]
