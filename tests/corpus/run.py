"""Run the real-script corpus through ``dpmigrate verify`` and say what changed since the last run.

    python tests/corpus/run.py [--split dev|held-out|all] [--framework F] [--only ID ...] [-j 2] [--steps 3]
                               [--timeout S] [--mirrors DIR] [--python PY] [--update] [--report-file FILE]

Why: every change to the converter or the runtime is measured on real public scripts nobody here wrote, and a
script whose conversion was right and no longer is blocks the change. The manifest (``manifest.toml`` beside this
file) names each script by repository, commit and path; no public code is committed. Each script's source comes
back from a git snapshot of its repository (``<mirrors>/<owner>+<name>/repo``, a bare git directory, as the
search tool's ``fetch`` leaves it): the repository's tree at that commit is unpacked into a scratch folder, and
the script is verified there with default settings, as a user would run ``dpmigrate verify train.py``.

The synthetic-data shim (``shim/sitecustomize.py``, on ``PYTHONPATH`` with ``DPMIGRATE_CORPUS_SHIM=1``) stands in for
dataset downloads. Every script is verified by one ``dpmigrate verify --from LIST`` run (``-j`` at once); this
prints its table, then the counts per framework and split, then the difference with ``results.json`` (the last
run kept with ``--update``): new scripts, verdicts that changed, and REGRESSION for one that was equivalent and no
longer is. Exit status: 1 when any script regressed, 2 for a usage error, else 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.toml"
RESULTS = HERE / "results.json"
SHIM = HERE / "shim"
FRAMEWORKS = ("torch", "tensorflow", "paddle")
SPLITS = ("dev", "held-out")
CORRECT = ("equivalent", "nothing to verify")


def split_of(repo: str, path: str) -> str:
    """The split, fixed before anyone reads a script: a hash of where it is, never of what it says."""
    return "dev" if int(hashlib.sha256(f"{repo}:{path}".encode()).hexdigest(), 16) % 2 == 0 else "held-out"


def load_manifest(path: Path = MANIFEST) -> list[dict]:
    """The manifest's entries, checked: unique ids, a known framework, a full commit, the split by the rule."""
    entries = tomllib.loads(path.read_text())["script"]
    seen: set[str] = set()
    for e in entries:
        where = f"{path.name}: {e.get('id')!r}"
        for key in ("id", "framework", "repo", "commit", "path"):
            if not isinstance(e.get(key), str) or not e[key]:
                raise ValueError(f"{where}: {key} is missing")
        if e["id"] in seen:
            raise ValueError(f"{where}: the id is used twice")
        seen.add(e["id"])
        if e["framework"] not in FRAMEWORKS:
            raise ValueError(f"{where}: framework {e['framework']!r} is not one of {', '.join(FRAMEWORKS)}")
        if len(e["commit"]) != 40 or any(c not in "0123456789abcdef" for c in e["commit"]):
            raise ValueError(f"{where}: commit {e['commit']!r} is not 40 hex digits")
        if e.get("split") != split_of(e["repo"], e["path"]):
            raise ValueError(f"{where}: split {e.get('split')!r}, but the rule gives {split_of(e['repo'], e['path'])!r}")
    return entries


def git_dir(mirrors: Path, repo: str) -> Path | None:
    """The bare git directory of ``repo``'s snapshot under ``mirrors`` (None when it was never fetched)."""
    folder = mirrors / repo.replace("/", "+")
    for candidate in (folder / "repo", folder / "repo" / ".git", folder):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    return None


def materialize(entry: dict, mirrors: Path, cache: Path) -> Path:
    """The script's path in the repository's tree at the entry's commit, unpacked once into ``cache``."""
    source = git_dir(mirrors, entry["repo"])
    if source is None:
        raise LookupError(f"no snapshot of {entry['repo']} under {mirrors}: fetch github:{entry['repo']}")
    tree = cache / f"{entry['repo'].replace('/', '+')}@{entry['commit'][:12]}"
    if not (tree / ".complete").exists():
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=cache))
        try:
            unpack(source, entry["commit"], partial)
        except LookupError as error:
            shutil.rmtree(partial)
            raise LookupError(f"{entry['repo']}@{entry['commit'][:12]}: {error}") from None
        (partial / ".complete").touch()
        shutil.rmtree(tree, ignore_errors=True)
        partial.rename(tree)
    script = tree / entry["path"]
    if not script.is_file():
        raise LookupError(f"{entry['repo']}@{entry['commit'][:12]} has no {entry['path']}")
    return script


