"""Start the runtime once, at the start of the script's entry point."""

from __future__ import annotations

from ...codemod.entry import EntryPoint
from ...codemod.rule import Rule
from .unused_parameters import unreached_layers


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
        unreached = unreached_layers(self.ctx) if self.vocabulary.reducer_waits_for_every_gradient else []
        knobs = ", ".join((*(["sync_batchnorm=True"] if strategy else []),
                           *(["find_unused_parameters=True"] if unreached else [])))
        said = f"dp.init(dp.Strategy({knobs}))" if knobs else "dp.init()"
        statement = self.statement(said.replace("dp.", "{dp}.") + "\n")
        if entry.after:
            self.ctx.plan.insert_after(entry.anchor, statement)
        else:
            self.ctx.plan.insert_before(entry.anchor, statement)
        where = "after the arguments are parsed" if entry.after_parsed_arguments else "at the entry point"
        synchronised = (" and, launched, synchronises the batch normalisation of every model dp.distributed_model wraps "
                        "(--sync-batchnorm; GPUs only: elsewhere the job stops saying so)") if strategy else ""
        if unreached:
            first = unreached[0]
            synchronised += (f"; find_unused_parameters=True: {first.said} (line "
                             f"{self.ctx.positions[first.site].start.line}), so some steps give its parameters "
                             "no gradient and the reducer must not wait for them (without it the second step fails)")
        self.report(entry.anchor, "change",
                    f"{said} {where}: joins the job the launcher started (nothing when run plainly){synchronised}")
