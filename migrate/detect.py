"""Which framework (and which API generation of it) a file is written for, and whether to convert it.

Decided from imports and uses by qualified name, never from words in comments or strings: ``from
torch import distributed as d`` is as distributed as ``import torch.distributed``. A file is
converted only when it is plain single-process PyTorch; anything else is left byte-identical and the
engine reports why (a converted file, a hand-written DDP script, Hogwild-style multiprocessing, a
framework not supported yet, or two frameworks in one file, which is never half-converted).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .rules._index import TreeIndex
from .frameworks import FRAMEWORK_OF_PACKAGE

Status = Literal["convert", "converted", "hand-distributed", "multiprocessing", "mixed", "unsupported", "none"]

FRAMEWORK_ROOTS = FRAMEWORK_OF_PACKAGE
SUPPORTED = {"torch"}

_DISTRIBUTED = (
    "torch.distributed",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.utils.data.DistributedSampler",
    "torch.utils.data.distributed.DistributedSampler",
)
_MULTIPROCESSING = tuple(  # what starts processes, not e.g. set_sharing_strategy
    f"torch.multiprocessing.{n}" for n in ("Process", "spawn", "start_processes", "Pool", "get_context")
)

_GENERATIONS = {  # qualified-name prefix -> generation, first match wins (most specific first)
    "tensorflow": (
        ("tensorflow.keras.utils.multi_gpu_model", "keras-multi-gpu"),
        ("keras.utils.multi_gpu_model", "keras-multi-gpu"),
        ("tensorflow.compat.v1", "tf1-graph"),
        ("tensorflow.Session", "tf1-graph"),
        ("tensorflow.placeholder", "tf1-graph"),
        ("tensorflow.GradientTape", "tf2-custom-loop"),
        ("tensorflow.keras", "tf2-keras"),
        ("keras", "tf2-keras"),
    ),
    "paddle": (
        ("paddle.fluid", "fluid"),
        ("paddle.static", "static"),
        ("paddle.enable_static", "static"),
    ),
}
_DEFAULT_GENERATION = {"torch": "eager", "tensorflow": "tf2", "paddle": "dygraph"}


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


def detect(wrapper: MetadataWrapper, index: TreeIndex | None = None) -> Detection:
    """Classify a parsed file; see the module docstring for the statuses.

    ``index`` is the engine's index of the same module, shared with the rules (built if None).
    """
    index = index or TreeIndex(wrapper)
    found = _Uses(index)
    index.visit(found)
    frameworks = tuple(sorted(found.frameworks))
    where = lambda node: _position(wrapper, node)  # noqa: E731 - tiny local helper
    if not frameworks:
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
            reason=f"imports {' and '.join(frameworks)}: a file mixing frameworks is never half-converted",
            **where(first),
        )
    framework = frameworks[0]
    generation = _generation(framework, found.qualified)
    if framework not in SUPPORTED:
        return Detection(
            "unsupported", framework, generation, frameworks,
            reason=f"{framework} ({generation}) is not supported yet; only PyTorch files are converted",
            **where(found.frameworks[framework]),
        )
    if found.distributed is not None:
        return Detection(
            "hand-distributed", framework, generation, frameworks,
            reason="already uses torch.distributed / DistributedDataParallel / DistributedSampler: "
            "written for data parallelism by hand; left unchanged",
            **where(found.distributed),
        )
    if found.multiprocessing is not None:
        return Detection(
            "multiprocessing", framework, generation, frameworks,
            reason="starts its own processes with torch.multiprocessing (Hogwild-style training); "
            "left unchanged",
            **where(found.multiprocessing),
        )
    return Detection("convert", framework, generation, frameworks, **where(found.frameworks[framework]))


def _single(frameworks: tuple[str, ...]) -> str | None:
    return frameworks[0] if len(frameworks) == 1 else None


def _generation(framework: str, qualified: set[str]) -> str:
    for prefix, generation in _GENERATIONS.get(framework, ()):
        if any(q == prefix or q.startswith(prefix + ".") for q in qualified):
            return generation
    return _DEFAULT_GENERATION[framework]


def _position(wrapper: MetadataWrapper, node: cst.CSTNode) -> dict[str, int]:
    start = wrapper.resolve(PositionProvider)[node].start
    return {"line": start.line, "col": start.column + 1}


def _dotted(node: cst.BaseExpression | None) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


def _matches(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


class _Uses(cst.CSTVisitor):
    """Collects the first import of each framework and the first distributed/multiprocessing use."""

    def __init__(self, index: TreeIndex) -> None:
        super().__init__()
        self.index = index
        self.frameworks: dict[str, cst.CSTNode] = {}
        self.qualified: set[str] = set()
        self.runtime: cst.CSTNode | None = None
        self.distributed: cst.CSTNode | None = None
        self.multiprocessing: cst.CSTNode | None = None

    def _imported(self, node: cst.CSTNode, module: str, names: list[str]) -> None:
        root = module.split(".")[0]
        if root in FRAMEWORK_ROOTS:
            self.frameworks.setdefault(FRAMEWORK_ROOTS[root], node)
        if module == "dpmigrate.runtime" or module.startswith("dpmigrate.runtime."):
            self.runtime = self.runtime or node
        for full in [module, *(f"{module}.{n}" for n in names)]:
            self._used(node, full)

    def _used(self, node: cst.CSTNode, name: str) -> None:
        self.qualified.add(name)
        if self.distributed is None and _matches(name, _DISTRIBUTED):
            self.distributed = node
        if self.multiprocessing is None and _matches(name, _MULTIPROCESSING):
            self.multiprocessing = node

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self._imported(node, _dotted(alias.name), [])

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None:
            return
        names = [] if isinstance(node.names, cst.ImportStar) else [_dotted(a.name) for a in node.names]
        if _dotted(node.module) == "dpmigrate" and "runtime" in names:
            self.runtime = self.runtime or node
        self._imported(node, _dotted(node.module), names)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        for qualified in self.index.qualified_names(node):
            self._used(node, qualified)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "share_memory":  # Hogwild's shared model
            self.multiprocessing = self.multiprocessing or node

    def visit_Name(self, node: cst.Name) -> None:
        for qualified in self.index.qualified_names(node):
            self._used(node, qualified)
