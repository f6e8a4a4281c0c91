"""What the model classes of a script's local modules do that the conversion must know: which build batch
normalisation layers, and which call a layer in ``forward`` only under a condition (or never).

Why batch normalisation: a model written in ``models/resnet.py`` (``self.bn1 = nn.BatchNorm2D(64)``) and built by the script
(``model = ResNet18()``) normalises over each rank's share once launched, like one written in the script, but
the batch-norm note looked only at the script's own calls (image_classification_paddle, issue 19 audit: its
ranks printed different validation figures with nothing said). Named as the script imports them
(``models.resnet.ResNet18``), they join the framework's library models in ``BatchNormLayers``.
Why the layers: a model class in ``models/resnet.py`` whose ``forward`` skips a block at random (stochastic
depth: Paddle-Stochastic-Depth-ResNet110, issue 19 audit) gives some parameters no gradient in a step, and the
reducer then fails the second step unless ``dp.Strategy(find_unused_parameters=True)`` (``unused_parameters.py``
looks at the script's own classes; this, at its modules'). Why the training functions: a script that hands its
DataLoader to a local module's ``train_per_epoch(loader, model, opt, ...)``, whose loop trains, had the loader
declined as one whose use could not be told (the stochastic-depth ResNet's ``models/utils.py``): the parameter
positions that such a loop iterates make it a training loader. A module is parsed only when its text names a
batch normalisation class, defines ``forward`` or calls ``.backward(``.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable

_MARK = b"BatchNorm"  # torch BatchNorm2d, Paddle BatchNorm2D, Keras BatchNormalization, SyncBatchNorm
# library models built of batch normalisation layers (torchvision's and paddle.vision's names), which a local helper
# may build and return (``def build_model(name): return mobilenet_v3_small(...)``: a steel-defect classifier, round I)
_LIBRARY_MODELS = re.compile(rb"\b(resnet\d+\w*|resnext\d+\w*|wide_resnet\d+_2|mobilenet_v[123]\w*|densenet\d+"
                             rb"|inception_v3|shufflenet_v2\w*|efficientnet_\w+|vgg\d+_bn)\b")


_NONE: tuple[tuple[str, ...], ...] = ((), (), (), ())


def model_facts(folder: str, files: Iterable[str], cache: dict) -> tuple[list[str], ...]:
    """``module.Name`` (dotted from ``folder``) of the top-level classes and functions of ``files`` that build a
    batch normalisation layer (directly or through another such definition of their module), and of the classes
    whose ``forward`` calls a layer of theirs only under a condition, or never; and ``module.function:index:name``
    of the parameters a training loop of a top-level function iterates; ``module.function`` of the top-level
    functions that run a backward pass (directly or through one another). ``cache`` (real path -> facts) is the
    run's: a module many files import is read once."""
    found: tuple[list[str], ...] = ([], [], [], [])
    for file in files:
        real = os.path.realpath(file)
        facts = cache.get(real)
        if facts is None:
            facts = cache[real] = _facts_of(file)
        if any(facts):
            module = os.path.relpath(file, folder).removesuffix(".py").replace(os.sep, ".").removesuffix(".__init__")
            for kind, names in zip(found, facts):
                kind.extend(f"{module}.{name}" for name in names)
    return found


def _facts_of(file: str, depth: int = 0) -> tuple[tuple[str, ...], ...]:
    try:
        with open(file, "rb") as f:
            source = f.read()
    except OSError:
        return _NONE
    if os.path.basename(file) == "__init__.py" and depth < 3 and b"from ." in source:
        return _reexported(file, source, depth)
    library = _LIBRARY_MODELS.search(source) is not None
    if _MARK not in source and not library and b"def forward" not in source and b".backward(" not in source:
        return _NONE
    try:
        tree = ast.parse(source, file)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _NONE
    trains = b".backward(" in source
    return (tuple(sorted(_builders(tree))) if _MARK in source or library else (), tuple(sorted(_unreached(tree))),
            tuple(_training_parameters(tree)) if trains else (), tuple(sorted(_trainers(tree))) if trains else ())


def _reexported(file: str, source: bytes, depth: int) -> tuple[tuple[str, ...], ...]:
    """A package's ``__init__.py`` re-exporting its modules' names (``from .net import *``, ``from .net import
    Net``): their facts, under the package's name (``from models import Net`` calls ``models.Net``)."""
    try:
        tree = ast.parse(source, file)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _NONE
    found: tuple[set[str], ...] = (set(), set(), set(), set())
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            inner = _facts_of(os.path.join(os.path.dirname(file), *node.module.split(".")) + ".py", depth + 1)
            names = {a.name for a in node.names}
            keep = (lambda n: True) if names == {"*"} else names.__contains__
            for kind, facts in zip(found, inner):
                kind.update(n for n in facts if keep(n.split(":", 1)[0]))
    return tuple(tuple(sorted(kind)) for kind in found)


