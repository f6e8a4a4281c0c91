"""Start the runtime once, at the start of the script's entry point."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ._base import Rule
from ._query import is_main_guard

PARSE_ARGS = m.Call(func=m.Attribute(attr=m.Name("parse_args") | m.Name("parse_known_args")))


class InitRuntime(Rule):
    """Call ``dp.init()`` at the start of the entry point, after the arguments are parsed.

    Why: every later runtime call needs to know this process's rank and world size, and the process
    group must exist before the model is wrapped. After ``parse_args()`` so that ``--help`` and
    argument errors start nothing.
    Example:  def main():                      def main():
                  args = parser.parse_args()  ->   args = parser.parse_args()
                  ...                              dp.init()
    The entry point is the ``__main__`` block when it parses the arguments, else the module top when
    the script parses them there, else the function the ``__main__`` block calls (``main()``), else
    that block, else the module top (after the imports) for scripts without one.
    Leaves alone: files that train nothing (no ``backward()`` or optimizer step: modules of models
    and helpers, imported by the script); every runtime call starts the runtime lazily anyway.
    """

    name = "init-runtime"

    def finish(self) -> None:
        if not self.q.is_training_script():
            return  # a module of models or helpers: any dp call it gets starts the runtime lazily
        _, anchor, after = self._entry_point()
        statement = self.statement("{dp}.init()\n")
        if after:
            self.ctx.plan.insert_after(anchor, statement)
        else:
            self.ctx.plan.insert_before(anchor, statement)
        self.ctx.facts["init_anchor"] = (anchor, after)
        where = "after the arguments are parsed" if self._parses_args(anchor) and after else "at the entry point"
        self.report(anchor, "change", f"dp.init() {where}: joins the job the launcher started (nothing when run plainly)")

    def _entry_point(self) -> tuple[cst.CSTNode, cst.BaseStatement, bool]:
        module = self.ctx.module
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

    def _called_function(self, statements: list[cst.BaseStatement]) -> cst.FunctionDef | None:
        functions = self.q.module_functions()
        for statement in statements:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue  # `for epoch in ...: train(epoch)` calls a step, not the entry point
            for call in self.q.findall(statement, m.Call(func=m.Name())):
                if call.func.value in functions:
                    return functions[call.func.value]
        return None

    def _in_block(self, block, statements: list[cst.BaseStatement]):
        parsed = _first(statements, self._parses_args)
        if parsed is not None:
            return block, parsed, True
        body = [s for s in statements if not _is_docstring(s)] or statements
        return block, body[0], False

    def _module_top(self, statements: list[cst.BaseStatement]):
        parsed = _first(statements, self._parses_args)
        if parsed is not None:
            return self.ctx.module, parsed, True
        code = [s for s in statements if not (_is_docstring(s) or _is_import(s))]
        if code:
            return self.ctx.module, code[0], False
        return self.ctx.module, statements[-1], True


def _first(statements, predicate):
    return next((s for s in statements if predicate(s)), None)


def _is_docstring(statement: cst.CSTNode) -> bool:
    return m.matches(statement, m.SimpleStatementLine(body=[m.Expr(m.SimpleString() | m.ConcatenatedString())]))


def _is_import(statement: cst.CSTNode) -> bool:
    return m.matches(statement, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))
