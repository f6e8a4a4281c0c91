"""A Keras model's own ``train_step`` under the strategy: every loss that trains scaled by the replicas in sync."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from ...codemod.query import target_names
from ...codemod.rule import Rule
from ._keras import KerasFile

_SCALED = ("compiled_loss", "compute_loss")  # Keras' own losses: already divided by the global batch
_APPLY = ("apply_gradients", "apply", "minimize")


class TrainStepOverride(Rule):
    """Scale each loss of an overridden ``train_step`` by ``num_replicas_in_sync`` inside its ``GradientTape``.

    Why: ``fit`` runs ``train_step`` on every replica through ``strategy.run``, and
    ``optimizer.apply_gradients`` then SUMS the replicas' gradients. A loss that is a plain mean over
    the replica's batch (``tf.reduce_mean``, a ``keras.losses`` object) trains with N times the update
    and no error (measured: ratio 2.000 on 2 workers). A step with several tapes (a GAN: the critic's
    loss and its ``apply_gradients``, then the generator's) has every such loss scaled, each in its own
    tape: the ones whose gradients reach an ``apply_gradients`` (or ``minimize(loss, ..., tape=)``). A
    gradient taken for another purpose (a gradient penalty's gradient with respect to the inputs) is
    left as it is. ``self.compiled_loss`` / ``self.compute_loss`` are scaled already and are left alone.
    Example:  loss = self.loss_fn(y, y_pred)      ->  loss = self.loss_fn(y, y_pred)
                                                      loss = loss / tf.distribute.get_strategy().num_replicas_in_sync
    At world size 1 the divisor is 1.
    Leaves alone: ``self.compiled_loss`` / ``self.compute_loss``; gradients no optimizer applies; Keras 3-only
    files (their ``fit`` is declined).
    Declined (with that fix): a gradient of an expression rather than a name, a loss not assigned inside
    its tape, or a file without ``import tensorflow as <name>``.
    """

    name = "keras-train-step-loss"

    def finish(self) -> None:
        keras = self.ctx.analysis(KerasFile)
        if keras.keras3_only:
            return  # its fit is declined (keras-strategy-scope): nothing runs under the strategy
        alias = keras.tensorflow_alias()
        for function in keras.train_step_overrides():
            reaching = self._reaching_an_update(function)
            done: set[int] = set()
            for call, target, tape_name in self._gradients(function):
                if not (self._result_names(call) & reaching or call.func.attr.value == "minimize"):
                    continue  # a gradient that no optimizer applies (a gradient penalty's)
                tape = self._tape(function, call, tape_name)
                if tape is not None and self._keras_scaled(tape):
                    continue
                name = target.value.value if target is not None and isinstance(target.value, cst.Name) else None
                assignment = self._assigned_in(tape, name) if tape is not None and name else None
                if assignment is None or alias is None:
                    what = f"`{name}`" if name else (f"`{self.code(target.value)}`" if target else "its loss")
                    self.report(call, "declined", f"train_step's loss {what} is a mean over one replica's batch: "
                                "under the strategy apply_gradients sums the replicas' gradients (N times the "
                                "update), and it is not a name assigned inside its GradientTape here",
                                "inside the GradientTape: loss = loss / tf.distribute.get_strategy()"
                                ".num_replicas_in_sync, and take the gradient of that loss")
                    continue
                if id(assignment) in done:
                    continue
                done.add(id(assignment))
                self.ctx.plan.insert_after(assignment, cst.parse_statement(  # plain TensorFlow: no runtime import
                    f"{name} = {name} / {alias}.distribute.get_strategy().num_replicas_in_sync\n",
                    config=self.ctx.config()))
                self.report(assignment, "change", f"train_step: {name} divided by num_replicas_in_sync inside the "
                            "tape: apply_gradients sums the replicas' gradients, so the update is the original one",
                            effect="scale-loss")

    def _gradients(self, function: cst.FunctionDef):
        """(call, the loss argument, the tape's name) of each ``tape.gradient(loss, ...)`` and
        ``optimizer.minimize(loss, ..., tape=tape)`` in ``function``."""
        for call in self.q.findall(function, m.Call(func=m.Attribute(attr=m.Name("gradient") | m.Name("minimize")))):
            if call.func.attr.value == "gradient":
                owner = call.func.value
                yield call, argument(call, 0, "target"), owner.value if isinstance(owner, cst.Name) else None
            else:
                tape = argument(call, 99, "tape")
                if tape is not None:
                    yield call, argument(call, 0, "loss"), tape.value.value if isinstance(tape.value, cst.Name) else None

    def _result_names(self, call: cst.Call) -> set[str]:
        parent = self.q.parent(call)
        if isinstance(parent, cst.Assign) and parent.value is call:
            return set().union(*(target_names(t.target) for t in parent.targets))
        return set()

    def _reaching_an_update(self, function: cst.FunctionDef) -> set[str]:
        """Names whose value flows into an optimizer's ``apply_gradients`` (through assignments in ``function``)."""
        reaching: set[str] = set()
        for call in self.q.findall(function, m.Call(func=m.Attribute(attr=m.OneOf(*map(m.Name, _APPLY))))):
            reaching |= {n for a in call.args for n in self.q.names_in(a)}
        assignments = [a for a in self.q.findall(function, m.Assign())]
        changed = True
        while changed:
            changed = False
            for assign in assignments:
                targets = set().union(*(target_names(t.target) for t in assign.targets))
                if targets & reaching:
                    new = self.q.names_in(assign.value) - reaching
                    if new:
                        reaching |= new
                        changed = True
        return reaching

    def _tape(self, function: cst.FunctionDef, call: cst.Call, tape_name: str | None) -> cst.With | None:
        """The ``with tf.GradientTape() as <tape_name>:`` block the gradient is taken from (the last one
        before it of that name)."""
        found = None
        for tape in self.q.findall(function, m.With()):
            for item in tape.items:
                if self.code(item.item).split("(")[0].endswith("GradientTape") and item.asname is not None and \
                        isinstance(item.asname.name, cst.Name) and item.asname.name.value == tape_name:
                    if self._before(tape, call):
                        found = tape
        return found

    def _before(self, node: cst.CSTNode, other: cst.CSTNode) -> bool:
        return self.ctx.positions[node].start.line <= self.ctx.positions[other].start.line

    def _keras_scaled(self, tape: cst.With) -> bool:
        return any(self.q.findall(tape.body, m.Attribute(attr=m.Name(n))) for n in _SCALED)

    def _assigned_in(self, tape: cst.With, name: str) -> cst.BaseStatement | None:
        """The last statement of the tape's block (at its top level) that assigns ``name``."""
        last = None
        for statement in tape.body.body if isinstance(tape.body, cst.IndentedBlock) else ():
            if name in self.q.assigned_names(statement) and isinstance(statement, cst.SimpleStatementLine):
                last = statement
        return last
