"""Helpers for the focused rule tests, in the spirit of LibCST's ``CodemodTest``: a ``before`` and an
``after`` source (dedented), and a no-op case that must come back byte-identical."""

from __future__ import annotations

import textwrap

from dpmigrate.codemod.engine import convert
from dpmigrate.findings import Conversion, Finding, Options

IMPORT = "import dpmigrate.runtime.torch as dp\n"


def convert_text(before: str, **options) -> Conversion:
    return convert(textwrap.dedent(before).encode(), "train.py", Options(**options))


def assert_converts(before: str, after: str, **options) -> Conversion:
    result = convert_text(before, **options)
    assert result.output.decode() == textwrap.dedent(after)
    return result


def assert_unchanged(before: str, **options) -> Conversion:
    result = convert_text(before, **options)
    assert result.output == textwrap.dedent(before).encode()
    return result


def findings_of(result: Conversion, rule: str, severity: str | None = None) -> list[Finding]:
    return [f for f in result.findings if f.rule == rule and (severity is None or f.severity == severity)]


def assert_rule_converts(rule: str, before: str, after: str, **options) -> Conversion:
    """Run ``rule`` alone (as LibCST's ``CodemodTest`` runs one command): the output shows only its edits."""
    result = convert_text(before, select=(rule,), **options)
    assert result.output.decode() == textwrap.dedent(after)
    assert {f.rule for f in result.findings} <= {rule, "detect-framework"}
    return result


# the same small script in torch and in Paddle: a loader, a linear model and its SGD, by framework
LOADER_FRAMEWORKS = {
    "torch": dict(framework="torch", loader_module="torch.utils.data", linear="torch.nn.Linear(4, {width})",
                  optimizer="torch.optim.SGD(model.parameters(), lr=0.1)"),
    "paddle": dict(framework="paddle", loader_module="paddle.io", linear="paddle.nn.Linear(4, {width})",
                   optimizer="paddle.optimizer.SGD(parameters=model.parameters())"),
}


def loader_framework(name: str, width: int) -> dict[str, str]:
    """The ``LOADER_FRAMEWORKS`` entry of ``name`` with a model ``width`` outputs wide."""
    return {k: v.format(width=width) if k == "linear" else v for k, v in LOADER_FRAMEWORKS[name].items()}
