"""Random data drawn once, before training, with no seed: different on every rank unless shared."""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule
from .same_random_inputs import _DRAWS, _SEEDS


class SharedRandomData(Rule):
    """Broadcast rank 0's copy of random data a script draws once, before training, without a seed.

    Why: the original draws it once, in one process. Launched on N processes, each rank draws its
    own: a synthetic dataset, a random target function or a random train/test split then differs
    from rank to rank, the shards are not parts of one dataset, and averaged gradients pull toward
    an average of N different problems. ``dp.broadcast`` gives every rank rank 0's draw; on one
    process it returns the value itself.
    Example:  W_target = torch.randn(4, 1) * 5  ->  W_target = dp.broadcast(torch.randn(4, 1) * 5)
    Leaves alone: files that seed (every rank then draws the same), draws inside loops (fresh data
    per step is what data parallelism splits), and draws inside classes (model initialisation,
    which DDP broadcasts).
    """

    name = "shared-random-data"

    def _called_in_a_loop(self, function: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether a loop calls ``function``, directly or through other functions of the file."""
        if self._calls is None:
            self._calls = {}
            for c in self.q.index.of_type(self.ctx.module, cst.Call):
                if isinstance(c.func, cst.Name):
                    self._calls.setdefault(c.func.value, []).append(c)
        if function not in self._in_loop:
            self._in_loop[function] = any(_in_loop(self.q, c) or (
                (caller := self.q.function_of(c)) is not None and caller.name.value not in seen | {function}
                and self._called_in_a_loop(caller.name.value, seen | {function})) for c in self._calls.get(function, []))
        return self._in_loop[function]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._calls: dict[str, list[cst.Call]] | None = None
        self._in_loop: dict[str, bool] = {}

    def finish(self) -> None:
        calls = self.q.index.of_type(self.ctx.module, cst.Call)
        if any(self.q.is_call_to(c, _SEEDS) for c in calls) or not self.q.is_training_script():
            return
        for call in calls:
            if not self.q.is_call_to(call, _DRAWS):
                continue
            statement = self.q.statement_of(call)
            if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                    and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1
                    and isinstance(statement.body[0].targets[0].target, cst.Name)):
                continue
            if any(isinstance(a, (cst.For, cst.While, cst.ClassDef, cst.Lambda)) for a in self.q.ancestors(call)):
                continue
            function = self.q.function_of(call)
            if function is not None and (function.name.value not in self.q.module_functions()
                                         or self._called_in_a_loop(function.name.value)):
                continue  # a nested function, or one a loop calls: fresh data at every call
            assign = statement.body[0]
            if self.q.index.of_type(assign.value, cst.Call) and assign.value is not call and not _wraps(assign.value, call):
                continue
            name = assign.targets[0].target.value
            self.ctx.plan.replace(assign.value, lambda updated: self.dp_call("broadcast", updated))
            self.report(
                call, "change",
                f"`{name}` is drawn at random once, with no seed: dp.broadcast gives every rank rank 0's draw, "
                "as the single process had one",
            )


def _in_loop(q, node: cst.CSTNode) -> bool:
    return any(isinstance(a, (cst.For, cst.While)) for a in q.ancestors(node))


def _wraps(value: cst.BaseExpression, call: cst.Call) -> bool:
    """``torch.randn(4, 1) * 5`` or ``torch.randn(4).to(device)``: arithmetic or methods around one draw."""
    node = value
    while True:
        if node is call:
            return True
        if isinstance(node, cst.BinaryOperation):
            node = node.left if not isinstance(node.left, (cst.Integer, cst.Float)) else node.right
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            node = node.func.value
        else:
            return False
