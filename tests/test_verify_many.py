"""``dpmigrate verify DIR/`` and ``dpmigrate verify --from LIST``: many scripts, one verify subprocess each.

The slow tests run the real command on tiny scripts written here: a torch script that trains an ``nn.Linear`` with
SGD over a DataLoader (verify proves it equivalent), a file that does not parse ("error"), one that imports torch but
never steps an optimizer, and one that sleeps (the per-script time limit, Ctrl-C). The fast ones check the LIST
parser, the folder's choice of scripts and the table, without starting a verify.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dpmigrate.verify.cli import main
from dpmigrate.verify.many import UsageError, read_list, scripts_in
from dpmigrate.verify.table import counts, progress_line, reason, render_table

TRAINS = textwrap.dedent("""\
    import argparse
    import os

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    ask = argparse.ArgumentParser()
    ask.add_argument("--batch-size", type=int, default=16)
    args = ask.parse_args()
    torch.manual_seed(0)
    outputs = int(os.environ.get("TOY_OUTPUTS", "2"))
    samples = int(open("rows.txt").read()) if os.path.exists("rows.txt") else 64
    inputs, targets = torch.randn(samples, 4), torch.randn(samples, outputs)
    model = nn.Linear(4, outputs)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(TensorDataset(inputs, targets), batch_size=args.batch_size):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    """)
READS_ROWS = TRAINS.replace('if os.path.exists("rows.txt") else 64', "")  # fails unless started in its folder
BROKEN = "def train(:\n    pass\n"
NEVER_STEPS = "import torch\n\nprint(torch.zeros(3).sum())\n"
SLEEPS = textwrap.dedent("""\
    import os
    import time

    import torch

    with open(os.environ["TOY_PID_FILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
    """)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _dpmigrate(cwd: Path, *argv: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "dpmigrate", "verify", "--to-end", "0", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _gone(pid: int, within: float = 10.0) -> bool:
    """The process ended (a zombie not yet reaped by whoever adopted it counts as ended)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    return True
        except FileNotFoundError:
            return True
        except OSError:  # no /proc: ask the kernel
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
        time.sleep(0.2)
    return False


# ---- slow: real verifies ----


@pytest.mark.slow
def test_a_folder_is_verified_script_by_script_two_at_a_time(tmp_path):
    folder = tmp_path / "scripts"
    _write(folder / "good.py", TRAINS)
    _write(folder / "broken.py", BROKEN)
    _write(folder / "nostep.py", NEVER_STEPS)
    for skipped in ("__init__.py", "setup.py", "conftest.py", "test_good.py", "deeper/good.py"):
        _write(folder / skipped, TRAINS)
    done = _dpmigrate(tmp_path, "scripts/", "-j", "2", "--report", "json", "--report-file", "many.json",
                      "--", "--batch-size", "8")
    document = json.loads((tmp_path / "many.json").read_text())
    assert document["schema"] == "dpmigrate-verify-many/1"
    scripts = {Path(s["script"]).name: s for s in document["scripts"]}
    assert [Path(s["script"]) for s in document["scripts"]] == [folder / "broken.py", folder / "good.py",
                                                                folder / "nostep.py"]
    good, broken, nostep = scripts["good.py"], scripts["broken.py"], scripts["nostep.py"]
    assert good["verdict"] == "equivalent", good
    assert good["comparison"]["data"]["sizes"] == [8, [4, 4]]  # the arguments after -- reached it
    assert good["args"] == ["--batch-size", "8"] and good["env"] == {} and good["seconds"] > 0
    assert broken["verdict"] == "error" and "SyntaxError" in broken["headline"], broken
    assert broken["framework"] == "unknown"
    assert nostep["verdict"] == "inconclusive", nostep
    assert document["counts"] == {"torch": {"equivalent": 1, "inconclusive": 1}, "unknown": {"error": 1}}
    assert document["worst"] == "error" and document["exit_code"] == 2  # could not run is worse than inconclusive
    assert done.returncode == 2, done.stderr
    # progress as each ends, then the table: one row per script, the counts, the total
    assert [line[:5] for line in done.stderr.splitlines() if line.startswith("[")] == ["[1/3]", "[2/3]", "[3/3]"]
    assert "scripts/good.py  equivalent  (max |dw| " in done.stderr
    rows = [line for line in done.stderr.splitlines() if line.startswith("  scripts/")]
    assert [row.split()[:2] for row in rows] == [["scripts/broken.py", "unknown"], ["scripts/good.py", "torch"],
                                                 ["scripts/nostep.py", "torch"]]
    assert " error " in rows[0] and " equivalent " in rows[1] and f" {nostep['verdict']} " in rows[2]
    assert "unknown: 1 error\n" in done.stderr
    assert "total: 3 scripts: 1 equivalent, " in done.stderr and "; worst error (exit 2)\n" in done.stderr


@pytest.mark.slow
def test_a_list_gives_each_script_its_environment_and_arguments_and_runs_it_in_its_folder(tmp_path):
    _write(tmp_path / "project" / "reader.py", READS_ROWS)  # reads rows.txt from the folder it is started in
    _write(tmp_path / "project" / "rows.txt", "48")
    _write(tmp_path / "project" / "scripts" / "nested.py", READS_ROWS)  # run from project/, as its author does
    _write(tmp_path / "lists" / "verify.txt", textwrap.dedent("""\
        # the reader with 3 outputs (TOY_OUTPUTS) and batches of 12
        TOY_OUTPUTS=3 ../project/reader.py --batch-size 12

        ../project/missing.py --batch-size 8
        --cwd ../project ../project/scripts/nested.py --batch-size 8
        """))
    done = _dpmigrate(tmp_path, "--from", "lists/verify.txt", "--report", "json")
    document = json.loads(done.stdout)
    reader, missing, nested = document["scripts"]
    # started in --cwd's folder, it finds rows.txt there (48 rows: 6 steps of 8); in its own folder it would fail
    assert nested["verdict"] == "equivalent" and nested["comparison"]["data"]["sizes"] == [8, [4, 4]], nested
    assert reader["verdict"] == "equivalent", reader
    assert reader["comparison"]["values"] == 4 * 3 + 3  # TOY_OUTPUTS=3: a Linear(4, 3), weight and bias
    assert reader["comparison"]["data"]["sizes"] == [12, [6, 6]]  # --batch-size 12
    assert reader["comparison"]["steps"] == 3
    assert reader["env"] == {"TOY_OUTPUTS": "3"} and reader["args"] == ["--batch-size", "12"]
    assert missing["verdict"] == "error" and missing["script"] == str(tmp_path / "project" / "missing.py")
    assert missing["headline"].startswith("could not run: ../project/missing.py: no such script (line 4 of "
                                          "lists/verify.txt"), missing
    assert document["counts"] == {"torch": {"equivalent": 2}, "unknown": {"error": 1}}
    assert document["worst"] == "error" and document["exit_code"] == 2 and done.returncode == 2


@pytest.mark.slow
def test_a_script_past_its_time_limit_is_killed_with_its_runs_and_the_others_still_report(tmp_path):
    pid_file = tmp_path / "sleeper.pid"
    _write(tmp_path / "sleeps.py", SLEEPS)
    _write(tmp_path / "broken.py", BROKEN)  # ends at once whatever the load (a real run could pass the short limit)
    _write(tmp_path / "list.txt", f"TOY_PID_FILE={pid_file} sleeps.py\nbroken.py\n")
    started = time.monotonic()
    done = _dpmigrate(tmp_path, "--from", "list.txt", "-j", "2", "--script-timeout", "40", "--report", "json",
                      "--report-file", "many.json")
    took = time.monotonic() - started
    document = json.loads((tmp_path / "many.json").read_text())
    sleeps, broken = document["scripts"]
    assert sleeps["verdict"] == "error" and sleeps["framework"] == "torch"
    assert sleeps["headline"] == "could not run: verify did not finish within 40 s (--script-timeout): it was stopped"
    assert 40 <= sleeps["seconds"] < 60, sleeps["seconds"]
    assert broken["verdict"] == "error" and "SyntaxError" in broken["headline"], broken
    assert took < 100, took  # not the sleeper's 600 s, nor verify's own --timeout
    assert pid_file.exists(), "the sleeping script never started: raise --script-timeout on a slow machine"
    assert _gone(int(pid_file.read_text())), "the timed-out script's process is still running"
    assert [line[:5] for line in done.stderr.splitlines() if line.startswith("[")] == ["[1/2]", "[2/2]"]
    assert "[2/2] sleeps.py  error  (verify did not finish within 40 s" in done.stderr
    assert done.returncode == 2 and document["exit_code"] == 2


@pytest.mark.slow
def test_ctrl_c_stops_the_running_verifies_and_prints_the_table_of_those_finished(tmp_path):
    pid_file = tmp_path / "sleeper.pid"
    _write(tmp_path / "sleeps.py", SLEEPS)
    _write(tmp_path / "broken.py", BROKEN)
    _write(tmp_path / "list.txt", f"TOY_PID_FILE={pid_file} sleeps.py\nbroken.py\n")
    err = tmp_path / "stderr.txt"
    with open(err, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "dpmigrate", "verify", "--from", "list.txt", "-j", "2",
                                    "--to-end", "0"],
                                   cwd=tmp_path, stderr=out, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and "[1/2]" in err.read_text()) and time.monotonic() < deadline:
        assert process.poll() is None, err.read_text()
        time.sleep(0.2)
    assert pid_file.exists(), err.read_text()
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=40) == 130, err.read_text()
    text = err.read_text()
    assert "[1/2] broken.py  error  (" in text
    assert "stopped by SIGINT after 1 of 2 scripts" in text
    assert "total: 1 script: 1 error; worst error (exit 2)\n" in text
    assert _gone(int(pid_file.read_text())), "the interrupted script's process is still running"


