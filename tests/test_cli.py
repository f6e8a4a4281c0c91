"""The command line: modes, exit codes, what is written (atomically, byte for byte) and what is not.

Expectations are literal (``cli_samples``): the exact bytes a conversion writes, the exact diff
and report lines, the exact exit code; a rule that stops converting fails these tests.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cli_samples import (
    BROKEN_TORCH,
    CONVERTED_SCRIPT,
    DIFF_HUNKS,
    PLAIN_SCRIPT,
    RANK_DIVERGENT,
    TORCH_SCRIPT,
    TORCH_SCRIPT_RULES,
    TORCH_SCRIPT_SUMMARY,
    UNCHANGED_SUMMARY,
    converted_script_note,
    rank_divergent_report,
    torch_script_report,
)

from dpmigrate.cli import main
from dpmigrate.rules import all_rules
from dpmigrate.userfiles.selection import discover


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".dpmigrate-tmp")]


# --- modes and exit codes -------------------------------------------------------------------------

def test_rewrites_in_place_exits_1_and_reports_every_change(tmp_path, capsys):
    script = write(tmp_path / "train.py", TORCH_SCRIPT)
    assert main([str(script)]) == 1
    assert script.read_bytes() == CONVERTED_SCRIPT
    assert capsys.readouterr().err.splitlines() == [
        f"Rewriting {script}", *torch_script_report(str(script)), TORCH_SCRIPT_SUMMARY]


def test_second_run_changes_nothing_and_exits_0(tmp_path, capsys):
    script = write(tmp_path / "train.py", TORCH_SCRIPT)
    assert main([str(script)]) == 1
    capsys.readouterr()
    assert main([str(script)]) == 0
    assert script.read_bytes() == CONVERTED_SCRIPT
    assert capsys.readouterr().err.splitlines() == [converted_script_note(str(script)), UNCHANGED_SUMMARY]


def test_file_without_a_framework_is_untouched_and_exits_0(tmp_path, capsys):
    script = write(tmp_path / "util.py", PLAIN_SCRIPT)
    before = os.stat(script)
    assert main([str(script)]) == 0
    assert script.read_bytes() == PLAIN_SCRIPT
    assert os.stat(script).st_mtime_ns == before.st_mtime_ns
    assert capsys.readouterr().err == UNCHANGED_SUMMARY + "\n"


def test_check_writes_nothing_and_exits_1_when_a_file_would_change(tmp_path, capsys):
    script = write(tmp_path / "train.py", TORCH_SCRIPT)
    assert main(["--check", str(script)]) == 1
    assert script.read_bytes() == TORCH_SCRIPT
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [*torch_script_report(str(script)), TORCH_SCRIPT_SUMMARY]
    assert captured.out == ""


def test_check_passes_a_converted_script(tmp_path, capsys):
    script = write(tmp_path / "train.py", CONVERTED_SCRIPT)
    assert main(["--check", str(script)]) == 0
    assert capsys.readouterr().err.splitlines() == [converted_script_note(str(script)), UNCHANGED_SUMMARY]


def test_check_fails_on_rank_divergent_code_even_without_a_change(tmp_path, capsys):
    script = write(tmp_path / "eval.py", RANK_DIVERGENT)
    assert main(["--check", str(script)]) == 1
    assert script.read_bytes() == RANK_DIVERGENT
    assert capsys.readouterr().err.splitlines() == rank_divergent_report(str(script))


def test_diff_prints_the_conversion_and_writes_nothing(tmp_path, capsys):
    script = write(tmp_path / "train.py", TORCH_SCRIPT)
    assert main(["--diff", "--color", "never", str(script)]) == 1
    assert capsys.readouterr().out == f"--- {script}\n+++ {script}\n" + DIFF_HUNKS
    assert script.read_bytes() == TORCH_SCRIPT


def test_diff_is_colored_only_when_asked(tmp_path, capsys):
    script = write(tmp_path / "train.py", TORCH_SCRIPT)
    main(["--diff", "--color", "always", str(script)])
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [f"\033[1m--- {script}\033[0m", f"\033[1m+++ {script}\033[0m", "\033[36m@@ -1,14 +1,17 @@\033[0m"]
    assert "\033[32m+    dp.init()\033[0m" in out
    assert '\033[31m-    torch.save(model.state_dict(), "model.pt")\033[0m' in out
    assert " import torch" in out  # context lines stay plain
    main(["--diff", str(script)])  # auto: captured stdout is not a terminal
    assert capsys.readouterr().out == f"--- {script}\n+++ {script}\n" + DIFF_HUNKS


def test_diff_of_an_unchanged_file_is_empty(tmp_path, capsys):
    script = write(tmp_path / "util.py", PLAIN_SCRIPT)
    assert main(["--diff", str(script)]) == 0
    assert capsys.readouterr().out == ""


def test_output_dir_mirrors_the_tree_and_leaves_the_sources(tmp_path, capsys):
    src = tmp_path / "src"
    train = write(src / "a" / "train.py", TORCH_SCRIPT)
    util = write(src / "b" / "sub" / "util.py", PLAIN_SCRIPT)
    out = tmp_path / "out"
    assert main(["-o", str(out), str(src)]) == 1
    assert (out / "a" / "train.py").read_bytes() == CONVERTED_SCRIPT
    assert (out / "b" / "sub" / "util.py").read_bytes() == PLAIN_SCRIPT
    assert train.read_bytes() == TORCH_SCRIPT and util.read_bytes() == PLAIN_SCRIPT
    assert capsys.readouterr().err.splitlines()[0] == f"Rewriting {train} -> {out / 'a' / 'train.py'}"


def test_output_dir_refuses_two_inputs_with_one_copy(tmp_path, capsys):
    first = write(tmp_path / "a" / "train.py", TORCH_SCRIPT)
    second = write(tmp_path / "b" / "train.py", TORCH_SCRIPT)
    assert main(["-o", str(tmp_path / "out"), str(first), str(second)]) == 2
    assert "would both be written to train.py" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_output_dir_with_check_is_a_usage_error(tmp_path):
    script = write(tmp_path / "train.py", TORCH_SCRIPT)
    with pytest.raises(SystemExit) as exc:
        main(["--check", "-o", str(tmp_path / "out"), str(script)])
    assert exc.value.code == 2


def test_missing_path_exits_2_and_names_it(tmp_path, capsys):
    assert main([str(tmp_path / "nope.py")]) == 2
    assert "nope.py: no such file or directory" in capsys.readouterr().err


def test_no_path_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "no PATH given" in capsys.readouterr().err


# --- files that cannot be converted or written --------------------------------------------------------

def test_file_that_does_not_parse_exits_2_with_its_line_and_stays_byte_identical(tmp_path, capsys):
    script = write(tmp_path / "broken.py", BROKEN_TORCH)
    good = write(tmp_path / "util.py", PLAIN_SCRIPT)
    assert main([str(script), str(good)]) == 2
    err = capsys.readouterr().err
    assert f"{script}:3:" in err or f"{script}:4:" in err
    assert "does not parse" in err
    assert script.read_bytes() == BROKEN_TORCH


def test_latin1_bytes_without_a_coding_comment_exit_2_as_not_utf8(tmp_path, capsys):
    source = b'import torch\nname = "Jos\xe9"\n'
    script = write(tmp_path / "latin.py", source)
    assert main([str(script)]) == 2
    err = capsys.readouterr().err
    assert f"{script}:2:12: error: is not UTF-8: byte 0xe9" in err
    assert "coding: latin-1" in err  # the fix is named
    assert script.read_bytes() == source


def test_latin1_with_a_coding_comment_is_converted_in_its_encoding(tmp_path):
    def latin1(script: bytes, after_imports: bytes) -> bytes:
        author = b'\nAUTHOR = "Jos\xe9"\n'
        return b"# -*- coding: latin-1 -*-\n" + script.replace(after_imports, after_imports + author, 1)

    script = write(tmp_path / "latin.py", latin1(TORCH_SCRIPT, b"TensorDataset\n"))
    assert main([str(script)]) == 1
    assert script.read_bytes() == latin1(CONVERTED_SCRIPT, b"import dpmigrate.runtime.torch as dp\n")


def test_nul_bytes_are_not_text(tmp_path, capsys):
    script = write(tmp_path / "blob.py", b"import torch\x00\n")
    assert main([str(script)]) == 2
    assert "is not text" in capsys.readouterr().err
    assert script.read_bytes() == b"import torch\x00\n"


def test_bom_and_crlf_are_kept(tmp_path):
    source = b"\xef\xbb\xbf" + TORCH_SCRIPT.replace(b"\n", b"\r\n")
    script = write(tmp_path / "train.py", source)
    assert main([str(script)]) == 1
    assert script.read_bytes() == b"\xef\xbb\xbf" + CONVERTED_SCRIPT.replace(b"\n", b"\r\n")


def test_write_protected_file_exits_2_and_is_untouched(tmp_path, capsys):
    script = write(tmp_path / "train.py", TORCH_SCRIPT)
    script.chmod(0o444)
    assert main([str(script)]) == 2
    assert f"{script}: error: is write-protected" in capsys.readouterr().err
    assert script.read_bytes() == TORCH_SCRIPT
    assert stat.S_IMODE(script.stat().st_mode) == 0o444
    assert leftovers(tmp_path) == []


def test_file_in_a_write_protected_folder_exits_2_and_is_untouched(tmp_path, capsys):
    folder = tmp_path / "ro"
    script = write(folder / "train.py", TORCH_SCRIPT)
    folder.chmod(0o555)
    try:
        assert main([str(script)]) == 2
        assert f"{script}: error: cannot be written: its folder {folder} is write-protected" in capsys.readouterr().err
        assert script.read_bytes() == TORCH_SCRIPT
        assert sorted(p.name for p in folder.iterdir()) == ["train.py"]
    finally:
        folder.chmod(0o755)


def test_copy_into_a_write_protected_folder_exits_2_and_leaves_no_temporary_file(tmp_path, capsys):
    script = write(tmp_path / "train.py", TORCH_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o555)
    try:
        assert main(["-o", str(out), str(script)]) == 2
        assert "is write-protected" in capsys.readouterr().err
        assert list(out.iterdir()) == []
    finally:
        out.chmod(0o755)
    assert script.read_bytes() == TORCH_SCRIPT
    assert leftovers(tmp_path) == []


def test_copy_onto_a_file_where_a_folder_should_be_exits_2(tmp_path, capsys):
    script = write(tmp_path / "src" / "pkg" / "train.py", TORCH_SCRIPT)
    write(tmp_path / "out" / "pkg", b"a file, not a folder")
    assert main(["-o", str(tmp_path / "out"), str(tmp_path / "src")]) == 2
    assert "cannot be written" in capsys.readouterr().err
    assert script.read_bytes() == TORCH_SCRIPT
    assert leftovers(tmp_path) == []


def test_rewrite_keeps_the_file_mode(tmp_path):
    script = write(tmp_path / "train.py", TORCH_SCRIPT)
    script.chmod(0o750)
    assert main([str(script)]) == 1
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert leftovers(tmp_path) == []


def test_copies_keep_the_source_mode(tmp_path):
    script = write(tmp_path / "src" / "run.py", PLAIN_SCRIPT)
    script.chmod(0o755)
    main(["-o", str(tmp_path / "out"), str(tmp_path / "src")])
    assert stat.S_IMODE((tmp_path / "out" / "run.py").stat().st_mode) == 0o755


# --- which files a directory holds ---------------------------------------------------------------------

def make_tree(root: Path) -> set[str]:
    """A project with files to skip; returns the relative paths a run must visit."""
    write(root / "train.py", TORCH_SCRIPT)
    write(root / "pkg" / "util.py", PLAIN_SCRIPT)
    write(root / "pkg" / "notes.txt", b"import torch\n")
    write(root / ".hidden" / "secret.py", TORCH_SCRIPT)
    write(root / "env" / "pyvenv.cfg", b"home = /usr/bin\n")
    write(root / "env" / "lib" / "site.py", TORCH_SCRIPT)
    write(root / "build" / "lib" / "train.py", TORCH_SCRIPT)
    write(root / "pkg" / "model_gen.py", TORCH_SCRIPT)
    write(root / "pkg" / "keep_gen.py", TORCH_SCRIPT)
    write(root / "data" / "cache" / "x.py", TORCH_SCRIPT)
    write(root / "data" / "loader.py", TORCH_SCRIPT)
    write(root / ".gitignore", b"# outputs\nbuild/\n*_gen.py\n!keep_gen.py\n/data/cache\n")
    return {"train.py", "pkg/util.py", "pkg/keep_gen.py", "data/loader.py"}


@pytest.mark.parametrize("in_git", [True, False], ids=["git-work-tree", "plain-folder"])
def test_directories_skip_hidden_ignored_and_virtualenv_folders(tmp_path, in_git):
    root = tmp_path / "project"
    wanted = make_tree(root)
    if in_git:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
    found = {s.relative.replace(os.sep, "/") for s in discover([str(root)])}
    assert found == wanted


@pytest.mark.parametrize("in_git", [True, False], ids=["git-work-tree", "plain-folder"])
def test_gitignore_anchors_double_stars_classes_and_folder_patterns(tmp_path, in_git):
    """The same answers from git and from the reader used outside git."""
    root = tmp_path / "p"
    for rel in ["a/x.py", "a/b/x.py", "a/b/y.py", "docs/conf.py", "src/docs/conf.py", "deep/q/gen/y.py",
                "z.py", "tmp1.py", "tmp12.py", "v3.py", "v7.py", "#literal.py", "src/#literal.py", "src/logs/k.py"]:
        write(root / rel, b"x = 1\n")
    write(root / ".gitignore", b"/docs/\n**/gen/\na/**/x.py\ntmp?.py\nv[!7].py\n\\#literal.py\nlogs  \n")
    write(root / "src" / ".gitignore", b"!/#literal.py\n")
    if in_git:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
    found = {s.relative.replace(os.sep, "/") for s in discover([str(root)])}
    assert found == {"a/b/y.py", "src/docs/conf.py", "z.py", "tmp12.py", "v7.py", "src/#literal.py"}


def test_a_named_file_is_converted_even_if_ignored_or_not_py(tmp_path):
    script = write(tmp_path / "build" / "train", TORCH_SCRIPT)
    write(tmp_path / ".gitignore", b"build/\n")
    assert [s.path for s in discover([str(script)])] == [str(script)]


def test_directory_run_reports_every_visited_file_and_skips_the_rest(tmp_path, capsys):
    root = tmp_path / "project"
    wanted = make_tree(root)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    originals = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert main(["--check", "--report", "json", str(root)]) == 1
    report = json.loads(capsys.readouterr().out)
    changed = {os.path.relpath(f["path"], root): f["changed"] for f in report["files"]}
    assert changed == {"train.py": True, "pkg/util.py": False, "pkg/keep_gen.py": True, "data/loader.py": True}
    assert set(changed) == wanted
    assert {p: p.read_bytes() for p in originals} == originals


def test_parallel_run_gives_the_same_result_as_a_serial_one(tmp_path, capsys):
    results = []
    for jobs in ("1", "2"):
        root = tmp_path / f"j{jobs}"
        for i in range(6):
            write(root / f"m{i}" / "train.py", TORCH_SCRIPT)
            write(root / f"m{i}" / "util.py", PLAIN_SCRIPT)
        write(root / "m3" / "broken.py", BROKEN_TORCH)
        code = main(["-j", jobs, "--report", "json", "--report-file", str(tmp_path / f"r{jobs}.json"), str(root)])
        err = capsys.readouterr().err.replace(str(root), "ROOT")
        report = json.loads((tmp_path / f"r{jobs}.json").read_text())
        for entry in report["files"]:
            entry["path"] = os.path.relpath(entry["path"], root)
        tree = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        results.append((code, err, report["files"], tree))
    assert results[0] == results[1]
    assert results[0][0] == 2  # the broken file


# --- reports -------------------------------------------------------------------------------------------

def test_json_report_lists_files_findings_and_summary(tmp_path, capsys):
    script = write(tmp_path / "train.py", TORCH_SCRIPT)
    broken = write(tmp_path / "broken.py", BROKEN_TORCH)
    assert main(["--check", "--report", "json", str(script), str(broken)]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "dpmigrate-report/1" and report["mode"] == "check"
    assert report["summary"] == {"files": 2, "changed": 1, "changes": 7, "declined": 0, "errors": 0, "notes": 0,
                                 "not_converted": 1}
    assert [(f["path"], f["framework"], f["changed"]) for f in report["files"]] == [
        (str(script), "torch", True), (str(broken), None, False)]
    assert report["files"][0]["failure"] is None
    failure = report["files"][1]["failure"]
    assert (failure["line"], failure["col"]) == (3, 1) and failure["reason"].startswith("does not parse: ")
    assert [(f["path"], f["line"], f["col"], f["rule"], f["severity"]) for f in report["findings"]] == [
        (str(script), line, col, rule, "change")
        for (line, col), rule in zip([(7, 5), (7, 14), (9, 14), (10, 5), (11, 17), (19, 9), (20, 5)],
                                     TORCH_SCRIPT_RULES)]
    assert report["findings"][4]["message"] == "SGD(...) -> dp.distributed_optimizer(...)"


def test_sarif_report_is_sarif_2_1_0(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "src" / "train.py", TORCH_SCRIPT)
    write(tmp_path / "src" / "broken.py", BROKEN_TORCH)
    assert main(["--check", "--report", "sarif", "src"]) == 2
    sarif = json.loads(capsys.readouterr().out)
    assert sarif["version"] == "2.1.0" and "sarif-2.1.0" in sarif["$schema"]
    (run,) = sarif["runs"]
    rule_ids = [rule["id"] for rule in run["tool"]["driver"]["rules"]]
    assert run["tool"]["driver"]["name"] == "dpmigrate"
    assert set(TORCH_SCRIPT_RULES) | {"rank-divergent-code", "not-converted"} <= set(rule_ids)
    located = [(r["ruleId"], r["level"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
                r["locations"][0]["physicalLocation"]["region"]["startLine"]) for r in run["results"]]
    assert located == [("not-converted", "error", "src/broken.py", 3)] + [
        (rule, "note", "src/train.py", line) for rule, line in zip(TORCH_SCRIPT_RULES, [7, 7, 9, 10, 11, 19, 20])]
    for result in run["results"]:
        assert rule_ids[result["ruleIndex"]] == result["ruleId"]


def test_report_file_receives_the_text_report(tmp_path, capsys):
    script = write(tmp_path / "util.py", PLAIN_SCRIPT)
    report = tmp_path / "report.txt"
    assert main(["--report-file", str(report), str(script)]) == 0
    assert report.read_text().endswith("1 file, 0 changed, 0 changes, 0 declined, 0 errors\n")
    assert "0 changed" not in capsys.readouterr().err


def test_unwritable_report_file_exits_2_and_the_report_goes_to_stderr(tmp_path, capsys):
    script = write(tmp_path / "util.py", PLAIN_SCRIPT)
    assert main(["--report-file", str(tmp_path / "no" / "such" / "report.txt"), str(script)]) == 2
    err = capsys.readouterr().err
    assert "--report-file" in err and "No such file or directory" in err
    assert "1 file, 0 changed" in err


def test_diff_and_a_json_report_cannot_share_stdout(tmp_path):
    script = write(tmp_path / "util.py", PLAIN_SCRIPT)
    with pytest.raises(SystemExit) as exc:
        main(["--diff", "--report", "json", str(script)])
    assert exc.value.code == 2


def test_list_rules_prints_every_rule_with_its_summary(capsys):
    assert main(["--list-rules"]) == 0
    listed = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert set(TORCH_SCRIPT_RULES) | {"rank-divergent-code", "evaluation-loader", "global-batch-size"} <= set(listed)
    assert listed["distributed-save"] == "Replace ``torch.save(obj, path)`` with ``dp.save(obj, path)``."
    for rule in all_rules():  # every rule the engine runs, each with the first line of its docstring
        assert listed[rule.name] == rule.__doc__.strip().splitlines()[0]


# --- the program itself ----------------------------------------------------------------------------------

def test_launch_is_dispatched_to_the_launcher(capsys):
    assert main(["launch", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: dpmigrate launch")


def test_python_dash_m_runs_the_same_command(tmp_path):
    script = write(tmp_path / "util.py", PLAIN_SCRIPT)
    version = subprocess.run([sys.executable, "-m", "dpmigrate", "--version"],
                             capture_output=True, text=True, check=True)
    assert version.stdout.startswith("dpmigrate ")
    proc = subprocess.run([sys.executable, "-m", "dpmigrate", "--check", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
