"""The package's shape: one `dpmigrate` namespace, and no framework loaded by importing it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("torch", "tensorflow", "paddle", "keras", "jax")


def run_probe(code: str) -> tuple[str, set]:
    """What ``code`` prints, and the modules loaded once it has run (in a fresh interpreter)."""
    probe = f"import sys\n{code}\nprint('\\n' + ' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd="/")
    printed, _, modules = out.stdout.rpartition("\n\n")
    return printed, set(modules.split())


def modules_loaded_by(code: str) -> set:
    return run_probe(code)[1]


@pytest.mark.parametrize("code", [
    "import dpmigrate",
    "import dpmigrate.runtime",
    "import dpmigrate.runtime.role, dpmigrate.runtime.strategy, dpmigrate.runtime.atomic",
    "import dpmigrate.runtime.common, dpmigrate.runtime.role_reader, dpmigrate.runtime.launchers",
    "import dpmigrate.runtime.contract_check",
    "from dpmigrate.runtime import Role, Strategy, read_role; read_role({})",
    "import dpmigrate.launch, dpmigrate.launch.cli, dpmigrate.launch.torch, dpmigrate.launch.rank_status",
])
def test_importing_dpmigrate_loads_no_framework(code):
    loaded = modules_loaded_by(code)
    assert not {m.split(".")[0] for m in loaded} & set(FRAMEWORKS)


def runtime_imports() -> dict[str, set[str]]:
    """For each module of runtime/, the runtime modules it imports, at the top or inside a function."""
    folder = ROOT / "runtime"
    modules = {path.stem for path in folder.glob("*.py")}
    graph = {}
    for name in modules:
        imported = set()
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                targets = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                imported |= {t if t in modules else "__init__" for t in targets}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                full = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                imported |= {f.split(".")[2] for f in full if f.startswith("dpmigrate.runtime.")}
        graph[name] = imported - {name}
    return graph


def test_runtime_modules_import_each_other_without_a_loop():
    graph = runtime_imports()
    assert graph["role_reader"] >= {"role", "launchers"}  # the reader of the graph sees real imports
    done, path = set(), []

    def visit(module):
        assert module not in path, f"import loop: {' -> '.join(path[path.index(module):] + [module])}"
        if module in done:
            return
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            visit(imported)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_cli_help_loads_no_framework_and_no_libcst():
    code = "import sys\nfrom dpmigrate.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    printed, loaded = run_probe(code)
    assert printed.startswith("usage: dpmigrate") and "--check" in printed
    assert not {m.split(".")[0] for m in loaded} & {*FRAMEWORKS, "libcst"}


def test_the_torch_backend_imports_torch_only():
    top = {m.split(".")[0] for m in modules_loaded_by("import dpmigrate.runtime.torch")}
    assert "torch" in top
    assert not top & {"tensorflow", "paddle", "keras", "jax"}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """An sdist and the wheel built from it (as ``python -m build`` does, so the sdist must carry what the wheel
    needs: setup.py, the bind guard's source), with this environment's setuptools."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True)
    return out


@pytest.mark.slow
def test_the_wheel_holds_dpmigrate_runtime_and_no_top_level_runtime_or_migrate(built):
    (wheel,) = built.glob("dpmigrate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"dpmigrate"}
    for module in ("dpmigrate/__init__.py", "dpmigrate/runtime/__init__.py", "dpmigrate/runtime/torch.py",
                   "dpmigrate/runtime/role.py", "dpmigrate/runtime/common.py", "dpmigrate/cli.py",
                   "dpmigrate/codemod/engine.py", "dpmigrate/rules/torch/__init__.py",
                   "dpmigrate/launch/__init__.py", "dpmigrate/launch/__main__.py", "dpmigrate/launch/supervise.py",
                   "dpmigrate/launch/torch.py", "dpmigrate/launch/rank_status.py", "dpmigrate/launch/torch_store.py",
                   "dpmigrate/launch/bind_guard.c"):  # compiled on the node where the install could not
        assert module in names, module
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "dpmigrate = dpmigrate.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the bind guard is compiled on Linux only")
def test_the_wheel_carries_the_compiled_bind_guard_for_any_python_3_of_this_platform(built):
    (wheel,) = built.glob("dpmigrate-*.whl")
    assert wheel.name.startswith("dpmigrate-0.1.0-py3-none-linux_"), wheel.name  # a plain .so: no Python ABI
    info = zipfile.ZipFile(wheel).getinfo("dpmigrate/launch/_bind_guard.so")
    assert not (info.external_attr >> 16) & 0o022  # writable by its owner only
    (sdist,) = built.glob("dpmigrate-*.tar.gz")
    members = tarfile.open(sdist).getnames()
    assert {"dpmigrate-0.1.0/setup.py", "dpmigrate-0.1.0/migrate/launch/bind_guard.c"} <= set(members)
    assert not any(m.endswith(".so") for m in members)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the bind guard is compiled on Linux only")
def test_without_a_c_compiler_the_wheel_still_builds_without_the_bind_guard(built, tmp_path):
    """An install where there is no compiler succeeds; the guard is then compiled when a job starts."""
    (sdist,) = built.glob("dpmigrate-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "out"),
                           str(tmp_path / "dpmigrate-0.1.0")], capture_output=True, text=True,
                          env={**os.environ, "CC": str(tmp_path / "no-such-compiler")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no-such-compiler" in done.stdout + done.stderr  # it was tried, and failed
    (wheel,) = (tmp_path / "out").glob("dpmigrate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "dpmigrate/launch/bind_guard.c" in names and "dpmigrate/launch/_bind_guard.so" not in names
