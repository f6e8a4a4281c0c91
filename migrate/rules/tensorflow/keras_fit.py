"""``fit`` with the batch policy applied, progress shown by the chief, callbacks that write once."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from ...codemod.rule import Rule
from ._keras import KerasFile, owner_name

_RUNS = ("fit", "evaluate", "predict", "fit_generator", "evaluate_generator", "predict_generator")
_CHIEF_WRITES = {"ModelCheckpoint", "TensorBoard", "BackupAndRestore"}
_EVERY_WORKER_WRITES = {"CSVLogger"}
_NUMPY_DEFAULT_BATCH = "32"


class KerasFit(Rule):
    """Apply the batch policy to ``model.fit`` and show its progress on the chief only.

    Why: under ``MultiWorkerMirroredStrategy`` the batch ``fit`` is given (``batch_size=`` for NumPy
    arrays, the ``.batch(B)`` of a ``tf.data`` pipeline) is the GLOBAL batch, split over the workers.
    ``--batch per-device`` (default, Horovod's convention) keeps B per worker, so the global batch is
    ``B * dp.world_size()``; ``--batch global`` keeps B as the global batch (the original trajectory).
    Example (per-device):  model.fit(x, y, batch_size=64, epochs=5)
      -> model.fit(x, y, batch_size=64 * dp.world_size(), epochs=5, verbose=1 if dp.is_main_process() else 0)
    ``verbose`` of ``fit``/``evaluate``/``predict`` is the script's on the chief, 0 elsewhere.
    Callbacks: ``ModelCheckpoint``, ``TensorBoard`` and ``BackupAndRestore`` are left as they are
    (tf-keras makes every worker call them and writes the real path on the chief only, the others in
    temporary folders it removes); ``EarlyStopping`` decides on metrics reduced over all workers, so
    they stop together; ``CSVLogger`` is declined (every worker would write the same file).
    ``validation_split`` is kept: Keras splits the arrays before distributing them.
    A model wrapped by ``multi_gpu_model`` had a global batch already: kept, whatever the policy.
    Leaves alone: a batch it cannot find (declined with the fix).
    """

    name = "keras-fit"

    def finish(self) -> None:
        keras = self.ctx.analysis(KerasFile)
        parallel = {keras.receiver_name(c) for c in keras.multi_gpu}
        for call in self.q.findall(self.ctx.module, m.Call(func=m.Attribute(attr=m.OneOf(*map(m.Name, _RUNS))))):
            name = owner_name(call)
            if name not in keras.model_names:
                continue
            method = call.func.attr.value
            if method.startswith("fit"):
                self._batch(keras, call, name in parallel)
                self._callbacks(keras, call)
                split = argument(call, 99, "validation_split")
                if split is not None:
                    self.report(split, "note", "validation_split kept: Keras splits the arrays before sharding them, "
                                "and the validation metrics are reduced over all workers")
            self._verbose(call, method)

    # --- batch --------------------------------------------------------------------------------------

    def _batch(self, keras: KerasFile, call: cst.Call, parallel: bool) -> None:
        per_device = self.ctx.options.batch == "per-device"
        data = argument(call, 0, "x")
        scope = keras.scope_of(call)
        if argument(call, 2, "batch_size") is not None or argument(call, 1, "y") is not None:
            dataset = False  # NumPy arrays: a dataset takes neither
        elif data is not None and keras.is_dataset_chain(data.value, scope):
            dataset = True
        else:
            self.report(call, "declined", "cannot tell whether fit() reads NumPy arrays or a tf.data pipeline, so "
                        "not where its batch is set",
                        "under the strategy the batch is the GLOBAL batch: pass batch_size=B * dp.world_size() "
                        "(per-device policy) or B (global policy), or batch the dataset so")
            return
        if dataset:
            batches = keras.batch_calls(self._defined(keras, data.value, call), scope)
            if len(batches) != 1 or not batches[0].args:
                self.report(call, "declined", "fit() reads a tf.data pipeline whose .batch(B) cannot be found here",
                            "its batch is the GLOBAL batch under the strategy: batch it with B * dp.world_size() "
                            "(per-device policy) or B (global policy)")
                return
            site = batches[0].args[0]
            what = "the dataset's .batch(...)"
        else:
            site = argument(call, 2, "batch_size")
            what = "batch_size"
        if parallel:
            if site is not None:
                self.report(site, "note", f"{what} kept: it was the global batch of multi_gpu_model already, now "
                            "split over all workers' replicas")
            return
        if not per_device:
            self.report(site or call, "note", f"--batch global: {what} kept; Keras splits that global batch over the "
                        "workers, so the training trajectory is the original one")
            return
        if site is None:  # NumPy input and no batch_size: Keras' default of 32
            self.ctx.plan.needs_runtime_import = True
            self.ctx.plan.replace(call, lambda updated: updated.with_changes(args=_appended(updated.args, cst.Arg(
                cst.parse_expression(f"{_NUMPY_DEFAULT_BATCH} * {self.ctx.alias}.world_size()"),
                keyword=cst.Name("batch_size"), equal=_EQUAL))))
            self.report(call, "change", "per-device batch: batch_size=32 (Keras' default) * dp.world_size() is the "
                        "global batch, 32 per worker")
            return
        self.ctx.plan.replace(site, lambda updated: updated.with_changes(value=cst.BinaryOperation(
            _parenthesized(updated.value), cst.Multiply(), self.dp("world_size()"))))
        self.report(site, "change", f"per-device batch: {what} {self.code(site.value)} -> "
                    f"{self.code(site.value)} * dp.world_size(): under the strategy it is the global batch, so each "
                    "worker keeps the original batch (--batch global keeps it instead)")

    def _defined(self, keras: KerasFile, value: cst.BaseExpression, call: cst.Call) -> cst.BaseExpression:
        """The expression a dataset name was last given before ``call``."""
        if isinstance(value, cst.Name):
            assignment = keras.last_assignment_before(call, value.value)
            if assignment is not None:
                return assignment.value
        return value

    # --- callbacks and verbosity ---------------------------------------------------------------

    def _callbacks(self, keras: KerasFile, call: cst.Call) -> None:
        scope = keras.scope_of(call)
        for created in self._callback_calls(keras, call, scope):
            kind = next((n.rsplit(".", 1)[-1] for n in keras.under_keras(created.func)), "")
            if kind in _CHIEF_WRITES:
                self.report(created, "note", f"{kind} kept: every worker calls it, tf-keras writes the real path on "
                            "the chief only and the others in temporary folders it removes")
            elif kind in _EVERY_WORKER_WRITES:
                self.report(created, "declined", f"{kind} would be written by every worker to the same file",
                            "give it a path per worker, or add it to the callbacks only `if dp.is_main_process()`")

    def _callback_calls(self, keras: KerasFile, call: cst.Call, scope: cst.CSTNode) -> list[cst.Call]:
        given = argument(call, 99, "callbacks")
        if given is None:
            return []
        roots = [given.value]
        if isinstance(given.value, cst.Name):
            roots = [a.value for a in keras.assignments(scope, given.value.value)]
        found = []
        for root in roots:
            for element in self.q.findall(root, m.Call()):
                if keras.under_keras(element.func):
                    found.append(element)
                elif isinstance(element.func, cst.Name):
                    found.extend(a.value for a in keras.assignments(scope, element.func.value)
                                 if isinstance(a.value, cst.Call))
            for name in self.q.findall(root, m.Name()):
                found.extend(a.value for a in keras.assignments(scope, name.value) if isinstance(a.value, cst.Call)
                             and keras.under_keras(a.value.func))
        return found

    def _verbose(self, call: cst.Call, method: str) -> None:
        chief = f"{self.ctx.alias}.is_main_process()"
        given = argument(call, 99, "verbose")
        if given is not None:
            if chief in self.code(given.value) or m.matches(given.value, m.Integer("0")):
                return  # already the chief's, or silent everywhere
            self.ctx.plan.replace(given, lambda updated: updated.with_changes(value=cst.parse_expression(
                f"{self.code(given.value)} if {chief} else 0")))
        else:
            default = '"auto"'
            self.ctx.plan.replace(call, lambda updated: updated.with_changes(args=_appended(updated.args, cst.Arg(
                cst.parse_expression(f"{default} if {chief} else 0"), keyword=cst.Name("verbose"), equal=_EQUAL))))
        self.ctx.plan.needs_runtime_import = True
        self.report(call, "change", f"{method}(verbose=...) only on the chief: the other workers print no progress")


_EQUAL = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))


def _appended(args, new: cst.Arg) -> list[cst.Arg]:
    """``args`` and ``new`` after them, laid out as the call was (one line, or one argument a line
    with a trailing comma)."""
    args = list(args)
    if not args:
        return [new]
    last = args[-1]
    if last.comma is cst.MaybeSentinel.DEFAULT:
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return [*args, new]
    between = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else last.comma
    args[-1] = last.with_changes(comma=between)
    return [*args, new.with_changes(comma=last.comma)]


def _parenthesized(value: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(value, (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)) or value.lpar:
        return value
    return value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
