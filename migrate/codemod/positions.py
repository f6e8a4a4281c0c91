"""Where one node starts, without computing the position of every node in the file.

Why: ``PositionProvider`` prints the whole module once, recording a range for every node; the
detection note needs the position of one import, usually near the top. This prints the module
with the same position-tracking state up to the end of that node and stops there, so the answer
is the one ``PositionProvider`` gives (syntactic start, 1-based line and column) at the cost of
printing the code before it.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata.position_provider import PositionProvidingCodegenState


class _Reached(Exception):
    """Raised by the state once the target node is printed, to stop printing the rest."""


class _Ranges:
    """Stands in for the provider: the state stores every range it computes in ``_computed``."""

    def __init__(self) -> None:
        self._computed: dict[cst.CSTNode, object] = {}


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
    except (_Reached, KeyError):  # unwinding, an enclosing node may miss the range of a child never printed
        if not state.reached:
            raise
    if state.reached:
        start = ranges._computed[node].start
        return start.line, start.column + 1
    raise ValueError(f"{type(node).__name__} node is not part of the module whose position was asked for")
