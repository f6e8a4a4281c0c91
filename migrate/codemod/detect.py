"""Which framework (and which API generation of it) a file is written for, and whether to convert it.

Decided from imports and uses by qualified name, never from words in comments or strings: ``from
torch import distributed as d`` is as distributed as ``import torch.distributed``. A file is
converted only when it uses exactly one framework, that framework has rules (see the registry,
``dpmigrate.frameworks``), and the file is plain single-process code; anything else is left
byte-identical and the engine reports why (a converted file, a script written for data parallelism
by hand, one that starts its own processes, a framework without rules yet, or two frameworks in one
file, which is never half-converted). What "by hand" and "its own processes" mean is each
framework's :class:`~.vocabulary.Vocabulary`. A file that imports no framework itself takes the one its
local modules use (``import setup_mod`` where setup_mod.py imports tensorflow: the CLI reads them and
says so in ``Options.local_frameworks``) when it runs a training step itself (``model.fit(...)``), so the entry
script of a project is not "no framework"; a helper that trains nothing stays as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import libcst as cst
from libcst.metadata import MetadataWrapper

from ..frameworks import REGISTRY, Framework, framework_of_package
from .imported_names import local_trainer_calls
from .index import TreeIndex
from .positions import start_of
from .vocabulary import Vocabulary, matches

Status = Literal["convert", "converted", "hand-distributed", "multiprocessing", "mixed", "unsupported", "none"]

@dataclasses.dataclass(frozen=True)
class Detection:
    """What the file is, what to do with it, and where (1-based) the deciding import or use is."""

    status: Status
    framework: str | None = None  # the framework the file is written for ("torch", ...), if exactly one
    generation: str | None = None  # "eager", "tf1-graph", "tf2-keras", "fluid", "static", "dygraph"...
    frameworks: tuple[str, ...] = ()
    reason: str = ""
    line: int = 1
    col: int = 1


def detect(wrapper: MetadataWrapper, index: TreeIndex | None = None,
           local_frameworks: tuple[tuple[str, str], ...] = (), local_modules: tuple[str, ...] = (),
           local_trainers: tuple[str, ...] = ()) -> Detection:
    """Classify a parsed file; see the module docstring for the statuses.

    ``index`` is the engine's index of the same module, shared with the rules (built if None).
    ``local_frameworks``: (local module name, framework) of the modules beside the file that use one
    (``Options.local_frameworks``): a file that imports no framework itself but ``import setup_mod`` of
    ``("setup_mod", "tensorflow")`` is written for TensorFlow, through that module, when it trains itself or calls
    one of ``local_trainers`` (``Options.local_trainers``: ``main.py`` running ``train_model()`` of ``trainlib``).
    """
    index = index or TreeIndex(wrapper)
    found = _Uses(index, names=False, local_frameworks=local_frameworks)  # imports and method calls first
    index.visit(found)
    through = found.adopt_local_frameworks()
    frameworks = tuple(sorted(found.frameworks))
    where = lambda node: _position(wrapper, node)  # noqa: E731 - tiny local helper
    if not frameworks or (through and not _trains_itself(found, frameworks)  # (a helper of helpers: as before)
                          and not local_trainer_calls(wrapper.module, index, local_modules, local_trainers)):
        return Detection("none", reason="imports no deep-learning framework")
    if found.runtime is not None:
        return Detection(
            "converted", _single(frameworks), frameworks=frameworks,
            reason="already imports dpmigrate.runtime: converted before; left unchanged",
            **where(found.runtime),
        )
    if len(frameworks) > 1:
        first = list(found.frameworks.values())[1]  # the import that brought in a second framework
        return Detection(
            "mixed", frameworks=frameworks,
            reason=f"imports {' and '.join(frameworks)}{f' (through {through})' if through else ''}: a file mixing "
                   "frameworks is never half-converted",
            **where(first),
        )
    framework = frameworks[0]
    rule_set = REGISTRY[framework].rule_set()
    vocabulary: Vocabulary = rule_set.VOCABULARY
    prefixes = _name_prefixes(vocabulary, bool(rule_set.RULES))
    if index.possible(prefixes):  # a use by name could decide it
        packages = tuple(sorted({p.strip(".").split(".", 1)[0] for p in prefixes}))
        found = _Uses(index, names=True, local_frameworks=local_frameworks, packages=packages)
        index.visit(found)
        found.adopt_local_frameworks()
    generation = vocabulary.generation(found.qualified)
    if not rule_set.RULES:
        converted = [r.VOCABULARY.display_name for r in map(Framework.rule_set, REGISTRY.values()) if r.RULES]
        return Detection(
            "unsupported", framework, generation, frameworks,
            reason=f"{vocabulary.display_name} ({generation}) is not supported yet; only "
            f"{' and '.join(converted)} files are converted",
            **where(found.frameworks[framework]),
        )
    distributed = found.first(vocabulary.distributed_prefixes, ())
    if distributed is not None:
        return Detection(
            "hand-distributed", framework, generation, frameworks,
            reason=f"already uses {vocabulary.distributed_description}: "
            "written for data parallelism by hand; left unchanged",
            **where(distributed),
        )
    processes = found.first(vocabulary.multiprocessing_prefixes, vocabulary.multiprocessing_methods)
    if processes is not None:
        return Detection(
            "multiprocessing", framework, generation, frameworks,
            reason=f"starts its own processes with {vocabulary.multiprocessing_description}; left unchanged",
            **where(processes),
        )
    reason = (f"imports no framework itself: {vocabulary.display_name} comes through its local module{'s' * (',' in through)} "
              f"{through}, so it is converted as a {vocabulary.display_name} script" if through else "")
    return Detection("convert", framework, generation, frameworks, reason, **where(found.frameworks[framework]))


def _trains_itself(found: _Uses, frameworks: tuple[str, ...]) -> bool:
    """The file runs a training step of one of ``frameworks`` itself (``model.fit(...)``, ``loss.backward()``):
    only then is a file whose framework comes through its local modules that framework's script."""
    vocabularies = [REGISTRY[f].rule_set().VOCABULARY for f in frameworks]
    return found.first((), tuple(m for v in vocabularies for m in (*v.backward_methods, *v.optimizer_step_methods))) \
        is not None


