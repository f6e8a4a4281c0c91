"""Log once, not once per rank."""

from __future__ import annotations

import libcst as cst

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
        if entry.anchor is None:  # not a training script
            return
        if first is None:
            self._through_local_modules(entry)
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

    def _through_local_modules(self, entry) -> None:
        """A script that logs only through a local module's logger (``logger = get_logger(...)`` of
        ``utils.py``, which imports ``logging``): the same switch, importing ``logging`` where it is used
        (image_classification_paddle, issue 19 audit: both ranks wrote every line of its log file)."""
        wanted = set(self.ctx.options.local_logging)
        site = next((s for s in self.q.findall(self.ctx.module, m.Import() | m.ImportFrom())
                     if wanted and _top_module(s) in wanted and self.q.function_of(s) is None), None)
        if site is None:
            return
        block = self.statement("if not {dp}.is_main_process():\n    import logging\n"
                               "    logging.disable(logging.WARNING)\n")
        if entry.after:
            self.ctx.plan.insert_after(entry.anchor, block)
        else:
            self.ctx.plan.insert_before(entry.anchor, block)
        self.report(site, "change", f"logging: the local module `{_top_module(site)}` logs (it imports logging); "
                    "records below ERROR are kept on the main process only (logging.disable on the other ranks, "
                    "after dp.init())")

    def _imports_logging(self) -> bool:
        for statement in self.q.findall(self.ctx.module, m.Import()):
            for alias in statement.names:
                if m.matches(alias, m.ImportAlias(name=m.Name("logging"), asname=None)):
                    return True
        return False


def _top_module(statement) -> str | None:
    """``utils`` of ``import utils.log``, ``from utils import get_logger`` (relative imports: None)."""
    if isinstance(statement, cst.ImportFrom):
        if statement.relative or statement.module is None:
            return None
        node = statement.module
    else:
        node = statement.names[0].name
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None
