"""VisualDL's ``LogWriter`` (Paddle's TensorBoard) writing on the main process only."""

from __future__ import annotations

import libcst as cst

from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule

LOG_WRITERS = frozenset({"visualdl.LogWriter", "visualdl.writer.writer.LogWriter"})


class PaddleVisualDL(Rule):
    """Create VisualDL's ``LogWriter`` on the main process only, and call it there.

    Why: launched on N processes, every rank opens its own ``vdlrecords.*.log`` in the same ``logdir``: VisualDL
    then shows N runs of nearly the same curves, or N writers interleave in one file (issue 19).
    Example:  writer = LogWriter(logdir="./log")          ->  writer = LogWriter(logdir="./log") if dp.is_main_process() else None
              writer.add_scalar("loss", step, loss)       ->  if dp.is_main_process():
                                                                  writer.add_scalar("loss", step, loss)
    Every statement calling a method of the writer (``add_scalar``, ``add_image``, ``close``...) is guarded, so
    the other ranks never touch ``None``. Matched by qualified name (``visualdl.LogWriter``).
    Leaves alone (noted, with the fix): ``with LogWriter(...) as writer:`` and a writer kept elsewhere than in a
    plain variable (``self.writer``); writer calls whose value is kept.
    """

    name = "paddle-visualdl"
    generations = ("dygraph", "static")
    about_training = False

    def finish(self) -> None:
        writers: set[str] = set()
        q = self.q
        if not q.index.possible(LOG_WRITERS):
            return
        for call in q.index.of_type(self.ctx.module, cst.Call):
            if not q.is_call_to(call, LOG_WRITERS):
                continue
            parent = q.parent(call)
            statement = q.statement_of(call)
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name) \
                    and (escape := self._handed_on(parent.targets[0].target.value)) is not None:
                self.report(call, "declined", f"VisualDL's LogWriter `{parent.targets[0].target.value}` is handed to "
                            f"`{self.code(escape)}`, which calls it where this file cannot guard it: left on every rank, "
                            "each writes its own VisualDL log (N runs, or N writers in one file)",
                            f"create it only when {self.ctx.alias}.is_main_process() (None elsewhere) and guard its calls "
                            f"there with `if writer is not None:`")
            elif isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name):
                writers.add(parent.targets[0].target.value)
                self.ctx.plan.replace(call, lambda updated: cst.IfExp(
                    test=self.dp("is_main_process()"), body=updated, orelse=cst.Name("None"),
                    whitespace_before_if=cst.SimpleWhitespace(" "), whitespace_after_if=cst.SimpleWhitespace(" "),
                    whitespace_before_else=cst.SimpleWhitespace(" "), whitespace_after_else=cst.SimpleWhitespace(" ")))
                self.report(call, "change", f"VisualDL's LogWriter created by the main process only ({self.ctx.alias}."
                            "is_main_process(); None elsewhere): one log, not one per rank")
            else:
                how = "in a `with` block" if isinstance(statement, cst.With) else "held elsewhere than in a variable"
                self.report(call, "note", f"every rank opens its own VisualDL log ({how}): VisualDL shows N runs",
                            f"log once: create the writer only when {self.ctx.alias}.is_main_process() and call it "
                            f"under `if {self.ctx.alias}.is_main_process():`")
        for call in q.index.of_type(self.ctx.module, cst.Call):
            func = call.func
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in writers:
                self._main_process_only(call, func.value.value)

    def _handed_on(self, writer: str) -> cst.CSTNode | None:
        """The call or assignment that hands ``writer`` on (``train_per_epoch(loader, model, writer)``,
        ``self.writer = writer``): the stochastic-depth ResNet's local module called ``add_scalar`` on the None that
        the other ranks had, and rank 1 failed (issue 19 audit)."""
        for name in self.q.index.of_type(self.ctx.module, cst.Name):
            if name.value != writer:
                continue
            parent = self.q.parent(name)
            if isinstance(parent, cst.Arg):
                return self.q.parent(parent)
            if isinstance(parent, (cst.Assign, cst.Element, cst.DictElement)) and getattr(parent, "value", None) is name:
                return parent
        return None

    def _main_process_only(self, call: cst.Call, writer: str) -> None:
        statement = self.q.statement_of(call)
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Expr) and statement.body[0].value is call):
            self.report(call, "declined", f"`{writer}` is None on the other ranks, and this call is part of a larger "
                        "statement", f"call it on a line of its own under `if {self.ctx.alias}.is_main_process():`")
            return
        if self.ctx.analysis(RankAnalysis).rank_condition(call) is not None:
            return

        if self.ctx.plan.group([statement], self.main_process_only):
            self.report(call, "change", f"{writer}.{call.func.attr.value}(...) on the main process only")
