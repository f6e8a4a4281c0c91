"""``dpmigrate verify DIR/`` and ``dpmigrate verify --from LIST``: verify many scripts with the same options.

Each script's verify is a subprocess (``python -m dpmigrate verify SCRIPT ... --report json``), not a call: a
script that hangs, crashes its interpreter or fills memory takes only its own verify down, and its time limit
(``--script-timeout``) can stop it whole. It starts in the script's own folder, as its author runs it, so its
relative paths (``data/``, ``../configs``) mean what they mean there. Up to ``-j N`` run at once.

A verify starts its runs in process groups of their own, which a signal to the verify's group does not reach: so
a verify is stopped with SIGINT first (it then stops its runs and removes its temporary folder), and what is left
after :data:`GRACE_S` (the verify and every process it had started, found through ``/proc``) is killed.

LIST holds one script a line, ``[NAME=VALUE ...] [--cwd DIR] SCRIPT [ARGS ...]`` split as a shell would
(:mod:`shlex`): the leading assignments are extra environment variables of that script's verify; ``--cwd DIR`` starts
it in DIR instead of the script's folder (a script its author runs from the repository's root, or from a folder
above it, reads its data and imports its modules relative to there); a relative SCRIPT or DIR is relative to LIST's
folder; blank lines and lines starting with ``#`` are skipped. A line that names no existing script is an
"error" row of the table, not the end of the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..run.stopping import Interrupted, interruptible
from .report import EXIT_CODES, Outcome, render_json, worst
from .table import counts, progress_line, render_table

SCHEMA = "dpmigrate-verify-many/1"
SKIPPED_NAMES = ("__init__.py", "setup.py", "conftest.py")  # and test_*.py: not training scripts
GRACE_S = 10.0  # a verify stopped with SIGINT has this long to stop its runs before everything left is killed
POLL_S = 0.2
STDERR_LINES = 15
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)


class UsageError(Exception):
    """Nothing to verify at all (an empty folder, a LIST that cannot be read): exit 2 with this message."""


@dataclasses.dataclass
class Entry:
    """One script to verify, as the folder or a LIST line gives it."""

    script: Path  # absolute
    args: list[str] = dataclasses.field(default_factory=list)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    problem: str = ""  # why it cannot even start (no such script, a line shlex cannot split): an "error" row
    cwd: Path | None = None  # where its verify starts (absolute); None: the script's folder


def scripts_in(folder: Path) -> list[Entry]:
    """The training scripts directly in ``folder``, sorted: every ``*.py`` but packaging and test files."""
    scripts = sorted(p for p in folder.iterdir() if p.suffix == ".py" and p.is_file()
                     and p.name not in SKIPPED_NAMES and not p.name.startswith("test_"))
    if not scripts:
        raise UsageError(f"{folder}: no script to verify in it (the *.py files directly inside, but "
                         f"{', '.join(SKIPPED_NAMES)} and test_*.py); give the folder that holds the training "
                         "scripts, or list them in a file for --from")
    return [Entry(p.resolve()) for p in scripts]


def read_list(text: str, base: Path, name: str) -> list[Entry]:
    """The scripts of a LIST (see the module's docstring); ``base`` resolves relative scripts, ``name`` says where
    a faulty line is."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"line {number} of {name}"
        try:
            words = shlex.split(line)
        except ValueError as e:  # an unclosed quote
            entries.append(Entry(base / f"({where})", problem=f"{where}: cannot split it as a shell would ({e}): "
                                 f"close the quote in: {line.strip()}"))
            continue
        env = {}
        while words and _ASSIGNMENT.fullmatch(words[0]):
            variable, value = words.pop(0).split("=", 1)
            env[variable] = value
        if not words:
            entries.append(Entry(base / f"({where})", env=env, problem=f"{where} sets {', '.join(env)} but names no "
                                 "script: write the script after the NAME=VALUE assignments (and --cwd DIR)"))
            continue
        cwd, problem = None, ""
        if words[0] == "--cwd" or words[0].startswith("--cwd="):
            flag = words.pop(0)  # "--cwd=" names no folder: the next word is the script, not a folder
            given = flag.partition("=")[2] if "=" in flag else (words.pop(0) if words else "")
            cwd = _resolved(given, base) if given else None
            if cwd is None or not cwd.is_dir():
                problem = (f"{where}: --cwd {given or '(nothing)'}: no such folder" + (f" (looked for {cwd})" if cwd else "")
                           + f"; a relative folder is taken from the list's folder, {base}")
        if not words:
            entries.append(Entry(base / f"({where})", env=env, problem=problem or f"{where} names no script after "
                                 "--cwd: write [NAME=VALUE ...] [--cwd DIR] SCRIPT [ARGS ...]"))
            continue
        script = _resolved(words[0], base)
        if not problem and not script.is_file():
            problem = (f"{words[0]}: no such script ({where}, looked for {script}); a relative path is taken from the "
                       f"list's folder, {base}")
        entries.append(Entry(script, words[1:], env, problem, cwd))
    return entries


def _resolved(given: str, base: Path) -> Path:
    path = Path(os.path.expanduser(given))
    return (path if path.is_absolute() else base / path).resolve()


def load_list(name: str) -> list[Entry]:
    """The scripts of the LIST file ``name`` (``-``: standard input, relative scripts from the current folder)."""
    if name == "-":
        text, base, said = sys.stdin.read(), Path.cwd(), "standard input"
    else:
        path = Path(name)
        try:
            text = path.read_text()
        except OSError as e:
            raise UsageError(f"--from {name}: cannot read it ({e.strerror or e}); give a text file with one script a "
                             "line: [NAME=VALUE ...] [--cwd DIR] SCRIPT [ARGS ...]") from None
        base, said = path.resolve().parent, name
    entries = read_list(text, base, said)
    if not entries:
        raise UsageError(f"--from {name}: no script in it (only blank lines and # comments); write one script a "
                         "line: [NAME=VALUE ...] [--cwd DIR] SCRIPT [ARGS ...]")
    return entries


def shared_options(args: argparse.Namespace) -> list[str]:
    """The options every script's verify gets: the ones given to this command (``--steps`` already a number)."""
    options = ["-n", str(args.nproc), "--steps", "all" if args.steps == 0 else str(args.steps),
               "--tolerance", repr(args.tolerance), "--framework", args.framework, "--timeout", repr(args.timeout),
               "--to-end", repr(args.to_end), "--batch", args.batch]
    return options + ["--sync-batchnorm"] * bool(args.sync_batchnorm) + ["--keep"] * bool(args.keep) + [
        "--no-shares-pass"] * bool(args.no_shares_pass)


class Runner:
    """Runs the entries' verifies, ``jobs`` at a time, and keeps a row per script that has ended."""

    def __init__(self, entries: list[Entry], options: list[str], jobs: int, script_timeout: float, work: Path,
                 args: argparse.Namespace):
        self.entries, self.options, self.jobs, self.script_timeout, self.work = entries, options, jobs, script_timeout, work
        self.args = args
        self.rows: dict[int, dict] = {}
        self.running: dict[int, tuple[subprocess.Popen, float]] = {}  # entry index -> (process, start time)

    def run(self) -> None:
        waiting = list(range(len(self.entries)))
        while waiting or self.running:
            while waiting and len(self.running) < self.jobs:
                self._start(waiting.pop(0))
            for index, (process, started) in list(self.running.items()):
                if process.poll() is not None:
                    del self.running[index]
                    self._ended(index, process.returncode, time.monotonic() - started)
                elif time.monotonic() - started > self.script_timeout:
                    said = self._tail(index)  # before the stop adds its traceback of KeyboardInterrupt
                    stop([process])
                    del self.running[index]
                    self._done(index, self._error(index, f"verify did not finish within {self.script_timeout:g} s "
                                                  "(--script-timeout): it was stopped", said), time.monotonic() - started)
            if self.running:
                time.sleep(POLL_S)

    def _start(self, index: int) -> None:
        entry = self.entries[index]
        if entry.problem:
            self._done(index, self._error(index, entry.problem), 0.0)
            return
        argv = [sys.executable, "-m", "dpmigrate", "verify", str(entry.script), *self.options, "--report", "json",
                "--report-file", str(self.work / f"{index}.json"), "--", *entry.args]
        with open(self.work / f"{index}.log", "wb") as log:
            process = subprocess.Popen(argv, cwd=entry.cwd or entry.script.parent, env={**os.environ, **entry.env},
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.running[index] = (process, time.monotonic())

    def _ended(self, index: int, returncode: int, seconds: float) -> None:
        try:
            row = json.loads((self.work / f"{index}.json").read_text())
        except (OSError, ValueError):
            row = None
        if not (isinstance(row, dict) and {"verdict", "headline", "framework"} <= row.keys()):
            row = self._error(index, f"verify ended (exit code {returncode}) without a report; its last lines show why",
                              self._tail(index))
            self._done(index, row, seconds, show_details=True)  # (a crash of verify itself: shown nowhere else)
            return
        self._done(index, row, seconds)

    def _done(self, index: int, row: dict, seconds: float, show_details: bool = False) -> None:
        entry = self.entries[index]
        if row["framework"] == "auto":  # a verify that could not tell it (a script that does not parse)
            row["framework"] = "unknown"
        row.update(args=entry.args, env=entry.env, seconds=round(seconds, 1))
        self.rows[index] = row
        print(progress_line(len(self.rows), len(self.entries), row), file=sys.stderr, flush=True)
        for line in row["details"] if show_details else ():
            print(f"  | {line}", file=sys.stderr, flush=True)

    def _error(self, index: int, reason: str, details: list[str] | None = None) -> dict:
        """The row of a script whose verify gave no report: the report it would have written, verdict "error"."""
        a = self.args
        outcome = Outcome(str(self.entries[index].script), _framework(self.entries[index].script, a.framework),
                          a.nproc, a.steps, a.tolerance, "error", f"could not run: {reason}", details=details or [])
        return json.loads(render_json(outcome))

    def _tail(self, index: int) -> list[str]:
        try:
            return (self.work / f"{index}.log").read_text(errors="replace").splitlines()[-STDERR_LINES:]
        except OSError:
            return []


def _framework(script: Path, given: str) -> str:
    """The framework of a script whose verify said nothing: as given, else from its imports, else "unknown"."""
    if given != "auto":
        return given
    from ..launch.cli import UsageError as NotDetected
    from ..launch.cli import detect_framework

    try:
        return detect_framework(script)
    except (NotDetected, OSError):
        return "unknown"


def stop(processes: list[subprocess.Popen]) -> None:
    """Stop verifies and everything they started: SIGINT to each one's group (a verify then stops its runs, which
    sit in groups of their own), and after :data:`GRACE_S` SIGKILL to every group of what is left."""
    members = {}
    for process in processes:
        members.update(_tree(process.pid))
        _signal_group(process.pid, signal.SIGINT)
    deadline = time.monotonic() + GRACE_S
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            members.update(_tree(process.pid))  # started since (a launcher's workers)
    for pid, (group, started) in members.items():
        if _tree(pid).get(pid) == (group, started):  # still that process (not a new one given its number)
            _signal_group(group, signal.SIGKILL)
    for process in processes:
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tree(pid: int) -> dict[int, tuple[int, str]]:
    """``pid`` and its descendants, each with its process group and start time, from ``/proc`` (none elsewhere)."""
    parents: dict[int, list[int]] = {}
    facts: dict[int, tuple[int, str]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(name))
        facts[int(name)] = (int(fields[2]), fields[19])  # process group, start time
    found, todo = {}, [pid]
    while todo:
        current = todo.pop()
        if current in facts and current not in found:
            found[current] = facts[current]
            todo.extend(parents.get(current, []))
    return found


def main(parser: argparse.ArgumentParser, args: argparse.Namespace, script_args: list[str]) -> int:
    """``dpmigrate verify DIR/`` or ``--from LIST`` (options already checked by :func:`.cli.main`)."""
    if args.against:
        parser.error("--against checks one converted script: not with a folder or --from")
    if args.script and args.from_list:
        parser.error(f"give a folder ({args.script}) or --from {args.from_list}, not both")
    if args.from_list and script_args:
        parser.error("with --from, write each script's arguments on its line of the list, not after --")
    if args.jobs < 1:
        parser.error(f"-j {args.jobs}: give the number of scripts to verify at once (1 or more)")
    script_timeout = 2 * args.timeout + 120 if args.script_timeout is None else args.script_timeout
    if not script_timeout > 0:
        parser.error(f"--script-timeout {script_timeout:g}: give a positive number of seconds")
    try:
        entries = load_list(args.from_list) if args.from_list else scripts_in(Path(args.script))
    except UsageError as e:
        parser.error(str(e))
    for entry in entries if not args.from_list else ():
        entry.args = list(script_args)  # a folder's scripts share the arguments after --
    work = Path(tempfile.mkdtemp(prefix="dpmigrate-verify-many-"))  # 0700, random name
    runner = Runner(entries, shared_options(args), args.jobs, script_timeout, work, args)
    stopped = None
    try:
        with interruptible():
            try:
                runner.run()
            except Interrupted as e:
                stopped = e
                stop([process for process, _ in runner.running.values()])
        return _report(args, [runner.rows[i] for i in sorted(runner.rows)], len(entries), stopped)
    finally:
        if args.keep:
            print(f"dpmigrate verify: each script's report and output kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _report(args: argparse.Namespace, rows: list[dict], total: int, stopped: Interrupted | None) -> int:
    bad = worst(row["verdict"] for row in rows)
    table = render_table(rows)
    sys.stderr.write(table)
    if stopped:
        print(f"dpmigrate verify: stopped by {stopped.name} after {len(rows)} of {total} scripts; the table shows "
              "those that had ended", file=sys.stderr, flush=True)
    if args.report == "json":
        text = json.dumps({"schema": SCHEMA, "scripts": rows, "counts": counts(rows), "worst": bad,
                           "exit_code": EXIT_CODES[bad]}, indent=2) + "\n"
    else:
        text = table
    if args.report_file:
        Path(args.report_file).write_text(text)
    elif args.report == "json":
        sys.stdout.write(text)
    return stopped.code if stopped else EXIT_CODES[bad]
