"""Keras' ``multi_gpu_model`` (removed in TF 2.4) replaced by the strategy scope."""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule
from ._keras import MULTI_GPU_MODEL, KerasFile


class MultiGpuModel(Rule):
    """Remove ``parallel = multi_gpu_model(model, gpus=N)``; ``compile``/``fit``/``save`` use ``model``.

    Why: ``keras.utils.multi_gpu_model`` copied the model onto the GPUs of one machine and split each
    batch; it was removed in TF 2.4, so the script no longer runs at all. The strategy does the same
    on any number of GPUs and machines: the template model, built and compiled under ``dp.scope()``
    (``keras-strategy-scope``), is what trains, and its batch is still the global batch.
    Example:  parallel_model = multi_gpu_model(model, gpus=8)      (removed)
              parallel_model.compile(...)                       ->  model.compile(...)  under dp.scope()
    The import of ``multi_gpu_model`` goes too.
    Leaves alone: a call whose result is not assigned to a name, or whose model is not a plain name
    (declined).
    """

    name = "keras-multi-gpu-model"

    def finish(self) -> None:
        keras = self.ctx.analysis(KerasFile)
        for call in keras.multi_gpu:
            parallel = keras.receiver_name(call)
            template = call.args[0].value if call.args and call.args[0].keyword is None else None
            statement = self.q.statement_of(call)
            if parallel is None or not isinstance(template, cst.Name) or not isinstance(statement, cst.SimpleStatementLine):
                self.report(call, "declined", "multi_gpu_model(...) whose result is not assigned to a name, or of a "
                            "model that is not a plain name", "remove the call and train the template model, built "
                            "and compiled under `with dp.scope():`")
                continue
            self.ctx.plan.remove(statement)
            scope = keras.scope_of(call)
            for name in self.q.index.of_type(scope, cst.Name):
                if name.value == parallel and self._is_variable(name) and not self.q.index.contains(statement, name):
                    self.ctx.plan.replace(name, lambda updated, t=template.value: updated.with_changes(value=t))
            self.report(call, "change", f"multi_gpu_model removed (gone since TF 2.4): `{parallel}` is now "
                        f"`{template.value}`, built and compiled under dp.scope(); the strategy splits each global "
                        "batch over every worker's replicas")
        if keras.multi_gpu:
            self._remove_imports()

    def _is_variable(self, name: cst.Name) -> bool:
        parent = self.q.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            return False
        return not (isinstance(parent, cst.Arg) and parent.keyword is name)

    def _remove_imports(self) -> None:
        for statement in self.q.index.of_type(self.ctx.module, cst.ImportFrom):
            if isinstance(statement.names, cst.ImportStar) or statement.module is None:
                continue
            module = self.code(statement.module)
            gone = [a for a in statement.names if f"{module}.{self.code(a.name)}" in MULTI_GPU_MODEL]
            if not gone:
                continue
            line = self.q.statement_of(statement)
            if len(gone) == len(statement.names):
                self.ctx.plan.remove(line)
            else:
                kept = [a for a in statement.names if a not in gone]
                kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                self.ctx.plan.replace(statement, lambda updated, k=kept: updated.with_changes(names=k))
            self.report(statement, "change", "import of multi_gpu_model removed (it no longer exists)")
