"""The index answers qualified-name questions as libcst's QualifiedNameProvider does, scope analysis or not.

The index skips libcst's whole-file scope analysis when a question's answer is plain (a name the
file never writes, a builtin nothing can rebind). These tests hold every answer to libcst's own
``QualifiedNameProvider``, node by node, over the fixture scripts and over snippets written to
hit each shortcut, and check that the shortcuts really skip the analysis.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

from dpmigrate.codemod.index import TreeIndex

ROOT = Path(__file__).resolve().parents[1]
PROBES = frozenset({
    "builtins.print", "builtins.list", "builtins.type", "builtins.None", "torch.device", "torch.optim.SGD",
    "torch.distributed.barrier", "torch.utils.data.DataLoader", "logging.getLogger",
})
SNIPPETS = {
    "own SGD is not torch's": "class SGD:\n    pass\nopt = SGD()\n",
    "aliased module": "from torch import optim as o\nopt = o.SGD([], lr=0.1)\n",
    "aliased class": "from torch.optim import SGD as Plain\nopt = Plain([])\n",
    "dotted import": "import torch.utils.data\nloader = torch.utils.data.DataLoader([])\n",
    "print rebound by a def": "def print(*a):\n    pass\nprint('x')\n",
    "print rebound by a parameter": "def f(print):\n    print('x')\nprint('y')\n",
    "print rebound later at module level": "print('x')\nprint = len\nprint('y')\n",
    "print imported": "from rich import print\nprint('x')\n",
    "call of a call": "x = type(3)(4)\ny = list[int]\nz = type\n",
    "attribute of an expression": "import torch\nv = (torch.ones(2) + 1).abs().sum()\n",
    "lambda and comprehension": "f = lambda device: device.type\nxs = [print(i) for i in range(3)]\n",
    "module named like a class": "import torch\ntorch = None\ntorch.device('cpu')\n",
    "import after use": "torch.device('cpu')\nimport torch\n",
    "star import": "from torch.optim import *\nopt = SGD([])\n",
    "relative import": "from .models import device\ndevice()\n",
    "two imports of one name": "import numpy as np\ntry:\n    import cupy as np\nexcept ImportError:\n    pass\nnp.ones(2)\n",
    "import inside a function": "import torch\ndef f():\n    import numpy as torch\n    return torch.ones(2)\n",
    "name used before its import": "x = torch.ones(2)\nimport torch\ny = torch.ones(2)\n",
    "function using a later import": "def f():\n    return nn.Linear(2, 2)\nfrom torch import nn\n",
    "attribute and keyword spelled like an import": "from torch import nn\nimport torch.nn.functional as F\n"
    "m = nn.Linear(2, 2, bias=F.nn)\nf(nn=m)\n",
    "dotted and plain import": "import torch\nimport torch.nn\nm = torch.nn.Linear(2, 2)\n",
}


def libcst_names(wrapper: MetadataWrapper) -> dict[cst.CSTNode, frozenset[str]]:
    names = {}
    for node, value in wrapper.resolve(QualifiedNameProvider).items():
        value = value() if callable(value) else value  # libcst 1.9 resolves lazily
        names[node] = frozenset(q.name for q in value)
    return names


def assert_same_answers(source: bytes) -> int:
    module = cst.parse_module(source)
    truth = libcst_names(MetadataWrapper(module, unsafe_skip_copy=True))
    index = TreeIndex(MetadataWrapper(module, unsafe_skip_copy=True))
    checked = 0
    for node in index.nodes:
        if not isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
            continue
        expected = truth.get(node, frozenset())
        assert index.qualified_names_among(node, expected | PROBES) == expected, (
            module.code_for_node(node), expected)
        for name in expected:
            if not name.startswith("."):
                package = name.split(".", 1)[0]
                assert name in index.qualified_names_under(node, package), (module.code_for_node(node), name)
        checked += 1
    return checked


@pytest.mark.parametrize("path", sorted(ROOT.glob("fixtures/*/*/before.py")), ids=lambda p: p.parent.name)
def test_fixture_scripts_get_libcsts_names(path: Path):
    assert assert_same_answers(path.read_bytes()) > 50


@pytest.mark.parametrize("source", SNIPPETS.values(), ids=SNIPPETS.keys())
def test_snippets_get_libcsts_names(source: str):
    assert assert_same_answers(source.encode()) > 0


def test_names_the_file_never_writes_need_no_scope_analysis():
    module = cst.parse_module(b"import torch\nmodel = torch.nn.Linear(2, 2)\nprint(model(torch.ones(2)).sum())\n")
    index = TreeIndex(MetadataWrapper(module, unsafe_skip_copy=True))
    calls = [n for n in index.nodes if isinstance(n, cst.Call)]
    assert [sorted(index.qualified_names_among(c.func, PROBES)) for c in calls] == [[], ["builtins.print"], [], [], []]
    assert index.qualified_names_among(calls[0].func, {"torch.nn.Linear"}) == {"torch.nn.Linear"}  # import only
    assert index._scopes is None  # all answered without libcst's scope analysis


def test_a_name_bound_otherwise_too_gets_the_scope_analysis():
    module = cst.parse_module(b"import torch\ndef f(torch):\n    return torch.device('cpu')\n")
    index = TreeIndex(MetadataWrapper(module, unsafe_skip_copy=True))
    call = next(n for n in index.nodes if isinstance(n, cst.Call))
    assert index.qualified_names_among(call.func, {"torch.device"}) == frozenset()
    assert index._scopes is not None


def _installed_torch_files() -> list[Path]:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    package = Path(spec.origin).parent if spec is not None and spec.origin else None
    return sorted(f for folder in ("optim", "utils/data") for f in (package / folder).rglob("*.py")) if package else []


@pytest.mark.slow
def test_a_real_package_gets_libcsts_names():
    """torch's own optim and utils.data (annotations, nested and dotted imports, names rebound): every answer
    libcst's, shortcuts or not."""
    files = _installed_torch_files()
    assert len(files) > 30
    assert sum(assert_same_answers(f.read_bytes()) for f in files) > 10_000
