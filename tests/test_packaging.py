"""The package's shape: one `dpmigrate` namespace, and no framework loaded by importing it."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("torch", "tensorflow", "paddle", "keras", "jax")


def modules_loaded_by(code: str) -> set:
    probe = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd="/")
    return set(out.stdout.split())


@pytest.mark.parametrize("code", [
    "import dpmigrate",
    "import dpmigrate.runtime",
    "import dpmigrate.runtime.role, dpmigrate.runtime.strategy, dpmigrate.runtime.atomic",
    "from dpmigrate.runtime import Role, Strategy, read_role; read_role({})",
    "import dpmigrate.launch, dpmigrate.launch.cli, dpmigrate.launch.torch, dpmigrate.launch.rank_status",
])
def test_importing_dpmigrate_loads_no_framework(code):
    loaded = modules_loaded_by(code)
    assert not {m.split(".")[0] for m in loaded} & set(FRAMEWORKS)


def test_cli_help_loads_no_framework():
    code = "import sys\nfrom dpmigrate.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    loaded = modules_loaded_by(code)
    assert not {m.split(".")[0] for m in loaded} & set(FRAMEWORKS)


def test_the_torch_backend_imports_torch_only():
    top = {m.split(".")[0] for m in modules_loaded_by("import dpmigrate.runtime.torch")}
    assert "torch" in top
    assert not top & {"tensorflow", "paddle", "keras", "jax"}


@pytest.mark.slow
def test_the_wheel_holds_dpmigrate_runtime_and_no_top_level_runtime_or_migrate(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("dpmigrate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"dpmigrate"}
    for module in ("dpmigrate/__init__.py", "dpmigrate/runtime/__init__.py", "dpmigrate/runtime/torch.py",
                   "dpmigrate/runtime/role.py", "dpmigrate/cli.py", "dpmigrate/engine.py",
                   "dpmigrate/launch/__init__.py", "dpmigrate/launch/__main__.py", "dpmigrate/launch/supervise.py",
                   "dpmigrate/launch/torch.py", "dpmigrate/launch/rank_status.py", "dpmigrate/launch/torch_store.py"):
        assert module in names, module
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "dpmigrate = dpmigrate.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
