"""Keras models built and compiled under the distribution strategy's scope."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.entry import EntryPoint
from ...codemod.query import is_main_guard
from ...codemod.rule import Rule
from ._keras import KerasFile, owner_name, statements_of


class StrategyScope(Rule):
    """Move the statements that build and compile a Keras model under ``with dp.scope():``.

    Why: ``MultiWorkerMirroredStrategy`` mirrors only the variables created in its scope; a model,
    optimizer or metric built outside it trains on each worker alone (tf-keras refuses to ``compile``
    an optimizer created outside the model's scope). ``fit`` then runs the strategy itself: the data
    is sharded, the compiled loss is scaled by the global batch, and gradients are all-reduced.
    Example:  model = keras.Sequential([...])         with dp.scope():
              model.compile(optimizer="sgd", ...)  ->     model = keras.Sequential([...])
                                                          model.compile(optimizer="sgd", ...)
    The block runs from the first statement that builds something the model or ``compile`` uses
    (``inputs = keras.Input(...)``, layers of a functional model, the optimizer) to ``compile``. A
    function that builds, compiles and returns a model has its call site put under the scope
    (``model = build_model()``). ``model = dp.distributed_model(model)`` follows the block: it checks the
    variables are mirrored and turns Keras 3's unreadable multi-worker ``fit`` failure into an error that
    names the fix (tf-keras). At world size 1 both are TF's default strategy: nothing changes.
    Scripts that train through Keras only (``fit``, ``train_step`` overrides; no hand-written loop) also
    get ``dp.enter_scope()`` right after ``dp.init()`` (before any Keras object the module builds
    earlier): the strategy's scope for the rest of the program, so the variables made outside the block
    (sub-models and optimizers built first, then ``GAN(d, g).compile(d_opt, g_opt)``; layers called on
    ``keras.Input`` statements above; a ``TextVectorization`` adapted first) are the strategy's too.
    Leaves alone: models compiled in a block other than the one that builds them, or from a function
    argument (declined: build them under ``dp.scope()`` by hand; a note when ``dp.enter_scope()`` covers
    them); hand-written training loops (see ``tf-custom-loop``). Declined: a script using Keras 3-only APIs
    (``keras.ops``, ``keras.random``, ``PyDataset``, ``KERAS_BACKEND``): tf-keras, which
    MultiWorkerMirroredStrategy's ``fit`` needs, has none of them, and Keras 3's ``fit`` fails under it.
    """

    name = "keras-strategy-scope"

    def finish(self) -> None:
        keras = self.ctx.analysis(KerasFile)
        if keras.keras3_only and keras.compiles:
            self._decline_keras3(keras)
            return
        program = keras.fit_style and self.ctx.analysis(EntryPoint).anchor is not None
        ranges: dict[int, tuple[cst.CSTNode, list[list[int]]]] = {}
        builders = keras.compiling_functions()
        parallel = {keras.receiver_name(c): c for c in keras.multi_gpu if keras.receiver_name(c)}
        built: list[tuple[cst.BaseStatement, str]] = []  # (last statement under the scope, model)
        for compile_call in keras.compiles:
            function = self.q.function_of(compile_call)
            name = owner_name(compile_call)
            if function is not None and function.name.value in builders:
                continue  # its call sites go under the scope
            if self._in_scope(compile_call):
                continue
            found = self._range(keras, compile_call, parallel.get(name))
            if found is None and program:
                self.report(compile_call, "note", f"`{name}` is compiled here but not built in the same block: "
                            "dp.enter_scope() makes its variables the strategy's wherever they are built")
                continue
            if found is None:
                self.report(
                    compile_call, "declined",
                    f"`{name}` is compiled here but not built in the same block: cannot tell which statements "
                    "create its variables",
                    f"build and compile `{name}` (with its optimizer) inside `with dp.scope():`",
                )
                continue
            block, first, last = found
            ranges.setdefault(id(block), (block, []))[1].append([first, last])
            built.append((statements_of(block)[last], self.code(parallel[name].args[0].value) if name in parallel
                          else name))
            if name in parallel:
                template = parallel[name].args[0].value
                name = self.code(template)
            self.report(compile_call, "change", f"`{name}` is built and compiled under dp.scope(): its variables are "
                        "mirrored on every worker, fit() shards the data and all-reduces the gradients")
        for call in self.q.index.of_type(self.ctx.module, cst.Call):
            if isinstance(call.func, cst.Name) and call.func.value in builders and not self._in_scope(call):
                statement = self.q.statement_of(call)
                block = self.q.block_of(statement) if statement is not None else None
                if block is None or self.q.function_of(call) is builders[call.func.value]:
                    continue
                index = next(i for i, s in enumerate(statements_of(block)) if s is statement)
                ranges.setdefault(id(block), (block, []))[1].append([index, index])
                receiver = keras.receiver_name(call)
                if receiver:
                    built.append((statement, receiver))
                self.report(call, "change", f"{call.func.value}() builds and compiles a model: called under "
                            "dp.scope(), so its variables are mirrored on every worker")
        for block, spans in ranges.values():
            body = statements_of(block)
            for first, last in _merged(spans):
                self.ctx.plan.group(body[first:last + 1], self._with_scope(body[first:last + 1]))
        for statement, name in built:
            self.ctx.plan.insert_after(statement, self.statement(f"{name} = {{dp}}.distributed_model({name})\n"))
        if program:
            self._enter_scope(keras)

    def _enter_scope(self, keras: KerasFile) -> None:
        """``dp.enter_scope()`` after ``dp.init()`` (where InitRuntime puts it), or before the first module-level
        statement that builds Keras objects before the entry point runs."""
        entry = self.ctx.analysis(EntryPoint)
        statement = self.statement("{dp}.enter_scope()\n")
        early = self._keras_objects_before(keras, entry.anchor)
        if early is not None:
            self.ctx.plan.insert_before(early, statement)
            where = early
        elif entry.after:
            self.ctx.plan.insert_after(entry.anchor, statement)
            where = entry.anchor
        else:
            self.ctx.plan.insert_before(entry.anchor, statement)
            where = entry.anchor
        self.report(where, "change", "dp.enter_scope(): the strategy's scope for the rest of the program, so every "
                    "variable the Keras training uses is the strategy's, wherever it is built (sub-models, "
                    "optimizers, layers called earlier, lookup tables); nothing at world size 1")

    def _keras_objects_before(self, keras: KerasFile, anchor: cst.CSTNode) -> cst.BaseStatement | None:
        """The first module-level statement run before ``anchor`` that builds Keras or TensorFlow objects."""
        body = self.ctx.module.body
        top = next(s for s in body if s is anchor or self.q.index.contains(s, anchor))
        in_function = isinstance(top, cst.FunctionDef)  # main(): module code runs up to the __main__ block
        for statement in body:
            if (statement is top and not in_function) or (isinstance(statement, cst.If) and is_main_guard(statement)):
                return None
            if isinstance(statement, cst.SimpleStatementLine) and not self.q.findall(
                    statement, m.Import() | m.ImportFrom()) and self._creates_keras_objects(keras, statement):
                return statement
        return None

    def _decline_keras3(self, keras: KerasFile) -> None:
        use = keras.keras3_only[0]
        where = self.ctx.positions[use].start
        for compile_call in keras.compiles:
            self.report(compile_call, "declined", f"`{owner_name(compile_call)}` trains with Keras' fit in a script "
                        f"that uses Keras 3-only APIs ({keras.keras3_name(use)} at line {where.line}): tf-keras, with which "
                        "fit runs under MultiWorkerMirroredStrategy, has none of them, and Keras 3's fit fails under "
                        "the strategy (keras-team/keras#20585); the training is left as it is",
                        "replace the Keras 3-only calls by tf.* ones (keras.ops.einsum -> tf.einsum, keras.random.normal "
                        "-> tf.random.normal) and convert again, or write the training as a GradientTape loop, which "
                        "dpmigrate converts with Keras 3")

    def _range(self, keras: KerasFile, compile_call: cst.Call, parallel_call: cst.Call | None):
        """(block, first index, last index) of the statements that build and compile the model."""
        statement = self.q.statement_of(compile_call)
        block = self.q.block_of(statement) if statement is not None else None
        if block is None:
            return None
        body = statements_of(block)
        last = next(i for i, s in enumerate(body) if s is statement)
        name = owner_name(compile_call)
        if parallel_call is not None:  # parallel_model.compile(): the template model is what is built
            template = parallel_call.args[0].value if parallel_call.args else None
            name = template.value if isinstance(template, cst.Name) else name
        built = next((i for i in range(last - 1, -1, -1) if name in self.q.assigned_names(body[i])), None)
        if built is None:
            return None
        needed = (self.q.names_in(body[built]) | self.q.names_in(compile_call)) - {name}
        first = built
        for i in range(built - 1, -1, -1):
            candidate = body[i]
            if not isinstance(candidate, cst.SimpleStatementLine) or self.q.findall(
                candidate, m.Call(func=m.Attribute(attr=m.Name("parse_args")))
            ):
                break
            assigned = self.q.assigned_names(candidate)
            if assigned & needed and self._creates_keras_objects(keras, candidate):
                first = i
                needed |= self.q.names_in(candidate) - assigned
        return block, first, last

    def _creates_keras_objects(self, keras: KerasFile, statement: cst.CSTNode) -> bool:
        """A statement that calls into Keras/TF or the script's own classes (layers, inputs, optimizers)."""
        classes = {s.name.value for s in self.ctx.module.body if isinstance(s, cst.ClassDef)}
        for call in self.q.index.of_type(statement, cst.Call):
            if keras.under_keras(call.func) or (isinstance(call.func, cst.Name) and call.func.value in classes):
                return True
            if isinstance(call.func, cst.Call):  # layers.Dense(10)(x)
                return True
        return False

    def _in_scope(self, node: cst.CSTNode) -> bool:
        for ancestor in self.q.ancestors(node):
            if isinstance(ancestor, cst.With) and any(
                isinstance(item.item, cst.Call) and isinstance(item.item.func, cst.Attribute)
                and item.item.func.attr.value == "scope" for item in ancestor.items
            ):
                return True
        return False

    def _with_scope(self, originals):
        def wrap(statements):
            kept = [s for s, o in zip(statements, originals) if not self.ctx.plan.is_removed(o)]
            first = kept[0]
            body = [first.with_changes(leading_lines=())] + [_unindented_blank_lines(s) for s in kept[1:]]
            return cst.With(
                items=[cst.WithItem(self.dp("scope()"))],
                body=cst.IndentedBlock(body=body),
                leading_lines=first.leading_lines,
            )
        return wrap


def _unindented_blank_lines(statement: cst.BaseStatement) -> cst.BaseStatement:
    """Blank lines above a statement moved into the block stay empty (no indentation left on them)."""
    lines = [line.with_changes(indent=False) if line.comment is None else line for line in statement.leading_lines]
    return statement.with_changes(leading_lines=lines)


def _merged(spans: list[list[int]]) -> list[list[int]]:
    """Overlapping or touching index ranges of one block, joined (two models compiled one after the other)."""
    merged: list[list[int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return merged
