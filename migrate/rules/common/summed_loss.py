"""A loss summed over the batch, under ``--batch global``: multiplied by the world size, so each step moves as far."""

from __future__ import annotations

import libcst as cst

from ...codemod.calls import argument
from ...codemod.rule import Rule

_SUM_METHODS = ("sum",)
_AXIS_KEYWORDS = ("dim", "axis")


class SummedLoss(Rule):
    """Keep the original gradient of a loss summed over the batch: ``(loss * dp.world_size()).backward()``.

    Why: with ``--batch global`` each rank sums B/N samples, and the data-parallel wrapper averages the ranks'
    gradients: every step then moves 1/N as far as the original's sum over B (measured: the conversion
    trains like the original at lr/N). Multiplying the rank's loss by N makes the average of the N rank sums the
    sum over the whole batch again. With ``--batch per-device`` each rank sums its B samples, as the original
    did, and the average of those sums has the original's scale: nothing to do.
    Example (--batch global):  loss = F.mse_loss(out, y, reduction="sum")    (or (out - y).pow(2).sum())
                               loss.backward()  ->  (loss * dp.world_size()).backward()
    A summed loss is ``reduction="sum"`` (or the legacy ``size_average=False``) given to a loss of the framework
    (a function, or a loss object built with it), or a ``.sum()`` / ``torch.sum(x)`` over everything, possibly
    times a constant, a sum of such terms (a VAE's reconstruction plus KL), or what a helper of the file returns
    when it returns one; the one whose name a ``.backward()`` in the same function reads (also through
    ``scaler.scale(loss)``).
    Leaves alone: a sum divided by anything (a mean over the rank's batch, which averages right); sums over a
    ``dim``/``axis``; losses it cannot trace to their definition.
    """

    name = "summed-loss"

    def finish(self) -> None:
        if self.ctx.options.batch != "global" or "backward" not in self.vocabulary.backward_methods:
            return
        for call in self.q.index.of_type(self.ctx.module, cst.Call):
            if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward" and not call.args):
                continue
            target, wrap = self._loss_of(call.func.value)
            if target is None:
                continue
            summed = self._summed_definition(target, call)
            if summed is None or not self._batch_split(call):
                continue
            self.ctx.plan.replace(wrap, self._times_world_size(parenthesized=wrap is call.func.value))
            self.report(call, "change", (
                f"`{target}` is a sum over the batch ({summed}): with --batch global each rank sums B/N samples and the "
                "gradients are averaged over the ranks, so it is multiplied by dp.world_size() to keep the original's "
                "step"), effect="scale-loss")

    def _batch_split(self, backward: cst.Call) -> bool:
        """Whether this step's batch may be the rank's share. Not when every loop around it counts steps
        (``for step in range(n):``, batches drawn or cut by hand) and nothing in them was sharded: every rank then
        sums the whole batch, and the factor made the update N times the original's (PaddleNLP's memory network,
        issue 19 audit round J). A loop over anything else (a loader, a parameter) is taken as split, as before."""
        loops = []
        for ancestor in self.q.ancestors(backward):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                break
            if isinstance(ancestor, cst.For):
                if not _counts(ancestor.iter):
                    return True
                loops.append(ancestor)
        if not loops:
            return True
        outer = self.ctx.positions[loops[-1]]
        return any(f.effect == "shard" and outer.start.line <= f.line <= outer.end.line for f in self.ctx.findings)

    def _times_world_size(self, parenthesized: bool):
        """``loss`` -> ``loss * dp.world_size()`` (in parentheses as the receiver of ``.backward()``)."""
        def replace(updated: cst.BaseExpression) -> cst.BaseExpression:
            left = _parenthesized(updated) if isinstance(updated, cst.BinaryOperation) else updated
            paren = {"lpar": [cst.LeftParen()], "rpar": [cst.RightParen()]} if parenthesized else {}
            return cst.BinaryOperation(left=left, operator=cst.Multiply(), right=self.dp("world_size()"), **paren)
        return replace

    def _loss_of(self, receiver: cst.BaseExpression) -> tuple[str | None, cst.BaseExpression | None]:
        """``loss`` of ``loss.backward()`` or of ``scaler.scale(loss).backward()``, and the node to multiply."""
        if isinstance(receiver, cst.Name):
            return receiver.value, receiver
        if (isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute)
                and receiver.func.attr.value == "scale" and len(receiver.args) == 1
                and isinstance(receiver.args[0].value, cst.Name)):
            return receiver.args[0].value.value, receiver.args[0].value
        return None, None

    def _summed_definition(self, name: str, backward: cst.Call) -> str | None:
        """How ``name`` is a sum over the batch (for the report), from its last assignment before the backward."""
        function = self.q.function_of(backward)
        scope = function if function is not None else self.ctx.module
        assigned = None
        for assign in self.q.index.of_type(scope, cst.Assign):
            if (len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
                    and assign.targets[0].target.value == name and self.q.function_of(assign) is function
                    and self.q.index.position(assign) < self.q.index.position(backward)):
                assigned = assign
        return self._summed(assigned.value) if assigned is not None else None

    def _summed(self, value: cst.BaseExpression, depth: int = 0) -> str | None:
        """How ``value`` sums over the batch: a summed loss, a constant times one, a sum or difference of summed
        terms (a VAE's reconstruction sum plus its summed KL term), or what a function of the file returns."""
        if depth > 3:
            return None
        if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
            return self._summed(value.expression, depth + 1)
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply):
            if isinstance(value.right, (cst.Integer, cst.Float)):
                return self._summed(value.left, depth + 1)
            if isinstance(value.left, (cst.Integer, cst.Float)) or (
                    isinstance(value.left, cst.UnaryOperation) and isinstance(value.left.expression, (cst.Integer, cst.Float))):
                return self._summed(value.right, depth + 1)
            return None
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Subtract)):
            left, right = self._summed(value.left, depth + 1), self._summed(value.right, depth + 1)
            return f"{left} + {right}" if left and right else None
        if not isinstance(value, cst.Call):
            return None
        if isinstance(value.func, cst.Name) and value.func.value in self.q.module_functions():
            returned = self._returned_sum(self.q.module_functions()[value.func.value], depth)
            if returned:
                return f"{value.func.value}(...) returns {returned}"
        if (_reduction_sum(value) or _size_average_false(value)) and self._a_framework_loss(value.func):
            return 'reduction="sum"'
        if isinstance(value.func, cst.Attribute) and value.func.attr.value in _SUM_METHODS and not value.args:
            return ".sum()"
        if (self._a_framework_sum(value.func) and len(value.args) == 1 and value.args[0].keyword is None
                and not value.args[0].star):
            return f"{self.code(value.func)}(...)"
        if isinstance(value.func, cst.Name) and self._built_summing(value.func.value, value):
            return f'{value.func.value}, built with reduction="sum"'
        return None

    def _returned_sum(self, function: cst.FunctionDef, depth: int) -> str | None:
        """What a helper returns, when every ``return`` of it is a sum over the batch (read through its own
        assignments: ``bce = F.binary_cross_entropy(..., reduction="sum"); return bce + kld``)."""
        returns = [r for r in self.q.index.of_type(function, cst.Return) if r.value is not None]
        if not returns:
            return None
        found = []
        for r in returns:
            value = r.value
            if isinstance(value, cst.BinaryOperation) or isinstance(value, cst.Name):
                value = self._inlined(value, function)
            summed = self._summed(value, depth + 1)
            if summed is None:
                return None
            found.append(summed)
        return found[0]

    def _inlined(self, value: cst.BaseExpression, function: cst.FunctionDef) -> cst.BaseExpression:
        """``bce + kld`` with each name replaced by its (only) assignment in ``function``."""
        assigned: dict[str, cst.BaseExpression] = {}
        for assign in self.q.index.of_type(function, cst.Assign):
            if len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
                name = assign.targets[0].target.value
                assigned[name] = assign.value if name not in assigned else None

        class Inline(cst.CSTTransformer):
            def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
                found = assigned.get(original.value)
                return found if found is not None else updated

        return value.visit(Inline())

    def _a_framework_loss(self, func: cst.BaseExpression) -> bool:
        return any(self.q.named_under(func, p) for p in self.vocabulary.tensor_packages)

    def _a_framework_sum(self, func: cst.BaseExpression) -> bool:
        return bool(self.q.index.qualified_names_among(func, {f"{p}.sum" for p in self.vocabulary.tensor_packages}))

    def _built_summing(self, name: str, use: cst.Call) -> bool:
        """``criterion = nn.MSELoss(reduction="sum")`` in the function of ``use`` or at module level."""
        function = self.q.function_of(use)
        for scope in (function, None):
            where = scope if scope is not None else self.ctx.module
            for assign in self.q.index.of_type(where, cst.Assign):
                if (len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
                        and assign.targets[0].target.value == name and isinstance(assign.value, cst.Call)
                        and (scope is not None or self.q.function_of(assign) is None)):
                    return _reduction_sum(assign.value) and self._a_framework_loss(assign.value.func)
        return False


def _size_average_false(call: cst.Call) -> bool:
    """The legacy ``size_average=False`` (a sum over the batch, before ``reduction=`` existed)."""
    arg = argument(call, None, "size_average")
    return arg is not None and isinstance(arg.value, cst.Name) and arg.value.value == "False"


def _reduction_sum(call: cst.Call) -> bool:
    arg = argument(call, None, "reduction")
    return arg is not None and isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value == "sum"


def _counts(iterable: cst.BaseExpression) -> bool:
    """``range(n)``, ``enumerate(range(n))``, ``trange(n)``: a loop that counts steps, reading no data."""
    if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Name):
        if iterable.func.value in ("range", "trange"):
            return True
        if iterable.func.value == "enumerate" and iterable.args:
            return _counts(iterable.args[0].value)
    return False


def _parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