# ---- fast: no verify started ----


def test_a_list_line_is_environment_script_and_arguments(tmp_path):
    _write(tmp_path / "a" / "train.py", "")
    _write(tmp_path / "b.py", "")
    text = textwrap.dedent(f"""\
        # a comment, then a blank line

        LR=0.1 DATA="my data" a/train.py --epochs 2 "--name=two words"
          b.py
        {tmp_path / "b.py"} --tag=a#b
        X=1 missing.py
        ONLY=1
        b.py --note "unclosed
        """)
    entries = read_list(text, tmp_path, "jobs.txt")
    assert [(e.script, e.args, e.env, e.problem) for e in entries[:3]] == [
        (tmp_path / "a" / "train.py", ["--epochs", "2", "--name=two words"], {"LR": "0.1", "DATA": "my data"}, ""),
        (tmp_path / "b.py", [], {}, ""),
        (tmp_path / "b.py", ["--tag=a#b"], {}, ""),
    ]
    missing, only, unclosed = entries[3:]
    assert missing.script == tmp_path / "missing.py" and missing.env == {"X": "1"}
    assert missing.problem == (f"missing.py: no such script (line 6 of jobs.txt, looked for {tmp_path / 'missing.py'}); "
                               f"a relative path is taken from the list's folder, {tmp_path}")
    assert only.problem == ("line 7 of jobs.txt sets ONLY but names no script: write the script after the NAME=VALUE "
                            "assignments (and --cwd DIR)")
    assert unclosed.problem.startswith("line 8 of jobs.txt: cannot split it as a shell would (No closing quotation)")


