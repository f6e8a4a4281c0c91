"""Where a script's entry point starts: the one place ``dp.init()`` (and what must follow it) goes.

An analysis (``ctx.analysis(EntryPoint)``) rather than a rule's private decision, because the
logging switch must go right after ``dp.init()`` and must not depend on the init rule having run.
The entry point is the ``__main__`` block when it parses the arguments, else the module top when
the script parses them there, else the function the ``__main__`` block calls (``main()``), else
that block, else the module top (after the imports) for scripts without one. Files that train
nothing (modules of models and helpers), and modules whose training functions only a script
calls, have none: importing them must not start the runtime (every ``dp`` call starts it lazily).
"""

from __future__ import annotations

import libcst as cst

from . import patterns as m
from .query import is_main_guard

PARSE_ARGS = m.Call(func=m.Attribute(attr=m.Name("parse_args") | m.Name("parse_known_args")))


class EntryPoint:
    """``anchor``: the statement to insert at; ``after``: insert after it (else before); None when the file trains nothing."""

    def __init__(self, ctx) -> None:
        self.q = ctx.query
        self.module = ctx.module
        self.anchor: cst.BaseStatement | None = None
        self.after = False
        self.parsed_by_the_caller = False  # `main(parser.parse_args())`: main's top comes after the parsing
        if self.q.is_training_script() and self._runs_something():
            _, self.anchor, self.after = self._entry_point()

    def _runs_something(self) -> bool:
        """Whether running the file trains: a ``__main__`` block, or module-level code that trains or
        calls one of the file's functions. A module of functions a script imports (``train.py`` with
        ``def train(...)``) runs nothing at import, so ``dp.init()`` must not run there either."""
        functions = set(self.q.module_functions())
        for statement in self.module.body:
            if isinstance(statement, cst.If) and is_main_guard(statement):
                return True
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or _is_import(statement):
                continue
            if self.q.trains(statement) or self.q.called_names(statement) & functions:
                return True
        return False

    @property
    def after_parsed_arguments(self) -> bool:
        if self.parsed_by_the_caller:
            return True
        return self.anchor is not None and self.after and self._parses_args(self.anchor)

    def _entry_point(self) -> tuple[cst.CSTNode, cst.BaseStatement, bool]:
        module = self.module
        guards = [s for s in module.body if isinstance(s, cst.If) and is_main_guard(s)]
        if guards:
            guard = guards[-1]
            statements = list(guard.body.body) if isinstance(guard.body, cst.IndentedBlock) else []
            parsed = _first(statements, self._parses_args)
            if parsed is None and _first(list(module.body), self._parses_args) is not None:
                return self._module_top(list(module.body))  # a script that parses at the top
            if parsed is None:
                function = self._called_function(statements)
                if function is not None and isinstance(function.body, cst.IndentedBlock):
                    return self._in_block(function.body, list(function.body.body))
            if statements:
                return self._in_block(guard.body, statements)
        return self._module_top(list(module.body))

    def _parses_args(self, statement: cst.CSTNode) -> bool:
        return isinstance(statement, cst.SimpleStatementLine) and bool(self.q.findall(statement, PARSE_ARGS))

    def _parsed_into_a_call(self, parsed: cst.BaseStatement):
        """``main(parser.parse_args())`` parses and runs the whole job in one line: after that line is
        after training, so the entry point is the top of ``main``, where the arguments are parsed."""
        body = parsed.body if isinstance(parsed, cst.SimpleStatementLine) else []
        if len(body) != 1 or not m.matches(body[0], m.Expr(m.Call(func=m.Name()))):
            return None
        function = self.q.module_functions().get(body[0].value.func.value)
        if function is None or not isinstance(function.body, cst.IndentedBlock):
            return None
        self.parsed_by_the_caller = True
        statements = list(function.body.body)
        code = [s for s in statements if not _is_docstring(s)] or statements
        return function.body, code[0], False

    def _called_function(self, statements: list[cst.BaseStatement]) -> cst.FunctionDef | None:
        functions = self.q.module_functions()
        for statement in statements:
            if _is_docstring(statement):
                continue
            if not isinstance(statement, cst.SimpleStatementLine):
                return None  # `for epoch in ...: train(epoch)` calls a step, not the entry point
            for call in self.q.findall(statement, m.Call(func=m.Name())):
                if call.func.value in functions:
                    return functions[call.func.value]
            if self.q.index.of_type(statement, cst.Call):
                return None  # `data = datautil.make_data()` first: the block itself is the entry point (a word2vec
                # script drew its data there before `train(...)`, whose top got dp.init(): after the draw)
        return None

    def _in_block(self, block, statements: list[cst.BaseStatement]):
        parsed = _first(statements, self._parses_args)
        if parsed is not None:
            return self._parsed_into_a_call(parsed) or (block, parsed, True)
        body = [s for s in statements if not _is_docstring(s)] or statements
        return block, body[0], False

    def _module_top(self, statements: list[cst.BaseStatement]):
        parsed = _first(statements, self._parses_args)
        if parsed is not None:
            return self._parsed_into_a_call(parsed) or (self.module, parsed, True)
        code = [s for s in statements if not (_is_docstring(s) or _is_import(s))]
        if code:
            return self.module, code[0], False
        return self.module, statements[-1], True


def _first(statements, predicate):
    return next((s for s in statements if predicate(s)), None)


def _is_docstring(statement: cst.CSTNode) -> bool:
    return m.matches(statement, m.SimpleStatementLine(body=[m.Expr(m.SimpleString() | m.ConcatenatedString())]))


def _is_import(statement: cst.CSTNode) -> bool:
    return m.matches(statement, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))
