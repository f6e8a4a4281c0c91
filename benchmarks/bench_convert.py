"""How fast the converter is, through the CLI's own code path: lines per second, best of 3.

Two workloads: every ``fixtures/**/before.py`` (real training scripts: parse, detect, rules),
and 500 ordinary Python files with no framework in them, copied from the standard library (the
pre-filter path a ``dpmigrate .`` over a large repository mostly takes). Run by hand:

    python benchmarks/bench_convert.py [-j N]

Nothing is written: the runs use ``--check``. No test asserts a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sysconfig
import tempfile
import time
from pathlib import Path

from dpmigrate.cli import main

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORK_WORDS = (b"torch", b"tensorflow", b"keras", b"paddle")


def stdlib_tree(folder: Path, count: int = 500) -> list[Path]:
    """``count`` framework-free stdlib modules of 100 to 300 lines (reused under new names if needed)."""
    pool = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        data = path.read_bytes()
        if 100 <= data.count(b"\n") <= 300 and not any(w in data for w in FRAMEWORK_WORDS):
            pool.append(path)
    if not pool:
        raise SystemExit("no standard-library module of 100-300 lines found to copy")
    copies = []
    for i in range(count):
        source = pool[i % len(pool)]
        target = folder / f"pkg{i // 50:02d}" / f"{source.stem}_{i}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        copies.append(target)
    return copies


def best_of_3(targets: list[Path], jobs: int) -> float:
    argv = [*map(str, targets), "--check", "-j", str(jobs)]
    times = []
    for _ in range(3):
        with contextlib.redirect_stderr(io.StringIO()):
            start = time.perf_counter()
            code = main(argv)
            times.append(time.perf_counter() - start)
        if code == 2:
            raise SystemExit(f"dpmigrate exited 2 on the benchmark inputs; run it by hand: dpmigrate {' '.join(argv)}")
    return min(times)


def report(name: str, paths: list[Path], jobs: int, targets: list[Path] | None = None) -> None:
    """Time a run over ``targets`` (default: the files themselves) holding ``paths``."""
    if not paths:
        print(f"{name}: no files")
        return
    lines = sum(p.read_bytes().count(b"\n") for p in paths)
    seconds = best_of_3(targets or paths, jobs)
    print(f"{name}: {len(paths)} files, {lines} lines, {seconds:.3f} s, {lines / seconds:,.0f} lines/s (-j {jobs})")


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=1)
    jobs = parser.parse_args().jobs
    report("fixtures (before.py)", sorted(ROOT.glob("fixtures/**/before.py")), jobs)
    with tempfile.TemporaryDirectory() as folder:
        report("500 non-ML stdlib files, found by walking their folder", stdlib_tree(Path(folder)), jobs, [Path(folder)])


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run()
