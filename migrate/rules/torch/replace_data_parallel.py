"""Drop single-process DataParallel: DDP (``distributed-model``) replaces it, never wraps it."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.rule import Rule

DATA_PARALLEL = {
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
}
FUNCTIONAL_DATA_PARALLEL = {"torch.nn.parallel.data_parallel", "torch.nn.parallel.data_parallel.data_parallel"}


class ReplaceDataParallel(Rule):
    """Remove ``nn.DataParallel(model)`` and ``nn.parallel.data_parallel(module, x)``.

    Why: DataParallel splits each batch over the GPUs of one process; inside DDP it would split each
    rank's batch again and fight DDP over devices. DDP is added after the model is on its device.
    Example:  model = torch.nn.DataParallel(model).cuda()  ->  model = model.to(dp.device())
              model = nn.DataParallel(model)               ->  (removed; also an ``if`` left empty)
              nn.parallel.data_parallel(self.main, x, ids)  ->  self.main(x)
              model.module.state_dict()                     ->  model.state_dict()
    ``model.module`` is rewritten because a dpmigrate-wrapped model forwards attributes and keeps
    the unwrapped ``state_dict`` keys, and is the plain model when run on one process.
    Leaves alone: ``data_parallel`` called with inputs it cannot spread into a call (reported).
    """

    name = "replace-data-parallel"
    _data_parallel_names: set[str] | None = None

    def visit_Call(self, node: cst.Call) -> None:
        if self.q.is_call_to(node, DATA_PARALLEL) and node.args:
            self._data_parallel(node)
        elif self.q.is_call_to(node, FUNCTIONAL_DATA_PARALLEL) and len(node.args) >= 2:
            self._functional(node)

    def _data_parallel(self, node: cst.Call) -> None:
        module_arg = node.args[0].value
        statement = self.q.statement_of(node)
        assign = m.matches(
            statement, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())], value=m.Call())])
        )
        target = statement.body[0].targets[0].target.value if assign else None
        if assign and statement.body[0].value is node and m.matches(module_arg, m.Name(target)):
            self._remove_statement(statement)
            self.report(node, "change", f"removed nn.DataParallel({target}): dp.distributed_model wraps it in DDP")
            return
        self.ctx.plan.replace(node, lambda updated: updated.args[0].value)
        self.report(node, "change", f"nn.DataParallel({self.code(module_arg)}) -> {self.code(module_arg)}: "
                    "DDP is added by dp.distributed_model, not nested")

    def _remove_statement(self, statement: cst.BaseStatement) -> None:
        block = self.q.block_of(statement)
        owner = self.q.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if isinstance(owner, cst.If) and owner.orelse is None and len(block.body) == 1:
            self.ctx.plan.remove(owner)  # `if torch.cuda.device_count() > 1:` guarding only the wrap
        else:
            self.ctx.plan.remove(statement)

    def _functional(self, node: cst.Call) -> None:
        inputs = node.args[1].value
        if isinstance(inputs, cst.Tuple):
            self.report(node, "declined", "nn.parallel.data_parallel with a tuple of inputs",
                        f"call the module directly: {self.code(node.args[0].value)}(*inputs)")
            return
        self.ctx.plan.replace(
            node, lambda updated: cst.Call(func=updated.args[0].value, args=[cst.Arg(updated.args[1].value)])
        )
        self.report(node, "change", "nn.parallel.data_parallel(module, x) -> module(x): DDP parallelizes ranks")

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "module" and isinstance(node.value, cst.Name) and node.value.value in self._dp_names():
            self.ctx.plan.replace(node, lambda updated: updated.value)
            self.report(node, "change", f"{node.value.value}.module -> {node.value.value}: the wrapper keeps "
                        "the model's keys and attributes")

    def _dp_names(self) -> set[str]:
        """Names assigned a DataParallel (computed on first use, once per file)."""
        if self._data_parallel_names is None:
            names: set[str] = set()
            for call in self.q.findall(self.ctx.module, m.Call()):
                if self.q.is_call_to(call, DATA_PARALLEL):
                    statement = self.q.statement_of(call)
                    if m.matches(statement, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())])])):
                        names.add(statement.body[0].targets[0].target.value)
            self._data_parallel_names = names
        return self._data_parallel_names
