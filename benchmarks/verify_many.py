"""How long ``dpmigrate verify DIR -j N`` takes over a folder of small training scripts (issue 32: under 10 minutes
for 20 scripts with ``-j 2``, under 60 s a script).

    python benchmarks/verify_many.py [--scripts 20] [--jobs 2] [--frameworks torch,paddle]

The folder: the ``before.py`` of the first executed fixtures (``fixtures/<framework>/<case>/execute.json`` present,
run with no argument of their own), in the order of ``--frameworks`` then by name, copied into a private temporary
folder as ``<framework>_<case>.py``; verify runs them with its default options (3 steps, each run to its end for at
most 120 s more, the shares pass where a script shuffles). Prints the wall time, each script's verdict and time, and
the slowest; asserts nothing. A fixture that needs a package this machine lacks ends "error" quickly and still
counts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OWN_ARGUMENTS = ("not_executed", "own_test", "verified_by", "args", "batch_args", "reference")


def small_scripts(frameworks: list[str], count: int) -> list[Path]:
    """The executed fixtures' originals that run with no argument of their own, ``count`` of them at most."""
    picked = []
    for framework in frameworks:
        for case in sorted((FIXTURES / framework).iterdir()):
            spec = case / "execute.json"
            if spec.exists() and not any(k in json.loads(spec.read_text()) for k in OWN_ARGUMENTS):
                picked.append(case / "before.py")
    return picked[:count]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--frameworks", default="torch,paddle")
    args = parser.parse_args()
    scripts = small_scripts(args.frameworks.split(","), args.scripts)
    with tempfile.TemporaryDirectory(prefix="dpmigrate-verify-many-") as scratch:
        folder = Path(scratch) / "scripts"
        folder.mkdir()
        for script in scripts:
            shutil.copyfile(script, folder / f"{script.parent.parent.name}_{script.parent.name}.py")
        report = Path(scratch) / "report.json"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dpmigrate", "verify", str(folder), "-j", str(args.jobs), "--report",
                        "json", "--report-file", str(report)], cwd=scratch, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        rows = json.loads(report.read_text())["scripts"]
    times = sorted(r.get("seconds") or 0.0 for r in rows)
    for r in rows:
        print(f"  {Path(r['script']).name:40s} {r['verdict']:11s} {r.get('seconds') or 0.0:6.1f} s")
    print(f"{len(rows)} scripts, -j {args.jobs}: {wall / 60:.0f} min {wall % 60:.0f} s wall; a script "
          f"{times[0]:.0f}-{times[-1]:.0f} s (median {times[len(times) // 2]:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
