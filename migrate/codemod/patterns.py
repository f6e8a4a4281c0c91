"""Tree patterns written like ``libcst.matchers`` (``Call(func=Name("len"))``), checked by plain isinstance tests.

Why not ``libcst.matchers`` itself: importing it costs about 150 ms (more than the rest of libcst),
which a pre-commit run on one small file pays every time, and each ``matches`` call goes through
its general machinery (metadata, captures, inversions) that the rules never use; matching was a
tenth of a conversion. The rules only need the subset here: a node type with some of its fields
constrained (by position in the node's field order, or by name), a literal string, ``None`` or
bool compared by equality, a list matched element by element with ``ZeroOrMore()`` wildcards,
``a | b`` for either, and ``DoNotCare()``. The semantics are those of ``libcst.matchers`` for that
subset (a pattern matches a node of exactly its class).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import libcst as cst


class _DoNotCare:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DoNotCare()"


_DO_NOT_CARE = _DoNotCare()


def DoNotCare() -> _DoNotCare:  # noqa: N802 - spelled like the libcst.matchers it replaces
    return _DO_NOT_CARE


class ZeroOrMore:
    """In a list pattern: any number (zero included) of elements of any kind."""

    __slots__ = ()


class Pattern:
    """A node of exactly ``node_type`` whose named fields match their constraints."""

    __slots__ = ("node_type", "fields")

    def __init__(self, node_type: type, fields: tuple[tuple[str, Any], ...]) -> None:
        self.node_type = node_type
        self.fields = fields

    def __or__(self, other: Pattern | OneOf) -> OneOf:
        return OneOf(self, other)

    def __repr__(self) -> str:
        return f"{self.node_type.__name__}({', '.join(f'{n}={v!r}' for n, v in self.fields)})"


class OneOf:
    """Matches what any of its options matches."""

    __slots__ = ("options",)

    def __init__(self, *options: Any) -> None:
        flat: list[Any] = []
        for option in options:
            flat.extend(option.options if isinstance(option, OneOf) else (option,))
        self.options = tuple(flat)

    def __or__(self, other: Pattern | OneOf) -> OneOf:
        return OneOf(self, other)


def matches(node: Any, pattern: Any) -> bool:
    """True when ``node`` (a node, a value, or a sequence of nodes) matches ``pattern``."""
    if pattern is _DO_NOT_CARE:
        return True
    if isinstance(pattern, Pattern):
        if type(node) is not pattern.node_type:
            return False
        for name, wanted in pattern.fields:
            if not matches(getattr(node, name), wanted):
                return False
        return True
    if isinstance(pattern, OneOf):
        return any(matches(node, option) for option in pattern.options)
    if isinstance(pattern, (list, tuple)):
        return isinstance(node, Sequence) and not isinstance(node, str) and _sequence_matches(node, pattern, 0, 0)
    if isinstance(pattern, bool):
        return node is pattern
    return node == pattern  # a string, None


def _sequence_matches(nodes: Sequence[Any], patterns: Sequence[Any], i: int, j: int) -> bool:
    if j == len(patterns):
        return i == len(nodes)
    if isinstance(patterns[j], ZeroOrMore):
        return any(_sequence_matches(nodes, patterns, k, j + 1) for k in range(i, len(nodes) + 1))
    return i < len(nodes) and matches(nodes[i], patterns[j]) and _sequence_matches(nodes, patterns, i + 1, j + 1)


def node_types(pattern: Any) -> tuple[type, ...] | None:
    """The node classes ``pattern`` can match (None: it is not a node pattern)."""
    if isinstance(pattern, OneOf):
        types: list[type] = []
        for option in pattern.options:
            more = node_types(option)
            if more is None:
                return None
            types.extend(t for t in more if t not in types)
        return tuple(types)
    return (pattern.node_type,) if isinstance(pattern, Pattern) else None


def constrains_only_type(pattern: Any) -> bool:
    """``Call()`` or ``For() | While()``: a pattern that asks nothing but the node's class."""
    if isinstance(pattern, OneOf):
        return all(constrains_only_type(option) for option in pattern.options)
    return isinstance(pattern, Pattern) and all(wanted is _DO_NOT_CARE for _, wanted in pattern.fields)


@functools.cache
def _factory(name: str):
    node_type = getattr(cst, name, None)
    if not (isinstance(node_type, type) and issubclass(node_type, cst.CSTNode)):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (no libcst node class {name})")
    field_names = tuple(f.name for f in dataclasses.fields(node_type))

    def make(*args: Any, **kwargs: Any) -> Pattern:
        if len(args) > len(field_names):
            raise TypeError(f"{name}() takes at most {len(field_names)} positional patterns, got {len(args)}")
        given = dict(zip(field_names, args))
        unknown = set(kwargs) - set(field_names)
        if unknown or set(given) & set(kwargs):
            raise TypeError(f"{name}() got unknown or repeated fields {sorted(unknown | (set(given) & set(kwargs)))}")
        given.update(kwargs)
        return Pattern(node_type, tuple((n, v) for n, v in given.items() if v is not _DO_NOT_CARE))

    make.__name__ = make.__qualname__ = name
    return make


def __getattr__(name: str):
    """``patterns.Call``, ``patterns.Name``...: a pattern factory for each libcst node class."""
    if name[:1].isupper():
        return _factory(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
