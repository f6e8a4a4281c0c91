"""Training loops that stop on a value of this rank's own data: ranks may stop at different steps."""

from __future__ import annotations

import libcst as cst

from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule


class LocalStop(Rule):
    """Report a ``break`` out of a training loop decided by a value the loop computes (``loss``).

    Why: once converted, each rank computes that value on its own shard, so one rank can stop while
    the others run another step and wait for its gradients: the job fails (or hangs until the
    collective timeout). The decision must be taken on every rank alike.
    Example (declined):  for x, y in loader:
                             loss = step(x, y)
                             if loss.item() < 1e-3:
                                 break
    fix: ``if dp.all_reduce(loss.item()) < 1e-3:`` (the mean over the ranks, the global batch's loss)
    Leaves alone: conditions on flags and counters set outside the loop (``if args.dry_run: break``),
    and rank conditions (``rank-divergent-code`` reports those).
    """

    name = "local-stop"

    def visit_Break(self, node: cst.Break) -> None:
        loop, guard = self._loop_and_guard(node)
        if loop is None or guard is None or not self.q.trains(loop.body):
            return
        if self.ctx.analysis(RankAnalysis).rank_condition(node) is not None:
            return
        computed = set().union(*(self.q.assigned_names(s) for s in _statements(loop.body))) - _loop_targets(loop)
        read = self.q.names_in(guard.test) & computed
        if not read:
            return
        value = sorted(read)[0]
        self.report(
            node, "declined",
            f"this `break` depends on `{value}`, which each rank computes from its own data: ranks can stop at "
            "different steps, and the others then wait for this rank's gradients",
            f"decide on every rank alike, e.g. test dp.all_reduce({value}) (the mean over the ranks) instead of `{value}`",
        )

    def _loop_and_guard(self, node: cst.CSTNode) -> tuple[cst.For | cst.While | None, cst.If | None]:
        guard = None
        for ancestor in self.q.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return None, None
            if isinstance(ancestor, cst.If) and guard is None:
                guard = ancestor
            if isinstance(ancestor, (cst.For, cst.While)):
                return ancestor, guard
        return None, None


def _statements(block: cst.BaseSuite):
    return block.body if isinstance(block, cst.IndentedBlock) else ()


def _loop_targets(loop: cst.For | cst.While) -> set[str]:
    if isinstance(loop, cst.For) and isinstance(loop.target, cst.Name):
        return {loop.target.value}
    return set()
