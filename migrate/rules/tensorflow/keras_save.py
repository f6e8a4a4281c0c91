"""Models and checkpoints saved by every worker, written once by the chief."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule
from ._keras import KerasFile, owner_name

_CHECKPOINTS = {"tensorflow.train.Checkpoint", "tensorflow.compat.v2.train.Checkpoint"}
_MANAGERS = {"tensorflow.train.CheckpointManager", "tensorflow.compat.v2.train.CheckpointManager"}


class KerasSave(Rule):
    """Replace ``model.save(path)`` / ``model.save_weights(path)`` / ``checkpoint.save(prefix)`` with ``dp.save``.

    Why: under ``MultiWorkerMirroredStrategy`` saving runs collectives, so EVERY worker must call it
    (the opposite of torch's rank-0 rule: a save on the chief only hangs the job); and every worker
    writing the real path at once tears it. ``dp.save`` makes every worker save, the chief to the
    real path and the others to temporary paths that are removed.
    Example:  model.save("model.keras")         ->  dp.save(model, "model.keras")
              model.save_weights("w.weights.h5")  ->  dp.save(model, "w.weights.h5", weights_only=True)
              manager.save()                      ->  dp.save(manager, manager.directory)   (tf.train.CheckpointManager)
    Unsafe when: only some workers reach the line (``rank-divergent-code`` reports it).
    Leaves alone: a save already under a rank condition (declined: it hangs once distributed), and
    saves with more arguments than the path (declined: ``dp.save`` takes the object and the path).
    """

    name = "keras-save"

    def finish(self) -> None:
        keras = self.ctx.analysis(KerasFile)
        checkpoints = self._checkpoints(keras, _CHECKPOINTS)
        managers = self._checkpoints(keras, _MANAGERS)
        for call in self.q.findall(self.ctx.module, m.Call(func=m.Attribute(attr=m.Name("save") | m.Name("save_weights")))):
            name = owner_name(call)
            weights = call.func.attr.value == "save_weights"
            if name in keras.model_names:
                what = f"{name}.{call.func.attr.value}"
            elif name in checkpoints and not weights:
                what = f"{name}.save"
            elif name in managers and not weights:
                self._manager(call, name)
                continue
            else:
                continue
            ranks = self.ctx.analysis(RankAnalysis)
            guard = ranks.rank_condition(call)
            if guard is not None:
                self.report(call, "declined", f"{what}(...) is under `{ranks.describe(guard)}`: once distributed every "
                            "worker must save (collectives), so it is left as it is and would hang",
                            f"call dp.save({name}, path{', weights_only=True' if weights else ''}) on every worker, "
                            "outside the condition: the chief writes the real path")
                continue
            path = argument(call, 0, "filepath") or argument(call, 0, "file_prefix")
            if path is None or len(call.args) != 1 or call.args[0].star:
                self.report(call, "declined", f"{what}(...) with other arguments than the path",
                            f"save on every worker with dp.save({name}, path): the chief writes the real path")
                continue
            self.ctx.plan.replace(call, self._rewrite(weights))
            self.report(call, "change", f"{what}(path) -> dp.save({name}, path"
                        f"{', weights_only=True' if weights else ''}): every worker saves, the chief writes the real "
                        "path, the others temporary ones that are removed")

    def _manager(self, call: cst.Call, name: str) -> None:
        """``manager.save(...)`` -> ``dp.save(manager, manager.directory, ...)``: the chief saves through it."""
        ranks = self.ctx.analysis(RankAnalysis)
        guard = ranks.rank_condition(call)
        if guard is not None or any(a.star for a in call.args) or any(a.keyword is None for a in call.args):
            self.report(call, "declined", f"{name}.save(...) under `{ranks.describe(guard)}` or with positional "
                        "arguments" if guard is not None else f"{name}.save(...) with positional arguments",
                        f"call dp.save({name}, {name}.directory) on every worker: the chief saves through the manager, "
                        "the others write a private temporary copy")
            return

        def rewrite(updated: cst.Call) -> cst.Call:
            owner = updated.func.value
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            head = [cst.Arg(owner, comma=comma), cst.Arg(cst.Attribute(owner, cst.Name("directory")))]
            if updated.args:
                head[-1] = head[-1].with_changes(comma=comma)
            return updated.with_changes(func=self.dp_attribute("save"), args=[*head, *updated.args])

        self.ctx.plan.replace(call, rewrite)
        self.report(call, "change", f"{name}.save() -> dp.save({name}, {name}.directory): every worker saves (reading "
                    "distributed variables runs collectives), the chief through the manager into its folder, the "
                    "others a private temporary copy that is removed; every worker still restores from the real folder")

    def _checkpoints(self, keras: KerasFile, classes: set[str]) -> set[str]:
        found = set()
        for call in self.q.index.of_type(self.ctx.module, cst.Call):
            if self.q.is_call_to(call, classes):
                name = keras.receiver_name(call)
                if name:
                    found.add(name)
        return found

    def _rewrite(self, weights: bool):
        def rewrite(updated: cst.Call) -> cst.Call:
            owner = updated.func.value
            path = updated.args[0].with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT,
                                                comma=cst.MaybeSentinel.DEFAULT)
            args = [cst.Arg(owner, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), path]
            if weights:
                args[-1] = path.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                args.append(cst.Arg(cst.Name("True"), keyword=cst.Name("weights_only"), equal=cst.AssignEqual(
                    cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
            return updated.with_changes(func=self.dp_attribute("save"), args=args)
        return rewrite
