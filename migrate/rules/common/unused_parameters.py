"""Layers a model's ``forward`` calls only under a condition, or never: the gradient reducer must not wait for them.

Why: DDP and Paddle's DataParallel wait, each step, for a gradient of every parameter before all-reducing. A
layer ``forward`` calls only when ``if paddle.rand([1]) > 0.5`` holds (Paddle's dynamic-graph tutorial), or one
``__init__`` builds and nothing calls, gives none in some steps: the second step fails on every rank
("parameter ... has been ready before. Please set find_unused_parameters=True"; the issue 19 audit), where the
original runs. ``dp.Strategy(find_unused_parameters=True)`` in ``dp.init`` (init-runtime writes it) makes the
reducer look for them each step, at some cost in speed. Classes of the file with a ``forward``, and those of its
local modules the script builds (``local_models.py`` reads them: stochastic depth in ``models/resnet.py``).
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from ...codemod.flow import self_attribute
from ...codemod.query import body_statements

_CONDITIONAL = (cst.If, cst.IfExp, cst.While)
# layers with no parameters: a reducer never waits for them (a FashionMNIST script's unused MaxPool2D, round Q)
_NO_PARAMETERS = frozenset(f"{package}.{name}" for package in ("torch.nn", "paddle.nn") for name in (
    *(f"{kind}{d}{case}" for kind in ("MaxPool", "AvgPool", "AdaptiveAvgPool", "AdaptiveMaxPool", "LPPool")
      for d in "123" for case in ("d", "D")),
    *(f"{kind}{d}{case}" for kind in ("Dropout", "ZeroPad", "ReflectionPad", "ReplicationPad", "ConstantPad")
      for d in "123" for case in ("d", "D")),
    "Dropout", "AlphaDropout", "FeatureAlphaDropout", "Flatten", "Unflatten", "Identity", "Upsample",
    "UpsamplingNearest2D", "UpsamplingBilinear2D", "UpsamplingNearest2d", "UpsamplingBilinear2d", "PixelShuffle",
    "ReLU", "ReLU6", "LeakyReLU", "GELU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "ELU", "SELU", "CELU", "SiLU",
    "Silu", "Swish", "Hardswish", "Hardsigmoid", "Hardtanh", "Mish", "Softplus", "Softsign", "Tanhshrink",
    "Softshrink", "Hardshrink", "LogSigmoid", "Softmax2D", "Softmax2d", "ThresholdedReLU", "Threshold"))


@dataclasses.dataclass(frozen=True)
class Unreached:
    """A model whose ``forward`` does not call every layer each step: what to say of it, and where."""

    said: str
    site: cst.CSTNode


def unreached_layers(ctx) -> list[Unreached]:
    """The first layer of each model class of the file that ``forward`` does not call on every step."""
    q = ctx.query
    found = []
    for cls in (s for s in ctx.module.body if isinstance(s, cst.ClassDef) and s.bases):
        methods = {s.name.value: s for s in body_statements(cls) if isinstance(s, cst.FunctionDef)}
        init, forward = methods.get("__init__"), methods.get("forward")
        if init is None or forward is None:
            continue
        built = _layers_built(q, init)
        read = {self_attribute(a) for name, m in methods.items() if name != "__init__"
                for a in q.index.of_type(m, cst.Attribute)} | _read_in_init(q, init)
        never = next((layer for layer, site in built.items() if layer not in read), None)
        if never is not None:
            found.append(Unreached(f"{cls.name.value}.forward never calls self.{never}", built[never]))
            continue
        for call in q.index.of_type(forward, cst.Call):
            layer = self_attribute(call.func)
            if layer in built and any(isinstance(a, _CONDITIONAL) and not q.index.contains(a.test, call)
                                      for a in _ancestors_within(q, call, forward)):
                found.append(Unreached(f"{cls.name.value}.forward calls self.{layer} under a condition", call))
                break
    local = ctx.options.local_unreached_layer_models
    if local and q.index.possible(local):
        for call in q.index.of_type(ctx.module, cst.Call):
            if q.is_call_to(call, local):
                name = next(iter(q.qualified_names(call.func) & set(local)))
                module, cls = name.rsplit(".", 1)
                found.append(Unreached(f"{cls} (a model class of {module}) calls a layer in forward only under a "
                                       "condition, or never", call))
                break
    return found


def _layers_built(q, init: cst.FunctionDef) -> dict[str, cst.CSTNode]:
    """``self.x = Something(...)`` of ``__init__``: attribute -> the statement (not layers without parameters:
    pooling, activations, dropout)."""
    built = {}
    for statement in q.index.of_type(init, cst.SimpleStatementLine):
        small = statement.body[0] if len(statement.body) == 1 else None
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Call):
            layer = self_attribute(small.targets[0].target)
            if layer is not None and not q.is_call_to(small.value, _NO_PARAMETERS):
                built.setdefault(layer, statement)
    return built


def _read_in_init(q, init: cst.FunctionDef) -> set[str | None]:
    """Attributes ``__init__`` reads after building them (``self.head = nn.Sequential(self.fc, ...)``)."""
    assigned = {id(s.body[0].targets[0].target) for s in q.index.of_type(init, cst.SimpleStatementLine)
                if len(s.body) == 1 and isinstance(s.body[0], cst.Assign) and len(s.body[0].targets) == 1}
    return {self_attribute(a) for a in q.index.of_type(init, cst.Attribute) if id(a) not in assigned}


def _ancestors_within(q, node: cst.CSTNode, stop: cst.CSTNode):
    for ancestor in q.ancestors(node):
        if ancestor is stop:
            return
        yield ancestor
