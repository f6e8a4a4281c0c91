"""Check that a backend module honours the runtime contract of :mod:`dpmigrate.runtime`.

A converted script only changes its import line to move between frameworks, so every backend must
export exactly the contract's names (no fewer: a script would fail; no more: a script using them
would not move), each function callable the same way, and the shared classes themselves (a
``dp.Strategy`` from one backend must be the ``Strategy`` every backend accepts).

Compatible means: the same positional parameters, by name, order and default; ``*args`` where the
contract has it; every keyword-only parameter of the contract, with its default. A backend may add
keyword-only parameters that have defaults, and ``**kwargs``, for its framework's extras.
Standard library only; the checker imports no framework (the backend module given to it does).
"""

from __future__ import annotations

import ast
import inspect
import types
from typing import Any

from . import CONTRACT, ContractName

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_NO_DEFAULT = inspect.Parameter.empty


def contract_signature(spec: str) -> inspect.Signature:
    """The parameters of a contract entry's ``spec`` (``"(value, op='mean') -> value"``), defaults evaluated."""
    function = ast.parse(f"def _{spec}: pass").body[0]
    assert isinstance(function, ast.FunctionDef)
    args = function.args
    positional = args.posonlyargs + args.args
    defaults: list[Any] = [_NO_DEFAULT] * (len(positional) - len(args.defaults))
    defaults += [ast.literal_eval(d) for d in args.defaults]
    params = [inspect.Parameter(a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d)
              for a, d in zip(positional, defaults)]
    if args.vararg is not None:
        params.append(inspect.Parameter(args.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        default = _NO_DEFAULT if d is None else ast.literal_eval(d)
        params.append(inspect.Parameter(a.arg, inspect.Parameter.KEYWORD_ONLY, default=default))
    if args.kwarg is not None:
        params.append(inspect.Parameter(args.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


def exported_names(module: types.ModuleType) -> set[str]:
    """What the module offers a script: its ``__all__``, plus any public function or class it defines."""
    names = set(getattr(module, "__all__", ()))
    for name, value in vars(module).items():
        defined_here = getattr(value, "__module__", None) == module.__name__
        if not name.startswith("_") and defined_here and (inspect.isfunction(value) or inspect.isclass(value)):
            names.add(name)
    return names


def check_backend(module: types.ModuleType, contract: tuple[ContractName, ...] = CONTRACT) -> list[str]:
    """Every way ``module`` departs from the contract, one sentence each; an empty list when it honours it."""
    where = module.__name__
    problems = []
    if not isinstance(getattr(module, "__all__", None), (list, tuple)):
        problems.append(f"{where} has no __all__: list the contract's names in it")
    listed = set(getattr(module, "__all__", ()))
    wanted = {entry.name for entry in contract}
    for name in sorted(exported_names(module) - wanted):
        problems.append(f"{where}.{name} is public but not in the contract: make it private (_{name}) or add "
                        "it to dpmigrate.runtime.CONTRACT for every backend")
    for entry in contract:
        if not hasattr(module, entry.name):
            problems.append(f"{where}.{entry.name} is missing: the contract has {entry.synopsis()}")
            continue
        if entry.name not in listed:
            problems.append(f"{where}.__all__ lacks {entry.name!r}")
        problems.extend(_check_entry(where, entry, getattr(module, entry.name)))
    return problems


def _check_entry(where: str, entry: ContractName, value: Any) -> list[str]:
    if not isinstance(entry.spec, str):
        if value is entry.spec:
            return []
        shared = f"{entry.spec.__module__}.{entry.spec.__qualname__}"
        return [f"{where}.{entry.name} is {value!r}, not the shared {shared}: import it from dpmigrate.runtime"]
    if not callable(value):
        return [f"{where}.{entry.name} is {type(value).__name__}, not callable: the contract has {entry.synopsis()}"]
    try:
        actual = inspect.signature(value)
    except (TypeError, ValueError):
        return [f"{where}.{entry.name} has no readable signature: the contract has {entry.synopsis()}"]
    reasons = signature_differences(contract_signature(entry.spec), actual)
    return [f"{where}.{entry.name}{actual} {reason}: the contract has {entry.synopsis()}" for reason in reasons]


def signature_differences(expected: inspect.Signature, actual: inspect.Signature) -> list[str]:
    """Why a call written against ``expected`` could fail, or mean something else, on ``actual``."""
    reasons = []
    exp, act = _kinds(expected), _kinds(actual)
    exp_names = [p.name for p in exp["positional"]]
    act_names = [p.name for p in act["positional"]]
    if exp_names != act_names:
        reasons.append(f"takes positional parameters {act_names}, not {exp_names}")
    else:
        for want, got in zip(exp["positional"], act["positional"]):
            if got.kind != want.kind:
                reasons.append(f"takes {got.name} by position only, so {got.name}=... fails")
            if not _same_default(want.default, got.default):
                reasons.append(f"gives {got.name} the default {_show(got.default)}, not {_show(want.default)}")
    for kind, label in (("var_positional", "*args"), ("var_keyword", "**kwargs")):
        if exp[kind] and not act[kind]:
            reasons.append(f"does not take {label}")
    if act["var_positional"] and not exp["var_positional"]:
        reasons.append("takes *args, so a misplaced positional argument would be swallowed")
    act_kw = {p.name: p for p in act["keyword_only"]}
    for p in exp["keyword_only"]:
        if p.name not in act_kw:
            reasons.append(f"does not take the keyword-only parameter {p.name}")
        elif not _same_default(p.default, act_kw[p.name].default):
            reasons.append(f"gives {p.name} the default {_show(act_kw[p.name].default)}, not {_show(p.default)}")
    wanted_kw = {p.name for p in exp["keyword_only"]}
    for p in act["keyword_only"]:
        if p.name not in wanted_kw and p.default is _NO_DEFAULT:
            reasons.append(f"requires the extra keyword-only parameter {p.name}: give it a default")
    return reasons


def _kinds(signature: inspect.Signature) -> dict[str, list[inspect.Parameter]]:
    params = list(signature.parameters.values())
    return {
        "positional": [p for p in params if p.kind in _POSITIONAL],
        "var_positional": [p for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL],
        "keyword_only": [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY],
        "var_keyword": [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD],
    }


def _same_default(want: Any, got: Any) -> bool:
    if want is _NO_DEFAULT or got is _NO_DEFAULT:
        return want is got
    return type(want) is type(got) and want == got


def _show(default: Any) -> str:
    return "(none)" if default is _NO_DEFAULT else repr(default)
