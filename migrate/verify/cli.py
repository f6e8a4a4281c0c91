"""``dpmigrate verify``: prove on the user's own script that the converted job trains like the original.

    dpmigrate verify train.py [-n 2] [--steps 3] [--against converted.py] [--tolerance 1e-5]
                     [--framework F] [--timeout S] [--report text|json] [--report-file FILE] [--keep] [-- ARGS]
    dpmigrate verify DIR/ [-j N] [--script-timeout S] [the options above] [-- ARGS]
    dpmigrate verify --from LIST [-j N] [--script-timeout S] [the options above]

Without ``--against``, a copy of the script (and of the local modules the conversion reads) is converted
with ``--batch global`` (or ``--batch per-device``: then the original runs with every batch N times larger,
:mod:`.harness.batch_scale`) and the project's ``[tool.dpmigrate]`` settings into a private temporary folder;
the user's files are untouched. The original then runs on one process and the conversion on N (the real
launcher), each for K optimizer steps under the harness (:mod:`.harness`), and the records are compared
(:mod:`.compare`). Exit 0: equivalent, or nothing to verify; 1: diverges; 2: could not run (bad
arguments, a script that does not convert, an original that fails); 3: inconclusive (:data:`.report.EXIT_CODES`).

A folder (its ``*.py`` files, not those below it) or ``--from LIST`` (one ``[NAME=VALUE ...] [--cwd DIR] SCRIPT
[ARGS ...]`` a line) verifies many scripts with the same options, each in a verify subprocess of its own started in
the script's folder (or the line's ``--cwd``), ``-j N`` at once (:mod:`.many`); the exit status is the worst
verdict's, and a summary table ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import compare, dumps, ending, runs, shares
from .report import Outcome, headline, render_json, render_text

FRAMEWORKS = ("auto", "torch", "tensorflow", "paddle")
_GPU_WORDS = ("CUDA", "cuda", "GPU", "nccl", "NCCL")


class CannotRun(Exception):
    """Exit 2, with the reason (and the output lines that show it)."""

    def __init__(self, reason: str, details: list[str] | None = None):
        super().__init__(reason)
        self.details = details or []


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, script_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = _parser()
    args = parser.parse_args(own)
    if args.nproc < 1:
        parser.error("-n takes 1 or more")
    if args.steps != "all" and not (args.steps.isdigit() and int(args.steps) >= 1):
        parser.error(f"--steps {args.steps}: give a number of optimizer steps (1 or more), or all")
    args.steps = 0 if args.steps == "all" else int(args.steps)
    if not args.tolerance > 0:
        parser.error("--tolerance takes a positive number, e.g. 1e-5")
    if not args.to_end >= 0:
        parser.error("--to-end takes seconds (0 or more), e.g. 120")
    if args.from_list is not None or (args.script and Path(args.script).is_dir()):
        from . import many

        return many.main(parser, args, script_args)
    if args.script is None:
        parser.error("give the training SCRIPT, a folder of scripts, or --from LIST")
    if args.jobs != 1 or args.script_timeout is not None:
        parser.error("-j and --script-timeout go with a folder of scripts or --from LIST, not with one script")
    outcome = verify(Path(args.script), args.nproc, args.steps, args.tolerance, args.framework, script_args,
                     against=Path(args.against) if args.against else None, timeout_s=args.timeout, keep=args.keep,
                     conversion_flags=("--batch", args.batch, *("--sync-batchnorm",) * args.sync_batchnorm),
                     to_end_s=args.to_end,
                     shuffle_pass=not args.no_shares_pass)
    text = render_json(outcome) if args.report == "json" else render_text(outcome)
    if args.report_file:
        Path(args.report_file).write_text(text)
    else:
        (sys.stdout if args.report == "json" else sys.stderr).write(text)
    return outcome.exit_code


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dpmigrate verify",
        description="Run the original script on 1 process and its conversion on N for a few optimizer steps, and "
                    "check that they train alike: same parameters after every step, and the data really split.",
        epilog="Many scripts: give a folder (its *.py files but __init__, setup, conftest and test_*; the arguments "
               "after -- go to each) or --from LIST (a text file, one `[NAME=VALUE ...] [--cwd DIR] SCRIPT [ARGS ...]` "
               "a line, relative scripts and folders from LIST's folder, - for standard input). Each is verified in its "
               "own subprocess, started in the script's folder (or --cwd DIR), -j N at a time; a progress line as each "
               "ends, then a summary table on stderr (with --report json, one document of every script's report). "
               "Exit status: 0 equivalent (or nothing to verify), 1 diverges, 2 could not run, 3 inconclusive; over "
               "many scripts, the worst verdict's.")
    p.add_argument("-n", "--nproc", type=int, default=2, metavar="N", help="processes of the converted job (default 2)")
    p.add_argument("--steps", default="3", metavar="K", help="optimizer steps to compare (default 3); `all` runs both "
                   "scripts to their end (slower: it also sees what happens after step K, a late hang or crash)")
    p.add_argument("--against", metavar="CONVERTED", help="check this converted script (however it was made) "
                   "instead of converting a copy with --batch global")
    p.add_argument("--batch", choices=("global", "per-device"), default="global", help="the conversion to check: "
                   "global (default: the script's batch is split over the ranks; compared with the original as it is) "
                   "or per-device (each rank reads the script's batch, as `dpmigrate` converts by default; compared "
                   "with the original with every batch size multiplied by N: exact for mean losses without batch "
                   "statistics)")
    p.add_argument("--sync-batchnorm", action="store_true", help="convert with --sync-batchnorm (synchronised "
                   "batch normalisation: Keras layers on the CPU; torch and Paddle run theirs on GPUs only)")
    p.add_argument("--to-end", type=float, default=120.0, metavar="S", help="after the K compared steps, each run "
                   "goes on, unrecorded, to its end or for at most S s more, so a later crash or hang is seen (default "
                   "120; 0 stops both at step K)")
    p.add_argument("--no-shares-pass", action="store_true", help="skip the third run: the conversion with the "
                   "script's shuffling left on, which checks that the ranks' shares of an epoch are disjoint and "
                   "cover the data (it runs only when the script shuffles)")
    p.add_argument("--tolerance", type=float, default=1e-5, help="largest parameter difference allowed (default 1e-5)")
    p.add_argument("--framework", choices=FRAMEWORKS, default="auto", help="default: from the script's imports")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="time limit of each run (default 600)")
    p.add_argument("--report", choices=("text", "json"), default="text", help="text on stderr, json on stdout")
    p.add_argument("--report-file", metavar="FILE", help="write the report to FILE")
    p.add_argument("--keep", action="store_true", help="keep the converted copy, the runs' logs and records")
    p.add_argument("--from", dest="from_list", metavar="LIST", help="verify every script of LIST, one a line: "
                   "[NAME=VALUE ...] [--cwd DIR] SCRIPT [ARGS ...] (NAME=VALUE: extra environment of that script's verify; "
                   "--cwd: the folder it starts in, default the script's)")
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="N", help="with a folder or --from: verify N scripts "
                   "at once (default 1; each verify runs 1 + n processes)")
    p.add_argument("--script-timeout", type=float, metavar="S", help="with a folder or --from: stop a script's verify "
                   "after S seconds, verdict error (default 2 x --timeout + 120)")
    p.add_argument("script", nargs="?", help="the original, single-process training script (its arguments follow "
                   "`--`), or a folder of them")
    return p


def verify(script: Path, nproc: int, steps: int, tolerance: float, framework: str, script_args: list[str], *,
           against: Path | None = None, timeout_s: float = 600.0, keep: bool = False,
           conversion_flags: tuple[str, ...] = ("--batch", "global"), to_end_s: float = 0.0,
           shuffle_pass: bool = True) -> Outcome:
    outcome = Outcome(str(script), framework, nproc, steps, tolerance, "error", "")
    work = Path(tempfile.mkdtemp(prefix="dpmigrate-verify-"))  # 0700, random name
    try:
        outcome.framework = _framework(script, framework, against)
        _compare_runs(outcome, work, script, script_args, against, timeout_s, conversion_flags,
                      to_end_s if steps else 0.0, shuffle_pass)
    except CannotRun as e:
        outcome.verdict, outcome.headline, outcome.details = "error", f"could not run: {e}", e.details
    except _Diverges as e:
        outcome.verdict, outcome.headline, outcome.details = "diverges", f"diverges: {e}", e.details
    except _Inconclusive as e:
        outcome.verdict, outcome.headline, outcome.details = "inconclusive", f"inconclusive: {e}", e.details
    except _NothingToVerify as e:
        outcome.verdict, outcome.headline = "nothing to verify", f"nothing to verify: {e}"
    finally:
        if keep:
            outcome.kept = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return outcome


class _Diverges(Exception):
    def __init__(self, reason: str, details: list[str] | None = None):
        super().__init__(reason)
        self.details = details or []


class _Inconclusive(Exception):
    """Exit 3: the runs ended well but prove nothing either way (no optimizer step, no input seen, one step)."""

    def __init__(self, reason: str, details: list[str] | None = None):
        super().__init__(reason)
        self.details = details or []


class _NothingToVerify(Exception):
    """Exit 0: the converter left the script as it is (distributed by hand, its own processes): no conversion."""


def _framework(script: Path, framework: str, against: Path | None) -> str:
    from ..launch.cli import UsageError, detect_framework

    for path in (script, against):
        if path is not None and not path.is_file():
            raise CannotRun(f"{path}: no such script")
    if framework != "auto":
        return framework
    try:
        return detect_framework(against or script)
    except UsageError as e:
        raise CannotRun(str(e)) from None


def _compare_runs(o: Outcome, work: Path, script: Path, args: list[str], against: Path | None, timeout_s: float,
                  conversion_flags: tuple[str, ...] = ("--batch", "global"), to_end_s: float = 0.0,
                  shuffle_pass: bool = True):
    script = script.resolve()
    if against is None:
        converted, o.conversion = _convert(script, work, o.framework, conversion_flags)
    else:
        converted = runs.place_copy(against.resolve(), work, "against", runs.levels_above(against.resolve().parent))
        o.conversion = f"checked as given ({against})"
    here = Path.cwd()
    single_out, job_out = dumps.private_folder(work / "single"), dumps.private_folder(work / "job")
    placed = runs.place_copy(script, work, "original", runs.levels_above(script.parent))
    scale = o.nproc if _per_device(conversion_flags) else 1  # its reference: the original, every batch N times larger
    original = runs.run(runs.original_argv(placed, args), runs.scratch_folder(work, "original-cwd", here),
                        runs.environment(single_out, placed, o.steps, o.framework, to_end_s, batch_scale=scale),
                        work / "original.log", timeout_s)
    o.original_seconds = original.seconds
    if original.returncode != 0 and not (to_end_s and ending.recorded_to_k(single_out)):
        raise CannotRun(_failed("the original", original, timeout_s) + _paths_hint(original), original.tail())
    one = _record(single_out, "the original", original)
    if one.steps == 0 and one.child_processes:
        raise CannotRun("the original trains in processes it starts itself (torch.multiprocessing, Hogwild): verify "
                        "follows the script's own process only", original.tail())
    if one.steps == 0:
        raise _Inconclusive("no optimizer step seen in the original (nothing to compare: does it train?)",
                            original.tail())
    if scale > 1 and not any(change.startswith("batch x") for change in one.changes):
        raise _Inconclusive(f"--batch per-device: no batch size of the original could be multiplied by {o.nproc} (no "
                            "DataLoader, BatchSampler, Dataset.batch or fit batch_size: batches cut by hand?), so there "
                            "is no single-process reference; verify the --batch global conversion instead")
    env = runs.environment(job_out, converted, o.steps, o.framework, to_end_s)
    job = runs.run(runs.launch_argv(converted, args, o.nproc, work / "logs", timeout_s, o.framework),
                   runs.scratch_folder(work, "converted-cwd", here), env, work / "converted.log", timeout_s + 30)
    o.converted_seconds = job.seconds
    if job.returncode != 0 and not (to_end_s and all(ending.recorded_to_k(job_out, r) for r in range(o.nproc))):
        raise _Diverges(f"{_failed(f'the conversion on {o.nproc} processes', job, timeout_s)}, where the original "
                        "runs", [*job.rank_errors(), *job.tail()])
    for rank in range(o.nproc):
        _record(job_out, f"rank {rank} of the conversion", job, rank)
    o.harness = sorted({c for folder in (dumps.rank_folder(single_out, 0), dumps.rank_folder(job_out, 0))
                        for c in dumps.Record.read(folder).changes})
    c = compare.compare(single_out, job_out, o.nproc, o.tolerance)
    said = _as_the_conversion_says(c, work / "conversion.json")
    o.comparison = c
    o.verdict = "equivalent" if c.equivalent else "diverges"
    o.headline = headline(c, o.tolerance)
    unproven = _unproven(c)
    if unproven:
        o.verdict, o.headline = "inconclusive", f"inconclusive: {unproven}"
    if shuffle_pass and 0 < c.data.split == c.data.observed and any(  # (a split proven with shuffling off)
            change.startswith("shuffling off") for change in dumps.Record.read(dumps.rank_folder(job_out, 0)).changes):
        _shares_pass(o, work, converted, args, timeout_s, one)
    if to_end_s:
        end = ending.judge(o.steps, to_end_s, single_out, job_out, o.nproc, original.returncode, job.returncode)
        o.ending = end.lines
        if end.failure:
            o.verdict, o.headline = "diverges", f"diverges: {end.failure}"
            o.details = [*job.rank_errors(), *job.tail()]
    if said and o.headline.startswith("diverges: the weights match"):
        o.headline += ", as the conversion says (no speed-up, not a fault)"


def _per_device(flags: tuple[str, ...]) -> bool:
    """The conversion keeps each rank's batch the script's (``--batch per-device``, or the converter's default)."""
    return "global" not in [flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag == "--batch"]


def _shares_pass(o: Outcome, work: Path, converted: Path, args: list[str], timeout_s: float,
                 one: dumps.Record) -> None:
    """The conversion once more, K steps with the script's shuffling on: are the ranks' shares of the first epoch
    still disjoint and covering (:mod:`.shares`)? Its finding joins the comparison's causes."""
    out = dumps.private_folder(work / "shuffled")
    job = runs.run(runs.launch_argv(converted, args, o.nproc, work / "logs-shuffled", timeout_s, o.framework),
                   runs.scratch_folder(work, "shuffled-cwd", Path.cwd()),
                   runs.environment(out, converted, o.steps, o.framework, shuffled=True), work / "shuffled.log",
                   timeout_s + 30)
    if job.returncode != 0:
        o.shares = f"shuffled: {_failed(f'the conversion on {o.nproc} processes with shuffling on', job, timeout_s)}"
        o.verdict, o.headline = "diverges", f"diverges: {o.shares.removeprefix('shuffled: ')}, where it runs with " \
                                             "shuffling off"
        o.details = [*job.rank_errors(), *job.tail()]
        return
    try:
        ranks = [dumps.Record.read(dumps.rank_folder(out, r)) for r in range(o.nproc)]
    except FileNotFoundError:
        o.shares = "shuffled: a rank recorded nothing with shuffling on: the shares are not proven"
        return
    found = shares.check(one, ranks)
    o.shares = found.line
    if found.cause is not None:
        o.comparison.causes.append(found.cause)
        if o.verdict != "diverges":
            o.verdict = "diverges"
            o.headline = (f"diverges: the weights match with shuffling off (max |dw| {o.comparison.max_difference:.1e})"
                          f" but with the script's shuffling on the ranks' shares are wrong ({found.cause.kind})")


def _unproven(c: compare.Comparison) -> str:
    """Why weights that match prove nothing yet ('' when they do): no input was seen, so the ranks may each have
    read all the data (batches cut by hand from a tensor); or one step only, which every rank starts from the same
    weights however they were made (a TF loop whose workers are equalised inside the first apply_gradients)."""
    if not c.equivalent:
        return ""
    matched = f"the weights match (max |dw| {c.max_difference:.1e} after {c.steps} step{'s' * (c.steps != 1)})"
    if not c.data.observed:
        return (f"{matched}, but no input was seen (no DataLoader batch, feed or model input): whether each rank "
                "read its own share is not proven; every rank may have read all the data")
    if c.steps < 2:
        return (f"{matched}, but one step proves little: every rank starts it from the same weights; run more "
                "steps (--steps 3) or a longer run")
    return ""


def _as_the_conversion_says(c: compare.Comparison, report: Path) -> bool:
    """A data set read whole on every rank that the conversion itself said it leaves so (hand-cut batches, a full
    batch, one sample broadcast to every rank: correct, but no speed-up): the cause quotes that note, or the
    summary's "no training data was sharded", so nobody takes it for a silent fault (the autograd guide's one
    random sample, issue 19's round Q). True when it did."""
    if not report.exists():
        return False
    document = json.loads(report.read_text())
    notes = [f for f in document["findings"] if f["severity"] == "note"
             and f["rule"] in ("manual-batching", "paddle-manual-batching") and "no speed-up" in f["message"]]
    if notes:
        where = f"{Path(notes[0]['path']).name}:{notes[0]['line']}, {notes[0]['rule']}"
    elif "no training data was sharded" in (document.get("policy") or ""):
        where = "in its summary: no training data was sharded"
    else:
        return False
    said = False
    for cause in c.causes:
        if cause.kind == "not-sharded":
            said = True
            cause.message = (f"as the conversion says ({where}), every rank reads all the data: correct (the weights "
                             "match) but no faster; to gain speed, give each rank its part of the data by hand (dp.shard)")
    return said


def _record(out: Path, who: str, run: runs.Run, rank: int = 0) -> dumps.Record:
    folder = dumps.rank_folder(out, rank)
    try:
        return dumps.Record.read(folder)
    except FileNotFoundError:
        raise CannotRun(f"{who} ran but the harness recorded nothing: it never imported torch, tensorflow or paddle "
                        "in the script's own process", run.tail()) from None


def _paths_hint(run: runs.Run) -> str:
    """A run that did not find a file: say where the runs work (a path above the parent folder is not linked)."""
    text = "\n".join(run.tail())
    if "No such file or directory" in text or "FileNotFoundError" in text:
        return ("; it did not find a file: the runs work in scratch folders linked to this folder and its parent, so "
                "a path further up (../../) is missing there; give it as an absolute path")
    return ""


def _failed(who: str, run: runs.Run, timeout_s: float) -> str:
    if run.returncode is None:
        return f"{who} did not finish within {timeout_s:g} s (--timeout)"
    text = "\n".join(run.tail())
    gpu = " (it needs a GPU: verify runs on the CPU)" if any(w in text for w in _GPU_WORDS) and "Error" in text else ""
    return f"{who} failed (exit code {run.returncode}){gpu}"


def _convert(script: Path, work: Path, framework: str, flags: tuple[str, ...] = ()) -> tuple[Path, str]:
    """Convert a copy of the script (and the local modules it reads) into ``work/converted/<its folder's name>``,
    beside links to the rest of its folder and of the folder above: a ``tools/train.py`` that puts its project root
    on ``sys.path`` (``sys.path.append(dirname(__file__) + "/..")``, then ``from tools.helper import Data``) finds
    its packages there as it does in place (FCCDN_paddle, issue 19 audit: verify had blamed the conversion). Folders
    further up are mirrored the same way when the script's folder reaches them (:func:`runs.levels_above`:
    ``Path(__file__).resolve().parents[2]``, a steel-defect classifier's project root: round I)."""
    folder = script.parent
    chain = [folder, *folder.parents][:runs.levels_above(folder) + 1]  # the script's folder and those it reaches up to
    target = work / "converted" / folder.relative_to(chain[-1])
    report = work / "conversion.json"
    argv = [sys.executable, "-m", "dpmigrate", "-o", str(target), "--framework", framework, *flags,
            "--report", "json", "--report-file", str(report), str(script)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=os.getcwd())
    if done.returncode == 2 or not report.exists():
        raise CannotRun(f"dpmigrate could not convert {script.name}", done.stderr.splitlines()[-TAIL:])
    document = json.loads(report.read_text())
    summary = document["summary"]
    left_alone = [f["left_alone"] for f in document["files"] if f.get("left_alone") and Path(f["path"]).resolve() == script]
    if left_alone and not summary["changed"]:
        raise _NothingToVerify(f"dpmigrate left {script.name} as it is: {left_alone[0]}")
    converted = target / script.name
    if not converted.exists():
        raise CannotRun(f"dpmigrate wrote no converted copy of {script.name}", done.stderr.splitlines()[-TAIL:])
    level = target
    for original in chain:  # (each level's converted folder is there already: not linked)
        runs.place_beside(level, original, above=original != chain[0])
        level = level.parent
    policy = " ".join(flags)
    said = (f"{policy}, {summary['changes']} changes, {summary['declined']} declined, {summary['errors']} "
            f"errors in {summary['files']} file{'s' if summary['files'] != 1 else ''} (`dpmigrate --diff {policy} "
            f"{script.name}` shows them)")
    return converted, said


TAIL = 20
