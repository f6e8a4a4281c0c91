"""One pass over the original tree that every rule queries instead of walking the tree again.

Why: libcst rebuilds every node it walks, even for a read-only visitor, so a walk costs about as
much as parsing. The rules used to walk the whole module once each, plus a ``m.findall`` walk per
question (about fifty per file). The index records the nodes once, in the order a visitor meets
them (pre-order), with where each subtree ends and each node's parent; a question about a subtree
is then a look-up in a list, answered in the same order ``m.findall`` would give.

Qualified names come straight from the ``ScopeProvider`` scopes, as ``QualifiedNameProvider``
computes them, but only for the nodes asked about, each once.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import heapq
from collections.abc import Iterable, Iterator
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ScopeProvider


class TreeIndex:
    """Nodes of one module in pre-order, by type, with their subtree extents and parents."""

    def __init__(self, wrapper: MetadataWrapper) -> None:
        self.wrapper = wrapper
        self.module = wrapper.module
        builder = _Builder()
        self.module.visit(builder)
        self.nodes: list[cst.CSTNode] = builder.nodes
        self.ends: list[int] = builder.ends  # nodes[i]'s subtree is nodes[i:ends[i]]
        self._order: dict[int, int] = builder.order  # id(node) -> its index in nodes
        self._parents: dict[int, cst.CSTNode] = builder.parents
        self._by_type: dict[type, list[int]] = builder.by_type
        self._scopes: Any = None
        self._qualified: dict[int, frozenset[str]] = {}
        self._identifiers: frozenset[str] | None = None
        self._possible: dict[frozenset[str], frozenset[str]] = {}

    # --- structure --------------------------------------------------------------------------------

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._parents.get(id(node))

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        node = self._parents.get(id(node))
        while node is not None:
            yield node
            node = self._parents.get(id(node))

    def contains(self, outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
        """True when ``inner`` is ``outer`` or inside it (both nodes of the indexed module)."""
        start, index = self._order.get(id(outer)), self._order.get(id(inner))
        return start is not None and index is not None and start <= index < self.ends[start]

    def findall(self, root: cst.CSTNode, matcher: Any) -> list[cst.CSTNode]:
        """What ``m.findall(root, matcher)`` returns, in the same order, without walking ``root``."""
        start = self._order.get(id(root))
        if start is None or self.nodes[start] is not root:  # not part of this module: walk it
            return list(m.findall(root, matcher))
        found = [self.nodes[i] for i in self._indices(_node_types(matcher), start, self.ends[start])]
        if _matches_any_of_its_types(matcher):
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


_LIBCST_PARTS = frozenset({"builtins", "<locals>", "<comprehension>"})


@functools.cache
def _visit_methods(visitor_class: type) -> dict[type, str]:
    """``{cst.Call: "visit_Call"}`` for the methods ``visitor_class`` defines (not CSTVisitor's stubs)."""
    own = [n for n in dir(visitor_class) if n.startswith(("visit_", "leave_"))
           and getattr(visitor_class, n) is not getattr(cst.CSTVisitor, n, None)]
    unsupported = [n for n in own if n.startswith("leave_") or not isinstance(getattr(cst, n[6:], None), type)]
    if unsupported:
        raise TypeError(
            f"{visitor_class.__name__} defines {', '.join(unsupported)}, which TreeIndex.visit does not call "
            "(only visit_<Type>); walk the tree with node.visit(visitor) instead"
        )
    return {getattr(cst, n[6:]): n for n in own}


def _node_types(matcher: Any) -> tuple[type, ...] | None:
    """The node classes ``matcher`` can match (None: any), from the matchers' own class names."""
    if isinstance(matcher, m.OneOf):
        types: list[type] = []
        for option in matcher.options:
            more = _node_types(option)
            if more is None:
                return None
            types.extend(t for t in more if t not in types)
        return tuple(types)
    node_class = getattr(cst, type(matcher).__name__, None)
    if isinstance(matcher, m.BaseMatcherNode) and isinstance(node_class, type) and issubclass(node_class, cst.CSTNode):
        return (node_class,)
    return None


def _matches_any_of_its_types(matcher: Any) -> bool:
    """``m.Call()`` or ``m.For() | m.While()``: a matcher that constrains nothing but the node type."""
    if isinstance(matcher, m.OneOf):
        return all(_matches_any_of_its_types(option) for option in matcher.options)
    return isinstance(matcher, m.BaseMatcherNode) and _node_types(matcher) is not None and all(
        getattr(matcher, field.name) is m.DoNotCare() for field in dataclasses.fields(matcher)
    )


class _Builder(cst.CSTVisitor):
    """Records nodes in pre-order with parents and subtree ends (one libcst walk)."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[cst.CSTNode] = []
        self.ends: list[int] = []
        self.order: dict[int, int] = {}
        self.parents: dict[int, cst.CSTNode] = {}
        self.by_type: dict[type, list[int]] = {}
        self._stack: list[int] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        index = len(self.nodes)
        self.nodes.append(node)
        self.ends.append(index + 1)
        self.order[id(node)] = index
        if self._stack:
            self.parents[id(node)] = self.nodes[self._stack[-1]]
        self._stack.append(index)
        self.by_type.setdefault(type(node), []).append(index)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.ends[self._stack.pop()] = len(self.nodes)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass
