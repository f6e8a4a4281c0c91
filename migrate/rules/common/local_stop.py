"""Training loops that stop on a value of this rank's own data: ranks may stop at different steps."""

from __future__ import annotations

import libcst as cst

from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule


class LocalStop(Rule):
    """Make a ``break`` out of a training loop decided by a value the loop computes (``loss``) agree.

    Why: once converted, each rank computes that value on its own shard, so one rank can stop while
    the others run another step and wait for its gradients: the job fails (or hangs until the
    collective timeout). The decision must be taken on every rank alike.
    Example:  if loss.item() < 1e-3:  ->  if dp.all_reduce(loss).item() < 1e-3:
    (the mean over the ranks: the global batch's loss, so one process and N ranks stop alike).
    Declined, with that fix: a test that is not a plain comparison directly in the loop's body (an
    ``and``/``or`` could skip the all-reduce on some ranks). Declined, with ``drop_last=True`` as the fix: a test
    of the batch's size (``if data.shape[1] < batch_size: break``), which sharding changes on every rank.
    Leaves alone: conditions on flags and counters set outside the loop (``if args.dry_run: break``), counters
    the loop steps by a constant (``step += 1``: the same on every rank), and rank conditions
    (``rank-divergent-code`` reports those).
    """

    name = "local-stop"

    def visit_Break(self, node: cst.Break) -> None:
        loop, guard = self._loop_and_guard(node)
        if loop is None or guard is None or not self.q.trains(loop.body):
            return
        if self.ctx.analysis(RankAnalysis).rank_condition(node) is not None:
            return
        assigned = set().union(*(self.q.assigned_names(s) for s in _statements(loop.body)))
        computed = assigned - _loop_targets(loop) - _counters(loop)
        batches = self.q.names_in(guard.test) & ((computed | _loop_targets(loop)) - _counters(loop))
        read = self.q.names_in(guard.test) & computed
        if not batches:
            return
        value = sorted(read or batches)[0]
        if self._sizes_only(guard.test, batches):  # (the batch itself too: `for data in loader():` ... len(data))
            self.report(
                node, "declined",
                f"this `break` tests the size of this rank's batch (`{self.code(guard.test)}`): once the loader is "
                "sharded each rank's batches are its share (under --batch global, dp.per_rank_batch_size(...) "
                "samples), so the test can stop one rank and not the others, or every rank at the first step",
                "drop a short last batch with the loader's drop_last=True instead of this test, and compare "
                "shapes with this rank's batch size (dp.per_rank_batch_size(...) under --batch global)",
            )
            return
        if not read:
            return
        if self._agreeable(loop, guard, read):
            self.ctx.plan.replace(guard.test, lambda test: test.visit(_AllRanks(read, self)))
            self.report(
                guard.test, "change",
                f"the stop test reads dp.all_reduce({value}), the mean over the ranks (the global batch's value): "
                "every rank stops at the same step",
            )
            return
        self.report(
            node, "declined",
            f"this `break` depends on `{value}`, which each rank computes from its own data: ranks can stop at "
            "different steps, and the others then wait for this rank's gradients",
            f"decide on every rank alike, e.g. test dp.all_reduce({value}) (the mean over the ranks) instead of `{value}`",
        )

    def _sizes_only(self, test: cst.BaseExpression, read: set[str]) -> bool:
        """Every read of ``read`` in ``test`` asks its size (``data.shape[1]``, ``len(batch)``, ``x.size``), not a
        value: no mean over the ranks makes sense of that (the all-reduce of an array failed, issue 19 audit)."""
        for name in (n for n in self.q.index.of_type(test, cst.Name) if n.value in read):
            parent = self.q.parent(name)
            if isinstance(parent, cst.Attribute) and parent.value is name and parent.attr.value in _SIZES:
                continue
            call = self.q.parent(parent) if isinstance(parent, cst.Arg) else None
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == "len":
                continue
            return False
        return True

    def _agreeable(self, loop, guard: cst.If, read: set[str]) -> bool:
        """The test can be made the same on every rank: a plain comparison, in an ``if`` every rank
        reaches (directly in the loop's body), so the all-reduce in it is met by all."""
        body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
        return (any(s is guard for s in body) and isinstance(guard.test, cst.Comparison)
                and not self.q.index.of_type(guard.test, cst.BooleanOperation))

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


_SIZES = frozenset({"shape", "size", "ndim", "numel"})


def _statements(block: cst.BaseSuite):
    return block.body if isinstance(block, cst.IndentedBlock) else ()


def _counters(loop: cst.For | cst.While) -> set[str]:
    """Names the loop only ever steps by a constant (``step += 1``, ``n = n + 1``): the same on every rank."""
    stepped: set[str] = set()
    other: set[str] = set()

    class Assignments(cst.CSTVisitor):
        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if isinstance(node.target, cst.Name):
                constant = isinstance(node.value, (cst.Integer, cst.Float)) and isinstance(
                    node.operator, (cst.AddAssign, cst.SubtractAssign))
                (stepped if constant else other).add(node.target.value)

        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            if isinstance(node.target, cst.Name):
                other.add(node.target.value)

        def visit_Assign(self, node: cst.Assign) -> None:
            value = node.value
            for target in node.targets:
                if (isinstance(target.target, cst.Name) and isinstance(value, cst.BinaryOperation)
                        and isinstance(value.operator, cst.Add) and isinstance(value.left, cst.Name)
                        and value.left.value == target.target.value and isinstance(value.right, cst.Integer)):
                    stepped.add(target.target.value)
                    other.discard(target.target.value)

    loop.body.visit(Assignments())
    return stepped - other


def _loop_targets(loop: cst.For | cst.While) -> set[str]:
    if isinstance(loop, cst.For) and isinstance(loop.target, cst.Name):
        return {loop.target.value}
    return set()


class _AllRanks(cst.CSTTransformer):
    """Every read of the named values becomes ``dp.all_reduce(name)``."""

    def __init__(self, names: set[str], rule: Rule) -> None:
        super().__init__()
        self.names = names
        self.rule = rule

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if original.value in self.names:
            return self.rule.dp_call("all_reduce", updated)
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        return updated.with_changes(attr=original.attr)  # `x.loss`: an attribute's name is not the value

    def visit_Subscript(self, node: cst.Subscript) -> bool:
        return _subscripted(node) not in self.names  # `info["loss"]` is reduced whole (below), not `info`

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
        """``dp.all_reduce(info["loss"])``: the value the test reads, not the dict that holds it (PaddleNLP's
        memory network stopped on ``info["validate_perplexity"]``; ``dp.all_reduce(info)`` failed on both ranks)."""
        if _subscripted(original) in self.names:
            return self.rule.dp_call("all_reduce", updated)
        return updated


def _subscripted(node: cst.Subscript) -> str | None:
    """The name at the root of ``a["x"]["y"]``."""
    value = node.value
    while isinstance(value, cst.Subscript):
        value = value.value
    return value.value if isinstance(value, cst.Name) else None
