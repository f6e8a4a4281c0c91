"""``fit`` with the batch policy applied, progress shown by the chief, callbacks that write once."""

from __future__ import annotations

import libcst as cst

from ...codemod import flow
from ...codemod import patterns as m
from ...codemod.calls import appended, argument
from ...codemod.rule import Rule
from ._keras import KerasFile, owner_name

_RUNS = ("fit", "evaluate", "predict", "fit_generator", "evaluate_generator", "predict_generator")
_CHIEF_WRITES = {"ModelCheckpoint", "TensorBoard", "BackupAndRestore"}
_EVERY_WORKER_WRITES = {"CSVLogger"}
_NUMPY_DEFAULT_BATCH = "32"
_BATCH_PARAMETERS = ("batch_size", "batch", "bs")
_IMAGE_FLOWS = ("flow", "flow_from_directory", "flow_from_dataframe")
_STEP_COUNTS = ("steps_per_epoch", "validation_steps")
_RANDOM = ("numpy.random.", "random.")
_SEEDED_WHEN_GIVEN = ("numpy.random.default_rng", "numpy.random.RandomState", "random.Random", "numpy.random.seed")


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
    A ``keras.utils.Sequence`` of the script's own: Keras splits each of its batches over the workers
    (measured equivalent); per-device, its constructor's ``batch_size`` argument is multiplied; a Sequence
    that shuffles itself with an unseeded generator is declined (each worker would draw its own order, and
    the workers' parts of a batch would overlap).
    Keras' own batch makers (``keras.utils.image_dataset_from_directory`` and the like, an
    ``ImageDataGenerator``'s ``flow``): their ``batch_size`` is handled as ``fit``'s (32 when not given); the
    runtime gives such an iterator the job's seed, so every worker orders and augments alike.
    A model wrapped by ``multi_gpu_model`` had a global batch already: kept, whatever the policy.
    When the batch changes (per-device), counts of batches computed from it are reported: ``steps_per_epoch``,
    ``validation_steps``, a ``ModelCheckpoint``'s integer ``save_freq``.
    Leaves alone: a batch it cannot find (declined with the fix); files using Keras 3-only APIs
    (``keras-strategy-scope`` declines them).
    """

    name = "keras-fit"

    def finish(self) -> None:
        keras = self.ctx.analysis(KerasFile)
        if keras.keras3_only:
            return
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
        sequence = keras.sequence_built(data.value, scope, call) if data is not None else None
        if argument(call, 2, "batch_size") is not None or argument(call, 1, "y") is not None:
            dataset = False  # NumPy arrays: a dataset takes neither
        elif data is not None and keras.is_dataset_chain(data.value, scope):
            dataset = True
        elif sequence is not None:
            self._sequence(keras, call, sequence, per_device and not parallel)
            return
        elif data is not None and self._image_flow(keras, data.value, call) is not None:
            self._factory(self._image_flow(keras, data.value, call), per_device and not parallel, call, keras)
            return
        else:
            self.report(call, "declined", "cannot tell whether fit() reads NumPy arrays or a tf.data pipeline, so "
                        "not where its batch is set",
                        "under the strategy the batch is the GLOBAL batch: pass batch_size=B * dp.world_size() "
                        "(per-device policy) or B (global policy), or batch the dataset so")
            return
        if dataset:
            batches = keras.batch_calls(self._defined(keras, data.value, call), scope)
            factory = keras.factory_call(self._defined(keras, data.value, call), scope) if not batches else None
            if factory is not None:
                self._factory(factory, per_device and not parallel, call, keras)
                return
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
                            "split over all workers' replicas", effect="split-batch")
            return
        if not per_device:
            self.report(site or call, "note", f"--batch global: {what} kept; Keras splits that global batch over the "
                        "workers, so the training trajectory is the original one", effect="split-batch")
            return
        if site is None:  # NumPy input and no batch_size: Keras' default of 32
            self.ctx.plan.needs_runtime_import = True
            self.ctx.plan.replace(call, lambda updated: appended(updated, cst.Arg(
                cst.parse_expression(f"{_NUMPY_DEFAULT_BATCH} * {self.ctx.alias}.world_size()"),
                keyword=cst.Name("batch_size"), equal=_EQUAL)))
            self.report(call, "change", "per-device batch: batch_size=32 (Keras' default) * dp.world_size() is the "
                        "global batch, 32 per worker", effect="shard")
            return
        self._multiply(site, what)
        self._counts_of_batches(keras, call)

    def _multiply(self, site: cst.Arg, what: str) -> None:
        self.ctx.plan.replace(site, lambda updated: updated.with_changes(value=cst.BinaryOperation(
            _parenthesized(updated.value), cst.Multiply(), self.dp("world_size()"))))
        self.report(site, "change", f"per-device batch: {what} {self.code(site.value)} -> "
                    f"{self.code(site.value)} * dp.world_size(): under the strategy it is the global batch, so each "
                    "worker keeps the original batch (--batch global keeps it instead)", effect="shard")

    def _counts_of_batches(self, keras: KerasFile, call: cst.Call) -> None:
        """Counts of batches the script gives ``fit``: the same count of batches N times larger."""
        for name in _STEP_COUNTS:
            given = argument(call, 99, name)
            if given is not None:
                self.report(given, "note", f"{name}={self.code(given.value)} counts global batches, now "
                            "dp.world_size() times larger: an epoch reads that many times the samples; divide it "
                            "by dp.world_size() if it was computed from the data size and the batch")
        for created in self._callback_calls(keras, call, keras.scope_of(call)):
            freq = argument(created, 99, "save_freq")
            if freq is not None and not isinstance(freq.value, cst.SimpleString):
                self.report(freq, "note", f"save_freq={self.code(freq.value)} counts batches, now dp.world_size() "
                            "times larger: the model is saved that many times less often (in samples); divide it "
                            "by dp.world_size() to keep the original rhythm")

    def _factory(self, factory: cst.Call, per_device: bool, fit: cst.Call, keras: KerasFile) -> None:
        """``fit`` on ``keras.utils.*_dataset_from_*(..., batch_size=B)``: its batch is the global batch."""
        name = self.code(factory.func)
        site = argument(factory, None, "batch_size")
        if not per_device:
            self.report(site or factory, "note", f"--batch global: {name}'s batch kept; Keras splits that global "
                        "batch over the workers, so the training trajectory is the original one", effect="split-batch")
            return
        if site is None:  # Keras' default of 32
            self.ctx.plan.needs_runtime_import = True
            self.ctx.plan.replace(factory, lambda updated: appended(updated, cst.Arg(
                cst.parse_expression(f"{_NUMPY_DEFAULT_BATCH} * {self.ctx.alias}.world_size()"),
                keyword=cst.Name("batch_size"), equal=_EQUAL)))
            self.report(factory, "change", f"per-device batch: {name}(batch_size=32 (its default) * dp.world_size()) "
                        "is the global batch, 32 per worker", effect="shard")
        else:
            self._multiply(site, f"{name}'s batch_size")
        self._counts_of_batches(keras, fit)

    def _image_flow(self, keras: KerasFile, value: cst.BaseExpression, before: cst.CSTNode) -> cst.Call | None:
        """``datagen.flow(x, y, batch_size=B)`` (or ``flow_from_directory``...) of an ``ImageDataGenerator``."""
        value = self._defined(keras, value, before)
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                and value.func.attr.value in _IMAGE_FLOWS and isinstance(value.func.value, cst.Name)):
            return None
        made = keras.last_assignment_before(value, value.func.value.value)
        if made is None or not isinstance(made.value, cst.Call) or not any(
                n.endswith("preprocessing.image.ImageDataGenerator") for n in keras.under_keras(made.value.func)):
            return None
        return value

    def _unseeded_draw(self, cls: cst.ClassDef) -> cst.Call | None:
        """A draw from NumPy's or Python's global generator, or from one built without a seed, in ``cls``."""
        for call in self.q.index.of_type(cls, cst.Call):
            names = self.q.qualified_names(call.func)
            if not any(n.startswith(_RANDOM) for n in names):
                continue
            if any(n in _SEEDED_WHEN_GIVEN for n in names):
                if call.args:
                    continue  # a generator built with a seed
                return call
            receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
            if isinstance(receiver, cst.Call) and receiver.args and \
                    any(n in _SEEDED_WHEN_GIVEN for n in self.q.qualified_names(receiver.func)):
                continue  # np.random.default_rng(seed).shuffle(...)
            return call
        return None

    def _sequence(self, keras: KerasFile, call: cst.Call, built: cst.Call, per_device: bool) -> None:
        """``fit(Rows(x, y, batch_size))``: the Sequence's batch is the global batch; Keras splits each one."""
        cls = keras.sequence_classes()[built.func.value]
        draw = self._unseeded_draw(cls)
        if draw is not None:
            self.report(draw, "declined", f"{cls.name.value} draws {self.code(draw.func)}(...) with an unseeded "
                        "generator: each worker draws its own order, so the workers' parts of a batch overlap and "
                        "some samples are never seen", "draw it from a generator seeded alike on every worker, "
                        "e.g. np.random.default_rng(seed + epoch).shuffle(self.indices)")
        if not per_device:
            self.report(built, "note", f"--batch global: {cls.name.value}'s batch is the global batch; Keras splits "
                        "each of its batches over the workers (every worker loads the whole batch)",
                        effect="split-batch")
            return
        init = flow.method(cls, "__init__")
        params = [p.name.value for p in init.params.params][1:] if init is not None else []
        parameter = next((p for p in params if p in _BATCH_PARAMETERS), None)
        site = argument(built, params.index(parameter), parameter) if parameter is not None else None
        if site is None:
            self.report(built, "declined", f"fit() reads {cls.name.value}, a Sequence whose batch size this cannot "
                        "find: under the strategy its batch is the GLOBAL batch, split over the workers",
                        "build it with batch B * dp.world_size() (per-device policy) or B (global policy)")
            return
        self._multiply(site, f"{cls.name.value}'s {parameter}")
        self._counts_of_batches(keras, call)

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
            self.ctx.plan.replace(call, lambda updated: appended(updated, cst.Arg(
                cst.parse_expression(f"{default} if {chief} else 0"), keyword=cst.Name("verbose"), equal=_EQUAL)))
        self.ctx.plan.needs_runtime_import = True
        self.report(call, "change", f"{method}(verbose=...) only on the chief: the other workers print no progress")


_EQUAL = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))


def _parenthesized(value: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(value, (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)) or value.lpar:
        return value
    return value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
