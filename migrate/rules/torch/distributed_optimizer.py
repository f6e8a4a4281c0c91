"""Wrap every torch optimizer, and scale its learning rate when asked to."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.query import optimizer_class
from ...codemod.rule import Rule


class DistributedOptimizer(Rule):
    """Wrap ``torch.optim.*`` constructions in ``dp.distributed_optimizer(...)``.

    Why: the runtime's optimizer averages the gradients no DDP model owns and applies the chosen
    ``Strategy`` (gradient accumulation, LocalSGD). It stays an instance of the original optimizer
    class, so learning-rate schedulers built on it keep working.
    Matched by qualified name: ``from torch import optim as o; o.SGD(...)`` is converted, a class
    of the script's own called ``SGD`` is not.
    Example:  optimizer = optim.SGD(model.parameters(), lr=args.lr)
           -> optimizer = dp.distributed_optimizer(optim.SGD(model.parameters(), lr=args.lr))
    With ``--scale-lr linear|sqrt`` the learning rate becomes ``dp.scale_lr(args.lr, "linear")``
    (the global batch is N times larger under ``--batch per-device``).
    Leaves alone: schedulers (``torch.optim.lr_scheduler``) and optimizers built dynamically
    (``getattr(optim, name)``); with ``--scale-lr``, an optimizer using its default learning rate
    (declined), and learning rates set by hand later (``param_group['lr'] = ...``, declined).
    """

    name = "distributed-optimizer"

    def visit_Call(self, node: cst.Call) -> None:
        qualified = optimizer_class(self.q, node)
        if qualified is None:
            return
        self.ctx.plan.replace(node, lambda updated: self.dp_call("distributed_optimizer", updated))
        self.report(node, "change", f"{qualified.rsplit('.', 1)[-1]}(...) -> dp.distributed_optimizer(...)")
        if self.ctx.options.scale_lr != "none":
            self._scale_lr(node, qualified)

    def visit_Assign(self, node: cst.Assign) -> None:
        if self.ctx.options.scale_lr == "none":
            return
        for target in node.targets:
            if m.matches(target.target, m.Subscript(slice=[m.SubscriptElement(m.Index(m.SimpleString()))])):
                key = target.target.slice[0].slice.value.evaluated_value
                if key == "lr":
                    rule = self.ctx.options.scale_lr
                    self.report(
                        node, "declined",
                        f"--scale-lr {rule}: this sets a learning rate by hand, after the optimizer was built",
                        f'scale it too: {self.code(target.target)} = dp.scale_lr(<value>, "{rule}")',
                    )

    def _scale_lr(self, node: cst.Call, qualified: str) -> None:
        rule = self.ctx.options.scale_lr
        positional = [a for a in node.args if a.keyword is None and a.star == ""]
        named = [a for a in node.args if a.keyword is not None and a.keyword.value == "lr"]
        lr = named[0] if named else (positional[1] if len(positional) > 1 else None)
        if lr is None:
            self.report(
                node, "declined",
                f"--scale-lr {rule}: {qualified} uses its default learning rate",
                f'pass it explicitly, e.g. lr=dp.scale_lr(0.001, "{rule}") with the default of {qualified}',
            )
            return
        self.ctx.plan.replace(
            lr, lambda updated: updated.with_changes(value=self.dp_call("scale_lr", updated.value, _string(rule)))
        )
        self.report(lr, "change", f'learning rate {self.code(lr.value)} -> dp.scale_lr(..., "{rule}")', effect="scale-lr")


def _string(value: str) -> cst.SimpleString:
    return cst.SimpleString(f'"{value}"')
