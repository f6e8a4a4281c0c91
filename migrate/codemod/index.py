"""One pass over the original tree that every rule queries instead of walking the tree again.

Why: libcst rebuilds every node it walks, even for a read-only visitor, so a walk costs about as
much as parsing. The rules used to walk the whole module once each, plus a ``m.findall`` walk per
question (about fifty per file). The index records the nodes once, in the order a visitor meets
them (pre-order, read from the nodes' fields: see ``walk.py``), with where each subtree ends and
each node's parent; a question about a subtree is then a look-up in a list, answered in the same
order libcst's ``m.findall`` would give. Whitespace, newlines and comments are not indexed
(``walk.NOT_INDEXED``: more than half of all nodes, and no question is about one).

Qualified names come straight from the ``ScopeProvider`` scopes, as ``QualifiedNameProvider``
computes them, but only for the nodes asked about, each once.
"""

from __future__ import annotations

import array
import bisect
import builtins
import functools
import heapq
from collections.abc import Iterable, Iterator
from typing import Any

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, ScopeProvider
from libcst.metadata.scope_provider import ImportAssignment

from . import patterns as m
from .walk import index_tree, walk


class TreeIndex:
    """Nodes of one module in pre-order, by type, with their subtree extents and parents."""

    def __init__(self, wrapper: MetadataWrapper) -> None:
        self.wrapper = wrapper
        self.module = wrapper.module
        self.nodes: list[cst.CSTNode]
        self.ends: array.array  # nodes[i]'s subtree is nodes[i:ends[i]]
        self._order: dict[int, int]  # id(node) -> its index in nodes
        self._parent_indices: array.array  # nodes[i]'s parent is nodes[_parent_indices[i]] (-1: none)
        self._by_type: dict[type, array.array]
        self.nodes, self.ends, self._order, self._parent_indices, self._by_type = index_tree(self.module)
        self._scopes: Any = None
        self._qualified: dict[int, frozenset[str]] = {}
        self._identifiers: frozenset[str] | None = None
        self._possible: dict[frozenset[str], frozenset[str]] = {}
        self._import_words: tuple[frozenset[str], frozenset[str]] | None = None
        self._defined: frozenset[str] | None = None
        self._called_only: frozenset[str] | None = None
        self._imported_only: dict[str, list[cst.Import | cst.ImportFrom]] | None = None
        self._imported_names: dict[str, frozenset[str]] = {}  # dotted name -> its qualified names, import-bound

    # --- structure --------------------------------------------------------------------------------

    def position(self, node: cst.CSTNode) -> int:
        """``node``'s place in the module's pre-order (source order): compare nodes without computing positions."""
        return self._order[id(node)]

    def follows(self, node: cst.CSTNode, earlier: cst.CSTNode) -> bool:
        """``node`` comes after the whole of ``earlier`` (its subtree) in source order."""
        return self._order[id(node)] >= self.ends[self._order[id(earlier)]]

    def is_original(self, node: cst.CSTNode) -> bool:
        """``node`` is one of the module's own nodes (a plan's output reuses every subtree it did not change)."""
        index = self._order.get(id(node))
        return index is not None and self.nodes[index] is node

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        index = self._order.get(id(node))
        if index is None or self.nodes[index] is not node:
            return None
        parent = self._parent_indices[index]
        return self.nodes[parent] if parent >= 0 else None

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        node = self.parent(node)
        while node is not None:
            yield node
            node = self.parent(node)

    def contains(self, outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
        """True when ``inner`` is ``outer`` or inside it (both nodes of the indexed module)."""
        start, index = self._order.get(id(outer)), self._order.get(id(inner))
        return start is not None and index is not None and start <= index < self.ends[start]

    def findall(self, root: cst.CSTNode, matcher: Any) -> list[cst.CSTNode]:
        """The nodes in ``root`` (itself included) that ``matcher`` (a ``patterns`` pattern) matches,
        in pre-order as libcst's ``m.findall`` gives them, without walking ``root``."""
        start = self._order.get(id(root))
        if start is None or self.nodes[start] is not root:  # not part of this module: walk it
            return [node for node in walk(root) if m.matches(node, matcher)]
        found = [self.nodes[i] for i in self._indices(m.node_types(matcher), start, self.ends[start])]
        if m.constrains_only_type(matcher):
            return found
        return [node for node in found if m.matches(node, matcher)]

    def of_type(self, root: cst.CSTNode, *types: type) -> list[cst.CSTNode]:
        """Every node of exactly one of ``types`` in ``root`` (``root`` included), in pre-order."""
        start = self._order[id(root)]
        return [self.nodes[i] for i in self._indices(types, start, self.ends[start])]

    def visit(self, visitor: cst.CSTVisitor, root: cst.CSTNode | None = None) -> None:
        """Call ``visitor``'s ``visit_<Type>`` methods in pre-order, as ``root.visit(visitor)`` would.

        A ``visit_<Type>`` returning False skips the node's children, as in libcst. Only
        ``visit_<Type>`` methods are supported: a ``leave_`` method raises, since none is called.
        """
        methods = _visit_methods(type(visitor))
        start = self._order[id(root)] if root is not None else 0
        skip_until = -1
        for i in self._indices(tuple(methods), start, self.ends[start]):
            if i < skip_until:
                continue
            node = self.nodes[i]
            if getattr(visitor, methods[type(node)])(node) is False:
                skip_until = self.ends[i]

    def _indices(self, types: Iterable[type] | None, start: int, end: int) -> Iterable[int]:
        """Pre-order indices in ``[start, end)`` of nodes of ``types`` (None: of any type), ascending."""
        if types is None:
            return range(start, end)
        slices = []
        for node_type in types:
            indices = self._by_type.get(node_type, ())
            slices.append(indices[bisect.bisect_left(indices, start):bisect.bisect_left(indices, end)])
        return slices[0] if len(slices) == 1 else heapq.merge(*slices)  # no types: nothing

    # --- names ------------------------------------------------------------------------------------

    def possible(self, names: Iterable[str]) -> frozenset[str]:
        """Those of ``names`` (or prefixes) that some node's qualified name could equal or start with.

        Every part of a qualified name is an identifier written in the file (an import's module,
        an alias's real name, an attribute, a function or class) or one of libcst's own parts
        (``builtins``, ``<locals>``, ``<comprehension>``): ``torch.distributed.barrier`` cannot
        be the name of anything in a file where no ``barrier`` is written. Asking this first lets
        a file whose rules look for names it never mentions skip the scope analysis altogether.
        """
        key = frozenset(names)
        found = self._possible.get(key)
        if found is None:
            if self._identifiers is None:
                self._identifiers = frozenset(n.value for n in self.of_type(self.module, cst.Name)) | _LIBCST_PARTS
            found = frozenset(n for n in key if all(part in self._identifiers for part in n.strip(".").split(".")))
            self._possible[key] = found
        return found

    def qualified_names_among(self, node: cst.CSTNode, names: Iterable[str]) -> frozenset[str]:
        """``qualified_names(node) & names``, without the file's scope analysis when the answer is plain.

        Empty, without resolving anything, when ``node`` cannot be any of ``names`` (see
        :meth:`_could_be`); ``{"builtins.print"}`` for a ``print(...)`` whose name the file never
        writes anywhere but as the callee of a call (nothing can bind it, so libcst resolves it to
        the builtin). Anything else is resolved as ``QualifiedNameProvider`` does.
        """
        candidates = self._could_be(node, self.possible(names))
        if not candidates:
            return frozenset()
        return self._qualified_names_cheaply(node) & candidates

    def qualified_names_under(self, node: cst.CSTNode, package: str) -> frozenset[str]:
        """The qualified names of ``node`` that are ``package`` or inside it (``"torch"``, ``"builtins"``)."""
        if not self.may_start_with(node, package):
            return frozenset()
        return frozenset(q for q in self._qualified_names_cheaply(node) if q == package or q.startswith(package + "."))

    def _qualified_names_cheaply(self, node: cst.CSTNode) -> frozenset[str]:
        if isinstance(node, cst.Name) and self._only_called(node.value):
            return frozenset({f"builtins.{node.value}"} if hasattr(builtins, node.value) else ())
        full = _full_name(node)
        imports = self._only_imported().get(full.split(".", 1)[0]) if full is not None else None
        if imports is not None and self._is_use(_root_node(node)):  # libcst's ImportAssignment names it, no scopes
            names = self._imported_names.get(full)  # (the same for every use of one dotted name)
            if names is None:
                names = self._imported_names[full] = frozenset(
                    q.name for i in imports for q in ImportAssignment("", None, i, 0, i).get_qualified_names_for(full))
            return names
        return self.qualified_names(node)

    def _only_imported(self) -> dict[str, list[cst.Import | cst.ImportFrom]]:
        """Names bound only by module-level imports and used only after them, with those imports.

        ``import torch`` / ``from torch import nn as tnn`` at the top level, and the name
        written nowhere else but as a callee, an argument, the object of an attribute, an
        attribute's or keyword's name, or the module of a ``from`` import: nothing can shadow it,
        so every scope sees exactly those imports, and libcst names ``tnn.Linear`` after them (``torch.nn.Linear``).
        """
        if self._imported_only is None:
            bound: dict[str, list[cst.Import | cst.ImportFrom]] = {}
            last_import: dict[str, int] = {}
            rejected: set[str] = set()
            for statement in self.of_type(self.module, cst.Import, cst.ImportFrom):
                top_level = not any(isinstance(a, _SCOPES) for a in self.ancestors(statement))
                for alias in () if isinstance(statement.names, cst.ImportStar) else statement.names:
                    target = alias.asname.name if alias.asname is not None else alias.name
                    if not isinstance(target, cst.Name) or not top_level:
                        rejected.add(_root_node(target).value)  # a dotted import, or one a function may shadow with
                        continue
                    bound.setdefault(target.value, []).append(statement)
                    last_import[target.value] = self._order[id(statement)]
            for name in self.of_type(self.module, cst.Name):
                if name.value not in bound or name.value in rejected:
                    continue
                parent = self.parent(name)
                if isinstance(parent, cst.ImportAlias | cst.AsName) and self._in_import_binding(name, parent):
                    continue
                if ((isinstance(parent, cst.Attribute) and parent.attr is name)  # ``x.nn`` neither binds nor reads ``nn``
                        or (isinstance(parent, cst.Arg) and parent.keyword is name)):  # nor does ``f(nn=1)``
                    continue
                used = self._is_use(name) or (isinstance(parent, cst.ImportFrom) and parent.module is name)
                if not used or self._order[id(name)] < last_import[name.value]:
                    rejected.add(name.value)
            self._imported_only = {n: i for n, i in bound.items() if n not in rejected}
        return self._imported_only

    def _is_use(self, name: cst.CSTNode) -> bool:
        """``name`` is read: a callee, an argument, the object of an attribute or subscript, an annotation, an
        operand, a test, a returned or assigned value... any place whose every child is read and none bound
        (a tuple's element is not: ``a, b = ...`` binds)."""
        parent = self.parent(name)
        if isinstance(parent, _READ_ONLY_PARENTS):
            return True
        return ((isinstance(parent, cst.Call) and parent.func is name)
                or (isinstance(parent, cst.Attribute) and parent.value is name)
                or (isinstance(parent, cst.Arg) and parent.value is name)
                or (isinstance(parent, cst.Subscript) and parent.value is name)
                or (isinstance(parent, cst.Assign) and parent.value is name))

    def _in_import_binding(self, name: cst.Name, parent: cst.ImportAlias | cst.AsName) -> bool:
        """``name`` is what an import alias binds (``import torch``, ``... as tnn``)."""
        if isinstance(parent, cst.AsName):
            return isinstance(self.parent(parent), cst.ImportAlias)
        return parent.asname is None and parent.name is name

    def may_start_with(self, node: cst.CSTNode, prefix: str) -> bool:
        """False when no qualified name of ``node`` can be or start with ``prefix`` (``"logging."``, ``"torch"``)."""
        if not self.possible((prefix,)):
            return False
        full = _full_name(node)
        if full is None:
            return True
        root = full.split(".", 1)[0]
        return root in self._parts()[1] or _first(prefix) in self._firsts(root)

    def _could_be(self, node: cst.CSTNode, names: frozenset[str]) -> frozenset[str]:
        """Those of ``names`` that a qualified name of ``node`` could be, decided from the file's words.

        libcst names a node after its dotted name (``a.b.c`` for ``a.b().c``) and what binds its
        first part, the root: an import (the import's real name, then the rest of the path), a
        builtin (``builtins.<root>``), or a definition (the enclosing classes and functions, then
        the path). So a name's last part is the node's own last part, the root, or a word of some
        import; and it starts with the root, a class or function name, ``builtins`` (for a root
        that is a builtin), or anything when an import binds the root.
        """
        full = _full_name(node)
        if not names or full is None:
            return names
        root, own = full.split(".", 1)[0], full.rsplit(".", 1)[-1]
        import_parts, import_roots = self._parts()
        firsts = None if root in import_roots else self._firsts(root)
        return frozenset(
            n for n in names
            if (n.rsplit(".", 1)[-1] in (own, root) or n.rsplit(".", 1)[-1] in import_parts)
            and (firsts is None or _first(n) in firsts)
        )

    def _parts(self) -> tuple[frozenset[str], frozenset[str]]:
        """(every word of every import, the first word of every name an import binds)."""
        if self._import_words is None:
            words: set[str] = set()
            roots: set[str] = set()
            for node in self.of_type(self.module, cst.Import, cst.ImportFrom):
                if isinstance(node, cst.ImportFrom) and node.module is not None:
                    words.update(n.value for n in self.of_type(node.module, cst.Name))
                for alias in () if isinstance(node.names, cst.ImportStar) else node.names:
                    words.update(n.value for n in self.of_type(alias, cst.Name))
                    bound = alias.asname.name if alias.asname is not None else alias.name
                    roots.update(n.value for n in self.of_type(bound, cst.Name)[:1])
            self._import_words = (frozenset(words), frozenset(roots))
        return self._import_words

    def _firsts(self, root: str) -> _Firsts:
        """What a qualified name of a node whose root no import binds can start with (a set to ask ``in``)."""
        if self._defined is None:
            self._defined = frozenset(d.name.value for d in self.of_type(self.module, cst.FunctionDef, cst.ClassDef))
        return _Firsts(self._defined, root)

    def _only_called(self, name: str) -> bool:
        """Every ``Name`` node spelling ``name`` in the file is the callee of a call (so none binds it)."""
        if self._called_only is None:
            written: set[str] = set()
            called: set[str] = set()
            for node in self.of_type(self.module, cst.Name):
                parent = self.parent(node)
                (called if isinstance(parent, cst.Call) and parent.func is node else written).add(node.value)
            self._called_only = frozenset(called - written)
        return name in self._called_only

    def qualified_names(self, node: cst.CSTNode) -> frozenset[str]:
        """The names ``QualifiedNameProvider`` gives ``node`` (``{"torch.optim.SGD"}``), computed once."""
        key = id(node)
        names = self._qualified.get(key)
        if names is None:
            if self._scopes is None:
                self._scopes = self.wrapper.resolve(ScopeProvider)
            scope = self._scopes.get(node)
            names = frozenset(q.name for q in scope.get_qualified_names_for(node)) if scope else frozenset()
            self._qualified[key] = names
        return names


# Parts of qualified names that libcst makes up: the builtins module, function and comprehension
# namespaces, and the root of an attribute on an expression that is not a name (``(a + b).abs``
# is named as if it were ``None.abs``, that is ``builtins.None``).
# Nodes none of whose children is ever bound (a name directly below one of them is read), for _is_use.
_READ_ONLY_PARENTS = (
    cst.Annotation, cst.Index, cst.Slice, cst.BinaryOperation, cst.UnaryOperation, cst.BooleanOperation,
    cst.Comparison, cst.ComparisonTarget, cst.IfExp, cst.Decorator, cst.Return, cst.Expr, cst.If, cst.While,
    cst.Assert, cst.Await, cst.Yield, cst.DictElement, cst.StarredDictElement, cst.FormattedStringExpression,
)
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
_NAMESPACES = frozenset({"<locals>", "<comprehension>"})
_LIBCST_PARTS = frozenset({"builtins", "None"}) | _NAMESPACES


class _Firsts:
    """The file's functions and classes, libcst's namespaces, ``root``, and ``builtins`` for a builtin root.

    Asked with ``in`` once or twice per node: building that union as a set per node made the
    look-up cost grow with the file, and a conversion quadratic in its length.
    """

    __slots__ = ("defined", "root")

    def __init__(self, defined: frozenset[str], root: str) -> None:
        self.defined = defined
        self.root = root

    def __contains__(self, first: str) -> bool:
        return (first in self.defined or first in _NAMESPACES or first == self.root
                or (first == "builtins" and hasattr(builtins, self.root)))


def _first(name: str) -> str:
    return name.strip(".").split(".", 1)[0]


def _root_node(node: cst.CSTNode) -> cst.CSTNode:
    """The name a dotted name starts from (``torch`` in ``torch.nn.Linear(2, 2).weight``)."""
    while isinstance(node, cst.Attribute | cst.Call | cst.Subscript):
        node = node.func if isinstance(node, cst.Call) else node.value
    return node


def _full_name(node: cst.CSTNode) -> str | None:
    """libcst's dotted name of a name, attribute, call or subscript (``a.b.c`` for ``a.b().c``), else None.

    An attribute of an expression that is not a name is ``None.<attr>``, as libcst spells it.
    """
    if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return get_full_name_for_node(node)
    return None


@functools.cache
def _visit_methods(visitor_class: type) -> dict[type, str]:
    """``{cst.Call: "visit_Call"}`` for the methods ``visitor_class`` defines (not CSTVisitor's stubs)."""
    own = []  # read from the classes' own dicts: dir() lists CSTVisitor's thousand stubs, 2 ms a class
    for klass in visitor_class.__mro__:
        if klass is cst.CSTVisitor or not issubclass(klass, cst.CSTVisitor):
            break
        own.extend(n for n in vars(klass) if n.startswith(("visit_", "leave_")) and n not in own)
    unsupported = [n for n in own if n.startswith("leave_") or not isinstance(getattr(cst, n[6:], None), type)]
    if unsupported:
        raise TypeError(
            f"{visitor_class.__name__} defines {', '.join(unsupported)}, which TreeIndex.visit does not call "
            "(only visit_<Type>); walk the tree with node.visit(visitor) instead"
        )
    return {getattr(cst, n[6:]): n for n in own}
