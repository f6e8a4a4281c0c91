"""The real-script corpus runner (``tests/corpus/run.py``): its manifest checks, how a script comes back from a git
snapshot of its repository, the LIST it hands to ``dpmigrate verify --from``, and the difference with the last run,
where a script that was equivalent and no longer is blocks the change (exit 1)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "corpus"))
import run as corpus  # noqa: E402  (tests/corpus/run.py: a script, not a package)

TRAIN = '''
    """A linear fit over a DataLoader: what verify proves equivalent."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=32):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
'''


def _snapshot(mirrors: Path, repo: str, files: dict[str, str]) -> str:
    """A bare repository laid out as the search tool's fetch leaves one (<mirrors>/<owner>+<name>/repo); its commit."""
    work = mirrors.parent / "work" / repo.replace("/", "+")
    work.mkdir(parents=True)
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(textwrap.dedent(text).lstrip())
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "scripts"], check=True)
    bare = mirrors / repo.replace("/", "+") / "repo"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def _manifest(path: Path, entries: list[dict]) -> Path:
    blocks = []
    for e in entries:
        e = {**e, "split": corpus.split_of(e["repo"], e["path"])}
        blocks.append("[[script]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in e.items()))
    path.write_text("\n".join(blocks))
    return path


def test_the_split_depends_on_where_a_script_is_and_halves_a_corpus():
    assert corpus.split_of("a/b", "train.py") == corpus.split_of("a/b", "train.py")
    splits = [corpus.split_of("user/repo", f"lesson{i}/train.py") for i in range(200)]
    assert 70 < splits.count("dev") < 130 and set(splits) == {"dev", "held-out"}


def test_a_manifest_entry_with_the_wrong_split_or_a_short_commit_is_refused(tmp_path):
    good = {"id": "a", "framework": "torch", "repo": "u/r", "commit": "0" * 40, "path": "t.py"}
    assert [e["id"] for e in corpus.load_manifest(_manifest(tmp_path / "m.toml", [good]))] == ["a"]
    wrong = dict(good, split="held-out" if corpus.split_of("u/r", "t.py") == "dev" else "dev")
    (tmp_path / "w.toml").write_text("[[script]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in wrong.items()))
    with pytest.raises(ValueError, match="the rule gives"):
        corpus.load_manifest(tmp_path / "w.toml")
    with pytest.raises(ValueError, match="40 hex"):
        corpus.load_manifest(_manifest(tmp_path / "c.toml", [dict(good, commit="abc")]))
    with pytest.raises(ValueError, match="used twice"):
        corpus.load_manifest(_manifest(tmp_path / "d.toml", [good, dict(good, path="u.py")]))


def test_a_script_comes_back_from_its_snapshot_with_its_folder_and_list_line(tmp_path, monkeypatch):
    mirrors = tmp_path / "mirrors"
    commit = _snapshot(mirrors, "jdoe/course", {"week3/train.py": TRAIN, "week3/data.csv": "1,2\n"})
    entry = {"id": "w3", "framework": "torch", "repo": "jdoe/course", "commit": commit, "path": "week3/train.py",
             "args": ["--epochs", "1"], "env": {"KERAS_BACKEND": "tensorflow"}}
    script = corpus.materialize(entry, mirrors, tmp_path / "cache")
    assert script.read_text() == textwrap.dedent(TRAIN).lstrip() and (script.parent / "data.csv").read_text() == "1,2\n"
    assert corpus.materialize(entry, mirrors, tmp_path / "cache") == script  # unpacked once
    words = shlex.split(corpus.list_line(entry, script))
    assert words[-3:] == [str(script), "--epochs", "1"]
    assert "DPMIGRATE_CORPUS_SHIM=1" in words and "KERAS_BACKEND=tensorflow" in words
    monkeypatch.setenv("PYTHONPATH", "/frozen/copy")  # the runner's own path stays, behind the shim
    (path,) = [w for w in shlex.split(corpus.list_line(entry, script)) if w.startswith("PYTHONPATH=")]
    assert path == f"PYTHONPATH={corpus.SHIM}{os.pathsep}/frozen/copy"
    # a course script run from the repository's root, which imports the root's packages: --cwd and the root on the path
    root = script.parent.parent
    words = shlex.split(corpus.list_line(dict(entry, cwd=".", pythonpath=["."]), script))
    assert words[-5:] == ["--cwd", str(root), str(script), "--epochs", "1"]
    (path,) = [w for w in words if w.startswith("PYTHONPATH=")]
    assert path == f"PYTHONPATH={corpus.SHIM}{os.pathsep}{root}{os.pathsep}/frozen/copy"
    assert "--cwd" not in shlex.split(corpus.list_line(entry, script))  # default: verify starts in the script's folder
    with pytest.raises(LookupError, match="fetch github:jdoe/other"):
        corpus.materialize(dict(entry, repo="jdoe/other"), mirrors, tmp_path / "cache")
    with pytest.raises(LookupError, match="has no week4/train.py"):
        corpus.materialize(dict(entry, path="week4/train.py"), mirrors, tmp_path / "cache")


def test_a_script_that_was_equivalent_and_no_longer_is_is_a_regression():
    last = {"scripts": {"a": {"verdict": "equivalent"}, "b": {"verdict": "diverges"}, "c": {"verdict": "error"},
                        "d": {"verdict": "nothing to verify"}}}
    rows = [{"id": "a", "verdict": "diverges", "headline": "diverges: x"},
            {"id": "b", "verdict": "equivalent", "headline": "equivalent: y"},
            {"id": "c", "verdict": "error", "headline": "could not run: z"},
            {"id": "d", "verdict": "inconclusive", "headline": "inconclusive: w"},
            {"id": "e", "verdict": "equivalent", "headline": "equivalent: v"}]
    lines, regressions = corpus.difference(rows, last)
    assert regressions == 2
    assert lines == ["REGRESSION a: equivalent -> diverges: diverges: x", "changed    b: diverges -> equivalent: equivalent: y",
                     "REGRESSION d: nothing to verify -> inconclusive: inconclusive: w", "new        e: equivalent"]


def test_the_counts_are_per_framework_and_split():
    rows = [{"framework": "torch", "split": "dev", "verdict": v} for v in ("equivalent", "equivalent", "diverges")]
    rows.append({"framework": "paddle", "split": "held-out", "verdict": "error"})
    assert corpus.counts_table(rows) == [
        "torch      dev        3 scripts, 2 equivalent: 1 diverges, 2 equivalent",
        "paddle     held-out   1 scripts, 0 equivalent: 1 error",
        "all                   4 scripts: 1 diverges, 2 equivalent, 1 error"]


def test_the_committed_manifest_is_valid_and_split_by_the_rule():
    if not corpus.MANIFEST.exists():
        pytest.fail("tests/corpus/manifest.toml is missing")
    entries = corpus.load_manifest()
    per = {f: sum(e["framework"] == f for e in entries) for f in corpus.FRAMEWORKS}
    assert len(entries) >= 100 and min(per.values()) >= 25, per


def test_a_snapshot_without_its_large_files_still_gives_back_the_script(tmp_path):
    """Snapshots lack files of 4 MiB and more (a data set, a PDF): the tree comes back without them."""
    mirrors = tmp_path / "mirrors"
    commit = _snapshot(mirrors, "jdoe/big", {"train.py": TRAIN, "data/huge.bin": "pretend this is 40 MB\n"})
    bare = mirrors / "jdoe+big" / "repo"
    blob = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", f"{commit}:data/huge.bin"], capture_output=True,
                          text=True, check=True).stdout.strip()
    loose = bare / "objects" / blob[:2] / blob[2:]
    if not loose.exists():  # (a packed clone: unpack it so the one object can go)
        for pack in (bare / "objects" / "pack").glob("*.pack"):
            moved = tmp_path / pack.name
            pack.rename(moved)
            (bare / "objects" / "pack" / pack.with_suffix(".idx").name).unlink()
            subprocess.run(["git", "--git-dir", str(bare), "unpack-objects", "-q"], stdin=moved.open("rb"), check=True)
    loose.unlink()
    entry = {"id": "big", "framework": "torch", "repo": "jdoe/big", "commit": commit, "path": "train.py"}
    script = corpus.materialize(entry, mirrors, tmp_path / "cache")
    assert script.read_text() == textwrap.dedent(TRAIN).lstrip()
    assert not (script.parent / "data" / "huge.bin").exists()


def test_the_results_name_the_dpmigrate_the_runs_imported_a_frozen_copy_by_its_source(tmp_path, monkeypatch):
    """A copy made with ``git archive`` (the way to measure a commit while the tree is edited) has no .git: it is named
    by a digest of its source, which changes with one edited byte; the tree itself, when clean, by its commit."""
    import shutil

    import dpmigrate

    frozen = tmp_path / "frozen"
    shutil.copytree(Path(dpmigrate.__file__).parent, frozen / "dpmigrate", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("PYTHONPATH", str(frozen))
    first = corpus.measured_dpmigrate(sys.executable)
    assert first == "source " + corpus.source_digest(frozen / "dpmigrate"), first
    (frozen / "dpmigrate" / "findings.py").write_text((frozen / "dpmigrate" / "findings.py").read_text() + "\n# edited\n")
    edited = corpus.measured_dpmigrate(sys.executable)
    assert edited.startswith("source ") and edited != first