def unpack(git: Path, commit: str, into: Path) -> int:
    """The tree of ``commit`` written into ``into``; the blobs a snapshot lacks (files of 4 MiB and more: data sets,
    PDFs, checkpoints) are left out, as a user without them would have it. The number left out."""
    listed = subprocess.run(["git", "--git-dir", str(git), "ls-tree", "-r", "-z", commit], capture_output=True)
    if listed.returncode != 0:
        raise LookupError(listed.stderr.decode(errors="replace").strip())
    entries = []
    for item in listed.stdout.split(b"\0"):
        if item:
            meta, name = item.split(b"\t", 1)
            mode, kind, sha = meta.split()
            if kind == b"blob":
                entries.append((mode, sha, os.fsdecode(name)))
    batch = subprocess.run(["git", "--git-dir", str(git), "cat-file", "--batch"], capture_output=True,
                           input=b"".join(sha + b"\n" for _, sha, _ in entries))
    out, at, missing = batch.stdout, 0, 0
    for mode, _sha, name in entries:
        end = out.index(b"\n", at)
        header = out[at:end].split()
        at = end + 1
        if header[-1] == b"missing":
            missing += 1
            continue
        size = int(header[2])
        data, at = out[at:at + size], at + size + 1
        target = into / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            continue  # (a tree never holds these; a path that leaves the folder is not followed)
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == b"120000":
            target.symlink_to(os.fsdecode(data))
        else:
            target.write_bytes(data)
            if mode == b"100755":
                target.chmod(0o755)
    return missing


