"""What the TensorFlow rules ask of a file: which names are Keras models, which are compiled, which
loops train by hand, which datasets feed them, and whether the file is TF1 graph code.

One analysis per file (``ctx.analysis(KerasFile)``), from the original tree only, so that every TF rule
can run alone and all of them agree (the scope rule and the fit rule act on the same compiled models;
the save rule knows the models the multi-GPU rule renames). Matching is by qualified name under the
Keras namespaces (``tensorflow.keras``, standalone ``keras``, ``tf_keras``), never by spelling.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from ...codemod import patterns as m
from ...codemod.query import Query, body_statements, target_names

KERAS_PACKAGES = ("tensorflow.keras", "keras", "tf_keras", "tensorflow.python.keras")
_TF1_NAMES = (  # under tensorflow (or tensorflow.compat.v1): only graph-mode code uses them
    "Session", "InteractiveSession", "placeholder", "get_variable", "variable_scope", "disable_v2_behavior",
    "disable_eager_execution", "global_variables_initializer", "train.Saver", "train.MonitoredTrainingSession",
    "contrib", *(f"train.{o}Optimizer" for o in (
        "", "GradientDescent", "Adam", "Momentum", "RMSProp", "Adagrad", "Adadelta", "AdagradDA", "Ftrl",
        "ProximalGradientDescent", "ProximalAdagrad", "SyncReplicas")),
)
# the TF1 graph generation's markers (the vocabulary's, so the report's generation is what the rules act on); a TF2
# script that only uses tf.compat.v1.logging and the like is not graph code
TF1_MARKERS = tuple(f"{package}.{name}" for package in ("tensorflow", "tensorflow.compat.v1") for name in _TF1_NAMES)
MULTI_GPU_MODEL = {  # also TF 1.x's spellings of tf.keras (tensorflow._api.v1.keras, tensorflow.compat.v1.keras)
    f"{p}.utils.{m}multi_gpu_model" for p in (*KERAS_PACKAGES, "tensorflow._api.v1.keras", "tensorflow.compat.v1.keras")
    for m in ("", "training_utils.", "multi_gpu_utils.")
}
_MODEL_CLASSES = ("Model", "Sequential")
_CUSTOM_STEP = ("apply_gradients", "minimize")
# Keras 3 only: tf-keras (what `dpmigrate launch` gives `tensorflow.keras`) has none of these
_KERAS3_ONLY = tuple(f"{p}.{n}" for p in ("keras", "tensorflow.keras") for n in (
    "ops", "random", "distribution", "tree", "config", "PyDataset", "utils.PyDataset"))
_DEVICES = {"tensorflow.device", "tensorflow.compat.v1.device"}
# Keras' own tf.data factories: their batch is their `batch_size=` argument (32 by default)
DATASET_FACTORIES = frozenset(f"{p}.{m}.{n}_dataset_from_{src}" for p in KERAS_PACKAGES for m in ("utils", "preprocessing")
                              for n, src in (("image", "directory"), ("text", "directory"), ("audio", "directory"),
                                             ("timeseries", "array")))
_GRADIENTS = ("compute_gradients", "gradients", "gradient", "minimize", "apply_gradients")


def method_call(name: str) -> m.Call:
    return m.Call(func=m.Attribute(attr=m.Name(name)))


def owner_name(call: cst.Call) -> str | None:
    """``"model"`` for ``model.fit(...)``."""
    func = call.func
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        return func.value.value
    return None


@dataclasses.dataclass
class Assignment:
    """``name = value`` as one statement of a block."""

    statement: cst.SimpleStatementLine
    value: cst.BaseExpression


class KerasFile:
    """Keras models, compiled models, hand-written training steps and datasets of one module."""

    def __init__(self, ctx) -> None:
        self.q: Query = ctx.query
        self.module = ctx.module
        self.local_modules = set(ctx.options.local_modules)
        # by qualified name: `from keras.utils import multi_gpu_model as to_gpus` too
        self.multi_gpu = [c for c in self.q.index.of_type(self.module, cst.Call) if self.is_multi_gpu_model(c)]
        self.compiles = [c for c in self.q.findall(self.module, method_call("compile")) if owner_name(c)]
        overrides = self.train_step_overrides()
        self.custom_steps = [c for c in self.q.findall(self.module, m.Call(func=m.Attribute(
            attr=m.OneOf(*(m.Name(n) for n in _CUSTOM_STEP))))) if not any(self.q.index.contains(f, c) for f in overrides)]
        self.model_names = self._model_names()
        self.keras3_only = self._keras3_only()
        self.towers = [loop for loop in self.q.findall(self.module, m.For()) if self.is_tower_loop(loop)]

    @property
    def fit_style(self) -> bool:
        """Trains through Keras only (``compile``/``fit``, ``train_step`` overrides), with no hand-written
        loop outside a ``train_step`` and no Keras 3-only API: ``dp.enter_scope()`` is for such files."""
        fits = self.q.findall(self.module, method_call("fit")) or self.q.findall(self.module, method_call("fit_generator"))
        return bool((self.compiles or self.imported_models()) and fits) and not self.custom_steps and \
            not self.keras3_only and not self.towers

    def _keras3_only(self) -> list[cst.CSTNode]:
        """Uses of Keras 3-only APIs (``keras.ops``, ``keras.random``, ``PyDataset``, a ``KERAS_BACKEND``
        setting other than ``"tensorflow"``), first first: tf-keras has none of them."""
        found: list[cst.CSTNode] = [n for n in self.q.index.of_type(self.module, cst.Attribute, cst.Name)
                                    if self.q.index.qualified_names_among(n, _KERAS3_ONLY)]
        for string in self.q.index.of_type(self.module, cst.SimpleString):
            statement = self.q.statement_of(string) if "KERAS_BACKEND" in string.value else None
            if statement is not None and "tensorflow" not in self.q.module.code_for_node(statement):
                found.append(string)  # another backend than TensorFlow's: Keras 3 only
        return found

    def keras3_name(self, use: cst.CSTNode) -> str:
        """``keras.ops`` for a use :meth:`_keras3_only` found (``KERAS_BACKEND`` for the setting)."""
        if isinstance(use, cst.SimpleString):
            return "KERAS_BACKEND"
        return min(self.q.index.qualified_names_among(use, _KERAS3_ONLY), default=self.q.module.code_for_node(use))

    def is_tower_loop(self, loop: cst.For) -> bool:
        """``for i in range(n): with tf.device('/gpu:%d' % i):`` (the device named by the loop's variable)
        whose body computes gradients or calls a model: one replica per device, combined by the script itself
        (in-graph towers, or TF2's eager form). A loop of epochs under one fixed device is not one."""
        bound = target_names(loop.target)
        devices = [w for w in self.q.findall(loop.body, m.With()) if any(
            isinstance(i.item, cst.Call) and self.q.is_call_to(i.item, _DEVICES)
            and bound & {n for a in i.item.args for n in self.q.names_in(a)} for i in w.items)]
        if not devices:
            return False
        calls = self.q.findall(loop.body, m.Call())
        return any(isinstance(c.func, cst.Attribute) and c.func.attr.value in _GRADIENTS for c in calls) or any(
            isinstance(c.func, cst.Name) for c in calls)

    def train_step_overrides(self) -> list[cst.FunctionDef]:
        """``train_step`` methods of the module's Keras ``Model`` subclasses (run by ``fit`` on every replica)."""
        classes = self.model_classes()
        return [s for c in self.module.body if isinstance(c, cst.ClassDef) and c.name.value in classes
                for s in body_statements(c) if isinstance(s, cst.FunctionDef) and s.name.value == "train_step"]

    def tensorflow_alias(self) -> str | None:
        """``tf`` for ``import tensorflow as tf`` at the top of the module."""
        for statement in self.module.body:
            for node in self.q.index.of_type(statement, cst.Import):
                for alias in node.names:
                    if self.q.module.code_for_node(alias.name) == "tensorflow":
                        return alias.asname.name.value if alias.asname else "tensorflow"
        return None

    # --- names ------------------------------------------------------------------------------------

    def under_keras(self, node: cst.CSTNode) -> set[str]:
        return {n for p in ("tensorflow", "keras", "tf_keras") for n in self.q.index.qualified_names_under(node, p)}

    def is_multi_gpu_model(self, call: cst.Call) -> bool:
        return self.q.is_call_to(call, MULTI_GPU_MODEL)

    # --- models -----------------------------------------------------------------------------------

    def is_model_construction(self, value: cst.BaseExpression) -> bool:
        """``keras.Sequential(...)``, ``keras.Model(inputs, outputs)``, ``applications.ResNet50(...)``,
        ``models.load_model(...)``, the script's own ``keras.Model`` subclass, or a module function
        that returns one of those."""
        if not isinstance(value, cst.Call):
            return False
        for name in self.under_keras(value.func):
            last = name.rsplit(".", 1)[-1]
            if last in _MODEL_CLASSES or ".applications." in name or last == "load_model":
                return True
        if isinstance(value.func, cst.Name):
            if value.func.value in self.model_classes():
                return True
            function = self.q.module_functions().get(value.func.value)
            if function is not None and self.returns_model(function):
                return True
        return False

    def model_classes(self) -> set[str]:
        """The module's classes deriving (directly) from a Keras ``Model``."""
        found = set()
        for statement in self.module.body:
            if isinstance(statement, cst.ClassDef) and any(
                any(n.rsplit(".", 1)[-1] == "Model" for n in self.under_keras(base.value)) for base in statement.bases
            ):
                found.add(statement.name.value)
        return found

    def returns_model(self, function: cst.FunctionDef) -> bool:
        """The function builds a model and returns it (``return model``)."""
        for ret in self.q.index.of_type(function, cst.Return):
            if isinstance(ret.value, cst.Name):
                for assign in self.assignments(function, ret.value.value):
                    if assign.value is not None and self._constructs(assign.value):
                        return True
            elif ret.value is not None and self._constructs(ret.value):
                return True
        return False

    def _constructs(self, value: cst.BaseExpression) -> bool:
        if not isinstance(value, cst.Call):
            return False
        names = self.under_keras(value.func)
        return any(n.rsplit(".", 1)[-1] in _MODEL_CLASSES or ".applications." in n for n in names) or (
            isinstance(value.func, cst.Name) and value.func.value in self.model_classes())

    def compiling_functions(self) -> dict[str, cst.FunctionDef]:
        """Module functions that build, compile and return a model: their call sites go under the scope."""
        found = {}
        for name, function in self.q.module_functions().items():
            compiled = {owner_name(c) for c in self.compiles if self.q.function_of(c) is function}
            for ret in self.q.index.of_type(function, cst.Return):
                if isinstance(ret.value, cst.Name) and ret.value.value in compiled:
                    found[name] = function
        return found

    def _model_names(self) -> set[str]:
        names = {owner_name(c) for c in self.compiles}
        builders = set(self.compiling_functions())
        for assign in self.q.findall(self.module, m.Assign()):
            if len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name) and (
                self.is_model_construction(assign.value) or (
                    isinstance(assign.value, cst.Call) and isinstance(assign.value.func, cst.Name)
                    and assign.value.func.value in builders)
            ):
                names.add(assign.targets[0].target.value)
        for call in self.multi_gpu:
            receiver = self.receiver_name(call)
            if receiver:
                names.add(receiver)
        names |= self.imported_models()
        return {n for n in names if n}

    def imported_models(self) -> set[str]:
        """Names a function of the script's own modules returns and the script then fits
        (``model = setup_mod.build_and_compile()`` ... ``model.fit(...)``): Keras models built and compiled there."""
        fitted = {owner_name(c) for c in self.q.findall(self.module, method_call("fit"))}
        found = set()
        for assign in self.q.findall(self.module, m.Assign(value=m.Call(func=m.Attribute(value=m.Name())))):
            target = assign.targets[0].target if len(assign.targets) == 1 else None
            if isinstance(target, cst.Name) and target.value in fitted and \
                    assign.value.func.value.value in self.local_modules:
                found.add(target.value)
        return found

    # --- Keras Sequences ----------------------------------------------------------------------------

    def sequence_classes(self) -> dict[str, cst.ClassDef]:
        """The module's classes deriving (directly) from ``keras.utils.Sequence`` / ``PyDataset``."""
        return {s.name.value: s for s in self.module.body if isinstance(s, cst.ClassDef) and any(
            any(n.rsplit(".", 1)[-1] in ("Sequence", "PyDataset") and ".utils." in n for n in self.under_keras(b.value))
            for b in s.bases)}

    def sequence_built(self, value: cst.BaseExpression, scope: cst.CSTNode, before: cst.CSTNode) -> cst.Call | None:
        """The ``Rows(...)`` call that builds the Sequence ``value`` is (itself, or a name assigned it)."""
        if isinstance(value, cst.Name):
            assignment = self.last_assignment_before(before, value.value)
            value = assignment.value if assignment is not None else value
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in self.sequence_classes():
            return value
        return None

    # --- statements and assignments ---------------------------------------------------------------

    def receiver_name(self, call: cst.Call) -> str | None:
        """``x`` for the statement ``x = call``."""
        parent = self.q.parent(call)
        if isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1:
            target = parent.targets[0].target
            if isinstance(target, cst.Name):
                return target.value
        return None

    def assignments(self, scope: cst.CSTNode, name: str) -> list[Assignment]:
        """Every ``name = value`` statement of ``scope`` (not of functions nested in it), in order."""
        found = []
        for assign in self.q.findall(scope, m.Assign()):
            owner = self.q.function_of(assign)
            if owner is not (scope if isinstance(scope, cst.FunctionDef) else None):
                continue
            if len(assign.targets) == 1 and target_names(assign.targets[0].target) == {name}:
                statement = self.q.statement_of(assign)
                if isinstance(statement, cst.SimpleStatementLine):
                    found.append(Assignment(statement, assign.value))
        return found

    def scope_of(self, node: cst.CSTNode) -> cst.CSTNode:
        return self.q.function_of(node) or self.module

    def last_assignment_before(self, node: cst.CSTNode, name: str) -> Assignment | None:
        before = [a for a in self.assignments(self.scope_of(node), name) if _starts_before(self.q, a.statement, node)]
        return before[-1] if before else None

    # --- datasets ---------------------------------------------------------------------------------

    def is_dataset_chain(self, value: cst.BaseExpression, scope: cst.CSTNode, seen: frozenset[str] = frozenset()) -> bool:
        """``tf.data.Dataset.from_tensor_slices(...).batch(B)``, ``ds.shuffle(...).batch(B)`` of such a
        ``ds``, or ``tfds.load(...)``: a ``tf.data`` pipeline."""
        for call in self.q.findall(value, m.Call()):
            if self.q.index.qualified_names_under(call.func, "tensorflow.data") or \
                    self.q.index.qualified_names_under(call.func, "tensorflow_datasets"):
                return True
            if m.matches(call.func, m.Attribute(attr=m.Name("batch") | m.Name("padded_batch"))):
                return True
            if self.q.is_call_to(call, DATASET_FACTORIES):
                return True
        root = chain_root(value)
        if isinstance(root, cst.Name) and root.value not in seen:
            return any(self.is_dataset_chain(a.value, scope, seen | {root.value})
                       for a in self.assignments(scope, root.value))
        return False

    def factory_call(self, value: cst.BaseExpression, scope: cst.CSTNode,
                     seen: frozenset[str] = frozenset()) -> cst.Call | None:
        """The ``keras.utils.image_dataset_from_directory(...)`` (or text, audio, timeseries) call a pipeline
        starts from, whose ``batch_size=`` makes its batches (following ``ds = ds.map(...)``)."""
        found = [c for c in self.q.findall(value, m.Call()) if self.q.is_call_to(c, DATASET_FACTORIES)]
        if found:
            return found[0]
        root = chain_root(value)
        if isinstance(root, cst.Name) and root.value not in seen:
            earlier = [a for a in self.assignments(scope, root.value) if _starts_before(self.q, a.statement, value)]
            if earlier:
                return self.factory_call(earlier[-1].value, scope, seen | {root.value})
        return None

    def batch_calls(self, value: cst.BaseExpression, scope: cst.CSTNode,
                    seen: frozenset[str] = frozenset()) -> list[cst.Call]:
        """The ``.batch(B)`` calls that make the batches of a dataset chain (following ``ds = ds.batch(B)``)."""
        found = [c for c in self.q.findall(value, m.Call(func=m.Attribute(attr=m.Name("batch"))))]
        if found:
            return found
        root = chain_root(value)
        if isinstance(root, cst.Name) and root.value not in seen:
            earlier = [a for a in self.assignments(scope, root.value) if _starts_before(self.q, a.statement, value)]
            if earlier:
                return self.batch_calls(earlier[-1].value, scope, seen | {root.value})
        return []


def chain_root(value: cst.BaseExpression) -> cst.BaseExpression:
    """``ds`` for ``ds.shuffle(10).batch(4)``."""
    while True:
        if isinstance(value, cst.Call):
            value = value.func
        elif isinstance(value, cst.Attribute):
            value = value.value
        else:
            return value


def _starts_before(query: Query, statement: cst.CSTNode, node: cst.CSTNode) -> bool:
    """``statement`` comes before ``node`` in the file (and does not contain it)."""
    if query.index.contains(statement, node):
        return False
    return _order(query, statement) < _order(query, node)


def _order(query: Query, node: cst.CSTNode) -> tuple[int, ...]:
    """The path of child positions from the module to ``node``: sorts nodes in source order."""
    path = []
    current = node
    while True:
        parent = query.parent(current)
        if parent is None:
            break
        children = parent.children
        path.append(next(i for i, c in enumerate(children) if c is current))
        current = parent
    return tuple(reversed(path))


def statements_of(block: cst.CSTNode) -> list[cst.BaseStatement]:
    """The statements of a module or an indented block (or a compound statement's body)."""
    if isinstance(block, (cst.Module, cst.IndentedBlock)):
        return list(block.body)
    return list(body_statements(block))
