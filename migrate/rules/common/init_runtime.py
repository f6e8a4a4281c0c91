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
    With ``--sync-batchnorm`` where the framework synchronises through the runtime (torch, Paddle), the call
    is ``dp.init(dp.Strategy(sync_batchnorm=True))``.
    Leaves alone: files that train nothing (no backward pass or optimizer step: modules of models
    and helpers, imported by the script); every runtime call starts the runtime lazily anyway.
    """

    name = "init-runtime"
    about_training = False

    def finish(self) -> None:
        entry = self.ctx.analysis(EntryPoint)
        if entry.anchor is None:
            return  # a module of models or helpers: any dp call it gets starts the runtime lazily
        strategy = self.ctx.options.sync_batchnorm and self.vocabulary.sync_batchnorm == "strategy"
        statement = self.statement("{dp}.init({dp}.Strategy(sync_batchnorm=True))\n" if strategy else "{dp}.init()\n")
        if entry.after:
            self.ctx.plan.insert_after(entry.anchor, statement)
        else:
            self.ctx.plan.insert_before(entry.anchor, statement)
        where = "after the arguments are parsed" if entry.after_parsed_arguments else "at the entry point"
        said = "dp.init(dp.Strategy(sync_batchnorm=True))" if strategy else "dp.init()"
        synchronised = (" and, launched, synchronises the batch normalisation of every model dp.distributed_model wraps "
                        "(--sync-batchnorm; GPUs only: elsewhere the job stops saying so)") if strategy else ""
        self.report(entry.anchor, "change",
                    f"{said} {where}: joins the job the launcher started (nothing when run plainly){synchronised}")
