"""A Keras model's own ``train_step`` under the strategy: its loss scaled by the replicas in sync."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from ...codemod.rule import Rule
from ._keras import KerasFile

_SCALED = ("compiled_loss", "compute_loss")  # Keras' own losses: already divided by the global batch


class TrainStepOverride(Rule):
    """Scale the loss of an overridden ``train_step`` by ``num_replicas_in_sync`` inside its ``GradientTape``.

    Why: ``fit`` runs ``train_step`` on every replica through ``strategy.run``, and
    ``optimizer.apply_gradients`` then SUMS the replicas' gradients. A loss that is a plain mean over
    the replica's batch (``tf.reduce_mean``, a ``keras.losses`` object) trains with N times the update
    and no error (measured: ratio 2.000 on 2 workers). ``self.compiled_loss`` / ``self.compute_loss``
    are scaled already and are left alone.
    Example:  loss = self.loss_fn(y, y_pred)      ->  loss = self.loss_fn(y, y_pred)
                                                      loss = loss / tf.distribute.get_strategy().num_replicas_in_sync
    At world size 1 the divisor is 1.
    Leaves alone: losses from ``self.compiled_loss``/``self.compute_loss``. Declined (with that fix): a
    tape whose loss is not assigned inside it, or a file without ``import tensorflow as <name>``.
    """

    name = "keras-train-step-loss"

    def finish(self) -> None:
        keras = self.ctx.analysis(KerasFile)
        for function in keras.train_step_overrides():
            gradient = next(iter(self.q.findall(function, m.Call(func=m.Attribute(attr=m.Name("gradient"))))), None)
            loss = argument(gradient, 0, "target") if gradient is not None else None
            if gradient is None or loss is None or not isinstance(loss.value, cst.Name):
                continue
            if any(self.q.findall(function, m.Attribute(attr=m.Name(n))) for n in _SCALED):
                continue
            name = loss.value.value
            assignment = self._assigned_in_tape(function, name)
            alias = keras.tensorflow_alias()
            if assignment is None or alias is None:
                self.report(gradient, "declined", f"train_step's loss `{name}` is a mean over one replica's batch: "
                            "under the strategy apply_gradients sums the replicas' gradients (N times the update)",
                            f"inside the GradientTape: {name} = {name} / tf.distribute.get_strategy()"
                            ".num_replicas_in_sync")
                continue
            self.ctx.plan.insert_after(assignment, self.statement(
                f"{name} = {name} / {alias}.distribute.get_strategy().num_replicas_in_sync\n"))
            self.report(assignment, "change", f"train_step: {name} divided by num_replicas_in_sync inside the tape: "
                        "apply_gradients sums the replicas' gradients, so the update is the original one")

    def _assigned_in_tape(self, function: cst.FunctionDef, name: str) -> cst.BaseStatement | None:
        for tape in self.q.findall(function, m.With()):
            if not any(self.code(i.item).endswith("GradientTape()") for i in tape.items):
                continue
            last = None
            for statement in tape.body.body if isinstance(tape.body, cst.IndentedBlock) else ():
                if name in self.q.assigned_names(statement) and isinstance(statement, cst.SimpleStatementLine):
                    last = statement
            if last is not None:
                return last
        return None
