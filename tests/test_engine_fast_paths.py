"""The engine's fast stand-ins for libcst machinery give exactly what libcst's own would.

For speed (issue 7), ``walk.py`` reads children from a table of libcst's field order,
``printing.py`` follows ``Module._codegen_impl`` and reuses unchanged statements' text,
``positions.py`` prints one top-level statement at a time, ``patterns.py`` replaces
``libcst.matchers`` and ``imports.py`` its ``AddImportsVisitor``: each is checked here against
libcst itself (its visitor order, ``Module.code``, ``PositionProvider``, matchers, visitor) over
every Python file under ``fixtures/`` plus layouts the fixtures lack (no trailing newline,
comment-only files, CRLF, a form feed); and what a pre-commit run imports is checked too.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from dpmigrate.codemod import patterns as m
from dpmigrate.codemod.index import TreeIndex
from dpmigrate.codemod.positions import Positions
from dpmigrate.codemod.printing import ModulePrint
from dpmigrate.codemod.walk import CHILD_FIELDS, NOT_INDEXED, walk

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SOURCES = sorted(FIXTURES.rglob("*.py"))
LAYOUTS = {
    "no-trailing-newline": b"import torch\nx = torch.ones(1)",
    "comments-only": b"# just a comment\n\n# and another\n",
    "empty": b"",
    "crlf": b"import torch\r\n\r\ndef f():\r\n    return torch.ones(1)\r\n# end\r\n",
    "form-feed-and-header": b"#!/usr/bin/env python\n# header\n\n\x0cimport torch\nclass A:\n    x = 1  # c\n\n# footer\n",
    "semicolons-and-nesting": b"import torch; a = 1\nif a:\n    for i in range(2):\n        print([j for j in (i, a)])\n",
}


def child_fields() -> dict[str, tuple[str, ...]]:
    """Each libcst node class's child fields in the order its ``_visit_and_replace_children`` visits them."""
    found = {}
    for name, klass in sorted(vars(cst).items()):
        if isinstance(klass, type) and issubclass(klass, cst.CSTNode) and "_visit_and_replace_children" in vars(klass):
            source = inspect.getsource(klass._visit_and_replace_children)
            found[name] = tuple(dict.fromkeys(re.findall(r'visit_\w+\(\s*self,\s*"(\w+)"', source)))
    return found


def modules():
    for path in SOURCES:
        yield path.relative_to(FIXTURES).as_posix(), path.read_bytes()
    yield from LAYOUTS.items()


MODULES = list(modules())


class _Recorder(cst.CSTVisitor):
    def __init__(self, skipping: tuple[type, ...] = ()) -> None:
        super().__init__()
        self.nodes: list[cst.CSTNode] = []
        self.skipping = skipping  # node types left out, with everything below them

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, self.skipping):
            return False
        self.nodes.append(node)
        return True


def test_the_table_of_child_fields_is_the_installed_libcsts():
    assert CHILD_FIELDS == child_fields()


def test_there_are_fixtures_to_check():
    assert len(SOURCES) >= 30


