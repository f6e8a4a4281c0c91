"""Follow a device held in a variable back to where it is chosen, and decline a fixed GPU.

``rank-device`` rewrites the device expressions it can see (``torch.device("cuda")``, ``.cuda()``).
A device reaching ``.to(device)`` through a variable, a function parameter or a default value is
another matter: ``device = 0`` passed to ``main(device)`` puts every rank on GPU 0, and DDP's
``device_ids`` then do not match the parameters. This rule traces each ``.to(NAME)`` /
``device=NAME`` / ``torch.device(NAME)`` use back through assignments in its scope, module globals,
and the call sites (or defaults) of the function whose parameter it is, and classifies what it finds.
"""

from __future__ import annotations

import libcst as cst

from ...codemod.calls import argument
from ...codemod.flow import self_attribute
from ...codemod.rule import Rule
from .rank_device import cpu_string, cuda_string, cuda_template

_RANK = "rank"  # rank-device turns it into dp.device(): right on every rank
_FINE = "fine"  # the CPU, "cuda" without an index (dp.init() pins it), a tensor's own device
_FIXED = "fixed"  # a GPU index: the same card on every rank
_UNKNOWN = "unknown"
_DEPTH = 4
_CUDA_AVAILABLE = "torch.cuda.is_available"
_DEVICE_CALLS = {"torch.device"}


