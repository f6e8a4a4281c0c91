"""Static graph: a training step only some ranks run is a hang (its program holds the gradient all-reduce)."""

from __future__ import annotations

from ...codemod.calls import argument
from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule
from .static_common import executor_runs, program_kind, simple_assignments


class StaticRankDivergence(Rule):
    """Report ``exe.run`` of the training program under a rank condition, as ``rank-divergent-code`` does
    for the framework's collectives.

    Why: once converted (Fleet's ``minimize``, or the runtime's all-reduce ops), every run of the main
    program performs a collective: under ``if rank == 0:`` the other ranks never join it and the job
    hangs. Covers fluid's ``fleet.main_program`` too. Runs on files left unchanged as well.
    Example (error):  if dp.is_main_process():
                          exe.run(main_program, feed=feed, fetch_list=[loss])
    Leaves alone: the code (the fix needs the author's intent); runs of startup or test programs.
    """

    name = "static-rank-divergence"
    checks_only = True

    def finish(self) -> None:
        assigned = simple_assignments(self.q)
        ranks = self.ctx.analysis(RankAnalysis)
        for run in executor_runs(self.q):
            program = argument(run, 0, "program")
            value = program.value if program is not None else None
            trains = program_kind(self.q, value, assigned) in ("main", "compiled") or (
                value is not None and "fleet.main_program" in self.code(value)) or self._bound_to_fleet(value, assigned)
            guard = ranks.rank_condition(run) if trains else None
            if guard is not None:
                self.report(run, "error", f"{self.code(run.func)}(...) runs the training program, whose gradient "
                            f"all-reduce every rank must join, under `{ranks.describe(guard)}`: the other ranks "
                            "never join it and the job hangs", "run it on every rank, outside the condition (print "
                            "or save the results on one rank only)")

    def _bound_to_fleet(self, value, assigned) -> bool:
        if value is None or not hasattr(value, "value") or not isinstance(value.value, str):
            return False
        binds = assigned.get(value.value, [])
        return len(binds) == 1 and self.code(binds[0].value) == "fleet.main_program"
