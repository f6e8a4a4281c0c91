"""The conventions formatters share: ``-`` for stdin, ``--select``/``--ignore``, ``[tool.dpmigrate]`` defaults.

Every expectation is literal (``cli_samples``, or a named literal edit of it), so a rule that
stops converting, or a setting that stops reaching the rules, fails here.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_samples import (
    BROKEN_TORCH,
    CONVERTED_SCRIPT,
    DIFF_HUNKS,
    PLAIN_SCRIPT,
    POLICY,
    POLICY_NOTHING_SHARDED,
    TORCH_SCRIPT,
    TORCH_SCRIPT_SUMMARY,
    UNCHANGED_SUMMARY,
    converted_script_note,
    torch_script_report,
)

from dpmigrate.cli import main
from dpmigrate.findings import Options

KEYS = "batch, exclude, framework, ignore, scale-lr, select, sync-batchnorm"


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def edited(data: bytes, *edits: tuple[bytes, bytes]) -> bytes:
    """``data`` with each literal ``old`` replaced by ``new`` (each must be there exactly once)."""
    for old, new in edits:
        assert data.count(old) == 1, old
        data = data.replace(old, new)
    return data


GLOBAL_BATCH = (b"DataLoader(data, batch_size=8, shuffle=True))",
                b"DataLoader(data, batch_size=dp.per_rank_batch_size(8), shuffle=True))")
LINEAR_LR = (b"lr=0.1))", b'lr=dp.scale_lr(0.1, "linear")))')
# TORCH_SCRIPT with only main-process-print and distributed-save (and the runtime import they need)
PRINT_AND_SAVE_ONLY = edited(
    TORCH_SCRIPT,
    (b"TensorDataset\n", b"TensorDataset\nimport dpmigrate.runtime.torch as dp\n"),
    (b'        print(f"epoch', b'        dp.print(f"epoch'),
    (b"    torch.save(model", b"    dp.save(model"),
)


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """An empty project folder, the current directory (so no pyproject.toml of this repository is found)."""
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.chdir(root)
    return root


def feed_stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


# --- [tool.dpmigrate] ---------------------------------------------------------------------------------

def test_config_sets_the_batch_and_learning_rate_policies(project):
    write(project / "pyproject.toml",
          '[project]\nname = "x"\n\n[tool.dpmigrate]\nbatch = "global"\nscale-lr = "linear"\n')
    script = write(project / "train.py", TORCH_SCRIPT)
    assert main(["train.py"]) == 1
    assert script.read_bytes() == edited(CONVERTED_SCRIPT, GLOBAL_BATCH, LINEAR_LR)


def test_flags_override_the_config(project):
    write(project / "pyproject.toml", '[tool.dpmigrate]\nbatch = "global"\nscale-lr = "linear"\n')
    script = write(project / "train.py", TORCH_SCRIPT)
    assert main(["--batch", "per-device", "--scale-lr", "none", "train.py"]) == 1
    assert script.read_bytes() == CONVERTED_SCRIPT


BATCHNORM_SCRIPT = TORCH_SCRIPT.replace(b"nn.Linear(4, 1)", b"nn.Sequential(nn.Linear(4, 1), nn.BatchNorm1d(1))")
SYNC_INIT = b"    dp.init(dp.Strategy(sync_batchnorm=True))\n"


@pytest.mark.parametrize(("table", "flags", "synchronised"), [
    ("sync-batchnorm = true", [], True),
    ("sync-batchnorm = true", ["--no-sync-batchnorm"], False),
    ("", ["--sync-batchnorm"], True),
    ("sync-batchnorm = false", [], False),
])
def test_sync_batchnorm_from_the_config_or_the_flag(project, table, flags, synchronised):
    write(project / "pyproject.toml", f"[tool.dpmigrate]\n{table}\n")
    script = write(project / "train.py", BATCHNORM_SCRIPT)
    assert main([*flags, "train.py"]) == 1
    assert (SYNC_INIT in script.read_bytes()) is synchronised
    assert (b"    dp.init()\n" in script.read_bytes()) is not synchronised


def test_config_is_found_from_the_current_folder_upward_past_pyprojects_without_the_table(project, monkeypatch):
    write(project / "pyproject.toml", '[tool.dpmigrate]\nbatch = "global"\n')
    write(project / "pkg" / "pyproject.toml", '[project]\nname = "pkg"\n')  # no [tool.dpmigrate]: passed over
    script = write(project / "pkg" / "deep" / "train.py", TORCH_SCRIPT)
    monkeypatch.chdir(project / "pkg" / "deep")
    assert main(["train.py"]) == 1
    assert script.read_bytes() == edited(CONVERTED_SCRIPT, GLOBAL_BATCH)


def test_the_nearest_table_wins(project, monkeypatch):
    write(project / "pyproject.toml", '[tool.dpmigrate]\nbatch = "global"\n')
    write(project / "sub" / "pyproject.toml", '[tool.dpmigrate]\nscale-lr = "linear"\n')
    script = write(project / "sub" / "train.py", TORCH_SCRIPT)
    monkeypatch.chdir(project / "sub")
    assert main(["train.py"]) == 1
    assert script.read_bytes() == edited(CONVERTED_SCRIPT, LINEAR_LR)  # the outer batch setting is not merged in


def test_config_ignore_and_select_choose_the_rules(project, capsys):
    write(project / "pyproject.toml", '[tool.dpmigrate]\nselect = ["main-process-print", "distributed-save", '
                                      '"init-runtime"]\nignore = ["init-runtime"]\n')
    script = write(project / "train.py", TORCH_SCRIPT)
    assert main(["train.py"]) == 1
    assert script.read_bytes() == PRINT_AND_SAVE_ONLY
    assert capsys.readouterr().err.splitlines() == [
        "Rewriting train.py", *torch_script_report("train.py")[-2:],
        "1 file, 1 changed, 2 changes, 0 declined, 0 errors" + POLICY_NOTHING_SHARDED]


@pytest.mark.parametrize(("table", "message"), [
    ('batchsize = 8', f"[tool.dpmigrate] batchsize: unknown key; the keys are {KEYS}"),
    ('batch = "huge"', '[tool.dpmigrate] batch = "huge": expected one of "per-device", "global"'),
    ('scale-lr = 2', '[tool.dpmigrate] scale-lr = 2: expected one of "none", "linear", "sqrt"'),
    ('framework = "jax"',
     '[tool.dpmigrate] framework = "jax": expected one of "auto", "torch", "tensorflow", "paddle"'),
    ('ignore = "distributed-save"',
     '[tool.dpmigrate] ignore = "distributed-save": expected a list of strings, e.g. ignore = ["..."]'),
    ('sync-batchnorm = "yes"', '[tool.dpmigrate] sync-batchnorm = "yes": expected true or false'),
    ('exclude = ["a", 1]', '[tool.dpmigrate] exclude = ["a", 1]: expected a list of strings, e.g. exclude = ["..."]'),
])
def test_a_bad_key_or_value_exits_2_naming_the_file(project, capsys, table, message):
    config = write(project / "pyproject.toml", f"[tool.dpmigrate]\n{table}\n")
    script = write(project / "train.py", TORCH_SCRIPT)
    assert main(["train.py"]) == 2
    assert capsys.readouterr().err == f"dpmigrate: error: {config}: {message}\n"
    assert script.read_bytes() == TORCH_SCRIPT


def test_an_unknown_rule_in_the_config_exits_2_listing_the_rules(project, capsys):
    config = write(project / "pyproject.toml", '[tool.dpmigrate]\nselect = ["distributed-save", "save-everything"]\n')
    write(project / "train.py", TORCH_SCRIPT)
    assert main(["train.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dpmigrate: error: {config}: [tool.dpmigrate] select: unknown rule 'save-everything'; "
                          "the rules are: init-runtime, rank-device, ")
    assert "distributed-save" in err.split("the rules are: ")[1]


def test_invalid_toml_exits_2_naming_the_file(project, capsys):
    config = write(project / "pyproject.toml", "[tool.dpmigrate\nbatch = \n")
    write(project / "train.py", TORCH_SCRIPT)
    assert main(["train.py"]) == 2
    assert capsys.readouterr().err.startswith(f"dpmigrate: error: {config}: is not valid TOML (")


def make_excluding_project(root: Path) -> None:
    write(root / "pyproject.toml", '[tool.dpmigrate]\nexclude = ["legacy/", "*_gen.py", "!keep_gen.py", "/top.py"]\n')
    for rel in ["train.py", "top.py", "legacy/old.py", "src/legacy/old.py", "src/model_gen.py", "src/keep_gen.py",
                "src/top.py"]:
        write(root / rel, TORCH_SCRIPT)


def test_exclude_prunes_folder_walks_relative_to_the_pyproject(project, monkeypatch, capsys):
    make_excluding_project(project)
    assert main(["--check", "--report", "json", "."]) == 1
    converted = [f["path"] for f in json.loads(capsys.readouterr().out)["files"]]
    assert converted == ["src/keep_gen.py", "src/top.py", "train.py"]
    monkeypatch.chdir(project / "src")  # patterns stay relative to the pyproject.toml's folder
    assert main(["--check", "--report", "json", "."]) == 1
    assert [f["path"] for f in json.loads(capsys.readouterr().out)["files"]] == ["keep_gen.py", "top.py"]


def test_a_file_named_on_the_command_line_is_converted_unless_force_exclude(project, capsys):
    make_excluding_project(project)
    assert main(["--check", "legacy/old.py", "src/model_gen.py", "top.py"]) == 1
    assert capsys.readouterr().err.endswith("3 files, 3 changed, 21 changes, 0 declined, 0 errors" + POLICY + "\n")
    assert main(["--check", "--force-exclude", "legacy/old.py", "src/model_gen.py", "top.py", "train.py"]) == 1
    assert capsys.readouterr().err.endswith(f"\n{TORCH_SCRIPT_SUMMARY}\n")  # train.py alone
    assert main(["--check", "--force-exclude", "legacy"]) == 0  # a named folder too
    assert capsys.readouterr().err == "0 files, 0 changed, 0 changes, 0 declined, 0 errors\n"


# --- --select / --ignore ------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["--select", "main-process-print,distributed-save"],
    ["--select", "main-process-print", "--select", "distributed-save"],
    ["--select", "main-process-print, distributed-save,init-runtime", "--ignore", "init-runtime"],
])
def test_select_runs_only_the_named_rules(project, argv):
    script = write(project / "train.py", TORCH_SCRIPT)
    assert main([*argv, "train.py"]) == 1
    assert script.read_bytes() == PRINT_AND_SAVE_ONLY


def test_ignore_turns_rules_off(project, capsys):
    script = write(project / "train.py", TORCH_SCRIPT)
    assert main(["--ignore", "main-process-print", "--ignore", "distributed-save", "train.py"]) == 1
    assert script.read_bytes() == edited(
        CONVERTED_SCRIPT,
        (b'        dp.print(f"epoch', b'        print(f"epoch'),
        (b"    dp.save(model", b"    torch.save(model"),
    )
    assert capsys.readouterr().err.splitlines()[-1] == "1 file, 1 changed, 5 changes, 0 declined, 0 errors" + POLICY


def test_flags_replace_the_configured_rule_choice(project):
    write(project / "pyproject.toml", '[tool.dpmigrate]\nignore = ["distributed-model", "rank-device"]\n')
    script = write(project / "train.py", TORCH_SCRIPT)
    assert main(["--ignore", "init-runtime", "--select", "main-process-print,distributed-save,init-runtime",
                 "train.py"]) == 1
    assert script.read_bytes() == PRINT_AND_SAVE_ONLY


def test_selecting_only_a_checking_rule_changes_nothing(project, capsys):
    script = write(project / "train.py", TORCH_SCRIPT)
    assert main(["--select", "rank-divergent-code", "train.py"]) == 0
    assert script.read_bytes() == TORCH_SCRIPT
    assert capsys.readouterr().err == UNCHANGED_SUMMARY + "\n"


@pytest.mark.parametrize("flag", ["--select", "--ignore"])
def test_an_unknown_rule_is_a_usage_error_listing_the_rules(project, capsys, flag):
    script = write(project / "train.py", TORCH_SCRIPT)
    with pytest.raises(SystemExit) as exc:
        main([flag, "distributed-save,save-all,print-once", "train.py"])
    assert exc.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"dpmigrate: error: {flag}: unknown rules 'save-all', 'print-once'; the rules are: "
                           "init-runtime, rank-device, device-variable, replace-data-parallel, distributed-model, ")
    for rule in ("rank-divergent-code", "keras-rank-divergent-code", "static-rank-divergence"):  # every framework's
        assert f", {rule}" in last
    assert script.read_bytes() == TORCH_SCRIPT


def test_an_empty_select_is_a_usage_error(project, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--select", ",", "train.py"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == "dpmigrate: error: --select needs a rule name (see --list-rules)"


def test_options_run_a_rule_when_selected_and_not_ignored():
    assert Options().runs("distributed-save")
    assert Options(select=("distributed-save",)).runs("distributed-save")
    assert not Options(select=("distributed-save",)).runs("init-runtime")
    assert not Options(select=("distributed-save",), ignore=("distributed-save",)).runs("distributed-save")
    assert not Options(ignore=("init-runtime",)).runs("init-runtime")


# --- `-`: standard input to standard output -----------------------------------------------------------

def test_stdin_is_converted_to_stdout_with_the_report_on_stderr(project, monkeypatch, capsysbinary):
    feed_stdin(monkeypatch, TORCH_SCRIPT)
    assert main(["-"]) == 1
    out, err = capsysbinary.readouterr()
    assert out == CONVERTED_SCRIPT
    assert err.decode().splitlines() == [*torch_script_report("-"), TORCH_SCRIPT_SUMMARY]
    assert os.listdir(project) == []


@pytest.mark.parametrize("source", [PLAIN_SCRIPT, CONVERTED_SCRIPT], ids=["no-framework", "converted"])
def test_stdin_that_needs_no_change_is_echoed_and_exits_0(project, monkeypatch, capsysbinary, source):
    feed_stdin(monkeypatch, source)
    assert main(["-"]) == 0
    assert capsysbinary.readouterr().out == source


def test_stdin_filename_names_the_script_in_the_report(project, monkeypatch, capsysbinary):
    feed_stdin(monkeypatch, CONVERTED_SCRIPT)
    assert main(["--stdin-filename", "src/train.py", "-"]) == 0
    out, err = capsysbinary.readouterr()
    assert out == CONVERTED_SCRIPT
    assert err.decode() == f"{converted_script_note('src/train.py')}\n{UNCHANGED_SUMMARY}\n"


def test_stdin_diff_puts_only_the_diff_on_stdout(project, monkeypatch, capsysbinary):
    feed_stdin(monkeypatch, TORCH_SCRIPT)
    assert main(["--diff", "--stdin-filename", "train.py", "-"]) == 1
    out, err = capsysbinary.readouterr()
    assert out.decode() == "--- train.py\n+++ train.py\n" + DIFF_HUNKS
    assert err.decode().splitlines() == [*torch_script_report("train.py"), TORCH_SCRIPT_SUMMARY]


def test_stdin_check_prints_nothing_on_stdout(project, monkeypatch, capsysbinary):
    feed_stdin(monkeypatch, TORCH_SCRIPT)
    assert main(["--check", "-"]) == 1
    out, err = capsysbinary.readouterr()
    assert out == b""
    assert err.decode().splitlines()[-1] == TORCH_SCRIPT_SUMMARY


def test_stdin_check_may_put_a_json_report_on_stdout(project, monkeypatch, capsysbinary):
    feed_stdin(monkeypatch, TORCH_SCRIPT)
    assert main(["--check", "--report", "json", "--stdin-filename", "t.py", "-"]) == 1
    report = json.loads(capsysbinary.readouterr().out)
    assert report["files"] == [{"path": "t.py", "framework": "torch", "changed": True, "left_alone": None,
                                "failure": None}]


def test_stdin_that_does_not_parse_exits_2_and_is_echoed(project, monkeypatch, capsysbinary):
    feed_stdin(monkeypatch, BROKEN_TORCH)
    assert main(["--stdin-filename", "broken.py", "-"]) == 2
    out, err = capsysbinary.readouterr()
    assert out == BROKEN_TORCH
    assert err.decode().startswith("broken.py:3:1: error: does not parse: ")


def test_stdin_filename_finds_the_config_from_its_own_folder(tmp_path, monkeypatch, capsysbinary):
    write(tmp_path / "proj" / "pyproject.toml", '[tool.dpmigrate]\nbatch = "global"\nexclude = ["vendored/"]\n')
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # an editor's working folder is not the project
    feed_stdin(monkeypatch, TORCH_SCRIPT)
    assert main(["--stdin-filename", str(tmp_path / "proj" / "train.py"), "-"]) == 1
    assert capsysbinary.readouterr().out == edited(CONVERTED_SCRIPT, GLOBAL_BATCH)
    feed_stdin(monkeypatch, TORCH_SCRIPT)
    assert main(["--force-exclude", "--stdin-filename", str(tmp_path / "proj" / "vendored" / "t.py"), "-"]) == 0
    out, err = capsysbinary.readouterr()
    assert out == TORCH_SCRIPT  # excluded: echoed untouched
    assert err.decode() == "0 files, 0 changed, 0 changes, 0 declined, 0 errors\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["-o", "out", "-"], "with `-` the converted script goes to stdout; -o/--output-dir writes files: drop one"),
    (["-", "train.py"], "`-` reads one script from stdin; it cannot be combined with other paths (- train.py)"),
    (["--stdin-filename", "t.py", "train.py"],
     "--stdin-filename names the script read from stdin: add `-` as the PATH"),
    (["--report", "sarif", "-"], "with `-` the converted script and --report sarif would both go to stdout: "
                                 "add --report-file FILE"),
])
def test_stdin_usage_errors(project, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"dpmigrate: error: {message}"


def run_dpmigrate(args: list[str], stdin: bytes, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpmigrate", *args], input=stdin, capture_output=True, cwd=cwd,
                          timeout=120)


def test_stdin_through_a_real_pipe_keeps_bom_and_crlf(project):
    source = b"\xef\xbb\xbf" + TORCH_SCRIPT.replace(b"\n", b"\r\n")
    proc = run_dpmigrate(["--stdin-filename", "train.py", "-"], source, project)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == b"\xef\xbb\xbf" + CONVERTED_SCRIPT.replace(b"\n", b"\r\n")
    assert proc.stderr.decode().splitlines() == [*torch_script_report("train.py"), TORCH_SCRIPT_SUMMARY]


def test_stdin_diff_and_echo_through_a_real_pipe(project):
    diff = run_dpmigrate(["--diff", "--color", "always", "-"], TORCH_SCRIPT, project)
    assert diff.returncode == 1, diff.stderr
    assert diff.stdout.decode().splitlines()[:2] == ["\033[1m--- -\033[0m", "\033[1m+++ -\033[0m"]
    echo = run_dpmigrate(["-"], PLAIN_SCRIPT, project)
    assert (echo.returncode, echo.stdout, echo.stderr) == (0, PLAIN_SCRIPT, f"{UNCHANGED_SUMMARY}\n".encode())
