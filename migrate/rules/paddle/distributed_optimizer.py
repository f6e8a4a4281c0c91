"""Wrap every dygraph ``paddle.optimizer.*`` with Fleet, and scale its learning rate when asked to."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from ...codemod.query import optimizer_class
from ...codemod.rule import Rule
from ._analyses import HighLevelModels


class PaddleDistributedOptimizer(Rule):
    """Wrap ``paddle.optimizer.*(parameters=...)`` in ``dp.distributed_optimizer(...)``.

    Why: ``fleet.distributed_optimizer`` applies the job's ``Strategy`` (gradient merge, AMP...) and
    is what Fleet's dygraph recipe pairs with ``fleet.distributed_model``. It returns an optimizer with
    the same ``step``/``clear_grad``/``state_dict``, so LR schedulers keep working.
    Matched by qualified name: ``from paddle import optimizer as o; o.SGD(...)`` is converted, a class
    of the script's own called ``SGD`` is not; ``paddle.optimizer.lr.*`` schedulers are not optimizers.
    Example:  opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
           -> opt = dp.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()))
    With ``--scale-lr linear|sqrt`` the learning rate becomes ``dp.scale_lr(0.1, "linear")``.
    Leaves alone: the optimizer a ``paddle.Model`` is prepared with (the high-level API averages the
    gradients itself); with ``--scale-lr``, an optimizer using its default learning rate (declined) or a
    scheduler object as its rate (declined: scale the scheduler's base rate); static-graph files.
    """

    name = "paddle-distributed-optimizer"
    generations = ("dygraph",)

    def visit_Call(self, node: cst.Call) -> None:
        qualified = optimizer_class(self.q, node)
        if qualified is None:
            return
        if self.ctx.analysis(HighLevelModels).prepares(node):
            self.report(node, "note", f"{qualified.rsplit('.', 1)[-1]}(...) prepares a paddle.Model: left as it is, "
                        "the high-level API averages its gradients under a launcher")
            return
        self.ctx.plan.replace(node, lambda updated: self.dp_call("distributed_optimizer", updated))
        self.report(node, "change", f"{qualified.rsplit('.', 1)[-1]}(...) -> dp.distributed_optimizer(...)")
        if self.ctx.options.scale_lr != "none":
            self._scale_lr(node, qualified)

    def _scale_lr(self, node: cst.Call, qualified: str) -> None:
        rule = self.ctx.options.scale_lr
        lr = argument(node, 0, "learning_rate")
        if lr is None:
            self.report(node, "declined", f"--scale-lr {rule}: {qualified} uses its default learning rate",
                        f'pass it explicitly: learning_rate=dp.scale_lr(0.001, "{rule}") with the default of {qualified}')
            return
        value = lr.value
        if self._scheduler(value):
            self.report(node, "declined", f"--scale-lr {rule}: the learning rate `{self.code(value)}` is a "
                        "paddle.optimizer.lr scheduler (or may be one), which cannot be multiplied",
                        f'scale the scheduler\'s base rate instead: learning_rate=dp.scale_lr(<base>, "{rule}")')
            return
        self.ctx.plan.replace(lr, lambda updated: updated.with_changes(
            value=self.dp_call("scale_lr", updated.value, cst.SimpleString(f'"{rule}"'))))
        self.report(lr, "change", f'learning rate {self.code(value)} -> dp.scale_lr(..., "{rule}")', effect="scale-lr")

    def _scheduler(self, value: cst.BaseExpression) -> bool:
        """A call (``paddle.optimizer.lr.StepDecay(...)``) or a name assigned one."""
        if isinstance(value, cst.Call):
            return True
        if not isinstance(value, cst.Name):
            return False
        assigns = self.q.findall(self.ctx.module, m.Assign(targets=[m.AssignTarget(m.Name(value.value))]))
        return any(isinstance(a.value, cst.Call) and self.q.callee_starts_with(a.value, "paddle.optimizer.lr.")
                   for a in assigns)
