"""What the static-graph and fluid rules ask of a file: its optimizers, executors, programs, runs.

Static graph training is spread over statements that name each other: an optimizer whose
``minimize(loss)`` builds the backward pass into the main program, an ``Executor`` whose
``run(program, feed=..., fetch_list=...)`` trains (or evaluates, or initialises), and the place the
executor runs on. These helpers answer by qualified name (``paddle.static.Executor``,
``paddle.fluid.Executor``) and by plain ``name = value`` assignments, never by guessing from words.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from ...codemod.query import Query

OPTIMIZER_PREFIXES = ("paddle.optimizer.", "paddle.fluid.optimizer.")
NOT_OPTIMIZERS = ("paddle.optimizer.lr", "paddle.optimizer.Optimizer", "paddle.fluid.optimizer.Optimizer")
EXECUTORS = frozenset({
    "paddle.static.Executor", "paddle.fluid.Executor", "paddle.fluid.executor.Executor", "paddle.base.Executor",
})
MAIN_PROGRAMS = frozenset({
    "paddle.static.default_main_program", "paddle.fluid.default_main_program",
    "paddle.fluid.framework.default_main_program", "paddle.base.default_main_program",
})
STARTUP_PROGRAMS = frozenset({
    "paddle.static.default_startup_program", "paddle.fluid.default_startup_program",
    "paddle.fluid.framework.default_startup_program", "paddle.base.default_startup_program",
})
PROGRAM_GUARDS = frozenset({"paddle.static.program_guard", "paddle.fluid.program_guard",
                            "paddle.fluid.framework.program_guard", "paddle.base.program_guard"})
COMPILED_PROGRAMS = frozenset({"paddle.fluid.CompiledProgram", "paddle.fluid.compiler.CompiledProgram"})
CUDA_PLACES = frozenset({"paddle.CUDAPlace", "paddle.fluid.CUDAPlace", "paddle.base.CUDAPlace"})
CPU_PLACES = frozenset({"paddle.CPUPlace", "paddle.fluid.CPUPlace", "paddle.base.CPUPlace"})


def simple_assignments(q: Query) -> dict[str, list[cst.Assign]]:
    """``name = value`` statements (one plain name target), by name, in file order."""
    found: dict[str, list[cst.Assign]] = {}
    for assign in q.findall(q.module, m.Assign()):
        if len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
            found.setdefault(assign.targets[0].target.value, []).append(assign)
    return found


def optimizer_constructor(q: Query, node: cst.CSTNode) -> str | None:
    """``"paddle.optimizer.SGD"`` when ``node`` constructs one of Paddle's optimizers."""
    for prefix in OPTIMIZER_PREFIXES:
        name = q.callee_starts_with(node, prefix)
        if name and not any(name == p or name.startswith(p + ".") for p in NOT_OPTIMIZERS) \
                and name.rsplit(".", 1)[-1][:1].isupper():
            return name
    return None


def minimize_calls(q: Query) -> Iterator[tuple[cst.Call, cst.CSTNode, str]]:
    """``(call, optimizer expression, optimizer class)`` for every ``<optimizer>.minimize(...)``.

    The optimizer is a construction (``SGD(0.1).minimize(loss)``) or a name assigned one.
    """
    assigned = simple_assignments(q)
    for call in q.findall(q.module, m.Call(func=m.Attribute(attr=m.Name("minimize")))):
        owner = call.func.value
        built = optimizer_constructor(q, owner)
        if built is None and isinstance(owner, cst.Name):
            for assign in assigned.get(owner.value, ()):
                built = built or optimizer_constructor(q, assign.value)
        if built is not None:
            yield call, owner, built


def executor_names(q: Query) -> set[str]:
    """Names assigned an ``Executor(...)``."""
    return {name for name, assigns in simple_assignments(q).items()
            if any(q.is_call_to(a.value, EXECUTORS) for a in assigns)}


def executor_runs(q: Query) -> Iterator[cst.Call]:
    """``exe.run(...)`` calls on an executor the file built."""
    executors = executor_names(q)
    for call in q.findall(q.module, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("run")))):
        if call.func.value.value in executors:
            yield call


def program_kind(q: Query, program: cst.BaseExpression | None, assigned: dict[str, list[cst.Assign]]) -> str:
    """``"main"`` (the program ``minimize`` built: trains), ``"startup"``, or ``"other"`` (a clone, a test program...).

    No program argument means the default main program, as ``Executor.run`` does.
    """
    if program is None or q.is_call_to(program, MAIN_PROGRAMS):
        return "main"
    if q.is_call_to(program, STARTUP_PROGRAMS):
        return "startup"
    if isinstance(program, cst.Name):
        guarded = guarded_programs(q)
        if program.value in guarded:
            return guarded[program.value]
        assigns = assigned.get(program.value, [])
        if len(assigns) == 1:
            value = assigns[0].value
            if q.is_call_to(value, MAIN_PROGRAMS):
                return "main"
            if q.is_call_to(value, STARTUP_PROGRAMS):
                return "startup"
            if _compiled_main(q, value):
                return "compiled"
    return "other"


_GUARDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # per file's Query: computed once, freed with it


def guarded_programs(q: Query) -> dict[str, str]:
    """``{"main": "main", "startup": "startup"}`` for ``with program_guard(main, startup):`` blocks that minimize."""
    if q not in _GUARDED:
        _GUARDED[q] = _guarded_programs(q)
    return _GUARDED[q]


def _guarded_programs(q: Query) -> dict[str, str]:
    found: dict[str, str] = {}
    minimizing = [call for call, _, _ in minimize_calls(q)]
    for with_ in q.findall(q.module, m.With()):
        if not any(q.index.contains(with_, call) for call in minimizing):
            continue
        for item in with_.items:
            if isinstance(item.item, cst.Call) and q.is_call_to(item.item, PROGRAM_GUARDS):
                for position, keyword, kind in ((0, "main_program", "main"), (1, "startup_program", "startup")):
                    arg = argument(item.item, position, keyword)
                    if arg is not None and isinstance(arg.value, cst.Name):
                        found[arg.value.value] = kind
    return found


def _compiled_main(q: Query, value: cst.CSTNode) -> bool:
    """``fluid.CompiledProgram(<main>)`` or ``....with_data_parallel(...)`` on it."""
    if m.matches(value, m.Call(func=m.Attribute(attr=m.Name("with_data_parallel")))):
        value = value.func.value
    return q.is_call_to(value, COMPILED_PROGRAMS)


def names_used(q: Query) -> set[str]:
    return q.names_in(q.module)


def free_name(used: set[str], preferred: str, fallback: str) -> str:
    """``preferred`` when the file does not use it, else ``fallback`` (numbered if that is taken too)."""
    if preferred not in used:
        return preferred
    candidate, n = fallback, 2
    while candidate in used:
        candidate, n = f"{fallback}{n}", n + 1
    return candidate


def leading_imports(module: cst.Module) -> list[cst.SimpleStatementLine]:
    """The import lines at the top of the module (after a docstring), in order."""
    found = []
    for statement in module.body:
        if m.matches(statement, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])):
            found.append(statement)
        elif found or not m.matches(statement, m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])):
            break
    return found
