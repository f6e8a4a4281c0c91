"""The two runs ``dpmigrate verify`` compares: where they run, with what environment, and how they ended.

Both run under the harness (:mod:`dpmigrate.verify.harness`), each in a private scratch folder of its own
as working directory, so neither sees the other's outputs (a checkpoint the first run wrote is not
resumed by the second) and none of the user's folders gets new files. The scratch folder links to every
entry of the folder ``dpmigrate verify`` was started in, and sits in one that links to every entry of that
folder's parent, so relative paths to data keep working (``data/``, ``../data/``).

- the original: ``python SCRIPT ARGS``, a copy placed in the private folder as the conversion is, with no launcher
  in its environment;
- the conversion: ``python -m dpmigrate.launch -n N CONVERTED ARGS`` (the real launcher of its framework).

A converted copy lives in the private folder; :func:`place_beside` links the rest of the script's own
folder next to it, so its imports of unconverted local modules and its paths relative to ``__file__``
resolve as the original's do.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .harness import core
from .harness.batch_scale import ENV as ENV_BATCH_SCALE

BOOT = Path(__file__).parent / "boot"
_HASH_SEED = str(secrets.randbelow(2**32))  # one per verify: the original and the conversion hash strings alike
_LAUNCHER_PREFIXES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_", "PADDLE_",
                      "TF_CONFIG", "SLURM_", "OMPI_", "PMI_", "DPMIGRATE_RENDEZVOUS", "DPMIGRATE_VERIFY_")
TAIL_LINES = 25
_RANK_ERROR = re.compile(r"^\[rank(\d+)\]!? ((?:[A-Za-z_][\w.]*\.)?\w*(?:Error|Exception|Interrupt|Exit)(?::.*)?)$", re.M)


@dataclasses.dataclass
class Run:
    """How one run ended."""

    returncode: int | None  # None: stopped after the time limit
    seconds: float
    log: Path

    def tail(self, lines: int = TAIL_LINES) -> list[str]:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]

    def rank_errors(self) -> list[str]:
        """Each rank's last Python exception line, in rank order (``rank 1: RuntimeError: ...``): the launched job's
        log interleaves the ranks, and its tail showed rank 0's timeout waiting for a rank whose own error had
        scrolled away (a skip-gram notebook of issue 19's round O)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        last: dict[int, str] = {}
        for match in _RANK_ERROR.finditer(text):
            last[int(match.group(1))] = match.group(2).strip()
        return [f"rank {rank}: {line}" for rank, line in sorted(last.items())]


def environment(out: Path, script: Path, steps: int, framework: str, to_end_s: float = 0.0,
                shuffled: bool = False, batch_scale: int = 1) -> dict[str, str]:
    """The run's environment: the user's, without any launcher's variables, plus the harness's (``to_end_s``: how
    long the run goes on past step K, unrecorded; ``shuffled``: the script's shuffling left on)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    path = [str(BOOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    env.update({
        "PYTHONPATH": os.pathsep.join(path), core.ENV_OUT: str(out), core.ENV_SCRIPT: str(script.resolve()),
        core.ENV_STEPS: str(steps), "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "",
    })
    if to_end_s:
        env[core.ENV_TO_END] = f"{to_end_s:g}"
    if shuffled:
        env[core.ENV_SHUFFLED] = "1"
    if batch_scale > 1:  # the reference of a per-device conversion (:mod:`.harness.batch_scale`)
        env[ENV_BATCH_SCALE] = str(batch_scale)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONHASHSEED", _HASH_SEED)  # both runs order sets of strings alike, as one job's ranks do
    if framework == "tensorflow":
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if importlib.util.find_spec("tf_keras") is not None:  # as dpmigrate launch does for its workers: the
            env.setdefault("TF_USE_LEGACY_KERAS", "1")  # single process must train with the same Keras
    return env


def scratch_folder(work: Path, name: str, like: Path) -> Path:
    """A private working directory whose entries link to those of ``like`` (the user's current folder), inside a
    private folder whose entries link to those of ``like``'s parent: ``data/x.csv`` and ``../data/x.csv`` both
    resolve as they do from ``like``, while new files land in the scratch folders."""
    root = work / name
    root.mkdir(mode=0o700)
    like = like.resolve()
    if like.parent == like:  # the file system's root: no parent to mirror
        _link_entries(like, root, skip=set())
        return root
    folder = root / like.name
    folder.mkdir(mode=0o700)
    _link_entries(like.parent, root, skip={like.name}, budget=[PARENT_BUDGET])
    _link_entries(like, folder, skip=set())
    return folder


_PARENTS_INDEX = re.compile(r"__file__.*?\.parents\[(\d)\]")
_PARENT_CHAIN = re.compile(r"__file__\S*?((?:\.parent\b)+)")
_DIRNAME = re.compile(r"dirname\(")
MAX_LEVELS = 4


def levels_above(folder: Path) -> int:
    """How many folders above ``folder`` its scripts reach from their own path (at least 1, at most
    :data:`MAX_LEVELS`): ``Path(__file__).resolve().parents[2]`` reaches 2, ``os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))`` 1, ``Path(__file__).parent.parent`` 1. Read from the ``*.py`` files of the folder."""
    levels = 1
    try:
        sources = [p for p in folder.iterdir() if p.suffix == ".py" and p.is_file()][:200]
    except OSError:
        return levels
    for path in sources:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in (line for line in text.splitlines() if "__file__" in line):
            found = [int(k) for k in _PARENTS_INDEX.findall(line)]
            found += [chain.count(".parent") - 1 for chain in _PARENT_CHAIN.findall(line)]
            found.append(len(_DIRNAME.findall(line)) - 1)
            levels = max(levels, *found)
    return min(levels, MAX_LEVELS)


def place_beside(converted_root: Path, original_folder: Path, above: bool = False) -> None:
    """Link every entry of ``original_folder`` that the conversion did not write into ``converted_root``,
    folder by folder (a package with one converted module gets links to its other modules). ``above``: a folder
    above the script's, mirrored within :data:`PARENT_BUDGET`."""
    _link_entries(original_folder, converted_root, skip=set(), budget=[PARENT_BUDGET if above else MIRROR_BUDGET])


