"""Static-graph and fluid training loops that stop on this rank's own figure: as ``local-stop`` for dygraph."""

from __future__ import annotations

import libcst as cst

from ...codemod.ranks import RankAnalysis
from ..common.local_stop import LocalStop, _AllRanks
from .graph_mode import stands_down
from .static_common import executor_runs, minimize_calls, program_kind, simple_assignments


class StaticLocalStop(LocalStop):
    """Make a ``break`` out of a loop that runs the training program, decided by a value the loop computes, agree.

    Why: the shared ``local-stop`` knows a training loop by its ``backward()``; a static-graph loop trains by
    ``exe.run(main_program, ...)``, so ``if test_metrics[0] < 10.0: break`` (the Paddle book's fit_a_line) went
    unreported while each trainer decides on its own figure: one stops, the others wait in the next step's
    all-reduce (issue 19). Static graph (the runtime): the test reads ``dp.all_reduce(value)``, the mean over
    the ranks, as ``local-stop`` does. Fluid 1.x (Fleet, no runtime): declined, with the fix.
    Example:  if test_metrics[0] < 10.0:  ->  if dp.all_reduce(test_metrics)[0] < 10.0:
    Leaves alone: conditions on flags and counters set outside the loop; loops that run no training program.
    """

    name = "static-local-stop"
    generations = ("static", "fluid")

    def visit_Break(self, node: cst.Break) -> None:
        loop, guard = self._loop_and_guard(node)
        if loop is None or guard is None or not self._runs_training(loop) or stands_down(self.ctx):
            return
        if self.ctx.generation == "fluid" and len(list(minimize_calls(self.q))) != 1:
            return  # fluid-fleet declines the whole file: nothing is distributed, nothing can hang
        if self.ctx.analysis(RankAnalysis).rank_condition(node) is not None:
            return
        computed = set().union(*(self.q.assigned_names(s) for s in _body(loop))) - _targets(loop)
        read = self.q.names_in(guard.test) & computed
        if not read:
            return
        value = sorted(read)[0]
        if self.ctx.generation == "static" and self._agreeable(loop, guard, read):
            self.ctx.plan.replace(guard.test, lambda test: test.visit(_AllRanks(read, self)))
            self.report(guard.test, "change", f"the stop test reads {self.ctx.alias}.all_reduce({value}), the mean over "
                        "the ranks: every rank stops at the same step")
            return
        fix = (f"decide on every rank alike, e.g. test {self.ctx.alias}.all_reduce({value}) (the mean over the ranks)"
               if self.ctx.generation == "static" else
               "decide on every trainer alike: stop after a fixed number of passes or steps (fluid 1.x has no "
               "collective outside the program to average the figure over the trainers)")
        self.report(node, "declined", f"this `break` depends on `{value}`, which each rank computes from its own data: "
                    "ranks can stop at different steps, and the others then wait in the next step's all-reduce", fix)

    def _runs_training(self, loop: cst.CSTNode) -> bool:
        assigned = simple_assignments(self.q)
        for run in executor_runs(self.q):
            if not self.q.index.contains(loop, run):
                continue
            program = run.args[0].value if run.args and run.args[0].keyword is None else next(
                (a.value for a in run.args if a.keyword is not None and a.keyword.value == "program"), None)
            if program_kind(self.q, program, assigned) in ("main", "compiled"):
                return True
        return False


def _body(loop) -> tuple:
    return loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()


def _targets(loop) -> set[str]:
    return {loop.target.value} if isinstance(loop, cst.For) and isinstance(loop.target, cst.Name) else set()
