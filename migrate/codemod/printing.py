"""The original module printed once, statement by statement, and the converted one printed from it.

Why: a conversion used to print the whole tree three times (positions for the findings, the check
that libcst reprints the input byte for byte, the output) and parse the output again. Here the
original is printed once, remembering which tokens each top-level statement produced. The output
reuses those tokens for every top-level statement the plan left as it was (the same node object,
so the same text) and prints only the new or edited ones; positions (``positions.py``) start
from where each statement's tokens begin. The result is ``Module.code`` exactly: this follows
``Module._codegen_impl`` step by step (``tests/test_engine_fast_paths.py`` checks both over every fixture).
"""

from __future__ import annotations

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata.position_provider import NEWLINE_RE


class ModulePrint:
    """``module.code``, with the token range of each top-level statement."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.tokens, spans = _print(module, {})
        self._spans = {id(statement): (statement, start, end) for statement, start, end in spans}
        self._starts: dict[int, tuple[int, int]] | None = None
        self.code = "".join(self.tokens)

    def print(self, module: cst.Module) -> str:
        """``module.code`` for a module built from this one: unchanged top-level statements are not printed again."""
        return "".join(_print(module, self._spans, self.tokens)[0])

    def start_of(self, statement: cst.CSTNode) -> tuple[int, int] | None:
        """(line, 0-based column) where a top-level statement's first token is, or None for other nodes."""
        if self._starts is None:
            self._starts = {}
            line, column, previous = 1, 0, 0
            for key, (_, start, end) in self._spans.items():
                line, column = _advance(line, column, "".join(self.tokens[previous:start]))
                self._starts[key] = (line, column)
                line, column = _advance(line, column, "".join(self.tokens[start:end]))
                previous = end
        found = self._spans.get(id(statement))
        return self._starts[id(statement)] if found is not None and found[0] is statement else None


def _advance(line: int, column: int, text: str) -> tuple[int, int]:
    """Where the position ``(line, column)`` moves to past ``text``, as libcst's position state counts."""
    segments = NEWLINE_RE.split(text)
    if len(segments) == 1:
        return line, column + len(text)
    return line + len(segments) - 1, len(segments[-1])


def _print(module: cst.Module, known: dict, known_tokens: list[str] | None = None):
    """(tokens of ``module.code``, [(statement, first token, end token)]) as ``Module._codegen_impl`` prints.

    ``known`` maps ``id(statement)`` to ``(statement, start, end)`` in ``known_tokens``: those
    statements are copied, not printed.
    """
    state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
    tokens = state.tokens
    for line in module.header:
        line._codegen(state)
    spans = []
    for statement in module.body:
        start = len(tokens)
        found = known.get(id(statement))
        if found is not None and found[0] is statement:
            tokens.extend(known_tokens[found[1]:found[2]])
        else:
            statement._codegen(state)
        spans.append((statement, start, len(tokens)))
    for line in module.footer:
        line._codegen(state)
    if module.has_trailing_newline:
        if not tokens:
            state.add_token(state.default_newline)
    else:
        state.pop_trailing_newline()
    return tokens, spans
