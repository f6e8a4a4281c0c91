"""The pre-commit hooks, through a real ``pre-commit run`` (which pip-installs dpmigrate).

pre-commit installs a hook repository at a committed revision, so the current working tree
(tracked and untracked, not ignored) is copied into a throwaway git repository and committed
there once per module: the tests check the code as it is now, not as it was last committed. Every
test names that repository and its one revision in a ``.pre-commit-config.yaml`` and shares one
``PRE_COMMIT_HOME``, so the first test installs the hook environment and the others reuse it
(``pre-commit try-repo`` would commit a new shadow revision, and reinstall, on every call). The
installed package is a real, non-editable install: a module missing from the packaging fails
here first.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_samples import (
    BROKEN_TORCH,
    CONVERTED_SCRIPT,
    DIFF_HUNKS,
    TORCH_SCRIPT,
    TORCH_SCRIPT_SUMMARY,
    UNCHANGED_SUMMARY,
    converted_script_note,
    torch_script_report,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=dpmigrate-test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"]


@dataclasses.dataclass(frozen=True)
class HookRepo:
    path: Path
    rev: str
    home: Path  # PRE_COMMIT_HOME, shared: the hook environment is installed once


@dataclasses.dataclass(frozen=True)
class HookRun:
    """One hook's part of ``pre-commit run --verbose`` output."""

    status: str  # "Passed" or "Failed"
    exit_code: int
    modified_files: bool
    output: str  # what dpmigrate printed (stdout and stderr, as pre-commit interleaves them)


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory) -> HookRepo:
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
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True).stdout
    return HookRepo(repo, rev.strip(), tmp_path_factory.mktemp("pre-commit-home"))


def project(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A user's repository holding ``files``, staged."""
    target = tmp_path / "project"
    target.mkdir()
    subprocess.run(["git", "init", "-q", str(target)], check=True)
    for name, data in files.items():
        (target / name).write_bytes(data)
    subprocess.run([*GIT, "add", "-A"], cwd=target, check=True)
    return target


def run_hook(hook_repo: HookRepo, target: Path, hook: str) -> HookRun:
    config = target.parent / "pre-commit-config.yaml"  # outside the user's repository: it holds only their files
    config.write_text(f"repos:\n- repo: {hook_repo.path}\n  rev: {hook_repo.rev}\n  hooks:\n  - id: {hook}\n")
    env = {**os.environ, "PRE_COMMIT_HOME": str(hook_repo.home), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)  # the hook must run the installed copy, not this checkout
    proc = subprocess.run([sys.executable, "-m", "pre_commit", "run", "-c", str(config), "--all-files", "--verbose",
                           "--color", "never"], cwd=target, env=env, capture_output=True, text=True, timeout=900)
    if "An unexpected error has occurred" in proc.stdout + proc.stderr:
        log = hook_repo.home / "pre-commit.log"
        pytest.fail(f"pre-commit could not install or run the hook:\n{proc.stdout}\n{proc.stderr}\n"
                    f"{log.read_text() if log.exists() else ''}")
    return parse_run(proc.stdout, proc.returncode)


def parse_run(stdout: str, returncode: int) -> HookRun:
    """``name....Failed`` then ``- key: value`` lines, a blank line, the hook's output, a blank line.

    The first run of the module starts with ``[INFO]`` lines: it installs the hook environment.
    """
    while stdout.startswith("[INFO] "):
        stdout = stdout.partition("\n")[2]
    header, _, rest = stdout.partition("\n")
    status = re.fullmatch(r"\S.*?\.+(Passed|Failed)", header)
    assert status, stdout
    keys, _, output = rest.partition("\n\n")
    fields = dict(line[2:].split(": ", 1) if ": " in line else (line[2:], "") for line in keys.splitlines())
    exit_code = int(fields.get("exit code", "0"))
    assert returncode == (0 if status.group(1) == "Passed" else 1), stdout
    assert output.endswith("\n\n") or output == "", stdout
    return HookRun(status.group(1), exit_code, "files were modified by this hook" in fields, output[:-1])


def test_check_hook_fails_with_the_diff_and_the_report_and_writes_nothing(tmp_path, hook_repo):
    files = {"train.py": TORCH_SCRIPT, "converted.py": CONVERTED_SCRIPT}
    target = project(tmp_path, files)
    run = run_hook(hook_repo, target, "dpmigrate-check")
    assert (run.status, run.exit_code, run.modified_files) == ("Failed", 1, False)
    assert run.output == "".join(line + "\n" for line in [
        "--- train.py", "+++ train.py", *DIFF_HUNKS.splitlines(),
        converted_script_note("converted.py"), *torch_script_report("train.py"),
        TORCH_SCRIPT_SUMMARY.replace("1 file,", "2 files,"),
    ])
    assert {name: (target / name).read_bytes() for name in files} == files


def test_check_hook_passes_an_already_converted_script(tmp_path, hook_repo):
    target = project(tmp_path, {"converted.py": CONVERTED_SCRIPT})
    run = run_hook(hook_repo, target, "dpmigrate-check")
    assert (run.status, run.exit_code, run.modified_files) == ("Passed", 0, False)
    assert run.output == f"{converted_script_note('converted.py')}\n{UNCHANGED_SUMMARY}\n"
    assert (target / "converted.py").read_bytes() == CONVERTED_SCRIPT


def test_converting_hook_rewrites_the_script_and_fails(tmp_path, hook_repo):
    target = project(tmp_path, {"train.py": TORCH_SCRIPT})
    run = run_hook(hook_repo, target, "dpmigrate")
    assert (run.status, run.exit_code, run.modified_files) == ("Failed", 1, True)
    assert run.output.splitlines() == ["Rewriting train.py", *torch_script_report("train.py"), TORCH_SCRIPT_SUMMARY]
    assert (target / "train.py").read_bytes() == CONVERTED_SCRIPT


def test_hook_on_a_file_that_does_not_parse_fails_with_exit_2_and_leaves_it(tmp_path, hook_repo):
    target = project(tmp_path, {"broken.py": BROKEN_TORCH})
    run = run_hook(hook_repo, target, "dpmigrate-check")
    assert (run.status, run.exit_code, run.modified_files) == ("Failed", 2, False)
    error, summary = run.output.splitlines()
    assert error.startswith("broken.py:3:1: error: does not parse: "), run.output
    assert summary == "1 file, 0 changed, 0 changes, 0 declined, 0 errors, 1 not converted"
    assert (target / "broken.py").read_bytes() == BROKEN_TORCH


def test_hooks_skip_what_the_projects_config_excludes(tmp_path, hook_repo):
    files = {"pyproject.toml": b'[tool.dpmigrate]\nexclude = ["legacy_*.py"]\n', "legacy_train.py": TORCH_SCRIPT,
             "converted.py": CONVERTED_SCRIPT}
    target = project(tmp_path, files)
    run = run_hook(hook_repo, target, "dpmigrate")  # pre-commit names legacy_train.py; --force-exclude skips it
    assert (run.status, run.exit_code, run.modified_files) == ("Passed", 0, False)
    assert run.output == f"{converted_script_note('converted.py')}\n{UNCHANGED_SUMMARY}\n"
    assert {name: (target / name).read_bytes() for name in files} == files
