"""The edits the rules ask for, recorded against the original tree and applied in one pass.

Why a plan rather than one transformer per rule: every rule then reads the *original* module with
its metadata (qualified names, scopes, and positions that are those of the input file, as reports
need), and edits to nested nodes compose: a rule's replacement receives the node as already
rewritten by earlier rules (``dp.distributed_optimizer(...)`` wraps a call whose ``lr=`` another
rule rewrote). Edits are keyed by node identity, so two equal-looking nodes are never confused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Callable

import libcst as cst

from .index import TreeIndex

Replacement = Callable[[cst.CSTNode], cst.CSTNode]
Wrapper = Callable[[Sequence[cst.BaseStatement]], cst.BaseStatement]


@dataclasses.dataclass
class _Group:
    statements: tuple[cst.BaseStatement, ...]
    wrapper: Wrapper


class Plan:
    """Replacements, insertions, removals and groupings of statements, applied by :func:`apply`."""

    def __init__(self) -> None:
        self._replace: dict[cst.CSTNode, list[Replacement]] = {}
        self._before: dict[cst.CSTNode, list[cst.BaseStatement]] = {}
        self._after: dict[cst.CSTNode, list[cst.BaseStatement]] = {}
        self._remove: set[cst.CSTNode] = set()
        self._groups: dict[cst.CSTNode, _Group] = {}
        self._grouped: set[cst.CSTNode] = set()
        self.needs_runtime_import = False  # set by whoever builds code that names the runtime
        self.standard_imports: set[str] = set()  # standard-library modules the new code names (``os`` for os.devnull)

    def replace(self, node: cst.CSTNode, replacement: Replacement) -> None:
        """Rewrite ``node``; ``replacement`` gets it as earlier edits (inner ones included) left it."""
        self._replace.setdefault(node, []).append(replacement)

    def insert_before(self, statement: cst.BaseStatement, *new: cst.BaseStatement) -> None:
        self._before.setdefault(statement, []).extend(new)

    def insert_after(self, statement: cst.BaseStatement, *new: cst.BaseStatement) -> None:
        self._after.setdefault(statement, []).extend(new)

    def remove(self, statement: cst.BaseStatement) -> None:
        self._remove.add(statement)

    def group(self, statements: Sequence[cst.BaseStatement], wrapper: Wrapper) -> bool:
        """Replace consecutive sibling statements by ``wrapper(their rewritten forms)``.

        Returns False (and records nothing) when one of them is already grouped.
        """
        if any(s in self._grouped for s in statements):
            return False
        self._groups[statements[0]] = _Group(tuple(statements), wrapper)
        self._grouped.update(statements)
        return True

    def is_replaced(self, node: cst.CSTNode) -> bool:
        return node in self._replace

    def is_removed(self, statement: cst.CSTNode) -> bool:
        return statement in self._remove

    @property
    def empty(self) -> bool:
        return not (self._replace or self._before or self._after or self._remove or self._groups)


def apply(module: cst.Module, plan: Plan, index: TreeIndex | None = None) -> cst.Module:
    """Return ``module`` with every edit of ``plan`` made (``module`` is the tree the rules read).

    With the module's ``index``, only the paths from the root to the edited nodes are walked
    (libcst rebuilds every node it walks; the untouched subtrees are kept as they are).
    """
    if plan.empty:
        return module
    return module.visit(_Applier(plan, None if index is None else _paths_to_edits(plan, index)))


def _paths_to_edits(plan: Plan, index: TreeIndex) -> set[int]:
    """ids of the edited nodes, of the blocks whose statements change, and of all their ancestors."""
    statements = [*plan._before, *plan._after, *plan._remove, *plan._grouped]
    targets = [*plan._replace, *(index.parent(s) for s in statements)]
    needed: set[int] = set()
    for target in targets:
        for node in (target, *index.ancestors(target)) if target is not None else ():
            if id(node) in needed:
                break  # its ancestors are in already
            needed.add(id(node))
    return needed


class _Applier(cst.CSTTransformer):
    def __init__(self, plan: Plan, needed: set[int] | None) -> None:
        super().__init__()
        self.plan = plan
        self.needed = needed  # None: walk everything

    def on_visit(self, node):
        return self.needed is None or id(node) in self.needed

    def on_leave(self, original_node, updated_node):
        for replacement in self.plan._replace.get(original_node, ()):
            updated_node = replacement(updated_node)
        if isinstance(original_node, (cst.Module, cst.IndentedBlock)) and isinstance(
            updated_node, type(original_node)
        ):
            updated_node = self._rebuild_body(original_node, updated_node)
        return updated_node

    def _rebuild_body(self, original, updated):
        plan = self.plan
        if len(original.body) != len(updated.body):  # a replacement changed the block itself
            return updated
        rewritten = dict(zip(map(id, original.body), updated.body))
        body: list[cst.BaseStatement] = []
        orphans: list[cst.EmptyLine] = []  # comments of removed statements, for the next one kept
        for old in original.body:
            before = plan._before.get(old, ())
            if before:
                rewritten[id(old)] = _insert_before(before, rewritten[id(old)], body)
            if old in plan._remove or (old in plan._grouped and old not in plan._groups):
                if old in plan._remove:
                    orphans.extend(_comments_of(old))
                body.extend(plan._after.get(old, ()))
                continue
            statement = group.wrapper([rewritten.get(id(s), s) for s in group.statements]) if (
                group := plan._groups.get(old)) is not None else rewritten[id(old)]
            if orphans:
                statement = _with_leading_comments(statement, orphans)
                orphans = []
            body.append(statement)
            body.extend(plan._after.get(old, ()))
        if not body and isinstance(updated, cst.IndentedBlock):
            body = [cst.SimpleStatementLine([cst.Pass()])]
        orphans = [line for line in orphans if line.comment is not None]
        if orphans:  # the block ended with removed statements: their comments close it
            return updated.with_changes(body=body, footer=[*orphans, *updated.footer])
        return updated.with_changes(body=body)


def _comments_of(statement: cst.BaseStatement) -> list[cst.EmptyLine]:
    """The lines above a statement (blank ones only before its first comment) and the comment at the
    end of its line, as comment lines: what the next statement kept inherits."""
    leading = list(getattr(statement, "leading_lines", ()))
    blank = 0
    while blank < len(leading) and leading[blank].comment is None:
        blank += 1
    lines = leading[:blank] + [line for line in leading[blank:] if line.comment is not None]
    trailing = getattr(statement, "trailing_whitespace", None)
    if trailing is None and isinstance(getattr(statement, "body", None), cst.IndentedBlock):
        trailing = statement.body.header  # `if ...:  # comment`
    if trailing is not None and trailing.comment is not None:
        lines.append(cst.EmptyLine(comment=trailing.comment))
    return lines


def _with_leading_comments(statement: cst.BaseStatement, comments: list[cst.EmptyLine]) -> cst.BaseStatement:
    """``statement`` with ``comments`` after its own blank lines, before its own comments.

    Blank lines that opened the removed statements are kept only when ``statement`` has none of its
    own, so a removal neither glues two paragraphs together nor doubles a gap.
    """
    lines = list(getattr(statement, "leading_lines", ()))
    blank = 0
    while blank < len(lines) and lines[blank].comment is None:
        blank += 1
    opening = 0
    while opening < len(comments) and comments[opening].comment is None:
        opening += 1
    inherited = comments if blank == 0 else comments[opening:]
    if blank == 0 and opening == 0 and inherited:
        return statement.with_changes(leading_lines=[*inherited, *lines])
    return statement.with_changes(leading_lines=[*lines[:blank], *inherited, *lines[blank:]])


def _insert_before(new: Sequence[cst.BaseStatement], statement: cst.BaseStatement, body: list) -> cst.BaseStatement:
    """Put ``new`` in ``body`` where ``statement`` begins: after its blank lines, before its comments.

    Returns ``statement`` without the blank lines it gave away.
    """
    lines = list(getattr(statement, "leading_lines", ()))
    blank = 0
    while blank < len(lines) and lines[blank].comment is None:
        blank += 1
    first, *rest = new
    body.append(first.with_changes(leading_lines=lines[:blank]) if hasattr(first, "leading_lines") else first)
    body.extend(rest)
    return statement.with_changes(leading_lines=lines[blank:]) if blank else statement
