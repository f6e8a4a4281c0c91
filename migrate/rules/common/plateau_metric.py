"""A plateau scheduler stepped with a value of this rank's data: decided on the mean over the ranks."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.query import is_main_guard
from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule


class PlateauMetric(Rule):
    """Hand a plateau scheduler's ``step`` the mean of its metric over the ranks.

    Why: ``ReduceLROnPlateau`` (torch) and ``paddle.optimizer.lr.ReduceOnPlateau`` lower the learning rate when the
    metric they are stepped with stops improving. Once converted, each rank steps its own scheduler with the value of
    its own shard (``scheduler.step(loss)``), so one rank lowers its rate and the others do not: the gradients are
    still averaged, but each rank applies them with its own rate and the replicas part ways for good (the
    ReduceOnPlateau example of Paddle's API docs, issue 19 audit round I: rank 0 ended at lr 0.125, rank 1 at 0.25,
    with different weights; nothing said so). The mean over the ranks is the global batch's value (equal shares), so
    every rank, and one process, decide alike; a value every rank computed alike (a whole validation set) is kept.
    Example:  scheduler.step(loss)  ->  scheduler.step(dp.all_reduce(loss))
    Declined, with that fix: a step under a condition other than the entry-point guard, a loop counter or a rank
    test (the all-reduce must be met by every rank); under a rank test, a step only some ranks take.
    Leaves alone: schedulers not built in this file by their qualified name; steps already given ``dp.all_reduce``.
    """

    name = "plateau-metric"

    def finish(self) -> None:
        classes = self.vocabulary.plateau_schedulers
        if not classes or not self.q.index.possible(classes):
            return
        schedulers = self._schedulers(classes)
        reduce_names = {f"{self.vocabulary.runtime_module}.all_reduce"}
        for call in self.q.index.of_type(self.ctx.module, cst.Call):
            key = _step_of(call)
            if key is None or key not in schedulers:
                continue
            arg = next((a for a in call.args if a.keyword is None and not a.star), None) or next(
                (a for a in call.args if a.keyword is not None and a.keyword.value == "metrics"), None)
            if arg is None or self.q.is_call_to(arg.value, reduce_names):
                continue
            value = self.code(arg.value)
            if self.ctx.analysis(RankAnalysis).rank_condition(call) is not None:
                self.report(call, "declined", f"`{key}.step({value})` runs on some ranks only: their learning rates "
                            "part ways from the others'", f"step `{key}` on every rank with "
                            f"{self.ctx.alias}.all_reduce({value}), the mean over the ranks")
                continue
            guard = self._data_condition(call)
            if guard is not None:
                self.report(call, "declined", f"`{key}.step({value})` decides on this rank's `{value}`, under "
                            f"`if {self.code(guard.test)}`: each rank lowers its learning rate on its own data, and "
                            "an all-reduce there could wait for ranks that skip it",
                            f"step `{key}` where every rank reaches it, with {self.ctx.alias}.all_reduce({value}) "
                            "(the mean over the ranks)")
                continue
            self.ctx.plan.replace(arg.value, lambda updated: self.dp_call("all_reduce", cst.Arg(updated)))
            self.report(arg.value, "change", f"`{key}.step` reads {self.ctx.alias}.all_reduce({value}), the mean over "
                        "the ranks (the global batch's value): every rank lowers its learning rate at the same step, "
                        "as one process does")

    def _schedulers(self, classes: frozenset[str]) -> set[str]:
        """``name`` or ``self.name`` bound to a plateau scheduler built here."""
        found: set[str] = set()
        for call in self.q.index.of_type(self.ctx.module, cst.Call):
            if not self.q.is_call_to(call, classes):
                continue
            parent = self.q.parent(call)
            targets = parent.targets if isinstance(parent, cst.Assign) else \
                [parent] if isinstance(parent, cst.AnnAssign) else []
            for target in (t.target for t in targets):
                key = _key(target)
                if key is not None:
                    found.add(key)
        return found

    def _data_condition(self, call: cst.Call) -> cst.If | None:
        """The first enclosing ``if`` (up to the function) whose test reads more than loop counters, arguments and
        constants: each rank may take it differently."""
        counters = {n.value for loop in self.q.ancestors(call) if isinstance(loop, cst.For)
                    for n in self.q.index.of_type(loop.target, cst.Name)}
        for ancestor in self.q.ancestors(call):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            if not isinstance(ancestor, cst.If) or is_main_guard(ancestor):
                continue
            read = {n.value for n in self.q.index.of_type(ancestor.test, cst.Name)
                    if not m.matches(self.q.parent(n), m.Attribute(attr=m.Name(n.value)))}
            if read - counters - {"args", "config", "cfg", "opt", "True", "False", "None", "len"}:
                return ancestor
        return None


def _key(target: cst.BaseExpression) -> str | None:
    if isinstance(target, cst.Name):
        return target.value
    if m.matches(target, m.Attribute(value=m.Name("self"))):
        return f"self.{target.attr.value}"
    return None


def _step_of(call: cst.Call) -> str | None:
    """``scheduler`` in ``scheduler.step(...)``."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "step":
        return _key(func.value)
    return None