class DeviceVariable(Rule):
    """A device variable that names one fixed GPU: ``device = 0`` becomes ``dp.local_rank()``; others declined.

    Why: launched on N processes every rank would use that one GPU; nothing in the converted script
    would say so. ``dp.device()`` is this rank's GPU.
    Example:  device = 0    ->  device = dp.local_rank()     (as the DDP tutorial's multi-GPU script does)
              main(device)
    Declined, with the fix: ``"cuda:1"``, a default value (``def main(device=0)``: evaluated at import),
    and a device that cannot be traced.
    Leaves alone: devices that ``rank-device`` converts, the CPU, ``"cuda"`` without an index (the
    GPU ``dp.init()`` pins), a tensor's ``.device``, and attributes such as ``args.device`` (a flag
    whose default is normally ``"cuda"``).
    """

    name = "device-variable"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._reported: set[int] = set()
        self._calls_by_name: dict[str, list[cst.Call]] | None = None  # f(...) by f, built once
        self._assigned: dict[int, dict[str, list[cst.BaseExpression]]] = {}  # scope -> name -> values

    def _calls_of(self, name: str) -> list[cst.Call]:
        if self._calls_by_name is None:
            self._calls_by_name = {}
            for call in self.q.index.of_type(self.ctx.module, cst.Call):
                if isinstance(call.func, cst.Name):
                    self._calls_by_name.setdefault(call.func.value, []).append(call)
        return self._calls_by_name.get(name, [])

    def visit_Call(self, node: cst.Call) -> None:
        for value in self._device_arguments(node):
            if isinstance(value, cst.Name) or self_attribute(value) is not None:
                self._check(value)

    def _device_arguments(self, call: cst.Call):
        func = call.func
        positional = [a for a in call.args if a.keyword is None]
        if isinstance(func, cst.Attribute) and func.attr.value == "to" and positional:
            yield positional[0].value
        elif self.q.is_call_to(call, _DEVICE_CALLS) and positional:
            yield positional[0].value
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == "device":
                yield arg.value

    def _check(self, name: cst.Name | cst.Attribute) -> None:
        origins = self._origins(name, _DEPTH, set())
        shown = name.value if isinstance(name, cst.Name) else f"self.{name.attr.value}"
        for kind, node in origins:
            if kind == _FIXED and id(node) not in self._reported:
                self._reported.add(id(node))
                if isinstance(node, cst.Integer) and isinstance(self.q.parent(node), cst.Assign):
                    self.ctx.plan.replace(node, lambda _: self.dp("local_rank()"))
                    self.report(
                        node, "change",
                        f"`{self._where(node)}` (GPU {node.value}) -> dp.local_rank(): this rank's GPU index, "
                        f"used as the device `{shown}`",
                    )
                    continue
                self.report(
                    node, "declined",
                    f"`{self._where(node)}` is a fixed GPU, used as the device `{shown}`: launched on N "
                    "processes every rank would use that one card",
                    f"use dp.device() (this rank's GPU, or the CPU) where `{shown}` is chosen",
                )
        unknown = [node for kind, node in origins if kind == _UNKNOWN]
        if unknown and not any(kind == _FIXED for kind, _ in origins) and id(unknown[0]) not in self._reported:
            self._reported.add(id(unknown[0]))
            self.report(
                unknown[0], "declined",
                f"cannot tell which device `{self.code(unknown[0])}` is (used as `{shown}`): if it names "
                "one GPU, every rank would use that card",
                f"if it is a CUDA device, use dp.device() where `{shown}` is chosen",
            )

    def _where(self, node: cst.CSTNode) -> str:
        """``device = 0`` for a value assigned on its own line, else the value itself."""
        statement = self.q.statement_of(node)
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            text = self.code(statement.body[0]).strip()
            if len(text) <= 60:
                return text
        return self.code(node)

    # --- tracing ----------------------------------------------------------------------------------

    def _origins(self, name: cst.Name | cst.Attribute, depth: int, seen: set[int]) -> list[tuple[str, cst.CSTNode]]:
        """(kind, expression) for every value ``name`` (or ``self.name``) can hold where it is used."""
        if depth == 0 or id(name) in seen:
            return []
        seen.add(id(name))
        if isinstance(name, cst.Attribute):
            return self._attribute_origins(name, depth, seen)
        function = self.q.function_of(name)
        found = self._assigned_values(function, name.value)
        if function is not None and not found:
            parameter = _parameter(function, name.value)
            if parameter is not None:
                return self._arguments(function, parameter, depth, seen)
            found = self._assigned_values(None, name.value)
        result: list[tuple[str, cst.CSTNode]] = []
        for value in found:
            result.extend(self._classify(value, depth, seen))
        return result

    def _assigned_values(self, function: cst.FunctionDef | None, name: str) -> list[cst.BaseExpression]:
        scope = function if function is not None else self.ctx.module
        if id(scope) not in self._assigned:  # every plain `name = value` of the scope, gathered once
            found: dict[str, list[cst.BaseExpression]] = {}
            for statement in self.q.index.of_type(scope, cst.Assign):
                if self.q.function_of(statement) is not function:
                    continue
                for target in statement.targets:
                    if isinstance(target.target, cst.Name):
                        found.setdefault(target.target.value, []).append(statement.value)
            self._assigned[id(scope)] = found
        return self._assigned[id(scope)].get(name, [])

    def _attribute_origins(self, attribute: cst.Attribute, depth: int, seen: set[int]) -> list[tuple[str, cst.CSTNode]]:
        """``self.gpu_id``: the values its class assigns to it (``self.gpu_id = gpu_id`` in ``__init__``)."""
        cls = next((a for a in self.q.ancestors(attribute) if isinstance(a, cst.ClassDef)), None)
        if cls is None:
            return [(_FINE, attribute)]
        result: list[tuple[str, cst.CSTNode]] = []
        for assign in self.q.index.of_type(cls, cst.Assign):
            for target in assign.targets:
                if self_attribute(target.target) == attribute.attr.value:
                    result.extend(self._classify(assign.value, depth, seen))
        return result

    def _arguments(self, function: cst.FunctionDef, parameter: tuple[int, cst.Param], depth: int, seen: set[int]):
        index, param = parameter
        called = function.name.value
        cls = next((a for a in self.q.ancestors(function) if isinstance(a, cst.ClassDef)), None)
        if cls is not None and called == "__init__":  # Trainer(model, data, device): its __init__'s arguments
            called, index = cls.name.value, index - 1
        elif cls is not None:
            return [(_FINE, param)]  # a method's argument: its callers are not followed
        calls = self._calls_of(called)
        result: list[tuple[str, cst.CSTNode]] = []
        for call in calls:
            value = _argument_value(call, index, param.name.value)
            if value is None:
                value = param.default
            if value is None:
                result.append((_UNKNOWN, call))
            else:
                result.extend(self._classify(value, depth, seen))
        return result

    def _classify(self, value: cst.BaseExpression, depth: int, seen: set[int]) -> list[tuple[str, cst.CSTNode]]:
        if isinstance(value, cst.Name):
            if value.value == "None":
                return [(_FINE, value)]
            return self._origins(value, depth - 1, seen)
        if isinstance(value, cst.Integer):
            return [(_FIXED, value)]
        if isinstance(value, cst.SimpleString):
            text = value.evaluated_value
            if isinstance(text, str) and text.startswith("cuda:"):
                return [(_FIXED, value)]
            return [(_FINE, value)]
        if cuda_template(value):
            return [(_FIXED, value)]
        if isinstance(value, cst.IfExp):
            if cuda_string(value.body) or cuda_template(value.body):
                return [(_RANK, value)]
            return self._classify(value.body, depth, seen) + self._classify(value.orelse, depth, seen)
        if isinstance(value, cst.Call):
            return self._classify_call(value, depth, seen)
        if self_attribute(value) is not None:
            return self._origins(value, depth - 1, seen)
        if isinstance(value, cst.Attribute):
            return [(_FINE, value)]  # x.device follows a tensor; args.device is the user's flag
        return [(_UNKNOWN, value)]

    def _classify_call(self, call: cst.Call, depth: int, seen: set[int]) -> list[tuple[str, cst.CSTNode]]:
        if self.q.callee_starts_with(call, "torch.accelerator.") or self.q.is_call_to(call, {"torch.cuda.current_device"}):
            return [(_RANK, call)]
        if self.q.is_call_to(call, _DEVICE_CALLS):
            first = next((a.value for a in call.args if a.keyword is None or a.keyword.value in ("type", "device")), None)
            if first is None or cuda_string(first) or cuda_template(first) or cpu_string(first):
                return [(_RANK, call)]  # rank-device rewrites these
            if isinstance(first, cst.IfExp):
                return [(_RANK, call)]
            return []  # rank-device declines torch.device(<anything else>) itself
        return [(_UNKNOWN, call)]


def _parameter(function: cst.FunctionDef, name: str) -> tuple[int, cst.Param] | None:
    params = function.params
    for index, param in enumerate([*params.posonly_params, *params.params]):
        if param.name.value == name:
            return index, param
    for param in params.kwonly_params:
        if param.name.value == name:
            return -1, param
    return None


def _argument_value(call: cst.Call, index: int, name: str) -> cst.BaseExpression | None:
    arg = argument(call, index if index >= 0 else None, name)
    return arg.value if arg is not None else None
