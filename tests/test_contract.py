"""Every backend honours the runtime contract declared once, as data, in dpmigrate.runtime.CONTRACT.

The checker is tested on module objects built here (complete, one name short, one name too many, a
signature changed), so it is known to fail when a backend drifts even while torch is the only backend.
Each real backend is then checked in its own process: one framework per process.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import types

import pytest

import dpmigrate.runtime
from dpmigrate.frameworks import FRAMEWORK_OF_PACKAGE
from dpmigrate.runtime import CONTRACT
from dpmigrate.runtime.contract_check import check_backend

FRAMEWORKS = sorted(set(FRAMEWORK_OF_PACKAGE.values()))
BACKENDS = [f"dpmigrate.runtime.{fw}" for fw in FRAMEWORKS if importlib.util.find_spec(f"dpmigrate.runtime.{fw}")]


def conforming_backend() -> types.ModuleType:
    """A module with exactly the contract: stub functions spelled from each entry, the shared classes."""
    module = types.ModuleType("fake_backend")
    source = ["from __future__ import annotations"]
    for entry in CONTRACT:
        if isinstance(entry.spec, str):
            source.append(f"def {entry.name}{entry.spec}:\n    pass")
        else:
            setattr(module, entry.name, entry.spec)
    exec("\n".join(source), module.__dict__)
    module.__all__ = [entry.name for entry in CONTRACT]
    return module


def redefine(module: types.ModuleType, source: str) -> types.ModuleType:
    exec(textwrap.dedent(source), module.__dict__)  # defined "in" the module, as a backend author would
    return module


# --- the checker -----------------------------------------------------------------------------------


def test_a_module_with_exactly_the_contract_passes():
    assert check_backend(conforming_backend()) == []


def test_a_missing_name_fails_and_names_it():
    module = conforming_backend()
    del module.barrier
    module.__all__.remove("barrier")
    assert check_backend(module) == ["fake_backend.barrier is missing: the contract has barrier() -> None"]


def test_a_name_defined_but_not_listed_in_all_fails():
    module = conforming_backend()
    module.__all__.remove("scope")
    assert check_backend(module) == ["fake_backend.__all__ lacks 'scope'"]


def test_a_module_without_all_fails():
    module = conforming_backend()
    del module.__all__
    problems = check_backend(module)
    assert problems[0] == "fake_backend has no __all__: list the contract's names in it"
    assert "fake_backend.__all__ lacks 'init'" in problems


def test_an_extra_name_in_all_fails_and_names_it():
    module = conforming_backend()
    module.gather_for_metrics = lambda value: value
    module.__all__.append("gather_for_metrics")
    assert check_backend(module) == [
        "fake_backend.gather_for_metrics is public but not in the contract: make it private (_gather_for_metrics) "
        "or add it to dpmigrate.runtime.CONTRACT for every backend"
    ]


def test_an_extra_public_function_or_class_defined_in_the_backend_fails_even_outside_all():
    module = redefine(conforming_backend(), """
        from os.path import join  # imported, not offered: fine
        def _helper(): pass       # private: fine
        def local_world_size(): return 1
        class Accelerator: pass
    """)
    assert [p.split(" ")[0] for p in check_backend(module)] == ["fake_backend.Accelerator",
                                                                 "fake_backend.local_world_size"]


def test_a_look_alike_of_a_shared_class_fails():
    module = redefine(conforming_backend(), """
        class Strategy:
            pass
    """)
    (problem,) = check_backend(module)
    assert problem.startswith("fake_backend.Strategy is <class 'fake_backend.Strategy'>, not the shared "
                              "dpmigrate.runtime.strategy.Strategy: import it from dpmigrate.runtime")


def test_a_value_where_a_function_belongs_fails():
    module = conforming_backend()
    module.rank = 0
    assert check_backend(module) == ["fake_backend.rank is int, not callable: the contract has rank() -> int"]


@pytest.mark.parametrize("source, reason", [
    ("def all_reduce(tensor, op='mean'): pass",
     "all_reduce(tensor, op='mean') takes positional parameters ['tensor', 'op'], not ['value', 'op']"),
    ("def broadcast(src=0, value=None): pass",
     "broadcast(src=0, value=None) takes positional parameters ['src', 'value'], not ['value', 'src']"),
    ("def all_reduce(value, op='sum'): pass", "all_reduce(value, op='sum') gives op the default 'sum', not 'mean'"),
    ("def broadcast(value, /, src=0): pass", "broadcast(value, /, src=0) takes value by position only"),
    ("def shard(sequence, *more): pass", "shard(sequence, *more) takes *args, so a misplaced positional"),
    ("def print(*args): pass", "print(*args) does not take **kwargs"),
    ("def init(strategy=None): pass", "init(strategy=None) does not take the keyword-only parameter timeout"),
    ("def init(strategy=None, *, timeout=None, backend): pass",
     "init(strategy=None, *, timeout=None, backend) requires the extra keyword-only parameter backend"),
    ("def distributed_loader(loader_or_dataset, *, evaluation=True): pass",
     "gives evaluation the default True, not False"),
    ("def main_process_first(local=1): pass", "main_process_first(local=1) gives local the default 1, not True"),
])
def test_an_incompatible_signature_fails_with_the_reason(source, reason):
    problems = check_backend(redefine(conforming_backend(), source))
    assert len(problems) == 1 and reason in problems[0], problems
    assert problems[0].startswith("fake_backend.")


@pytest.mark.parametrize("source", [
    "def init(strategy=None, *, timeout=None, backend=None): pass",  # torch's extra knob
    "def save(obj, path, **kwargs): pass",  # torch.save's keyword arguments passed through
    "def init(strategy: 'Strategy | None' = None, *, timeout: float | None = None) -> 'Role': pass",
])
def test_keyword_only_extras_with_defaults_and_annotations_are_compatible(source):
    assert check_backend(redefine(conforming_backend(), source)) == []


def test_the_package_docstring_lists_every_contract_name():
    doc = dpmigrate.runtime.__doc__
    for entry in CONTRACT:
        assert f"``{entry.synopsis()}``" in doc
    assert len({entry.name for entry in CONTRACT}) == len(CONTRACT)


# --- the real backends, one process each -------------------------------------------------------------

PROBE = """
import importlib, json, sys
from dpmigrate.runtime.contract_check import check_backend
backend = importlib.import_module(sys.argv[1])
as_is = check_backend(backend)
del backend.barrier                      # what a backend without barrier() would look like
exec("def gather_for_metrics(value): return value", backend.__dict__)
print(json.dumps({"as_is": as_is, "drifted": check_backend(backend)}))
"""


def test_torch_is_among_the_backends_checked():
    assert "dpmigrate.runtime.torch" in BACKENDS


def test_tensorflow_is_among_the_backends_checked():
    assert "dpmigrate.runtime.tensorflow" in BACKENDS


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_honours_the_contract(backend):
    proc = subprocess.run([sys.executable, "-c", PROBE, backend], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["as_is"] == []
    assert result["drifted"] == [
        f"{backend}.gather_for_metrics is public but not in the contract: make it private (_gather_for_metrics) "
        "or add it to dpmigrate.runtime.CONTRACT for every backend",
        f"{backend}.barrier is missing: the contract has barrier() -> None",
    ]
