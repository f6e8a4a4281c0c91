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

from .index import TreeIndex
from .walk import children


def without_unused_imports(new: cst.Module, index: TreeIndex) -> tuple[cst.Module, list[tuple[cst.CSTNode, str]]]:
    """``new`` without the import aliases that only the replaced code used; (import statement, name) removed."""
    original = index.module
    bound = _imported_names(original)
    if not bound:
        return new, []
    kept_ids = {id(s) for s in new.body}
    before: Counter = Counter()
    for statement in original.body:
        if id(statement) not in kept_ids:  # a statement the plan changed: its uses before the change
            before.update(_uses_in_index(index, bound, statement))
    candidates = {name for name in bound if before[name]}
    if not candidates:
        return new, []
    total = _uses_in_index(index, candidates)
    after = _uses([s for s in new.body if not index.is_original(s)], candidates, index)
    gone = {name for name in candidates if total[name] - before[name] + after[name] == 0}
    if not gone:
        return new, []
    removed: list[tuple[cst.CSTNode, str]] = []
    body = []
    for statement in new.body:
        trimmed = _trim(statement, gone, removed) if index.is_original(statement) else statement
        if trimmed is not None:
            body.append(trimmed)
    return new.with_changes(body=body), removed


def _uses(statements, names: set[str], index: TreeIndex | None = None) -> Counter:
    """How often each of ``names`` is read or written in ``statements``, imports and attribute names aside. With
    ``index``, an original subtree inside a new statement is counted from the index (it is not walked)."""
    counts: Counter = Counter()
    stack = list(reversed(statements))
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            continue
        if index is not None and index.is_original(node):
            counts.update(_uses_in_index(index, names, node))
            continue
        if isinstance(node, cst.Name):
            if node.value in names:
                counts[node.value] += 1
            continue
        if isinstance(node, cst.Attribute):
            stack.append(node.value)  # ``torch.save``: ``torch`` is a use, the attribute name ``save`` is not
            continue
        stack.extend(reversed(children(node)))
    return counts


def _uses_in_index(index: TreeIndex, names: set[str], root: cst.CSTNode | None = None) -> Counter:
    """The same count over an original subtree (the whole module by default), from the index: no walk."""
    counts: Counter = Counter()
    for name in index.of_type(root if root is not None else index.module, cst.Name):
        if name.value not in names:
            continue
        parent = index.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            continue
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in _ancestors(index, name, 4)):
            continue
        counts[name.value] += 1
    return counts


def _ancestors(index: TreeIndex, node: cst.CSTNode, limit: int):
    for _ in range(limit):
        node = index.parent(node)
        if node is None:
            return
        yield node


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