MIRRORED_ENTRIES = 256  # a folder with more entries than this is data: linked whole, not mirrored
MIRROR_DEPTH = 4
MIRROR_BUDGET = 5000  # entries made anew in all, per placement: beyond it (many small folders), folders are linked
# the same for a folder above the script's or the working one: a parent holds the user's other projects (pytest's,
# every test's folder), and mirroring them made 21,000 links per verify, 20 of its 32 s on a small torch script
PARENT_BUDGET = 256


def _link_entries(source: Path, target: Path, skip: set[str], depth: int = 0, budget: list[int] | None = None) -> None:
    """Link ``source``'s entries into ``target``. A small folder (at most :data:`MIRRORED_ENTRIES` entries, at most
    :data:`MIRROR_DEPTH` levels down, within :data:`MIRROR_BUDGET` entries in all) is made anew and its entries
    linked in turn, so a file the run writes into an existing ``outputs/`` lands in the scratch tree; a run had left
    a checkpoint in the user's ``outputs/pinn_results`` through a linked folder (issue 19's round Q). A large folder
    (a data set's images) is linked whole."""
    budget = [MIRROR_BUDGET] if budget is None else budget
    try:
        entries = sorted(os.scandir(source), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if entry.name in skip or entry.name == "__pycache__":
            continue
        destination = target / entry.name
        if destination.is_dir() and not destination.is_symlink() and entry.is_dir():
            _link_entries(Path(entry.path), destination, set(), depth + 1, budget)  # converted modules inside: merge
        elif destination.exists() or destination.is_symlink():
            continue
        elif entry.is_dir() and depth < MIRROR_DEPTH and (size := _size(entry.path)) <= min(MIRRORED_ENTRIES, budget[0]):
            budget[0] -= size
            destination.mkdir(mode=0o700)
            _link_entries(Path(entry.path), destination, set(), depth + 1, budget)
        else:
            os.symlink(os.path.abspath(entry.path), destination)


def _size(folder: str) -> int:
    """The folder's number of entries, counted up to one more than :data:`MIRRORED_ENTRIES` (unreadable: more)."""
    try:
        with os.scandir(folder) as entries:
            return sum(1 for _ in zip(range(MIRRORED_ENTRIES + 1), entries))
    except OSError:
        return MIRRORED_ENTRIES + 1


def run(argv: list[str], cwd: Path, env: dict[str, str], log: Path, timeout_s: float) -> Run:
    """Run to the end (or the time limit, then kill its process group); output to ``log`` only."""
    started = time.monotonic()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as out:
        process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            returncode = None
        except BaseException:  # Ctrl-C: nothing of ours keeps running
            _kill_group(process)
            raise
    return Run(returncode, time.monotonic() - started, log)


def _kill_group(process: subprocess.Popen) -> None:
    import signal

    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def place_copy(script: Path, work: Path, name: str, levels: int) -> Path:
    """A copy of ``script`` in ``work/name/<its folder>``, beside links to the rest of its folder and of the ``levels``
    folders above (as the converted copy is placed): what the run writes at paths it builds from ``__file__`` lands in
    the scratch tree, not next to the user's script (a checkpoint verify's original run had left there: round Q)."""
    folder = script.parent
    chain = [folder, *folder.parents][:levels + 1]
    target = work / name / folder.relative_to(chain[-1])
    target.mkdir(parents=True, mode=0o700)
    copy = target / script.name
    shutil.copy2(script, copy)
    level = target
    for original in chain:
        place_beside(level, original, above=original != folder)
        level = level.parent
    return copy


def original_argv(script: Path, args: list[str]) -> list[str]:
    return [sys.executable, str(script), *args]


def launch_argv(script: Path, args: list[str], nproc: int, logs: Path, timeout_s: float, framework: str) -> list[str]:
    return [sys.executable, "-m", "dpmigrate.launch", "-n", str(nproc), "--log-dir", str(logs),
            "--timeout", f"{timeout_s:g}", "--framework", framework, str(script), *args]