def list_line(entry: dict, script: Path) -> str:
    """``--from`` LIST's line for one entry: the shim's environment, the entry's, the folder its author runs it from
    (``cwd``, relative to the repository's root; default the script's folder), the script and its arguments.
    ``pythonpath`` (folders relative to the root) goes after the shim: a course's scripts that import the
    repository's own packages from its root."""
    root = Path(str(script)[: -len(entry["path"])]) if str(script).endswith(entry["path"]) else script.parent
    # (a PYTHONPATH of the runner's own stays behind the shim and the entry's: a frozen copy of dpmigrate measured
    # there, not the editable install, while the tree is edited)
    folders = [str(SHIM), *(str((root / f).resolve()) for f in entry.get("pythonpath", []))]
    path = os.pathsep.join([*folders, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {"DPMIGRATE_CORPUS_SHIM": "1", "PYTHONPATH": path, "MPLBACKEND": "Agg", **entry.get("env", {})}
    cwd = ["--cwd", str((root / entry["cwd"]).resolve())] if "cwd" in entry else []
    words = [f"{k}={v}" for k, v in env.items()] + cwd + [str(script), *entry.get("args", [])]
    return shlex.join(words)


def select(entries: list[dict], split: str, framework: str | None, only: list[str]) -> list[dict]:
    chosen = [e for e in entries if (split == "all" or e["split"] == split)
              and (framework is None or e["framework"] == framework) and (not only or e["id"] in only)]
    unknown = set(only) - {e["id"] for e in entries}
    if unknown:
        raise ValueError(f"no such id in the manifest: {', '.join(sorted(unknown))}")
    return chosen


def counts_table(rows: list[dict]) -> list[str]:
    """Counts per framework and split: ``torch dev: 5 equivalent, 1 diverges``."""
    lines = []
    for framework in FRAMEWORKS:
        for split in SPLITS:
            mine = [r["verdict"] for r in rows if r["framework"] == framework and r["split"] == split]
            if mine:
                correct = sum(v in CORRECT for v in mine)
                parts = ", ".join(f"{n} {v}" for v, n in sorted(Counter(mine).items()))
                lines.append(f"{framework:<10} {split:<8} {len(mine):>3} scripts, {correct} equivalent: {parts}")
    total = Counter(r["verdict"] for r in rows)
    lines.append(f"{'all':<19} {len(rows):>3} scripts: " + ", ".join(f"{n} {v}" for v, n in sorted(total.items())))
    return lines


def difference(rows: list[dict], last: dict) -> tuple[list[str], int]:
    """What changed since the last kept run, and how many scripts regressed (equivalent before, not now)."""
    before = last.get("scripts", {})
    lines, regressions = [], 0
    for r in rows:
        was = before.get(r["id"], {}).get("verdict")
        if was is None:
            lines.append(f"new        {r['id']}: {r['verdict']}")
        elif was != r["verdict"]:
            regressed = was in CORRECT and r["verdict"] not in CORRECT
            regressions += regressed
            lines.append(f"{'REGRESSION' if regressed else 'changed':<10} {r['id']}: {was} -> {r['verdict']}: "
                         f"{r['headline'][:160]}")
    return lines, regressions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tests/corpus/run.py", description=__doc__.split("\n\n")[1])
    p.add_argument("--split", choices=("dev", "held-out", "all"), default="all")
    p.add_argument("--framework", choices=FRAMEWORKS)
    p.add_argument("--only", nargs="+", default=[], metavar="ID")
    p.add_argument("-j", "--jobs", type=int, default=1)
    p.add_argument("--steps", default="3")
    p.add_argument("--timeout", type=float, default=300, help="each run's limit (dpmigrate verify --timeout)")
    p.add_argument("--to-end", type=float, default=30, help="how long each run goes on past step K (verify --to-end)")
    p.add_argument("--mirrors", type=Path, default=Path(os.environ.get("DPMIGRATE_CORPUS_MIRRORS", "/work/.mirror")))
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dpmigrate-corpus",
                   help="where the repositories' trees are unpacked (kept between runs)")
    p.add_argument("--python", default=_corpus_python(), help="the interpreter that runs dpmigrate verify "
                   "(default: .venv-corpus's, made by tests/corpus/setup, else this one)")
    p.add_argument("--manifest", type=Path, default=MANIFEST)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--update", action="store_true", help="keep this run as the last run (results.json)")
    p.add_argument("--report-file", type=Path, help="also write every script's verify report (JSON) here")
    args = p.parse_args(argv)
    try:
        entries = select(load_manifest(args.manifest), args.split, args.framework, args.only)
    except (OSError, ValueError, KeyError) as e:
        print(f"corpus: {e}", file=sys.stderr)
        return 2
    args.cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    rows, lines, by_script = [], [], {}
    for e in entries:
        try:
            script = materialize(e, args.mirrors, args.cache)
        except LookupError as error:
            rows.append(_row(e, "unavailable", str(error), 0.0))
            continue
        lines.append(list_line(e, script))
        by_script[str(script)] = e
    started = time.monotonic()
    report = _verify_all(args, lines) if lines else {"scripts": []}
    for s in report["scripts"]:
        e = by_script.get(s["script"]) or by_script.get(str(Path(s["script"]).resolve()))
        if e is not None:
            rows.append(_row(e, s["verdict"], s["headline"], s.get("seconds") or 0.0))
    rows.sort(key=lambda r: r["id"])
    print(f"\ncorpus: {len(rows)} scripts in {time.monotonic() - started:.0f} s", file=sys.stderr)
    for line in counts_table([r for r in rows if r["verdict"] != "unavailable"]):
        print("  " + line, file=sys.stderr)
    missing = [r for r in rows if r["verdict"] == "unavailable"]
    if missing:
        print(f"  {len(missing)} unavailable (no snapshot): " + ", ".join(r["id"] for r in missing), file=sys.stderr)
    last = json.loads(args.results.read_text()) if args.results.exists() else {}
    changes, regressions = difference([r for r in rows if r["verdict"] != "unavailable"], last)
    print(f"since the last run ({last.get('dpmigrate', 'none')}): " + ("no change" if not changes else ""), file=sys.stderr)
    for line in changes:
        print("  " + line, file=sys.stderr)
    if args.report_file:
        args.report_file.write_text(json.dumps(report, indent=1) + "\n")
    if args.update:
        kept = {**last.get("scripts", {}), **{r["id"]: {k: r[k] for k in ("framework", "split", "verdict", "headline")}
                                               for r in rows if r["verdict"] != "unavailable"}}
        measured = measured_dpmigrate(args.python)
        args.results.write_text(json.dumps({"dpmigrate": measured, "scripts": dict(sorted(kept.items()))}, indent=1,
                                           ensure_ascii=False) + "\n")
    return 1 if regressions else 0


def _row(entry: dict, verdict: str, headline: str, seconds: float) -> dict:
    return {"id": entry["id"], "framework": entry["framework"], "split": entry["split"], "verdict": verdict,
            "headline": headline, "seconds": seconds}


def _verify_all(args: argparse.Namespace, lines: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="dpmigrate-corpus-run-") as scratch:
        listing, out = Path(scratch) / "list.txt", Path(scratch) / "report.json"
        listing.write_text("\n".join(lines) + "\n")
        argv = [args.python, "-m", "dpmigrate", "verify", "--from", str(listing), "-j", str(args.jobs),
                "--steps", str(args.steps), "--timeout", f"{args.timeout:g}", "--to-end", f"{args.to_end:g}",
                "--report", "json",
                "--report-file", str(out)]
        subprocess.run(argv, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if not out.exists():
            raise SystemExit("corpus: dpmigrate verify --from wrote no report (see above)")
        return json.loads(out.read_text())


def _corpus_python() -> str:
    venv = Path(os.environ.get("DPMIGRATE_CORPUS_VENV", HERE.parents[1] / ".venv-corpus"))
    return str(venv / "bin" / "python") if (venv / "bin" / "python").exists() else sys.executable


def measured_dpmigrate(python: str) -> str:
    """Which dpmigrate the runs measured: the one ``python`` imports with this process's environment (a frozen copy on
    PYTHONPATH, or the editable install), named by its git commit when its folder is a clean checkout, else by a
    digest of its source (a ``git archive`` copy has no .git; an edited tree is not its commit)."""
    done = subprocess.run([python, "-c", "import dpmigrate, os; print(os.path.dirname(dpmigrate.__file__))"],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    folder = Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None
    if folder is None:
        return "unknown (dpmigrate does not import: " + (done.stderr.strip().splitlines() or ["?"])[-1] + ")"
    head = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--", "."], capture_output=True, text=True)
    if head.returncode == 0 and dirty.returncode == 0 and not dirty.stdout.strip():
        return head.stdout.strip()
    return "source " + source_digest(folder) + (f" (edited {head.stdout.strip()})" if head.returncode == 0 else "")


def source_digest(folder: Path) -> str:
    """12 hex digits of SHA-256 over the package's Python files (relative path and bytes, in path order)."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


if __name__ == "__main__":
    sys.exit(main())