def test_a_list_line_may_say_which_folder_its_verify_starts_in(tmp_path):
    _write(tmp_path / "repo" / "tools" / "train.py", "")
    text = textwrap.dedent("""\
        --cwd repo repo/tools/train.py --epochs 1
        SEED=3 --cwd=repo/tools train.py
        --cwd nowhere repo/tools/train.py
        --cwd
        --cwd= repo/tools/train.py
        """)
    given, joined, nowhere, empty, blank = read_list(text, tmp_path, "jobs.txt")
    assert (given.cwd, given.script, given.args, given.problem) == (tmp_path / "repo", tmp_path / "repo" / "tools" /
                                                                     "train.py", ["--epochs", "1"], "")
    # a relative script stays relative to the list's folder, not to --cwd
    assert joined.cwd == tmp_path / "repo" / "tools" and joined.env == {"SEED": "3"}
    assert joined.problem.startswith("train.py: no such script (line 2 of jobs.txt")
    assert nowhere.problem == (f"line 3 of jobs.txt: --cwd nowhere: no such folder (looked for {tmp_path / 'nowhere'}); "
                               f"a relative folder is taken from the list's folder, {tmp_path}")
    assert empty.problem.startswith("line 4 of jobs.txt: --cwd (nothing): no such folder")
    # "--cwd=" with nothing after "=" names no folder: the script that follows stays the script, and the row says so
    assert blank.script == tmp_path / "repo" / "tools" / "train.py"
    assert blank.problem.startswith("line 5 of jobs.txt: --cwd (nothing): no such folder")
    assert read_list("a.py\n", tmp_path, "x").pop().cwd is None  # the script's own folder, as before


def test_a_folder_gives_its_own_scripts_sorted_but_packaging_and_tests(tmp_path):
    for name in ("b.py", "a.py", "__init__.py", "setup.py", "conftest.py", "test_a.py", "notes.txt", "sub/c.py"):
        _write(tmp_path / name, "")
    assert [e.script for e in scripts_in(tmp_path)] == [tmp_path / "a.py", tmp_path / "b.py"]
    _write(tmp_path / "tests_only" / "test_a.py", "")
    with pytest.raises(UsageError, match="no script to verify in it"):
        scripts_in(tmp_path / "tests_only")


ROWS = [
    {"script": "jobs/a.py", "framework": "torch", "verdict": "equivalent", "seconds": 14.2,
     "headline": "equivalent: max |dw| 2.1e-07 after 3 steps (tolerance 1e-05)"},
    {"script": "jobs/keras_model.py", "framework": "tensorflow", "verdict": "diverges", "seconds": 101.0,
     "headline": "diverges after step 1: dense/kernel differs by 0.0046 (tolerance 1e-05); 2 of 2 parameters differ"},
    {"script": "jobs/b.py", "framework": "torch", "verdict": "error", "seconds": 0.5,
     "headline": "could not run: the original failed (exit code 1)"},
    {"script": "jobs/c.py", "framework": "torch", "verdict": "equivalent", "seconds": 9.0,
     "headline": "equivalent: max |dw| 0.0e+00 after 3 steps (tolerance 1e-05)"},
]


