"""Start the runtime once, at the start of the script's entry point."""

from __future__ import annotations

from ...codemod.entry import EntryPoint
from ...codemod.rule import Rule


class InitRuntime(Rule):
    """Call ``dp.init()`` at the start of the entry point, after the arguments are parsed.

    Why: every later runtime call needs to know this process's rank and world size, and the process
    group must exist before the model is wrapped. After ``parse_args()`` so that ``--help`` and
    argument errors start nothing.
    Example:  def main():                      def main():
                  args = parser.parse_args()  ->   args = parser.parse_args()
                  ...                              dp.init()
    Where the entry point is: see ``dpmigrate.codemod.entry``.
    Leaves alone: files that train nothing (no backward pass or optimizer step: modules of models
    and helpers, imported by the script); every runtime call starts the runtime lazily anyway.
    """

    name = "init-runtime"
    about_training = False

    def finish(self) -> None:
        entry = self.ctx.analysis(EntryPoint)
        if entry.anchor is None:
            return  # a module of models or helpers: any dp call it gets starts the runtime lazily
        statement = self.statement("{dp}.init()\n")
        if entry.after:
            self.ctx.plan.insert_after(entry.anchor, statement)
        else:
            self.ctx.plan.insert_before(entry.anchor, statement)
        where = "after the arguments are parsed" if entry.after_parsed_arguments else "at the entry point"
        self.report(entry.anchor, "change", f"dp.init() {where}: joins the job the launcher started (nothing when run plainly)")