def _name_prefixes(vocabulary: Vocabulary, has_rules: bool) -> list[str]:
    """The qualified-name prefixes detection asks about (generations; for a framework with rules,
    hand-written distribution and process starting). Only when the file could use one of them are
    the qualified names of its names and attributes computed."""
    prefixes = [prefix for prefix, _ in vocabulary.generations]
    if has_rules:
        prefixes += [*vocabulary.distributed_prefixes, *vocabulary.multiprocessing_prefixes]
    return prefixes


def _single(frameworks: tuple[str, ...]) -> str | None:
    return frameworks[0] if len(frameworks) == 1 else None


def _position(wrapper: MetadataWrapper, node: cst.CSTNode) -> dict[str, int]:
    line, col = start_of(wrapper.module, node)
    return {"line": line, "col": col}


def _dotted(node: cst.BaseExpression | None) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


class _Uses(cst.CSTVisitor):
    """Collects the first import of each framework, and every qualified name and method call in order."""

    def __init__(self, index: TreeIndex, *, names: bool, local_frameworks: tuple[tuple[str, str], ...] = (),
                 packages: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.index = index
        self.names = names  # False: skip the qualified names of names and attributes (imports only)
        # the packages detection asks about: a name's qualified names outside them are never asked for, so
        # they are not computed (most files then need no scope analysis: see TreeIndex.qualified_names_under)
        self.packages = packages
        self.frameworks: dict[str, cst.CSTNode] = {}
        self.local: dict[str, list[str]] = {}  # local module name -> the frameworks it uses
        for module, framework in local_frameworks:
            self.local.setdefault(module, []).append(framework)
        self.through: dict[str, tuple[cst.CSTNode, str]] = {}  # framework -> (first import of it, local module)
        self.qualified: set[str] = set()
        self.runtime: cst.CSTNode | None = None
        self._uses: list[tuple[cst.CSTNode, str, str]] = []  # (node, "name" | "method", what), in order

    def adopt_local_frameworks(self) -> str:
        """A file importing no framework itself is written for those of the local modules it imports: take
        them (each at its module's import) and return those modules' names, or "" when it imports one itself."""
        if self.frameworks or not self.through:
            return ""
        self.frameworks = {framework: node for framework, (node, _) in self.through.items()}
        return ", ".join(sorted({module for _, module in self.through.values()}))

    def first(self, prefixes: tuple[str, ...], methods: tuple[str, ...]) -> cst.CSTNode | None:
        """The first node using a name under ``prefixes`` or calling a method in ``methods``."""
        for node, kind, what in self._uses:
            if (kind == "name" and matches(what, prefixes)) or (kind == "method" and what in methods):
                return node
        return None

    def _imported(self, node: cst.CSTNode, module: str, names: list[str]) -> None:
        framework = framework_of_package(module.split(".")[0])
        if framework is not None:
            self.frameworks.setdefault(framework, node)
        self._local(node, module.split(".")[0])
        if module == "dpmigrate.runtime" or module.startswith("dpmigrate.runtime."):
            self.runtime = self.runtime or node
        for full in [module, *(f"{module}.{n}" for n in names)]:
            self._used(node, full)

    def _used(self, node: cst.CSTNode, name: str) -> None:
        self.qualified.add(name)
        self._uses.append((node, "name", name))

    # An import's own names are recorded whole by _imported: its children are not visited (their qualified
    # names would add nothing, and a name inside an import is not a use the index can name without scopes).

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            self._imported(node, _dotted(alias.name), [])
        return False

    def _local(self, node: cst.CSTNode, module: str) -> None:
        for framework in self.local.get(module, ()):
            self.through.setdefault(framework, (node, module))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if node.relative or node.module is None:
            if len(node.relative) == 1 and not isinstance(node.names, cst.ImportStar):  # from . import setup_mod
                for module in [_dotted(node.module)] if node.module else [_dotted(a.name) for a in node.names]:
                    self._local(node, module.split(".")[0])
            return False
        names = [] if isinstance(node.names, cst.ImportStar) else [_dotted(a.name) for a in node.names]
        if _dotted(node.module) == "dpmigrate" and "runtime" in names:
            self.runtime = self.runtime or node
        self._imported(node, _dotted(node.module), names)
        return False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._used_by_name(node)

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Attribute):
            self._uses.append((node, "method", node.func.attr.value))

    def visit_Name(self, node: cst.Name) -> None:
        self._used_by_name(node)

    def _used_by_name(self, node: cst.Name | cst.Attribute) -> None:
        if self.names:
            for package in self.packages:
                for qualified in sorted(self.index.qualified_names_under(node, package)):
                    self._used(node, qualified)
