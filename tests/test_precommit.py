"""The pre-commit hooks, through the real ``pre-commit try-repo`` (which pip-installs dpmigrate).

try-repo installs the hook repository's committed HEAD, so the current working tree (tracked
and untracked, not ignored) is copied into a throwaway git repository and committed there:
the test checks the code as it is now, not as it was last committed. The installed package
is a real, non-editable install: a module missing from the packaging fails here first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpmigrate.codemod.engine import convert
from dpmigrate.findings import Options

from test_cli import BROKEN_TORCH, TORCH_SCRIPT

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=dpmigrate-test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"]


@pytest.fixture(scope="module")
def hooks(tmp_path_factory):
    """A committed copy of the working tree, and a pre-commit home shared by this module's runs."""
    repo = tmp_path_factory.mktemp("hook-repo")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (os.fsdecode(n) for n in listed)):
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "snapshot of the working tree"], cwd=repo, check=True)
    return repo, tmp_path_factory.mktemp("pre-commit-home")


def project(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A user's repository holding ``files``, staged."""
    target = tmp_path / "project"
    target.mkdir()
    subprocess.run(["git", "init", "-q", str(target)], check=True)
    for name, data in files.items():
        (target / name).write_bytes(data)
    subprocess.run([*GIT, "add", "-A"], cwd=target, check=True)
    return target


def try_repo(hooks, target: Path, hook: str) -> subprocess.CompletedProcess:
    repo, home = hooks
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)  # the hook must run the installed copy, not this checkout
    proc = subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", str(repo), hook, "--all-files", "--verbose",
                           "--color", "never"], cwd=target, env=env, capture_output=True, text=True, timeout=900)
    if "An unexpected error has occurred" in proc.stdout + proc.stderr:
        log = home / "pre-commit.log"
        pytest.fail(f"pre-commit could not install or run the hook:\n{proc.stdout}\n{proc.stderr}\n"
                    f"{log.read_text() if log.exists() else ''}")
    return proc


def engine(name: str, source: bytes):
    return convert(source, name, Options())


def converted_script() -> bytes:
    """A script as dpmigrate leaves it (today's engine output for the single-GPU script)."""
    return engine("train.py", TORCH_SCRIPT).output


def test_check_hook_fails_exactly_when_the_engine_would_convert_and_writes_nothing(tmp_path, hooks):
    files = {"train.py": TORCH_SCRIPT, "converted.py": converted_script()}
    target = project(tmp_path, files)
    proc = try_repo(hooks, target, "dpmigrate-check")
    conversions = {name: engine(name, data) for name, data in files.items()}
    must_fail = any(c.changed or c.has_errors for c in conversions.values())
    assert ("Failed" if must_fail else "Passed") in proc.stdout, proc.stdout
    for name, conversion in conversions.items():
        assert (f"--- {name}\n" in proc.stdout) == conversion.changed, proc.stdout
    assert "2 files," in proc.stdout  # the report's summary
    assert {name: (target / name).read_bytes() for name in files} == files


def test_check_hook_passes_an_already_converted_script(tmp_path, hooks):
    target = project(tmp_path, {"converted.py": converted_script()})
    proc = try_repo(hooks, target, "dpmigrate-check")
    assert "Passed" in proc.stdout, proc.stdout
    assert proc.returncode == 0


def test_converting_hook_rewrites_as_the_engine_does_and_fails_when_it_did(tmp_path, hooks):
    target = project(tmp_path, {"train.py": TORCH_SCRIPT})
    proc = try_repo(hooks, target, "dpmigrate")
    conversion = engine("train.py", TORCH_SCRIPT)
    assert (target / "train.py").read_bytes() == conversion.output
    assert ("Failed" if conversion.changed or conversion.has_errors else "Passed") in proc.stdout, proc.stdout
    assert ("Rewriting train.py" in proc.stdout) == conversion.changed, proc.stdout


def test_hook_on_a_file_that_does_not_parse_fails_with_exit_2_and_leaves_it(tmp_path, hooks):
    target = project(tmp_path, {"broken.py": BROKEN_TORCH})
    proc = try_repo(hooks, target, "dpmigrate-check")
    assert "Failed" in proc.stdout and "- exit code: 2" in proc.stdout, proc.stdout
    assert "broken.py:" in proc.stdout and "does not parse" in proc.stdout, proc.stdout
    assert (target / "broken.py").read_bytes() == BROKEN_TORCH
