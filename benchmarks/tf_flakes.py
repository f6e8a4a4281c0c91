"""Run the 2-worker TensorFlow equivalence job N times in a row (default 30), optionally under load, and report.

    python benchmarks/tf_flakes.py [--runs 30] [--mode fit|tape|loop] [--busy 1]

The job is tests/jobs/tf_train.py under `dpmigrate launch -n 2`, checked against one single-process run
to 1e-5 each time. A failure is any non-zero exit (a hang is ended by a per-job timeout and counted),
or weights that differ. ``--busy K`` keeps K extra processes spinning on a core for the whole run (the
"under load" of issue 10). Only NumPy is imported here; the jobs import TensorFlow.
"""

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

JOB = Path(__file__).resolve().parent.parent / "tests" / "jobs" / "tf_train.py"


def spin() -> None:
    while True:
        pass


def weights(path: Path) -> list:
    with np.load(path) as saved:
        return [saved[k] for k in saved.files]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--mode", choices=("fit", "tape", "loop"), default="fit")
    parser.add_argument("--busy", type=int, default=1, help="extra processes spinning on a core (default 1)")
    parser.add_argument("--job-timeout", type=float, default=300.0)
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), TF_CPP_MIN_LOG_LEVEL="2")
    busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    failures, times = [], []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, str(JOB), "--mode", args.mode, "--out", "single.npz"], cwd=tmp, env=env,
                           check=True, capture_output=True)
            single = weights(Path(tmp) / "single.npz")
            for i in range(args.runs):
                out = Path(tmp) / f"dist{i}.npz"
                started = time.perf_counter()
                try:
                    proc = subprocess.run([sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--log-dir",
                                           str(Path(tmp) / f"logs{i}"), str(JOB), "--mode", args.mode, "--out", str(out)],
                                          cwd=tmp, env=env, capture_output=True, text=True, timeout=args.job_timeout)
                    code, err = proc.returncode, proc.stderr[-2000:]
                except subprocess.TimeoutExpired:  # dpmigrate launch itself kills its workers when it is killed
                    code, err = "timeout", f"no end after {args.job_timeout:g} s"
                times.append(time.perf_counter() - started)
                ok = code == 0 and out.exists() and all(
                    np.abs(a - b).max() < 1e-5 for a, b in zip(single, weights(out)))
                if not ok:
                    failures.append((i, code, err))
                print(f"run {i + 1:3d}/{args.runs}: {'ok' if ok else 'FAILED'} ({times[-1]:.1f} s)", flush=True)
    finally:
        for p in busy:
            p.terminate()
    print(f"\n{args.runs} runs of the 2-worker TF {args.mode} job with {args.busy} busy core(s), {len(failures)} "
          f"failures; wall time median {statistics.median(times):.1f} s, min {min(times):.1f} s, max {max(times):.1f} s")
    for i, code, err in failures:
        print(f"--- run {i + 1} exit {code}:\n{err}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
