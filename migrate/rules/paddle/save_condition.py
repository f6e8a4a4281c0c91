"""A checkpoint saved when this rank's own figure improves: every rank must take the same branch."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule
from .distributed_save import JIT_SAVE
from .graph_mode import stands_down
from .static_save import _SAVES as STATIC_SAVES

_LOOPS = (cst.For, cst.While)


class PaddleSaveCondition(Rule):
    """Make the test of an ``if`` that guards a save agree on every rank, or report it as an error.

    Why: once converted, a save is a meeting point (``dp.save`` and the barrier after a main-process
    export wait for every rank). Under ``if avg_acc > max_acc:``, ``avg_acc`` is computed by each rank from
    its own data (its shard of the evaluation, or a dev set drawn per rank): ranks can disagree, one waits
    in the save for ranks that never come, and the job hangs (issue 19). The test reads the mean over the
    ranks instead (``dp.all_reduce``), which every rank computes alike: the global figure, as one process had.
    Example:  if avg_acc > max_acc:            ->  if dp.all_reduce(avg_acc) > dp.all_reduce(max_acc):
                  max_acc = avg_acc                     max_acc = avg_acc
                  paddle.save(model.state_dict(), p)    dp.save(model.state_dict(), p)
    A save in a function of the file (``def save_checkpoint(model, path): paddle.save(...)``) is checked
    where that function is called. Only values the loop holding the ``if`` computes from calls count: not
    loop counters, values set before the loop (arguments, flags) or constants; a test may join comparisons with
    ``and``/``or`` (``if best is None or val_loss < best:``, the None test left as it is); the ``if`` may sit in
    ``if``s of that loop whose tests read no such value (``if steps % k == 0:``). Error (not rewritten): any other
    test (a call of the figure), or an ``if`` under a test of such a value, a ``with`` or a ``try`` in that loop.
    Leaves alone: saves under a rank condition (``paddle-distributed-save``), ``paddle.Model.save`` (rank 0
    writes it alone, no rank waits).
    """

    name = "paddle-save-condition"
    generations = ("dygraph", "static")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._done: set[int] = set()  # the guards whose test is rewritten already

    def visit_Call(self, node: cst.Call) -> None:
        if not self.q.is_call_to(node, self.vocabulary.save_calls | JIT_SAVE | STATIC_SAVES):
            return
        if self.ctx.generation == "static" and stands_down(self.ctx):
            return
        if self.ctx.analysis(RankAnalysis).rank_condition(node) is not None:
            return
        self._check(node, node, frozenset())

    def _check(self, node: cst.Call, site: cst.CSTNode, seen: frozenset[str]) -> None:
        """The save ``node``, reached at ``site``: itself, or a call of the file's function that saves
        (``save_checkpoint(model, path)`` under ``if val_acc > best_acc:``, the issue 19 audit's CharCNN)."""
        guard, container = self._guard(site)
        if guard is None:
            helper = self._saving_helper(site)
            if helper is not None and helper.name.value not in seen:
                for call in self._calls_of(helper.name.value):
                    if self.ctx.analysis(RankAnalysis).rank_condition(call) is None:
                        self._check(node, call, seen | {helper.name.value})
            return
        figures = _derived(self.q, container)
        derived = figures & self.q.names_in(guard.test)
        if not derived:
            return
        value = next(n.value for n in self.q.index.of_type(guard.test, cst.Name) if n.value in derived)
        if id(guard) in self._done:
            return  # a second save under the same test (the model's and the optimizer's): rewritten once
        if self._reached_alike(guard, container, figures) and _agreeable(guard.test):
            self._done.add(id(guard))
            self.ctx.plan.replace(guard.test, lambda test: test.visit(_MeanOverRanks(derived, self)))
            kept = self._kept_figures(guard, derived)
            for assign in kept:
                self.ctx.plan.replace(assign.value, lambda v: v.visit(_MeanOverRanks(derived, self)))
            also = (f"; the figure it keeps ({', '.join(self.code(a.targets[0].target) for a in kept)}) is that mean "
                    "too, so the next test agrees as well") if kept else ""
            self.report(guard.test, "change", f"the test of this save reads {self.ctx.alias}.all_reduce({value}), the mean "
                        f"over the ranks: every rank takes the same branch and meets in the save{also}")
            return
        where = "this save" if site is node else f"this call saves (`{self.code(node.func)}` in it), and"
        self.report(site, "error", f"{where} runs only when `{self.code(guard.test)}` holds, and `{value}` is "
                    "computed by each rank from its own data: ranks can disagree, and the ones that save wait for "
                    "the others (the job hangs)", f"decide on every rank alike: compute the test from "
                    f"{self.ctx.alias}.all_reduce({value}) (the mean over the ranks) in an `if` every rank reaches")

    def _reached_alike(self, guard: cst.If, container: cst.CSTNode, figures: set[str]) -> bool:
        """``guard`` sits in the loop's body, or in ``if``s there whose tests read none of this rank's figures
        (``if steps % save_steps == 0:`` around ``if current_acc > best_acc:``, a VGG trainer of issue 19's round P):
        every rank reaches it alike, so its all-reduce is met by all."""
        for ancestor in self.q.ancestors(guard):
            if ancestor is container:
                return True
            if isinstance(ancestor, cst.If) and self.q.names_in(ancestor.test) & figures:
                return False
            if not isinstance(ancestor, (cst.If, cst.IndentedBlock, cst.Else)):
                return False
        return False

    def _kept_figures(self, guard: cst.If, derived: set[str]) -> list[cst.Assign]:
        """``self.best = loss.item()`` in the body of ``if loss.item() < self.best:``: an assignment to what the test
        compares with, from this rank's figures. Left so, each rank would keep its own best and the next test
        would part them again (MTCNN's trainer: one rank alone in dp.save's barrier; issue 19 audit)."""
        compared = {self.code(n) for n in self.q.index.of_type(guard.test, cst.Attribute)} | self.q.names_in(guard.test)
        kept = []
        for statement in guard.body.body if isinstance(guard.body, cst.IndentedBlock) else ():
            small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
            if (isinstance(small, cst.Assign) and len(small.targets) == 1
                    and self.code(small.targets[0].target) in compared - derived
                    and self.q.names_in(small.value) & derived):
                kept.append(small)
        return kept

    def _saving_helper(self, site: cst.CSTNode) -> cst.FunctionDef | None:
        """The module-level function whose body runs ``site`` on every call (no test or loop in between)."""
        for ancestor in self.q.ancestors(site):
            if isinstance(ancestor, (cst.If, cst.While, cst.For, cst.Try, cst.With, cst.ClassDef, cst.Lambda)):
                return None
            if isinstance(ancestor, cst.FunctionDef):
                return ancestor if isinstance(self.q.parent(ancestor), cst.Module) else None
        return None

    def _calls_of(self, name: str) -> list[cst.Call]:
        return [c for c in self.q.index.of_type(self.ctx.module, cst.Call)
                if isinstance(c.func, cst.Name) and c.func.value == name]

    def _guard(self, node: cst.CSTNode) -> tuple[cst.If | None, cst.CSTNode | None]:
        """The innermost ``if`` around ``node``, and the loop that holds it (the epoch loop of a best-so-far save)."""
        guard = None
        for ancestor in self.q.ancestors(node):
            if isinstance(ancestor, cst.If) and guard is None:
                guard = ancestor
            if guard is not None and isinstance(ancestor, _LOOPS):
                return guard, ancestor
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return None, None
        return None, None


def _is_none_test(node: cst.BaseExpression) -> bool:
    """``best is None`` / ``best is not None``: alike on every rank once every rank takes the same branches."""
    return (isinstance(node, cst.Comparison) and isinstance(node.left, cst.Name) and all(
        isinstance(c.operator, (cst.Is, cst.IsNot)) and isinstance(c.comparator, cst.Name)
        and c.comparator.value == "None" for c in node.comparisons))


def _agreeable(test: cst.BaseExpression) -> bool:
    """A test the all-reduce makes every rank decide alike: comparisons, joined by ``and``/``or`` (``best is None
    or val_loss < best``, ``acc > best and epoch > 0``). Each operand then reads the same on every rank (this
    rank's figures all-reduced, counters and flags alike everywhere, a None test alike once every rank has
    taken the same branches), so ``and``/``or`` stop at the same operand on every rank."""
    if isinstance(test, cst.BooleanOperation):
        return _agreeable(test.left) and _agreeable(test.right)
    return isinstance(test, cst.Comparison) and not any(
        isinstance(c.comparator, cst.BooleanOperation) for c in test.comparisons)


def _derived(q, container: cst.CSTNode) -> set[str]:
    """Names the loop assigns from a call (or from such names): figures computed at run time, per rank.

    Loop targets (counters, batches) and counters (``step += 1``, ``n = n + 1``) are not counted."""
    assigns = [a for a in q.findall(container, m.Assign() | m.AugAssign() | m.AnnAssign())
               if q.function_of(a) is q.function_of(container)]
    targets = set()
    for loop in q.findall(container, m.For()):
        targets |= _names(loop.target)
    derived: set[str] = set()
    changed = True
    while changed:
        changed = False
        for assign in assigns:
            if assign.value is None:
                continue
            calls = q.index.of_type(assign.value, cst.Call)
            if not calls and not (q.names_in(assign.value) & derived):
                continue
            names = {t.target for t in assign.targets} if isinstance(assign, cst.Assign) else {assign.target}
            for target in names:
                for name in _names(target) - targets - derived:
                    derived.add(name)
                    changed = True
    return derived


def _names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_names(e.value) for e in target.elements))
    if isinstance(target, cst.StarredElement):
        return _names(target.value)
    return set()


class _MeanOverRanks(cst.CSTTransformer):
    """Every read of the named values becomes ``dp.all_reduce(name)``."""

    def __init__(self, names: set[str], rule: Rule) -> None:
        super().__init__()
        self.names, self.rule = names, rule

    def visit_Comparison(self, node: cst.Comparison) -> bool:
        return not _is_none_test(node)  # ``best is None`` stays as it is (None has no mean)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return self.rule.dp_call("all_reduce", updated) if original.value in self.names else updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        return updated.with_changes(attr=original.attr)