def test_the_table_has_a_row_per_script_then_counts_per_framework_then_totals():
    assert render_table(ROWS) == (
        "dpmigrate verify: 4 scripts\n"
        "  script               framework   verdict     seconds  headline\n"
        "  jobs/a.py            torch       equivalent     14.2  max |dw| 2.1e-07 after 3 steps (tolerance 1e-05)\n"
        "  jobs/keras_model.py  tensorflow  diverges      101.0  dense/kernel differs by 0.0046 (tolerance 1e-05); "
        "2 of 2 parameters differ\n"
        "  jobs/b.py            torch       error           0.5  the original failed (exit code 1)\n"
        "  jobs/c.py            torch       equivalent      9.0  max |dw| 0.0e+00 after 3 steps (tolerance 1e-05)\n"
        "tensorflow: 1 diverges\n"
        "torch: 2 equivalent, 1 error\n"
        "total: 4 scripts: 2 equivalent, 1 error, 1 diverges; worst diverges (exit 1)\n")
    assert counts(ROWS) == {"tensorflow": {"diverges": 1}, "torch": {"equivalent": 2, "error": 1}}
    assert render_table([]) == ("dpmigrate verify: 0 scripts\n  script  framework  verdict  seconds  headline\n"
                                "total: 0 scripts; worst equivalent (exit 0)\n")


def test_a_progress_line_gives_the_verdict_and_the_headline_after_its_colon():
    assert progress_line(3, 20, ROWS[0]) == ("[3/20] jobs/a.py  equivalent  (max |dw| 2.1e-07 after 3 steps "
                                             "(tolerance 1e-05), 14.2 s)")
    long = "could not run: " + "x" * 150
    assert reason(long) == "x" * 97 + "..."
    assert reason("inconclusive: the data split was not observed") == "the data split was not observed"


def test_usage_errors_exit_2_with_the_fix(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    _write(tmp_path / "train.py", TRAINS)
    for argv, said in (
        ([str(tmp_path / "empty")], "no script to verify in it"),
        (["--from", str(tmp_path / "nowhere.txt")], "cannot read it (No such file or directory)"),
        (["--from", str(_write(tmp_path / "blank.txt", "# nothing\n\n"))], "no script in it"),
        ([str(tmp_path / "train.py"), "-j", "2"], "-j and --script-timeout go with a folder of scripts or --from"),
        ([str(tmp_path), "-j", "0"], "-j 0: give the number of scripts to verify at once"),
        ([], "give the training SCRIPT, a folder of scripts, or --from LIST"),
    ):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2, argv
        assert said in capsys.readouterr().err, argv


def test_a_list_on_standard_input_whose_script_is_missing_is_an_error_row_not_a_crash(tmp_path):
    done = subprocess.run([sys.executable, "-m", "dpmigrate", "verify", "--from", "-", "--report", "json"], cwd=tmp_path,
                          input="gone.py --epochs 1\n", capture_output=True, text=True, timeout=120)
    document = json.loads(done.stdout)
    assert done.returncode == 2, done.stderr
    assert [(s["verdict"], s["args"], s["seconds"]) for s in document["scripts"]] == [("error", ["--epochs", "1"], 0.0)]
    assert document["scripts"][0]["headline"].startswith("could not run: gone.py: no such script (line 1 of standard input")
    assert document["counts"] == {"unknown": {"error": 1}} and document["worst"] == "error"
    assert "[1/1] gone.py  error  (gone.py: no such script" in done.stderr


def test_a_verify_that_dies_without_a_report_is_an_error_with_its_last_lines(tmp_path):
    _write(tmp_path / "train.py", NEVER_STEPS)
    # a Python that cannot find its standard library dies before verify starts: a real crash, no report
    _write(tmp_path / "list.txt", "PYTHONHOME=/nowhere/at/all train.py\n")
    done = subprocess.run([sys.executable, "-m", "dpmigrate", "verify", "--from", "list.txt", "--report", "json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    (row,) = json.loads(done.stdout)["scripts"]
    assert row["verdict"] == "error" and row["framework"] == "torch" and row["env"] == {"PYTHONHOME": "/nowhere/at/all"}
    assert row["headline"].startswith("could not run: verify ended (exit code 1) without a report"), row
    assert any("/nowhere/at/all" in line for line in row["details"]), row["details"]
    assert "\n  | " in done.stderr and done.returncode == 2
