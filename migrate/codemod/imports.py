"""``import dpmigrate.runtime.<framework> as dp``, added by libcst's ``AddImportsVisitor``.

The visitor reads and changes only the module's leading statements (a first docstring or
``__strict__`` flag, the block of imports after it, and the statement that follows, which may get a
blank line before it), yet would walk and copy the whole module: it is given just those statements,
and the rest of the body is put back untouched. ``libcst.codemod`` (which loads ``libcst.matchers``,
about 300 ms) is imported on the first file that needs the import, never for files left as they
are. ``tests/test_engine_fast_paths.py`` checks the result against the visitor run on the whole
module, on every fixture and on layouts the fixtures lack.
"""

from __future__ import annotations

import libcst as cst

from . import patterns as m

_IMPORT_LINE = m.SimpleStatementLine(body=[m.ImportFrom() | m.Import()])
_FIRST_LINE_KEPT_FIRST = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name("__strict__"))])]) \
    | m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())])


def add_import(module: cst.Module, name: str, alias: str | None) -> cst.Module:
    """``module`` with ``import name as alias`` (``import name`` for no alias) added by ``AddImportsVisitor``."""
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor

    body = list(module.body)
    start = 1 if body and m.matches(body[0], _FIRST_LINE_KEPT_FIRST) else 0
    end = start
    while end < len(body) and m.matches(body[end], _IMPORT_LINE):
        end += 1
    head = module.with_changes(body=body[:end + 1], default_indent="    ")  # a form feed in an indent: layout only
    context = CodemodContext()
    AddImportsVisitor.add_needed_import(context, name, asname=alias)
    added = AddImportsVisitor(context).transform_module(head)
    return module.with_changes(body=[*added.body, *body[end + 1:]])
