"""Reading a module's import statements alone never misses one that parsing the whole module finds.

``local_modules`` reads only the import statements of every file of a run (``import_lines``); these
tests hold that shortcut to :func:`ast.parse` of the whole file, over every script we ship, our own
code and the installed torch's ``nn``/``optim``/``utils.data`` package (imports nested in functions,
``try``/``if TYPE_CHECKING`` blocks, parenthesised and backslash-continued lists), and over snippets
written to hit each case it must read whole.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from dpmigrate.local.import_lines import import_statements

ROOT = Path(__file__).resolve().parents[1]


def _imports(tree: ast.Module | None) -> list[str]:
    return sorted(ast.dump(n) for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)) if tree else []


def _python_files() -> list[Path]:
    files = [*ROOT.glob("fixtures/**/*.py"), *ROOT.glob("migrate/**/*.py"), *ROOT.glob("runtime/**/*.py")]
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        package = Path(spec.origin).parent
        for folder in ("nn", "optim", "utils/data"):
            files.extend((package / folder).rglob("*.py"))
    return files


def test_no_import_of_hundreds_of_real_files_is_missed():
    files = _python_files()
    assert len(files) > 300
    found_nested = False
    for path in files:
        source = path.read_bytes()
        whole = _imports(ast.parse(source))
        read = _imports(import_statements(str(path), source))
        assert set(whole) <= set(read), (path, set(whole) - set(read))
        found_nested = found_nested or any(
            isinstance(n, ast.FunctionDef) and any(isinstance(s, ast.Import | ast.ImportFrom) for s in ast.walk(n))
            for n in ast.walk(ast.parse(source)))
    assert found_nested  # (the files hold imports inside functions, which a look at the top level would miss)


SNIPPETS = {
    "nested in a function": "def f():\n    import torch\n    return torch\n",
    "parenthesised list with a comment": "from torch.nn import (  # layers\n    Linear,\n    ReLU,\n)\n",
    "comment with a parenthesis in the list": "from torch.nn import (\n    Linear,  # (dense)\n    ReLU,\n)\n",
    "backslash continuation": "from torch.nn import Linear, \\\n    ReLU\n",
    "after a colon": "try: import torch\nexcept ImportError: torch = None\n",
    "after a semicolon": "x = 1; import data\n",
    "if TYPE_CHECKING": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from data import Loader\n",
    "relative": "from . import data\nfrom .models import Net\n",
    "form feed before an import": "import os\n\x0cimport torch\n",
    "a byte-order mark": "\ufeffimport torch\nimport data\n",
    "a latin-1 coding cookie": "# -*- coding: latin-1 -*-\nimport torch\n",
    "prose that starts with from": '"""Docs.\n\nfrom the start\nimport the data\n"""\nimport torch\n',
}


@pytest.mark.parametrize("source", SNIPPETS.values(), ids=SNIPPETS.keys())
def test_every_import_of_a_snippet_is_read(source: str):
    whole = _imports(ast.parse(source.encode()))  # (as bytes, as files are read: a byte-order mark is allowed)
    assert whole and _imports(import_statements("snippet.py", source.encode())) == whole


def test_a_file_that_must_be_read_whole_and_does_not_parse_gives_none():
    assert import_statements("bad.py", b"if x: import torch\ndef (:\n") is None