@pytest.mark.parametrize("name,source", MODULES, ids=[n for n, _ in MODULES])
def test_walk_meets_every_node_in_libcsts_visit_order(name, source):
    module = cst.parse_module(source)
    recorder = _Recorder()
    module.visit(recorder)
    walked = list(walk(module))
    assert len(walked) == len(recorder.nodes)
    assert all(a is b for a, b in zip(walked, recorder.nodes))
    index = TreeIndex(MetadataWrapper(module, unsafe_skip_copy=True))
    indexed = _Recorder(skipping=NOT_INDEXED)  # the index leaves out whitespace, newlines and comments
    module.visit(indexed)
    if len(recorder.nodes) > 1000:  # a script: what makes leaving them out worth it
        assert len(indexed.nodes) < len(recorder.nodes) * 0.7
    assert len(index.nodes) == len(indexed.nodes)
    assert all(a is b for a, b in zip(index.nodes, indexed.nodes))
    some = indexed.nodes[len(indexed.nodes) // 2]
    assert index.parent(some) is not None or some is module


@pytest.mark.parametrize("name,source", MODULES, ids=[n for n, _ in MODULES])
def test_printing_and_positions_are_libcsts(name, source):
    module = cst.parse_module(source)
    printed = ModulePrint(module)
    assert printed.code == module.code  # (libcst itself drops the form feed before a top-level statement)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    expected = wrapper.resolve(PositionProvider)
    positions = Positions(wrapper, TreeIndex(wrapper), printed)
    for node in walk(module):
        assert positions[node] == expected[node], (type(node).__name__, module.code_for_node(node)[:60])
    # a module built from this one: replaced, inserted and removed statements, the rest reused
    body = list(module.body)
    if body:
        body[len(body) // 2] = cst.parse_statement("changed = 1\n")
        body.insert(0, cst.parse_statement("import os\n"))
        del body[-1]
    new = module.with_changes(body=body)
    assert printed.print(new) == new.code


def test_patterns_match_as_libcst_matchers_do():
    import libcst.matchers as lm

    call = cst.parse_expression("torchvision.datasets.MNIST('d', train=True, download=True)")
    download = m.Call(args=[m.ZeroOrMore(), m.Arg(m.Name("True"), keyword=m.Name("download")), m.ZeroOrMore()])
    same = lm.Call(args=[lm.ZeroOrMore(), lm.Arg(lm.Name("True"), keyword=lm.Name("download")), lm.ZeroOrMore()])
    assert m.matches(call, download) and lm.matches(call, same)
    for code in ("f(download=True)", "f(x, download=False)", "f(x)", "g.f(1, download=True, y=2)", "x"):
        node = cst.parse_expression(code)
        assert m.matches(node, download) == lm.matches(node, same), code
    either = m.Name("a") | m.Attribute(attr=m.Name("b"))
    assert [m.matches(cst.parse_expression(c), either) for c in ("a", "x.b", "x.c", "b")] == [True, True, False, False]
    assert m.matches(cst.parse_expression("f(x)"), m.Call(args=[m.Arg(keyword=None)]))
    assert not m.matches(cst.parse_expression("f(k=x)"), m.Call(args=[m.Arg(keyword=None)]))
    with pytest.raises(TypeError, match="unknown or repeated fields"):
        m.Call(nonsense=1)


IMPORT_LAYOUTS = {
    "docstring-then-imports": b'"""Doc."""\nimport os\nimport torch\nx = 1\n',
    "strict-flag": b"__strict__ = True\nimport torch\n# a comment\nx = 1\n",
    "comment-first": b"import torch\n# about x\nx = 1\n",
    "blank-first": b"import torch\n\nx = 1\n",
    "only-imports": b"import torch\nfrom os import path\n",
    "code-first": b"x = 1\nimport torch\n",
    "docstring-only": b'"""Doc."""\n',
    "future": b'from __future__ import annotations\nimport torch\n',
}
# the engine never adds the runtime to a file that imports it already (such a file is left unchanged)
IMPORT_MODULES = [(n, s) for n, s in MODULES if b"dpmigrate.runtime" not in s] + list(IMPORT_LAYOUTS.items())


@pytest.mark.parametrize("alias", ["dp", None])
@pytest.mark.parametrize("name,source", IMPORT_MODULES, ids=[n for n, _ in IMPORT_MODULES])
def test_the_runtime_import_goes_where_libcsts_add_imports_visitor_puts_it(name, source, alias):
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor

    from dpmigrate.codemod.imports import add_import

    module = cst.parse_module(source)
    context = CodemodContext()
    AddImportsVisitor.add_needed_import(context, "dpmigrate.runtime.torch", asname=alias)
    expected = AddImportsVisitor(context).transform_module(module.with_changes(default_indent="    "))
    assert add_import(module, "dpmigrate.runtime.torch", alias).with_changes(default_indent="    ").code == expected.code


def _modules_loaded_by_a_check_of(tmp_path, source: str) -> set[str]:
    import subprocess
    import sys

    path = tmp_path / "script.py"
    path.write_text(source)
    probe = ("import sys\nfrom dpmigrate.cli import main\ncode = main(['--check', sys.argv[1]])\n"
             "print(' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_a_check_of_a_file_naming_no_framework_never_loads_libcst(tmp_path):
    loaded = _modules_loaded_by_a_check_of(tmp_path, "import argparse\nprint(argparse.ArgumentParser())\n")
    assert "dpmigrate.cli" in loaded and not {m for m in loaded if m.startswith("libcst")}


def test_checking_a_converted_script_loads_neither_libcst_matchers_nor_its_codemod_package(tmp_path):
    source = (FIXTURES / "torch" / "mnist" / "after.py").read_text()
    loaded = _modules_loaded_by_a_check_of(tmp_path, source)
    assert not {m for m in loaded if m.startswith(("libcst.matchers", "libcst.codemod"))}
    # (and, when no rank test in it guards what could meet the other ranks, not even libcst: the fast path of
    # dpmigrate.run.fast_path, tests/test_converted_fast_path.py)
    assert "dpmigrate.codemod.engine" not in loaded


def test_converting_a_training_script_adds_its_import_with_libcsts_add_imports_visitor(tmp_path):
    source = (FIXTURES / "torch" / "mnist" / "before.py").read_text()
    assert "libcst.codemod.visitors" in _modules_loaded_by_a_check_of(tmp_path, source)