def _training_parameters(tree: ast.Module) -> list[str]:
    """``function:index:name`` of each parameter of a top-level function that a ``for`` loop of it iterates
    (``loader``, ``enumerate(loader)``, ``tqdm(loader)``, ``loader()``) when that loop calls ``.backward()`` or an
    optimizer's ``.step()``."""
    found = []
    for function in (d for d in tree.body if isinstance(d, ast.FunctionDef)):
        parameters = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
        for loop in (n for n in ast.walk(function) if isinstance(n, ast.For)):
            iterated = _iterated_name(loop.iter)
            if iterated in parameters and _trains(loop):
                entry = f"{function.name}:{parameters.index(iterated)}:{iterated}"
                if entry not in found:
                    found.append(entry)
    return found


def _trainers(tree: ast.Module) -> set[str]:
    """Top-level functions that run a backward pass or an optimizer step, directly or through one another
    (``main.py`` calling ``train.train_model()``, the stochastic-depth ResNet's entry point)."""
    functions = {d.name: d for d in tree.body if isinstance(d, ast.FunctionDef)}
    found = {name for name, f in functions.items() if _trains(f)}
    calls = {name: {n.func.id for n in ast.walk(f) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
             for name, f in functions.items()}
    changed = True
    while changed:
        changed = False
        for name in functions:
            if name not in found and calls[name] & found:
                found.add(name)
                changed = True
    return found


def _iterated_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in ("len", "range")):
        if not node.args:  # loader()
            node = node.func
            break
        node = node.args[0]  # enumerate(loader), tqdm(loader, ...)
    return node.id if isinstance(node, ast.Name) else None


def _trains(block: ast.AST) -> bool:
    for node in ast.walk(block):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if node.func.attr == "backward" or (node.func.attr in ("step", "minimize") and isinstance(owner, ast.Name)
                                                 and "opt" in owner.id.lower()):
                return True
    return False


def _unreached(tree: ast.Module) -> set[str]:
    """Classes whose ``forward`` calls a ``self.x`` built in ``__init__`` under an ``if``/``while`` (not in its
    test), or whose ``__init__`` builds a ``self.x`` no other method reads."""
    found = set()
    for cls in (d for d in tree.body if isinstance(d, ast.ClassDef) and d.bases):
        methods = {d.name: d for d in cls.body if isinstance(d, ast.FunctionDef)}
        init, forward = methods.get("__init__"), methods.get("forward")
        if init is None or forward is None:
            continue
        built = {t.attr for s in ast.walk(init) if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
                 for t in s.targets if _is_self_attribute(t)}
        read = {n.attr for name, m in methods.items() if name != "__init__" for n in ast.walk(m)
                if _is_self_attribute(n)}
        if built - read - _read_in_init(init):
            found.add(cls.name)
            continue
        for block in ast.walk(forward):
            if isinstance(block, (ast.If, ast.While, ast.IfExp)):
                branches = [block.body, block.orelse] if not isinstance(block, ast.IfExp) else [[block.body], [block.orelse]]
                if any(isinstance(n, ast.Call) and _is_self_attribute(n.func) and n.func.attr in built
                       for part in branches for statement in part for n in ast.walk(statement)):
                    found.add(cls.name)
                    break
    return found


def _is_self_attribute(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _read_in_init(init: ast.FunctionDef) -> set[str]:
    stored = {id(t) for s in ast.walk(init) if isinstance(s, ast.Assign) for t in s.targets}
    return {n.attr for n in ast.walk(init) if _is_self_attribute(n) and id(n) not in stored}


def _builders(tree: ast.Module) -> set[str]:
    definitions = {d.name: d for d in tree.body if isinstance(d, (ast.ClassDef, ast.FunctionDef))}
    names = {d: {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
                 if isinstance(n, (ast.Name, ast.Attribute))} for d, node in definitions.items()}
    builders = {d for d, used in names.items()
                if any("BatchNorm" in u or _LIBRARY_MODELS.fullmatch(u.encode()) for u in used)}
    changed = True
    while changed:  # def resnet18(): return ResNet(BasicBlock, ...)
        changed = False
        for d, used in names.items():
            if d not in builders and used & builders:
                builders.add(d)
                changed = True
    return builders
