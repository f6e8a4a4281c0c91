"""Find code that only some ranks run but all ranks must: the classic distributed hang."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule


class RankDivergence(Rule):
    """Report collectives under a rank condition, and early exits on one rank from a loop that syncs.

    Why: a collective (``dist.all_reduce``, ``barrier``, ``dp.all_reduce``, ``dp.save``, DDP's
    gradient all-reduce) completes only when every rank calls it. Under ``if rank == 0:`` the
    other ranks never arrive and the job hangs until the timeout; a ``break`` or ``return`` on one
    rank inside the training loop (or a loop that calls a collective) leaves the others waiting.
    A rank condition is an ``if``, a conditional expression, or the left side of ``and``/``or``
    (``dp.rank() == 0 and dp.barrier()``).
    Example (error):  if dp.is_main_process():
                          dp.save(model.state_dict(), path)   # dp.save already writes on rank 0 only
    Reported as errors even in files that are otherwise left unchanged (converted ones, scripts
    written for DDP by hand). Calls to the script's own functions that reach a collective count.
    Leaves alone: the code itself; the fix needs the author's intent.
    """

    name = "rank-divergent-code"
    checks_only = True

    def finish(self) -> None:
        ranks = self.ctx.analysis(RankAnalysis)
        for call in self.q.findall(self.ctx.module, m.Call()):
            what = ranks.collective(call)
            guard = ranks.rank_condition(call) if what else None
            if guard is not None:
                self._collective(call, what, guard)
        for exit_ in self.q.findall(self.ctx.module, m.Break() | m.Return()):
            guard = ranks.rank_condition(exit_)
            loop = self._loop(exit_)
            if guard is None or loop is None or not self._inside(guard, loop):
                continue
            if self.q.trains(loop.body):
                waits = "inside a training loop: this rank stops while the others wait for its gradients (hang)"
            elif ranks.has_collective(loop.body):
                waits = "inside a loop that calls a collective: the other ranks wait for this rank in it (hang)"
            else:
                continue  # a loop with no collective: ranks leaving it early meet again after it
            word = "break" if isinstance(exit_, cst.Break) else "return"
            self.report(
                exit_, "error",
                f"`{word}` under a rank condition (`{ranks.describe(guard)}`) {waits}",
                "decide on every rank, e.g. stop = dp.all_reduce(int(condition), op=\"max\") and test `stop`",
            )

    def _collective(self, call: cst.Call, what: str, guard: cst.CSTNode) -> None:
        condition = self.ctx.analysis(RankAnalysis).describe(guard)
        if what == "dp.save":
            fix = "dp.save already writes on rank 0 only: call it on every rank, outside the condition"
        elif what.startswith("dp.main_process_first"):
            fix = "enter main_process_first() on every rank, outside the condition"
        else:
            fix = "call it on every rank, outside the condition (compute the value on all ranks)"
        self.report(
            call, "error",
            f"{what} is a collective every rank must reach, but it is under `{condition}`: "
            "the other ranks never call it and the job hangs",
            fix,
        )

    def _loop(self, node: cst.CSTNode) -> cst.For | cst.While | None:
        """The innermost loop ``node`` is in, within its function."""
        for ancestor in self.q.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return None
            if isinstance(ancestor, (cst.For, cst.While)):
                return ancestor
        return None

    def _inside(self, inner: cst.CSTNode, outer: cst.CSTNode) -> bool:
        return any(a is outer for a in self.q.ancestors(inner))
