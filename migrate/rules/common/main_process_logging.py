"""Log once, not once per rank."""

from __future__ import annotations

from ...codemod import patterns as m
from ...codemod.entry import EntryPoint
from ...codemod.rule import Rule

_LOGGING_CALLS = m.Call(func=m.Attribute(attr=m.Name()) | m.Name())


class MainProcessLogging(Rule):
    """After ``dp.init()``, silence ``logging`` below ERROR on every rank but the main process.

    Why: launched on N processes every log record appears N times. One switch after ``dp.init()``
    covers every logger (root, module loggers, libraries) without touching each call; errors and
    critical records still come from every rank, since those are the ones that explain a failure.
    Example:  dp.init()
           -> dp.init()
              if not dp.is_main_process():
                  logging.disable(logging.WARNING)
    Added only when the script uses the ``logging`` module (by qualified name).
    Leaves alone: scripts that import logging under another name or only ``from logging import
    ...`` (declined: add the two lines by hand, after ``dp.init()``).
    """

    name = "main-process-logging"
    about_training = False

    def finish(self) -> None:
        first = next((c for c in self.q.findall(self.ctx.module, _LOGGING_CALLS)
                      if self.q.callee_starts_with(c, "logging.")), None)
        entry = self.ctx.analysis(EntryPoint)
        if first is None or entry.anchor is None:  # no logging, or not a training script
            return
        if not self._imports_logging():
            self.report(
                first, "declined", "the logging module is not imported as `logging`, so no switch was added",
                "after dp.init(), add: if not dp.is_main_process(): logging.disable(logging.WARNING)",
            )
            return
        anchor, after = entry.anchor, entry.after
        block = self.statement("if not {dp}.is_main_process():\n    logging.disable(logging.WARNING)\n")
        if after:
            self.ctx.plan.insert_after(anchor, block)
        else:
            self.ctx.plan.insert_before(anchor, block)
        self.report(first, "change", "logging: records below ERROR are kept on the main process only "
                    "(logging.disable on the other ranks, after dp.init())")

    def _imports_logging(self) -> bool:
        for statement in self.q.findall(self.ctx.module, m.Import()):
            for alias in statement.names:
                if m.matches(alias, m.ImportAlias(name=m.Name("logging"), asname=None)):
                    return True
        return False
