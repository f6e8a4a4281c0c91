"""Imports whose last use the conversion replaced are removed (``from torch.nn import DataParallel`` once the
``DataParallel(model)`` it named became ``dp.distributed_model(model)``).

Only names the input used and the output no longer does: an import the script never used stays (it was
the script's own choice), and so does everything the conversion did not touch. Counted on the top-level
statements the plan changed (unchanged ones are the original's very objects, with the original's counts), so a
large file costs nothing more than its edited statements. Module-level ``from ... import name`` aliases only:
``import module`` stays (importing a module may set something up), as do star imports and ``__future__``.
"""

from __future__ import annotations

from collections import Counter

import libcst as cst


def without_unused_imports(new: cst.Module, original: cst.Module) -> tuple[cst.Module, list[tuple[cst.CSTNode, str]]]:
    """``new`` without the import aliases that only the replaced code used; (import statement, name) removed."""
    unchanged = {id(s) for s in original.body}
    changed_new = [s for s in new.body if id(s) not in unchanged]
    kept_ids = {id(s) for s in new.body}
    changed_old = [s for s in original.body if id(s) not in kept_ids]
    before = _uses(changed_old)
    after = _uses(changed_new)
    total = _uses(original.body)
    bound = _imported_names(original)
    gone = {name for name in bound if total[name] and before[name] and total[name] - before[name] + after[name] == 0}
    if not gone:
        return new, []
    removed: list[tuple[cst.CSTNode, str]] = []
    body = []
    for statement in new.body:
        trimmed = _trim(statement, gone, removed) if id(statement) in unchanged else statement
        if trimmed is not None:
            body.append(trimmed)
    return new.with_changes(body=body), removed


def _uses(statements) -> Counter:
    """How often each name is read or written outside import statements."""
    counts: Counter = Counter()

    class Names(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> bool:
            return False

        def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
            return False

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)  # ``torch.save``: ``torch`` is a use, the attribute name ``save`` is not
            return False

        def visit_Name(self, node: cst.Name) -> None:
            counts[node.value] += 1

    for statement in statements:
        statement.visit(Names())
    return counts


def _imported_names(module: cst.Module) -> set[str]:
    names = set()
    for statement in module.body:
        for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
            for alias in _aliases(small):
                names.add(_bound(alias))
    return names


def _aliases(small: cst.BaseSmallStatement) -> list[cst.ImportAlias]:
    """The names a ``from module import name`` binds (``import module`` stays: importing a module may do something)."""
    if (isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar) and not small.relative
            and not (isinstance(small.module, cst.Name) and small.module.value == "__future__")):
        return list(small.names)
    return []


def _bound(alias: cst.ImportAlias) -> str:
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    name = alias.name
    while isinstance(name, cst.Attribute):
        name = name.value
    return name.value if isinstance(name, cst.Name) else ""


def _trim(statement: cst.BaseStatement, gone: set[str], removed: list) -> cst.BaseStatement | None:
    """The import statement without the aliases of ``gone`` (None when nothing of it is left; kept whole when a
    comment sits on it or above it, so no comment is lost)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return statement
    small = statement.body[0]
    aliases = _aliases(small)
    if not aliases:
        return statement
    keep = [a for a in aliases if _bound(a) not in gone]
    if len(keep) == len(aliases):
        return statement
    commented = any(line.comment is not None for line in statement.leading_lines) or (
        statement.trailing_whitespace.comment is not None)
    if not keep and commented:
        return statement
    removed.extend((statement, _bound(a)) for a in aliases if _bound(a) in gone)
    if not keep:
        return None
    keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return statement.with_changes(body=[small.with_changes(names=keep)])
