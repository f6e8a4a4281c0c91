"""A file dpmigrate converted before, passed without loading libcst when it cannot hold rank-divergent code.

A converted file is left unchanged; all the engine does with it is the rank-divergence check (a collective,
barrier or save that only some ranks reach). That costs libcst's import and a parse, about 0.4 s, on every
pre-commit run over the project's training scripts. Python's own ``ast`` (a few milliseconds) tells the common
case apart: no test in the file looks at a rank (``dp.is_main_process()``, ``rank == 0``, a name such as
``is_main`` or ``local_rank``, ``os.environ``) around a call that could meet the other ranks, a call of one of the
file's own functions, or a ``break``/``return``. Then the engine has nothing to report but that the file was
converted before, which this module says itself, exactly as the engine would. Anything it cannot rule out goes
to the engine. Torch and TensorFlow conversions only (Paddle's checks also look at retired APIs).
"""

from __future__ import annotations

import ast
import re

from ..findings import Conversion, Finding
from ..frameworks import framework_of_package

DETECT_RULE = "detect-framework"  # the engine's name for its detection findings (dpmigrate.codemod.engine)
_RANKISH = re.compile(r"rank|main|master|chief|worker|local|node|process_index|environ|first", re.IGNORECASE)
_MEETS = {  # calls that may meet the other ranks: collectives, saves, wrapping, training and Keras' model calls
    "all_reduce", "allreduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list", "barrier",
    "reduce", "reduce_scatter", "scatter", "gather", "send", "recv", "isend", "irecv", "all_to_all", "alltoall",
    "new_group", "wait", "save", "save_weights", "main_process_first", "distributed_model", "distributed_optimizer",
    "distributed_loader", "DataParallel", "DistributedDataParallel", "fit", "evaluate", "predict", "train_on_batch",
    "test_on_batch", "backward", "step", "minimize", "apply_gradients", "init", "init_process_group", "run",
}


def quiet_conversion(source: bytes, path: str, framework_asked: str = "auto") -> Conversion | None:
    """The engine's result for an already-converted torch/TF file with nothing to check, or None (ask the engine)."""
    if b"dpmigrate.runtime" not in source:
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None  # the engine reports it
    imports = _imports(tree)
    runtimes = [(node, name) for node, name in imports if name == "dpmigrate.runtime" or name.startswith(
        "dpmigrate.runtime.") or name == "dpmigrate.runtime"]
    frameworks = {framework_of_package(name.split(".")[0]) for _, name in imports} - {None}
    if not runtimes or not frameworks <= {"torch", "tensorflow"} or not frameworks:
        return None  # Paddle, or no framework imported (the engine decides those)
    framework = frameworks.pop() if len(frameworks) == 1 else None
    if framework_asked not in ("auto", framework):
        return None  # the engine declines it, saying so
    functions = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(tree):
        test = _test_of(node)
        if test is not None and _rankish(test) and _may_meet(node, functions):
            return None
    statement = runtimes[0][0]
    finding = Finding(path, statement.lineno, statement.col_offset + 1, DETECT_RULE, "note",
                      "already imports dpmigrate.runtime: converted before; left unchanged")
    return Conversion(path=path, original=source, output=source, findings=(finding,), framework=framework)


def _imports(tree: ast.Module) -> list[tuple[ast.stmt, str]]:
    """(statement, module or module.name) of every absolute import, in the order the engine reads them."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node, node.module), *((node, f"{node.module}.{a.name}") for a in node.names)]
    return sorted(found, key=lambda item: (item[0].lineno, item[0].col_offset))


def _test_of(node: ast.AST) -> ast.AST | None:
    if isinstance(node, (ast.If, ast.IfExp, ast.While)):
        return None if _is_main_guard(node.test) else node.test
    if isinstance(node, ast.BoolOp):
        return node.values[0]
    return None


def _is_main_guard(test: ast.AST) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _rankish(test: ast.AST) -> bool:
    for node in ast.walk(test):
        word = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else (
            node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
        if word and _RANKISH.search(word):
            return True
    return False


def _may_meet(node: ast.AST, functions: set[str]) -> bool:
    parts = node.values[1:] if isinstance(node, ast.BoolOp) else (
        [node.body, node.orelse] if isinstance(node, ast.IfExp) else [*node.body, *node.orelse])
    for part in parts:
        for inner in ast.walk(part):
            if isinstance(inner, (ast.Break, ast.Continue, ast.Return)):
                return True
            if isinstance(inner, ast.Call):
                func = inner.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name in _MEETS or name in functions:
                    return True
    return False
