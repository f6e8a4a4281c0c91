"""Where nodes are, computed only for the top-level statements that hold a node something asks about.

Why: ``PositionProvider`` prints the whole module once, recording a range for every node, while
a file's findings are a few nodes. :class:`Positions` prints just the top-level statement that
holds the node, with libcst's own position-tracking state started where that statement begins in
the file (from :class:`~.printing.ModulePrint`), so a range is exactly what ``PositionProvider``
gives (``tests/test_engine_fast_paths.py`` compares every node of every fixture). ``start_of`` answers for
one node without any of that: it prints the module up to that node and stops (detection asks for
one import, usually near the top).
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

from .index import TreeIndex
from .printing import ModulePrint


class _Reached(Exception):
    """Raised by the state once the target node is printed, to stop printing the rest."""


class _Ranges:
    """Stands in for the provider: the state stores every range it computes in ``_computed``."""

    def __init__(self) -> None:
        self._computed: dict[cst.CSTNode, CodeRange] = {}


class _UpToNode(PositionProvidingCodegenState):
    target: object = None
    reached: bool = False

    def after_codegen(self, node: cst.CSTNode) -> None:
        PositionProvidingCodegenState.after_codegen(self, node)  # zero-argument super() breaks on slotted classes
        if node is self.target:
            self.reached = True
            raise _Reached


def start_of(module: cst.Module, node: cst.CSTNode) -> tuple[int, int]:
    """(line, column), both 1-based, where ``node`` of ``module`` starts, as ``PositionProvider`` gives it."""
    ranges = _Ranges()
    state = _UpToNode(default_indent=module.default_indent, default_newline=module.default_newline, provider=ranges)
    state.target = node
    try:
        module._codegen(state)
    except (_Reached, KeyError) as exc:  # unwinding, an enclosing node may miss the range of a child never printed
        _raise_interrupt_behind(exc)
        if not state.reached:
            raise
    if state.reached:
        start = ranges._computed[node].start
        return start.line, start.column + 1
    raise ValueError(f"{type(node).__name__} node is not part of the module whose position was asked for")


class Positions:
    """``PositionProvider``'s ranges (``positions[node]``), computed one top-level statement at a time."""

    def __init__(self, wrapper: MetadataWrapper, index: TreeIndex, printed: ModulePrint) -> None:
        self.wrapper = wrapper
        self.index = index
        self.printed = printed
        self._ranges = _Ranges()

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        found = self._ranges._computed.get(node)
        if found is None:
            self._compute(node)
            found = self._ranges._computed[node]
        return found

    def _compute(self, node: cst.CSTNode) -> None:
        top = node
        for ancestor in self.index.ancestors(node):
            if isinstance(ancestor, cst.Module):
                break
            top = ancestor
        start = self.printed.start_of(top)
        if start is None:  # the module itself, or a comment line of its header or footer
            self._ranges._computed.update(self.wrapper.resolve(PositionProvider))
            return
        module = self.printed.module
        state = PositionProvidingCodegenState(
            default_indent=module.default_indent, default_newline=module.default_newline, provider=self._ranges,
        )
        state.line, state.column = start
        try:
            top._codegen(state)
        except KeyError as exc:
            _raise_interrupt_behind(exc)
            raise


def _raise_interrupt_behind(exc: BaseException) -> None:
    """Raise the interrupt (Ctrl-C, ``kill``: not an ``Exception``) that ``exc`` replaced, if any.

    libcst's position state looks up the ranges of a node's children in a ``finally``: a signal
    raised mid-print (the CLI turns SIGINT into ``Interrupted``) left a child without a range, and
    the ``KeyError`` from that ``finally`` replaced the interrupt, which then reached the engine as a
    rule's bug and the run went on (``tests/test_cli_signals.py``, serial Ctrl-C, about 1 run in 7).
    """
    context = exc.__context__
    while context is not None:
        if not isinstance(context, Exception):
            raise context.with_traceback(context.__traceback__) from None
        context = context.__context__
