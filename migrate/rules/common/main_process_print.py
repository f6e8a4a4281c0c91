"""Print once, not once per rank."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.rule import Rule

_EXITS = {"sys.exit", "builtins.exit", "builtins.quit", "os._exit"}


class MainProcessPrint(Rule):
    """Replace ``print(...)`` with ``dp.print(...)``, which prints on the main process only.

    Why: launched on N processes every line of the log appears N times, interleaved.
    Example:  print('Train Epoch: {}'.format(epoch))  ->  dp.print('Train Epoch: {}'.format(epoch))
    Matched by qualified name (``builtins.print``): a ``print`` the script defines itself is kept.
    Also in a helper module converted with the script that imports it (its set-up prints showed once per rank:
    round G of issue 19's audit); on one process ``dp.print`` prints as ``print`` does, for any other importer.
    Leaves alone: files that train nothing and no script of the run imports; prints to a file
    (``file=sys.stderr``...) and prints followed by ``sys.exit`` or
    ``raise`` (error messages, e.g. argument errors): every rank should still show those.
    """

    name = "main-process-print"
    about_training = False

    def visit_Module(self, node: cst.Module) -> bool:
        # a module no converted script imports may serve other programs: left alone
        return self.q.is_training_script() or self.ctx.options.importer_seeds is not None

    def visit_Call(self, node: cst.Call) -> None:
        if not self.q.is_call_to(node, {"builtins.print"}):
            return
        if any(a.keyword is not None and a.keyword.value == "file" for a in node.args) or self._before_exit(node):
            return
        statement = self.q.statement_of(node)
        if self._prints_itself(node) and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            self.ctx.plan.group([statement], self.main_process_only)  # dp.print would still run summary() everywhere
            self.report(node, "change", "print of a summary run by the main process only (under `if dp.is_main_process():`): "
                        "summary() prints its own table before it returns")
            return
        self.ctx.plan.replace(node, lambda updated: updated.with_changes(func=self.dp_attribute("print")))
        self.report(node, "change", "print -> dp.print: printed once, by the main process")

    def _prints_itself(self, node: cst.Call) -> bool:
        """``print(model.summary())``: Paddle's ``summary`` prints its layer table itself (an image classifier's table
        showed on every rank, round O)."""
        return any(isinstance(c.func, cst.Attribute) and c.func.attr.value == "summary"
                   or self.q.is_call_to(c, {"paddle.summary"}) for a in node.args for c in self.q.findall(a, m.Call()))

    def _before_exit(self, node: cst.Call) -> bool:
        statement = self.q.statement_of(node)
        block = self.q.block_of(statement) if statement is not None else None
        if block is None:
            return False
        body = list(block.body)
        following = body[body.index(statement) + 1:]
        if not following:
            return False
        after = following[0]
        if not isinstance(after, cst.SimpleStatementLine):
            return False  # a `try:` whose `except` exits is no error message of this print's (round Q: every rank
        if m.matches(after, m.SimpleStatementLine(body=[m.Raise()])):  # printed "Starting to load data...")
            return True
        return any(self.q.is_call_to(c, _EXITS) for c in self.q.findall(after, m.Call()))
